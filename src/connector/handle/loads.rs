//! Loads on the engine's thread: the reservations a step allocated travel to the
//! reservation manager as one [`StartLoads`] message, and their completions come back
//! through the engine inbox.
//!
//! Workflow, per `on_step`:
//! 1. [`ConnectorHandle::plan_load`] copies each new reservation's page numbers (4 bytes a
//!    block; the manager pairs them with blocks and hashes off the engine thread) into the
//!    step's batch, or reports the load failed at once when the request has no plan;
//! 2. [`ConnectorHandle::send_loads`] hands the batch to the courier as one message, so
//!    the manager gets one message a step however many loads it starts. A refused
//!    message (full outbox or mailbox, manager gone) fails every load in it (R25),
//!    counted as started and failed.
//!
//! With `sync_load` every load is sent on its own and awaited before the next (R23).
//!
//! Released pages (R29): each load carries a [`LoadGrant`] of its reservation's tokens,
//! shared with the loaders of every rank. The engine takes pages back on this thread, and
//! the hook returns only once no loader can write them any more:
//! - `release_prefix_reservation` takes back the tokens it names (a trim or the whole);
//! - `reserve_prefix` under another id, and `on_step` with a new reservation of the same
//!   request, take back the replaced reservation's pages;
//! - `request_finished` takes back every page of the request's load;
//! - a load reported (filled or failed, or refused) gives its grant back: the pages are
//!   the engine's again.
//!
//! The engine may hand pages taken back to another request as soon as the hook returns.
//! A trimmed load is reported filled when every page still reserved is filled.
//!
//! Invariants:
//! 1. Every reservation handed to `plan_load` yields exactly one [`FinishedLoad`] (from the
//!    manager, or from the handle when the load could not be sent), unless the engine took
//!    all of its pages back first: then it yields none. Either way the manager answers
//!    every load it was sent exactly once ([`LoadAnswer`]), which ends it in
//!    `loads_in_flight`.
//! 2. `loads_asked - loads_sent` is the number of loads failed on the engine thread.
//! 3. A request has at most one grant, that of its last reservation whose load was sent
//!    and not yet reported.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::ConnectorHandle;
use crate::connector::{FinishedLoad, HookError, ScheduledRequest};
use crate::core::ids::{RequestId, ReservationId};
use crate::messages::courier::Outgoing;
use crate::messages::reservation_manager::{StartLoad, StartLoads};
use crate::messages::LoadAnswer;
use crate::transfer::LoadGrant;

impl ConnectorHandle {
    /// Adds the load of a reservation whose pages the engine allocated this step to the
    /// step's batch (`sync_load`: sends it and waits for it at once).
    pub(super) fn plan_load(
        &mut self,
        scheduled: &ScheduledRequest<'_>,
        reservation: ReservationId,
    ) {
        let planned = match self.reservation_verdict(scheduled.request, reservation) {
            Ok(()) => {
                self.take_back_load(scheduled.request, Some(reservation));
                self.mark_reported(scheduled.request, reservation);
                self.load_message(scheduled, reservation)
            }
            // Its load was started once: it is reported once (`check_step` refuses this).
            Err(HookError::ReservationReported { .. }) => {
                tracing::warn!(request = %scheduled.request, %reservation, "reservation reported again as new; ignored");
                return;
            }
            Err(refused) => {
                tracing::warn!(request = %scheduled.request, %reservation, %refused, "load not started");
                None
            }
        };
        self.loads_asked += 1;
        match planned {
            Some(load) => self.step_loads.push(load),
            None => self.finished_loads.push(FinishedLoad {
                reservation,
                request: scheduled.request,
                filled: false,
            }),
        }
        if self.sync_load {
            self.send_loads();
        }
    }

    /// The load of one reservation, or `None` when it cannot be planned (no plan, or a
    /// planned block without a page or a hash).
    fn load_message(
        &mut self,
        scheduled: &ScheduledRequest<'_>,
        reservation: ReservationId,
    ) -> Option<StartLoad> {
        let state = self.requests.get_mut(&scheduled.request)?;
        let (false, Some((Some(plan), hashes))) = (state.disputed, &state.lookup) else {
            return None;
        };
        let mut pages = Vec::with_capacity(plan.load_blocks());
        for load in &plan.loads {
            let position = self.keys.index_of(load.group)?;
            let named = hashes.names(self.keys.group(position)?.naming).len();
            let table = scheduled.page_tables.get(position).copied().unwrap_or(&[]);
            // Blocks ascend, so the last one bounds them all; a load can hold 10k blocks,
            // and this loop runs on the engine thread. Every offered block has a name
            // (`page_names::N2`); one without is no load.
            if load
                .blocks
                .last()
                .is_some_and(|&last| last >= named || last >= table.len())
            {
                return None;
            }
            // A missing page (`-1`) has no `u32`: the load cannot be planned.
            for &block in &load.blocks {
                pages.push(u32::try_from(table[block]).ok()?);
            }
        }
        state.reused_until = plan.resume_tokens;
        let tokens = scheduled.computed_before as u64..plan.resume_tokens as u64;
        let grant = Arc::new(LoadGrant::new(tokens.clone(), self.tokens_per_block as u64));
        let load = StartLoad {
            request: scheduled.request,
            reservation,
            tokens,
            plan: Arc::clone(plan),
            hashes: hashes.clone(),
            pages,
            grant: Arc::clone(&grant),
        };
        state.load = Some((reservation, grant));
        Some(load)
    }

    /// The engine takes back tokens `tokens` of `reservation`: returns once no loader can
    /// write their pages (module docs, R29).
    pub(super) fn release_load_pages(
        &mut self,
        request: RequestId,
        reservation: ReservationId,
        tokens: Range<u64>,
    ) {
        let Some(state) = self.requests.get_mut(&request) else {
            return;
        };
        let Some((_, grant)) = state.load.as_ref().filter(|(id, _)| *id == reservation) else {
            return;
        };
        if grant.release(tokens) {
            state.load = None;
        }
    }

    /// Takes back every page of the request's load, unless it is `keep`'s (module docs,
    /// R29); returns once no loader can write them.
    pub(super) fn take_back_load(&mut self, request: RequestId, keep: Option<ReservationId>) {
        let Some(state) = self.requests.get_mut(&request) else {
            return;
        };
        if state.load.as_ref().is_some_and(|(id, _)| Some(*id) != keep) {
            if let Some((_, grant)) = state.load.take() {
                grant.revoke();
            }
        }
    }

    /// Sends the step's batch of loads in one message; a refused message fails all of its
    /// loads (R25). `sync_load`: waits for each load of the batch (R23).
    pub(super) fn send_loads(&mut self) {
        if self.step_loads.is_empty() {
            return;
        }
        let loads = std::mem::take(&mut self.step_loads);
        let count = loads.len() as u64;
        // `sync_load` sends every load on its own: the batch holds that one.
        let wait = if self.sync_load {
            loads.last().map(|load| load.reservation)
        } else {
            None
        };
        let message = StartLoads {
            loads,
            enqueued_at: Instant::now(),
        };
        // Counted in flight now; a refusal (at once or from the courier) takes them out.
        self.loads_sent += count;
        self.loads_in_flight += count;
        self.hand_off(Outgoing::StartLoads(message));
        if let Some(reservation) = wait {
            self.wait_for_load(reservation);
        }
    }

    /// `sync_load`: blocks until the reservation's load is reported, filled or failed
    /// (R23), taking other results and refusals meanwhile.
    fn wait_for_load(&mut self, reservation: ReservationId) {
        let reported = |handle: &Self| {
            handle
                .finished_loads
                .iter()
                .any(|load| load.reservation == reservation)
        };
        while !reported(self) {
            let Some(event) = self.wait_event(None, None) else {
                return;
            };
            if !self.accept_event(event) {
                return;
            }
        }
    }

    /// The manager's answer for one load: one fewer in flight; a finished one is reported.
    pub(super) fn accept_load(&mut self, answer: LoadAnswer) {
        self.loads_in_flight = self.loads_in_flight.saturating_sub(1);
        if let LoadAnswer::Finished(finished) = answer {
            self.report_load(finished);
        }
    }

    /// Hands a finished (or refused) load to the engine; its pages are the engine's again
    /// (the grant is given back, module docs).
    pub(super) fn report_load(&mut self, finished: FinishedLoad) {
        if let Some(state) = self.requests.get_mut(&finished.request) {
            if state
                .load
                .as_ref()
                .is_some_and(|(id, _)| *id == finished.reservation)
            {
                if let Some((_, grant)) = state.load.take() {
                    grant.revoke();
                }
            }
        }
        self.finished_loads.push(finished);
    }
}
