//! `kv_connector.MemoryPool`: the embedded in-process pool (DESIGN section 10), shareable
//! by several connectors of one process, and how a connector gets its pool from the
//! configuration when none is given (a memory pool of `pool.capacity_bytes`, or a Mooncake
//! client of its own).
//!
//! Invariants:
//! - `python::pool::P1`. A memory pool's settings come from one place: its constructor's arguments,
//!   or the configuration loaded exactly as a connector loads it (`MemoryPool.from_config`, the
//!   pool of a connector given none). A configuration whose `pool.backend` is `mooncake` never
//!   makes a memory pool.
//! - `python::pool::P2`. A pool the host cannot hold is refused at its first connector's start,
//!   before any of it is taken: the configuration with the pool counted as `pool.capacity_bytes`
//!   must fit what the host can give now (the check `kv-connector validate` makes against
//!   `MemTotal`, here against the share of `MemAvailable` a pool may reserve), and so must what the
//!   arena carves (`MemoryPool::reserve`, which then touches every page so that the memory is
//!   resident at start).

use std::sync::Arc;

use kv_connector::{
    host_memory, Config, Device, EvictionPolicy, HostArena, MemoryPool, Pool, PoolBackend,
    PoolError, SystemClock,
};
use pyo3::prelude::*;
use std::sync::Mutex;

use crate::config;
use crate::convert::{arg, to_py};
use crate::errors;

/// The embedded memory pool. Several connectors given the same pool share its objects, as
/// serving instances share a Mooncake Store.
///
/// The pool is made when the first connector attaches, in that connector's device's host
/// memory (`Device::host_arena`): pinned memory of its CUDA context for CUDA tensors, so
/// loads and saves are DMA straight from and into the pool's objects; heap memory for CPU
/// tensors, or when something asks the pool before any connector does. Made for a
/// connector, it takes its whole capacity then (`MemoryPool::reserve`, sized by that
/// connector's pages), so saves never wait for memory and a capacity the host cannot give
/// fails that connector's start.
#[pyclass(name = "MemoryPool", module = "kv_connector", frozen)]
pub struct PyMemoryPool {
    policy: EvictionPolicy,
    /// The pool, once made (the test aid needs the concrete type).
    made: Mutex<Option<Arc<MemoryPool>>>,
}

impl PyMemoryPool {
    /// The pool, made in `device`'s host memory if this is its first use, with its
    /// capacity reserved for objects of `object_lens` bytes.
    pub fn for_device(
        &self,
        device: Option<&Device>,
        object_lens: &[usize],
    ) -> PyResult<Arc<MemoryPool>> {
        let mut made = self.made.lock().map_err(|_| {
            errors::raise::<errors::PoolError>(
                "poisoned",
                "the memory pool's lock was poisoned".to_owned(),
            )
        })?;
        if let Some(pool) = made.as_ref() {
            return Ok(Arc::clone(pool));
        }
        let pool = memory_pool(self.policy, device, object_lens)?;
        *made = Some(Arc::clone(&pool));
        Ok(pool)
    }

    fn inner(&self) -> PyResult<Arc<MemoryPool>> {
        self.for_device(None, &[])
    }

    /// The host memory the pool holds already: none until it is made.
    fn held_bytes(&self) -> u64 {
        let made = self.made.lock().ok().and_then(|made| made.clone());
        made.map_or(0, |pool| pool.arena().stats().chunk_bytes as u64)
    }

    /// A pool with `policy`, once it validates.
    fn with_policy(policy: EvictionPolicy) -> PyResult<Self> {
        policy
            .validate()
            .map_err(|error| errors::pool(&PoolError::from(error)))?;
        Ok(Self {
            policy,
            made: Mutex::new(None),
        })
    }
}

#[pymethods]
impl PyMemoryPool {
    /// A pool of `capacity_bytes` with Mooncake's eviction model: above
    /// `eviction_high_watermark_ratio` of capacity, least recently used unleased objects go
    /// until `eviction_ratio` of it is free; probes and gets lease objects for
    /// `kv_lease_ttl_ms`. Raises `PoolError` for a zero capacity or a ratio outside (0, 1].
    #[new]
    #[pyo3(signature = (capacity_bytes = 1 << 30, *, eviction_high_watermark_ratio = 0.95, eviction_ratio = 0.05, kv_lease_ttl_ms = 5000))]
    fn new(
        #[pyo3(from_py_with = arg::capacity_bytes)] capacity_bytes: u64,
        eviction_high_watermark_ratio: f64,
        eviction_ratio: f64,
        #[pyo3(from_py_with = arg::kv_lease_ttl_ms)] kv_lease_ttl_ms: u64,
    ) -> PyResult<Self> {
        Self::with_policy(EvictionPolicy {
            capacity_bytes,
            high_watermark_ratio: eviction_high_watermark_ratio,
            eviction_ratio,
            lease_ttl_ms: kv_lease_ttl_ms,
        })
    }

    /// A pool with the `[pool]` settings of a configuration loaded exactly as
    /// `Connector(config=...)` loads it (`python::pool::P1`): `None`, a TOML path or a dict, under
    /// the `KVC_*` environment. Raises `ConfigError` for what that connector would refuse, and for
    /// `pool.backend = "mooncake"` (a Mooncake client is not a memory pool).
    #[staticmethod]
    #[pyo3(signature = (config = None))]
    fn from_config(py: Python<'_>, config: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let config = config::load(py, config)?;
        if config.pool.backend == PoolBackend::Mooncake {
            return Err(backend_refusal(
                "MemoryPool.from_config: pool.backend = \"mooncake\" configures a Mooncake \
                 client, not a memory pool; give this configuration to Connector(pool=None) \
                 instead, or set pool.backend = \"memory\"",
            ));
        }
        Self::with_policy(policy_of(&config))
    }

    /// The capacity in bytes.
    #[getter]
    pub fn capacity_bytes(&self) -> u64 {
        self.policy.capacity_bytes
    }

    /// The pool's counters: hits, misses, puts, evictions, bytes, objects held.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner()?.counters())
    }

    /// Test aid (wheels built with the `faults` feature only): flips one payload byte of up
    /// to `count` stored objects whose key contains `key_substring` (any for `None`), in
    /// key order, so that the next load of each fails its integrity check (R5) and is
    /// reported `filled=False`. Returns the keys damaged.
    #[cfg(feature = "faults")]
    #[pyo3(signature = (key_substring = None, count = 1))]
    fn corrupt(
        &self,
        py: Python<'_>,
        key_substring: Option<&str>,
        #[pyo3(from_py_with = count_arg)] count: usize,
    ) -> PyResult<Vec<String>> {
        let pool = self.inner()?;
        py.detach(|| pool.corrupt_payloads(key_substring, count))
            .map_err(|error| errors::pool(&error))
    }

    fn __repr__(&self) -> String {
        match self.made.lock().ok().and_then(|made| made.clone()) {
            Some(pool) => {
                let counters = pool.counters();
                format!(
                    "MemoryPool(capacity_bytes={}, used_bytes={}, objects={})",
                    counters.capacity_bytes, counters.used_bytes, counters.objects
                )
            }
            None => format!(
                "MemoryPool(capacity_bytes={}, unused)",
                self.policy.capacity_bytes
            ),
        }
    }
}

/// The `count` argument of `corrupt` (a count, named in its errors).
#[cfg(feature = "faults")]
fn count_arg(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    crate::convert::unsigned(value, "count")
}

/// A memory pool with `policy` on the system clock, in `device`'s host memory, its
/// capacity reserved for objects of `object_lens` bytes (none reserved for an empty list).
/// The GIL is not needed: pinning gigabytes takes a while.
fn memory_pool(
    policy: EvictionPolicy,
    device: Option<&Device>,
    object_lens: &[usize],
) -> PyResult<Arc<MemoryPool>> {
    let arena = device.map_or_else(HostArena::heap, Device::host_arena);
    let pool = MemoryPool::with_arena(policy, Arc::new(SystemClock::new()), arena)
        .map_err(|error| errors::pool(&error))?;
    pool.reserve(object_lens)
        .map_err(|error| errors::pool(&error))?;
    Ok(Arc::new(pool))
}

/// The pool of a connector given none: `config`'s backend (module docs); a memory pool
/// lives in `device`'s host memory (pinned for CUDA).
pub fn from_config(
    py: Python<'_>,
    config: &Config,
    device: Option<&Device>,
    object_lens: &[usize],
) -> PyResult<Arc<dyn Pool>> {
    match config.pool.backend {
        PoolBackend::Memory => {
            let policy = policy_of(config);
            Ok(py.detach(|| memory_pool(policy, device, object_lens))?)
        }
        PoolBackend::Mooncake => mooncake(py, config, device.is_none()),
    }
}

/// The eviction policy of `config`'s `[pool]` section.
fn policy_of(config: &Config) -> EvictionPolicy {
    EvictionPolicy {
        capacity_bytes: config.pool.capacity_bytes,
        high_watermark_ratio: config.pool.eviction_high_watermark_ratio,
        eviction_ratio: config.pool.eviction_ratio,
        lease_ttl_ms: config.pool.kv_lease_ttl_ms,
    }
}

/// Refuses a `MemoryPool` given to a connector whose configuration says `pool.backend = "mooncake"`
/// (`python::pool::P1`): one of the two would be dropped without a word.
pub fn check_given_pool(config: &Config) -> PyResult<()> {
    if config.pool.backend != PoolBackend::Mooncake {
        return Ok(());
    }
    Err(backend_refusal(
        "pool.backend = \"mooncake\" but a MemoryPool was given as pool=, which would replace \
         the Mooncake backend; pass pool=None to use Mooncake, or set pool.backend = \"memory\" \
         to use the MemoryPool",
    ))
}

fn backend_refusal(message: &str) -> PyErr {
    errors::raise::<errors::ConfigError>("pool_backend", message.to_owned())
}

/// Refuses, before any pool memory is taken, a configuration that takes more memory than the host
/// can give now (`python::pool::P2`): the check `kv-connector validate` makes, against what a pool
/// may reserve of `MemAvailable` plus what the `MemoryPool` `given` to the connector (counted as
/// `pool.capacity_bytes`) holds already, so the value it names also passes the pool's own check. A
/// refusal that names the pool's capacity is a `PoolError`, one that names staging a `ConfigError`.
pub fn check_host_memory(config: &Config, given: Option<&PyMemoryPool>) -> PyResult<()> {
    let Some(host) = host_memory() else {
        return Ok(());
    };
    let held = given.map_or(0, PyMemoryPool::held_bytes);
    let can_give = MemoryPool::reservable_bytes(host).saturating_add(held);
    let runtime = config.validate().map_err(|error| errors::config(&error))?;
    config
        .check_host_memory(
            &runtime,
            can_give,
            "available to a pool now, of MemAvailable",
        )
        .map_err(|refused| {
            let mut text = errors::message(&refused);
            if let Some(pool) = given {
                text = format!(
                    "the pool given, MemoryPool(capacity_bytes={}), counts as \
                     pool.capacity_bytes: {text}",
                    pool.policy.capacity_bytes
                );
            }
            if refused.fits_key == refused.memory.pool_key {
                errors::raise::<errors::PoolError>(refused.kind(), text)
            } else {
                errors::raise::<errors::ConfigError>(refused.kind(), text)
            }
        })
}

/// A Mooncake client of this connector's own, in the host interpreter (`lookup_only`: a
/// connector without devices, whose dummy client needs no shared memory for staging).
/// Connecting checks that the master answers and may take seconds, so the GIL is released
/// meanwhile (the client takes it back for its Python calls).
#[cfg(feature = "mooncake")]
fn mooncake(py: Python<'_>, config: &Config, lookup_only: bool) -> PyResult<Arc<dyn Pool>> {
    use kv_connector::{MooncakePool, MooncakeSettings};
    let settings = if lookup_only {
        MooncakeSettings::lookup_only_from_config(config)
    } else {
        MooncakeSettings::from_config(config)
    };
    let pool = py
        .detach(|| MooncakePool::connect(settings))
        .map_err(|error| errors::mooncake(&error))?;
    Ok(Arc::new(pool))
}

#[cfg(not(feature = "mooncake"))]
fn mooncake(_py: Python<'_>, _config: &Config, _lookup_only: bool) -> PyResult<Arc<dyn Pool>> {
    Err(errors::raise::<errors::ConfigError>(
        "mooncake_not_built",
        "pool.backend = \"mooncake\" needs a kv_connector build with the mooncake feature; \
         use pool.backend = \"memory\" or a wheel built with it"
            .to_owned(),
    ))
}
