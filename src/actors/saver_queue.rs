//! A rank's saver actor: a bounded priority queue of pages to save (window first, R21;
//! shedding when full, R22) driven by one batch at a time on tokio's blocking pool.
//!
//! The `EnqueueSave` handler only inserts and returns (STYLE G5); I/O runs in
//! `spawn_blocking` with the staging pool and stream moved in and handed back, so control
//! messages (`SettleSaves`, stats) never wait behind a save. Mailbox:
//! `saver.mailbox_capacity`; the handle uses `try_send` and counts a full mailbox as drops.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use super::keyspace::KeySpace;
use crate::connector::transfer::{save_pages, SaveItem as TransferItem, SaveResult};
use crate::core::ids::RequestId;
use crate::core::save_order::{SaveItem, SavePriority, SaveQueue};
use crate::gpu::{CopyStream, StagingPool};
use crate::messages::saver_queue::{CollectSaveStats, EnqueueSave, SettleSaves};
use crate::messages::{EngineInbox, SavesSettled};
use crate::pool::Pool;
use crate::stats::SaveStats;

/// A queued page with the time it was enqueued.
#[derive(Debug)]
struct Queued {
    item: SaveItem,
    priority: SavePriority,
    enqueued_at: Instant,
}

/// The resources a batch needs, moved into the blocking task and back.
struct Worker {
    stream: CopyStream,
    staging: StagingPool,
}

/// One rank's saver.
pub struct SaverQueue {
    rank: u32,
    pool: Arc<dyn Pool>,
    keys: Arc<KeySpace>,
    queue: SaveQueue<Queued>,
    /// `None` while a batch is in flight.
    worker: Option<Worker>,
    waiters: Vec<flume::Sender<()>>,
    /// Settlements waiting for room in the engine channel.
    pending_sends: usize,
    inbox: EngineInbox,
    mailbox_capacity: usize,
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
}

impl SaverQueue {
    /// Builds the saver.
    pub fn new(params: SaverParams) -> Self {
        SaverQueue {
            rank: params.rank,
            pool: params.pool,
            keys: params.keys,
            queue: SaveQueue::new(params.queue_capacity_pages, params.window_first),
            worker: Some(Worker {
                stream: params.stream,
                staging: params.staging,
            }),
            waiters: Vec::new(),
            pending_sends: 0,
            inbox: params.inbox,
            mailbox_capacity: params.mailbox_capacity,
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
        if self.worker.is_none() {
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
        let Some(worker) = self.worker.take() else {
            return;
        };
        let batch_len = usize::try_from(worker.staging.slots()).unwrap_or(1).max(1);
        let mut batch = Vec::with_capacity(batch_len);
        while batch.len() < batch_len {
            let Some(queued) = self.queue.pop() else {
                break;
            };
            batch.push(queued);
        }
        let items: Vec<TransferItem> = batch
            .iter()
            .filter_map(|queued| self.transfer_item(&queued.item))
            .collect();
        let pool = Arc::clone(&self.pool);
        let work = tokio::task::spawn_blocking(move || {
            let mut worker = worker;
            let (staging, results) =
                save_pages(pool.as_ref(), &mut worker.stream, worker.staging, &items);
            (
                Worker {
                    stream: worker.stream,
                    staging,
                },
                results,
                items,
            )
        });
        ctx.spawn(work.into_actor(self).map(move |joined, actor, ctx| {
            let Ok((worker, results, items)) = joined else {
                return tracing::error!(
                    rank = actor.rank,
                    "save batch panicked; saver stops saving"
                );
            };
            actor.worker = Some(worker);
            actor.account(ctx, &batch, &items, &results);
            actor.kick(ctx);
        }));
    }

    fn transfer_item(&self, item: &SaveItem) -> Option<TransferItem> {
        let group = self
            .keys
            .index_of(item.group)
            .and_then(|index| self.keys.group(index))?;
        Some(TransferItem {
            key: group.key(self.rank, &item.hash),
            identity: self.keys.identity(group, self.rank, item.hash),
            page: item.page.0,
            payload_len: group.payload_len,
        })
    }

    fn account(
        &mut self,
        ctx: &mut Context<Self>,
        batch: &[Queued],
        items: &[TransferItem],
        results: &[SaveResult],
    ) {
        let mut counts: HashMap<RequestId, u64> = HashMap::new();
        for (position, queued) in batch.iter().enumerate() {
            *counts.entry(queued.item.request).or_default() += 1;
            self.stats.queue_time.record(queued.enqueued_at.elapsed());
            match results.get(position) {
                Some(SaveResult::Stored) => {
                    self.stats.saves_done += 1;
                    self.stats.bytes_saved += items
                        .get(position)
                        .map_or(0, |item| item.payload_len as u64);
                }
                // R20: for a re-save, the saver's existence probe is what refreshes a
                // present object (a probe resets its eviction age in both pools).
                Some(SaveResult::SkippedPresent) if queued.priority == SavePriority::Resave => {
                    self.stats.saves_skipped_present += 1;
                    self.stats.saves_refreshed += 1;
                }
                Some(SaveResult::SkippedPresent) => self.stats.saves_skipped_present += 1,
                Some(SaveResult::Failed) | None => self.stats.saves_failed += 1,
            }
        }
        self.settle(ctx, counts);
    }
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
        let mut dropped: HashMap<RequestId, u64> = HashMap::new();
        for (item, priority) in message.items() {
            self.stats.saves_enqueued += 1;
            let outcome = self.queue.push(
                Queued {
                    item,
                    priority,
                    enqueued_at: message.enqueued_at,
                },
                priority,
            );
            if let Some(shed) = outcome.into_dropped() {
                self.stats.saves_dropped += 1;
                *dropped.entry(shed.item.item.request).or_default() += 1;
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
