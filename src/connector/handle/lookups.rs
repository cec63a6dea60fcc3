//! Lookups on the engine's thread: the lookups one admission pass starts travel to the
//! lookup planner as one [`LookupPrefixes`] message, and their results come back through
//! the engine inbox.
//!
//! Workflow:
//! 1. `lookup_prefix` records the request and queues its lookup (nothing is sent);
//! 2. the engine ends its admission pass (`flush_lookups`), or calls its next step hook
//!    (`on_step`, `get_finished_prefix_loads`, `get_finished_saves`, `wait_for_progress`,
//!    `settle_saves`): [`ConnectorHandle::flush_lookups`] hands every queued lookup to the
//!    courier as one message, so the planner gets one message a pass however many
//!    requests it looked up;
//! 3. a full outbox or mailbox (refused at once, or handed back by the courier) queues
//!    the lookups again (each counted `deferred`) and every later flush point retries
//!    them, including every `reserve_prefix`; a planner that is gone ends each lookup with
//!    nothing offered (and nothing saved);
//! 4. `reserve_prefix` and `on_step` drain the results ([`ConnectorHandle::drain_lookups`]).
//!
//! Invariants:
//! 1. `reserve_prefix` answers `Pending` for a request until its result is drained: a
//!    queued lookup is never answered from stale state.
//! 2. Every queued lookup is sent exactly once, or answered "nothing" when the planner is
//!    gone, or dropped by `close`.
//! 3. A result is taken only by the request record whose lookup it answers (same
//!    [`LookupTicket`](crate::core::ids::LookupTicket)): lookups interleave in the
//!    planner, so a result may outlive its request, and a later request under the same id
//!    (a new prompt) must never save under the old prompt's hashes (R32).

use std::sync::Arc;

use std::time::Instant;

use super::{ConnectorHandle, RequestState};
use crate::connector::HookError;
use crate::core::ids::{LookupTicket, RequestId};
use crate::core::page_names::PromptHashes;
use crate::core::request_scope::RequestScope;
use crate::messages::courier::Outgoing;
use crate::messages::lookup_planner::{LookupPrefix, LookupPrefixes};
use crate::messages::prompt::Prompt;
use crate::messages::LookupCompleted;

impl ConnectorHandle {
    /// `lookup_prefix_in_scope` for a prompt the planner may read itself (`Prompt`): an
    /// engine whose prompts are objects of its language hands over a snapshot and a reader
    /// instead of reading it on its scheduler thread (module workflow 1).
    ///
    /// # Errors
    /// [`HookError::LiveRequest`] as for `lookup_prefix` (R32).
    pub fn lookup_prompt(
        &mut self,
        request: RequestId,
        prompt: Prompt,
        local_match_tokens: usize,
        scope: RequestScope,
    ) -> Result<(), HookError> {
        if let Some(live) = self.requests.get_mut(&request) {
            live.disputed = true;
            return Err(HookError::LiveRequest { request });
        }
        self.last_ticket = LookupTicket(self.last_ticket.0 + 1);
        let ticket = self.last_ticket;
        let mut state = RequestState {
            ticket,
            reused_until: local_match_tokens,
            ..RequestState::default()
        };
        if self.thread.is_none() {
            // Closed: nothing is looked up any more, so nothing is offered or saved.
            state.lookup = Some((None, PromptHashes::default()));
        } else {
            self.unsent_lookups.push(LookupPrefix {
                request,
                ticket,
                prompt,
                local_match_tokens,
                scope,
                enqueued_at: Instant::now(),
            });
        }
        self.requests.insert(request, state);
        Ok(())
    }

    /// Sends every queued lookup in one message (module workflow 2, 3).
    pub(super) fn flush_queued_lookups(&mut self) {
        if self.unsent_lookups.is_empty() {
            return;
        }
        let lookups = std::mem::take(&mut self.unsent_lookups);
        // A refusal (`take_back`) queues them again and sets the flag.
        self.lookups_refused = false;
        self.hand_off(Outgoing::Lookups(LookupPrefixes { lookups }));
    }

    /// Takes every lookup result that has arrived.
    pub(super) fn drain_lookups(&mut self) {
        while let Ok(done) = self.lookups.try_recv() {
            self.accept_lookup(done);
        }
    }

    /// Records one lookup result, if its request record still waits for it (invariant
    /// 3); a stale one is freed by the courier with the forgotten results.
    pub(super) fn accept_lookup(&mut self, done: LookupCompleted) {
        let answer = (done.plan.map(Arc::new), done.hashes);
        match self.requests.get_mut(&done.request) {
            Some(state) if state.ticket == done.ticket => state.lookup = Some(answer),
            _ => self.discarded.push(answer),
        }
    }
}
