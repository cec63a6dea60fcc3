//! The handle's side of the courier (`crate::connector::courier`): handing messages over,
//! taking refused ones back, and waiting for anything the actors send.
//!
//! Workflow:
//! 1. every message for an actor goes through [`ConnectorHandle::hand_off`]; the courier
//!    delivers it or hands it back;
//! 2. a refusal, whether the outbox refused at once or the actor's mailbox later, goes
//!    through one path, [`ConnectorHandle::take_back`] (`crate::messages::courier` lists
//!    what it means per message);
//! 3. refusals are drained at every hook that drains results, and every wait of the
//!    handle ([`ConnectorHandle::wait_event`]) takes them too, so the courier never waits
//!    on a handle that waits on it.
//!
//! Invariant: the handle counts a load or a save page as in flight when it hands it off,
//! and takes it back out of every count when it comes back refused; so refused work is
//! counted once, as failed loads and dropped pages, whichever side refused it.

use std::time::{Duration, Instant};

use super::ConnectorHandle;
use crate::connector::FinishedLoad;
use crate::core::page_names::PromptHashes;
use crate::messages::courier::{Outgoing, Refused};
use crate::messages::lookup_planner::LookupPrefixes;
use crate::messages::reservation_manager::StartLoads;
use crate::messages::saver_queue::EnqueueSave;
use crate::messages::{LoadAnswer, LookupCompleted, SavesSettled};

/// How long a control message waits for room in a full outbox before it is tried again.
const OUTBOX_RETRY: Duration = Duration::from_millis(1);

/// One thing a wait of the handle woke up for.
pub(super) enum Event {
    Lookup(LookupCompleted),
    Load(LoadAnswer),
    Save(SavesSettled),
    Returned(Refused),
    /// The awaited answer channel answered or closed.
    Answered,
    /// An inbox channel closed (the actors are gone).
    Closed,
}

impl ConnectorHandle {
    /// Hands a message to the courier; a refused one is taken back at once.
    pub(super) fn hand_off(&mut self, item: Outgoing) {
        if let Err(refused) = self.courier.hand_off(item) {
            self.take_back(refused);
        }
    }

    /// Hands off a control message (`SettleSaves`, a barrier) whose sender waits for its
    /// answer next: while the outbox is only full it is tried again every
    /// [`OUTBOX_RETRY`], taking results meanwhile, until `deadline`. One that could not be
    /// handed off is dropped, so its waiter stops waiting.
    pub(super) fn hand_off_control(&mut self, mut item: Outgoing, deadline: Option<Instant>) {
        loop {
            match self.courier.hand_off(item) {
                Ok(()) | Err(Refused { closed: true, .. }) => return,
                Err(Refused {
                    item: back,
                    closed: false,
                }) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|deadline| deadline <= now) {
                        return;
                    }
                    let retry_at = now + OUTBOX_RETRY;
                    let until = deadline.map_or(retry_at, |deadline| deadline.min(retry_at));
                    if let Some(event) = self.wait_event(None, Some(until)) {
                        if !self.accept_event(event) {
                            return;
                        }
                    }
                    item = back;
                }
            }
        }
    }

    /// Takes back every message the courier returned.
    pub(super) fn drain_returns(&mut self) {
        let returned: Vec<Refused> = match self.courier.returns() {
            Some(returns) if !returns.is_empty() => returns.try_iter().collect(),
            _ => return,
        };
        for refused in returned {
            self.take_back(refused);
        }
    }

    /// Applies a refusal (module workflow 2).
    pub(super) fn take_back(&mut self, refused: Refused) {
        let Refused { item, closed } = refused;
        match item {
            Outgoing::Lookups(message) => self.lookups_refused(message, closed),
            Outgoing::StartLoads(message) => self.loads_refused(&message),
            Outgoing::Save { batch, .. } => self.saves_refused(&batch, closed),
            Outgoing::Release(release) => {
                tracing::debug!(
                    reservation = %release.reservation,
                    "reservation manager full or gone; release not recorded"
                );
            }
            // A full mailbox: once more through the courier. Otherwise (or if that fails)
            // dropping it closes the answer channel, and its waiter stops waiting.
            control @ (Outgoing::Settle { .. } | Outgoing::Barrier { .. }) => {
                if !closed {
                    let _ = self.courier.hand_off(control);
                }
            }
            // Freed here after all.
            Outgoing::Discard(answers) => drop(answers),
        }
    }

    /// Refused lookups: deferred to the next flush point while the planner lives;
    /// answered "nothing" (so nothing offered, nothing saved) once it is gone.
    fn lookups_refused(&mut self, message: LookupPrefixes, closed: bool) {
        if closed {
            tracing::error!(
                lookups = message.lookups.len(),
                "lookup planner gone; nothing offered, nothing saved"
            );
            for lookup in message.lookups {
                if let Some(state) = self.requests.get_mut(&lookup.request) {
                    if state.ticket == lookup.ticket {
                        state.lookup = Some((None, PromptHashes::default()));
                    }
                }
            }
            return;
        }
        self.lookups_deferred += message.lookups.len() as u64;
        self.unsent_lookups.extend(message.lookups);
        self.lookups_refused = true;
    }

    /// Refused loads: each fails at once, in the message's order (R25).
    fn loads_refused(&mut self, message: &StartLoads) {
        tracing::warn!(
            loads = message.loads.len(),
            "reservation manager full or gone; the step's loads failed"
        );
        let count = message.loads.len() as u64;
        self.loads_sent = self.loads_sent.saturating_sub(count);
        self.loads_in_flight = self.loads_in_flight.saturating_sub(count);
        for load in &message.loads {
            self.report_load(FinishedLoad {
                reservation: load.reservation,
                request: load.request,
                filled: false,
            });
        }
    }

    /// Refused save pages: counted dropped and settled at once (R22). The ended requests
    /// it named go out with the next batches, unless the saver is gone.
    fn saves_refused(&mut self, batch: &EnqueueSave, closed: bool) {
        for (request, pages) in batch.pages_per_request() {
            self.saves_refused += pages;
            self.accept_settled(SavesSettled { request, pages });
        }
        if !closed && !batch.ended().is_empty() {
            // Every rank's batch names the same requests: once each is enough.
            self.ended.extend_from_slice(batch.ended());
            self.ended.sort_unstable();
            self.ended.dedup();
        }
    }

    /// Waits until the courier delivered (or handed back) everything handed off so far,
    /// taking results and refusals meanwhile.
    pub(super) fn wait_for_courier(&mut self) {
        let (passed, answer) = flume::bounded(1);
        self.hand_off_control(Outgoing::Barrier { passed }, None);
        while let Some(event) = self.wait_event(Some(&answer), None) {
            if !self.accept_event(event) {
                break;
            }
        }
        self.drain_returns();
    }

    /// Waits for the next result, refusal or `answer` until `deadline` (`None`: no
    /// deadline); `None` when the deadline passed first.
    pub(super) fn wait_event(
        &self,
        answer: Option<&flume::Receiver<()>>,
        deadline: Option<Instant>,
    ) -> Option<Event> {
        // About to block: what the outbox holds need not wait for the courier's next poll.
        self.courier.nudge();
        self.waiter().wait_or(answer, deadline)
    }

    /// Records what a wait woke up for; `false` for `Answered` and `Closed`.
    pub(super) fn accept_event(&mut self, event: Event) -> bool {
        match event {
            Event::Lookup(done) => self.accept_lookup(done),
            Event::Load(finished) => self.accept_load(finished),
            Event::Save(settled) => self.accept_settled(settled),
            Event::Returned(refused) => self.take_back(refused),
            Event::Answered | Event::Closed => return false,
        }
        true
    }
}
