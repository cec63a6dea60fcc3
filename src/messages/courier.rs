//! Messages to the courier: the engine thread's hand-off to the actors (the courier
//! thread itself is the connector's `courier` module, one layer up).
//!
//! The engine's handle never sends to an actor mailbox itself: waking a parked actor
//! thread is a system call and an inter-processor interrupt on the engine's critical path.
//! It puts each message into the courier's bounded outbox instead (`try_send`, no wake-up
//! while the courier is polling), and the courier delivers it with `try_send` to the
//! actor's mailbox. One outbox keeps the engine's order: a release before the next step's
//! loads, a step's saves before a later `SettleSaves`.
//!
//! - Sender: the engine's handle (`ConnectorHandle`), with `try_send` on the outbox
//!   (capacity `handoff.outbox_capacity`). A full or closed outbox refuses the message at
//!   once and the handle applies the refusal below.
//! - Guarantee: every message is delivered in outbox order, or handed back to the handle
//!   as [`Refused`] when its actor's mailbox is full or the actor is gone; none is lost
//!   while the handle is open.
//! - Reply: none; refusals come back on the courier's return channel, drained at every
//!   engine hook.
//! - Receiver gone (the courier thread stopped): the outbox is closed, every message is
//!   refused as closed.
//!
//! What a refusal means, per message (the same whether the outbox or the actor refused):
//! lookups are deferred and sent again at the next flush point (full) or answered
//! "nothing to offer" (closed); the loads of a `StartLoads` fail at once (R25); the pages
//! of a save batch are counted dropped and settle (R22); a release is lost (the engine
//! ignores the stale completion); a `SettleSaves` or a barrier is dropped and its waiter
//! stops waiting.

use std::sync::Arc;

use crate::core::page_names::PromptHashes;
use crate::core::planner::LookupPlan;
use crate::messages::lookup_planner::LookupPrefixes;
use crate::messages::reservation_manager::{ReleaseReservation, StartLoads};
use crate::messages::saver_queue::{EnqueueSave, SettleSaves};

/// A finished lookup as the handle keeps it: its plan (`None` when it failed) and the
/// prompt's chain hashes.
pub type LookupAnswer = (Option<Arc<LookupPlan>>, PromptHashes);

/// One message for an actor, as the engine's handle hands it over.
#[derive(Debug)]
pub enum Outgoing {
    /// For the lookup planner: one admission pass's lookups.
    Lookups(LookupPrefixes),
    /// For the reservation manager: one step's new loads.
    StartLoads(StartLoads),
    /// For the reservation manager: a released reservation range.
    Release(ReleaseReservation),
    /// For the saver of `rank`: one step's save batch.
    Save {
        /// The tensor-parallel rank whose saver takes the batch.
        rank: usize,
        /// The batch.
        batch: EnqueueSave,
    },
    /// For the saver of `rank`: answer once everything queued before is settled.
    Settle {
        /// The tensor-parallel rank.
        rank: usize,
        /// The request, with its answer channel.
        message: SettleSaves,
    },
    /// For the courier itself: drop what finished requests kept of their lookups (plan
    /// and chain hashes). A long prompt's hashes are hundreds of KiB, and freeing them on
    /// the engine thread cost it heap consolidation and trims (profiled); the courier
    /// frees them instead. Refused: the handle drops them itself.
    Discard(Vec<LookupAnswer>),
    /// For the courier itself: answer on `passed` once every message handed off before
    /// this one was delivered or handed back. `ConnectorHandle::stats` sends one first, so
    /// a report sees everything the engine did before asking.
    Barrier {
        /// Where to say "passed" (bounded, capacity 1); dropped unanswered if refused.
        passed: flume::Sender<()>,
    },
}

/// A message the courier could not deliver, handed back to the engine's handle.
#[derive(Debug)]
pub struct Refused {
    /// The message, untouched.
    pub item: Outgoing,
    /// `true` when its receiver is gone for good; `false` when its mailbox (or the
    /// outbox) was full and a later try may succeed.
    pub closed: bool,
}
