//! Pool eviction model (placeholder, filled by the pool work).
