//! The metrics endpoint: the stats reporter's counters and histograms (R27) served over
//! HTTP in the Prometheus / `OpenMetrics` text format, for `kv-connector replay
//! --metrics-addr ADDR` (config `stats.metrics_addr`) and for engines that embed the
//! connector.
//!
//! ## Workflow
//!
//! 1. Every connector hands out a [`StatsSource`] (`ConnectorHandle::stats_source`): a
//!    clone of its stats reporter's address, usable from any thread.
//! 2. The owner adds each source to a shared [`MetricsSources`] under a label (the replay
//!    uses the instance number); adding takes a short lock and never waits on a scrape.
//! 3. [`MetricsServer::start`] binds the address and serves on its own threads
//!    (`tiny_http`). A `GET /metrics` asks every source for its totals (the same
//!    `CollectNow` that `ConnectorHandle::stats` sends), waits at most
//!    [`COLLECT_TIMEOUT`] per source, and encodes them with `prometheus-client`
//!    ([`exposition`]). A source that no longer answers (its connector stopped) keeps
//!    reporting the last totals it gave, so counters never go backwards.
//!
//! ## Invariants
//!
//! 1. Nothing here runs on, or takes a lock that is held by, the engine thread: scrapes
//!    run on the server's thread and talk to the actors by message.
//! 2. Counters are totals since the connector started: monotone across scrapes.
//! 3. Every sample carries `connector="<label>"`; names follow
//!    `kv_connector_<subsystem>_<what>_{total,seconds,bytes}`.
//!
//! A scrape, like `ConnectorHandle::stats`, folds the actors' current interval counters
//! into the reporter's totals, so the next periodic INFO report covers the time since the
//! scrape rather than a whole `stats.interval_s`.

#[cfg(any(feature = "metrics-server", feature = "internals"))]
pub mod exposition;
#[cfg(feature = "metrics-server")]
mod server;

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use parking_lot::Mutex;

#[cfg(feature = "metrics-server")]
pub use server::MetricsServer;

use crate::actors::stats_reporter::StatsReporter;
use crate::messages::stats_reporter::CollectNow;
use crate::stats::ConnectorStats;

/// How long a scrape waits for one connector's totals before using the last ones it gave.
#[cfg(any(feature = "metrics-server", feature = "internals"))]
pub const COLLECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the metrics endpoint could not start.
#[cfg(any(feature = "metrics-server", feature = "internals"))]
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address is not `HOST:PORT`.
    #[error("stats.metrics_addr {addr:?} is not a socket address; 127.0.0.1:9464 works")]
    Address {
        /// The address given.
        addr: String,
    },
    /// The address could not be bound (in use, or not this machine's).
    #[error(
        "cannot listen on {addr} for metrics (in use, or not an address of this machine); \
         pick another port, or 127.0.0.1:0 for any free one"
    )]
    Bind {
        /// The address given.
        addr: std::net::SocketAddr,
        /// The operating system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP server could not take over the bound socket.
    #[error("the metrics http server on {addr} did not start")]
    Server {
        /// The bound address.
        addr: std::net::SocketAddr,
        /// The server's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The server thread could not be spawned.
    #[error("the metrics server thread did not start")]
    Thread(#[source] std::io::Error),
}

#[cfg(any(feature = "metrics-server", feature = "internals"))]
impl MetricsError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Address { .. } => "metrics_address",
            Self::Bind { .. } => "metrics_bind",
            Self::Server { .. } => "metrics_server",
            Self::Thread(_) => "metrics_thread",
        }
    }
}

/// Parses `stats.metrics_addr`: `None` for the empty string (endpoint off).
///
/// # Errors
///
/// [`MetricsError::Address`] when the text is not `HOST:PORT` with a literal IP.
#[cfg(any(feature = "cli", feature = "internals"))]
pub fn parse_metrics_addr(text: &str) -> Result<Option<std::net::SocketAddr>, MetricsError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| MetricsError::Address {
        addr: text.to_owned(),
    })
}

/// One connector's statistics as seen from another thread: a clone of its stats
/// reporter's address.
#[derive(Clone)]
pub struct StatsSource {
    reporter: Addr<StatsReporter>,
}

impl std::fmt::Debug for StatsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsSource")
            .field("connected", &self.reporter.connected())
            .finish()
    }
}

impl StatsSource {
    /// Wraps a stats reporter's address (see `ConnectorHandle::stats_source`).
    pub fn new(reporter: Addr<StatsReporter>) -> Self {
        Self { reporter }
    }

    /// The totals since start, or `None` when the reporter is gone or does not answer
    /// within `timeout`. Blocks the calling thread (never call it on the engine thread).
    pub fn collect(
        &self,
        runtime: &tokio::runtime::Runtime,
        timeout: Duration,
    ) -> Option<ConnectorStats> {
        // The timer is made inside the runtime (a timeout built outside it has no clock).
        let reply = runtime.block_on(async {
            tokio::time::timeout(timeout, self.reporter.send(CollectNow)).await
        });
        reply.ok()?.ok()
    }
}

/// A labelled source and the last totals it gave.
struct SourceEntry {
    label: String,
    source: StatsSource,
    last: Option<ConnectorStats>,
}

/// The connectors one metrics endpoint reports, shared between their owner (who adds them)
/// and the server (which scrapes them).
#[derive(Default)]
pub struct MetricsSources {
    entries: Mutex<Vec<SourceEntry>>,
}

impl std::fmt::Debug for MetricsSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<String> = self
            .entries
            .lock()
            .iter()
            .map(|entry| entry.label.clone())
            .collect();
        f.debug_struct("MetricsSources")
            .field("labels", &labels)
            .finish()
    }
}

impl MetricsSources {
    /// An empty, shareable set.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Adds a connector under `label` (the value of its `connector` label).
    pub fn add(&self, label: impl Into<String>, source: StatsSource) {
        self.entries.lock().push(SourceEntry {
            label: label.into(),
            source,
            last: None,
        });
    }

    /// Every source's totals, freshly collected where the source answers within
    /// `timeout`, its last answer otherwise; sources that never answered are left out.
    /// The lock is held only to copy the list and to store the answers (invariant 1).
    pub fn snapshot(
        &self,
        runtime: &tokio::runtime::Runtime,
        timeout: Duration,
    ) -> Vec<(String, ConnectorStats)> {
        let sources: Vec<StatsSource> = self
            .entries
            .lock()
            .iter()
            .map(|entry| entry.source.clone())
            .collect();
        let fresh: Vec<Option<ConnectorStats>> = sources
            .iter()
            .map(|source| source.collect(runtime, timeout))
            .collect();
        let mut entries = self.entries.lock();
        for (entry, stats) in entries.iter_mut().zip(fresh) {
            if stats.is_some() {
                entry.last = stats;
            }
        }
        entries
            .iter()
            .filter_map(|entry| Some((entry.label.clone(), entry.last.clone()?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_address_turns_the_endpoint_off() -> Result<(), MetricsError> {
        assert_eq!(parse_metrics_addr("")?, None);
        assert_eq!(parse_metrics_addr("  ")?, None);
        assert_eq!(
            parse_metrics_addr("127.0.0.1:9464")?,
            Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9464)))
        );
        Ok(())
    }

    #[test]
    fn a_bad_address_names_the_setting_and_a_working_value() {
        let Err(err) = parse_metrics_addr("localhost") else {
            panic!("localhost without a port is not a socket address");
        };
        assert_eq!(err.kind(), "metrics_address");
        let text = err.to_string();
        assert!(text.contains("stats.metrics_addr"), "{text}");
        assert!(text.contains("127.0.0.1:9464"), "{text}");
    }
}
