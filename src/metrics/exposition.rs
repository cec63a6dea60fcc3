//! Encodes connector totals as `OpenMetrics` text (which Prometheus scrapes) with
//! `prometheus-client`.
//!
//! The metric set is three tables: labelled counter families ([`COUNTERS`]), gauges
//! ([`GAUGES`]), and latency histograms ([`HISTOGRAMS`]) whose buckets are read from the
//! stats' HDR histograms ([`crate::stats::Latency`]) at [`BUCKET_BOUNDS_MICROS`]. Every name is
//! `kv_connector_` + the table's name, plus the unit and the type's suffix that the encoder
//! appends (`_total` for counters, `_bytes` / `_seconds` for units). Each family is
//! written once, with one series per connector (`connector="<label>"`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::stats::{ConnectorStats, Latency};

/// The `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Prefix of every metric name.
pub const PREFIX: &str = "kv_connector";

/// Upper bounds of the histogram buckets, in microseconds (100 us to 60 s; `+Inf` after).
pub const BUCKET_BOUNDS_MICROS: [u64; 18] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

/// Reads one count out of a connector's totals.
type Count = fn(&ConnectorStats) -> u64;

/// A counter family: one series per connector and per value of `label` (no label when
/// `label` is `None`, with a single series whose value name is ignored).
pub struct CounterFamily {
    /// Name after the prefix, before the unit and `_total`.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Unit suffix, if any.
    pub unit: Option<Unit>,
    /// The label that tells the series apart.
    pub label: Option<&'static str>,
    /// Label value and the count it reads.
    pub series: &'static [(&'static str, Count)],
}

/// Load failures with neither of the two named causes (pool errors, timeouts).
fn other_load_failures(stats: &ConnectorStats) -> u64 {
    let loads = &stats.loads;
    loads
        .loads_failed
        .saturating_sub(loads.failed_evicted + loads.failed_corrupt)
}

/// Pages the saver stored (skipped, dropped and failed ones are other results).
fn saves_stored(stats: &ConnectorStats) -> u64 {
    stats.saves.saves_done
}

/// Every counter family.
pub const COUNTERS: &[CounterFamily] = &[
    CounterFamily {
        name: "lookup_outcomes",
        help: "Lookups by outcome (R11-R13, R28).",
        unit: None,
        label: Some("outcome"),
        series: &[
            ("full", |s| s.lookups.full),
            ("rewound", |s| s.lookups.rewound),
            ("checkpoint", |s| s.lookups.checkpoint),
            ("recovered", |s| s.lookups.recovered),
            ("window_miss", |s| s.lookups.window_miss),
            ("full_miss", |s| s.lookups.full_miss),
        ],
    },
    CounterFamily {
        name: "lookup_outage",
        help: "Lookups lost to a pool outage (R30): the pool was unreachable or did not answer before the deadline, so nothing was offered. Never counted as full_miss.",
        unit: None,
        label: None,
        series: &[("", |s| s.lookups.outage)],
    },
    CounterFamily {
        name: "lookup_failed",
        help: "Lookups that failed (pool error, bad request) and offered nothing.",
        unit: None,
        label: None,
        series: &[("", |s| s.lookups.failed)],
    },
    CounterFamily {
        name: "lookup_offered_tokens",
        help: "Tokens offered to the engine by lookups.",
        unit: None,
        label: None,
        series: &[("", |s| s.lookups.tokens_offered)],
    },
    CounterFamily {
        name: "lookup_probed_keys",
        help: "Pool keys probed by lookups (R14).",
        unit: None,
        label: None,
        series: &[("", |s| s.lookups.keys_probed)],
    },
    CounterFamily {
        name: "load_started",
        help: "Reservations whose load started.",
        unit: None,
        label: None,
        series: &[("", |s| s.loads.loads_started)],
    },
    CounterFamily {
        name: "load_done",
        help: "Reservations filled on every rank (R24).",
        unit: None,
        label: None,
        series: &[("", |s| s.loads.loads_done)],
    },
    CounterFamily {
        name: "load_failed",
        help: "Reservations whose load failed, by cause (R25).",
        unit: None,
        label: Some("cause"),
        series: &[
            ("evicted", |s| s.loads.failed_evicted),
            ("corrupt", |s| s.loads.failed_corrupt),
            ("other", other_load_failures),
        ],
    },
    CounterFamily {
        name: "load_stale_completions",
        help: "Load completions ignored as stale (R26).",
        unit: None,
        label: None,
        series: &[("", |s| s.loads.stale_completions)],
    },
    CounterFamily {
        name: "load_pages",
        help: "Pages placed on devices by loads (all ranks).",
        unit: None,
        label: None,
        series: &[("", |s| s.loads.pages_loaded)],
    },
    CounterFamily {
        name: "load",
        help: "Payload bytes placed on devices by loads (all ranks).",
        unit: Some(Unit::Bytes),
        label: None,
        series: &[("", |s| s.loads.bytes_loaded)],
    },
    CounterFamily {
        name: "save_enqueued_pages",
        help: "Pages enqueued for saving (all ranks).",
        unit: None,
        label: None,
        series: &[("", |s| s.saves.saves_enqueued)],
    },
    CounterFamily {
        name: "save_pages",
        help: "Pages the saver settled, by result (R19, R22).",
        unit: None,
        label: Some("result"),
        series: &[
            ("stored", saves_stored),
            ("skipped_present", |s| s.saves.saves_skipped_present),
            ("dropped", |s| s.saves.saves_dropped),
            ("failed", |s| s.saves.saves_failed),
        ],
    },
    CounterFamily {
        name: "save_outage_pages",
        help: "Pages dropped because the pool was unreachable or missed a deadline (R30); also counted as dropped.",
        unit: None,
        label: None,
        series: &[("", |s| s.saves.saves_outage)],
    },
    CounterFamily {
        name: "save_no_space_pages",
        help: "Pages the pool refused for want of room (full, or no segment mounted yet); also counted as failed.",
        unit: None,
        label: None,
        series: &[("", |s| s.saves.saves_no_space)],
    },
    CounterFamily {
        name: "save_refreshed_pages",
        help: "Re-saved pages found present and refreshed (R20); also counted as skipped.",
        unit: None,
        label: None,
        series: &[("", |s| s.saves.saves_refreshed)],
    },
    CounterFamily {
        name: "save",
        help: "Payload bytes stored by the saver (all ranks).",
        unit: Some(Unit::Bytes),
        label: None,
        series: &[("", |s| s.saves.bytes_saved)],
    },
    CounterFamily {
        name: "pool_outages",
        help: "Times the pool became unreachable (R30).",
        unit: None,
        label: None,
        series: &[("", |s| s.pool.outages)],
    },
    CounterFamily {
        name: "pool_calls_lost",
        help: "Pool calls that got no answer (R30): refused at once while the pool was unreachable, or probes past their deadline.",
        unit: None,
        label: Some("reason"),
        series: &[
            ("refused", |s| s.pool.calls_refused),
            ("timed_out", |s| s.pool.calls_timed_out),
        ],
    },
];

/// A gauge family: one series per connector.
pub struct GaugeFamily {
    /// Name after the prefix.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Reads the value out of a connector's totals.
    pub value: Count,
}

/// Every gauge.
pub const GAUGES: &[GaugeFamily] = &[
    GaugeFamily {
        name: "save_queue_depth_max_pages",
        help: "Largest saver queue depth (pages) seen since start (R22).",
        value: |s| s.saves.max_queue_depth,
    },
    GaugeFamily {
        name: "pool_unreachable",
        help: "1 while the pool is marked unreachable (R30), else 0.",
        value: |s| u64::from(s.pool.is_unreachable()),
    },
];

/// A latency histogram family (unit: seconds).
pub struct HistogramFamily {
    /// Name after the prefix, before `_seconds`.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Reads the histogram out of a connector's totals.
    pub latency: fn(&ConnectorStats) -> &Latency,
}

/// Every histogram family.
pub const HISTOGRAMS: &[HistogramFamily] = &[
    HistogramFamily {
        name: "lookup_probe",
        help: "Time spent probing the pool per lookup (R27).",
        latency: |s| &s.lookups.probe_time,
    },
    HistogramFamily {
        name: "load",
        help: "Time from the start of a load to the last rank's report.",
        latency: |s| &s.loads.load_time,
    },
    HistogramFamily {
        name: "save_queue",
        help: "Time a page waited from enqueue to settle in the saver (R27).",
        latency: |s| &s.saves.queue_time,
    },
];

/// The name of every series family as a scraper sees it (with prefix and suffixes), for
/// the docs and their test.
pub fn exposed_names() -> Vec<String> {
    let counters = COUNTERS.iter().map(|family| match &family.unit {
        Some(unit) => format!("{PREFIX}_{}_{}_total", family.name, unit.as_str()),
        None => format!("{PREFIX}_{}_total", family.name),
    });
    let gauge = GAUGES
        .iter()
        .map(|family| format!("{PREFIX}_{}", family.name));
    let histograms = HISTOGRAMS
        .iter()
        .map(|family| format!("{PREFIX}_{}_seconds", family.name));
    counters.chain(gauge).chain(histograms).collect()
}

/// The totals of every connector, as a `prometheus-client` collector.
#[derive(Debug)]
struct Snapshot(Vec<(String, ConnectorStats)>);

impl Snapshot {
    fn encode_counters(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in COUNTERS {
            let mut metric = encoder.encode_descriptor(
                family.name,
                family.help,
                family.unit.as_ref(),
                MetricType::Counter,
            )?;
            for (connector, stats) in &self.0 {
                for (value_name, count) in family.series {
                    let mut labels = vec![("connector", connector.as_str())];
                    if let Some(label) = family.label {
                        labels.push((label, value_name));
                    }
                    metric
                        .encode_family(&labels)?
                        .encode_counter::<NoLabelSet, u64, u64>(&count(stats), None)?;
                }
            }
        }
        Ok(())
    }

    fn encode_gauges(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in GAUGES {
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, None, MetricType::Gauge)?;
            for (connector, stats) in &self.0 {
                metric
                    .encode_family(&vec![("connector", connector.as_str())])?
                    .encode_gauge(&(family.value)(stats))?;
            }
        }
        Ok(())
    }

    fn encode_histograms(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in HISTOGRAMS {
            let mut metric = encoder.encode_descriptor(
                family.name,
                family.help,
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for (connector, stats) in &self.0 {
                let (sum, count, buckets) = histogram_buckets((family.latency)(stats));
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
        self.encode_counters(&mut encoder)?;
        self.encode_gauges(&mut encoder)?;
        self.encode_histograms(&mut encoder)
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
