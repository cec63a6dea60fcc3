//! The metric families the counters are exposed in: one entry per family (name, help,
//! unit, label, type); each counter names its family in its own declaration
//! (`stats::declare`). The metrics endpoint writes these families, and the Python package
//! exports them so `kv_connector.vllm` builds its Prometheus counters from the same table.
//!
//! A scraper sees `kv_connector_` + the name, then `_` + the unit, then `_total` for
//! counters and `_seconds` for histograms ([`Family::exposed_name`]).

/// What a family's series are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FamilyType {
    /// Monotonic totals.
    Counter,
    /// A value that can go down (a high-water mark, a state).
    Gauge,
    /// A latency histogram in seconds.
    Histogram,
}

impl FamilyType {
    /// The type's name (`counter`, `gauge`, `histogram`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// One metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// Name after the prefix, before the unit and the type's suffix.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Unit suffix (`bytes`), if any.
    pub unit: Option<&'static str>,
    /// The label that tells its series apart, if any.
    pub label: Option<&'static str>,
    /// Counter, gauge or histogram.
    pub kind: FamilyType,
}

/// Prefix of every metric name.
pub const PREFIX: &str = "kv_connector";

impl Family {
    /// The family's name as a scraper sees it.
    pub fn exposed_name(&self) -> String {
        let unit = self.unit.map(|unit| format!("_{unit}")).unwrap_or_default();
        let suffix = match self.kind {
            FamilyType::Counter => "_total",
            FamilyType::Gauge => "",
            FamilyType::Histogram => "_seconds",
        };
        format!("{PREFIX}_{}{unit}{suffix}", self.name)
    }
}

const fn counter(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        help,
        unit: None,
        label: None,
        kind: FamilyType::Counter,
    }
}

const fn labelled(name: &'static str, label: &'static str, help: &'static str) -> Family {
    Family {
        label: Some(label),
        ..counter(name, help)
    }
}

const fn bytes(name: &'static str, help: &'static str) -> Family {
    Family {
        unit: Some("bytes"),
        ..counter(name, help)
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Family {
    Family {
        kind: FamilyType::Gauge,
        ..counter(name, help)
    }
}

const fn histogram(name: &'static str, help: &'static str) -> Family {
    Family {
        kind: FamilyType::Histogram,
        ..counter(name, help)
    }
}

/// Every family, in the order the metrics endpoint writes them.
pub const FAMILIES: &[Family] = &[
    labelled("lookup_outcomes", "outcome", "Lookups by outcome (R11-R13, R28)."),
    counter("lookup_outage", "Lookups lost to a pool outage (R30): the pool was unreachable or did not answer before the deadline, so nothing was offered. Never counted as full_miss."),
    counter("lookup_failed", "Lookups that failed (pool error, bad request) and offered nothing."),
    counter("lookup_shed", "Lookups that arrived to a full planner queue and offered nothing."),
    counter("lookup_offered_tokens", "Tokens offered to the engine by lookups."),
    counter("lookup_probed_keys", "Pool keys probed by lookups (R14)."),
    counter("load_started", "Reservations whose load started."),
    counter("load_done", "Reservations filled on every rank (R24)."),
    labelled("load_failed", "cause", "Reservations whose load failed, by cause (R25)."),
    counter("load_stale_completions", "Load completions ignored as stale (R26)."),
    counter("load_pages", "Pages placed on devices by loads (all ranks)."),
    bytes("load", "Payload bytes placed on devices by loads (all ranks)."),
    counter("save_enqueued_pages", "Pages enqueued for saving (all ranks)."),
    labelled("save_pages", "result", "Pages the saver settled, by result (R19, R22)."),
    counter("save_outage_pages", "Pages dropped because the pool was unreachable or missed a deadline (R30); also counted as dropped."),
    counter("save_no_space_pages", "Pages the pool refused for want of room (full, or no segment mounted yet); also counted as failed."),
    counter("save_retried_pages", "Pages the pool refused for want of room and that were saved again (R35), each counted once; they end as stored, skipped or failed."),
    counter("save_refreshed_pages", "Re-saved pages found present and refreshed (R20); also counted as skipped."),
    bytes("save", "Payload bytes stored by the saver (all ranks)."),
    counter("pool_outages", "Times the pool became unreachable (R30)."),
    labelled("pool_calls_lost", "reason", "Pool calls that got no answer (R30): refused at once while the pool was unreachable, or probes past their deadline."),
    gauge("save_queue_depth_max_pages", "Largest saver queue depth (pages) seen since start (R22)."),
    gauge("pool_unreachable", "1 while the pool is marked unreachable (R30), else 0."),
    histogram("lookup_probe", "Time spent probing the pool per lookup (R27)."),
    histogram("load", "Time from the start of a load to the last rank's report."),
    histogram("save_queue", "Time a page waited from enqueue to settle in the saver (R27)."),
];

/// The family called `name` with type `kind` (two families may share a name across types,
/// `load` bytes and `load` seconds).
#[cfg(feature = "internals")]
pub fn family(name: &str, kind: FamilyType) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .find(|family| family.name == name && family.kind == kind)
}
