//! The [`Pool`] contract (`crate::pool` module docs) for [`MooncakePool`], and its `Drop`.
//!
//! How each method meets the contract on Mooncake:
//!
//! - `exists`: `batch_is_exist`; a present object gets the master's `kv_lease_ttl` lease.
//! - `put`: a probe, then `batch_put_from` of the absent keys. A key present at the probe,
//!   or repeated within the batch, is [`PoolError::AlreadyExists`]. (A key another client
//!   stores between the probe and the put is reported `Ok`: Mooncake keeps the first
//!   object, and keys are content hashes, R3.) `NO_AVAILABLE_HANDLE` (-200, no room until
//!   the master's next eviction pass) is [`PoolError::Backend`] with that code and counts
//!   as `put_rejected`.
//! - `put_absent`: `batch_put_from` of every key without the probe (the saver has just
//!   probed them); a key repeated within the batch is still `AlreadyExists`, a key present
//!   in the pool is answered `Ok` and its object stays as it was.
//! - `get_into`: `batch_get_into`; too-small buffers are [`PoolError::BufferTooSmall`] and
//!   stay unwritten.
//! - `touch`: `batch_is_exist` too. It is the cheapest call that resets an object's eviction
//!   age: the master evicts unleased objects in order of their lease expiry, and a probe
//!   extends that expiry to now + `kv_lease_ttl` (one metadata RPC, no data moved), which is
//!   also what a get would do at the price of a transfer.
//! - `register_staging` / `unregister_staging`: `register_buffer` / `unregister_buffer`;
//!   a registration first drops stale regions it overlaps (`mooncake::pool::I4`).
//! - `counters`: hits, misses, puts and bytes of this client; `capacity_bytes` is its
//!   segment. Eviction, `used_bytes` and `objects` are the master's and stay 0 here.

use std::collections::HashSet;

use super::error::INVALID_PARAMS;
use super::pool::MooncakePool;
use super::staging::{plan_rounds, FallbackStaging};
use crate::gpu::LentHostMemory;
use crate::pool::{Pool, PoolCounters, PoolError};

impl Pool for MooncakePool {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        let (_, probe_chunk) = self.settings().call_limits();
        let results = self.probe(keys, probe_chunk);
        self.counters.lookups(
            results
                .iter()
                .map(|result| result.as_ref().map(|present| *present)),
        );
        results
    }

    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        if keys.len() != values.len() {
            return PoolError::BatchShape {
                keys: keys.len(),
                items: values.len(),
            }
            .for_every_key(keys.len());
        }
        let (_, probe_chunk) = self.settings().call_limits();
        let presence = self.probe(keys, probe_chunk);
        let mut results: Vec<Result<(), PoolError>> = vec![Ok(()); keys.len()];
        let mut pending = Vec::with_capacity(keys.len());
        let mut seen = HashSet::with_capacity(keys.len());
        for (index, (key, present)) in keys.iter().zip(presence).enumerate() {
            results[index] = match present {
                Ok(false) if seen.insert(*key) => {
                    pending.push(index);
                    continue;
                }
                Ok(_) => {
                    self.counters.put_existing();
                    Err(PoolError::AlreadyExists)
                }
                Err(err) => Err(err),
            };
        }
        self.put_pending(keys, values, &pending, &mut results);
        results
    }

    fn put_absent(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        if keys.len() != values.len() {
            return PoolError::BatchShape {
                keys: keys.len(),
                items: values.len(),
            }
            .for_every_key(keys.len());
        }
        let mut results: Vec<Result<(), PoolError>> = vec![Ok(()); keys.len()];
        let mut pending = Vec::with_capacity(keys.len());
        let mut seen = HashSet::with_capacity(keys.len());
        for (index, key) in keys.iter().enumerate() {
            if seen.insert(*key) {
                pending.push(index);
            } else {
                self.counters.put_existing();
                results[index] = Err(PoolError::AlreadyExists);
            }
        }
        self.put_pending(keys, values, &pending, &mut results);
        results
    }

    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        if keys.len() != buffers.len() {
            return PoolError::BatchShape {
                keys: keys.len(),
                items: buffers.len(),
            }
            .for_every_key(keys.len());
        }
        let items: Vec<(usize, bool)> = buffers
            .iter()
            .map(|buffer| {
                (
                    buffer.len(),
                    self.needs_staging(buffer.as_ptr().addr(), buffer.len()),
                )
            })
            .collect();
        let mut results: Vec<Result<usize, PoolError>> =
            PoolError::Unavailable.for_every_key(keys.len());
        match self.staging_if_any(&items) {
            Err(err) => results = err.for_every_key(keys.len()),
            Ok(mut guard) => {
                let (max_keys, _) = self.settings().call_limits();
                let staging_len = guard
                    .as_deref()
                    .and_then(Option::as_ref)
                    .map_or(0, FallbackStaging::len);
                for round in plan_rounds(&items, max_keys, staging_len) {
                    let staging = guard.as_deref_mut().and_then(Option::as_mut);
                    self.get_round(keys, buffers, &round, staging, &mut results);
                }
            }
        }
        for (index, result) in results.iter_mut().enumerate() {
            if *result
                == Err(PoolError::Backend {
                    code: INVALID_PARAMS,
                })
            {
                *result = Err(self.explain_invalid_get(keys[index], buffers[index].len()));
            }
        }
        self.counters
            .lookups(results.iter().map(|result| result.as_ref().map(|_| true)));
        let read: usize = results
            .iter()
            .filter_map(|result| result.as_ref().ok())
            .sum();
        self.counters.bytes_read(read);
        results
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        let (_, probe_chunk) = self.settings().call_limits();
        self.probe(keys, probe_chunk)
    }

    fn counters(&self) -> PoolCounters {
        self.counters
            .snapshot(self.settings().global_segment_size_bytes)
    }

    fn name(&self) -> &'static str {
        "mooncake"
    }

    /// Shared memory of a dummy client (`shared.rs`); `None` for a client of its own.
    fn lend_staging(&self, bytes: usize) -> Option<Result<Box<dyn LentHostMemory>, PoolError>> {
        let lease = self.client().lend(bytes)?;
        Some(
            lease
                .map(|lease| Box::new(lease) as Box<dyn LentHostMemory>)
                .map_err(|err| err.pool_error()),
        )
    }

    fn register_staging(&self, staging: &[u8]) -> Result<(), PoolError> {
        self.register_staging_slice(staging)
            .map_err(|err| err.pool_error())
    }

    fn unregister_staging(&self, start_addr: usize) -> Result<(), PoolError> {
        self.unregister_at(start_addr)
            .map_err(|err| err.pool_error())
    }
}

impl Drop for MooncakePool {
    fn drop(&mut self) {
        if let Err(err) = self.close() {
            tracing::warn!(error = %err, kind = err.kind(), "closing the mooncake client failed");
        }
    }
}

impl std::fmt::Debug for MooncakePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MooncakePool")
            .field("master_address", &self.settings().master_address)
            .field("local_hostname", &self.settings().local_hostname)
            .finish_non_exhaustive()
    }
}
