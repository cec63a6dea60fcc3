//! The pool trait and the embedded memory pool.
