//! # kv-connector
//!
//! A runtime that an LLM serving process embeds to share prompt KV cache between serving
//! instances through a distributed KV pool (Mooncake Store, or the embedded memory pool).
//! It saves the KV pages of prompts under chained block hashes, finds the longest reusable
//! prefix of a new prompt, and loads it back while the engine keeps computing other
//! requests. `docs/DESIGN.md` is the reference for behaviour; its rules are cited as
//! `R1`..`R35`.
//!
//! ## Surface
//!
//! What an engine names is re-exported here, at the crate root: the configuration
//! ([`Config`]), the engine's handle and hooks ([`ConnectorHandle`], [`EngineConnector`]),
//! the layout and hash vocabulary ([`Layout`], [`hash_blocks`], [`scope_seed`]), devices
//! ([`Device`]) and pools ([`MemoryPool`], `MooncakePool` with `mooncake`), stats
//! ([`ConnectorStats`], [`FAMILIES`]) and metrics ([`MetricsSources`], `MetricsServer`
//! with `metrics-server`); beside them the [`logging`] module and, for the binary, `cli`.
//! Everything else is crate-private (`pub` only under the `internals` feature, which the
//! crate's own tests, benches and fuzz targets turn on).
//!
//! ## Layout
//!
//! | module | what it holds |
//! | --- | --- |
//! | `core` | pure, synchronous logic: hash chain (R1, R2), pool keys (R3, R4), layout (R6, R7), object header (R5), pool eviction model, pool health (R30) |
//! | `pool` | the pool trait (exists / put / get / touch, batched, per-key results), the embedded memory pool, and the guarded pool that gives every call its deadline and the pool its health state (R30) |
//! | `gpu` | device page pools, staging pools, copy streams and events; the host-memory backend (the only module allowed `unsafe`, but for the one `unsafe impl` of `gpu::LentHostMemory` in `pool::mooncake`: the promise behind memory a dummy client lends) |
//! | `transfer` | the synchronous load, save and lookup procedures (pool <-> staging or lent objects <-> device pages) that the actors run |
//! | `config` | the typed configuration tree: defaults < TOML < environment < command line |
//! | `connector` | the engine-facing hooks (`EngineConnector`) and the `NoConnector` baseline |
//! | `actors` | the actor system: lookup planner, reservation manager, loaders, saver, stats reporter |
//! | `messages` | typed messages, one file per receiving actor |
//! | `replay` | (feature `replay`) the main job: workloads (Mooncake traces, long multi-turn sessions), the oracle, the engine simulator |
//! | `cli` | (feature `cli`) the `kv-connector` subcommands; `main.rs` only dispatches to them |
//! | `metrics` | the Prometheus exposition of the stats reporter's counters and histograms, and its optional endpoint (`--metrics-addr`, `stats.metrics_addr`) |
//! | [`logging`] | the tracing subscriber: `RUST_LOG` filter, text or json lines on stderr |
//! | `stats` | per-actor counters and latency histograms merged by the stats reporter (R27) |
//!
//! Layers point one way: `core` -> `gpu` -> `pool` -> `transfer` -> `messages` /
//! `actors` -> `connector` -> `replay`, `cli`; a module imports only from the layers before
//! it. Beside them: `stats` and `logging` import nothing of the crate, `config` only `core`
//! and `gpu` (the pool reads its settings), `metrics` reads the actors for the connector.

#![deny(unsafe_code)]

/// Declares modules of the crate's inside: `pub(crate)`, so the compiler holds what an
/// embedder can reach to the re-exports below, or `pub` (and hidden from the docs) under
/// the `internals` feature, which only the crate's own tests, benches and fuzz targets turn
/// on (the root package's dev-dependency on itself). Not a stable surface.
macro_rules! internal_modules {
    ($($(#[$attr:meta])* mod $name:ident;)*) => {$(
        $(#[$attr])*
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "internals"))]
        pub(crate) mod $name;
    )*};
}

internal_modules! {
    mod actors;
    mod config;
    mod connector;
    mod core;
    #[allow(
        unsafe_code,
        reason = "device memory and copies need FFI; every block has a SAFETY note"
    )]
    mod gpu;
    mod messages;
    mod metrics;
    mod pool;
    #[cfg(feature = "replay")]
    mod replay;
    mod stats;
    mod transfer;
}
#[cfg(feature = "cli")]
pub mod cli;
pub mod logging;

// The embedder's surface: what an engine (the Python package, `examples/embed.rs`,
// docs/EMBEDDING.md) names, and nothing more.
pub use crate::config::{
    Config, ConfigError, ConfigSources, ModelConfig, MooncakeConfig, PoolBackend, StatsConfig,
};
pub use crate::connector::{
    AdoptError, ConnectorHandle, ConnectorParams, EngineConnector, HookError, RankShare,
    ReserveAnswer, ScheduledRequest, SchedulerOutput, ShareError, StartError,
};
pub use crate::core::eviction::EvictionPolicy;
pub use crate::core::hash::{hash_blocks, scope_seed, BlockHash, HashError, Scope};
pub use crate::core::ids::{RequestId, ReservationId};
pub use crate::core::layout::{GroupId, LayerGroup, Layout, LayoutError};
pub use crate::core::object::object_len;
pub use crate::core::page_names::{PageNaming, PromptHashes};
pub use crate::core::planner::load_blocks;
pub use crate::core::request_scope::RequestScope;
pub use crate::gpu::host_memory::{host_memory, HostArena};
pub use crate::gpu::{BorrowedPages, Device, DeviceRequest, GpuError, PagePoolSpec};
pub use crate::messages::prompt::Prompt;
#[cfg(feature = "metrics-server")]
pub use crate::metrics::MetricsServer;
pub use crate::metrics::MetricsSources;
#[cfg(feature = "mooncake")]
pub use crate::pool::mooncake::{MooncakeError, MooncakePool, MooncakeSettings};
pub use crate::pool::{MemoryPool, Pool, PoolError, SystemClock};
pub use crate::stats::families::{Family, FAMILIES};
pub use crate::stats::ConnectorStats;
