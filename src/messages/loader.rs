//! Messages to a loader.

use std::sync::Arc;
use std::time::Instant;

use actix::Message;

use crate::core::ledger::LoadTicket;
use crate::transfer::{LoadGrant, LoadOrder, PageRef};

/// Move these pages pool -> staging -> device and report (R24).
///
/// - Sender: the reservation manager, with `try_send`; a full mailbox fails the load
///   at once (the engine computes the prefix, R25).
/// - Guarantee: the loader verifies every object (R5), writes only pages the grant still
///   lends (R29), and answers with exactly one `RankLoadFinished`; a partial load is
///   reported failed.
/// - Reply: none; the report goes to the reservation manager.
/// - Receiver gone: `try_send` fails and the manager fails the load.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct LoadBlocks {
    /// The ledger ticket.
    pub ticket: LoadTicket,
    /// Pages to load on this rank.
    pub items: Vec<PageRef>,
    /// The block index of each item (what a release names).
    pub blocks: Vec<u64>,
    /// The pages the engine still lends to this load, shared with the engine's handle and
    /// the loaders of the other ranks (R29).
    pub grant: Arc<LoadGrant>,
    /// When the reservation manager received the `StartLoad`.
    pub started_at: Instant,
}

impl LoadBlocks {
    /// The load as the transfer procedure takes it.
    pub fn order(&self) -> LoadOrder<'_> {
        LoadOrder {
            items: &self.items,
            blocks: &self.blocks,
            grant: &self.grant,
        }
    }
}
