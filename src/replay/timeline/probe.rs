//! [`ConnectorProbe`]: a connector wrapper that forwards every hook unchanged and tallies
//! the loads the engine side sees (timeline workflow step 1), and [`ProbeHandle`], the
//! driver's side of it, which samples the wrapped connector between steps.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::connector::{EngineConnector, FinishedLoad, HookError, ReserveAnswer, SchedulerOutput};
use crate::core::ids::{RequestId, ReservationId};
use crate::replay::connectors::ReplayConnector;
use crate::stats::ConnectorStats;

/// What a [`ConnectorProbe`] saw of loads since the driver last took it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadTally {
    /// Reservations reported filled.
    pub filled: u64,
    /// Reservations reported failed.
    pub failed: u64,
    /// Tokens the filled ones covered.
    pub tokens: u64,
}

/// The state a probe shares with the driver.
struct ProbeState {
    connector: Box<dyn ReplayConnector>,
    /// Tokens offered per open reservation, minus what the engine released.
    offers: HashMap<ReservationId, usize>,
    tally: LoadTally,
}

/// The driver's side of a [`ConnectorProbe`]: samples the connector between steps.
#[derive(Clone)]
pub struct ProbeHandle(Rc<RefCell<ProbeState>>);

impl ProbeHandle {
    /// The connector's cumulative counters now.
    pub fn sample(&self) -> ConnectorStats {
        self.0.borrow_mut().connector.report()
    }

    /// The load tally since the last call.
    pub fn take_loads(&self) -> LoadTally {
        std::mem::take(&mut self.0.borrow_mut().tally)
    }
}

/// A connector wrapper that forwards every hook and tallies loads (workflow step 1).
pub struct ConnectorProbe(Rc<RefCell<ProbeState>>);

impl ConnectorProbe {
    /// Wraps `connector`; the handle samples it.
    pub fn wrap(connector: Box<dyn ReplayConnector>) -> (Box<dyn ReplayConnector>, ProbeHandle) {
        let state = Rc::new(RefCell::new(ProbeState {
            connector,
            offers: HashMap::new(),
            tally: LoadTally::default(),
        }));
        (
            Box::new(ConnectorProbe(Rc::clone(&state))),
            ProbeHandle(state),
        )
    }
}

impl EngineConnector for ConnectorProbe {
    fn lookup_prefix(
        &mut self,
        request: RequestId,
        prompt: std::sync::Arc<[i64]>,
        local: usize,
    ) -> Result<(), HookError> {
        self.0
            .borrow_mut()
            .connector
            .lookup_prefix(request, prompt, local)
    }

    fn flush_lookups(&mut self) {
        self.0.borrow_mut().connector.flush_lookups();
    }

    fn reserve_prefix(
        &mut self,
        request: RequestId,
        num_computed: usize,
        reservation: ReservationId,
    ) -> ReserveAnswer {
        let mut state = self.0.borrow_mut();
        let answer = state
            .connector
            .reserve_prefix(request, num_computed, reservation);
        if let ReserveAnswer::Offer { extra_tokens, .. } = answer {
            if extra_tokens > 0 {
                state.offers.insert(reservation, extra_tokens);
            }
        }
        answer
    }

    fn release_prefix_reservation(
        &mut self,
        request: RequestId,
        reservation: ReservationId,
        start: usize,
        end: usize,
    ) {
        let mut state = self.0.borrow_mut();
        if let Some(tokens) = state.offers.get_mut(&reservation) {
            *tokens = tokens.saturating_sub(end.saturating_sub(start));
        }
        state
            .connector
            .release_prefix_reservation(request, reservation, start, end);
    }

    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
        let mut state = self.0.borrow_mut();
        let finished = state.connector.get_finished_prefix_loads();
        for load in &finished {
            let tokens = state.offers.remove(&load.reservation).unwrap_or(0);
            if load.filled {
                state.tally.filled += 1;
                state.tally.tokens += u64::try_from(tokens).unwrap_or(u64::MAX);
            } else {
                state.tally.failed += 1;
            }
        }
        finished
    }

    fn on_step(&mut self, output: &SchedulerOutput<'_>) {
        self.0.borrow_mut().connector.on_step(output);
    }

    fn request_finished(&mut self, request: RequestId) -> bool {
        self.0.borrow_mut().connector.request_finished(request)
    }

    fn get_finished_saves(&mut self) -> Vec<RequestId> {
        self.0.borrow_mut().connector.get_finished_saves()
    }

    fn wait_for_progress(&mut self, timeout: std::time::Duration) {
        self.0.borrow_mut().connector.wait_for_progress(timeout);
    }

    fn settle_saves(&mut self) {
        self.0.borrow_mut().connector.settle_saves();
    }
}

impl ReplayConnector for ConnectorProbe {
    fn report(&mut self) -> ConnectorStats {
        self.0.borrow_mut().connector.report()
    }

    fn finish(&mut self) -> ConnectorStats {
        self.0.borrow_mut().connector.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// Offers 64 tokens to every reservation and reports reservation 1 filled, 2 failed.
    struct Offering;

    impl EngineConnector for Offering {
        fn lookup_prefix(
            &mut self,
            _request: RequestId,
            _prompt: Arc<[i64]>,
            _local: usize,
        ) -> Result<(), HookError> {
            Ok(())
        }
        fn reserve_prefix(
            &mut self,
            _request: RequestId,
            _num_computed: usize,
            _reservation: ReservationId,
        ) -> ReserveAnswer {
            ReserveAnswer::Offer {
                extra_tokens: 64,
                is_async: true,
            }
        }
        fn release_prefix_reservation(
            &mut self,
            _request: RequestId,
            _reservation: ReservationId,
            _start: usize,
            _end: usize,
        ) {
        }
        fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
            [(1, true), (2, false)]
                .into_iter()
                .map(|(id, filled)| FinishedLoad {
                    reservation: ReservationId(id),
                    request: RequestId(id),
                    filled,
                })
                .collect()
        }
        fn on_step(&mut self, _output: &SchedulerOutput<'_>) {}
        fn request_finished(&mut self, _request: RequestId) -> bool {
            false
        }
        fn get_finished_saves(&mut self) -> Vec<RequestId> {
            Vec::new()
        }
        fn wait_for_progress(&mut self, _timeout: Duration) {}
        fn settle_saves(&mut self) {}
    }

    impl ReplayConnector for Offering {
        fn report(&mut self) -> ConnectorStats {
            let mut stats = ConnectorStats::default();
            stats.saves.saves_done = 7;
            stats
        }
    }

    #[test]
    fn filled_loads_count_the_offer_minus_what_was_released() {
        let (mut probe, handle) = ConnectorProbe::wrap(Box::new(Offering));
        for id in [1, 2] {
            let answer = probe.reserve_prefix(RequestId(id), 0, ReservationId(id));
            assert!(matches!(
                answer,
                ReserveAnswer::Offer {
                    extra_tokens: 64,
                    ..
                }
            ));
        }
        probe.release_prefix_reservation(RequestId(1), ReservationId(1), 48, 64);
        assert_eq!(probe.get_finished_prefix_loads().len(), 2);
        assert_eq!(
            handle.take_loads(),
            LoadTally {
                filled: 1,
                failed: 1,
                tokens: 48,
            }
        );
        assert_eq!(handle.take_loads(), LoadTally::default());
        assert_eq!(handle.sample().saves.saves_done, 7);
    }
}
