//! The byte-moving procedures of loaders and the saver, as plain synchronous functions
//! over a [`Pool`], a [`CopyStream`] and a [`StagingPool`] (R5, R19, R24, R25), and the
//! lookup's probe procedure ([`lookup`], R10-R15).
//!
//! The actors own the resources and call these on their own threads (a loader's
//! Arbiter, the saver's blocking task); keeping the procedures here makes them testable
//! without an actor system.
//!
//! Load (R24): for each batch of [`LENT_BATCH_PAGES`] objects (or `staging.slots()`, if
//! more): take the objects from the pool (lent without a copy where the pool can lend,
//! `Pool::lend`, and then pipelined: the next batch is submitted before the previous one is
//! waited for; else batch gets into the staging slots, a part of `staging.slots()` at a
//! time), check every header against what was asked for (R5), ask the engine's
//! [`LoadGrant`] which pages are still lent (R29), scatter those payloads to their device
//! pages with the device checksumming each page that landed
//! (`CopyStream::scatter_checked`), wait, and compare those checksums with the headers'.
//! A page the engine took back is never written once its release returned (`grant`).
//! Any miss, pool error, corrupt object or failed copy fails the whole load (R25): the
//! caller reports it failed and the engine computes the prefix itself; pages already
//! written are not reported as computed.
//!
//! A pool answer of the wrong shape never reaches the device: a batch answered with
//! another number of results fails the load (pool error) or the saves without an answer
//! (failed); a get that reports another byte count than the object's fails the load as
//! corrupt (R5), even when the count exceeds the buffer.
//!
//! Save (R19): probe the batch's keys and skip those already present; gather the rest from
//! device pages, with the device checksumming each page (`gather_checked`), after the
//! header area of fresh pool objects (`Pool::alloc_objects`, zero-copy) or of staging
//! slots; seal each header with its page's checksum; commit the objects or batch put the
//! slots; every key's result is reported.
//!
//! Neither path reads a payload with the CPU on a CUDA device: the copies are DMA and the
//! checksums come from the device (`gpu::checked`).

use crate::core::hash::BlockHash;
use crate::core::ids::PageIndex;
use crate::core::keys::KeySpace;
use crate::core::layout::GroupId;
use crate::core::object::{ObjectIdentity, HEADER_BYTES};
use crate::gpu::{PageCopy, StagingPool};

mod grant;
mod load;
pub mod lookup;
mod save;
mod save_retry;

pub use grant::{CopyPermit, LoadGrant};
pub use load::{load_pages, LoadOrder};
#[cfg(feature = "internals")]
pub use load::LoadMoved;
pub use save::save_pages;
pub use save_retry::{save_pages_retrying, NoSpaceRetry, RetriedSave};

/// One page and its pool object: the object's key, what its header says, and the device
/// page it is loaded into or saved from.
#[derive(Clone, Debug)]
pub struct PageRef {
    /// Pool key of the object.
    pub key: String,
    /// What the object's header says (checked on loads, written on saves).
    pub identity: ObjectIdentity,
    /// Device page index in the identity's group.
    pub page: u32,
    /// Payload bytes (the device page size).
    pub payload_len: usize,
}

impl PageRef {
    /// Device page `page` of block `hash` in `group` on `rank`, with the key and identity
    /// the deployment's key space gives it (R3, R4); `None` when the key space has no such
    /// group.
    pub fn in_key_space(
        keys: &KeySpace,
        rank: u32,
        group: GroupId,
        page: PageIndex,
        hash: BlockHash,
    ) -> Option<Self> {
        let group = keys.index_of(group).and_then(|index| keys.group(index))?;
        Some(Self {
            key: group.key(rank, &hash),
            identity: keys.identity(group, rank, hash),
            page: page.0,
            payload_len: group.payload_len,
        })
    }
}

/// How one save ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveResult {
    /// Stored in the pool.
    Stored,
    /// Already present (probe or put said so): nothing written (R19).
    SkippedPresent,
    /// Could not be stored (pool error, failed copy).
    Failed,
    /// Refused by the pool for want of room (a full pool, or no segment mounted yet):
    /// failed, and counted apart as well (`saves_no_space`).
    NoSpace,
    /// Not stored because the pool was unreachable or missed a deadline (R30): dropped
    /// and counted as an outage loss.
    Outage,
}

/// Pages per batch of lent objects (and of fresh pool objects on saves): they stay in pool
/// memory, so staging does not bound them, and one submission of this many 1 MiB pages
/// keeps the copy engine busy for milliseconds against tens of microseconds of per-batch
/// work (the kernel, the result copy, the event).
pub const LENT_BATCH_PAGES: usize = 256;

/// Pages per batch: at least [`LENT_BATCH_PAGES`], and at least the staging slots. A pool
/// that does not lend is then served in parts of `staging.slots()`.
pub(super) fn batch_len(staging: &StagingPool) -> usize {
    usize::try_from(staging.slots())
        .unwrap_or(usize::MAX)
        .max(LENT_BATCH_PAGES)
}

/// One copy per item: the payload after the header of slot or object `i` to its page.
pub(super) fn page_copies(items: impl Iterator<Item = (GroupId, u32, usize)>) -> Vec<PageCopy> {
    items
        .enumerate()
        .map(|(slot, (group, page, len))| PageCopy {
            group,
            page,
            staging_slot: u32::try_from(slot).unwrap_or(u32::MAX),
            staging_offset: HEADER_BYTES,
            len,
        })
        .collect()
}

#[cfg(test)]
mod tests;
