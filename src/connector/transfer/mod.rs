//! The byte-moving procedures of loaders and the saver, as plain synchronous functions
//! over a [`Pool`], a [`CopyStream`] and a [`StagingPool`] (R5, R19, R24, R25).
//!
//! The actors own the resources and call these on their own threads (a loader's
//! Arbiter, the saver's blocking task); keeping the procedures here makes them testable
//! without an actor system.
//!
//! Load (R24): for each batch of at most `staging.slots()` objects: batch get into the
//! staging slots, verify every header against what was asked for (R5), scatter the
//! payloads to their device pages, wait for the copy. Any miss, pool error, corrupt
//! object or failed copy fails the whole load (R25): the caller reports it failed and
//! the engine computes the prefix itself; pages already written are not reported as
//! computed.
//!
//! A pool answer of the wrong shape never reaches the device: a batch answered with
//! another number of results fails the load (pool error) or the saves without an answer
//! (failed); a get that reports another byte count than the object's fails the load as
//! corrupt (R5), even when the count exceeds the buffer.
//!
//! Save (R19): probe the batch's keys and skip those already present; gather the rest
//! from device pages into staging slots after the header area, seal each header in
//! place, batch put; every key's result is reported.

use crate::core::ledger::LoadFailure;
use crate::core::object::{self, ObjectIdentity, HEADER_BYTES};
use crate::gpu::{CopyStream, PageCopy, StagingPool};
use crate::pool::{Pool, PoolError};

/// One page to load: its key, what its header must say, and where it goes.
#[derive(Clone, Debug)]
pub struct LoadItem {
    /// Pool key of the object.
    pub key: String,
    /// What the object's header must say.
    pub identity: ObjectIdentity,
    /// Destination page index in the identity's group.
    pub page: u32,
    /// Payload bytes (the device page size).
    pub payload_len: usize,
}

/// One page to save.
#[derive(Clone, Debug)]
pub struct SaveItem {
    /// Pool key of the object.
    pub key: String,
    /// What the header will say.
    pub identity: ObjectIdentity,
    /// Source page index in the identity's group.
    pub page: u32,
    /// Payload bytes (the device page size).
    pub payload_len: usize,
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
}

/// Loads `items` into device pages. Returns the staging pool in every case.
///
/// `deadline` (`loaders.load_timeout_ms` after the load started) is checked before each
/// batch's pool call and before its device copy: a load past it fails as
/// [`LoadFailure::Timeout`] (R25). A pool call already running is not interrupted; its
/// own timeouts bound it.
pub fn load_pages(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    mut staging: StagingPool,
    items: &[LoadItem],
    deadline: Option<std::time::Instant>,
) -> (StagingPool, Result<LoadMoved, LoadFailure>) {
    let expired = || deadline.is_some_and(|deadline| std::time::Instant::now() >= deadline);
    let batch_len = usize::try_from(staging.slots())
        .unwrap_or(usize::MAX)
        .max(1);
    let mut moved = LoadMoved::default();
    for batch in items.chunks(batch_len) {
        if let Some(too_big) = batch
            .iter()
            .find(|item| object::object_len(item.payload_len) > staging.slot_bytes())
        {
            tracing::warn!(key = %too_big.key, slot_bytes = staging.slot_bytes(), "object larger than a staging slot");
            return (staging, Err(LoadFailure::DeviceCopy));
        }
        if expired() {
            return (staging, Err(LoadFailure::Timeout));
        }
        let copies = match fetch_and_verify(pool, &mut staging, batch) {
            Ok(copies) => copies,
            Err(failure) => return (staging, Err(failure)),
        };
        if expired() {
            return (staging, Err(LoadFailure::Timeout));
        }
        let in_flight = match stream.scatter(staging, &copies) {
            Ok(in_flight) => in_flight,
            Err(refused) => return (refused.staging, Err(LoadFailure::DeviceCopy)),
        };
        let (returned, copy_result) = in_flight.wait();
        staging = returned;
        if copy_result.is_err() {
            return (staging, Err(LoadFailure::DeviceCopy));
        }
        moved.pages += batch.len() as u64;
        moved.bytes += batch
            .iter()
            .map(|item| item.payload_len as u64)
            .sum::<u64>();
    }
    (staging, Ok(moved))
}

/// Gets one batch into staging and verifies every object; returns the scatter copies.
fn fetch_and_verify(
    pool: &dyn Pool,
    staging: &mut StagingPool,
    batch: &[LoadItem],
) -> Result<Vec<PageCopy>, LoadFailure> {
    let keys: Vec<&str> = batch.iter().map(|item| item.key.as_str()).collect();
    let mut buffers: Vec<&mut [u8]> = staging.slots_mut().take(batch.len()).collect();
    let results = pool.get_into(&keys, &mut buffers);
    if results.len() != batch.len() {
        tracing::warn!(
            keys = batch.len(),
            answers = results.len(),
            "pool answered a batch get with the wrong number of results; load failed"
        );
        return Err(LoadFailure::PoolError);
    }
    let mut copies = Vec::with_capacity(batch.len());
    for (slot, ((item, result), buffer)) in batch.iter().zip(results).zip(buffers).enumerate() {
        let read = match result {
            Ok(read) => read,
            Err(PoolError::NotFound) => return Err(LoadFailure::Evicted),
            Err(_) => return Err(LoadFailure::PoolError),
        };
        // A pool that reports another byte count than the object's (or more than the
        // buffer holds) is answering wrongly: the object counts as corrupt (R5), and the
        // buffer is only read within its bounds.
        let expected = object::object_len(item.payload_len);
        let Some(object_bytes) = buffer.get(..read).filter(|_| read == expected) else {
            tracing::warn!(key = %item.key, expected, read, "pool answered a get with the wrong byte count");
            return Err(LoadFailure::Corrupt);
        };
        object::open(&item.identity, object_bytes, item.payload_len)
            .map_err(|_| LoadFailure::Corrupt)?;
        copies.push(PageCopy {
            group: item.identity.group,
            page: item.page,
            staging_slot: u32::try_from(slot).map_err(|_| LoadFailure::DeviceCopy)?,
            staging_offset: HEADER_BYTES,
            len: item.payload_len,
        });
    }
    Ok(copies)
}

/// Saves `items`, one result per item in order. Returns the staging pool in every case.
pub fn save_pages(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    mut staging: StagingPool,
    items: &[SaveItem],
) -> (StagingPool, Vec<SaveResult>) {
    let batch_len = usize::try_from(staging.slots())
        .unwrap_or(usize::MAX)
        .max(1);
    let mut results = Vec::with_capacity(items.len());
    for batch in items.chunks(batch_len) {
        let (returned, batch_results) = save_batch(pool, stream, staging, batch);
        staging = returned;
        results.extend(batch_results);
    }
    (staging, results)
}

fn save_batch(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    staging: StagingPool,
    batch: &[SaveItem],
) -> (StagingPool, Vec<SaveResult>) {
    let keys: Vec<&str> = batch.iter().map(|item| item.key.as_str()).collect();
    let mut results: Vec<SaveResult> = pool
        .exists(&keys)
        .into_iter()
        .map(|present| {
            if matches!(present, Ok(true)) {
                SaveResult::SkippedPresent
            } else {
                SaveResult::Stored
            }
        })
        .collect();
    results.resize(batch.len(), SaveResult::Failed);
    let slot_bytes = staging.slot_bytes();
    let mut absent: Vec<(usize, &SaveItem)> = Vec::new();
    for (index, item) in batch.iter().enumerate() {
        if results[index] == SaveResult::SkippedPresent {
            continue;
        }
        if object::object_len(item.payload_len) > slot_bytes {
            results[index] = SaveResult::Failed;
        } else {
            absent.push((index, item));
        }
    }
    if absent.is_empty() {
        return (staging, results);
    }
    let copies: Vec<PageCopy> = absent
        .iter()
        .enumerate()
        .map(|(slot, (_, item))| PageCopy {
            group: item.identity.group,
            page: item.page,
            staging_slot: u32::try_from(slot).unwrap_or(u32::MAX),
            staging_offset: HEADER_BYTES,
            len: item.payload_len,
        })
        .collect();
    let mut staging = match stream.gather(staging, &copies) {
        Ok(in_flight) => match in_flight.wait() {
            (staging, Ok(())) => staging,
            (staging, Err(_)) => return (staging, fail_all(results, &absent)),
        },
        Err(refused) => return (refused.staging, fail_all(results, &absent)),
    };
    put_sealed(pool, &mut staging, &absent, &mut results);
    (staging, results)
}

/// Seals the gathered slots and puts them; records each key's result.
fn put_sealed(
    pool: &dyn Pool,
    staging: &mut StagingPool,
    absent: &[(usize, &SaveItem)],
    results: &mut [SaveResult],
) {
    let mut keys = Vec::with_capacity(absent.len());
    let mut values: Vec<&[u8]> = Vec::with_capacity(absent.len());
    let mut sealed_indices = Vec::with_capacity(absent.len());
    for ((index, item), slot) in absent.iter().zip(staging.slots_mut()) {
        match object::seal(&item.identity, slot, item.payload_len) {
            Ok(len) => {
                let sealed: &[u8] = slot;
                keys.push(item.key.as_str());
                values.push(&sealed[..len]);
                sealed_indices.push(*index);
            }
            Err(_) => results[*index] = SaveResult::Failed,
        }
    }
    // The batch was probed just before the gather: no second probe.
    let put_results = pool.put_absent(&keys, &values);
    for (position, index) in sealed_indices.into_iter().enumerate() {
        results[index] = match put_results.get(position) {
            Some(Ok(())) => SaveResult::Stored,
            Some(Err(PoolError::AlreadyExists)) => SaveResult::SkippedPresent,
            _ => SaveResult::Failed,
        };
    }
}

fn fail_all(mut results: Vec<SaveResult>, absent: &[(usize, &SaveItem)]) -> Vec<SaveResult> {
    for (index, _) in absent {
        results[*index] = SaveResult::Failed;
    }
    results
}

#[cfg(test)]
mod tests;
