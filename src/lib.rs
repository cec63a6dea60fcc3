//! # kv-connector
//!
//! A runtime that an LLM serving process embeds to share prompt KV cache between serving
//! instances through a distributed KV pool (Mooncake Store, or the embedded memory pool).
//! It saves the KV pages of prompts under chained block hashes, finds the longest reusable
//! prefix of a new prompt, and loads it back while the engine keeps computing other
//! requests. `docs/DESIGN.md` is the reference for behaviour; its rules are cited as
//! `R1`..`R31`.
//!
//! ## Layout
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`core`] | pure, synchronous logic: hash chain (R1, R2), pool keys (R3, R4), layout (R6, R7), object header (R5), pool eviction model, pool health (R30) |
//! | [`pool`] | the pool trait (exists / put / get / touch, batched, per-key results), the embedded memory pool, and the guarded pool that gives every call its deadline and the pool its health state (R30) |
//! | [`gpu`] | device page pools, staging pools, copy streams and events; the host-memory backend (the only module allowed `unsafe`) |
//! | [`transfer`] | the synchronous load and save procedures (pool <-> staging or lent objects <-> device pages) that loaders and savers run |
//! | [`config`] | the typed configuration tree: defaults < TOML < environment < command line |
//! | [`connector`] | the engine-facing hooks (`EngineConnector`) and the `NoConnector` baseline |
//! | [`actors`] | the actor system: lookup planner, reservation manager, loaders, saver, stats reporter |
//! | [`messages`] | typed messages, one file per receiving actor |
//! | `replay` | (feature `replay`) the main job: workloads (Mooncake traces, long multi-turn sessions), the oracle, the engine simulator |
//! | `cli` | (feature `cli`) the `kv-connector` subcommands; `main.rs` only dispatches to them |
//! | [`metrics`] | the optional Prometheus endpoint (`--metrics-addr`, `stats.metrics_addr`) serving the stats reporter's counters and histograms |
//! | [`logging`] | the tracing subscriber: `RUST_LOG` filter, text or json lines on stderr |
//! | [`stats`] | per-actor counters and latency histograms merged by the stats reporter (R27) |
//!
//! Layers point one way: `core` -> `gpu` -> `pool` -> `transfer` -> `messages` /
//! `actors` -> `connector` -> `replay`, `cli`; a module imports only from the layers before
//! it. Beside them: `stats` and `logging` import nothing of the crate, `config` only `core`
//! and `gpu` (the pool reads its settings), `metrics` reads the actors for the connector.

#![deny(unsafe_code)]

pub mod actors;
#[cfg(feature = "cli")]
pub mod cli;
pub mod config;
pub mod connector;
pub mod core;
#[allow(
    unsafe_code,
    reason = "device memory and copies need FFI; every block has a SAFETY note"
)]
pub mod gpu;
pub mod logging;
pub mod messages;
pub mod metrics;
pub mod pool;
#[cfg(feature = "replay")]
pub mod replay;
pub mod stats;
pub mod transfer;
