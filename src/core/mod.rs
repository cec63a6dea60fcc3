//! Pure, synchronous logic: no actix, tokio or cudarc in here.
//!
//! Everything in this module is deterministic for its inputs, so it is tested with unit
//! tests and property tests at the bottom of each file.

#![deny(missing_docs)]

#[cfg(any(feature = "cli", feature = "internals"))]
pub mod engine_args;
pub mod eviction;
pub mod hash;
pub mod ids;
pub mod keys;
pub mod layout;
pub mod ledger;
pub mod lookup_record;
pub mod object;
pub mod page_names;
pub mod planner;
pub mod request_scope;
pub mod pool_health;
pub mod save_order;
pub mod save_plan;
