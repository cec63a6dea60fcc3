//! Object format (R5).
