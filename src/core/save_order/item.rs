//! What the queue holds and what a push hands back.

use super::SavePriority;
use crate::core::hash::BlockHash;
use crate::core::ids::{PageIndex, RequestId};
use crate::core::layout::GroupId;

/// One planned save: which page of which block to write, and under which chain hash.
/// It names the page; the bytes are read from the device only when the save is popped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SaveItem {
    /// The request whose page this is; drops and completions are counted per request.
    pub request: RequestId,
    /// The page's layer group.
    pub group: GroupId,
    /// The block's index in the prompt.
    pub block_index: u64,
    /// The page in the group's page table.
    pub page: PageIndex,
    /// The block's chain hash, the last segment of its pool key (R3).
    pub hash: BlockHash,
}

/// An item of one request: the queue sheds by request (R22), so it must know whose each
/// queued item is.
pub trait OfRequest {
    /// The request the item belongs to.
    fn request(&self) -> RequestId;
}

impl OfRequest for SaveItem {
    fn request(&self) -> RequestId {
        self.request
    }
}

/// An item with the priority it was pushed with, as handed back when it is dropped or
/// removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prioritized<T> {
    /// The item.
    pub item: T,
    /// The priority it was pushed with (not the class it was filed under, `save_order::I6`).
    pub priority: SavePriority,
}

/// What [`super::SaveQueue::push`] did. A push never blocks and never fails (R22).
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "dropped saves must be counted and their requests' pages released (R22)"]
pub struct PushOutcome<T> {
    /// Whether the pushed item is now queued.
    pub queued: bool,
    /// Every item this push dropped, in push order: the queued entries of each request it
    /// shed, request by request, oldest request first, and last the incoming item itself
    /// when it was not queued (`save_order::I5`, `save_order::I7`).
    pub dropped: Vec<Prioritized<T>>,
}

impl<T> PushOutcome<T> {
    /// Queued, nothing dropped.
    #[cfg(feature = "internals")]
    pub fn queued() -> Self {
        Self {
            queued: true,
            dropped: Vec::new(),
        }
    }

    /// Whether the pushed item is now queued.
    #[cfg(feature = "internals")]
    pub fn is_queued(&self) -> bool {
        self.queued
    }

    /// The items this push dropped.
    pub fn into_dropped(self) -> Vec<Prioritized<T>> {
        self.dropped
    }
}
