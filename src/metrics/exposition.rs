//! Encodes connector totals as `OpenMetrics` text (which Prometheus scrapes) with
//! `prometheus-client`.
//!
//! The metric set is the families table ([`crate::stats::families::FAMILIES`]); each
//! family's series are the counters and histograms whose declaration names it
//! (`stats::declare`), so a new counter reaches the endpoint without an edit here. Latency
//! buckets are read from the stats' HDR histograms ([`crate::stats::Latency`]) at
//! [`BUCKET_BOUNDS_MICROS`]. Each family is written once, with one series per connector
//! (`connector="<label>"`) and, in a labelled family, per label value.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

pub use crate::stats::families::PREFIX;
use crate::stats::families::{Family, FamilyType, FAMILIES};
use crate::stats::{ConnectorStats, Latency};

/// The `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the histogram buckets, in microseconds (100 us to 60 s; `+Inf` after).
pub const BUCKET_BOUNDS_MICROS: [u64; 18] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

/// The name of every series family as a scraper sees it (with prefix and suffixes), for
/// the docs and their test.
#[cfg(feature = "internals")]
pub fn exposed_names() -> Vec<String> {
    FAMILIES.iter().map(Family::exposed_name).collect()
}

/// The totals of every connector, as a `prometheus-client` collector.
#[derive(Debug)]
struct Snapshot(Vec<(String, ConnectorStats)>);

impl Snapshot {
    /// A counter or gauge family: every declared counter that names it.
    fn encode_values(
        &self,
        family: &Family,
        encoder: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let unit = family.unit.map(|unit| Unit::Other(unit.to_owned()));
        let metric_type = match family.kind {
            FamilyType::Gauge => MetricType::Gauge,
            _ => MetricType::Counter,
        };
        let mut metric =
            encoder.encode_descriptor(family.name, family.help, unit.as_ref(), metric_type)?;
        for (connector, stats) in &self.0 {
            for (counter, value) in stats.readings() {
                if counter.family != Some(family.name) {
                    continue;
                }
                let mut labels = vec![("connector", connector.as_str())];
                if let (Some(label), Some(label_value)) = (family.label, counter.label_value) {
                    labels.push((label, label_value));
                }
                let mut series = metric.encode_family(&labels)?;
                match family.kind {
                    FamilyType::Gauge => series.encode_gauge(&value)?,
                    _ => series.encode_counter::<NoLabelSet, u64, u64>(&value, None)?,
                }
            }
        }
        Ok(())
    }

    /// A histogram family: every declared latency that names it.
    fn encode_histogram(
        &self,
        family: &Family,
        encoder: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let mut metric = encoder.encode_descriptor(
            family.name,
            family.help,
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (connector, stats) in &self.0 {
            for (latency, histogram) in stats.latencies() {
                if latency.family != family.name {
                    continue;
                }
                let (sum, count, buckets) = histogram_buckets(histogram);
                metric
                    .encode_family(&vec![("connector", connector.as_str())])?
                    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        Ok(())
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in FAMILIES {
            match family.kind {
                FamilyType::Histogram => self.encode_histogram(family, &mut encoder)?,
                FamilyType::Counter | FamilyType::Gauge => {
                    self.encode_values(family, &mut encoder)?;
                }
            }
        }
        Ok(())
    }
}

/// Sum (seconds), count and per-bucket counts (upper bound in seconds, `f64::MAX` for
/// `+Inf`) of a latency histogram, in the form `encode_histogram` takes.
fn histogram_buckets(latency: &Latency) -> (f64, u64, Vec<(f64, u64)>) {
    let cumulative = latency.counts_at_or_below(&BUCKET_BOUNDS_MICROS);
    let count = latency.count();
    let mut buckets = Vec::with_capacity(BUCKET_BOUNDS_MICROS.len() + 1);
    let mut below = 0;
    for (&bound, &at_or_below) in BUCKET_BOUNDS_MICROS.iter().zip(&cumulative) {
        // HDR counts are approximate at bucket edges; keep the cumulative series monotone.
        let at_or_below = at_or_below.clamp(below, count);
        #[expect(
            clippy::cast_precision_loss,
            reason = "bucket bounds are small constants"
        )]
        buckets.push((bound as f64 / 1e6, at_or_below - below));
        below = at_or_below;
    }
    buckets.push((f64::MAX, count - below));
    (latency.sum_micros() / 1e6, count, buckets)
}

/// Encodes the totals of every `(label, stats)` connector as `OpenMetrics` text, ending with
/// the `# EOF` marker.
///
/// # Errors
///
/// Only when formatting into the string fails, which `String` never does.
pub fn encode(connectors: Vec<(String, ConnectorStats)>) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix(PREFIX);
    registry.register_collector(Box::new(Snapshot(connectors)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn sample() -> ConnectorStats {
        let mut stats = ConnectorStats::default();
        stats.lookups.full = 3;
        stats.lookups.full_miss = 1;
        stats.loads.loads_failed = 4;
        stats.loads.failed_evicted = 1;
        stats.loads.failed_corrupt = 2;
        stats.saves.bytes_saved = 4096;
        stats.saves.max_queue_depth = 7;
        stats.lookups.probe_time.record(Duration::from_micros(300));
        stats.lookups.probe_time.record(Duration::from_millis(20));
        stats
    }

    /// The value of the series `line_start` (name and labels, as written).
    fn value(text: &str, line_start: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(line_start)?.trim().parse().ok())
    }

    #[test]
    fn counters_carry_the_connector_and_their_own_label() -> Result<(), std::fmt::Error> {
        let text = encode(vec![("0".into(), sample()), ("1".into(), sample())])?;
        let full = "kv_connector_lookup_outcomes_total{connector=\"1\",outcome=\"full\"}";
        assert_eq!(value(&text, full), Some(3.0), "{text}");
        let other = "kv_connector_load_failed_total{connector=\"0\",cause=\"other\"}";
        assert_eq!(value(&text, other), Some(1.0), "{text}");
        let bytes = "kv_connector_save_bytes_total{connector=\"0\"}";
        assert_eq!(value(&text, bytes), Some(4096.0), "{text}");
        let depth = "kv_connector_save_queue_depth_max_pages{connector=\"0\"}";
        assert_eq!(value(&text, depth), Some(7.0), "{text}");
        assert!(text.ends_with("# EOF\n"));
        Ok(())
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_the_count() -> Result<(), std::fmt::Error> {
        let text = encode(vec![("0".into(), sample())])?;
        let bucket = |le: &str| {
            value(
                &text,
                &format!("kv_connector_lookup_probe_seconds_bucket{{le=\"{le}\",connector=\"0\"}}"),
            )
        };
        assert_eq!(bucket("0.00025"), Some(0.0), "{text}");
        assert_eq!(bucket("0.0005"), Some(1.0), "{text}");
        assert_eq!(bucket("0.025"), Some(2.0), "{text}");
        assert_eq!(bucket("+Inf"), Some(2.0), "{text}");
        let count = "kv_connector_lookup_probe_seconds_count{connector=\"0\"}";
        assert_eq!(value(&text, count), Some(2.0), "{text}");
        let sum = value(
            &text,
            "kv_connector_lookup_probe_seconds_sum{connector=\"0\"}",
        );
        assert!(
            sum.is_some_and(|sum| (sum - 0.0203).abs() < 0.0002),
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn every_exposed_name_appears_in_the_output() -> Result<(), std::fmt::Error> {
        let text = encode(vec![("0".into(), ConnectorStats::default())])?;
        for name in exposed_names() {
            assert!(
                text.lines().any(|line| line.starts_with(&name)),
                "{name} missing from:\n{text}"
            );
            assert!(name.starts_with("kv_connector_"), "{name}");
        }
        Ok(())
    }
}
