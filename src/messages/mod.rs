//! Typed messages, one file per receiving actor.
//!
//! Every message says who sends it, what the receiver guarantees, its reply, and what
//! happens when the receiver is gone. Commands are imperative, events past tense.
//! Replies that must reach the engine's (non-actix) thread travel over bounded flume
//! channels, named in [`EngineInbox`]; everything between actors uses actix mailboxes.

pub mod courier;
pub mod loader;
pub mod lookup_planner;
pub mod prompt;
pub mod reservation_manager;
pub mod saver_queue;
pub mod stats_reporter;

use crate::core::page_names::PromptHashes;
use crate::core::ids::{LookupTicket, RequestId, ReservationId};
use crate::core::planner::LookupPlan;

/// A lookup's result, sent by the lookup planner to the engine's handle.
#[derive(Debug)]
pub struct LookupCompleted {
    /// The request looked up.
    pub request: RequestId,
    /// The ticket of the lookup this answers: the handle accepts the result only for the
    /// request record that holds the same ticket (R32).
    pub ticket: LookupTicket,
    /// The plan (R10-R15); `None` when the lookup failed (the engine computes everything).
    pub plan: Option<LookupPlan>,
    /// The names of the prompt's pages (R1, R37), reused for saves.
    pub hashes: PromptHashes,
}

/// A reservation whose load ended, sent by the reservation manager to the engine's
/// handle (which hands it out through `get_finished_prefix_loads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FinishedLoad {
    /// The reservation.
    pub reservation: ReservationId,
    /// The request it belongs to.
    pub request: RequestId,
    /// `true`: every page is in place and verified; `false`: the engine computes the
    /// prefix itself (R25).
    pub filled: bool,
}

/// The reservation manager's answer to the engine's handle for one load it was asked to
/// start: exactly one per load (`reservation_manager` M1), so the handle always knows how
/// many loads are still in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadAnswer {
    /// The load ended, filled or failed; the engine is told.
    Finished(FinishedLoad),
    /// The engine took every page of the load back before it ended (R26, R29): nothing
    /// is reported to the engine.
    Stale,
}

/// A rank's saver settled `pages` of a request's saves (stored, skipped, failed or dropped).
#[derive(Clone, Copy, Debug)]
pub struct SavesSettled {
    /// The request.
    pub request: RequestId,
    /// Pages settled by this report.
    pub pages: u64,
}

/// The senders the actors use to reach the engine's handle. Each channel is bounded;
/// actors send with `send_async().await`, so a full channel applies backpressure to the
/// actor, never drops a result; the handle drains every channel each step.
#[derive(Clone, Debug)]
pub struct EngineInbox {
    /// Lookup results.
    pub lookups: flume::Sender<LookupCompleted>,
    /// Loads that ended (filled, failed or stale).
    pub loads: flume::Sender<LoadAnswer>,
    /// Save settlements.
    pub saves: flume::Sender<SavesSettled>,
}
