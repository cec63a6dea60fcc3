//! [`MooncakePool`]: the [`Pool`] trait over one Mooncake Store client.
//!
//! # Workflow of each call
//!
//! - `exists` / `touch`: `batch_is_exist`, split into chunks of `probe_chunk_keys` that run
//!   concurrently on scoped threads (R10; the first chunk on the caller's thread).
//! - `put`: probe the keys first (Mooncake's client reports a put of a present key as
//!   success and writes nothing, so the probe is what tells [`PoolError::AlreadyExists`]);
//!   then `batch_put_from` the absent ones in calls of at most `max_keys_per_call` keys.
//! - `get_into`: `batch_get_into` in calls of at most `max_keys_per_call` keys. A buffer
//!   shorter than its object makes Mooncake answer `INVALID_PARAMS` without writing; the
//!   pool then asks `get_size` for that key to report [`PoolError::BufferTooSmall`].
//! - Buffers inside a region registered with [`MooncakePool::register_buffer`] go to
//!   Mooncake directly; others are staged through the registered fallback buffer
//!   (`staging.rs`).
//!
//! # Invariants
//!
//! - `mooncake::pool::I1`. One result per key, in key order, whatever fails (the trait's contract):
//!   a call that raises or a closed client gives every key of that call the same error.
//! - `mooncake::pool::I2`. No call carries more than `max_keys_per_call` keys (the TCP transport's
//!   per-peer queue; above 1024 a batch partly fails with -800).
//! - `mooncake::pool::I3`. Calls after [`MooncakePool::close`] answer [`PoolError::Unavailable`]
//!   per key.
//! - `mooncake::pool::I4`. A staging registration ([`Pool::register_staging`](crate::pool::Pool))
//!   first unregisters every recorded region it overlaps. Live allocations never overlap, so those
//!   are registrations of memory freed since (a connector that stopped without unregistering);
//!   Mooncake refuses overlapping regions with `INVALID_PARAMS`.

use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};

use super::client::StoreClient;
use super::counters::Counters;
use super::error::{exists_result, get_result, put_result, INVALID_PARAMS};
use super::staging::{plan_rounds, staging_len_for, FallbackStaging, Regions, Slot};
use super::{MooncakeError, MooncakeSettings};
use crate::gpu::StagingPool;
use crate::pool::PoolError;

/// Most threads one probe fans out to; larger probes get larger chunks.
const MAX_PROBE_THREADS: usize = 8;

/// A [`Pool`](crate::pool::Pool) backed by Mooncake Store through the in-process Python client.
///
/// Register long-lived transfer memory (loader and saver staging pools) once with
/// [`register_buffer`](Self::register_buffer): those buffers then move without a copy.
/// Any other buffer works too, through an extra copy (module docs).
///
/// [`close`](Self::close) it at shutdown from a thread that may block for about two
/// seconds (not an actor's arbiter); dropping an open pool closes it on the dropping thread.
/// The master places each object in some mounted segment (any client's); the objects held
/// in this client's segment leave the pool when it closes.
pub struct MooncakePool {
    settings: MooncakeSettings,
    client: StoreClient,
    /// Caller regions registered with the client.
    regions: Regions,
    /// The fallback buffer, made on first use (lock before entering Python,
    /// `mooncake::client::I1`).
    staging: Mutex<Option<FallbackStaging>>,
    /// What this client did; public as [`Pool::counters`](crate::pool::Pool::counters).
    pub(super) counters: Counters,
}

impl MooncakePool {
    /// A pool over a started client.
    pub(super) fn from_client(settings: MooncakeSettings, client: StoreClient) -> Self {
        Self {
            settings,
            client,
            regions: Regions::default(),
            staging: Mutex::new(None),
            counters: Counters::default(),
        }
    }

    /// The store client.
    pub(super) fn client(&self) -> &StoreClient {
        &self.client
    }

    /// The settings the client started with.
    pub fn settings(&self) -> &MooncakeSettings {
        &self.settings
    }

    /// How many caller regions are registered now (staging pools of running connectors,
    /// buffers given to [`register_buffer`](Self::register_buffer)); the fallback buffer
    /// is not counted.
    pub fn registered_regions(&self) -> usize {
        self.regions.len()
    }

    /// Registers `len` bytes at `ptr` for direct transfers. The memory must stay allocated
    /// until [`unregister_buffer`](Self::unregister_buffer) or [`close`](Self::close);
    /// the pointer is never dereferenced by Rust code.
    ///
    /// # Errors
    ///
    /// [`MooncakeError::Register`] for a nonzero code, [`MooncakeError::Closed`] after close.
    pub fn register_buffer(&self, ptr: *const u8, len: usize) -> Result<(), MooncakeError> {
        self.client.register("register_buffer", ptr.addr(), len)?;
        self.regions.add(ptr.addr(), len);
        Ok(())
    }

    /// [`register_buffer`](Self::register_buffer) for a slice; the same lifetime rule holds.
    ///
    /// # Errors
    ///
    /// As [`register_buffer`](Self::register_buffer).
    pub fn register_slice(&self, buffer: &[u8]) -> Result<(), MooncakeError> {
        self.register_buffer(buffer.as_ptr(), buffer.len())
    }

    /// Unregisters the region starting at `ptr`; later transfers of it are staged.
    ///
    /// # Errors
    ///
    /// [`MooncakeError::Register`] for a nonzero code, [`MooncakeError::Closed`] after close.
    pub fn unregister_buffer(&self, ptr: *const u8) -> Result<(), MooncakeError> {
        self.unregister_at(ptr.addr())
    }

    /// Unregisters the region starting at `addr`.
    pub(super) fn unregister_at(&self, addr: usize) -> Result<(), MooncakeError> {
        self.regions.remove(addr);
        self.client.register("unregister_buffer", addr, 0)
    }

    /// Registers a staging pool after unregistering the stale regions it overlaps
    /// (`mooncake::pool::I4`).
    pub(super) fn register_staging_slice(&self, staging: &[u8]) -> Result<(), MooncakeError> {
        for stale in self
            .regions
            .overlapping(staging.as_ptr().addr(), staging.len())
        {
            tracing::debug!(
                addr = stale,
                "unregistering a stale region that new staging memory overlaps"
            );
            self.unregister_at(stale)?;
        }
        self.register_slice(staging)
    }

    /// Existence of `keys` in chunks of `chunk_keys` run concurrently; a present object
    /// gets a lease and its eviction age reset. Counts no hits or misses.
    pub fn probe(&self, keys: &[&str], chunk_keys: usize) -> Vec<Result<bool, PoolError>> {
        let chunk = chunk_keys
            .max(1)
            .max(keys.len().div_ceil(MAX_PROBE_THREADS));
        if keys.len() <= chunk {
            return self.probe_once(keys);
        }
        let mut chunks = keys.chunks(chunk);
        let first = chunks.next().unwrap_or_default();
        std::thread::scope(|scope| {
            let others: Vec<_> = chunks
                .map(|keys| (keys.len(), scope.spawn(move || self.probe_once(keys))))
                .collect();
            let mut results = self.probe_once(first);
            for (len, handle) in others {
                results.extend(
                    handle
                        .join()
                        .unwrap_or_else(|_| PoolError::Unavailable.for_every_key(len)),
                );
            }
            results
        })
    }

    /// Removes objects (`batch_remove` with `force`, ignoring leases); for benches and
    /// operators, not part of [`Pool`](crate::pool::Pool).
    pub fn remove(&self, keys: &[&str]) -> Vec<Result<(), PoolError>> {
        let (max_keys, _) = self.settings.call_limits();
        let mut results = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(max_keys) {
            let started = Instant::now();
            let answers = self.client.batch_remove(chunk);
            let elapsed = started.elapsed();
            match answers {
                Ok(codes) => {
                    results.extend(codes.into_iter().map(|code| put_result(code, elapsed)));
                }
                Err(err) => results.extend(err.pool_error().for_every_key(chunk.len())),
            }
        }
        results
    }

    /// Closes the client (`mooncake::pool::I3`). Idempotent. Blocks about two seconds holding the
    /// GIL: call it where blocking is fine. Objects in this client's segment leave the pool.
    ///
    /// # Errors
    ///
    /// [`MooncakeError::Close`] for a nonzero code, [`MooncakeError::Python`] if it raised.
    pub fn close(&self) -> Result<(), MooncakeError> {
        self.client.close()
    }

    fn probe_once(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let started = Instant::now();
        let answers = self.client.batch_is_exist(keys);
        let elapsed = started.elapsed();
        match answers {
            Ok(codes) => codes
                .into_iter()
                .map(|code| exists_result(code, elapsed))
                .collect(),
            Err(err) => err.pool_error().for_every_key(keys.len()),
        }
    }

    /// Whether a buffer must go through the fallback buffer (`mooncake::staging::I1`).
    pub(super) fn needs_staging(&self, addr: usize, len: usize) -> bool {
        len != 0 && !self.regions.contains(addr, len)
    }

    /// The fallback buffer, grown and registered to fit every staged item.
    fn staging_for(
        &self,
        items: &[(usize, bool)],
    ) -> Result<MutexGuard<'_, Option<FallbackStaging>>, PoolError> {
        let needed = staging_len_for(items, self.settings.fallback_staging_bytes);
        let mut guard = self.staging.lock();
        if guard
            .as_ref()
            .is_some_and(|staging| staging.len() >= needed)
        {
            return Ok(guard);
        }
        if let Some(mut old) = guard.take() {
            if let Err(err) = self.client.register("unregister_buffer", old.addr(), 0) {
                tracing::warn!(error = %err, "could not unregister the old fallback buffer");
            }
        }
        let mut staging = match self.client.lend(needed) {
            None => FallbackStaging::new(needed),
            Some(lease) => {
                let lease = lease.map_err(|err| err.pool_error())?;
                let memory = StagingPool::lent_host(needed, Box::new(lease))
                    .map_err(|_| PoolError::Backend { code: INVALID_PARAMS })?;
                FallbackStaging::lent(needed, memory)
            }
        };
        self.client
            .register("register_buffer", staging.addr(), needed)
            .map_err(|err| match err {
                MooncakeError::Register { code, .. } => PoolError::Backend {
                    code: i32::try_from(code).unwrap_or(i32::MIN),
                },
                _ => PoolError::Unavailable,
            })?;
        *guard = Some(staging);
        Ok(guard)
    }

    /// `batch_put_from` of the absent keys at `pending`, staging where needed.
    pub(super) fn put_pending(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        pending: &[usize],
        results: &mut [Result<(), PoolError>],
    ) {
        let items: Vec<(usize, bool)> = pending
            .iter()
            .map(|&index| {
                let value = values[index];
                (
                    value.len(),
                    self.needs_staging(value.as_ptr().addr(), value.len()),
                )
            })
            .collect();
        let mut guard = match self.staging_if_any(&items) {
            Ok(guard) => guard,
            Err(err) => return pending.iter().for_each(|&i| results[i] = Err(err.clone())),
        };
        let (max_keys, _) = self.settings.call_limits();
        let staging_len = guard
            .as_deref()
            .and_then(Option::as_ref)
            .map_or(0, FallbackStaging::len);
        for round in plan_rounds(&items, max_keys, staging_len) {
            let mut call = Call::with_capacity(round.len());
            for slot in &round {
                let index = pending[slot.item];
                let value = values[index];
                let addr = match (
                    slot.staging_offset,
                    guard.as_deref_mut().and_then(Option::as_mut),
                ) {
                    (Some(offset), Some(staging)) => {
                        staging
                            .range_mut(offset, value.len())
                            .copy_from_slice(value);
                        staging.addr() + offset
                    }
                    _ => value.as_ptr().addr(),
                };
                call.push(keys[index], addr, value.len());
            }
            let started = Instant::now();
            let answers = self
                .client
                .batch_put_from(&call.keys, &call.addrs, &call.sizes);
            let elapsed = started.elapsed();
            for (position, slot) in round.iter().enumerate() {
                let index = pending[slot.item];
                results[index] = match &answers {
                    Ok(codes) => put_result(codes[position], elapsed),
                    Err(err) => Err(err.pool_error()),
                };
                self.counters.put(&results[index], values[index].len());
            }
        }
    }

    /// The locked fallback buffer when some item is staged.
    pub(super) fn staging_if_any(
        &self,
        items: &[(usize, bool)],
    ) -> Result<Option<MutexGuard<'_, Option<FallbackStaging>>>, PoolError> {
        if items.iter().any(|(_, staged)| *staged) {
            self.staging_for(items).map(Some)
        } else {
            Ok(None)
        }
    }

    /// One round of `batch_get_into`; staged reads are copied out into their buffers.
    pub(super) fn get_round(
        &self,
        keys: &[&str],
        buffers: &mut [&mut [u8]],
        round: &[Slot],
        staging: Option<&mut FallbackStaging>,
        results: &mut [Result<usize, PoolError>],
    ) {
        let mut staging = staging;
        let mut call = Call::with_capacity(round.len());
        for slot in round {
            let buffer = &mut buffers[slot.item];
            let addr = match (slot.staging_offset, staging.as_deref_mut()) {
                (Some(offset), Some(staging)) => staging.addr() + offset,
                _ => buffer.as_mut_ptr().addr(),
            };
            call.push(keys[slot.item], addr, buffer.len());
        }
        let started = Instant::now();
        let answers = self
            .client
            .batch_get_into(&call.keys, &call.addrs, &call.sizes);
        let elapsed = started.elapsed();
        for (position, slot) in round.iter().enumerate() {
            let buffer = &mut buffers[slot.item];
            let result = match &answers {
                Ok(codes) => get_result(codes[position], buffer.len(), elapsed),
                Err(err) => Err(err.pool_error()),
            };
            if let (Ok(read), Some(offset), Some(staging)) =
                (&result, slot.staging_offset, staging.as_deref_mut())
            {
                buffer[..*read].copy_from_slice(staging.range_mut(offset, *read));
            }
            results[slot.item] = result;
        }
    }

    /// Turns `INVALID_PARAMS` of a get into [`PoolError::BufferTooSmall`] when the object
    /// is larger than the buffer (Mooncake does not say which parameter was wrong).
    pub(super) fn explain_invalid_get(&self, key: &str, capacity: usize) -> PoolError {
        match self.client.get_size(key) {
            Ok(size) => match usize::try_from(size) {
                Ok(needed) if needed > capacity => PoolError::BufferTooSmall { needed, capacity },
                Ok(_) => PoolError::Backend {
                    code: INVALID_PARAMS,
                },
                Err(_) => super::error::pool_error(size, std::time::Duration::ZERO),
            },
            Err(err) => err.pool_error(),
        }
    }
}

/// The argument lists of one batch call.
struct Call<'k> {
    keys: Vec<&'k str>,
    addrs: Vec<usize>,
    sizes: Vec<usize>,
}

impl<'k> Call<'k> {
    fn with_capacity(len: usize) -> Self {
        Self {
            keys: Vec::with_capacity(len),
            addrs: Vec::with_capacity(len),
            sizes: Vec::with_capacity(len),
        }
    }

    fn push(&mut self, key: &'k str, addr: usize, size: usize) {
        self.keys.push(key);
        self.addrs.push(addr);
        self.sizes.push(size);
    }
}
