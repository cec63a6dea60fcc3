//! The pool trait and the embedded in-process memory pool (`docs/DESIGN.md` section 10).
//!
//! A pool is the shared object store the runtime saves KV pages to and loads them from:
//! Mooncake Store, or [`MemoryPool`], the default, in this process. Both implement [`Pool`],
//! which the lookup planner, the loaders and the saver share as `Arc<dyn Pool>`.
//!
//! # Contract
//!
//! Every call is batched and answers **per key**: one result per input key, in input order.
//! A failure of the whole batch (a remote backend that is down, a batch whose keys and values
//! differ in length) is the same error repeated for every key, never a panic or a shorter
//! vector.
//!
//! - Objects are immutable: a put of a present key is [`PoolError::AlreadyExists`] and leaves
//!   the object as it was (keys are content hashes, R3, so the bytes would be the same).
//! - A probe (`exists`), a `get_into` or a `lend` of a present object grants it a lease of
//!   `kv_lease_ttl`, during which it is not evicted (R14). `touch` does too, and resets the
//!   object's eviction age: it is the refresh that re-save uses (R20).
//! - Eviction follows Mooncake's model (`crate::core::eviction`): above the high watermark or
//!   when a put would not fit, the least recently accessed unleased objects go first.
//! - A put too large for what eviction can free is [`PoolError::NoSpace`]; nothing is stored.
//!
//! # Workflow
//!
//! 1. Build a pool once (`MemoryPool::new` or the Mooncake backend) with a [`PoolClock`].
//! 2. The planner probes with `exists`, the saver writes with `put` (after `exists`, R19) or
//!    refreshes with `touch`, loaders read with `get_into` into staging memory.
//! 3. Zero-copy, where the backend offers it (the memory pool): loaders call
//!    [`Pool::lend`] and move the stored objects themselves to the device; the saver calls
//!    [`Pool::alloc_objects`], fills the buffers (pages by DMA, headers by the CPU) and stores
//!    them with [`Pool::commit_objects`]. A backend that answers `None` (Mooncake, the
//!    fault-injecting wrapper) is used through `get_into` and `put_absent` instead.
//! 4. The stats reporter reads `counters()` snapshots.
//!
//! # Layer
//!
//! `pool` sits above `gpu` and below `transfer` and the actors: its objects live in
//! device-visible host memory, the slots of a [`HostArena`](crate::gpu::host_memory::HostArena)
//! (`gpu::host_memory`), so that copy streams can move them to and from device pages
//! without a CPU copy. The pool only owns and hands out slots; every `unsafe` use of their
//! memory stays in `gpu`. Nothing in `gpu` or `core` imports `pool`.
//!
//! Loaders and the saver own staging pools for the lifetime of a connector; the connector
//! registers each with [`Pool::register_staging`] when it is made and unregisters it at
//! shutdown, so a backend with registered-memory transfers (Mooncake) moves them directly.

pub mod clock;
#[cfg(feature = "faults")]
pub mod faults;
pub mod guard;
pub mod memory;
#[cfg(feature = "mooncake")]
pub mod mooncake;

#[cfg(any(feature = "replay", feature = "internals"))]
pub use clock::ManualClock;
pub use clock::{PoolClock, SystemClock};
pub use guard::{GuardSettings, GuardedPool, HealthView};
pub use memory::MemoryPool;

use crate::core::eviction::{EvictionError, EvictionPolicyError};
use crate::gpu::host_memory::{HostSlot, SharedSlot};
use crate::gpu::LentHostMemory;

/// A shared object store with batched, per-key calls. Object safe; share as `Arc<dyn Pool>`.
///
/// Every method returns exactly one result per key, in the order of `keys` (module docs).
pub trait Pool: Send + Sync {
    /// Which objects are present. A present object gets a lease of `kv_lease_ttl` (R14).
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>>;

    /// Stores `values[i]` under `keys[i]`. A present key is [`PoolError::AlreadyExists`] and
    /// its object is left alone; a value that eviction cannot make room for is
    /// [`PoolError::NoSpace`]. Keys and values of different lengths give
    /// [`PoolError::BatchShape`] for every key.
    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>>;

    /// [`put`](Self::put) of keys the caller has just probed absent (the saver's
    /// skip-present probe, R22). A backend whose own put must probe to tell
    /// [`PoolError::AlreadyExists`] may skip that second probe here: a key stored by another
    /// client in between is then answered `Ok` and its object is left alone, which is safe
    /// because a key names its content (R1-R4). The default is `put`.
    fn put_absent(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.put(keys, values)
    }

    /// Copies each object into the front of its buffer and returns the bytes read.
    /// Absent is [`PoolError::NotFound`]; a buffer shorter than the object is
    /// [`PoolError::BufferTooSmall`] and is left unwritten. A present object gets a lease.
    /// Keys and buffers of different lengths give [`PoolError::BatchShape`] for every key.
    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>>;

    /// Zero-copy read: the stored objects themselves, each leased and counted as by
    /// [`get_into`](Self::get_into) (R14), so a loader can move them to the device without a
    /// copy. An object evicted while lent keeps its bytes until the last holder drops it.
    /// Absent is [`PoolError::NotFound`]. `None`: this backend does not lend; use
    /// `get_into`. Default: `None`.
    fn lend(&self, keys: &[&str]) -> Option<Vec<Result<SharedSlot, PoolError>>> {
        let _ = keys;
        None
    }

    /// Zero-copy write: fresh object buffers of the given lengths, one result per length,
    /// for the caller to fill (a saver DMAs pages into them and writes headers) and then
    /// store with [`commit_objects`](Self::commit_objects). A length that can never fit gets
    /// the error a [`put`](Self::put) of that size gets ([`PoolError::NoSpace`]), counted
    /// the same way. `None`: this backend has no such buffers; use `put`. Default: `None`.
    fn alloc_objects(&self, lens: &[usize]) -> Option<Vec<Result<HostSlot, PoolError>>> {
        let _ = lens;
        None
    }

    /// Stores buffers from [`alloc_objects`](Self::alloc_objects) under `keys`, with
    /// [`put_absent`](Self::put_absent) semantics: a present key is
    /// [`PoolError::AlreadyExists`] or `Ok` per backend and its object is left alone; a
    /// buffer that eviction cannot make room for is [`PoolError::NoSpace`]. Keys and
    /// objects of different lengths give [`PoolError::BatchShape`] for every key. Default:
    /// `put_absent` of the buffers' bytes.
    fn commit_objects(&self, keys: &[&str], objects: Vec<HostSlot>) -> Vec<Result<(), PoolError>> {
        let values: Vec<&[u8]> = objects.iter().map(|object| &object[..]).collect();
        self.put_absent(keys, &values)
    }

    /// Resets each present object's eviction age (and grants a lease); returns whether it
    /// was present. Re-save's refresh (R20).
    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>>;

    /// Whether a call may block on something outside this process (a remote master, a
    /// network): such calls get their deadline by running off the caller's thread
    /// ([`guard::GuardedPool`]). A pool that answers from memory says `false` and is called
    /// in place. Default: `true`.
    fn calls_may_block(&self) -> bool {
        true
    }

    /// A snapshot of the pool's counters.
    fn counters(&self) -> PoolCounters;

    /// A short name for logs: `"memory"`, `"mooncake"`.
    fn name(&self) -> &'static str;

    /// Memory for a staging pool of `bytes` when this backend moves data only from and into
    /// memory of its own (Mooncake's dummy client: shared memory the node's real client
    /// maps); `None` when any memory will do. The connector builds the pool's staging in it
    /// and registers it as usual; the backend keeps the memory mapped while the lease lives.
    ///
    /// # Errors
    ///
    /// The backend's refusal, for example [`PoolError::TransferMemory`] when its memory is
    /// spent.
    fn lend_staging(&self, bytes: usize) -> Option<Result<Box<dyn LentHostMemory>, PoolError>> {
        let _ = bytes;
        None
    }

    /// Registers long-lived transfer memory (a loader's or the saver's staging pool) so
    /// the backend moves objects into and out of it without an extra copy. The memory must
    /// stay allocated until [`unregister_staging`](Self::unregister_staging) is called with
    /// its start address. A backend that copies anyway (the memory pool) does nothing.
    ///
    /// # Errors
    ///
    /// The backend's refusal, for example [`PoolError::Backend`] with its code.
    fn register_staging(&self, staging: &[u8]) -> Result<(), PoolError> {
        let _ = staging;
        Ok(())
    }

    /// Forgets memory registered with [`register_staging`](Self::register_staging), named by
    /// the address of its first byte (`staging.as_ptr().addr()` at registration), so the
    /// memory may be freed and reused. Later transfers of it are copied. Default: nothing.
    ///
    /// # Errors
    ///
    /// The backend's refusal (an address it does not know, a closed client).
    fn unregister_staging(&self, start_addr: usize) -> Result<(), PoolError> {
        let _ = start_addr;
        Ok(())
    }

    /// The fault injector of a [`faults::FaultyPool`] (feature `faults`), through which
    /// the actors fire the fault points that are not pool calls. Default: none.
    #[cfg(feature = "faults")]
    fn faults(&self) -> Option<&faults::FaultInjector> {
        None
    }
}

/// A fault point that fires in an actor rather than in a pool call (feature `faults`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActorFault {
    /// A load or save batch finds no staging.
    StagingExhausted,
    /// A page finds the save queue full.
    SaveQueueFull,
    /// The lookup planner panics while it starts a lookup.
    PlannerPanic,
    /// The reservation manager panics while it starts a load.
    ManagerPanic,
    /// The stats reporter panics as a collection starts.
    ReporterPanic,
}

/// Whether `fault` fires now, through the injector of a [`faults::FaultyPool`]; always
/// `false` without the `faults` feature or with a pool that injects nothing.
#[cfg_attr(
    not(feature = "faults"),
    expect(unused_variables, reason = "the fault points exist only with `faults`")
)]
pub(crate) fn actor_fault_fires(pool: &dyn Pool, fault: ActorFault) -> bool {
    #[cfg(feature = "faults")]
    {
        let point = match fault {
            ActorFault::StagingExhausted => faults::FaultPoint::StagingExhausted,
            ActorFault::SaveQueueFull => faults::FaultPoint::SaveQueueFull,
            ActorFault::PlannerPanic => faults::FaultPoint::PlannerPanic,
            ActorFault::ManagerPanic => faults::FaultPoint::ManagerPanic,
            ActorFault::ReporterPanic => faults::FaultPoint::ReporterPanic,
        };
        pool.faults().is_some_and(|faults| faults.fire(point))
    }
    #[cfg(not(feature = "faults"))]
    false
}

/// The actor fault points, for the actors that hold no pool of their own (the reservation
/// manager, the stats reporter): they fire through the injector of the connector's pool
/// (feature `faults`). Without the feature, or built with [`Default`], nothing fires.
#[derive(Clone, Default)]
pub struct ActorFaults {
    #[cfg(feature = "faults")]
    pool: Option<std::sync::Arc<dyn Pool>>,
}

impl ActorFaults {
    /// The fault points of `pool`'s injector.
    #[cfg_attr(
        not(feature = "faults"),
        expect(unused_variables, reason = "the fault points exist only with `faults`")
    )]
    pub fn of(pool: &std::sync::Arc<dyn Pool>) -> Self {
        Self {
            #[cfg(feature = "faults")]
            pool: Some(std::sync::Arc::clone(pool)),
        }
    }

    /// Whether `fault` fires now.
    #[cfg_attr(
        not(feature = "faults"),
        expect(
            unused_variables,
            clippy::unused_self,
            reason = "the fault points exist only with `faults`"
        )
    )]
    pub(crate) fn fires(&self, fault: ActorFault) -> bool {
        #[cfg(feature = "faults")]
        {
            self.pool
                .as_deref()
                .is_some_and(|pool| actor_fault_fires(pool, fault))
        }
        #[cfg(not(feature = "faults"))]
        false
    }
}

/// Counters of one pool since it was created, plus its current fill.
///
/// For the memory pool the snapshot is consistent (taken under one lock):
/// `objects == puts - evicted_objects` and `used_bytes == bytes_written - evicted_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolCounters {
    /// Keys found by `exists`, `get_into` or `lend`.
    pub hits: u64,
    /// Keys not found by `exists`, `get_into` or `lend`.
    pub misses: u64,
    /// Objects stored by `put` or `commit_objects`.
    pub puts: u64,
    /// Puts refused for lack of space ([`PoolError::NoSpace`]).
    pub put_rejected: u64,
    /// Puts of a key already present ([`PoolError::AlreadyExists`]).
    pub put_existing: u64,
    /// Objects removed by eviction.
    pub evicted_objects: u64,
    /// Payload bytes removed by eviction.
    pub evicted_bytes: u64,
    /// Payload bytes stored by `put` or `commit_objects`.
    pub bytes_written: u64,
    /// Payload bytes copied out by `get_into` or lent by `lend`.
    pub bytes_read: u64,
    /// Payload bytes held now.
    pub used_bytes: u64,
    /// Payload bytes the pool may hold.
    pub capacity_bytes: u64,
    /// Objects held now.
    pub objects: u64,
}

/// Why one key of a pool call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolError {
    /// No object under the key (never stored, or evicted).
    #[error("object not found in the pool")]
    NotFound,
    /// A put of a key that is present; objects are immutable.
    #[error("object already exists in the pool; objects are immutable")]
    AlreadyExists,
    /// A get into a buffer shorter than the object; nothing was written.
    #[error("buffer of {capacity} bytes is too small for an object of {needed} bytes")]
    BufferTooSmall {
        /// The object's size.
        needed: usize,
        /// The buffer's length.
        capacity: usize,
    },
    /// A put that eviction cannot make room for; nothing was stored or evicted.
    #[error("pool has no space: {source}")]
    NoSpace {
        /// What the eviction model found.
        #[source]
        source: EvictionError,
    },
    /// Keys and values (or buffers) of different lengths; reported for every key.
    #[error("batch has {keys} keys but {items} values or buffers; pass one per key")]
    BatchShape {
        /// Number of keys.
        keys: usize,
        /// Number of values or buffers.
        items: usize,
    },
    /// A backend that moves data only through memory of its own (Mooncake's dummy client)
    /// has too little of it left for a staging pool.
    #[error("the pool's transfer memory cannot give {asked} more bytes ({used} of {key} = {total} taken); raise {key}, e.g. {key} = {suggested}")]
    TransferMemory {
        /// Bytes asked for.
        asked: u64,
        /// Bytes taken before.
        used: u64,
        /// The configured size.
        total: u64,
        /// The setting that sizes it.
        key: &'static str,
        /// A size that holds everything taken and asked.
        suggested: u64,
    },
    /// A remote backend answered with an error code.
    #[error("pool backend returned error code {code}")]
    Backend {
        /// The backend's own code (Mooncake's `ErrorCode`).
        code: i32,
    },
    /// The remote backend cannot be reached (no master, lost connection).
    #[error("pool backend is unavailable")]
    Unavailable,
    /// The remote backend did not answer in time: its own timeout, or the call's deadline
    /// (`pool.probe_timeout_ms`) passed first.
    #[error("pool backend did not answer within {after_ms} ms")]
    Timeout {
        /// How long the call waited.
        after_ms: u64,
    },
    /// The pool is marked unreachable after calls in a row failed (R30): the call was not
    /// made. A background probe finds the pool again.
    #[error("pool is unreachable; the call was not made (next probe in {retry_in_ms} ms)")]
    Unreachable {
        /// Time until the next background probe.
        retry_in_ms: u64,
    },
    /// The embedded pool could not get host memory for an object (its arena's chunk
    /// allocation failed); nothing was stored.
    #[error(
        "could not allocate host memory for a pool object of {len} bytes ({cause}); \
         lower pool.capacity_bytes or free host memory"
    )]
    HostMemory {
        /// The object's size.
        len: usize,
        /// The arena's error kind (`GpuError::kind`), e.g. `"cuda_driver"`.
        cause: &'static str,
    },
    /// The embedded pool could not take the host memory for its capacity up front.
    #[error(
        "could not reserve {bytes} bytes of host memory for pool objects of {len} bytes \
         ({cause}); lower pool.capacity_bytes or free host memory"
    )]
    Reserve {
        /// Bytes asked for this object size.
        bytes: u64,
        /// The object size.
        len: usize,
        /// The arena's error kind (`GpuError::kind`), e.g. `"cuda_driver"`.
        cause: &'static str,
    },
    /// The embedded pool's capacity needs more host memory than the host can give now:
    /// refused before any of it is taken or touched.
    #[error(
        "pool.capacity_bytes = {} takes {} of host memory up front, more than this host can \
         give now ({} of its {} MemAvailable; the rest stays free for the process); lower \
         pool.capacity_bytes, e.g. pool.capacity_bytes={}MiB, or free host memory",
        crate::config::bytes_text(*.capacity_bytes), crate::config::bytes_text(*.reserve_bytes),
        crate::config::bytes_text(*.limit_bytes), crate::config::bytes_text(*.available_bytes),
        .fits_bytes / crate::config::MIB
    )]
    ReserveExceedsHost {
        /// The pool's capacity.
        capacity_bytes: u64,
        /// The bytes its reservation would carve (whole arena chunks).
        reserve_bytes: u64,
        /// The host's `MemAvailable`.
        available_bytes: u64,
        /// The most a reservation may take of it.
        limit_bytes: u64,
        /// A capacity whose reservation fits (whole MiB).
        fits_bytes: u64,
    },
    /// The pool could not be built: its eviction policy is invalid.
    #[error("invalid pool eviction policy: {source}")]
    InvalidPolicy {
        /// What the policy check found.
        #[from]
        source: EvictionPolicyError,
    },
}

impl PoolError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::BufferTooSmall { .. } => "buffer_too_small",
            Self::NoSpace { .. } => "no_space",
            Self::BatchShape { .. } => "batch_shape",
            Self::Backend { .. } => "backend",
            Self::TransferMemory { .. } => "transfer_memory",
            Self::Unavailable => "unavailable",
            Self::Timeout { .. } => "timeout",
            Self::Unreachable { .. } => "unreachable",
            Self::HostMemory { .. } => "host_memory",
            Self::Reserve { .. } => "reserve",
            Self::ReserveExceedsHost { .. } => "reserve_exceeds_host",
            Self::InvalidPolicy { .. } => "invalid_policy",
        }
    }

    /// Whether this error says the pool could not be reached or did not answer in time
    /// ([`Self::Unavailable`], [`Self::Timeout`], [`Self::Unreachable`]), rather than
    /// answering something about the key: what counts toward the pool's health and as an
    /// outage loss (R30).
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            Self::Unavailable | Self::Timeout { .. } | Self::Unreachable { .. }
        )
    }

    /// This error once per key: how a whole-batch failure is reported.
    pub fn for_every_key<T>(&self, keys: usize) -> Vec<Result<T, PoolError>> {
        (0..keys).map(|_| Err(self.clone())).collect()
    }
}

impl From<EvictionError> for PoolError {
    fn from(source: EvictionError) -> Self {
        Self::NoSpace { source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_pool_takes_staging_registrations_as_no_ops() -> Result<(), PoolError> {
        use std::sync::Arc;

        use crate::core::eviction::EvictionPolicy;

        let pool = MemoryPool::new(
            EvictionPolicy::mooncake_defaults(1 << 20),
            Arc::new(SystemClock::new()),
        )?;
        let staging = vec![7u8; 256];
        pool.register_staging(&staging)?;
        assert_eq!(pool.put(&["k"], &[&staging[..64]]), vec![Ok(())]);
        pool.unregister_staging(staging.as_ptr().addr())?;
        pool.unregister_staging(0)?;
        let mut loaded = vec![0u8; 64];
        assert_eq!(pool.get_into(&["k"], &mut [&mut loaded[..]]), vec![Ok(64)]);
        assert_eq!(loaded, staging[..64]);
        Ok(())
    }

    #[test]
    fn for_every_key_repeats_the_error_once_per_key() {
        let results: Vec<Result<bool, PoolError>> = PoolError::Unavailable.for_every_key(3);
        assert_eq!(results.len(), 3);
        assert!(results.iter().all(|r| r == &Err(PoolError::Unavailable)));
    }

    #[test]
    fn kinds_are_distinct_labels() {
        let errors = [
            PoolError::NotFound,
            PoolError::AlreadyExists,
            PoolError::BufferTooSmall {
                needed: 2,
                capacity: 1,
            },
            PoolError::from(EvictionError::LargerThanCapacity {
                needed_bytes: 2,
                capacity_bytes: 1,
            }),
            PoolError::BatchShape { keys: 1, items: 2 },
            PoolError::Backend { code: -1 },
            PoolError::Unavailable,
            PoolError::Timeout { after_ms: 5 },
            PoolError::Unreachable { retry_in_ms: 5 },
            PoolError::HostMemory {
                len: 64,
                cause: "arena_alloc_failed",
            },
            PoolError::Reserve {
                bytes: 64,
                len: 64,
                cause: "arena_alloc_failed",
            },
            PoolError::ReserveExceedsHost {
                capacity_bytes: 2,
                reserve_bytes: 2,
                available_bytes: 1,
                limit_bytes: 1,
                fits_bytes: 1,
            },
            PoolError::from(EvictionPolicyError::ZeroCapacity { working: 1 }),
        ];
        let mut kinds: Vec<&str> = errors.iter().map(PoolError::kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(kinds.len(), errors.len());
    }

    #[test]
    fn no_space_message_names_the_setting() {
        let err = PoolError::from(EvictionError::LargerThanCapacity {
            needed_bytes: 2048,
            capacity_bytes: 1024,
        });
        let message = err.to_string();
        assert!(message.contains("capacity_bytes"), "{message}");
        assert!(message.contains("2048"), "{message}");
    }
}
