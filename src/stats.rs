//! Statistics: per-actor counters and latency histograms, merged by the stats reporter
//! (R27, STYLE G12).
//!
//! Each actor owns its counters and histograms as plain fields (no shared atomics); on a
//! report tick it hands over a [`StatsSample`] (swapping its interval histograms out with
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
