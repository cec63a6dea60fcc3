//! The values an [`Engine`](super::Engine) takes and hands back: arrived requests, step
//! results, counters and the final summary.

use crate::core::page_names::PromptHashes;
use crate::core::ids::RequestId;
use crate::replay::cost::SimMicros;
use crate::stats::ConnectorStats;
use crate::stats::Latency;

/// A request handed to an instance.
#[derive(Clone, Debug)]
pub struct ArrivedRequest {
    /// Position in the workload.
    pub workload_index: usize,
    /// The id the connector sees.
    pub id: RequestId,
    /// `P`.
    pub prompt_len: usize,
    /// Simulated arrival (after session gating).
    pub arrival_us: SimMicros,
    /// The names of the prompt's pages (R1, default scope; R37 for a drafter's groups).
    pub hashes: PromptHashes,
}

/// A request whose prompt is computed: its first token is out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptDone {
    /// Position in the workload.
    pub workload_index: usize,
    /// Simulated arrival.
    pub arrival_us: SimMicros,
    /// Simulated time of the first token (end of the last chunk's step).
    pub first_token_us: SimMicros,
    /// Prompt tokens loaded from the pool.
    pub reused_tokens: usize,
    /// Prompt tokens served by the local prefix cache.
    pub local_hit_tokens: usize,
}

/// What one call of [`Engine::step`](super::Engine::step) did.
#[derive(Debug, Default)]
pub struct StepResult {
    /// Whether any request changed state (admitted, resumed, computed, freed).
    pub changed: bool,
    /// Simulated duration of the step (0 when nothing was computed).
    #[cfg(feature = "internals")]
    pub duration_us: SimMicros,
    /// Requests whose prompt finished in this step.
    pub done: Vec<PromptDone>,
}

/// Counters of one engine, summed by the driver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Loaded or locally shared pages whose bytes matched (per rank).
    pub verified_pages: u64,
    /// Loaded or locally shared pages whose bytes did not (per rank).
    pub mismatched_pages: u64,
    /// Prompt tokens loaded from the pool (filled reservations).
    pub reused_tokens: u64,
    /// Prompt tokens served by the local prefix cache (the local matches admitted).
    pub local_hit_tokens: u64,
    /// Requests whose local match was partly evicted between lookup and admission (they
    /// took the shorter match and gave the connector's offer back).
    pub local_match_shrunk: u64,
    /// Pages moved into device memory by filled loads (per rank).
    pub pages_loaded: u64,
    /// Their bytes as stored.
    pub bytes_loaded: u64,
    /// Their bytes at the layout's full page size (what the cost model moved).
    pub modeled_bytes_loaded: u64,
    /// Reservations reported filled.
    pub loads_filled: u64,
    /// Load reports for reservations the engine does not know (R26: ignored).
    pub stale_load_reports: u64,
    /// Save reports for requests whose pages were not held.
    pub unexpected_save_reports: u64,
    /// Offers cut to whole blocks before the last prompt token.
    pub offers_trimmed: u64,
    /// Loads the engine released half of while they ran (`--release-during-loads`, R29).
    pub loads_released_in_flight: u64,
    /// Pages (per rank) it took back from them and handed to another request.
    pub pages_released_in_flight: u64,
    /// Prompt tokens the engine computed itself.
    pub computed_tokens: u64,
    /// Steps that called `on_step`.
    pub steps: u64,
    /// Real time spent waiting for lookups' answers.
    pub lookup_wait: std::time::Duration,
    /// Filled loads that moved window-group pages (R15).
    pub window_loads: u64,
    /// Window-group bytes per rank those loads moved, at full page size.
    pub window_bytes_loaded: u64,
    /// The most window-group bytes per rank one load moved, at full page size (R15 bounds
    /// it by the sinks, the window and one block per window group).
    pub window_bytes_per_load_max: u64,
    /// Draft tokens the drafter proposed after prompts' last chunks.
    pub draft_tokens_proposed: u64,
    /// Of those, accepted by the target's verification.
    pub draft_tokens_accepted: u64,
    /// Pages (per group, all ranks at once) the drafter wrote draft tokens into.
    pub draft_pages_written: u64,
    /// Pages given back because they held only rejected draft tokens.
    pub draft_pages_rewound: u64,
    /// The drafter's verifications, by where the request's prefix came from.
    pub drafts_by_prefix: DraftsByPrefix,
}

/// The drafter's proposals and acceptances of requests whose reused prefix came from the
/// pool, from the local prefix cache alone, or that computed their whole prompt: with the
/// drafter's KV in the layout, a pool-served request resumes its drafter on the same rows
/// as a locally reused one (R37), so the rates agree up to the requests' own draws.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DraftsByPrefix {
    /// Some prefix tokens were loaded from the pool.
    pub pool: DraftTally,
    /// Prefix tokens came from the local prefix cache only.
    pub local: DraftTally,
    /// Nothing was reused.
    pub computed: DraftTally,
}

/// Draft tokens of one set of requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DraftTally {
    /// Requests whose drafts were verified.
    pub requests: u64,
    /// Draft tokens proposed.
    pub tokens_proposed: u64,
    /// Of those, accepted.
    pub tokens_accepted: u64,
}

impl DraftTally {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &DraftTally) {
        self.requests += other.requests;
        self.tokens_proposed += other.tokens_proposed;
        self.tokens_accepted += other.tokens_accepted;
    }
}

impl DraftsByPrefix {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &DraftsByPrefix) {
        self.pool.add(&other.pool);
        self.local.add(&other.local);
        self.computed.add(&other.computed);
    }
}

/// What an engine hands back at the end of a replay.
#[derive(Debug)]
pub struct EngineSummary {
    /// Where this instance's pages lived (`host` or `cuda`).
    pub device: &'static str,
    /// The engine's counters.
    pub counters: EngineCounters,
    /// Wall-clock time inside connector calls per step.
    pub step_latency: Latency,
    /// Thread CPU time inside connector calls per step (excludes time the engine thread
    /// waited for a core).
    pub step_cpu_latency: Latency,
    /// The connector's own counters.
    pub connector: ConnectorStats,
    /// Finished requests whose pages were still held at the end.
    pub held_at_end: usize,
}

/// Wall-clock and thread-CPU time spent inside connector hooks.
#[derive(Clone, Copy, Debug, Default)]
pub struct HookTime {
    /// Wall-clock time.
    pub wall: std::time::Duration,
    /// CPU time of the engine thread.
    pub cpu: std::time::Duration,
}

impl std::ops::AddAssign for HookTime {
    fn add_assign(&mut self, other: HookTime) {
        self.wall += other.wall;
        self.cpu += other.cpu;
    }
}

/// Measures one stretch of connector calls on the engine thread.
///
/// Reading the thread's CPU clock is a system call (about 1.7 µs on the 2-core VM, far
/// more than most hooks cost), so the CPU clock is read outside the wall-clock window and
/// the CPU figure has the measured cost of an empty timer taken off: neither figure then
/// charges the measurement to the connector.
#[derive(Debug)]
pub struct HookTimer {
    wall: std::time::Instant,
    cpu: cpu_time::ThreadTime,
}

impl HookTimer {
    /// Starts measuring.
    pub fn start() -> Self {
        let cpu = cpu_time::ThreadTime::now();
        let wall = std::time::Instant::now();
        HookTimer { wall, cpu }
    }

    /// Stops and returns what was measured.
    pub fn stop(self) -> HookTime {
        let wall = self.wall.elapsed();
        let cpu = self.cpu.elapsed().saturating_sub(empty_timer_cpu());
        HookTime { wall, cpu }
    }
}

/// The thread CPU time an empty [`HookTimer`] measures: the smallest of a few tries, so
/// a preempted try does not count.
fn empty_timer_cpu() -> std::time::Duration {
    static EMPTY: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *EMPTY.get_or_init(|| {
        (0..64)
            .map(|_| {
                let cpu = cpu_time::ThreadTime::now();
                let wall = std::time::Instant::now();
                std::hint::black_box(wall.elapsed());
                cpu.elapsed()
            })
            .min()
            .unwrap_or_default()
    })
}
