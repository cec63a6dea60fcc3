//! `kv-connector replay`: drives the runtime the way a serving deployment would (`docs/DESIGN.md`
//! section 11) and reports what the connector achieved.
//!
//! Workflow of a replay:
//! 1. build a workload ([`workload`]): a Mooncake trace file or a generated set of long
//!    multi-turn conversations, as a list of requests whose prompt tokens are produced on
//!    demand;
//! 2. size the deployment ([`setup`]): KV pages per instance, stored page sizes
//!    (`--kv-bytes-scale`), the shared pool (the embedded one, or Mooncake Store with the
//!    `mooncake` feature: `mooncake`);
//! 3. run the requests through simulated serving instances ([`driver`]): each an
//!    [`engine`] simulator with chunked prefill and a paged KV cache per layer group
//!    ([`kv_cache`]), driving one connector through the engine hooks
//!    ([`crate::connector::EngineConnector`], built per instance by a
//!    [`connectors::ConnectorFactory`]); computed pages get deterministic bytes and every
//!    loaded page is checked ([`content`]); time is simulated by a cost model ([`cost`]);
//! 4. compare the tokens reused from the pool with what an unbounded prefix pool could give
//!    ([`workload::Oracle`]) and report ([`report`]).
//!
//! Simulated time and wall-clock time are kept apart: the cost model gives step, decode
//! and load durations; the connector's own cost on the engine thread is measured with
//! `Instant` and reported separately.

pub mod baseline;
pub mod checks;
pub mod connectors;
pub mod content;
pub mod cost;
pub mod driver;
pub mod engine;
pub mod error;
pub mod kv_cache;
pub mod kvc;
#[cfg(feature = "mooncake")]
pub mod mooncake;
pub mod nodes;
pub mod plots;
pub mod pool_fit;
pub mod progress;
pub mod report;
pub mod setup;
mod summary;
pub mod timeline;
pub mod witness;
pub mod workload;

pub use connectors::{no_connector, ConnectorFactory, InstanceContext, ReplayConnector};
pub use driver::{run_replay, run_replay_with_timeline, ReplayParams, Routing};
pub use error::ReplayError;
pub use kvc::kvc_connector;
pub use progress::{NoProgress, ProgressSink};
pub use report::ReplayReport;
pub use setup::{DeploymentParams, KvBytesScale, KvPages, PoolMaster};
