//! The replay report: one JSON object (`--json`) and a summary table (`docs/DESIGN.md` section 11,
//! "Output").
//!
//! Simulated figures (everything under `sim`, TTFT, throughput) come from the cost model;
//! wall-clock figures (`connector_step_us`, `wall_seconds`) are measured. The table prints
//! them in separate sections so they are never mixed up.
//!
//! JSON fields (top level): `requests`, `completed`, `prompt_tokens`, `computed_tokens`,
//! `reused_tokens`, `oracle_reusable_tokens` (this replay's requests only: processes that
//! share one pool can reuse more, so `reused_share_of_oracle` may exceed 1),
//! `reused_share_of_prompt`,
//! `reused_share_of_oracle`, `oracle_window_reusable_tokens`,
//! `reused_share_of_window_oracle`, `oracle_window_checkpoint_reusable_tokens`,
//! `reused_share_of_window_checkpoint_oracle`, `window_bytes_per_load` {`loads`, `max`,
//! `mean`, `bound`}, `local_hit_tokens`, `local_match_shrunk`, `verified_pages`,
//! `mismatched_pages`, `lookups` (the connectors' lookup counters, named as they are
//! declared in `stats`: `full`, `rewound`, `checkpoint`, `recovered`, `window_miss`,
//! `full_miss`, `failed`, `outage`, `deferred`, `tokens_offered`, `keys_probed`, `lookups`,
//! and `probe_time_us`, the probes' wall-clock latency), `pages_loaded`,
//! `bytes_loaded`, `modeled_bytes_loaded`, `pages_saved`, `bytes_saved`,
//! `saves_skipped_present`, `saves_dropped`, `saves_outage` (dropped because the pool was
//! unreachable or late, R30; part of `saves_dropped`), `pool_health` {`state`, `outages`,
//! `unreachable_ms`, `calls_refused`, `calls_timed_out`, `unreachable`}, `saves_enqueued`,
//! `checkpoint_pages_enqueued` (window pages enqueued for window checkpoints alone, R28;
//! part of `saves_enqueued`), `saves_done`, `saves_failed`, `saves_no_space` (refused by
//! the pool for want of room after the last retry; part of `saves_failed`), `saves_retried`
//! (pages refused for room and saved again, R35, each once), `loads_started`,
//! `loads_done`, `loads_filled`, `loads_failed`, `stale_load_reports`,
//! `unexpected_save_reports`, `offers_trimmed`, `loads_released_in_flight`,
//! `pages_released_in_flight` (`--release-during-loads`: loads the engines released half
//! of while they ran, and the pages per rank they took back; each such page is checked in
//! `verified_pages` / `mismatched_pages`, R29), `held_at_end`, `published_past_chunk_end`
//! (pages handed to the pool past the chunk end of their step, R16, as the connectors
//! counted them; must be 0), `published_uncomputed_pages` (objects the pool received whose
//! payload is not their block's computed content, counted at the pool by the replay's
//! witness, `super::witness`; must be 0), `drafter`
//! (null without `--drafter`; else {`draft_tokens`, `acceptance`, `tokens_proposed`,
//! `tokens_accepted`, `pages_written`, `pages_rewound`, `by_prefix` {`pool`, `local`,
//! `computed`: {`requests`, `tokens_proposed`, `tokens_accepted`}}, `draft_kv_in_layout`}), `sim` {`duration_s`,
//! `throughput_rps`, `ttft_p50_s`, `ttft_p99_s`, `ttft_max_s`, `steps`},
//! `connector_step_us` {`count`, `p50`, `p99`, `max`}, `connector_step_cpu_us` (same keys),
//! `wall_seconds`, `wall_waits` {`saves_settling_s`, `lookups_s`, `stalled_s`, `start_stop_s`}, `stopped_by` (only in a partial report: `sigint` or `sigterm`), `node`
//! (only with `--node`: `I/N`, the share this process replayed),
//! `setup` {..., `local_prefix_cache`, `swa_rewind_tokens`,
//! `window_fallback`, `window_first`, `window_checkpoint_tokens`,
//! `save_queue_capacity_pages`, ...}; with `--faults`,
//! also `faults_injected` {point name: times it fired}; with a baseline run, `baseline`
//! {`with_connector`, `without_connector` (each {`ttft_p50_s`, `ttft_p99_s`,
//! `throughput_rps`, `computed_tokens`}), `ttft_p50_speedup`, `ttft_p99_speedup`,
//! `throughput_ratio`, `computed_tokens_ratio`}.
//!
//! Accounting ([`ReplayReport::accounting_closed`]): `saves_enqueued =
//! saves_done + saves_skipped_present + saves_dropped + saves_failed` and `loads_started =
//! loads_done + loads_failed`, every term from the connectors, which count each load once:
//! a load cut off by a stop (SIGINT) is counted failed by its connector's shutdown though
//! its engine never sees it reported, so a partial report closes too. `loads_filled` is
//! the engines' count of reservations reported filled.
//!
//! Reuse has two sources that never overlap: `reused_tokens` came from the pool (filled
//! loads), `local_hit_tokens` from the instance's own local prefix cache (only with
//! `--local-prefix-cache`); `computed_tokens` is what the engines computed themselves.
//! The connector is asked only past the local match, so a lookup it leaves no candidate
//! block to (a repeated prompt served locally) counts as `full_miss`; the page check
//! (`verified_pages`, `mismatched_pages`) covers locally shared pages as well as loaded
//! ones.

use std::io::{self, Write};

use serde::Serialize;

use crate::stats::LatencySummary;

use super::baseline::BaselineComparison;
use super::cost::CostModel;
use super::engine::{DraftTally, DraftsByPrefix};

/// Simulated-time figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SimSummary {
    /// From 0 to the last request's last answer token.
    pub duration_s: f64,
    /// Completed requests per simulated second.
    pub throughput_rps: f64,
    /// Median time to first token.
    pub ttft_p50_s: f64,
    /// 99th percentile time to first token.
    pub ttft_p99_s: f64,
    /// Longest time to first token.
    pub ttft_max_s: f64,
    /// Engine steps over all instances.
    pub steps: u64,
}

/// Where the replay's wall-clock seconds went besides stepping: waiting on its connectors,
/// in three kinds, and starting and stopping them. The replay keeps one schedule on any
/// pool: before a step that looks requests up it waits until every save has settled, so
/// that each lookup sees every earlier save; engines wait for their lookups' answers (up
/// to the lookup wait); and when only connectors can move things on (a load past its
/// modeled end, pages that saves hold), the replay waits for them. On a pool slower than
/// the embedded one these say what its wall time went to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WallWaits {
    /// Seconds waiting for every save to settle before lookups, and for the last saves
    /// at the end.
    #[serde(rename = "saves_settling_s")]
    pub saves_settling: f64,
    /// Seconds engines waited for their lookups' answers.
    #[serde(rename = "lookups_s")]
    pub lookups: f64,
    /// Seconds the replay stalled with only connectors able to move it on.
    #[serde(rename = "stalled_s")]
    pub stalled: f64,
    /// Seconds spent starting the pool's clients and the connectors, and stopping the
    /// connectors: not waiting, but a part of `wall_seconds` that a pool's clients set.
    #[serde(rename = "start_stop_s")]
    pub start_stop: f64,
}

/// One group's page sizes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PageBytes {
    /// The group id.
    pub group: u32,
    /// The layout's page bytes (what the cost model moves).
    pub full: u64,
    /// Bytes really stored and moved (`--kv-bytes-scale`).
    pub stored: u64,
}

/// How the replay was set up.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SetupSummary {
    /// `kvc` or `none`.
    pub connector: String,
    /// Where pages lived: `host` or `cuda` (`device.kind` resolved).
    pub device: String,
    /// The layout's name.
    pub model: String,
    /// The layout fingerprint (R4), hex.
    pub layout_fingerprint: String,
    /// `T`.
    pub tokens_per_block: u32,
    /// Tensor-parallel ranks per instance.
    pub world_size: u32,
    /// Context instances.
    pub instances: usize,
    /// `round-robin` or `session`.
    pub routing: String,
    /// Prompt tokens per step.
    pub max_num_tokens: usize,
    /// Whether each instance kept a local prefix cache (`--local-prefix-cache`).
    pub local_prefix_cache: bool,
    /// KV pages per group per instance.
    pub kv_pages: u32,
    /// The scale of stored page bytes; the cost model always uses full sizes.
    pub kv_bytes_scale: f64,
    /// Page sizes per group.
    pub page_bytes: Vec<PageBytes>,
    /// Bytes the simulated devices allocate (all instances and ranks).
    pub device_bytes: u64,
    /// `memory`.
    pub pool: String,
    /// The modeled pool capacity (full page sizes).
    pub pool_capacity_bytes: u64,
    /// The capacity really allocated (scaled).
    pub pool_stored_capacity_bytes: u64,
    /// The cost model's numbers.
    pub cost_model: CostModel,
    /// `R` in force (`planner.swa_endpoint_rewind_tokens`; used only with window groups).
    pub swa_rewind_tokens: u64,
    /// `planner.window_fallback` (R13).
    pub window_fallback: bool,
    /// `saver.window_first` (R21).
    pub window_first: bool,
    /// `saver.window_checkpoint_tokens`, `I` (R28; 0 = off; used only with window groups).
    pub window_checkpoint_tokens: u64,
    /// `saver.queue_capacity_pages` (R22).
    pub save_queue_capacity_pages: usize,
}

/// Window groups' bytes per filled load (R15), per rank at full page size.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WindowLoadBytes {
    /// Filled loads that moved window-group pages.
    pub loads: u64,
    /// The most one load moved.
    pub max: u64,
    /// The mean over those loads.
    pub mean: f64,
    /// R15's bound: per window group, (sink blocks + window blocks + one block) pages;
    /// 0 without window groups.
    pub bound: u64,
}

/// What the simulated drafter did (`--drafter`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DrafterReport {
    /// Draft tokens per step (`--draft-tokens`).
    pub draft_tokens: usize,
    /// Per-token acceptance probability (`--draft-acceptance`).
    pub acceptance: f64,
    /// Draft tokens proposed after prompts' last chunks.
    pub tokens_proposed: u64,
    /// Of those, accepted.
    pub tokens_accepted: u64,
    /// Pages the drafts were written into (per group).
    pub pages_written: u64,
    /// Pages given back after rejected drafts.
    pub pages_rewound: u64,
    /// The same verifications by where each request's prefix came from: pool-served
    /// against locally reused against computed.
    pub by_prefix: DraftsByPrefix,
    /// Whether the layout carries the drafter's KV (a `role = "draft"` group): only then
    /// does a pool-served request's drafter resume on loaded rows rather than none.
    pub draft_kv_in_layout: bool,
}

/// Everything a replay reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayReport {
    /// Requests in the workload.
    pub requests: u64,
    /// Requests whose prompt was computed (their answers are modeled).
    pub completed: u64,
    /// Sum of prompt lengths of delivered requests.
    pub prompt_tokens: u64,
    /// Prompt tokens the engines computed.
    pub computed_tokens: u64,
    /// Prompt tokens loaded from the pool (the local prefix cache's share is
    /// `local_hit_tokens`).
    pub reused_tokens: u64,
    /// What an unbounded prefix pool would have reused.
    pub oracle_reusable_tokens: u64,
    /// `reused_tokens / prompt_tokens`.
    pub reused_share_of_prompt: f64,
    /// `reused_tokens / oracle_reusable_tokens`.
    pub reused_share_of_oracle: f64,
    /// What an unbounded pool holding window groups only at prompt ends would have reused
    /// (`workload::Oracle`'s window oracle); `oracle_reusable_tokens` without window groups.
    pub oracle_window_reusable_tokens: u64,
    /// `reused_tokens / oracle_window_reusable_tokens`.
    pub reused_share_of_window_oracle: f64,
    /// What an unbounded pool holding window groups at prompt ends and at window
    /// checkpoints (R28) would have reused (`workload::Oracle`'s checkpoint window oracle);
    /// `oracle_window_reusable_tokens` with checkpoints off, `oracle_reusable_tokens`
    /// without window groups.
    pub oracle_window_checkpoint_reusable_tokens: u64,
    /// `reused_tokens / oracle_window_checkpoint_reusable_tokens`.
    pub reused_share_of_window_checkpoint_oracle: f64,
    /// Window groups' bytes per filled load against the R15 bound.
    pub window_bytes_per_load: WindowLoadBytes,
    /// Prompt tokens served by the instances' local prefix caches (0 when off).
    pub local_hit_tokens: u64,
    /// Requests whose local match was partly evicted between lookup and admission.
    pub local_match_shrunk: u64,
    /// Loaded or locally shared pages whose bytes matched (per rank).
    pub verified_pages: u64,
    /// Loaded or locally shared pages whose bytes did not; the required number is 0.
    pub mismatched_pages: u64,
    /// Lookup counters (from the connectors).
    pub lookups: crate::stats::LookupStats,
    /// Pages moved into device memory by filled loads (per rank).
    pub pages_loaded: u64,
    /// Their stored bytes.
    pub bytes_loaded: u64,
    /// Their bytes at full page size.
    pub modeled_bytes_loaded: u64,
    /// Pages the connectors stored (from the connectors).
    pub pages_saved: u64,
    /// Bytes the connectors stored.
    pub bytes_saved: u64,
    /// Saves skipped as already present (R19).
    pub saves_skipped_present: u64,
    /// Saves shed by the save queue (R22), and those lost to a pool outage.
    pub saves_dropped: u64,
    /// Saves dropped because the pool was unreachable or missed a deadline (R30); part of
    /// `saves_dropped`.
    pub saves_outage: u64,
    /// The pool's health over the replay, summed over instances (R30).
    pub pool_health: crate::stats::PoolHealthStats,
    /// Save pages enqueued (accounting, module docs).
    pub saves_enqueued: u64,
    /// Window pages enqueued for window checkpoints alone (R28): the extra cost of
    /// checkpoints, part of `saves_enqueued`.
    pub checkpoint_pages_enqueued: u64,
    /// Save pages stored (the same count as `pages_saved`).
    pub saves_done: u64,
    /// Save pages that could not be stored.
    pub saves_failed: u64,
    /// Save pages the pool refused for want of room (full, or no segment mounted yet); part
    /// of `saves_failed`.
    pub saves_no_space: u64,
    /// Save pages the pool refused for want of room and that were saved again (R35), each
    /// once; they end done, skipped or failed like any page.
    pub saves_retried: u64,
    /// Loads the connectors started (accounting, module docs).
    pub loads_started: u64,
    /// Loads the connectors handed over filled.
    pub loads_done: u64,
    /// Reservations reported filled.
    pub loads_filled: u64,
    /// Loads the connectors counted failed (R25): reported failed, stale (R26), or cut off
    /// at shutdown; from the connectors, like `loads_started` and `loads_done`.
    pub loads_failed: u64,
    /// Load reports for unknown reservations (R26).
    pub stale_load_reports: u64,
    /// Save reports for requests whose pages were not held.
    pub unexpected_save_reports: u64,
    /// Offers cut to whole blocks before the last prompt token.
    pub offers_trimmed: u64,
    /// Loads the engines released half of while they ran (`--release-during-loads`, R29).
    pub loads_released_in_flight: u64,
    /// Pages per rank taken back from them and handed to another request.
    pub pages_released_in_flight: u64,
    /// Requests whose pages were still held for saves at the end.
    pub held_at_end: u64,
    /// Pages handed to the pool past the chunk end of their step (R16), as the connectors
    /// counted them; must be 0.
    pub published_past_chunk_end: u64,
    /// Objects handed to the pool whose payload is not their block's computed content
    /// (stale or draft bytes: published past the chunk end, R16, R18), counted at the pool
    /// by the replay's witness, independently of the connectors; must be 0.
    pub published_uncomputed_pages: u64,
    /// The drafter's counts; `None` without `--drafter`.
    pub drafter: Option<DrafterReport>,
    /// Simulated-time figures.
    pub sim: SimSummary,
    /// Wall-clock microseconds inside connector calls per engine step (the hooks the step
    /// calls, plus `lookup_prefix` of requests that arrived since the previous step; not
    /// `wait_for_progress` or `settle_saves`, which only the simulator calls).
    pub connector_step_us: LatencySummary,
    /// The same calls measured in engine-thread CPU time: what the connector costs the
    /// engine thread itself, without the time the thread waited for a core (on a machine
    /// with fewer cores than busy threads the wall figure includes preemption).
    pub connector_step_cpu_us: LatencySummary,
    /// Wall-clock seconds of the whole replay.
    pub wall_seconds: f64,
    /// What parts of `wall_seconds` went to waiting on connectors, and to starting and
    /// stopping them.
    pub wall_waits: WallWaits,
    /// How the replay was set up.
    pub setup: SetupSummary,
    /// The signal that stopped the replay before every request completed (`sigint`,
    /// `sigterm`); absent after a full run. The report is then partial, its accounting
    /// closed all the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    /// With `--node I/N`: which share of the workload this process replayed (`I/N`); the
    /// figures are this node's only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<super::nodes::NodeShare>,
    /// With `--faults`: how often each fault point fired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults_injected: Option<std::collections::BTreeMap<String, u64>>,
    /// With `--compare-baseline` (and in the built-in demo): the same workload without a
    /// connector, side by side.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<BaselineComparison>,
}

/// What to add after a share of the oracle above 1: the oracle counts only this replay's
/// requests, so a pool that other processes also filled can serve more than it.
fn oracle_note(share_of_oracle: f64) -> &'static str {
    if share_of_oracle > 1.0 {
        "\n                      (above 100 %: the pool also held other processes' pages; \
         the oracle counts only this replay's requests)"
    } else {
        ""
    }
}

/// `part / whole`, 0 for an empty whole.
#[expect(clippy::cast_precision_loss, reason = "a ratio for reports")]
pub fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Nearest-rank percentile `q` in `[0, 1]` of sorted values; 0 when empty.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "an index below the slice length"
)]
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Bytes in binary units, for the table.
#[expect(clippy::cast_precision_loss, reason = "display only")]
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A mean of bytes, rounded, for the table.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "display only; means are small and non-negative"
)]
fn mean_bytes(mean: f64) -> u64 {
    mean.round() as u64
}

impl ReplayReport {
    /// Whether every save and load is counted once (module docs, "Accounting").
    pub fn accounting_closed(&self) -> bool {
        u128::from(self.saves_enqueued)
            == u128::from(self.saves_done)
                + u128::from(self.saves_skipped_present)
                + u128::from(self.saves_dropped)
                + u128::from(self.saves_failed)
            && u128::from(self.loads_started)
                == u128::from(self.loads_done) + u128::from(self.loads_failed)
    }

    /// Writes the summary table.
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn write_table(&self, out: &mut dyn Write) -> io::Result<()> {
        self.write_workload(out)?;
        self.write_connector(out)?;
        self.write_times(out)?;
        match &self.baseline {
            Some(baseline) => baseline.write_table(out),
            None => Ok(()),
        }
    }

    /// The header and the workload section: tokens, reuse, the page check.
    fn write_workload(&self, out: &mut dyn Write) -> io::Result<()> {
        let setup = &self.setup;
        writeln!(
            out,
            "replay: {} on {} instance(s) x {} rank(s), connector {}, pool {}, T = {}{}",
            setup.model,
            setup.instances,
            setup.world_size,
            setup.connector,
            setup.pool,
            setup.tokens_per_block,
            if setup.local_prefix_cache {
                ", local prefix cache on"
            } else {
                ""
            }
        )?;
        if setup.kv_bytes_scale < 1.0 {
            writeln!(
                out,
                "  pages stored and moved at {} x their size; the cost model uses full sizes",
                setup.kv_bytes_scale
            )?;
        }
        writeln!(out, "workload")?;
        writeln!(
            out,
            "  requests            {:>14} ({} completed)",
            self.requests, self.completed
        )?;
        writeln!(out, "  prompt tokens       {:>14}", self.prompt_tokens)?;
        writeln!(
            out,
            "  reused (pool)       {:>14} ({:.1} % of prompt, {:.1} % of oracle {}){}",
            self.reused_tokens,
            100.0 * self.reused_share_of_prompt,
            100.0 * self.reused_share_of_oracle,
            self.oracle_reusable_tokens,
            oracle_note(self.reused_share_of_oracle)
        )?;
        if self.oracle_window_reusable_tokens != self.oracle_reusable_tokens {
            writeln!(
                out,
                "  window oracle       {:>14} ({:.1} % reused; R = {})",
                self.oracle_window_reusable_tokens,
                100.0 * self.reused_share_of_window_oracle,
                setup.swa_rewind_tokens
            )?;
        }
        if self.oracle_window_checkpoint_reusable_tokens != self.oracle_window_reusable_tokens {
            writeln!(
                out,
                "  checkpoint oracle   {:>14} ({:.1} % reused; I = {})",
                self.oracle_window_checkpoint_reusable_tokens,
                100.0 * self.reused_share_of_window_checkpoint_oracle,
                setup.window_checkpoint_tokens
            )?;
        }
        if setup.local_prefix_cache {
            writeln!(
                out,
                "  local hit tokens    {:>14} ({:.1} % of prompt; {} matches cut by eviction)",
                self.local_hit_tokens,
                100.0 * share(self.local_hit_tokens, self.prompt_tokens),
                self.local_match_shrunk
            )?;
        }
        writeln!(
            out,
            "  page check          {:>14} verified, {} mismatched",
            self.verified_pages, self.mismatched_pages
        )?;
        Ok(())
    }

    /// The pool outages line (R30), when the pool was ever unreachable or late.
    fn write_outage(&self, out: &mut dyn Write) -> io::Result<()> {
        let health = &self.pool_health;
        if health.outages == 0 && health.calls_timed_out == 0 {
            return Ok(());
        }
        #[expect(clippy::cast_precision_loss, reason = "seconds for a table")]
        let unreachable_s = health.unreachable_ms as f64 / 1000.0;
        writeln!(
            out,
            "  pool outages        {:>14} (unreachable {unreachable_s:.1} s in all, {} calls refused, {} probes past their deadline; lost: {} lookups, {} save pages; pool {} at the end)",
            health.outages,
            health.calls_refused,
            health.calls_timed_out,
            self.lookups.outage,
            self.saves_outage,
            health.state
        )
    }

    /// The connector section: lookups, loads, saves.
    fn write_connector(&self, out: &mut dyn Write) -> io::Result<()> {
        let lookups = &self.lookups;
        writeln!(out, "connector")?;
        writeln!(
            out,
            "  lookups             full {}, rewound {}, checkpoint {}, recovered {}, window_miss {}, full_miss {}, outage {}",
            lookups.full,
            lookups.rewound,
            lookups.checkpoint,
            lookups.recovered,
            lookups.window_miss,
            lookups.full_miss,
            lookups.outage
        )?;
        self.write_outage(out)?;
        writeln!(
            out,
            "  loaded              {:>14} pages, {} ({} modeled)",
            self.pages_loaded,
            human_bytes(self.bytes_loaded),
            human_bytes(self.modeled_bytes_loaded)
        )?;
        if self.window_bytes_per_load.loads > 0 {
            let window = &self.window_bytes_per_load;
            writeln!(
                out,
                "  window per load     {:>14} max, {} mean, bound {} (modeled, per rank)",
                human_bytes(window.max),
                human_bytes(mean_bytes(window.mean)),
                human_bytes(window.bound)
            )?;
        }
        self.write_saves(out)?;
        writeln!(
            out,
            "  loads filled/failed {:>14} / {}",
            self.loads_filled, self.loads_failed
        )?;
        if self.loads_released_in_flight > 0 {
            writeln!(
                out,
                "  released in flight  {:>14} loads, {} pages taken back (checked)",
                self.loads_released_in_flight, self.pages_released_in_flight
            )?;
        }
        writeln!(
            out,
            "  accounting          {:>14} (saves {} = {} done + {} skipped + {} dropped + {} failed; loads {} = {} done + {} failed)",
            if self.accounting_closed() { "closed" } else { "NOT CLOSED" },
            self.saves_enqueued, self.saves_done, self.saves_skipped_present,
            self.saves_dropped, self.saves_failed,
            self.loads_started, self.loads_done, self.loads_failed
        )?;
        if let Some(faults) = &self.faults_injected {
            let fired: Vec<String> = faults
                .iter()
                .filter(|(_, &count)| count > 0)
                .map(|(name, count)| format!("{name} {count}"))
                .collect();
            writeln!(out, "  faults injected     {:>14}", fired.join(", "))?;
        }
        if self.checkpoint_pages_enqueued > 0 {
            #[expect(clippy::cast_precision_loss, reason = "a share for humans")]
            let share =
                self.checkpoint_pages_enqueued as f64 / self.saves_enqueued.max(1) as f64 * 100.0;
            writeln!(
                out,
                "  checkpoint pages    {:>14} window pages enqueued for checkpoints alone ({share:.2} % of pages enqueued)",
                self.checkpoint_pages_enqueued
            )?;
        }
        writeln!(
            out,
            "  past chunk end      {:>14} pages published (must be 0); {} uncomputed pages seen at the pool (must be 0)",
            self.published_past_chunk_end, self.published_uncomputed_pages
        )?;
        if let Some(drafter) = &self.drafter {
            writeln!(
                out,
                "  drafter             {:>14} of {} draft tokens accepted, {} pages rewound",
                drafter.tokens_accepted, drafter.tokens_proposed, drafter.pages_rewound
            )?;
            let rate = |tally: &DraftTally| 100.0 * share(tally.tokens_accepted, tally.tokens_proposed);
            let by = &drafter.by_prefix;
            writeln!(
                out,
                "  drafts by prefix    pool {:.1} % of {} requests, local {:.1} % of {}, computed {:.1} % of {} (draft KV {})",
                rate(&by.pool),
                by.pool.requests,
                rate(&by.local),
                by.local.requests,
                rate(&by.computed),
                by.computed.requests,
                if drafter.draft_kv_in_layout { "loaded with the prefix" } else { "not in the layout" }
            )?;
        }
        Ok(())
    }

    /// The connector section's save lines.
    fn write_saves(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "  saved               {:>14} pages, {}",
            self.pages_saved,
            human_bytes(self.bytes_saved)
        )?;
        writeln!(
            out,
            "  saves skip/drop/fail{:>14} / {} / {}",
            self.saves_skipped_present, self.saves_dropped, self.saves_failed
        )?;
        if self.saves_no_space > 0 {
            writeln!(
                out,
                "  saves no space      {:>14} pages (part of failed: the pool had no room)",
                self.saves_no_space
            )?;
        }
        if self.saves_retried > 0 {
            writeln!(
                out,
                "  saves retried       {:>14} pages (refused for room, saved again)",
                self.saves_retried
            )?;
        }
        Ok(())
    }

    /// The simulated-time and wall-clock sections.
    fn write_times(&self, out: &mut dyn Write) -> io::Result<()> {
        let setup = &self.setup;
        writeln!(out, "simulated time (cost model {})", setup.cost_model.name)?;
        writeln!(out, "  duration            {:>14.3} s", self.sim.duration_s)?;
        writeln!(
            out,
            "  throughput          {:>14.3} requests/s",
            self.sim.throughput_rps
        )?;
        writeln!(
            out,
            "  ttft p50 / p99      {:>14.3} s / {:.3} s",
            self.sim.ttft_p50_s, self.sim.ttft_p99_s
        )?;
        writeln!(out, "wall clock (measured)")?;
        writeln!(
            out,
            "  connector per step  p50 {} us, p99 {} us, max {} us ({} steps)",
            self.connector_step_us.p50,
            self.connector_step_us.p99,
            self.connector_step_us.max,
            self.connector_step_us.count
        )?;
        writeln!(
            out,
            "  ... in thread CPU   p50 {} us, p99 {} us, max {} us",
            self.connector_step_cpu_us.p50,
            self.connector_step_cpu_us.p99,
            self.connector_step_cpu_us.max
        )?;
        writeln!(out, "  replay              {:>14.3} s", self.wall_seconds)?;
        let waits = &self.wall_waits;
        writeln!(
            out,
            "  ... waiting on      saves settling {:.3} s, lookups {:.3} s, stalled {:.3} s",
            waits.saves_settling, waits.lookups, waits.stalled
        )?;
        writeln!(out, "  ... start and stop  {:>14.3} s", waits.start_stop)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&values, 0.5), 50);
        assert_eq!(percentile(&values, 0.99), 99);
        assert_eq!(percentile(&values, 1.0), 100);
        assert_eq!(percentile(&values, 0.0), 1);
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[7], 0.99), 7);
    }

    #[test]
    fn a_share_of_the_oracle_above_one_is_explained() {
        assert_eq!(oracle_note(1.0), "");
        assert_eq!(oracle_note(0.5), "");
        assert!(oracle_note(1.43).contains("only this replay's requests"));
    }

    #[test]
    fn shares_and_bytes_read_well() {
        assert!((share(1, 4) - 0.25).abs() < 1e-12);
        assert!(share(1, 0).abs() < 1e-12);
        assert_eq!(human_bytes(512), "512.0 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
