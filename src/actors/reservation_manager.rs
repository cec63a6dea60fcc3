//! The reservation manager actor: keeps the reservation ledger, routes each load to a
//! loader of every rank, joins the ranks' reports, and tells the engine which
//! reservations are filled or failed (R23-R26).
//!
//! Decisions live in [`crate::core::ledger::Ledger`]; this shell translates messages.
//! Mailbox: `reservations.mailbox_capacity`; the handle's messages arrive through the
//! courier (`try_send`), loaders use `send`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use super::loader::Loader;
use crate::core::hash::BlockHash;
use crate::core::ids::PageIndex;
use crate::core::ids::{RequestId, ReservationId};
use crate::core::keys::KeySpace;
use crate::core::ledger::{
    CompletionDisposition, Ledger, LoadFailure, LoadResult, LoadTicket, ReservedPage,
};
use crate::core::planner::LookupPlan;
use crate::messages::loader::LoadBlocks;
use crate::messages::reservation_manager::{
    CollectLoadStats, RankLoadFinished, ReleaseReservation, StartLoad, StartLoads,
};
use crate::messages::{EngineInbox, FinishedLoad};
use crate::stats::LoadStats;
use crate::transfer::PageRef;

/// A load waiting for its ranks.
#[derive(Debug)]
struct PendingLoad {
    request: RequestId,
    ranks_left: usize,
    result: LoadResult,
    pages: u64,
    bytes: u64,
}

/// The reservation manager.
pub struct ReservationManager {
    ledger: Ledger,
    keys: Arc<KeySpace>,
    /// Loaders per rank; a load goes round robin to one loader of every rank.
    loaders: Vec<Vec<Addr<Loader>>>,
    next_loader: usize,
    pending: HashMap<(ReservationId, LoadTicket), PendingLoad>,
    inbox: EngineInbox,
    mailbox_capacity: usize,
    stats: LoadStats,
}

impl ReservationManager {
    /// Builds the manager; loaders are attached with [`AttachLoaders`] once started.
    pub fn new(
        ledger: Ledger,
        keys: Arc<KeySpace>,
        inbox: EngineInbox,
        mailbox_capacity: usize,
    ) -> Self {
        ReservationManager {
            ledger,
            keys,
            loaders: Vec::new(),
            next_loader: 0,
            pending: HashMap::new(),
            inbox,
            mailbox_capacity,
            stats: LoadStats::default(),
        }
    }

    /// Hands a finished load to the engine inbox: at once while it has room (so the
    /// reports of one `StartLoads` keep its order), else from a spawned send that waits.
    fn report(&self, ctx: &mut Context<Self>, finished: FinishedLoad) {
        let finished = match self.inbox.loads.try_send(finished) {
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
        for (reservation, result) in self.ledger.take_finished() {
            let filled = result == LoadResult::Filled;
            self.report(
                ctx,
                FinishedLoad {
                    reservation,
                    request,
                    filled,
                },
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
            FinishedLoad {
                reservation,
                request,
                filled: false,
            },
        );
    }

    /// Builds one rank's load items from the reserved pages.
    fn items_for_rank(
        &self,
        rank: u32,
        pages: &[(
            crate::core::ledger::ReservedPage,
            crate::core::hash::BlockHash,
        )],
    ) -> Vec<PageRef> {
        pages
            .iter()
            .filter_map(|(page, hash)| {
                PageRef::in_key_space(&self.keys, rank, page.group, page.page, *hash)
            })
            .collect()
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
pub struct AttachLoaders(pub Vec<Vec<Addr<Loader>>>);

impl Handler<AttachLoaders> for ReservationManager {
    type Result = ();

    fn handle(&mut self, message: AttachLoaders, _ctx: &mut Self::Context) {
        self.loaders = message.0;
    }
}

impl Handler<StartLoads> for ReservationManager {
    type Result = ();

    fn handle(&mut self, message: StartLoads, ctx: &mut Self::Context) {
        for load in message.loads {
            self.start_load(ctx, load);
        }
    }
}

impl ReservationManager {
    /// Records one reservation and sends its load to a loader of every rank.
    fn start_load(&mut self, ctx: &mut Context<Self>, load: StartLoad) {
        let StartLoad {
            request,
            reservation,
            tokens,
            plan,
            hashes,
            pages: page_indices,
        } = load;
        let pages = planned_pages(&plan, &hashes, &page_indices);
        let started_at = Instant::now();
        self.stats.loads_started += 1;
        let reserved = pages.iter().map(|(page, _)| *page).collect();
        let ticket = match self
            .ledger
            .reserve(request, reservation, reserved, tokens)
            .and_then(|_| self.ledger.start_load(reservation))
        {
            Ok(ticket) => ticket,
            Err(error) => {
                tracing::warn!(%request, %reservation, kind = error.kind(), "reservation refused");
                return self.fail_now(ctx, request, reservation);
            }
        };
        let ranks = self.loaders.len();
        self.next_loader = self.next_loader.wrapping_add(1);
        let mut sent = 0;
        for (rank, loaders) in self.loaders.iter().enumerate() {
            let Some(loader) = loaders.get(self.next_loader % loaders.len().max(1)) else {
                continue;
            };
            let items = self.items_for_rank(u32::try_from(rank).unwrap_or(u32::MAX), &pages);
            if loader
                .try_send(LoadBlocks {
                    ticket,
                    items,
                    started_at,
                })
                .is_ok()
            {
                sent += 1;
            }
        }
        let result = if sent == ranks && ranks > 0 {
            LoadResult::Filled
        } else {
            LoadResult::Failed(LoadFailure::LoaderGone)
        };
        self.pending.insert(
            (reservation, ticket),
            PendingLoad {
                request,
                ranks_left: sent,
                result,
                pages: 0,
                bytes: 0,
            },
        );
        if sent == 0 {
            self.finish(ctx, reservation, ticket);
        }
    }

    fn finish(&mut self, ctx: &mut Context<Self>, reservation: ReservationId, ticket: LoadTicket) {
        let Some(pending) = self.pending.remove(&(reservation, ticket)) else {
            return;
        };
        match self.ledger.complete(ticket, pending.result) {
            CompletionDisposition::Accepted => {
                if pending.result == LoadResult::Filled {
                    self.stats.loads_done += 1;
                    self.stats.pages_loaded += pending.pages;
                    self.stats.bytes_loaded += pending.bytes;
                } else {
                    self.stats.loads_failed += 1;
                    match pending.result {
                        LoadResult::Failed(LoadFailure::Evicted) => self.stats.failed_evicted += 1,
                        LoadResult::Failed(LoadFailure::Corrupt) => self.stats.failed_corrupt += 1,
                        _ => {}
                    }
                }
                self.hand_over(ctx, pending.request);
            }
            CompletionDisposition::Stale { reason } => {
                self.stats.stale_completions += 1;
                tracing::debug!(%reservation, reason = reason.as_str(), "stale load completion ignored");
            }
        }
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
            self.finish(ctx, key.0, key.1);
        }
    }
}

impl Handler<ReleaseReservation> for ReservationManager {
    type Result = ();

    fn handle(&mut self, message: ReleaseReservation, _ctx: &mut Self::Context) {
        let outcome = self
            .ledger
            .release(message.reservation, message.start, message.end);
        tracing::trace!(reservation = %message.reservation, ?outcome, "reservation released");
    }
}

impl Handler<CollectLoadStats> for ReservationManager {
    type Result = MessageResult<CollectLoadStats>;

    fn handle(&mut self, _message: CollectLoadStats, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(std::mem::take(&mut self.stats))
    }
}

/// Pairs each planned (group, block) with its engine page and chain hash, in plan order.
fn planned_pages(
    plan: &LookupPlan,
    hashes: &[BlockHash],
    pages: &[u32],
) -> Vec<(ReservedPage, BlockHash)> {
    let blocks = plan
        .loads
        .iter()
        .flat_map(|load| load.blocks.iter().map(move |&block| (load.group, block)));
    blocks
        .zip(pages)
        .filter_map(|((group, block), &page)| {
            let hash = *hashes.get(block)?;
            Some((
                ReservedPage {
                    block_index: block as u64,
                    group,
                    page: PageIndex(page),
                },
                hash,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;
    use crate::core::hash::{hash_blocks, scope_seed, Scope};
    use crate::core::layout::Layout;
    use crate::core::planner::{GroupLoad, LookupOutcome};
    use crate::messages::reservation_manager::{CollectLoadStats, StartLoad, StartLoads};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// A load of blocks 0 and 1 of group 0 into `pages`, over `tokens`.
    fn load(
        request: u64,
        reservation: u64,
        tokens: std::ops::Range<u64>,
        pages: Vec<u32>,
        layout: &Layout,
    ) -> Result<StartLoad, Box<dyn std::error::Error>> {
        let prompt: Vec<i64> = (0..=16 * 2).collect();
        let hashes = hash_blocks(scope_seed(&Scope::default()), &prompt, 16)?;
        let plan = LookupPlan {
            outcome: LookupOutcome::Full,
            resume_tokens: 32,
            local_match_tokens: 0,
            full_hit_tokens: 32,
            offered_tokens: 32,
            loads: vec![GroupLoad {
                group: layout.groups[0].id,
                blocks: vec![0, 1],
            }],
            rounds: 1,
            probed_items: 2,
        };
        Ok(StartLoad {
            request: RequestId(request),
            reservation: ReservationId(reservation),
            tokens,
            plan: Arc::new(plan),
            hashes: hashes.into(),
            pages,
        })
    }

    /// One `StartLoads` carrying several reservations: each is handled in the message's
    /// order and reported exactly once; with no loader attached every one fails (R25),
    /// and one the ledger refuses (empty token range) fails in its place, not first.
    #[actix::test]
    async fn a_step_s_loads_are_handled_in_order_and_each_reported_once() -> TestResult {
        let layout = Layout::preset("tiny-full")?;
        let keys = Arc::new(KeySpace::new(&layout, "ns", "m", &[64])?);
        let (lookups, _lookups) = flume::bounded(8);
        let (loads, finished) = flume::bounded(8);
        let (saves, _saves) = flume::bounded(8);
        let inbox = EngineInbox {
            lookups,
            loads,
            saves,
        };
        let ledger = Ledger::new(16, [(layout.groups[0].id, 8)])?;
        let manager = ReservationManager::new(ledger, keys, inbox, 8).start();
        let message = StartLoads {
            loads: vec![
                load(3, 30, 0..32, vec![4, 5], &layout)?,
                load(1, 10, 7..7, vec![0, 1], &layout)?,
                load(2, 20, 0..32, vec![2, 3], &layout)?,
            ],
            enqueued_at: Instant::now(),
        };
        manager.send(message).await?;
        let mut reported = Vec::new();
        for _ in 0..3 {
            let load = finished.recv_async().await?;
            assert!(!load.filled, "no loader: nothing can be filled");
            reported.push((load.request.0, load.reservation.0));
        }
        assert_eq!(reported, vec![(3, 30), (1, 10), (2, 20)]);
        assert!(finished.is_empty(), "each reservation is reported once");
        let stats = manager.send(CollectLoadStats).await?;
        assert_eq!((stats.loads_started, stats.loads_failed), (3, 3));
        Ok(())
    }
}
