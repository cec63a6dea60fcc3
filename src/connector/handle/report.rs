//! What the handle reports: the connector's statistics, taken after the courier has
//! delivered what it holds, plus the counts only the engine thread sees.

use super::ConnectorHandle;
use crate::messages::stats_reporter::CollectNow;
use crate::stats::ConnectorStats;

impl ConnectorHandle {
    /// Everything counted since start, including every message handed off before the call
    /// (blocks briefly for the courier and the actors' answers).
    pub fn stats(&mut self) -> ConnectorStats {
        if self.thread.is_some() {
            self.wait_for_courier();
        }
        let mut stats = self.collect_stats();
        self.add_handle_counts(&mut stats);
        stats
    }

    /// The actors' counters alone.
    pub(super) fn collect_stats(&self) -> ConnectorStats {
        self.runtime
            .block_on(self.reporter.send(CollectNow))
            .unwrap_or_default()
    }

    /// Adds what only the handle counted (pages refused by a full saver mailbox, lookups
    /// deferred by a full planner mailbox).
    pub(super) fn add_handle_counts(&self, stats: &mut ConnectorStats) {
        // Refused pages and loads never reached an actor: counted here on both sides of
        // the accounting (saves enqueued = ... + dropped; loads started = done + failed).
        stats.saves.saves_enqueued += self.saves_refused;
        stats.saves.saves_dropped += self.saves_refused;
        let loads_refused = self.loads_asked.saturating_sub(self.loads_sent);
        stats.loads.loads_started += loads_refused;
        stats.loads.loads_failed += loads_refused;
        stats.lookups.deferred += self.lookups_deferred;
        stats.saves.published_past_chunk_end += self.published_past_chunk_end;
        stats.saves.checkpoint_pages_planned += self.checkpoint_pages_planned;
    }

    /// A handle on this connector's statistics that another thread (the metrics endpoint)
    /// can query without going through the engine thread. It does not see the counts
    /// kept on the engine thread (mailbox-refused saves and loads, deferred lookups).
    pub fn stats_source(&self) -> crate::metrics::StatsSource {
        crate::metrics::StatsSource::new(self.reporter.clone())
    }
}
