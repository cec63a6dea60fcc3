//! The load procedure (R5, R24, R25, R29): lend or get, check headers, ask the grant,
//! scatter with device checksums, wait, compare (the workflow is in the parent module's
//! docs).

use super::{batch_len, CopyPermit, LoadGrant, PageRef};
use crate::core::ledger::LoadFailure;
use crate::core::object::{self, HEADER_BYTES};
use crate::gpu::host_memory::SharedSlot;
use crate::gpu::{CheckedInFlight, CopyStream, PageCopy, StagingPool};
use crate::pool::{Pool, PoolError};

/// What a successful load moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadMoved {
    /// Pages placed on the device.
    pub pages: u64,
    /// Payload bytes placed on the device.
    pub bytes: u64,
}

impl LoadMoved {
    fn add(&mut self, other: LoadMoved) {
        self.pages += other.pages;
        self.bytes += other.bytes;
    }
}

/// One rank's part of a load: its pages, the block each one holds, and the engine's
/// grant of those pages (R29).
#[derive(Clone, Copy, Debug)]
pub struct LoadOrder<'a> {
    /// The pages to load, in order.
    pub items: &'a [PageRef],
    /// The block index of each item (what a release names): as long as `items`.
    pub blocks: &'a [u64],
    /// The pages the engine still lends to the load; only those are written.
    pub grant: &'a LoadGrant,
}

/// Loads the items of `order` into device pages, skipping the pages the engine took back
/// (R29: the grant is asked right before each batch's copy). Returns the staging pool in
/// every case.
///
/// Batches of lent objects are pipelined: the next batch is lent, checked and submitted
/// before the previous one is waited for, so the copy engine always has work queued. A
/// failure waits for what is in flight before it returns (no copy outlives the call).
/// A grant taken back whole ends the load early; its completion is stale (R26).
///
/// `deadline` (`loaders.load_timeout_ms` after the load started) is checked before each
/// batch's pool call and before its device copy: a load past it fails as
/// [`LoadFailure::Timeout`] (R25). A pool call already running is not interrupted; its
/// own timeouts bound it.
pub fn load_pages(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    mut staging: StagingPool,
    order: LoadOrder<'_>,
    deadline: Option<std::time::Instant>,
) -> (StagingPool, Result<LoadMoved, LoadFailure>) {
    let expired = || deadline.is_some_and(|deadline| std::time::Instant::now() >= deadline);
    if order.items.len() != order.blocks.len() {
        tracing::warn!(
            items = order.items.len(),
            blocks = order.blocks.len(),
            "a load names another number of blocks than pages; load failed"
        );
        return (staging, Err(LoadFailure::DeviceCopy));
    }
    if let Some(too_big) = order
        .items
        .iter()
        .find(|item| object::object_len(item.payload_len) > staging.slot_bytes())
    {
        tracing::warn!(key = %too_big.key, slot_bytes = staging.slot_bytes(), "object larger than a staging slot");
        return (staging, Err(LoadFailure::DeviceCopy));
    }
    let len = batch_len(&staging);
    let mut moved = LoadMoved::default();
    let mut in_flight: Option<LentBatch<'_>> = None;
    for (batch, blocks) in order.items.chunks(len).zip(order.blocks.chunks(len)) {
        if order.grant.is_revoked() {
            break;
        }
        if expired() {
            return fail_load(staging, in_flight, LoadFailure::Timeout);
        }
        let part = LoadOrder {
            items: batch,
            blocks,
            grant: order.grant,
        };
        let started;
        (staging, started) = start_batch(pool, stream, staging, part, &expired);
        let next = match started {
            Ok(started) => {
                moved.add(started.moved);
                started.in_flight
            }
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

/// A batch of lent objects submitted and not yet waited for. Fields drop in order: the
/// copy is waited for before the permit says it landed (R29).
struct LentBatch<'a> {
    in_flight: CheckedInFlight<Vec<SharedSlot>>,
    /// The items copied (those still lent) with their stored checksums.
    copied: Vec<(&'a PageRef, u64)>,
    _permit: CopyPermit<'a>,
}

impl LentBatch<'_> {
    /// Waits for the batch and compares the device checksums with the headers' (R5).
    fn finish(self) -> Result<(), LoadFailure> {
        let (_objects, sums) = self.in_flight.wait();
        let sums = sums.map_err(|_| LoadFailure::DeviceCopy)?;
        compare_checksums(&self.copied, &sums)
    }
}

/// What starting a batch did: the lent batch left in flight, and what it places.
struct Started<'a> {
    in_flight: Option<LentBatch<'a>>,
    moved: LoadMoved,
}

/// Starts one batch: lent objects are checked and submitted (returned in flight); without
/// lending, the batch is got into staging, scattered and checked before returning. Only
/// the pages the grant still lends are copied.
fn start_batch<'a>(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    mut staging: StagingPool,
    batch: LoadOrder<'a>,
    expired: &dyn Fn() -> bool,
) -> (StagingPool, Result<Started<'a>, LoadFailure>) {
    let keys: Vec<&str> = batch.items.iter().map(|item| item.key.as_str()).collect();
    if let Some(lent) = pool.lend(&keys) {
        let started = take_lent(batch.items, lent).and_then(|(objects, stored)| {
            if expired() {
                return Err(LoadFailure::Timeout);
            }
            let (permit, still_lent) = batch.grant.begin_copy(batch.blocks);
            let kept = kept_slots(&still_lent);
            let moved = moved_by(batch.items, &kept);
            if kept.is_empty() {
                return Ok(Started {
                    in_flight: None,
                    moved,
                });
            }
            let copies = load_copies(batch.items, &kept);
            let in_flight = stream
                .scatter_checked(objects, &copies)
                .map_err(|_| LoadFailure::DeviceCopy)?;
            Ok(Started {
                in_flight: Some(LentBatch {
                    in_flight,
                    copied: kept.iter().map(|&i| (&batch.items[i], stored[i])).collect(),
                    _permit: permit,
                }),
                moved,
            })
        });
        return (staging, started);
    }
    let slots = usize::try_from(staging.slots())
        .unwrap_or(usize::MAX)
        .max(1);
    let mut moved = LoadMoved::default();
    for (items, blocks) in batch.items.chunks(slots).zip(batch.blocks.chunks(slots)) {
        let part = LoadOrder {
            items,
            blocks,
            grant: batch.grant,
        };
        let checked;
        (staging, checked) = load_through_staging(pool, stream, staging, part, expired);
        match checked {
            Ok(part_moved) => moved.add(part_moved),
            Err(failure) => return (staging, Err(failure)),
        }
    }
    let started = Started {
        in_flight: None,
        moved,
    };
    (staging, Ok(started))
}

/// Without lending: gets at most `staging.slots()` objects into staging, checks their
/// headers, scatters the pages still lent with device checksums and compares them.
fn load_through_staging(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    mut staging: StagingPool,
    batch: LoadOrder<'_>,
    expired: &dyn Fn() -> bool,
) -> (StagingPool, Result<LoadMoved, LoadFailure>) {
    let keys: Vec<&str> = batch.items.iter().map(|item| item.key.as_str()).collect();
    let stored = match fetch_into_staging(pool, &mut staging, batch.items, &keys) {
        Ok(stored) => stored,
        Err(failure) => return (staging, Err(failure)),
    };
    if expired() {
        return (staging, Err(LoadFailure::Timeout));
    }
    // Held until the copy landed (`wait` below): a release waits for it (R29).
    let (_permit, still_lent) = batch.grant.begin_copy(batch.blocks);
    let kept = kept_slots(&still_lent);
    let moved = moved_by(batch.items, &kept);
    if kept.is_empty() {
        return (staging, Ok(moved));
    }
    let copies = load_copies(batch.items, &kept);
    let (staging, sums) = match stream.scatter_checked(staging, &copies) {
        Ok(in_flight) => in_flight.wait(),
        Err(refused) => return (refused.memory, Err(LoadFailure::DeviceCopy)),
    };
    let landed: Vec<(&PageRef, u64)> = kept.iter().map(|&i| (&batch.items[i], stored[i])).collect();
    let checked = sums
        .map_err(|_| LoadFailure::DeviceCopy)
        .and_then(|sums| compare_checksums(&landed, &sums))
        .map(|()| moved);
    (staging, checked)
}

/// Positions of the items still lent.
fn kept_slots(still_lent: &[bool]) -> Vec<usize> {
    (0..still_lent.len()).filter(|&i| still_lent[i]).collect()
}

/// What copying the items at `kept` places.
fn moved_by(items: &[PageRef], kept: &[usize]) -> LoadMoved {
    LoadMoved {
        pages: kept.len() as u64,
        bytes: kept.iter().map(|&i| items[i].payload_len as u64).sum(),
    }
}

/// The scatter copies of the items at `kept`: item `i`'s payload (after the header of
/// slot or object `i`) to its page.
fn load_copies(batch: &[PageRef], kept: &[usize]) -> Vec<PageCopy> {
    kept.iter()
        .map(|&slot| {
            let item = &batch[slot];
            PageCopy {
                group: item.identity.group,
                page: item.page,
                staging_slot: u32::try_from(slot).unwrap_or(u32::MAX),
                staging_offset: HEADER_BYTES,
                len: item.payload_len,
            }
        })
        .collect()
}

/// Compares each copied page's device checksum with its header's (R5).
fn compare_checksums(copied: &[(&PageRef, u64)], sums: &[u64]) -> Result<(), LoadFailure> {
    for (&(item, stored), &computed) in copied.iter().zip(sums) {
        if let Err(error) = object::check_checksum(stored, computed) {
            tracing::warn!(key = %item.key, %error, "loaded page does not match its checksum");
            return Err(LoadFailure::Corrupt);
        }
    }
    if sums.len() == copied.len() {
        Ok(())
    } else {
        Err(LoadFailure::DeviceCopy)
    }
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
