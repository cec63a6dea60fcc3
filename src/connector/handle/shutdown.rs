//! The shutdown protocol of [`ConnectorHandle`]: the stop order of `crate::actors`,
//! bounded by `saver.shutdown_drain_timeout_ms`.
//!
//! Workflow ([`ConnectorHandle::close`]): stop admitting lookups; wait for in-flight loads;
//! settle queued saves; take the final stats, counting what the deadline cut off
//! (unsettled saves as dropped, unfinished loads as failed); stop the actor system.
//!
//! Invariant: in the report `close` returns, `saves_enqueued = done + skipped + dropped +
//! failed` and `loads_started = done + failed` hold whatever the deadline cut off.

use std::time::Instant;

use super::ConnectorHandle;
use crate::messages::courier::Outgoing;
use crate::messages::saver_queue::SettleSaves;
use crate::stats::ConnectorStats;

impl ConnectorHandle {
    /// Stops the connector following the stop order of `crate::actors` and returns the
    /// final report. Waits at most `saver.shutdown_drain_timeout_ms` in all.
    pub fn shutdown(mut self) -> ConnectorStats {
        self.close()
    }

    /// The shutdown protocol on a borrowed handle (for owners that cannot give the handle
    /// up, such as a replay's boxed connector); the handle answers nothing afterwards.
    /// A second call returns the report again without waiting.
    ///
    /// 1. Stop admitting: lookups not yet sent are dropped, so their requests get nothing.
    /// 2. In-flight loads finish or fail: wait for their completions until the deadline.
    /// 3. Queued saves drain until the deadline; saves still unsettled then are dropped.
    /// 4. Final stats, once the courier has delivered what it held: pages and loads cut
    ///    off at the deadline are counted as dropped saves and failed loads, so `enqueued = done + skipped + dropped + failed` and
    ///    `started = done + failed` hold in the final report.
    /// 5. The actor system stops, its thread is joined and staging pools are unregistered.
    ///    The pool itself (Mooncake `close()`) is closed by its owner after every
    ///    connector on it has stopped (dropping a `MooncakePool` closes it).
    pub fn close(&mut self) -> ConnectorStats {
        if self.thread.is_none() {
            return self.final_stats.clone().unwrap_or_default();
        }
        // At most one day from now (validated), which every clock can represent.
        let deadline = Instant::now() + self.drain_timeout;
        self.unsent_lookups.clear();
        self.wait_for_loads(deadline);
        let drained = self.settle_saves_until(deadline);
        // Whatever the courier still holds reaches its actor before the report, so pages
        // handed off but cut off by the deadline are counted (enqueued, then dropped).
        self.wait_for_courier();
        let mut stats = self.collect_stats();
        let cut_saves = unsettled_saves(&stats);
        let cut_loads = unfinished_loads(&stats);
        stats.saves.saves_dropped += cut_saves;
        stats.loads.loads_failed += cut_loads;
        self.add_handle_counts(&mut stats);
        self.stop();
        tracing::info!(
            instance = self.instance.as_str(),
            lookups = stats.lookups.lookups(),
            loads_done = stats.loads.loads_done,
            loads_cut = cut_loads,
            saves_done = stats.saves.saves_done,
            saves_cut = cut_saves,
            drained,
            "connector stopped"
        );
        self.final_stats = Some(stats.clone());
        stats
    }

    /// Stops the courier (after it delivered what its outbox holds), then the actor
    /// system; joins both threads and unregisters the staging pools from the pool
    /// (idempotent). The join waits for a save or load batch already running on the
    /// blocking pool; queued work is dropped with the actors.
    pub(super) fn stop(&mut self) {
        self.courier.stop();
        if let Some(thread) = self.thread.take() {
            self.system.stop();
            if thread.join().is_err() {
                tracing::error!("the actor system thread panicked");
            }
        }
        self.staging.release();
    }

    /// Stop order step 2: takes load completions until none is in flight or `deadline`.
    fn wait_for_loads(&mut self, deadline: Instant) {
        self.drain_returns();
        while self.loads_in_flight > 0 {
            match self.wait_event(None, Some(deadline)) {
                Some(event) => {
                    if !self.accept_event(event) {
                        return;
                    }
                }
                None => return,
            }
        }
    }

    /// Stop order step 3: [`EngineConnector::settle_saves`] with a deadline. Returns
    /// whether every saver answered "settled" in time.
    fn settle_saves_until(&mut self, deadline: Instant) -> bool {
        let mut waiting = Vec::with_capacity(self.ranks);
        for rank in 0..self.ranks {
            let (done, settled) = flume::bounded(1);
            // A request that could not be handed off drops `done`: its wait ends at once.
            self.hand_off_control(
                Outgoing::Settle {
                    rank,
                    message: SettleSaves { done },
                },
                Some(deadline),
            );
            waiting.push(settled);
        }
        let mut all = true;
        for settled in &waiting {
            all &= self.wait_settled(settled, Some(deadline));
        }
        self.drain_saves();
        all
    }

    /// Waits for one saver's "settled" answer, taking results and refusals meanwhile (a
    /// saver with a full channel waits for us, and so does the courier). `false` when
    /// `deadline` passed first.
    pub(super) fn wait_settled(
        &mut self,
        answer: &flume::Receiver<()>,
        deadline: Option<Instant>,
    ) -> bool {
        loop {
            match self.wait_event(Some(answer), deadline) {
                None => return false,
                Some(event) => {
                    if !self.accept_event(event) {
                        return true;
                    }
                }
            }
        }
    }
}

/// Pages the savers counted as enqueued but not yet settled (cut off at shutdown).
fn unsettled_saves(stats: &ConnectorStats) -> u64 {
    let saves = &stats.saves;
    saves.saves_enqueued.saturating_sub(
        saves.saves_done + saves.saves_skipped_present + saves.saves_dropped + saves.saves_failed,
    )
}

/// Loads started but neither done nor failed (cut off at shutdown).
fn unfinished_loads(stats: &ConnectorStats) -> u64 {
    let loads = &stats.loads;
    loads
        .loads_started
        .saturating_sub(loads.loads_done + loads.loads_failed)
}
