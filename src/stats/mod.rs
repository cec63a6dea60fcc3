//! Statistics: per-actor counters and latency histograms, merged by the stats reporter
//! (R27).
//!
//! Each actor owns its counters and histograms as plain fields (no shared atomics); on a
//! report tick it hands over its interval counters (swapping its interval histograms out with
//! `std::mem::take`), and the reporter merges samples with [`Latency::merge`].
//! Metric names follow `kv_connector_<subsystem>_<what>_{total,seconds,bytes}`.
//!
//! # One declaration per counter
//!
//! Every counter is declared once, in its set's `counter_set!` block (`sets.rs`: name, help,
//! how it merges, the metric family and label it is exposed under); the metric families are
//! one table (`families.rs`). Merging, the interval difference, the reporter's log lines, the
//! serialized form (the Python stats dict and the replay's report), the metrics exposition and
//! the Python package's metric families are all driven from those declarations, so a new
//! counter is its declaration plus its increments (`stats::D1`, `stats::D2` hold the readers
//! to the declarations).
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

mod declare;
pub mod families;
mod latency;
mod sets;

use serde::Serialize;

pub use declare::{CounterDecl, CounterKind, LatencyDecl, REPORT_TARGET};
pub use latency::Latency;
#[cfg(any(feature = "cli", feature = "internals"))]
pub use latency::LatencySummary;
pub use sets::{LoadStats, LookupStats, PoolHealthStats, SaveStats};

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

/// Everything the connector counted, merged over actors and ranks.
///
/// Serialized as one map per set, keyed by the set's `SECTION` (the Python package's
/// `Connector.stats()` dict and the replay's report).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
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

    /// Every counter's declaration with its set's section, in `readings` order.
    pub fn declarations() -> impl Iterator<Item = (&'static str, &'static CounterDecl)> {
        let section = |name: &'static str, counters: &'static [CounterDecl]| {
            counters.iter().map(move |counter| (name, counter))
        };
        section(LookupStats::SECTION, LookupStats::COUNTERS)
            .chain(section(LoadStats::SECTION, LoadStats::COUNTERS))
            .chain(section(SaveStats::SECTION, SaveStats::COUNTERS))
            .chain(section(PoolHealthStats::SECTION, PoolHealthStats::COUNTERS))
    }

    /// Every latency histogram's declaration with its set's section.
    pub fn latency_declarations() -> impl Iterator<Item = (&'static str, &'static LatencyDecl)> {
        let section = |name: &'static str, latencies: &'static [LatencyDecl]| {
            latencies.iter().map(move |latency| (name, latency))
        };
        section(LookupStats::SECTION, LookupStats::LATENCIES)
            .chain(section(LoadStats::SECTION, LoadStats::LATENCIES))
            .chain(section(SaveStats::SECTION, SaveStats::LATENCIES))
    }

    /// Every counter's value with its declaration, in [`Self::declarations`] order.
    pub fn readings(&self) -> impl Iterator<Item = (&'static CounterDecl, u64)> + '_ {
        self.lookups
            .readings()
            .chain(self.loads.readings())
            .chain(self.saves.readings())
            .chain(self.pool.readings())
    }

    /// Every latency histogram with its declaration.
    pub fn latencies(&self) -> impl Iterator<Item = (&'static LatencyDecl, &Latency)> + '_ {
        self.lookups
            .latencies()
            .chain(self.loads.latencies())
            .chain(self.saves.latencies())
    }

    /// What these totals counted since `earlier` (each set's `since`).
    #[must_use]
    pub fn since(&self, earlier: &ConnectorStats) -> ConnectorStats {
        ConnectorStats {
            lookups: self.lookups.since(&earlier.lookups),
            loads: self.loads.since(&earlier.loads),
            saves: self.saves.since(&earlier.saves),
            pool: self.pool.since(&earlier.pool),
        }
    }

    /// Logs every set, one line each (`stats::D1`), on [`REPORT_TARGET`].
    pub fn log(&self, instance: &str) {
        self.lookups.log(instance);
        self.loads.log(instance);
        self.saves.log(instance);
        self.pool.log(instance);
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
    use super::families::{family, FamilyType, FAMILIES};
    use super::*;

    #[test]
    fn d1_every_declared_counter_is_serialized_under_its_section_and_name() {
        let mut stats = ConnectorStats::default();
        stats.lookups.full = 3;
        stats.saves.max_queue_depth = 9;
        let value = serde_json::to_value(&stats).expect("stats serialize");
        let mut seen = 0;
        for ((section, counter), (reading, number)) in
            ConnectorStats::declarations().zip(stats.readings())
        {
            assert_eq!(counter, reading, "declarations and readings in one order");
            assert_eq!(
                value[section][counter.name], number,
                "{section}.{}",
                counter.name
            );
            seen += 1;
        }
        for (section, latency) in ConnectorStats::latency_declarations() {
            let key = format!("{}_us", latency.name);
            assert!(value[section][key.as_str()].is_object(), "{section}.{key}");
            seen += 1;
        }
        assert_eq!(value["lookups"]["full"], 3);
        assert_eq!(value["lookups"]["lookups"], 3, "a derived counter");
        assert_eq!(value["pool"]["state"], "healthy", "an extra field");
        let keys: usize = ["lookups", "loads", "saves", "pool"]
            .iter()
            .map(|section| value[section].as_object().map_or(0, serde_json::Map::len))
            .sum();
        assert_eq!(
            keys,
            seen + 1,
            "nothing serialized beyond the declarations and `state`"
        );
    }

    #[test]
    fn d2_families_and_counters_agree() {
        let mut used = std::collections::BTreeSet::new();
        for (section, counter) in ConnectorStats::declarations() {
            let Some(name) = counter.family else {
                assert!(counter.label_value.is_none(), "{section}.{}", counter.name);
                continue;
            };
            let kind = match counter.kind {
                CounterKind::Max => FamilyType::Gauge,
                CounterKind::Sum => FamilyType::Counter,
                CounterKind::Derived => counter
                    .metric_family()
                    .map_or(FamilyType::Counter, |f| f.kind),
            };
            let found = family(name, kind)
                .unwrap_or_else(|| panic!("{section}.{} names no {kind:?} {name}", counter.name));
            assert_eq!(
                found.label.is_some(),
                counter.label_value.is_some(),
                "{section}.{} in {name}: a label value exactly when the family has a label",
                counter.name
            );
            assert!(
                !counter.help_line().is_empty(),
                "{section}.{} has help",
                counter.name
            );
            used.insert((name, kind));
        }
        for (_, latency) in ConnectorStats::latency_declarations() {
            assert!(
                family(latency.family, FamilyType::Histogram).is_some(),
                "{}",
                latency.name
            );
            used.insert((latency.family, FamilyType::Histogram));
        }
        for family in FAMILIES {
            assert!(
                used.contains(&(family.name, family.kind)),
                "{} is used",
                family.name
            );
        }
    }

    #[test]
    fn merge_adds_sums_keeps_the_higher_mark_and_since_inverts_merge() {
        let mut earlier = ConnectorStats::default();
        earlier.saves.saves_done = 4;
        earlier.saves.max_queue_depth = 7;
        let mut later = earlier.clone();
        let mut interval = ConnectorStats::default();
        interval.saves.saves_done = 5;
        interval.saves.max_queue_depth = 3;
        interval.pool.state = "degraded";
        later.merge(&interval);
        assert_eq!(later.saves.saves_done, 9);
        assert_eq!(later.saves.max_queue_depth, 7);
        assert_eq!(later.pool.state, "degraded");
        let diff = later.since(&earlier);
        assert_eq!(diff.saves.saves_done, 5);
        assert_eq!(
            diff.saves.max_queue_depth, 7,
            "a mark is reported as it is now"
        );
    }

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
