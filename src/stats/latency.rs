//! Latency histograms (HDR, microseconds) and their summaries.

use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// A latency histogram in microseconds, 1 us to 1 hour, 3 significant digits.
#[derive(Clone, Debug, PartialEq)]
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

/// `p50/p99/max` in microseconds, for log lines (`412/1890/2210us`).
impl fmt::Display for LatencySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}us", self.p50, self.p99, self.max)
    }
}
