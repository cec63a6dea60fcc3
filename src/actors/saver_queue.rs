//! A rank's saver actor: a bounded priority queue of pages to save (window first, R21;
//! shedding when full, R22) driven by one batch at a time on tokio's blocking pool.
//!
//! The `EnqueueSave` handler only inserts into the save queue and returns; I/O runs in
//! `spawn_blocking` with the staging pool and stream moved in and handed back, so control
//! messages (`SettleSaves`, stats) never wait behind a save. Mailbox:
//! `saver.mailbox_capacity`; the handle's batches arrive through the courier (`try_send`),
//! and a full mailbox counts as drops.
//!
//! # Shedding (R22)
//!
//! A push into a full queue sheds the oldest request whole (`core::save_order`): one push
//! may hand back many pages, of several priorities, and a shed request's later pages are
//! dropped at once. The handler counts every page dropped and settles them per request in
//! one report per request and batch, so a request whose pages are all settled goes back to
//! the engine (`get_finished_saves`). Each batch also names the requests the engine ended
//! since the last one; the queue forgets those before queueing the batch
//! (`save_order::I7`), so its memory of shed requests holds live requests only.
//!
//! # Accounting
//!
//! - `saver_queue::A1`. Every enqueued page ends in exactly one of `saves_done`,
//!   `saves_skipped_present`, `saves_dropped` or `saves_failed` (pages lost to a pool outage,
//!   R30, are dropped and also counted in `saves_outage`; pages refused for want of room are
//!   failed and also counted in `saves_no_space`, once the retries of R35 are spent:
//!   `save_retry::N1`), and is settled to the engine once
//!   (so its pages can go): `saves_enqueued = done + skipped_present + dropped + failed` once the
//!   queue is drained and no batch is in flight.
//!
//! # Supervision: restart in place
//!
//! Each batch runs in its blocking task with the staging pool lent by the saver's
//! [`StagingSupervisor`]: a panic inside it (a pool client or a copy that panics) is
//! caught there, the batch's pages count as failed and are settled (`saver_queue::A1`), and the saver goes
//! on with a rebuilt staging pool. A saver whose pinned (CUDA) staging pool was lost
//! retires and fails every later page at once (counted and settled), so the engine's pages
//! are still released and serving goes on without saves.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use super::supervisor::{Batch, StagingSupervisor, Supervisee};
use crate::core::ids::RequestId;
use crate::core::keys::KeySpace;
use crate::core::save_order::{OfRequest, Prioritized, SaveItem, SavePriority, SaveQueue};
use crate::gpu::{CopyStream, StagingPool};
use crate::messages::saver_queue::{CollectSaveStats, EnqueueSave, SettleSaves};
use crate::messages::{EngineInbox, SavesSettled};
use crate::pool::{actor_fault_fires, ActorFault, Pool};
use crate::stats::SaveStats;
use crate::transfer::{save_pages_retrying, NoSpaceRetry, PageRef, RetriedSave, SaveResult};

/// A queued page with the time it was enqueued.
#[derive(Debug)]
struct Queued {
    item: SaveItem,
    priority: SavePriority,
    enqueued_at: Instant,
}

impl OfRequest for Queued {
    fn request(&self) -> RequestId {
        self.item.request
    }
}

/// One rank's saver.
pub struct SaverQueue {
    rank: u32,
    pool: Arc<dyn Pool>,
    keys: Arc<KeySpace>,
    queue: SaveQueue<Queued>,
    /// The copy stream, moved into a batch's blocking task and back: `None` while a batch
    /// is in flight (or for good, when its task never ran and the saver retired).
    stream: Option<CopyStream>,
    /// The staging pool, lent to each batch (module docs).
    staging: StagingSupervisor,
    waiters: Vec<flume::Sender<()>>,
    /// Settlements waiting for room in the engine channel.
    pending_sends: usize,
    inbox: EngineInbox,
    mailbox_capacity: usize,
    no_space_retry: NoSpaceRetry,
    stats: SaveStats,
}

/// How the saver is built.
pub struct SaverParams {
    /// The rank it saves for.
    pub rank: u32,
    /// The pool.
    pub pool: Arc<dyn Pool>,
    /// Keys and identities.
    pub keys: Arc<KeySpace>,
    /// Its copy stream.
    pub stream: CopyStream,
    /// Its staging pool.
    pub staging: StagingPool,
    /// Queue capacity in pages (R22).
    pub queue_capacity_pages: NonZeroUsize,
    /// Window pages first (R21).
    pub window_first: bool,
    /// Where settlements go.
    pub inbox: EngineInbox,
    /// Mailbox capacity.
    pub mailbox_capacity: usize,
    /// How puts refused for want of room are retried (R35).
    pub no_space_retry: NoSpaceRetry,
}

impl SaverQueue {
    /// Builds the saver.
    pub fn new(params: SaverParams) -> Self {
        let supervisee = Supervisee {
            actor: "saver",
            rank: params.rank,
        };
        SaverQueue {
            rank: params.rank,
            staging: StagingSupervisor::new(supervisee, Arc::clone(&params.pool), params.staging),
            pool: params.pool,
            keys: params.keys,
            queue: SaveQueue::new(params.queue_capacity_pages, params.window_first),
            stream: Some(params.stream),
            waiters: Vec::new(),
            pending_sends: 0,
            inbox: params.inbox,
            mailbox_capacity: params.mailbox_capacity,
            no_space_retry: params.no_space_retry,
            stats: SaveStats::default(),
        }
    }

    /// Reports settled pages to the engine. A settlement is sent before any `SettleSaves`
    /// waiter is answered (waiters wait for `pending_sends == 0`), so "settled" never
    /// overtakes the counts it covers. A full channel falls back to an awaited send.
    fn settle(&mut self, ctx: &mut Context<Self>, counts: HashMap<RequestId, u64>) {
        for (request, pages) in counts {
            match self.inbox.saves.try_send(SavesSettled { request, pages }) {
                Ok(()) => {}
                Err(flume::TrySendError::Full(settled)) => {
                    self.pending_sends += 1;
                    let saves = self.inbox.saves.clone();
                    ctx.spawn(
                        async move { saves.send_async(settled).await.is_ok() }
                            .into_actor(self)
                            .map(|sent, actor, ctx| {
                                if !sent {
                                    tracing::debug!("engine handle gone; save settlement dropped");
                                }
                                actor.pending_sends -= 1;
                                actor.kick(ctx);
                            }),
                    );
                }
                Err(flume::TrySendError::Disconnected(_)) => {
                    tracing::debug!("engine handle gone; save settlement dropped");
                }
            }
        }
    }

    /// Starts the next batch if none is in flight; answers settle waiters when idle.
    fn kick(&mut self, ctx: &mut Context<Self>) {
        if self.staging.is_retired() {
            self.fail_queued(ctx);
        } else if self.stream.is_none() {
            return;
        }
        if self.queue.is_empty() {
            if self.pending_sends == 0 {
                for waiter in self.waiters.drain(..) {
                    let _ = waiter.try_send(());
                }
            }
            return;
        }
        // One staging slot per page: a batch is at most one pass through the staging pool.
        let batch_len = self.staging.slots() as usize;
        let mut batch = Vec::with_capacity(batch_len);
        while batch.len() < batch_len {
            let Some(queued) = self.queue.pop() else {
                break;
            };
            batch.push(queued);
        }
        if actor_fault_fires(&*self.pool, ActorFault::StagingExhausted) {
            // The batch's pages fail (counted and settled, `saver_queue::A1`); the next batch may find
            // staging again.
            self.account(ctx, &batch, &[], &[]);
            return self.kick(ctx);
        }
        // In flight and retired returned above, so both are here; A1 holds either way.
        let Some(stream) = self.stream.take() else {
            return self.account(ctx, &batch, &[], &[]);
        };
        let Some(lent) = self.staging.lend() else {
            self.stream = Some(stream);
            return self.account(ctx, &batch, &[], &[]);
        };
        // One transfer item per queued page, or `None` (counted failed) when its group is
        // unknown; results come back for the transfer items only, in order.
        let positions: Vec<Option<PageRef>> = batch
            .iter()
            .map(|queued| {
                let item = &queued.item;
                PageRef::in_key_space(&self.keys, self.rank, item.group, item.page, item.hash)
            })
            .collect();
        let items: Vec<PageRef> = positions.iter().flatten().cloned().collect();
        let pool = Arc::clone(&self.pool);
        let retry = self.no_space_retry;
        let work = tokio::task::spawn_blocking(move || {
            let mut stream = stream;
            let outcome = lent.run(|staging| {
                save_pages_retrying(pool.as_ref(), &mut stream, staging, &items, retry)
            });
            (stream, outcome, items)
        });
        ctx.spawn(work.into_actor(self).map(move |joined, actor, ctx| {
            let Ok((stream, outcome, items)) = joined else {
                // The task itself could not run (runtime shutting down): the stream and
                // the staging pool are gone with it, so the saver retires (`saver_queue::A1` still holds
                // for this batch).
                actor.staging.retire();
                actor.account(ctx, &batch, &[], &[]);
                return actor.kick(ctx);
            };
            actor.stream = Some(stream);
            let results = match actor.staging.settle(outcome) {
                Batch::Done(RetriedSave { results, retried }) => {
                    actor.stats.saves_retried += retried;
                    results
                }
                Batch::Panicked => Vec::new(),
            };
            let results = aligned_results(&positions, &items, &results);
            actor.account(ctx, &batch, &positions, &results);
            actor.kick(ctx);
        }));
    }

    /// A retired saver fails every queued page at once (counted and settled, `saver_queue::A1`).
    fn fail_queued(&mut self, ctx: &mut Context<Self>) {
        let mut failed = Vec::new();
        while let Some(queued) = self.queue.pop() {
            failed.push(queued);
        }
        if !failed.is_empty() {
            self.account(ctx, &failed, &[], &[]);
        }
    }

    /// Counts and settles a batch (`saver_queue::A1`). `items` and `results` are per queued page
    /// (as [`aligned_results`] gives them); a page without a result failed.
    fn account(
        &mut self,
        ctx: &mut Context<Self>,
        batch: &[Queued],
        items: &[Option<PageRef>],
        results: &[Option<SaveResult>],
    ) {
        let mut counts: HashMap<RequestId, u64> = HashMap::new();
        for (position, queued) in batch.iter().enumerate() {
            *counts.entry(queued.item.request).or_default() += 1;
            self.stats.queue_time.record(queued.enqueued_at.elapsed());
            match results.get(position).copied().flatten() {
                Some(SaveResult::Stored) => {
                    self.stats.saves_done += 1;
                    self.stats.bytes_saved += items
                        .get(position)
                        .and_then(Option::as_ref)
                        .map_or(0, |item| item.payload_len as u64);
                }
                // R20: for a re-save, the saver's existence probe is what refreshes a
                // present object (a probe resets its eviction age in both pools).
                Some(SaveResult::SkippedPresent) if queued.priority == SavePriority::Resave => {
                    self.stats.saves_skipped_present += 1;
                    self.stats.saves_refreshed += 1;
                }
                Some(SaveResult::SkippedPresent) => self.stats.saves_skipped_present += 1,
                Some(SaveResult::Outage) => {
                    self.stats.saves_dropped += 1;
                    self.stats.saves_outage += 1;
                }
                Some(SaveResult::NoSpace) => {
                    self.stats.saves_failed += 1;
                    self.stats.saves_no_space += 1;
                }
                Some(SaveResult::Failed) | None => self.stats.saves_failed += 1,
            }
        }
        self.settle(ctx, counts);
    }
}

/// Each queued page's result: the next transfer result for a page that had a transfer
/// item, `None` for one without (or a result missing from a short answer).
fn aligned_results(
    positions: &[Option<PageRef>],
    items: &[PageRef],
    results: &[SaveResult],
) -> Vec<Option<SaveResult>> {
    let mut results = results.iter().take(items.len());
    positions
        .iter()
        .map(|item| item.as_ref().and_then(|_| results.next().copied()))
        .collect()
}

impl Actor for SaverQueue {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
    }
}

impl Handler<EnqueueSave> for SaverQueue {
    type Result = ();

    fn handle(&mut self, message: EnqueueSave, ctx: &mut Self::Context) {
        // Before the batch's items: an id the engine ended may come back as a new request.
        for &request in message.ended() {
            self.queue.request_ended(request);
        }
        let mut dropped: HashMap<RequestId, u64> = HashMap::new();
        for (item, priority) in message.items() {
            self.stats.saves_enqueued += 1;
            let request = item.request;
            let queued = Queued {
                item,
                priority,
                enqueued_at: message.enqueued_at,
            };
            let shed = if actor_fault_fires(&*self.pool, ActorFault::SaveQueueFull) {
                // As if the queue were full with this request the oldest: the request is
                // shed whole, this item with it (R22, `save_order::I5`).
                let mut shed = self.queue.shed(request);
                shed.push(Prioritized {
                    item: queued,
                    priority,
                });
                shed
            } else {
                self.queue.push(queued, priority).into_dropped()
            };
            for entry in shed {
                self.stats.saves_dropped += 1;
                *dropped.entry(entry.item.item.request).or_default() += 1;
            }
        }
        self.stats.max_queue_depth = self.stats.max_queue_depth.max(self.queue.len() as u64);
        if !dropped.is_empty() {
            self.settle(ctx, dropped);
        }
        self.kick(ctx);
    }
}

impl Handler<SettleSaves> for SaverQueue {
    type Result = ();

    fn handle(&mut self, message: SettleSaves, ctx: &mut Self::Context) {
        self.waiters.push(message.done);
        self.kick(ctx);
    }
}

impl Handler<CollectSaveStats> for SaverQueue {
    type Result = MessageResult<CollectSaveStats>;

    fn handle(&mut self, _message: CollectSaveStats, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(std::mem::take(&mut self.stats))
    }
}
