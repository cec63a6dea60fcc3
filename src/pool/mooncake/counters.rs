//! What one Mooncake client counts for [`PoolCounters`]: lock-free atomics, each updated
//! on its own, so a snapshot is not taken at one instant (unlike the memory pool's).
//!
//! Eviction, `used_bytes` and `objects` are the master's business (its metrics endpoint has
//! them for the whole pool) and stay 0 here.

use std::sync::atomic::{AtomicU64, Ordering};

use super::error::NO_AVAILABLE_HANDLE;
use crate::pool::{PoolCounters, PoolError};

/// Counters since the pool was built.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    puts: AtomicU64,
    put_rejected: AtomicU64,
    put_existing: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
}

impl Counters {
    /// Counts lookups of `exists` and `get_into`: present (or a too-small buffer) is a hit,
    /// absent a miss; other errors are neither.
    pub(crate) fn lookups<'r>(&self, results: impl Iterator<Item = Result<bool, &'r PoolError>>) {
        for result in results {
            let counter = match result {
                Ok(true) | Err(PoolError::BufferTooSmall { .. }) => &self.hits,
                Ok(false) | Err(PoolError::NotFound) => &self.misses,
                Err(_) => continue,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one put result of `len` bytes; `NO_AVAILABLE_HANDLE` is a rejected put.
    pub(crate) fn put(&self, result: &Result<(), PoolError>, len: usize) {
        match result {
            Ok(()) => {
                self.puts.fetch_add(1, Ordering::Relaxed);
                self.bytes_written.fetch_add(len as u64, Ordering::Relaxed);
            }
            Err(PoolError::Backend {
                code: NO_AVAILABLE_HANDLE,
            }) => {
                self.put_rejected.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }

    /// Counts a put of a present key.
    pub(crate) fn put_existing(&self) {
        self.put_existing.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts bytes copied out by `get_into`.
    pub(crate) fn bytes_read(&self, bytes: usize) {
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A snapshot with `capacity_bytes` set to this client's segment.
    pub(crate) fn snapshot(&self, capacity_bytes: u64) -> PoolCounters {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        PoolCounters {
            hits: load(&self.hits),
            misses: load(&self.misses),
            puts: load(&self.puts),
            put_rejected: load(&self.put_rejected),
            put_existing: load(&self.put_existing),
            bytes_written: load(&self.bytes_written),
            bytes_read: load(&self.bytes_read),
            capacity_bytes,
            ..PoolCounters::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_puts_land_in_their_counters() {
        let counters = Counters::default();
        let not_found = PoolError::NotFound;
        let too_small = PoolError::BufferTooSmall {
            needed: 2,
            capacity: 1,
        };
        let down = PoolError::Unavailable;
        counters.lookups(
            [
                Ok(true),
                Ok(false),
                Err(&not_found),
                Err(&too_small),
                Err(&down),
            ]
            .into_iter(),
        );
        counters.put(&Ok(()), 10);
        counters.put(
            &Err(PoolError::Backend {
                code: NO_AVAILABLE_HANDLE,
            }),
            10,
        );
        counters.put(&Err(PoolError::Unavailable), 10);
        counters.put_existing();
        counters.bytes_read(7);
        let snapshot = counters.snapshot(100);
        assert_eq!((snapshot.hits, snapshot.misses), (2, 2));
        assert_eq!(
            (snapshot.puts, snapshot.put_rejected, snapshot.put_existing),
            (1, 1, 1)
        );
        assert_eq!((snapshot.bytes_written, snapshot.bytes_read), (10, 7));
        assert_eq!(snapshot.capacity_bytes, 100);
    }
}
