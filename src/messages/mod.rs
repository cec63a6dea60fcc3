//! Typed messages, one file per receiving actor (issue 3).
