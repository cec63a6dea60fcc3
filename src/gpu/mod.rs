//! Device memory: page pools, staging pools, copy streams (host backend).
