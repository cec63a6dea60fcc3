//! The byte-moving procedures of loaders and the saver, as plain synchronous functions
//! over a [`Pool`], a [`CopyStream`] and a [`StagingPool`] (R5, R19, R24, R25).
//!
//! The actors own the resources and call these on their own threads (a loader's
//! Arbiter, the saver's blocking task); keeping the procedures here makes them testable
//! without an actor system.
//!
//! Load (R24): for each batch of [`LENT_BATCH_PAGES`] objects (or `staging.slots()`, if
//! more): take the objects from the pool (lent without a copy where the pool can lend,
//! `Pool::lend`, and then pipelined: the next batch is submitted before the previous one is
//! waited for; else batch gets into the staging slots, a part of `staging.slots()` at a
//! time), check every header against what was asked for (R5), scatter
//! the payloads to their device pages with the device checksumming each page that landed
//! (`CopyStream::scatter_checked`), wait, and compare those checksums with the headers'.
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
use crate::core::ledger::LoadFailure;
use crate::core::object::{self, ObjectIdentity, HEADER_BYTES};
use crate::gpu::host_memory::SharedSlot;
use crate::gpu::{CheckedInFlight, CopyStream, PageCopy, StagingPool};
use crate::pool::{Pool, PoolError};

mod save;

pub use save::save_pages;

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

/// What a successful load moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadMoved {
    /// Pages placed on the device.
    pub pages: u64,
    /// Payload bytes placed on the device.
    pub bytes: u64,
}

/// How one save ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveResult {
    /// Stored in the pool.
    Stored,
    /// Already present (probe or put said so): nothing written (R19).
    SkippedPresent,
    /// Could not be stored (pool error, no space, failed copy).
    Failed,
    /// Not stored because the pool was unreachable or missed a deadline (R30): dropped
    /// and counted as an outage loss.
    Outage,
}

/// Loads `items` into device pages. Returns the staging pool in every case.
///
/// Batches of lent objects are pipelined: the next batch is lent, checked and submitted
/// before the previous one is waited for, so the copy engine always has work queued. A
/// failure waits for what is in flight before it returns (no copy outlives the call).
///
/// `deadline` (`loaders.load_timeout_ms` after the load started) is checked before each
/// batch's pool call and before its device copy: a load past it fails as
/// [`LoadFailure::Timeout`] (R25). A pool call already running is not interrupted; its
/// own timeouts bound it.
pub fn load_pages(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    mut staging: StagingPool,
    items: &[PageRef],
    deadline: Option<std::time::Instant>,
) -> (StagingPool, Result<LoadMoved, LoadFailure>) {
    let expired = || deadline.is_some_and(|deadline| std::time::Instant::now() >= deadline);
    if let Some(too_big) = items
        .iter()
        .find(|item| object::object_len(item.payload_len) > staging.slot_bytes())
    {
        tracing::warn!(key = %too_big.key, slot_bytes = staging.slot_bytes(), "object larger than a staging slot");
        return (staging, Err(LoadFailure::DeviceCopy));
    }
    let mut in_flight: Option<LentBatch<'_>> = None;
    for batch in items.chunks(batch_len(&staging)) {
        if expired() {
            return fail_load(staging, in_flight, LoadFailure::Timeout);
        }
        let started;
        (staging, started) = start_batch(pool, stream, staging, batch, &expired);
        let next = match started {
            Ok(next) => next,
            Err(failure) => return fail_load(staging, in_flight, failure),
        };
        if let Some(previous) = std::mem::replace(&mut in_flight, next) {
            if let Err(failure) = previous.finish() {
                return fail_load(staging, in_flight, failure);
            }
        }
    }
    if let Some(last) = in_flight {
        if let Err(failure) = last.finish() {
            return (staging, Err(failure));
        }
    }
    let moved = LoadMoved {
        pages: items.len() as u64,
        bytes: items.iter().map(|item| item.payload_len as u64).sum(),
    };
    (staging, Ok(moved))
}

/// Fails a load after waiting for the batch still in flight (its drop waits), so no copy
/// outlives the call (R25).
fn fail_load(
    staging: StagingPool,
    in_flight: Option<LentBatch<'_>>,
    failure: LoadFailure,
) -> (StagingPool, Result<LoadMoved, LoadFailure>) {
    drop(in_flight);
    (staging, Err(failure))
}

/// Pages per batch of lent objects (and of fresh pool objects on saves): they stay in pool
/// memory, so staging does not bound them, and one submission of this many 1 MiB pages
/// keeps the copy engine busy for milliseconds against tens of microseconds of per-batch
/// work (the kernel, the result copy, the event).
pub const LENT_BATCH_PAGES: usize = 256;

/// A batch of lent objects submitted and not yet waited for.
struct LentBatch<'a> {
    in_flight: CheckedInFlight<Vec<SharedSlot>>,
    batch: &'a [PageRef],
    stored: Vec<u64>,
}

impl LentBatch<'_> {
    /// Waits for the batch and compares the device checksums with the headers' (R5).
    fn finish(self) -> Result<(), LoadFailure> {
        let (_objects, sums) = self.in_flight.wait();
        let sums = sums.map_err(|_| LoadFailure::DeviceCopy)?;
        compare_checksums(self.batch, &self.stored, &sums)
    }
}

/// Starts one batch: lent objects are checked and submitted (returned in flight); without
/// lending, the batch is got into staging, scattered and checked before returning.
fn start_batch<'a>(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    mut staging: StagingPool,
    batch: &'a [PageRef],
    expired: &dyn Fn() -> bool,
) -> (StagingPool, Result<Option<LentBatch<'a>>, LoadFailure>) {
    let keys: Vec<&str> = batch.iter().map(|item| item.key.as_str()).collect();
    if let Some(lent) = pool.lend(&keys) {
        let copies = load_copies(batch);
        let started = take_lent(batch, lent).and_then(|(objects, stored)| {
            if expired() {
                return Err(LoadFailure::Timeout);
            }
            let in_flight = stream
                .scatter_checked(objects, &copies)
                .map_err(|_| LoadFailure::DeviceCopy)?;
            Ok(Some(LentBatch {
                in_flight,
                batch,
                stored,
            }))
        });
        return (staging, started);
    }
    let slots = usize::try_from(staging.slots())
        .unwrap_or(usize::MAX)
        .max(1);
    for part in batch.chunks(slots) {
        let checked;
        (staging, checked) = load_through_staging(pool, stream, staging, part, expired);
        if let Err(failure) = checked {
            return (staging, Err(failure));
        }
    }
    (staging, Ok(None))
}

/// Without lending: gets at most `staging.slots()` objects into staging, checks their
/// headers, scatters with device checksums and compares them.
fn load_through_staging(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    mut staging: StagingPool,
    batch: &[PageRef],
    expired: &dyn Fn() -> bool,
) -> (StagingPool, Result<(), LoadFailure>) {
    let keys: Vec<&str> = batch.iter().map(|item| item.key.as_str()).collect();
    let copies = load_copies(batch);
    let stored = match fetch_into_staging(pool, &mut staging, batch, &keys) {
        Ok(stored) => stored,
        Err(failure) => return (staging, Err(failure)),
    };
    if expired() {
        return (staging, Err(LoadFailure::Timeout));
    }
    let (staging, sums) = match stream.scatter_checked(staging, &copies) {
        Ok(in_flight) => in_flight.wait(),
        Err(refused) => return (refused.memory, Err(LoadFailure::DeviceCopy)),
    };
    let checked = sums
        .map_err(|_| LoadFailure::DeviceCopy)
        .and_then(|sums| compare_checksums(batch, &stored, &sums));
    (staging, checked)
}

/// The scatter copies of a batch: item `i`'s payload (after the header of slot or object
/// `i`) to its page.
fn load_copies(batch: &[PageRef]) -> Vec<PageCopy> {
    page_copies(
        batch
            .iter()
            .map(|item| (item.identity.group, item.page, item.payload_len)),
    )
}

/// Pages per batch: at least [`LENT_BATCH_PAGES`], and at least the staging slots. A pool
/// that does not lend is then served in parts of `staging.slots()`.
pub(super) fn batch_len(staging: &StagingPool) -> usize {
    usize::try_from(staging.slots())
        .unwrap_or(usize::MAX)
        .max(LENT_BATCH_PAGES)
}

/// Compares each page's device checksum with its header's (R5).
fn compare_checksums(batch: &[PageRef], stored: &[u64], sums: &[u64]) -> Result<(), LoadFailure> {
    for ((item, &stored), &computed) in batch.iter().zip(stored).zip(sums) {
        if let Err(error) = object::check_checksum(stored, computed) {
            tracing::warn!(key = %item.key, %error, "loaded page does not match its checksum");
            return Err(LoadFailure::Corrupt);
        }
    }
    if sums.len() == batch.len() {
        Ok(())
    } else {
        Err(LoadFailure::DeviceCopy)
    }
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

/// The lent objects of a batch, each checked for length and header (R5); returns them
/// with the stored checksums.
fn take_lent(
    batch: &[PageRef],
    lent: Vec<Result<SharedSlot, PoolError>>,
) -> Result<(Vec<SharedSlot>, Vec<u64>), LoadFailure> {
    if lent.len() != batch.len() {
        tracing::warn!(
            keys = batch.len(),
            answers = lent.len(),
            "pool lent a batch with the wrong number of results; load failed"
        );
        return Err(LoadFailure::PoolError);
    }
    let mut objects = Vec::with_capacity(batch.len());
    let mut stored = Vec::with_capacity(batch.len());
    for (item, result) in batch.iter().zip(lent) {
        let object = result.map_err(|error| match error {
            PoolError::NotFound => LoadFailure::Evicted,
            _ => LoadFailure::PoolError,
        })?;
        stored.push(open_checked_header(item, &object, object.len())?);
        objects.push(object);
    }
    Ok((objects, stored))
}

/// Gets one batch into staging and checks every header; returns the stored checksums.
fn fetch_into_staging(
    pool: &dyn Pool,
    staging: &mut StagingPool,
    batch: &[PageRef],
    keys: &[&str],
) -> Result<Vec<u64>, LoadFailure> {
    let mut buffers: Vec<&mut [u8]> = staging.slots_mut().take(batch.len()).collect();
    let results = pool.get_into(keys, &mut buffers);
    if results.len() != batch.len() {
        tracing::warn!(
            keys = batch.len(),
            answers = results.len(),
            "pool answered a batch get with the wrong number of results; load failed"
        );
        return Err(LoadFailure::PoolError);
    }
    let mut stored = Vec::with_capacity(batch.len());
    for ((item, result), buffer) in batch.iter().zip(results).zip(buffers) {
        let read = match result {
            Ok(read) => read,
            Err(PoolError::NotFound) => return Err(LoadFailure::Evicted),
            Err(_) => return Err(LoadFailure::PoolError),
        };
        stored.push(open_checked_header(item, buffer, read)?);
    }
    Ok(stored)
}

/// Checks an object's byte count and header (R5) and returns its stored checksum.
///
/// A pool that reports another byte count than the object's (or more than the buffer
/// holds) is answering wrongly: the object counts as corrupt, and the buffer is only read
/// within its bounds.
fn open_checked_header(item: &PageRef, buffer: &[u8], read: usize) -> Result<u64, LoadFailure> {
    let expected = object::object_len(item.payload_len);
    let Some(object_bytes) = buffer.get(..read).filter(|_| read == expected) else {
        tracing::warn!(key = %item.key, expected, read, "pool answered a get with the wrong byte count");
        return Err(LoadFailure::Corrupt);
    };
    object::open_header(&item.identity, object_bytes, item.payload_len)
        .map_err(|_| LoadFailure::Corrupt)
}

#[cfg(test)]
mod tests;
