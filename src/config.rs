//! The typed configuration tree.
