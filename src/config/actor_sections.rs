//! The sections that configure the actor system and the engine thread's hand-off to it:
//! `[planner]`, `[reservations]`, `[loaders]`, `[saver]`, `[handoff]` and `[stats]`.
//! Same conventions as `sections.rs`: units in field names, a doc on why each setting
//! exists, defaults in explicit `impl Default`s repeated in `config/default.toml`.

use serde::{Deserialize, Serialize};

use super::sections::MIB;

/// `[planner]`: the lookup planner (R10-R14).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlannerConfig {
    /// Keys per concurrent existence probe (R10). Larger chunks mean fewer round trips but
    /// more keys leased (R14) past the first missing block.
    pub probe_chunk: usize,
    /// When no window near the prompt end is complete, probe further back for an earlier
    /// complete one (R13) instead of offering nothing.
    pub window_fallback: bool,
    /// `R`: how far before a prompt end a later request may resume and still find window
    /// KV (R12, R17). Larger saves more window pages per prompt (`(W + R) / T` per window
    /// group) and finds more resumes. 2048 was chosen by measurement (`docs/HYBRID.md`): on
    /// the shared trace it reuses 99 % of the full-attention oracle (93 % at 1024) for
    /// about 14 % more pages saved than full attention alone (9 % at 1024).
    pub swa_endpoint_rewind_tokens: u64,
    /// Bounded mailbox of the planner actor: lookups beyond it are refused as
    /// overloaded instead of queueing without limit.
    pub mailbox_capacity: usize,
    /// Lookups the planner runs at once (each probes its rounds in `probe_chunk` chunks on
    /// threads of its own). Later lookups wait in the planner's queue, which holds up to
    /// `mailbox_capacity` lookups; one arriving to a full queue offers nothing at once and
    /// counts as `shed` (its request computes the prompt, never waits).
    pub max_concurrent_lookups: usize,
    /// Deadline of one lookup, all its probe rounds together, from when the planner starts
    /// it: past it the lookup offers nothing and counts as lost to the outage (R30), so the
    /// engine's admission never waits longer than this plus one `pool.probe_timeout_ms`.
    pub lookup_timeout_ms: u64,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            probe_chunk: 4096,
            window_fallback: true,
            swa_endpoint_rewind_tokens: 2048,
            mailbox_capacity: 256,
            max_concurrent_lookups: 32,
            lookup_timeout_ms: 1000,
        }
    }
}

/// `[reservations]`: the reservation manager and its ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReservationsConfig {
    /// Bounded mailbox of the reservation manager. Releases arrive from `Drop`, so it
    /// is larger than the planner's to absorb bursts of finished requests.
    pub mailbox_capacity: usize,
    /// Reserve pages for a pool prefix at admission. Window loads need it, so a layout with
    /// window groups is refused while this is off (R7).
    pub prefix_aware_scheduling: bool,
}

impl Default for ReservationsConfig {
    fn default() -> Self {
        Self {
            mailbox_capacity: 1024,
            prefix_aware_scheduling: true,
        }
    }
}

/// `[loaders]`: the loader actors that move pool objects into device pages (R23-R26).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadersConfig {
    /// Number of loaders, each with its own stream and staging pool (R23). More overlap
    /// more loads, at `staging_bytes_per_loader` each.
    pub load_threads: usize,
    /// Load inside the engine step instead of in the background (R23): slower, but the old
    /// behaviour, kept for debugging and comparison.
    pub sync_load: bool,
    /// Pinned host memory each loader stages pool objects in; bounds the bytes one loader
    /// has in flight. Counts against `node.memory_budget_bytes` (R9).
    pub staging_bytes_per_loader: u64,
    /// Bounded mailbox of each loader.
    pub mailbox_capacity: usize,
    /// A load not finished after this long is failed, so the engine computes the prefix
    /// itself rather than waiting forever (R25).
    pub load_timeout_ms: u64,
}

impl Default for LoadersConfig {
    fn default() -> Self {
        Self {
            load_threads: 2,
            sync_load: false,
            staging_bytes_per_loader: 256 * MIB,
            mailbox_capacity: 64,
            load_timeout_ms: 30_000,
        }
    }
}

/// `[saver]`: the save queue and its actor (R16-R22).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SaverConfig {
    /// Queue window pages ahead of full-attention blocks (R21): a prompt end is only
    /// reusable once its window is stored, and window pages are few.
    pub window_first: bool,
    /// Re-save threshold in computed tokens (R20); 0 turns re-save off. Long prompts
    /// re-list their blocks so an evicted head block cannot orphan the chain.
    pub resave_min_tokens: u64,
    /// Window checkpoints (R28): every multiple of this many tokens a prompt's chunk
    /// passes, window groups also save the window read there, so a prefix shared but never
    /// ended at can be resumed; 0 turns them off. A multiple of the layout's block size.
    pub window_checkpoint_tokens: u64,
    /// Most pages the save queue holds; a full queue sheds whole requests, the oldest
    /// first (R22), so it should hold at least one step's pages of a request. Bounds the
    /// pages held back from the engine.
    pub queue_capacity_pages: usize,
    /// Pinned host memory the saver stages device pages in before the pool put. Counts
    /// against `node.memory_budget_bytes` (R9).
    pub staging_bytes: u64,
    /// Bounded mailbox of the saver actor (its handler only queues, so it drains fast).
    pub mailbox_capacity: usize,
    /// At shutdown, how long queued saves may still run before what is left is dropped
    /// (counted in `saves_dropped`). Bounds how long a stopping process waits on a slow
    /// pool; 0 drops every queued save at once.
    pub shutdown_drain_timeout_ms: u64,
    /// A put the pool refused for want of room (a full pool) is saved again this many times
    /// at most, after the pool has had a chance to evict (R35); 0 fails it at once.
    pub no_space_retries: u32,
    /// The wait before the first such retry; it doubles for each later one (20, 40, 80 ms
    /// with the defaults: Mooncake's master evicts every 10 ms).
    pub no_space_backoff_ms: u64,
}

impl Default for SaverConfig {
    fn default() -> Self {
        Self {
            window_first: true,
            resave_min_tokens: 0,
            window_checkpoint_tokens: 8192,
            queue_capacity_pages: 65_536,
            staging_bytes: 256 * MIB,
            mailbox_capacity: 1024,
            shutdown_drain_timeout_ms: 10_000,
            no_space_retries: 3,
            no_space_backoff_ms: 20,
        }
    }
}

/// `[handoff]`: how the engine thread hands messages to the actors (the courier,
/// `connector::courier`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HandoffConfig {
    /// Bounded outbox between the engine thread and the courier. A full outbox refuses
    /// at once, as a full actor mailbox does: lookups wait for the next flush, loads
    /// fail, save pages are dropped and counted.
    pub outbox_capacity: usize,
    /// How long the courier sleeps between polls of the outbox while messages keep
    /// coming. While it polls, a hand-off wakes no thread, so the engine's step pays no
    /// system call; each message waits up to this long. 0: the courier parks whenever the
    /// outbox is empty, and every hand-off wakes it (the lowest delay, the highest cost on
    /// the engine thread).
    pub poll_interval_us: u64,
    /// Idle time after which the courier stops polling and parks, so an idle connector
    /// costs no CPU; the next hand-off wakes it. Keep it above the engine's step interval
    /// (tens of ms for a real engine): below it the courier parks between steps, and each
    /// step's first hand-off pays a wake-up on the engine thread again.
    pub park_after_idle_ms: u64,
}

impl Default for HandoffConfig {
    fn default() -> Self {
        Self {
            outbox_capacity: 1024,
            poll_interval_us: 100,
            park_after_idle_ms: 200,
        }
    }
}

/// `[stats]`: the stats reporter (R27).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatsConfig {
    /// Seconds between INFO reports: often enough to follow a run, rare enough not to flood
    /// the log.
    pub interval_s: u64,
    /// `HOST:PORT` of the Prometheus metrics endpoint (`GET /metrics`), or empty for none:
    /// off by default, since a listening port is something an operator opts into.
    pub metrics_addr: String,
    /// This connector's name in its stats log lines (`instance=...`), e.g. the engine's
    /// instance and rank, so that several connectors' lines can be told apart; empty: the
    /// lines carry `instance="0"`.
    pub instance: String,
}

impl Default for StatsConfig {
    fn default() -> Self {
        Self {
            interval_s: 30,
            metrics_addr: String::new(),
            instance: String::new(),
        }
    }
}
