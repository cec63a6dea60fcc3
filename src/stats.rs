//! Statistics: per-actor counters and latency histograms, merged by the stats reporter
//! (R27).
//!
//! Each actor owns its counters and histograms as plain fields (no shared atomics); on a
//! report tick it hands over its interval counters (swapping its interval histograms out with
//! `std::mem::take`), and the reporter merges samples with [`Latency::merge`].
//! Metric names follow `kv_connector_<subsystem>_<what>_{total,seconds,bytes}`.
//!
//! # Accounting
//!
//! Every save and every load ends counted exactly once, so a snapshot taken when nothing
//! is in flight (after `settle_saves`, with no load pending) is closed:
//!
//! - `stats::A1`. `saves_enqueued = saves_done + saves_skipped_present + saves_dropped +
//!   saves_failed` (pages a full saver mailbox refused count as enqueued and dropped, and so
//!   do pages lost to a pool outage, also counted in `saves_outage`, R30; pages the pool
//!   refused for want of room are failed, also counted in `saves_no_space`);
//! - `stats::A2`. `loads_started = loads_done + loads_failed + stale_completions` (loads the handle
//!   failed at once count as started and failed; a stale completion, R26, is a load whose
//!   reservation the engine released first, and is 0 when the engine waits for every load).
//!
//! [`ConnectorStats::check_accounting`] checks both.

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
    /// Outcome `checkpoint` (R28).
    pub checkpoint: u64,
    /// Outcome `recovered`.
    pub recovered: u64,
    /// Outcome `window_miss`.
    pub window_miss: u64,
    /// Outcome `full_miss`.
    pub full_miss: u64,
    /// Lookups that failed (pool error, bad request): counted as offering nothing.
    pub failed: u64,
    /// Lookups lost to a pool outage (R30): a probe found the pool unreachable or missed
    /// its deadline, or the lookup missed its own, so it offered nothing. Never counted as
    /// `full_miss`.
    pub outage: u64,
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
        self.checkpoint += other.checkpoint;
        self.recovered += other.recovered;
        self.window_miss += other.window_miss;
        self.full_miss += other.full_miss;
        self.failed += other.failed;
        self.outage += other.outage;
        self.deferred += other.deferred;
        self.tokens_offered += other.tokens_offered;
        self.keys_probed += other.keys_probed;
        self.probe_time.merge(&other.probe_time);
    }

    /// Lookups that ended with an outcome.
    pub fn lookups(&self) -> u64 {
        self.full
            + self.rewound
            + self.checkpoint
            + self.recovered
            + self.window_miss
            + self.full_miss
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
    /// Pages shed by the bounded queue or refused by a full mailbox (R22), and pages lost to
    /// a pool outage (`saves_outage`).
    pub saves_dropped: u64,
    /// Pages dropped because the pool was unreachable or missed a deadline (R30); also
    /// counted in `saves_dropped`.
    pub saves_outage: u64,
    /// Re-saved pages found present and refreshed (R20); also counted as skipped.
    pub saves_refreshed: u64,
    /// Pages that could not be stored.
    pub saves_failed: u64,
    /// Pages the pool refused for want of room: full, or no segment mounted yet (a
    /// restarted Mooncake master, until the clients' segments are mounted again); also
    /// counted in `saves_failed`.
    pub saves_no_space: u64,
    /// Payload bytes stored.
    pub bytes_saved: u64,
    /// Largest queue depth seen.
    pub max_queue_depth: u64,
    /// Pages handed to the savers past the chunk end of their step (R16; must be 0).
    pub published_past_chunk_end: u64,
    /// Window pages handed to the savers for window checkpoints alone (R28), not for a
    /// prompt end's sinks and tail (counted by the handle; part of `saves_enqueued`).
    pub checkpoint_pages_planned: u64,
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
        self.saves_outage += other.saves_outage;
        self.saves_refreshed += other.saves_refreshed;
        self.saves_failed += other.saves_failed;
        self.saves_no_space += other.saves_no_space;
        self.bytes_saved += other.bytes_saved;
        self.max_queue_depth = self.max_queue_depth.max(other.max_queue_depth);
        self.published_past_chunk_end += other.published_past_chunk_end;
        self.checkpoint_pages_planned += other.checkpoint_pages_planned;
        self.queue_time.merge(&other.queue_time);
    }
}

/// A snapshot whose accounting is not closed (`stats::A1`, `stats::A2`): some save or load is in
/// flight or was counted nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccountingError {
    /// `stats::A1` does not hold.
    #[error(
        "saves not closed: {enqueued} enqueued but {done} done + {skipped} skipped + {dropped} dropped + {failed} failed"
    )]
    Saves {
        /// `saves_enqueued`.
        enqueued: u64,
        /// `saves_done`.
        done: u64,
        /// `saves_skipped_present`.
        skipped: u64,
        /// `saves_dropped`.
        dropped: u64,
        /// `saves_failed`.
        failed: u64,
    },
    /// `stats::A2` does not hold.
    #[error(
        "loads not closed: {started} started but {done} done + {failed} failed + {stale} stale"
    )]
    Loads {
        /// `loads_started`.
        started: u64,
        /// `loads_done`.
        done: u64,
        /// `loads_failed`.
        failed: u64,
        /// `stale_completions`.
        stale: u64,
    },
}

impl AccountingError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Saves { .. } => "saves_not_closed",
            Self::Loads { .. } => "loads_not_closed",
        }
    }
}

impl SaveStats {
    /// Whether `stats::A1` holds.
    pub fn is_closed(&self) -> bool {
        u128::from(self.saves_enqueued)
            == u128::from(self.saves_done)
                + u128::from(self.saves_skipped_present)
                + u128::from(self.saves_dropped)
                + u128::from(self.saves_failed)
    }
}

impl LoadStats {
    /// Whether `stats::A2` holds.
    pub fn is_closed(&self) -> bool {
        u128::from(self.loads_started)
            == u128::from(self.loads_done)
                + u128::from(self.loads_failed)
                + u128::from(self.stale_completions)
    }
}

/// The pool's health as the connector saw it (R30): totals since start, read from the
/// connector's guarded pool (`pool::guard`) at each collection rather than per interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PoolHealthStats {
    /// The state now: `healthy`, `degraded` or `unreachable`.
    pub state: &'static str,
    /// Times the pool became unreachable.
    pub outages: u64,
    /// Milliseconds it was unreachable, the current outage included.
    pub unreachable_ms: u64,
    /// Calls refused at once because the pool was unreachable.
    pub calls_refused: u64,
    /// Probe calls that missed their deadline (`pool.probe_timeout_ms`).
    pub calls_timed_out: u64,
}

impl Default for PoolHealthStats {
    fn default() -> Self {
        Self {
            state: "healthy",
            outages: 0,
            unreachable_ms: 0,
            calls_refused: 0,
            calls_timed_out: 0,
        }
    }
}

impl PoolHealthStats {
    /// Whether the pool is marked unreachable now.
    pub fn is_unreachable(&self) -> bool {
        self.state == "unreachable"
    }

    /// Adds another connector's counts; the state becomes the worse of the two.
    pub fn merge(&mut self, other: &PoolHealthStats) {
        let rank = |state: &str| match state {
            "unreachable" => 2,
            "degraded" => 1,
            _ => 0,
        };
        if rank(other.state) > rank(self.state) {
            self.state = other.state;
        }
        self.outages += other.outages;
        self.unreachable_ms += other.unreachable_ms;
        self.calls_refused += other.calls_refused;
        self.calls_timed_out += other.calls_timed_out;
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
    /// The pool's health (R30).
    pub pool: PoolHealthStats,
}

impl ConnectorStats {
    /// Adds another collection's counts.
    pub fn merge(&mut self, other: &ConnectorStats) {
        self.lookups.merge(&other.lookups);
        self.loads.merge(&other.loads);
        self.saves.merge(&other.saves);
        self.pool.merge(&other.pool);
    }

    /// Checks `stats::A1` and `stats::A2` (module docs); call it when nothing is in flight.
    ///
    /// # Errors
    ///
    /// [`AccountingError`] with every count of the equation that does not hold.
    pub fn check_accounting(&self) -> Result<(), AccountingError> {
        let saves = &self.saves;
        if !saves.is_closed() {
            return Err(AccountingError::Saves {
                enqueued: saves.saves_enqueued,
                done: saves.saves_done,
                skipped: saves.saves_skipped_present,
                dropped: saves.saves_dropped,
                failed: saves.saves_failed,
            });
        }
        let loads = &self.loads;
        if !loads.is_closed() {
            return Err(AccountingError::Loads {
                started: loads.loads_started,
                done: loads.loads_done,
                failed: loads.loads_failed,
                stale: loads.stale_completions,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a1_a2_closed_snapshots_pass_and_open_ones_name_the_counts() {
        let mut stats = ConnectorStats::default();
        stats.saves.saves_enqueued = 10;
        stats.saves.saves_done = 4;
        stats.saves.saves_skipped_present = 3;
        stats.saves.saves_dropped = 2;
        stats.saves.saves_failed = 1;
        stats.loads.loads_started = 5;
        stats.loads.loads_done = 3;
        stats.loads.loads_failed = 2;
        assert_eq!(stats.check_accounting(), Ok(()));
        stats.saves.saves_enqueued = 11;
        let err = stats
            .check_accounting()
            .expect_err("one save counted nowhere");
        assert_eq!(err.kind(), "saves_not_closed");
        assert!(err.to_string().contains("11 enqueued"), "{err}");
        stats.saves.saves_enqueued = 10;
        stats.loads.stale_completions = 1;
        let err = stats.check_accounting().expect_err("a load counted twice");
        assert_eq!(err.kind(), "loads_not_closed");
    }
}
