//! Sums what the driver and every engine counted into the [`ReplayReport`].

use std::time::Duration;

use crate::stats::Latency;

use super::cost::{micros_to_seconds, SimMicros};
use super::driver::ReplayParams;
use super::engine::{EngineCounters, EngineSummary};
use super::report::{
    percentile, share, DrafterReport, PageBytes, ReplayReport, SetupSummary, SimSummary,
    WallWaits, WindowLoadBytes,
};
use super::setup::Deployment;
use super::workload::Oracle;
use crate::stats::ConnectorStats;

/// What the driver itself counts during a run.
#[derive(Clone, Debug, Default)]
pub(super) struct RunTotals {
    /// Requests in the workload.
    pub requests: u64,
    /// Sum of delivered prompt lengths.
    pub prompt_tokens: u64,
    /// Requests with their first token.
    pub completed: u64,
    /// Time to first token of each completed request.
    pub ttft_us: Vec<SimMicros>,
    /// The last answer token of any request.
    pub last_finish_us: SimMicros,
    /// Real time the driver waited for saves to settle.
    pub settling: Duration,
    /// Real time the driver stalled on connectors.
    pub stalled: Duration,
    /// Real time spent building the deployment and its engines, and stopping the engines.
    pub start_stop: Duration,
}

/// Merges per-step latencies of every engine.
fn merge_latencies<'a>(latencies: impl Iterator<Item = &'a Latency>) -> Latency {
    let mut merged = Latency::default();
    for latency in latencies {
        merged.merge(latency);
    }
    merged
}

/// Adds one engine's counters into `sum`.
fn add_counters(sum: &mut EngineCounters, other: &EngineCounters) {
    sum.verified_pages += other.verified_pages;
    sum.mismatched_pages += other.mismatched_pages;
    sum.reused_tokens += other.reused_tokens;
    sum.local_hit_tokens += other.local_hit_tokens;
    sum.local_match_shrunk += other.local_match_shrunk;
    sum.pages_loaded += other.pages_loaded;
    sum.bytes_loaded += other.bytes_loaded;
    sum.modeled_bytes_loaded += other.modeled_bytes_loaded;
    sum.loads_filled += other.loads_filled;
    sum.stale_load_reports += other.stale_load_reports;
    sum.unexpected_save_reports += other.unexpected_save_reports;
    sum.offers_trimmed += other.offers_trimmed;
    sum.loads_released_in_flight += other.loads_released_in_flight;
    sum.pages_released_in_flight += other.pages_released_in_flight;
    sum.computed_tokens += other.computed_tokens;
    sum.steps += other.steps;
    sum.lookup_wait += other.lookup_wait;
    sum.window_loads += other.window_loads;
    sum.window_bytes_loaded += other.window_bytes_loaded;
    sum.window_bytes_per_load_max = sum
        .window_bytes_per_load_max
        .max(other.window_bytes_per_load_max);
    sum.draft_tokens_proposed += other.draft_tokens_proposed;
    sum.draft_tokens_accepted += other.draft_tokens_accepted;
    sum.draft_pages_written += other.draft_pages_written;
    sum.draft_pages_rewound += other.draft_pages_rewound;
    sum.drafts_by_prefix.add(&other.drafts_by_prefix);
}

/// Window groups' bytes per filled load against the R15 bound.
fn window_load_bytes(params: &ReplayParams, counters: &EngineCounters) -> WindowLoadBytes {
    let layout = &params.layout;
    let t = u64::from(layout.tokens_per_block.max(1));
    let bound = layout
        .groups
        .iter()
        .filter(|group| group.is_window())
        .map(|group| {
            let window_tokens = u64::from(group.window_tokens.unwrap_or(0));
            let pages = u64::from(group.sink_tokens).div_ceil(t) + window_tokens.div_ceil(t) + 1;
            pages * layout.page_bytes(group).unwrap_or(0)
        })
        .sum();
    WindowLoadBytes {
        loads: counters.window_loads,
        max: counters.window_bytes_per_load_max,
        mean: share(counters.window_bytes_loaded, counters.window_loads),
        bound,
    }
}

/// The setup section of the report.
fn setup_summary(params: &ReplayParams, deployment: &Deployment, device: &str) -> SetupSummary {
    let layout = &params.layout;
    let page_bytes = layout
        .groups
        .iter()
        .zip(&deployment.stored_page_bytes)
        .map(|(group, &(_, stored))| PageBytes {
            group: group.id.0,
            full: layout.page_bytes(group).unwrap_or(0),
            stored: u64::try_from(stored).unwrap_or(u64::MAX),
        })
        .collect();
    SetupSummary {
        connector: params.connector_name.clone(),
        device: device.to_owned(),
        model: layout.name.clone(),
        layout_fingerprint: layout.fingerprint().to_string(),
        tokens_per_block: layout.tokens_per_block,
        world_size: layout.world_size,
        instances: params.deployment.instances,
        routing: params.routing.as_str().to_owned(),
        max_num_tokens: params.max_num_tokens,
        local_prefix_cache: params.local_prefix_cache,
        kv_pages: deployment.kv_pages,
        kv_bytes_scale: deployment.kv_bytes_scale,
        page_bytes,
        device_bytes: deployment.device_bytes,
        pool: deployment.pool_backend.to_owned(),
        pool_capacity_bytes: params.config.pool.capacity_bytes,
        pool_stored_capacity_bytes: deployment.pool_stored_capacity_bytes,
        cost_model: params.cost.clone(),
        swa_rewind_tokens: params.config.planner.swa_endpoint_rewind_tokens,
        window_fallback: params.config.planner.window_fallback,
        window_first: params.config.saver.window_first,
        window_checkpoint_tokens: params.config.saver.window_checkpoint_tokens,
        save_queue_capacity_pages: params.config.saver.queue_capacity_pages,
    }
}

/// Builds the report from the run's totals and every engine's summary.
pub(super) fn summarize(
    params: &ReplayParams,
    deployment: &Deployment,
    mut totals: RunTotals,
    oracle: &Oracle,
    summaries: &[EngineSummary],
    now: SimMicros,
    wall: Duration,
) -> ReplayReport {
    let mut counters = EngineCounters::default();
    let mut connector = ConnectorStats::default();
    let mut held_at_end = 0_u64;
    for summary in summaries {
        add_counters(&mut counters, &summary.counters);
        connector.merge(&summary.connector);
        held_at_end += u64::try_from(summary.held_at_end).unwrap_or(u64::MAX);
    }
    let latency = merge_latencies(summaries.iter().map(|summary| &summary.step_latency));
    let cpu_latency = merge_latencies(summaries.iter().map(|summary| &summary.step_cpu_latency));
    totals.ttft_us.sort_unstable();
    let duration_s = micros_to_seconds(totals.last_finish_us.max(now));
    let oracle_reusable_tokens = oracle.totals().reusable_tokens;
    let oracle_window_reusable_tokens = oracle.totals().window_reusable_tokens;
    let oracle_window_checkpoint_reusable_tokens =
        oracle.totals().window_checkpoint_reusable_tokens;
    ReplayReport {
        requests: totals.requests,
        completed: totals.completed,
        prompt_tokens: totals.prompt_tokens,
        computed_tokens: counters.computed_tokens,
        reused_tokens: counters.reused_tokens,
        oracle_reusable_tokens,
        reused_share_of_prompt: share(counters.reused_tokens, totals.prompt_tokens),
        reused_share_of_oracle: share(counters.reused_tokens, oracle_reusable_tokens),
        oracle_window_reusable_tokens,
        reused_share_of_window_oracle: share(counters.reused_tokens, oracle_window_reusable_tokens),
        oracle_window_checkpoint_reusable_tokens,
        reused_share_of_window_checkpoint_oracle: share(
            counters.reused_tokens,
            oracle_window_checkpoint_reusable_tokens,
        ),
        window_bytes_per_load: window_load_bytes(params, &counters),
        local_hit_tokens: counters.local_hit_tokens,
        local_match_shrunk: counters.local_match_shrunk,
        verified_pages: counters.verified_pages,
        mismatched_pages: counters.mismatched_pages,
        lookups: connector.lookups,
        pages_loaded: counters.pages_loaded,
        bytes_loaded: counters.bytes_loaded,
        modeled_bytes_loaded: counters.modeled_bytes_loaded,
        pages_saved: connector.saves.saves_done,
        bytes_saved: connector.saves.bytes_saved,
        saves_skipped_present: connector.saves.saves_skipped_present,
        saves_dropped: connector.saves.saves_dropped,
        saves_outage: connector.saves.saves_outage,
        pool_health: connector.pool,
        saves_enqueued: connector.saves.saves_enqueued,
        checkpoint_pages_enqueued: connector.saves.checkpoint_pages_planned,
        saves_done: connector.saves.saves_done,
        saves_failed: connector.saves.saves_failed,
        saves_no_space: connector.saves.saves_no_space,
        saves_retried: connector.saves.saves_retried,
        loads_started: connector.loads.loads_started,
        loads_done: connector.loads.loads_done,
        loads_filled: counters.loads_filled,
        // a load whose reservation was released first (R26) is not handed over filled
        loads_failed: connector.loads.loads_failed + connector.loads.stale_completions,
        stale_load_reports: counters.stale_load_reports,
        unexpected_save_reports: counters.unexpected_save_reports,
        offers_trimmed: counters.offers_trimmed,
        loads_released_in_flight: counters.loads_released_in_flight,
        pages_released_in_flight: counters.pages_released_in_flight,
        held_at_end,
        published_past_chunk_end: connector.saves.published_past_chunk_end,
        published_uncomputed_pages: deployment.witness.uncomputed_pages(),
        drafter: drafter_report(params, &counters),
        sim: SimSummary {
            duration_s,
            throughput_rps: if duration_s > 0.0 {
                share(totals.completed, 1) / duration_s
            } else {
                0.0
            },
            ttft_p50_s: micros_to_seconds(percentile(&totals.ttft_us, 0.5)),
            ttft_p99_s: micros_to_seconds(percentile(&totals.ttft_us, 0.99)),
            ttft_max_s: micros_to_seconds(totals.ttft_us.last().copied().unwrap_or(0)),
            steps: counters.steps,
        },
        connector_step_us: latency.summary(),
        connector_step_cpu_us: cpu_latency.summary(),
        wall_seconds: wall.as_secs_f64(),
        wall_waits: WallWaits {
            saves_settling: totals.settling.as_secs_f64(),
            lookups: counters.lookup_wait.as_secs_f64(),
            stalled: totals.stalled.as_secs_f64(),
            start_stop: totals.start_stop.as_secs_f64(),
        },
        setup: setup_summary(
            params,
            deployment,
            summaries.first().map_or("none", |summary| summary.device),
        ),
        stopped_by: None,
        node: None,
        faults_injected: None,
        baseline: None,
    }
}

/// The drafter's section of the report; `None` without `--drafter`.
fn drafter_report(params: &ReplayParams, counters: &EngineCounters) -> Option<DrafterReport> {
    params.drafter.map(|drafter| DrafterReport {
        draft_tokens: drafter.draft_tokens,
        acceptance: drafter.acceptance,
        tokens_proposed: counters.draft_tokens_proposed,
        tokens_accepted: counters.draft_tokens_accepted,
        pages_written: counters.draft_pages_written,
        pages_rewound: counters.draft_pages_rewound,
        by_prefix: counters.drafts_by_prefix,
        draft_kv_in_layout: params.layout.has_draft_groups(),
    })
}
