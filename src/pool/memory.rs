//! The embedded in-process memory pool: the default [`Pool`] (`docs/DESIGN.md` section 10).
//!
//! Objects live in this process's memory as [`SharedSlot`]s of the pool's [`HostArena`],
//! under a capacity in bytes, and are evicted by Mooncake's model
//! ([`crate::core::eviction`]): above the high watermark or when a put would not fit, least
//! recently accessed unleased objects first. Probes, gets, lends and touches grant leases of
//! `kv_lease_ttl` measured on an injected [`PoolClock`].
//!
//! The arena is ordinary heap memory ([`MemoryPool::new`]) or, for zero-copy transfers on
//! CUDA, pinned memory ([`MemoryPool::with_arena`] with `device.host_arena()`): a loader
//! then DMAs a lent object straight to the device, and a saver DMAs pages straight into an
//! object buffer it commits.
//!
//! # Workflow of one call
//!
//! - `put`: copy the value into a fresh arena slot (the one payload copy) before locking;
//!   under the lock, plan the pass, remove the victims, insert; after unlocking, drop the
//!   evicted payloads (returning their slots to the arena outside the lock).
//! - `get_into`: under the lock, find the object, extend its lease, move it to the young end
//!   of the LRU order and clone its handle; after unlocking, copy into the caller's buffer
//!   (the one payload copy). An object evicted meanwhile stays alive until the copy ends.
//! - `lend`: the same bookkeeping as a get; the caller gets the handle itself, no copy. An
//!   object evicted while lent keeps its bytes until the last holder drops it.
//! - `alloc_objects` then `commit_objects`: fresh slots for the caller to fill (refused up
//!   front, like a put, when larger than the capacity), then the same locked pass as a put,
//!   without a copy.
//! - `exists` / `touch`: the same bookkeeping as a get, without a copy.
//!
//! The lock is taken once per key, so a 4096-key probe or a many-page batch never holds it
//! for long, and critical sections do hash-map and B-tree updates only (well under a
//! microsecond) while copies of 64 KiB to 1 MiB pages run unlocked.
//!
//! # Why one lock and not shards
//!
//! Eviction needs a global least-recently-used order and a global byte count (`pool::memory::I1`).
//! Shards would need either a pass that locks every shard, or per-shard capacities that evict from
//! a full shard while others have room. With copies outside the lock, the few threads that use a
//! pool (two or more loaders, a saver, the planner) spend little time inside it, so one
//! `parking_lot` mutex is the simpler correct choice.
//!
//! # Invariants
//!
//! Whenever the lock is free:
//!
//! - `pool::memory::I1`. `used_bytes` is the sum of stored payload sizes and is at most
//!   `capacity_bytes`.
//! - `pool::memory::I2`. The key map and the LRU index hold the same objects; an object's tick is
//!   its key in the index, and ticks grow with every access, so the index is least recently
//!   accessed first.
//! - `pool::memory::I3`. A stored payload never changes (objects are immutable; a put of a present
//!   key is refused).
//! - `pool::memory::I4`. Counters: `objects == puts - evicted_objects` and
//!   `used_bytes == bytes_written - evicted_bytes`.
//! - `pool::memory::I5`. A get or a put copies the payload exactly once, outside the lock; a lend
//!   or a commit copies nothing.
//! - `pool::memory::I6`. A stored payload's last handle is never dropped under the lock (evicted
//!   payloads and refused commits are dropped after unlocking), so the arena's lock is never taken
//!   inside the pool's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

use super::{Pool, PoolClock, PoolCounters, PoolError};
use crate::config::MIB;
use crate::core::eviction::{EvictionEntry, EvictionError, EvictionPolicy, PoolUsage};
#[cfg(feature = "faults")]
use crate::core::object::HEADER_BYTES;
use crate::gpu::host_memory::{host_memory, HostArena, HostMemory, HostSlot, SharedSlot};

/// The share of the host's `MemAvailable` a pool may reserve, as `(numerator,
/// denominator)`: the rest stays for the process's staging pools and the engine's own
/// memory, which are not part of the pool.
pub const RESERVE_SHARE_OF_AVAILABLE: (u64, u64) = (7, 8);

/// The embedded memory pool. Cheap to share as `Arc<dyn Pool>`; every method takes `&self`.
pub struct MemoryPool {
    /// Capacity, watermark, eviction ratio and lease length; validated at construction.
    policy: EvictionPolicy,
    /// Lease time source; a `ManualClock` in tests and in replay's simulated time.
    clock: Arc<dyn PoolClock>,
    /// Where payloads live: heap memory, or pinned memory a device can DMA from and into.
    arena: HostArena,
    /// Everything mutable, behind one short-held lock (module docs: why not shards).
    state: Mutex<PoolState>,
}

/// The pool's objects, LRU index and counters.
struct PoolState {
    /// Key to payload and current tick (`pool::memory::I2`).
    objects: HashMap<Arc<str>, StoredObject, Xxh3DefaultBuilder>,
    /// Tick to object, least recently accessed first (`pool::memory::I2`). Holds what eviction
    /// reads, so a pass walks this index alone.
    lru: BTreeMap<u64, LruSlot>,
    /// The next access stamp; strictly increasing, so ticks never tie.
    next_tick: u64,
    /// Sum of stored payload sizes (`pool::memory::I1`).
    used_bytes: u64,
    /// Running counters; `used_bytes`, `capacity_bytes` and `objects` are filled in by
    /// [`MemoryPool::counters`].
    counters: PoolCounters,
}

/// One stored object as the key map sees it.
struct StoredObject {
    /// The payload; cloned (not copied) under the lock by readers and lenders (`pool::memory::I5`).
    value: SharedSlot,
    /// Its key in the LRU index.
    tick: u64,
}

/// One stored object as the LRU index sees it.
struct LruSlot {
    /// Its key in the key map.
    key: Arc<str>,
    /// Payload bytes.
    size_bytes: u64,
    /// Leased while `now_ms < lease_expires_ms`; 0 until the first probe or get.
    lease_expires_ms: u64,
}

impl MemoryPool {
    /// A pool with `policy` (capacity, Mooncake's ratios, lease length) and lease clock,
    /// keeping its objects in heap memory ([`HostArena::heap`]).
    ///
    /// # Errors
    ///
    /// [`PoolError::InvalidPolicy`] when the policy fails [`EvictionPolicy::validate`]
    /// (zero capacity, a ratio outside `(0, 1]`).
    pub fn new(policy: EvictionPolicy, clock: Arc<dyn PoolClock>) -> Result<Self, PoolError> {
        Self::with_arena(policy, clock, HostArena::heap())
    }

    /// As [`new`](Self::new), keeping objects in `arena`: `device.host_arena()` makes lent
    /// objects and committed buffers pinned memory that the device's copies DMA directly.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_arena(
        policy: EvictionPolicy,
        clock: Arc<dyn PoolClock>,
        arena: HostArena,
    ) -> Result<Self, PoolError> {
        policy.validate()?;
        Ok(Self {
            policy,
            clock,
            arena,
            state: Mutex::new(PoolState {
                objects: HashMap::with_hasher(Xxh3DefaultBuilder::new()),
                lru: BTreeMap::new(),
                next_tick: 0,
                used_bytes: 0,
                counters: PoolCounters::default(),
            }),
        })
    }

    /// Takes the host memory for the pool's whole capacity now, before work starts, so no
    /// save waits for memory to be allocated (pinned memory takes milliseconds per chunk
    /// and stalls the copies meanwhile) and a capacity the host cannot give is an error up
    /// front. `object_lens` lists the object sizes the connector stores (one per layer
    /// group; repeats weigh more): the capacity is split among them in proportion to their
    /// bytes, and objects of other sizes still get memory on demand. An empty list
    /// reserves nothing.
    ///
    /// The memory is checked against the host's ([`host_memory`]) before any is taken:
    /// what the arena would carve must fit [`RESERVE_SHARE_OF_AVAILABLE`] of
    /// `MemAvailable`, since heap memory is touched page by page here
    /// ([`HostArena::reserve`]) and touching more than the host has ends the process.
    ///
    /// # Errors
    ///
    /// [`PoolError::ReserveExceedsHost`] when the host cannot give the memory now, naming a
    /// capacity that fits (nothing taken); [`PoolError::Reserve`] when the arena cannot
    /// carve it, what it carved before the failure staying with the pool.
    pub fn reserve(&self, object_lens: &[usize]) -> Result<(), PoolError> {
        self.reserve_within(object_lens, host_memory())
    }

    /// [`reserve`](Self::reserve) against `host` (`None`: the host's memory is unknown,
    /// nothing is checked).
    fn reserve_within(
        &self,
        object_lens: &[usize],
        host: Option<HostMemory>,
    ) -> Result<(), PoolError> {
        let shares = self.reserve_shares(object_lens);
        let arena_error = |len: usize, share: u64| {
            move |error: crate::gpu::GpuError| PoolError::Reserve {
                bytes: share,
                len,
                cause: error.kind(),
            }
        };
        if let Some(host) = host {
            let mut reserve_bytes = 0u64;
            let mut chunk_bytes = 0u64;
            for &(len, slots, share) in &shares {
                let bytes = self.arena.reserve_bytes(len, slots);
                reserve_bytes += bytes.map_err(arena_error(len, share))?;
                let chunk = self.arena.chunk_bytes(len);
                chunk_bytes += chunk.map_err(arena_error(len, share))? as u64;
            }
            self.check_host(reserve_bytes, chunk_bytes, host)?;
        }
        for (len, slots, share) in shares {
            self.arena
                .reserve(len, slots)
                .map_err(arena_error(len, share))?;
        }
        Ok(())
    }

    /// The most a reservation may take of `host`'s memory now:
    /// [`RESERVE_SHARE_OF_AVAILABLE`] of its `MemAvailable`.
    pub fn reservable_bytes(host: HostMemory) -> u64 {
        let (keep, of) = RESERVE_SHARE_OF_AVAILABLE;
        host.available_bytes / of * keep
    }

    /// Per object size, `(len, slots, share_bytes)`: the capacity split among the sizes in
    /// proportion to their bytes ([`reserve`](Self::reserve)).
    fn reserve_shares(&self, object_lens: &[usize]) -> Vec<(usize, usize, u64)> {
        let total: u128 = object_lens.iter().map(|&len| len as u128).sum();
        let mut per_len: BTreeMap<usize, u128> = BTreeMap::new();
        for &len in object_lens.iter().filter(|&&len| len > 0) {
            *per_len.entry(len).or_default() += len as u128;
        }
        let capacity = u128::from(self.policy.capacity_bytes);
        per_len
            .into_iter()
            .map(|(len, weight)| {
                let share = capacity * weight / total;
                let slots = usize::try_from(share.div_ceil(len as u128)).unwrap_or(usize::MAX);
                (len, slots, u64::try_from(share).unwrap_or(u64::MAX))
            })
            .collect()
    }

    /// Refuses a reservation of `reserve_bytes` that `host` cannot give now, naming a
    /// capacity that fits: lowered by the excess and by one chunk per object size
    /// (`chunk_bytes` together), since the arena carves whole chunks.
    fn check_host(
        &self,
        reserve_bytes: u64,
        chunk_bytes: u64,
        host: HostMemory,
    ) -> Result<(), PoolError> {
        let limit_bytes = Self::reservable_bytes(host);
        if reserve_bytes <= limit_bytes {
            return Ok(());
        }
        let excess = reserve_bytes - limit_bytes;
        let capacity_bytes = self.policy.capacity_bytes;
        let fits = capacity_bytes.saturating_sub(excess.saturating_add(chunk_bytes));
        Err(PoolError::ReserveExceedsHost {
            capacity_bytes,
            reserve_bytes,
            available_bytes: host.available_bytes,
            limit_bytes,
            fits_bytes: (fits / MIB).max(1) * MIB,
        })
    }

    /// The policy this pool evicts by.
    pub fn policy(&self) -> &EvictionPolicy {
        &self.policy
    }

    /// The arena the pool keeps its objects in.
    pub fn arena(&self) -> &HostArena {
        &self.arena
    }

    /// A fresh slot for an object of `len` bytes; refused, and counted as a rejected put,
    /// when `len` alone exceeds the capacity (before any memory is taken).
    fn object_slot(&self, len: usize) -> Result<HostSlot, PoolError> {
        let size_bytes = byte_len(len);
        if size_bytes > self.policy.capacity_bytes {
            self.state.lock().counters.put_rejected += 1;
            return Err(PoolError::from(EvictionError::LargerThanCapacity {
                needed_bytes: size_bytes,
                capacity_bytes: self.policy.capacity_bytes,
            }));
        }
        if len == 0 {
            return Ok(HostSlot::empty());
        }
        self.arena.alloc(len).map_err(|error| {
            tracing::warn!(len, %error, "no host memory for a pool object");
            PoolError::HostMemory {
                len,
                cause: error.kind(),
            }
        })
    }

    /// Stores one object; the payload is copied here, before the lock (`pool::memory::I5`).
    fn put_one(&self, key: &str, value: &[u8]) -> Result<(), PoolError> {
        let mut slot = self.object_slot(value.len())?;
        slot.copy_from_slice(value);
        self.store_one(key, slot.share())
    }

    /// Stores a filled payload under `key` (the locked part of a put or a commit).
    fn store_one(&self, key: &str, value: SharedSlot) -> Result<(), PoolError> {
        let key: Arc<str> = Arc::from(key);
        let now_ms = self.clock.now_ms();
        let mut released = Vec::new();
        let result = self
            .state
            .lock()
            .store(&self.policy, key, value, now_ms, &mut released);
        // The lock is released: free the evicted or refused payloads now (`pool::memory::I6`).
        drop(released);
        result
    }

    /// Lends one object: the bookkeeping and counters of a get, without the copy.
    fn lend_one(&self, key: &str, lease_until: u64) -> Result<SharedSlot, PoolError> {
        let mut state = self.state.lock();
        let Some(value) = state.access(key, lease_until) else {
            state.counters.misses += 1;
            return Err(PoolError::NotFound);
        };
        state.counters.hits += 1;
        state.counters.bytes_read += byte_len(value.len());
        Ok(value)
    }

    /// Reads one object into `buffer`; the copy runs after the lock is released
    /// (`pool::memory::I5`).
    fn get_one(&self, key: &str, buffer: &mut [u8], lease_until: u64) -> Result<usize, PoolError> {
        let value = {
            let mut state = self.state.lock();
            let Some(value) = state.access(key, lease_until) else {
                state.counters.misses += 1;
                return Err(PoolError::NotFound);
            };
            state.counters.hits += 1;
            if value.len() > buffer.len() {
                return Err(PoolError::BufferTooSmall {
                    needed: value.len(),
                    capacity: buffer.len(),
                });
            }
            state.counters.bytes_read += byte_len(value.len());
            value
        };
        buffer[..value.len()].copy_from_slice(&value);
        Ok(value.len())
    }

    /// Marks each key accessed (lease and age) and says whether it was present.
    fn access_each(&self, keys: &[&str], count_lookups: bool) -> Vec<Result<bool, PoolError>> {
        let lease_until = self.policy.lease_expiry_ms(self.clock.now_ms());
        keys.iter()
            .map(|key| {
                let mut state = self.state.lock();
                let present = state.access(key, lease_until).is_some();
                if count_lookups {
                    if present {
                        state.counters.hits += 1;
                    } else {
                        state.counters.misses += 1;
                    }
                }
                Ok(present)
            })
            .collect()
    }
}

impl std::fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPool")
            .field("policy", &self.policy)
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
}

impl PoolState {
    /// Marks `key` accessed now: youngest in LRU order, lease extended to at least
    /// `lease_until`. Returns its payload, or `None` if absent.
    fn access(&mut self, key: &str, lease_until: u64) -> Option<SharedSlot> {
        let object = self.objects.get_mut(key)?;
        let tick = self.next_tick;
        self.next_tick += 1;
        let old_tick = std::mem::replace(&mut object.tick, tick);
        let slot = self.lru.remove(&old_tick);
        debug_assert!(
            slot.is_some(),
            "pool::memory::I2: object without an LRU slot"
        );
        if let Some(mut slot) = slot {
            slot.lease_expires_ms = slot.lease_expires_ms.max(lease_until);
            self.lru.insert(tick, slot);
        }
        Some(object.value.clone())
    }

    fn usage(&self) -> PoolUsage {
        PoolUsage {
            used_bytes: self.used_bytes,
            objects: self.objects.len(),
        }
    }

    /// Evicts what the policy says and inserts the object; evicted payloads, and the value itself
    /// when refused, go to `released` so the caller frees them after unlocking
    /// (`pool::memory::I6`).
    fn store(
        &mut self,
        policy: &EvictionPolicy,
        key: Arc<str>,
        value: SharedSlot,
        now_ms: u64,
        released: &mut Vec<SharedSlot>,
    ) -> Result<(), PoolError> {
        if self.objects.contains_key(&*key) {
            self.counters.put_existing += 1;
            released.push(value);
            return Err(PoolError::AlreadyExists); // `pool::memory::I3`
        }
        let size_bytes = byte_len(value.len());
        let oldest_first = self.lru.iter().map(|(&tick, slot)| EvictionEntry {
            id: tick,
            size_bytes: slot.size_bytes,
            last_access: tick,
            lease_expires_ms: slot.lease_expires_ms,
        });
        let plan = match policy.plan_victims(self.usage(), size_bytes, oldest_first, now_ms) {
            Ok(plan) => plan,
            Err(source) => {
                self.counters.put_rejected += 1;
                released.push(value);
                return Err(PoolError::NoSpace { source });
            }
        };
        for tick in plan.victims {
            self.evict(tick, released);
        }
        let tick = self.next_tick;
        self.next_tick += 1;
        self.objects
            .insert(Arc::clone(&key), StoredObject { value, tick });
        self.lru.insert(
            tick,
            LruSlot {
                key,
                size_bytes,
                lease_expires_ms: 0, // a put grants no lease, as in Mooncake
            },
        );
        self.used_bytes += size_bytes;
        self.counters.puts += 1;
        self.counters.bytes_written += size_bytes;
        debug_assert!(self.used_bytes <= policy.capacity_bytes, "pool::memory::I1");
        Ok(())
    }

    fn evict(&mut self, tick: u64, evicted: &mut Vec<SharedSlot>) {
        let Some(slot) = self.lru.remove(&tick) else {
            debug_assert!(
                false,
                "pool::memory::I2: victim tick {tick} not in the LRU index"
            );
            return;
        };
        if let Some(object) = self.objects.remove(&slot.key) {
            evicted.push(object.value);
        }
        self.used_bytes -= slot.size_bytes;
        self.counters.evicted_objects += 1;
        self.counters.evicted_bytes += slot.size_bytes;
    }
}

impl Pool for MemoryPool {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.access_each(keys, true)
    }

    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        if keys.len() != values.len() {
            return PoolError::BatchShape {
                keys: keys.len(),
                items: values.len(),
            }
            .for_every_key(keys.len());
        }
        keys.iter()
            .zip(values)
            .map(|(key, value)| self.put_one(key, value))
            .collect()
    }

    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        if keys.len() != buffers.len() {
            return PoolError::BatchShape {
                keys: keys.len(),
                items: buffers.len(),
            }
            .for_every_key(keys.len());
        }
        let lease_until = self.policy.lease_expiry_ms(self.clock.now_ms());
        keys.iter()
            .zip(buffers.iter_mut())
            .map(|(key, buffer)| self.get_one(key, buffer, lease_until))
            .collect()
    }

    fn lend(&self, keys: &[&str]) -> Option<Vec<Result<SharedSlot, PoolError>>> {
        let lease_until = self.policy.lease_expiry_ms(self.clock.now_ms());
        Some(
            keys.iter()
                .map(|key| self.lend_one(key, lease_until))
                .collect(),
        )
    }

    fn alloc_objects(&self, lens: &[usize]) -> Option<Vec<Result<HostSlot, PoolError>>> {
        Some(lens.iter().map(|&len| self.object_slot(len)).collect())
    }

    fn commit_objects(&self, keys: &[&str], objects: Vec<HostSlot>) -> Vec<Result<(), PoolError>> {
        if keys.len() != objects.len() {
            return PoolError::BatchShape {
                keys: keys.len(),
                items: objects.len(),
            }
            .for_every_key(keys.len());
        }
        keys.iter()
            .zip(objects)
            .map(|(key, object)| self.store_one(key, object.share()))
            .collect()
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.access_each(keys, false)
    }

    fn counters(&self) -> PoolCounters {
        let state = self.state.lock();
        PoolCounters {
            used_bytes: state.used_bytes,
            capacity_bytes: self.policy.capacity_bytes,
            objects: byte_len(state.objects.len()),
            ..state.counters
        }
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    /// Every call answers from this process's memory under one lock: nothing to wait for.
    fn calls_may_block(&self) -> bool {
        false
    }
}

/// Test aid (feature `faults`): corrupting stored objects, so a test can show that a load
/// of a damaged object is a miss and never KV the engine sees (R5, R25).
#[cfg(feature = "faults")]
impl MemoryPool {
    /// Flips one payload byte (the first byte past the object header, or the last byte of
    /// an object no longer than a header) of up to `count` stored objects whose key
    /// contains `key_contains` (any key for `None`), taken in key order. Each object is
    /// replaced by a damaged copy of the same length, which breaks I3 on purpose; a reader
    /// that holds the old bytes keeps them. Returns the keys damaged, in key order.
    ///
    /// # Errors
    /// [`PoolError::HostMemory`] when the arena has no memory for a copy; objects damaged
    /// before it stay damaged.
    pub fn corrupt_payloads(
        &self,
        key_contains: Option<&str>,
        count: usize,
    ) -> Result<Vec<String>, PoolError> {
        let mut chosen: Vec<(Arc<str>, SharedSlot)> = {
            let state = self.state.lock();
            state
                .objects
                .iter()
                .filter(|(key, object)| {
                    !object.value.is_empty() && key_contains.is_none_or(|part| key.contains(part))
                })
                .map(|(key, object)| (Arc::clone(key), object.value.clone()))
                .collect()
        };
        chosen.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        chosen.truncate(count);
        let mut damaged = Vec::with_capacity(chosen.len());
        let mut released = Vec::with_capacity(chosen.len());
        for (key, original) in chosen {
            let mut copy =
                self.arena
                    .alloc(original.len())
                    .map_err(|error| PoolError::HostMemory {
                        len: original.len(),
                        cause: error.kind(),
                    })?;
            copy.copy_from_slice(&original);
            let at = if copy.len() > HEADER_BYTES {
                HEADER_BYTES
            } else {
                copy.len() - 1
            };
            copy[at] ^= 0xff;
            if let Some(object) = self.state.lock().objects.get_mut(&*key) {
                released.push(std::mem::replace(&mut object.value, copy.share()));
                damaged.push(key.to_string());
            }
        }
        drop(released); // after unlocking (I6)
        Ok(damaged)
    }
}

/// A length as `u64` (lossless on every supported target).
fn byte_len(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::ManualClock;
    use proptest::prelude::*;
    use std::collections::BTreeMap as Model;

    const TTL_MS: u64 = 1_000;

    fn pool(capacity_bytes: u64) -> Result<(MemoryPool, Arc<ManualClock>), PoolError> {
        let clock = Arc::new(ManualClock::new(0));
        let policy = EvictionPolicy {
            lease_ttl_ms: TTL_MS,
            ..EvictionPolicy::mooncake_defaults(capacity_bytes)
        };
        Ok((MemoryPool::new(policy, clock.clone())?, clock))
    }

    #[test]
    fn reserve_takes_the_capacity_up_front_split_by_object_bytes() -> Result<(), PoolError> {
        // 1 MiB of capacity for objects of 1,000 and 3,000 bytes (two groups of the first
        // size, one of the second): 2/5 and 3/5 of it.
        let (pool, _) = pool(1 << 20)?;
        pool.reserve(&[1000, 1000, 3000])?;
        let reserved = pool.arena().stats();
        let small = (1u64 << 20) * 2 / 5;
        let large = (1u64 << 20) * 3 / 5;
        let want = small.div_ceil(1024) + large.div_ceil(3008);
        assert!(
            reserved.free_slots as u64 >= want,
            "{reserved:?}, want {want}"
        );
        // Filling the pool with objects of both sizes carves no further memory.
        for i in 0..small / 1000 {
            pool.put_one(&format!("s{i}"), &[1; 1000])?;
        }
        for i in 0..large / 3000 {
            pool.put_one(&format!("l{i}"), &[2; 3000])?;
        }
        assert_eq!(pool.arena().stats().chunk_bytes, reserved.chunk_bytes);
        Ok(())
    }

    /// What the host cannot give now is refused before the arena carves (and touches)
    /// anything, naming a capacity whose reservation does fit.
    #[test]
    fn a_capacity_the_host_cannot_give_now_is_refused_before_any_is_taken() -> Result<(), PoolError>
    {
        let host = HostMemory {
            total_bytes: 256 * MIB,
            available_bytes: 64 * MIB,
        };
        let chunked = |capacity_bytes| {
            MemoryPool::with_arena(
                EvictionPolicy::mooncake_defaults(capacity_bytes),
                Arc::new(ManualClock::new(0)),
                HostArena::heap_with_chunk_bytes(1 << 20),
            )
        };
        let lens = [4160, 4160, 8256];
        let pool = chunked(128 * MIB)?;
        let error = pool.reserve_within(&lens, Some(host)).err();
        let Some(PoolError::ReserveExceedsHost {
            fits_bytes,
            limit_bytes,
            ..
        }) = error
        else {
            panic!("a 128 MiB pool on 64 MiB available was not refused: {error:?}");
        };
        assert_eq!(
            pool.arena().stats().chunks,
            0,
            "nothing carved, nothing touched"
        );
        assert_eq!(limit_bytes, 56 * MIB, "seven eighths of what is available");
        let message = error.map(|error| error.to_string()).unwrap_or_default();
        assert!(
            message.contains(&format!("pool.capacity_bytes={}MiB", fits_bytes / MIB)),
            "{message}"
        );
        let fitting = chunked(fits_bytes)?;
        fitting.reserve_within(&lens, Some(host))?;
        let carved = fitting.arena().stats().chunk_bytes as u64;
        assert!(carved >= fits_bytes && carved <= limit_bytes, "{carved}");
        Ok(())
    }

    #[test]
    fn a_capacity_the_allocator_refuses_is_a_reserve_error() -> Result<(), PoolError> {
        let (pool, _) = pool(1 << 51)?;
        let error = pool.reserve_within(&[1 << 50], None).err();
        assert!(
            matches!(error, Some(PoolError::Reserve { len, .. }) if len == 1 << 50),
            "{error:?}"
        );
        let message = error.map(|error| error.to_string()).unwrap_or_default();
        assert!(message.contains("pool.capacity_bytes"), "{message}");
        Ok(())
    }

    #[test]
    fn new_refuses_an_invalid_policy() {
        let clock = Arc::new(ManualClock::new(0));
        let result = MemoryPool::new(EvictionPolicy::mooncake_defaults(0), clock);
        assert!(matches!(result, Err(PoolError::InvalidPolicy { .. })));
    }

    #[test]
    fn oversized_put_is_refused_without_evicting() -> Result<(), PoolError> {
        let (pool, _) = pool(100)?;
        pool.put(&["a"], &[&[1; 60]])
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let results = pool.put(&["big"], &[&[2; 101]]);
        assert!(matches!(results[0], Err(PoolError::NoSpace { .. })));
        assert_eq!(pool.exists(&["a"]), vec![Ok(true)]);
        assert_eq!(pool.counters().put_rejected, 1);
        Ok(())
    }

    #[test]
    fn a_payload_read_during_its_eviction_stays_intact_i5() -> Result<(), PoolError> {
        let (pool, _) = pool(100)?;
        pool.put(&["a"], &[&[7; 100]])
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        // What a reader holds after unlocking, before copying.
        let held = pool.state.lock().access("a", 0);
        pool.put(&["b"], &[&[8; 100]])
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        assert_eq!(pool.exists(&["a"]), vec![Ok(false)]);
        assert_eq!(held.as_deref(), Some(&[7u8; 100][..]));
        Ok(())
    }

    #[cfg(feature = "faults")]
    #[test]
    fn corrupt_payloads_flips_one_payload_byte_of_matching_objects() -> Result<(), PoolError> {
        let (pool, _) = pool(1 << 20)?;
        let object: Vec<u8> = (0..100u8).collect();
        let keys = ["ns/m/lg0/b", "ns/m/lg1/a", "ns/m/lg0/a", "ns/m/lg0/c"];
        let values = [&object[..], &object[..], &object[..], &[9u8; 3][..]];
        pool.put(&keys, &values)
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let held = pool.state.lock().access("ns/m/lg0/a", 0);
        let damaged = pool.corrupt_payloads(Some("lg0/"), 2)?;
        assert_eq!(
            damaged,
            ["ns/m/lg0/a", "ns/m/lg0/b"],
            "key order, at most count"
        );
        let mut buffer = [0u8; 100];
        for key in ["ns/m/lg0/a", "ns/m/lg0/b", "ns/m/lg1/a"] {
            pool.get_into(&[key], &mut [&mut buffer[..]])[0].clone()?;
            let differ: Vec<usize> = (0..100).filter(|&i| buffer[i] != object[i]).collect();
            let expected = if key.contains("lg0") {
                vec![HEADER_BYTES]
            } else {
                vec![]
            };
            assert_eq!(differ, expected, "{key}");
        }
        assert_eq!(
            held.as_deref(),
            Some(&object[..]),
            "a holder keeps its bytes"
        );
        assert_eq!(pool.corrupt_payloads(Some("lg0/c"), 1)?, ["ns/m/lg0/c"]);
        let mut small = [0u8; 3];
        pool.get_into(&["ns/m/lg0/c"], &mut [&mut small[..]])[0].clone()?;
        assert_eq!(
            small,
            [9, 9, 9 ^ 0xff],
            "a short object loses its last byte"
        );
        assert_eq!(pool.counters().used_bytes, 303);
        Ok(())
    }

    /// Unwraps a backend's `Some` in tests (the memory pool always lends and allocates).
    fn some<T>(value: Option<T>) -> Result<T, PoolError> {
        value.ok_or(PoolError::Unavailable)
    }

    /// Fresh buffers for `values`, filled with them and committed under `keys`.
    fn commit(
        pool: &MemoryPool,
        keys: &[&str],
        values: &[&[u8]],
    ) -> Result<Vec<Result<(), PoolError>>, PoolError> {
        let lens: Vec<usize> = values.iter().map(|v| v.len()).collect();
        let mut objects = Vec::new();
        for (slot, value) in some(pool.alloc_objects(&lens))?.into_iter().zip(values) {
            let mut slot = slot?;
            slot.copy_from_slice(value);
            objects.push(slot);
        }
        Ok(pool.commit_objects(keys, objects))
    }

    #[test]
    fn r14_lend_returns_the_stored_bytes_and_leases_them() -> Result<(), PoolError> {
        let (pool, clock) = pool(100)?;
        pool.put(&["a"], &[&[7; 60]])
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let mut lent = some(pool.lend(&["a", "missing"]))?;
        assert!(matches!(lent.pop(), Some(Err(PoolError::NotFound))));
        let lent = lent.pop().ok_or(PoolError::NotFound)??;
        let mut read = vec![0u8; 60];
        assert_eq!(pool.get_into(&["a"], &mut [&mut read]), vec![Ok(60)]);
        assert_eq!(&lent[..], &read[..]);
        assert!(!lent.is_pinned());
        // The lease blocks an evicting put until it runs out.
        clock.advance_ms(TTL_MS - 1);
        assert!(matches!(
            pool.put(&["b"], &[&[8; 60]])[0],
            Err(PoolError::NoSpace { .. })
        ));
        clock.advance_ms(TTL_MS);
        assert_eq!(pool.put(&["b"], &[&[8; 60]]), vec![Ok(())]);
        assert_eq!(pool.exists(&["a"]), vec![Ok(false)]);
        Ok(())
    }

    #[test]
    fn a_lend_alone_grants_the_lease() -> Result<(), PoolError> {
        let (pool, _) = pool(100)?;
        pool.put(&["a"], &[&[7; 60]])
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let lent = some(pool.lend(&["a"]))?;
        drop(lent); // dropping the handle does not end the lease
        assert!(matches!(
            pool.put(&["b"], &[&[8; 60]])[0],
            Err(PoolError::NoSpace { .. })
        ));
        Ok(())
    }

    #[test]
    fn i5_a_lent_object_evicted_afterwards_keeps_its_bytes() -> Result<(), PoolError> {
        let arena = HostArena::heap_with_chunk_bytes(4096);
        let clock = Arc::new(ManualClock::new(0));
        let policy = EvictionPolicy {
            lease_ttl_ms: TTL_MS,
            ..EvictionPolicy::mooncake_defaults(100)
        };
        let pool = MemoryPool::with_arena(policy, clock.clone(), arena.clone())?;
        pool.put(&["a"], &[&[7; 100]])
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let lent = some(pool.lend(&["a"]))?.remove(0)?;
        clock.advance_ms(TTL_MS);
        assert_eq!(pool.put(&["b"], &[&[8; 100]]), vec![Ok(())]);
        assert_eq!(pool.exists(&["a"]), vec![Ok(false)]);
        assert_eq!(&lent[..], &[7; 100][..]);
        assert_eq!(
            arena.stats().live_slots,
            2,
            "the lender still holds a's slot"
        );
        drop(lent);
        assert_eq!(arena.stats().live_slots, 1);
        Ok(())
    }

    #[test]
    fn committed_objects_are_read_by_get_into() -> Result<(), PoolError> {
        let (pool, _) = pool(1_000)?;
        assert_eq!(
            commit(&pool, &["x", "y", "e"], &[b"hello", &[3; 200], b""])?,
            vec![Ok(()), Ok(()), Ok(())]
        );
        let mut x = [0u8; 8];
        let mut y = vec![0u8; 200];
        let mut e = [0u8; 1];
        let read = pool.get_into(&["x", "y", "e"], &mut [&mut x, &mut y, &mut e]);
        assert_eq!(read, vec![Ok(5), Ok(200), Ok(0)]);
        assert_eq!(&x[..5], b"hello");
        assert_eq!(y, vec![3; 200]);
        assert_eq!(
            pool.arena().stats().live_slots,
            2,
            "an empty object takes no slot"
        );
        Ok(())
    }

    #[test]
    fn i3_a_commit_of_a_present_key_leaves_the_old_bytes() -> Result<(), PoolError> {
        let (pool, _) = pool(1_000)?;
        assert_eq!(pool.put(&["k"], &[b"old"]), vec![Ok(())]);
        assert_eq!(
            commit(&pool, &["k"], &[b"new"])?,
            vec![Err(PoolError::AlreadyExists)]
        );
        let mut read = [0u8; 3];
        assert_eq!(pool.get_into(&["k"], &mut [&mut read]), vec![Ok(3)]);
        assert_eq!(&read, b"old");
        assert_eq!(pool.counters().put_existing, 1);
        assert_eq!(
            pool.arena().stats().live_slots,
            1,
            "pool::memory::I6: the refused slot went back"
        );
        Ok(())
    }

    #[test]
    fn commit_with_a_batch_shape_mismatch_fails_every_key() -> Result<(), PoolError> {
        let (pool, _) = pool(1_000)?;
        let objects = some(pool.alloc_objects(&[4]))?
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let shape = PoolError::BatchShape { keys: 2, items: 1 };
        assert_eq!(
            pool.commit_objects(&["a", "b"], objects),
            vec![Err(shape.clone()), Err(shape)]
        );
        assert_eq!(pool.exists(&["a", "b"]), vec![Ok(false), Ok(false)]);
        assert_eq!(pool.arena().stats().live_slots, 0);
        Ok(())
    }

    #[test]
    fn alloc_objects_refuses_what_a_put_refuses() -> Result<(), PoolError> {
        let (pool, _) = pool(100)?;
        let put = pool.put(&["big"], &[&[1; 101]]);
        let alloc = some(pool.alloc_objects(&[101, 100]))?;
        assert!(put[0].is_err());
        assert_eq!(alloc[0].as_ref().err(), put[0].as_ref().err());
        assert_eq!(alloc[1].as_ref().map(HostSlot::len), Ok(100));
        assert_eq!(pool.counters().put_rejected, 2);
        Ok(())
    }

    #[test]
    fn lend_and_commit_count_as_get_and_put() -> Result<(), PoolError> {
        let (copying, _) = pool(150)?;
        let (zero_copy, _) = pool(150)?;
        let values: [&[u8]; 3] = [&[1; 50], &[2; 60], &[3; 70]];
        let keys = ["a", "b", "c"];
        let put = copying.put(&keys, &values);
        assert_eq!(commit(&zero_copy, &keys, &values)?, put);
        assert_eq!(
            copying.put(&["a"], &[&[1; 50]]),
            commit(&zero_copy, &["a"], &[&[1; 50]])?
        );
        copying.put(&["huge"], &[&[0; 151]]);
        let _ = some(zero_copy.alloc_objects(&[151]))?;
        let mut buffers = [[0u8; 70]; 4];
        let [b0, b1, b2, b3] = &mut buffers;
        let read = copying.get_into(&["a", "b", "c", "zz"], &mut [b0, b1, b2, b3]);
        let lent = some(zero_copy.lend(&["a", "b", "c", "zz"]))?;
        let lent_lens: Vec<Result<usize, PoolError>> =
            lent.into_iter().map(|slot| slot.map(|s| s.len())).collect();
        assert_eq!(read, lent_lens);
        assert_eq!(copying.counters(), zero_copy.counters());
        assert!(zero_copy.counters().evicted_objects > 0);
        Ok(())
    }

    /// A naive model of the pool: a map of key -> (size, last access, lease) fed to the
    /// reference `plan_eviction`, checked against the pool op by op.
    #[derive(Default)]
    struct ModelPool {
        entries: Model<u8, (u64, u64, u64)>,
        tick: u64,
    }

    impl ModelPool {
        fn access(&mut self, key: u8, lease_until: u64) -> bool {
            self.tick += 1;
            let tick = self.tick;
            self.entries.get_mut(&key).is_some_and(|entry| {
                entry.1 = tick;
                entry.2 = entry.2.max(lease_until);
                true
            })
        }

        fn put(
            &mut self,
            policy: &EvictionPolicy,
            key: u8,
            size: u64,
            now: u64,
        ) -> Result<(), PoolError> {
            if self.entries.contains_key(&key) {
                return Err(PoolError::AlreadyExists);
            }
            let entries: Vec<EvictionEntry<u8>> = self
                .entries
                .iter()
                .map(
                    |(&id, &(size_bytes, last_access, lease_expires_ms))| EvictionEntry {
                        id,
                        size_bytes,
                        last_access,
                        lease_expires_ms,
                    },
                )
                .collect();
            let plan = policy.plan_eviction(&entries, size, now)?;
            for victim in plan.victims {
                self.entries.remove(&victim);
            }
            self.tick += 1;
            self.entries.insert(key, (size, self.tick, 0));
            Ok(())
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(u8, u64),
        Commit(u8, u64),
        Get(u8),
        Lend(u8),
        Exists(u8),
        Touch(u8),
        Advance(u64),
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..12, 1u64..60).prop_map(|(k, s)| Op::Put(k, s)),
            2 => (0u8..12, 1u64..60).prop_map(|(k, s)| Op::Commit(k, s)),
            2 => (0u8..12).prop_map(Op::Get),
            1 => (0u8..12).prop_map(Op::Lend),
            2 => (0u8..12).prop_map(Op::Exists),
            1 => (0u8..12).prop_map(Op::Touch),
            1 => (0u64..1_500).prop_map(Op::Advance),
        ]
    }

    fn payload(key: u8, size: u64) -> Vec<u8> {
        (0..size)
            .map(|i| key.wrapping_mul(31).wrapping_add(i.to_le_bytes()[0]))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(0x006d_656d), ..ProptestConfig::default() })]

        /// The pool holds exactly what the naive model holds after every op (`pool::memory::I1`,
        /// `pool::memory::I2`, `pool::memory::I4`).
        #[test]
        fn pool_matches_the_reference_model(ops in prop::collection::vec(arb_op(), 1..80)) {
            let (pool, clock) = pool(200).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let policy = *pool.policy();
            let mut model = ModelPool::default();
            // Ticks only grow; the model's start offset does not change the order.
            for op in ops {
                let now = clock.now_ms();
                match op {
                    Op::Put(key, size) => {
                        let name = key.to_string();
                        let got = pool.put(&[&name], &[&payload(key, size)]);
                        let want = model.put(&policy, key, size, now);
                        prop_assert_eq!(got, vec![want]);
                    }
                    Op::Commit(key, size) => {
                        let name = key.to_string();
                        let got = commit(&pool, &[&name], &[&payload(key, size)])
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        let want = model.put(&policy, key, size, now);
                        prop_assert_eq!(got, vec![want]);
                    }
                    Op::Lend(key) => {
                        let got = some(pool.lend(&[&key.to_string()]))
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        if model.access(key, now + TTL_MS) {
                            let want = payload(key, model.entries[&key].0);
                            prop_assert_eq!(got.len(), 1);
                            prop_assert_eq!(got[0].as_deref().ok(), Some(&want[..]));
                        } else {
                            prop_assert_eq!(got.into_iter().map(|r| r.map(|s| s.len())).collect::<Vec<_>>(), vec![Err(PoolError::NotFound)]);
                        }
                    }
                    Op::Get(key) => {
                        let name = key.to_string();
                        let mut buffer = vec![0u8; 64];
                        let got = pool.get_into(&[&name], &mut [&mut buffer]);
                        let present = model.access(key, now + TTL_MS);
                        if present {
                            let size = model.entries[&key].0;
                            prop_assert_eq!(&got, &vec![Ok(usize::try_from(size).unwrap_or(0))]);
                            prop_assert_eq!(&buffer[..usize::try_from(size).unwrap_or(0)], &payload(key, size)[..]);
                        } else {
                            prop_assert_eq!(&got, &vec![Err(PoolError::NotFound)]);
                        }
                    }
                    Op::Exists(key) => {
                        let got = pool.exists(&[&key.to_string()]);
                        prop_assert_eq!(got, vec![Ok(model.access(key, now + TTL_MS))]);
                    }
                    Op::Touch(key) => {
                        let got = pool.touch(&[&key.to_string()]);
                        prop_assert_eq!(got, vec![Ok(model.access(key, now + TTL_MS))]);
                    }
                    Op::Advance(ms) => {
                        clock.advance_ms(ms);
                    }
                }
                let counters = pool.counters();
                let model_bytes: u64 = model.entries.values().map(|e| e.0).sum();
                prop_assert_eq!(counters.used_bytes, model_bytes);
                prop_assert!(counters.used_bytes <= counters.capacity_bytes);
                prop_assert_eq!(counters.objects, model.entries.len() as u64);
                prop_assert_eq!(counters.objects, counters.puts - counters.evicted_objects);
                prop_assert_eq!(counters.used_bytes, counters.bytes_written - counters.evicted_bytes);
                // Nobody holds a payload between ops: every live slot is a stored object.
                prop_assert_eq!(pool.arena().stats().live_slots as u64, counters.objects);
                let state = pool.state.lock();
                prop_assert_eq!(state.lru.len(), state.objects.len());
                let present: Vec<String> = model.entries.keys().map(u8::to_string).collect();
                for key in &present {
                    prop_assert!(state.objects.contains_key(key.as_str()));
                }
            }
        }
    }
}
