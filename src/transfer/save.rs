//! The save procedure (R19): probe, gather with device checksums, seal, store.
//!
//! Per batch of [`super::LENT_BATCH_PAGES`] items (or `staging.slots()`, if more): probe
//! the keys and skip those already
//! present; for the rest, take fresh objects from the pool where it hands them out
//! (`Pool::alloc_objects`: the gather writes straight into pool memory, then
//! `commit_objects`), else use the staging slots, a part of `staging.slots()` at a time,
//! and a batch `put_absent`. Either way the
//! device checksums each page it copies out (`gather_checked`) and the header is sealed
//! with that checksum, so the CPU never reads the payload.
//!
//! Outages (R30): a probe whose every key answered that the pool is unreachable or late
//! ends the save there: the rest of the items are [`SaveResult::Outage`] without a copy or
//! a put, so a saver facing an unreachable pool drops its queue at once. A put or commit
//! that answers such an error for a key makes that key `Outage` too.
//!
//! No room: a key the pool refused for want of room ([`PoolError::NoSpace`], or Mooncake's
//! `NO_AVAILABLE_HANDLE`: a full pool, or no segment mounted yet after a master restart) is
//! [`SaveResult::NoSpace`], so it is counted apart from other failures.

use super::{batch_len, page_copies, PageRef, SaveResult};
use crate::core::object;
use crate::gpu::host_memory::HostSlot;
use crate::gpu::{CheckedInFlight, CopyStream, PageCopy, StagingPool};
use crate::pool::{Pool, PoolError};

/// Saves `items`, one result per item in order. Returns the staging pool in every case.
///
/// Batches gathered into pool objects are pipelined: the next batch is probed and its
/// gather submitted before the previous one is waited for, sealed and committed.
pub fn save_pages(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    mut staging: StagingPool,
    items: &[PageRef],
) -> (StagingPool, Vec<SaveResult>) {
    let batch_len = batch_len(&staging);
    let slots = usize::try_from(staging.slots())
        .unwrap_or(usize::MAX)
        .max(1);
    let slot_bytes = staging.slot_bytes();
    let mut results = vec![SaveResult::Failed; items.len()];
    let mut in_flight: Option<ObjectBatch<'_>> = None;
    for (first, batch) in (0..).step_by(batch_len).zip(items.chunks(batch_len)) {
        let Some(absent) = probe(pool, first, batch, slot_bytes, &mut results) else {
            results[first..].fill(SaveResult::Outage);
            break;
        };
        if absent.is_empty() {
            continue;
        }
        let lens: Vec<usize> = absent
            .iter()
            .map(|(_, item)| object::object_len(item.payload_len))
            .collect();
        let next = if let Some(allocated) = pool.alloc_objects(&lens) {
            submit_into_objects(stream, absent, allocated, &mut results)
        } else {
            for part in absent.chunks(slots) {
                staging = save_through_staging(pool, stream, staging, part, &mut results);
            }
            None
        };
        if let Some(previous) = std::mem::replace(&mut in_flight, next) {
            previous.finish(pool, &mut results);
        }
    }
    if let Some(last) = in_flight {
        last.finish(pool, &mut results);
    }
    (staging, results)
}

/// Probes a batch (R19): present keys are skipped, the rest returned as (index in
/// `items`, item) and left `Failed` until stored; objects larger than a slot fail. `None`
/// when the pool is unreachable or late for every key (R30).
fn probe<'a>(
    pool: &dyn Pool,
    first: usize,
    batch: &'a [PageRef],
    slot_bytes: usize,
    results: &mut [SaveResult],
) -> Option<Vec<(usize, &'a PageRef)>> {
    let keys: Vec<&str> = batch.iter().map(|item| item.key.as_str()).collect();
    let present = pool.exists(&keys);
    if !present.is_empty()
        && present
            .iter()
            .all(|answer| answer.as_ref().is_err_and(PoolError::is_outage))
    {
        return None;
    }
    let mut absent = Vec::with_capacity(batch.len());
    for (offset, item) in batch.iter().enumerate() {
        let index = first + offset;
        if matches!(present.get(offset), Some(Ok(true))) {
            results[index] = SaveResult::SkippedPresent;
        } else if object::object_len(item.payload_len) <= slot_bytes {
            absent.push((index, item));
        }
    }
    Some(absent)
}

/// Through staging: gather with device checksums, seal, `put_absent`.
fn save_through_staging(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    staging: StagingPool,
    absent: &[(usize, &PageRef)],
    results: &mut [SaveResult],
) -> StagingPool {
    let (mut staging, sums) = match stream.gather_checked(staging, &save_copies(absent)) {
        Ok(in_flight) => in_flight.wait(),
        Err(refused) => return refused.memory,
    };
    let Ok(sums) = sums else {
        return staging;
    };
    let sealed = seal_all(absent, staging.slots_mut(), &sums);
    let (kept, values): (Vec<(usize, &PageRef)>, Vec<&[u8]>) = (0_u32..)
        .zip(absent)
        .zip(sealed)
        .filter_map(|((slot, entry), len)| {
            let bytes = staging.slot(slot).ok()?.get(..len?)?;
            Some((*entry, bytes))
        })
        .unzip();
    let keys: Vec<&str> = kept.iter().map(|(_, item)| item.key.as_str()).collect();
    // The batch was probed just before the gather: no second probe.
    record(results, &kept, &pool.put_absent(&keys, &values));
    staging
}

/// A batch gathering into pool objects, submitted and not yet waited for.
struct ObjectBatch<'a> {
    in_flight: CheckedInFlight<Vec<HostSlot>>,
    kept: Vec<(usize, &'a PageRef)>,
}

/// Zero-copy: submits the gather into the pool's fresh objects (refused allocations stay
/// failed, or [`SaveResult::NoSpace`] when refused for room). `None` when nothing was
/// submitted.
fn submit_into_objects<'a>(
    stream: &mut CopyStream,
    absent: Vec<(usize, &'a PageRef)>,
    allocated: Vec<Result<HostSlot, PoolError>>,
    results: &mut [SaveResult],
) -> Option<ObjectBatch<'a>> {
    if allocated.len() != absent.len() {
        tracing::warn!(
            asked = absent.len(),
            answers = allocated.len(),
            "pool answered an object allocation with the wrong number of results"
        );
        return None;
    }
    let mut objects = Vec::with_capacity(absent.len());
    let mut kept = Vec::with_capacity(absent.len());
    for (entry, object) in absent.into_iter().zip(allocated) {
        match object {
            Ok(object) => {
                objects.push(object);
                kept.push(entry);
            }
            Err(error) if no_room(&error) => results[entry.0] = SaveResult::NoSpace,
            Err(_) => {}
        }
    }
    // Any fresh object of the right length can hold any page of that length: pairing pages
    // in (length, group, page) order with objects in (length, address) order keeps every
    // length matched, and neighbouring objects meet neighbouring pages, which the device
    // moves as one strided copy.
    kept.sort_by_key(|(_, item)| {
        (
            object::object_len(item.payload_len),
            item.identity.group,
            item.page,
        )
    });
    objects.sort_unstable_by_key(|object| (object.len(), object.as_ptr().addr()));
    let in_flight = match stream.gather_checked(objects, &save_copies(&kept)) {
        Ok(in_flight) => in_flight,
        Err(refused) => {
            tracing::warn!(error = %refused.error, "a save batch was refused by the device");
            return None;
        }
    };
    Some(ObjectBatch { in_flight, kept })
}

impl ObjectBatch<'_> {
    /// Waits, seals each object with its page's device checksum, commits (R5, R19).
    fn finish(self, pool: &dyn Pool, results: &mut [SaveResult]) {
        let (objects, sums) = self.in_flight.wait();
        let sums = match sums {
            Ok(sums) => sums,
            Err(error) => {
                tracing::warn!(%error, pages = objects.len(), "gathering a save batch failed");
                return;
            }
        };
        let mut objects = objects;
        let sealed = seal_all(
            &self.kept,
            objects.iter_mut().map(|object| &mut object[..]),
            &sums,
        );
        let (kept, committed): (Vec<(usize, &PageRef)>, Vec<HostSlot>) = self
            .kept
            .into_iter()
            .zip(objects)
            .zip(sealed)
            .filter_map(|((entry, object), len)| len.map(|_| (entry, object)))
            .unzip();
        let keys: Vec<&str> = kept.iter().map(|(_, item)| item.key.as_str()).collect();
        record(results, &kept, &pool.commit_objects(&keys, committed));
    }
}

/// One gather copy per entry: its page into the payload area of slot or object `i`.
fn save_copies(entries: &[(usize, &PageRef)]) -> Vec<PageCopy> {
    page_copies(
        entries
            .iter()
            .map(|(_, item)| (item.identity.group, item.page, item.payload_len)),
    )
}

/// Seals buffer `i`'s header with entry `i`'s device checksum (R5); returns each object's
/// length, or `None` where sealing failed.
fn seal_all<'b>(
    entries: &[(usize, &PageRef)],
    buffers: impl Iterator<Item = &'b mut [u8]>,
    sums: &[u64],
) -> Vec<Option<usize>> {
    entries
        .iter()
        .zip(buffers)
        .zip(sums)
        .map(|(((_, item), buffer), &checksum)| {
            object::seal_with_checksum(&item.identity, buffer, item.payload_len, checksum).ok()
        })
        .collect()
}

/// Records each stored key's put or commit result.
fn record(
    results: &mut [SaveResult],
    kept: &[(usize, &PageRef)],
    put_results: &[Result<(), PoolError>],
) {
    for (position, (index, _)) in kept.iter().enumerate() {
        results[*index] = match put_results.get(position) {
            Some(Ok(())) => SaveResult::Stored,
            Some(Err(PoolError::AlreadyExists)) => SaveResult::SkippedPresent,
            Some(Err(error)) if error.is_outage() => SaveResult::Outage,
            Some(Err(error)) if no_room(error) => SaveResult::NoSpace,
            _ => SaveResult::Failed,
        };
    }
}

/// Whether a put's error says the pool had no room for the object (module docs).
fn no_room(error: &PoolError) -> bool {
    matches!(error, PoolError::NoSpace { .. }) || backend_no_room(error)
}

/// Mooncake's no-room answer, `NO_AVAILABLE_HANDLE`: no mounted segment has room.
#[cfg(feature = "mooncake")]
fn backend_no_room(error: &PoolError) -> bool {
    *error
        == PoolError::Backend {
            code: crate::pool::mooncake::error::NO_AVAILABLE_HANDLE,
        }
}

/// Without the Mooncake backend no backend answers a no-room code.
#[cfg(not(feature = "mooncake"))]
fn backend_no_room(_: &PoolError) -> bool {
    false
}
