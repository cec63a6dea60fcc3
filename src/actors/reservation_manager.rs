//! The reservation manager actor: keeps the reservation ledger, routes each load to a
//! loader of every rank, joins the ranks' reports, and tells the engine which
//! reservations are filled or failed (R23-R26).
//!
//! Decisions live in [`crate::core::ledger::Ledger`]; this shell translates messages.
//! Mailbox: `reservations.mailbox_capacity`; the handle's messages arrive through the
//! courier (`try_send`), loaders use `send`.
//!
//! # Supervision: retire, never restart
//!
//! A panic in a handler ([`crate::actors::supervisor::catch`]) may leave the ledger
//! half-updated, and a ledger rebuilt empty would not know the reservations the engine
//! holds or the loads being written into their pages: it would drop their completions as
//! stale and let new reservations claim their pages (R26). So the manager does not
//! restart: it drops the ledger and retires, and from then on
//! - the load being started when it panicked fails at once, unless its loaders already
//!   have it;
//! - a load its loaders still hold is reported failed when they answer (never earlier: a
//!   reported load's pages are the engine's again, R29);
//! - every later load fails at once (R25), releases are ignored, stats are still answered.
//!
//! The engine sees every load reported failed, never filled, and computes the prefixes
//! itself; nothing waits forever, and the accounting stays closed (M1).
//!
//! Invariant M1: every `StartLoad` is counted in `loads_started` and answered by exactly one
//! `LoadAnswer`: a `FinishedLoad` counted done or failed, or a stale completion (R26)
//! counted as such, retired or not. A load whose grant the engine took back whole is stale
//! when its loaders answer, even before the release itself arrives here (the handle takes
//! the pages back first, R29): its pages are the engine's already, so it is never reported
//! filled.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use super::loader::Loader;
use super::supervisor::{catch, Panicked};
use crate::core::hash::BlockHash;
use crate::core::ids::{RequestId, ReservationId};
use crate::core::keys::KeySpace;
use crate::core::ledger::{
    CompletionDisposition, Ledger, LoadFailure, LoadResult, LoadTicket, ReservedPage,
};
use crate::messages::loader::LoadBlocks;
use crate::messages::reservation_manager::{
    CollectLoadStats, RankLoadFinished, ReleaseReservation, StartLoad, StartLoads,
};
use crate::messages::{EngineInbox, FinishedLoad, LoadAnswer};
use crate::pool::{ActorFault, ActorFaults};
use crate::stats::LoadStats;
use crate::transfer::{LoadGrant, PageRef};

/// A load waiting for its ranks.
#[derive(Debug)]
struct PendingLoad {
    request: RequestId,
    ranks_left: usize,
    result: LoadResult,
    pages: u64,
    bytes: u64,
    /// The pages the engine still lends to the load (R29).
    grant: Arc<LoadGrant>,
}

/// A recorded load on its way to the loaders.
struct PlannedLoad<'a> {
    pages: &'a [(ReservedPage, BlockHash)],
    grant: &'a Arc<LoadGrant>,
    started_at: Instant,
}

/// The reservation manager.
pub struct ReservationManager {
    /// `None` once a panic retired the manager (module docs).
    ledger: Option<Ledger>,
    keys: Arc<KeySpace>,
    /// Loaders per rank; a load goes round robin to one loader of every rank.
    loaders: Vec<Vec<Addr<Loader>>>,
    /// The rank of `loaders[0]` (a connector may serve ranks from any rank on).
    first_rank: u32,
    next_loader: usize,
    pending: HashMap<(ReservationId, LoadTicket), PendingLoad>,
    inbox: EngineInbox,
    mailbox_capacity: usize,
    stats: LoadStats,
    faults: ActorFaults,
}

impl ReservationManager {
    /// Builds the manager; loaders are attached with [`AttachLoaders`] once started.
    pub fn new(
        ledger: Ledger,
        keys: Arc<KeySpace>,
        inbox: EngineInbox,
        mailbox_capacity: usize,
        faults: ActorFaults,
    ) -> Self {
        ReservationManager {
            ledger: Some(ledger),
            keys,
            loaders: Vec::new(),
            first_rank: 0,
            next_loader: 0,
            pending: HashMap::new(),
            inbox,
            mailbox_capacity,
            stats: LoadStats::default(),
            faults,
        }
    }

    /// After a panic: drops the ledger and retires (module docs); loads whose loaders all
    /// answered but that were not reported yet are reported failed now (M1).
    fn retire(&mut self, ctx: &mut Context<Self>, panicked: &Panicked) {
        tracing::error!(
            panic = panicked.message(),
            pending_loads = self.pending.len(),
            "reservation manager panicked; ledger dropped, retired: every load fails from now on"
        );
        self.ledger = None;
        let answered: Vec<_> = self
            .pending
            .iter()
            .filter(|(_, pending)| pending.ranks_left == 0)
            .map(|(&key, _)| key)
            .collect();
        for (reservation, ticket) in answered {
            self.finish(ctx, reservation, ticket);
        }
    }

    /// Loads pending for `reservation` (module docs: whether its loaders have a load).
    fn pending_for(&self, reservation: ReservationId) -> usize {
        self.pending
            .keys()
            .filter(|(pending, _)| *pending == reservation)
            .count()
    }

    /// Hands a load's answer to the engine inbox: at once while it has room (so the
    /// reports of one `StartLoads` keep its order), else from a spawned send that waits.
    fn report(&self, ctx: &mut Context<Self>, answer: LoadAnswer) {
        let finished = match self.inbox.loads.try_send(answer) {
            Ok(()) => return,
            Err(flume::TrySendError::Disconnected(_)) => {
                return tracing::debug!("engine handle gone; load result dropped");
            }
            Err(flume::TrySendError::Full(finished)) => finished,
        };
        let inbox = self.inbox.clone();
        ctx.spawn(
            async move {
                if inbox.loads.send_async(finished).await.is_err() {
                    tracing::debug!("engine handle gone; load result dropped");
                }
            }
            .into_actor(self),
        );
    }

    /// Hands finished reservations from the ledger to the engine.
    fn hand_over(&mut self, ctx: &mut Context<Self>, request: RequestId) {
        let finished = self
            .ledger
            .as_mut()
            .map(Ledger::take_finished)
            .unwrap_or_default();
        for (reservation, result) in finished {
            let filled = result == LoadResult::Filled;
            self.report(
                ctx,
                LoadAnswer::Finished(FinishedLoad {
                    reservation,
                    request,
                    filled,
                }),
            );
        }
    }

    fn fail_now(
        &mut self,
        ctx: &mut Context<Self>,
        request: RequestId,
        reservation: ReservationId,
    ) {
        self.stats.loads_failed += 1;
        self.report(
            ctx,
            LoadAnswer::Finished(FinishedLoad {
                reservation,
                request,
                filled: false,
            }),
        );
    }

    /// Builds one rank's load items from the reserved pages, with the block of each.
    fn items_for_rank(
        &self,
        rank: u32,
        pages: &[(ReservedPage, BlockHash)],
    ) -> (Vec<PageRef>, Vec<u64>) {
        pages
            .iter()
            .filter_map(|(page, hash)| {
                PageRef::in_key_space(&self.keys, rank, page.group, page.page, *hash)
                    .map(|item| (item, page.block_index))
            })
            .unzip()
    }
}

impl Actor for ReservationManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
    }
}

/// Give the manager its loaders (sent once at start by the wiring code).
///
/// - Sender: `actors::start`, after the loaders started.
/// - Reply: none. Receiver gone: start-up fails.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct AttachLoaders {
    /// The rank of the first list's loaders; the others follow in rank order.
    pub first_rank: u32,
    /// Per rank, its loaders.
    pub loaders: Vec<Vec<Addr<Loader>>>,
}

impl Handler<AttachLoaders> for ReservationManager {
    type Result = ();

    fn handle(&mut self, message: AttachLoaders, _ctx: &mut Self::Context) {
        self.first_rank = message.first_rank;
        self.loaders = message.loaders;
    }
}

impl Handler<StartLoads> for ReservationManager {
    type Result = ();

    fn handle(&mut self, message: StartLoads, ctx: &mut Self::Context) {
        for load in message.loads {
            self.start_supervised(ctx, load);
        }
    }
}

impl ReservationManager {
    /// Starts one load; a panic retires the manager, and the load fails at once unless its
    /// loaders already have it (module docs, M1).
    fn start_supervised(&mut self, ctx: &mut Context<Self>, load: StartLoad) {
        let (request, reservation) = (load.request, load.reservation);
        self.stats.loads_started += 1;
        let pending_before = self.pending_for(reservation);
        if let Err(panicked) = catch(|| self.start_load(ctx, load)) {
            self.retire(ctx, &panicked);
            if self.pending_for(reservation) == pending_before {
                self.fail_now(ctx, request, reservation);
            }
        }
    }

    /// Records one reservation and sends its load to a loader of every rank. The load is
    /// pending before any loader has it, so a panic while sending leaves it to be failed
    /// when its loaders answer (R29).
    fn start_load(&mut self, ctx: &mut Context<Self>, load: StartLoad) {
        let (request, reservation) = (load.request, load.reservation);
        let Some(ledger) = self.ledger.as_mut() else {
            return self.fail_now(ctx, request, reservation);
        };
        let pages = load.planned_pages(&self.keys);
        let started_at = Instant::now();
        let reserved = pages.iter().map(|(page, _)| *page).collect();
        let ticket = match ledger
            .reserve(request, reservation, reserved, load.tokens)
            .and_then(|_| ledger.start_load(reservation))
        {
            Ok(ticket) => ticket,
            Err(error) => {
                tracing::warn!(%request, %reservation, kind = error.kind(), "reservation refused");
                return self.fail_now(ctx, request, reservation);
            }
        };
        assert!(
            !self.faults.fires(ActorFault::ManagerPanic),
            "injected fault manager_panic: the reservation manager panicked starting a load"
        );
        let order = PlannedLoad {
            pages: &pages,
            grant: &load.grant,
            started_at,
        };
        self.dispatch(ctx, request, (reservation, ticket), &order);
    }

    /// Sends a recorded load to one loader of every rank. The load is pending before any
    /// loader has it, so a panic while sending leaves it to be failed when its loaders
    /// answer (R29); one no loader took is finished (failed) at once.
    fn dispatch(
        &mut self,
        ctx: &mut Context<Self>,
        request: RequestId,
        key: (ReservationId, LoadTicket),
        load: &PlannedLoad<'_>,
    ) {
        let result = if self.loaders.is_empty() {
            LoadResult::Failed(LoadFailure::LoaderGone)
        } else {
            LoadResult::Filled
        };
        self.pending.insert(
            key,
            PendingLoad {
                request,
                ranks_left: 0,
                result,
                pages: 0,
                bytes: 0,
                grant: Arc::clone(load.grant),
            },
        );
        self.next_loader = self.next_loader.wrapping_add(1);
        for (rank, loaders) in (self.first_rank..).zip(&self.loaders) {
            let sent = loaders
                .get(self.next_loader % loaders.len().max(1))
                .is_some_and(|loader| {
                    let (items, blocks) = self.items_for_rank(rank, load.pages);
                    let message = LoadBlocks {
                        ticket: key.1,
                        items,
                        blocks,
                        grant: Arc::clone(load.grant),
                        started_at: load.started_at,
                    };
                    loader.try_send(message).is_ok()
                });
            if let Some(pending) = self.pending.get_mut(&key) {
                if sent {
                    pending.ranks_left += 1;
                } else {
                    pending.result = LoadResult::Failed(LoadFailure::LoaderGone);
                }
            }
        }
        if self
            .pending
            .get(&key)
            .is_some_and(|pending| pending.ranks_left == 0)
        {
            self.finish(ctx, key.0, key.1);
        }
    }

    /// Completes a load all of whose ranks answered: through the ledger (accepted or stale,
    /// R26), or failed once retired. It stays pending until reported (M1).
    fn finish(&mut self, ctx: &mut Context<Self>, reservation: ReservationId, ticket: LoadTicket) {
        let key = (reservation, ticket);
        let Some((request, result, pages, bytes, revoked)) = self.pending.get(&key).map(|p| {
            let revoked = p.grant.is_revoked();
            (p.request, p.result, p.pages, p.bytes, revoked)
        }) else {
            return;
        };
        if revoked {
            // The release that took the pages back follows through the courier and
            // retires the reservation in the ledger (M1).
            self.pending.remove(&key);
            self.stats.stale_completions += 1;
            tracing::debug!(%reservation, reason = "released", "stale load completion ignored");
            return self.report(ctx, LoadAnswer::Stale);
        }
        let Some(ledger) = self.ledger.as_mut() else {
            self.pending.remove(&key);
            return self.fail_now(ctx, request, reservation);
        };
        match ledger.complete(ticket, result) {
            CompletionDisposition::Accepted => {
                if result == LoadResult::Filled {
                    self.stats.loads_done += 1;
                    self.stats.pages_loaded += pages;
                    self.stats.bytes_loaded += bytes;
                } else {
                    self.stats.loads_failed += 1;
                    match result {
                        LoadResult::Failed(LoadFailure::Evicted) => self.stats.failed_evicted += 1,
                        LoadResult::Failed(LoadFailure::Corrupt) => self.stats.failed_corrupt += 1,
                        _ => {}
                    }
                }
                self.hand_over(ctx, request);
            }
            CompletionDisposition::Stale { reason } => {
                self.stats.stale_completions += 1;
                tracing::debug!(%reservation, reason = reason.as_str(), "stale load completion ignored");
                self.report(ctx, LoadAnswer::Stale);
            }
        }
        self.pending.remove(&key);
    }
}

impl Handler<RankLoadFinished> for ReservationManager {
    type Result = ();

    fn handle(&mut self, message: RankLoadFinished, ctx: &mut Self::Context) {
        let key = (message.ticket.id(), message.ticket);
        let Some(pending) = self.pending.get_mut(&key) else {
            return;
        };
        pending.ranks_left = pending.ranks_left.saturating_sub(1);
        pending.pages += message.pages;
        pending.bytes += message.bytes;
        if let LoadResult::Failed(_) = message.result {
            pending.result = message.result;
        }
        if pending.ranks_left == 0 {
            self.stats.load_time.record(message.started_at.elapsed());
            if let Err(panicked) = catch(|| self.finish(ctx, key.0, key.1)) {
                self.retire(ctx, &panicked);
            }
        }
    }
}

impl Handler<ReleaseReservation> for ReservationManager {
    type Result = ();

    fn handle(&mut self, message: ReleaseReservation, ctx: &mut Self::Context) {
        let Some(ledger) = self.ledger.as_mut() else {
            return tracing::debug!(reservation = %message.reservation, "reservation manager retired; release ignored");
        };
        match catch(|| ledger.release(message.reservation, message.start, message.end)) {
            Ok(outcome) => {
                tracing::trace!(reservation = %message.reservation, ?outcome, "reservation released");
            }
            Err(panicked) => self.retire(ctx, &panicked),
        }
    }
}

impl Handler<CollectLoadStats> for ReservationManager {
    type Result = MessageResult<CollectLoadStats>;

    fn handle(&mut self, _message: CollectLoadStats, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(std::mem::take(&mut self.stats))
    }
}

#[cfg(test)]
mod tests;
