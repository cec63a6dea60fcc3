//! Statistics: per-actor counters and latency histograms, merged by the stats reporter
//! (R27, STYLE G12).
//!
//! Each actor owns its counters and histograms as plain fields (no shared atomics); on a
//! report tick it hands over its interval counters (swapping its interval histograms out with
//! `std::mem::take`), and the reporter merges samples with [`Latency::merge`].
//! Metric names follow `kv_connector_<subsystem>_<what>_{total,seconds,bytes}`.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// A latency histogram in microseconds, 1 us to 1 hour, 3 significant digits.
#[derive(Clone, Debug)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    #[expect(
        clippy::expect_used,
        reason = "constant bounds that hdrhistogram accepts: 1 <= low, high >= 2 * low, 3 digits"
    )]
    fn default() -> Self {
        Latency(
            Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("valid constant histogram bounds"),
        )
    }
}

impl Latency {
    /// Records one duration (clamped into the histogram's range).
    pub fn record(&mut self, duration: Duration) {
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        self.0.saturating_record(micros.max(1));
    }

    /// Records one value already in microseconds.
    pub fn record_micros(&mut self, micros: u64) {
        self.0.saturating_record(micros.max(1));
    }

    /// Adds another histogram's counts into this one.
    pub fn merge(&mut self, other: &Latency) {
        // Both histograms have the same bounds, so `add` cannot fail; a failure would only
        // lose the other's counts, never corrupt these.
        let _ = self.0.add(&other.0);
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// For each of `upper_bounds_micros` (ascending), the values recorded at or below it,
    /// to the histogram's precision: cumulative counts for Prometheus histogram buckets.
    pub fn counts_at_or_below(&self, upper_bounds_micros: &[u64]) -> Vec<u64> {
        upper_bounds_micros
            .iter()
            .map(|&bound| {
                if self.0.is_empty() {
                    0
                } else {
                    self.0.count_between(0, bound)
                }
            })
            .collect()
    }

    /// Sum of the recorded values in microseconds, to the histogram's precision.
    pub fn sum_micros(&self) -> f64 {
        #[expect(
            clippy::cast_precision_loss,
            reason = "an approximate sum for a metric"
        )]
        let count = self.0.len() as f64;
        self.0.mean() * count
    }

    /// Percentiles in microseconds.
    pub fn summary(&self) -> LatencySummary {
        if self.0.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: self.0.len(),
            p50: self.0.value_at_quantile(0.50),
            p99: self.0.value_at_quantile(0.99),
            max: self.0.max(),
        }
    }
}

/// p50, p99 and max of a [`Latency`], in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest value.
    pub max: u64,
}

/// Lookup counters of one interval (R27), kept by the lookup planner.
#[derive(Clone, Debug, Default)]
pub struct LookupStats {
    /// Outcome `full`.
    pub full: u64,
    /// Outcome `rewound`.
    pub rewound: u64,
    /// Outcome `recovered`.
    pub recovered: u64,
    /// Outcome `window_miss`.
    pub window_miss: u64,
    /// Outcome `full_miss`.
    pub full_miss: u64,
    /// Lookups that failed (pool error, bad request): counted as offering nothing.
    pub failed: u64,
    /// Lookups a full planner mailbox deferred to a later step (counted by the handle).
    pub deferred: u64,
    /// Tokens offered to the engine.
    pub tokens_offered: u64,
    /// Keys probed.
    pub keys_probed: u64,
    /// Time spent probing per lookup.
    pub probe_time: Latency,
}

impl LookupStats {
    /// Adds another interval's counts.
    pub fn merge(&mut self, other: &LookupStats) {
        self.full += other.full;
        self.rewound += other.rewound;
        self.recovered += other.recovered;
        self.window_miss += other.window_miss;
        self.full_miss += other.full_miss;
        self.failed += other.failed;
        self.deferred += other.deferred;
        self.tokens_offered += other.tokens_offered;
        self.keys_probed += other.keys_probed;
        self.probe_time.merge(&other.probe_time);
    }

    /// Lookups that ended with an outcome.
    pub fn lookups(&self) -> u64 {
        self.full + self.rewound + self.recovered + self.window_miss + self.full_miss
    }
}

/// Load counters of one interval, kept by the reservation manager (which sees every
/// rank's report).
#[derive(Clone, Debug, Default)]
pub struct LoadStats {
    /// Reservations whose load started.
    pub loads_started: u64,
    /// Reservations filled (every rank).
    pub loads_done: u64,
    /// Reservations failed (R25).
    pub loads_failed: u64,
    /// Failed by cause: an object missing since the probe.
    pub failed_evicted: u64,
    /// Failed by cause: an object that failed verification (R5).
    pub failed_corrupt: u64,
    /// Completions ignored as stale (R26).
    pub stale_completions: u64,
    /// Pages placed on devices (all ranks).
    pub pages_loaded: u64,
    /// Payload bytes placed on devices (all ranks).
    pub bytes_loaded: u64,
    /// Time from `StartLoad` to the last rank's report.
    pub load_time: Latency,
}

impl LoadStats {
    /// Adds another interval's counts.
    pub fn merge(&mut self, other: &LoadStats) {
        self.loads_started += other.loads_started;
        self.loads_done += other.loads_done;
        self.loads_failed += other.loads_failed;
        self.failed_evicted += other.failed_evicted;
        self.failed_corrupt += other.failed_corrupt;
        self.stale_completions += other.stale_completions;
        self.pages_loaded += other.pages_loaded;
        self.bytes_loaded += other.bytes_loaded;
        self.load_time.merge(&other.load_time);
    }
}

/// Save counters of one interval, kept by each rank's saver.
#[derive(Clone, Debug, Default)]
pub struct SaveStats {
    /// Pages enqueued.
    pub saves_enqueued: u64,
    /// Pages stored.
    pub saves_done: u64,
    /// Pages skipped because the key was present (R19).
    pub saves_skipped_present: u64,
    /// Pages shed by the bounded queue or refused by a full mailbox (R22).
    pub saves_dropped: u64,
    /// Re-saved pages found present and refreshed (R20); also counted as skipped.
    pub saves_refreshed: u64,
    /// Pages that could not be stored.
    pub saves_failed: u64,
    /// Payload bytes stored.
    pub bytes_saved: u64,
    /// Largest queue depth seen.
    pub max_queue_depth: u64,
    /// Time from enqueue to settle.
    pub queue_time: Latency,
}

impl SaveStats {
    /// Adds another interval's counts.
    pub fn merge(&mut self, other: &SaveStats) {
        self.saves_enqueued += other.saves_enqueued;
        self.saves_done += other.saves_done;
        self.saves_skipped_present += other.saves_skipped_present;
        self.saves_dropped += other.saves_dropped;
        self.saves_refreshed += other.saves_refreshed;
        self.saves_failed += other.saves_failed;
        self.bytes_saved += other.bytes_saved;
        self.max_queue_depth = self.max_queue_depth.max(other.max_queue_depth);
        self.queue_time.merge(&other.queue_time);
    }
}

/// Everything the connector counted, merged over actors and ranks.
#[derive(Clone, Debug, Default)]
pub struct ConnectorStats {
    /// Lookups.
    pub lookups: LookupStats,
    /// Loads.
    pub loads: LoadStats,
    /// Saves (all ranks).
    pub saves: SaveStats,
}

impl ConnectorStats {
    /// Adds another collection's counts.
    pub fn merge(&mut self, other: &ConnectorStats) {
        self.lookups.merge(&other.lookups);
        self.loads.merge(&other.loads);
        self.saves.merge(&other.saves);
    }
}
