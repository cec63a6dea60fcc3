//! Messages to the reservation manager.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use actix::Message;

use crate::core::hash::BlockHash;
use crate::core::keys::KeySpace;
use crate::core::page_names::PromptHashes;
use crate::core::ids::{PageIndex, RequestId, ReservationId};
use crate::core::ledger::{LoadResult, LoadTicket, ReservedPage};
use crate::core::planner::LookupPlan;
use crate::stats::LoadStats;
use crate::transfer::LoadGrant;

/// Record the reservations whose pages the engine allocated in one step and start
/// loading them (R23, R24).
///
/// - Sender: the engine's handle (`on_step`): one message per step carrying every new
///   reservation of the step, so a step wakes the manager once however many loads it
///   starts; through the courier (`crate::messages::courier`), which delivers it with
///   `try_send`. A full mailbox (or outbox) makes the handle report every load of the
///   message failed, and the engine computes those prefixes (R25).
/// - Guarantee: the loads are handled in the order of [`StartLoads::loads`]; each
///   reservation enters the ledger and one `LoadBlocks` goes to a loader of every rank;
///   exactly one `FinishedLoad` reaches the engine inbox per reservation, unless it is
///   released or replaced first (R26).
/// - Reply: none (`()`).
/// - Receiver gone: the courier hands it back; the handle reports every load of the
///   message failed.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct StartLoads {
    /// The step's new reservations, in the order the engine reported them.
    pub loads: Vec<StartLoad>,
    /// When the handle sent it.
    pub enqueued_at: Instant,
}

/// One reservation of a [`StartLoads`] message.
#[derive(Debug)]
pub struct StartLoad {
    /// The request.
    pub request: RequestId,
    /// The engine's reservation id.
    pub reservation: ReservationId,
    /// Tokens the reservation covers.
    pub tokens: Range<u64>,
    /// The lookup's plan: which blocks of which groups to load (R15).
    pub plan: Arc<LookupPlan>,
    /// The names of the prompt's pages (R1, R37).
    pub hashes: PromptHashes,
    /// The engine's page for each planned block, in plan order (groups, then blocks).
    pub pages: Vec<u32>,
    /// The pages the engine lends to the load; the handle takes them back on a release
    /// (R29), the loaders of every rank write only what it still lends.
    pub grant: Arc<LoadGrant>,
}

impl StartLoad {
    /// Pairs each planned (group, block) with its engine page and its page's name in
    /// `keys` (R37), in plan order; a block without a name or a page is left out.
    pub(crate) fn planned_pages(&self, keys: &KeySpace) -> Vec<(ReservedPage, BlockHash)> {
        let blocks = self
            .plan
            .loads
            .iter()
            .flat_map(|load| load.blocks.iter().map(move |&block| (load.group, block)));
        blocks
            .zip(&self.pages)
            .filter_map(|((group, block), &page)| {
                let hash = keys.page_hash(&self.hashes, group, block)?;
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
}

/// Forget tokens `[start, end)` of a reservation (`release_prefix_reservation`).
///
/// - Sender: the engine's handle, through the courier (`crate::messages::courier`), so it
///   reaches the manager after every message the handle handed off before it.
/// - Guarantee: the ledger frees the released pages (a later reservation may hold them);
///   a completion for a reservation released whole is ignored (R26). The loaders already
///   skip the released pages: the handle took them back from the load's grant before
///   sending this (R29).
/// - Reply: none.
/// - Receiver gone or full: the release is lost to the ledger; the reservation's
///   completion is then still reported and the engine ignores it as stale on its side.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ReleaseReservation {
    /// The reservation.
    pub reservation: ReservationId,
    /// First released token.
    pub start: u64,
    /// One past the last released token.
    pub end: u64,
}

/// One rank's loader finished its part of a load.
///
/// - Sender: a loader, with `send().await` from a task spawned on its own Arbiter.
/// - Guarantee: when every rank has reported, the reservation is finished: filled only if
///   every rank filled (R24), failed otherwise (R25); stale tickets are ignored (R26).
/// - Reply: none.
/// - Receiver gone: the loader logs it; the connector is shutting down.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct RankLoadFinished {
    /// The ledger ticket of the load.
    pub ticket: LoadTicket,
    /// This rank's result.
    pub result: LoadResult,
    /// Pages this rank placed.
    pub pages: u64,
    /// Payload bytes this rank placed.
    pub bytes: u64,
    /// Time from the manager taking the load (`StartLoads`) to this report.
    pub started_at: Instant,
}

/// Report and reset the load counters (R27).
///
/// - Sender: the stats reporter and the handle's final report.
/// - Reply: [`LoadStats`].
/// - Receiver gone: the report shows no loads.
#[derive(Message, Debug)]
#[rtype(result = "LoadStats")]
pub struct CollectLoadStats;
