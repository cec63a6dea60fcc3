//! `kv-connector replay`: drives the runtime the way a serving deployment would (DESIGN
//! section 11) and reports what the connector achieved.
//!
//! Workflow of a replay:
//! 1. build a workload ([`workload`]): a Mooncake trace file or a generated set of long
//!    multi-turn conversations, as a list of requests whose prompt tokens are produced on
//!    demand;
//! 2. feed the requests, in arrival order, to simulated serving instances that share one
//!    pool;
//! 3. compare the tokens reused from the pool with what an unbounded prefix pool could give
//!    ([`workload::Oracle`]).
//!
//! This module holds only pure code so far: no actors, no async, no clocks.

pub mod workload;
