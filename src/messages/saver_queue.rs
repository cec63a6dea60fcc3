//! Messages to a rank's saver.

use std::time::Instant;

use actix::Message;

use crate::core::save_order::{SaveItem, SavePriority};
use crate::stats::SaveStats;

/// Queue these pages for saving (R16-R22).
///
/// - Sender: the engine's handle (`on_step`), with `try_send`; a full mailbox drops the
///   pages (counted) and they settle at once, so the request's pages can be freed (R22).
/// - Guarantee: the handler only inserts into the priority queue and returns; every item
///   is later settled exactly once (stored, skipped as present, failed or shed) and
///   reported through the engine inbox.
/// - Reply: none.
/// - Receiver gone: `try_send` fails; the handle settles the pages as dropped.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct EnqueueSave {
    /// Pages with their priority (window first, R21).
    pub items: Vec<(SaveItem, SavePriority)>,
    /// When the handle sent it.
    pub enqueued_at: Instant,
}

/// Answer once every save queued so far is settled.
///
/// - Sender: the handle's `settle_saves` (replay) and `shutdown`.
/// - Guarantee: `done` receives one message when the queue is empty and no batch is in
///   flight.
/// - Reply: none; the answer goes to `done` (bounded, capacity 1).
/// - Receiver gone: `done` is dropped and the waiter sees a disconnected channel.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct SettleSaves {
    /// Where to say "settled".
    pub done: flume::Sender<()>,
}

/// Report and reset the save counters (R27).
///
/// - Sender: the stats reporter and the handle's final report.
/// - Reply: [`SaveStats`].
/// - Receiver gone: the report shows no saves for this rank.
#[derive(Message, Debug)]
#[rtype(result = "SaveStats")]
pub struct CollectSaveStats;
