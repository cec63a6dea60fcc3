//! `kv_connector.MemoryPool`: the embedded in-process pool (DESIGN section 10), shareable
//! by several connectors of one process, and how a connector gets its pool from the
//! configuration when none is given (a memory pool of `pool.capacity_bytes`, or a Mooncake
//! client of its own).

use std::sync::Arc;

use kv_connector::config::{Config, PoolBackend};
use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::pool::{MemoryPool, Pool, SystemClock};
use pyo3::prelude::*;

use crate::convert::to_py;
use crate::errors;

/// The embedded memory pool. Several connectors given the same pool share its objects, as
/// serving instances share a Mooncake Store.
#[pyclass(name = "MemoryPool", module = "kv_connector", frozen)]
pub struct PyMemoryPool {
    /// The pool itself (the test aid needs the concrete type).
    pub inner: Arc<MemoryPool>,
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
        capacity_bytes: u64,
        eviction_high_watermark_ratio: f64,
        eviction_ratio: f64,
        kv_lease_ttl_ms: u64,
    ) -> PyResult<Self> {
        let policy = EvictionPolicy {
            capacity_bytes,
            high_watermark_ratio: eviction_high_watermark_ratio,
            eviction_ratio,
            lease_ttl_ms: kv_lease_ttl_ms,
        };
        memory_pool(policy).map(|inner| Self { inner })
    }

    /// The pool's counters: hits, misses, puts, evictions, bytes, objects held.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner.counters())
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
        count: usize,
    ) -> PyResult<Vec<String>> {
        py.detach(|| self.inner.corrupt_payloads(key_substring, count))
            .map_err(|error| errors::pool(&error))
    }

    fn __repr__(&self) -> String {
        let counters = self.inner.counters();
        format!(
            "MemoryPool(capacity_bytes={}, used_bytes={}, objects={})",
            counters.capacity_bytes, counters.used_bytes, counters.objects
        )
    }
}

/// A memory pool with `policy` on the system clock.
fn memory_pool(policy: EvictionPolicy) -> PyResult<Arc<MemoryPool>> {
    MemoryPool::new(policy, Arc::new(SystemClock::new()))
        .map(Arc::new)
        .map_err(|error| errors::pool(&error))
}

/// The pool of a connector given none: `config`'s backend (module docs).
pub fn from_config(py: Python<'_>, config: &Config) -> PyResult<Arc<dyn Pool>> {
    match config.pool.backend {
        PoolBackend::Memory => {
            let policy = EvictionPolicy {
                capacity_bytes: config.pool.capacity_bytes,
                high_watermark_ratio: config.pool.eviction_high_watermark_ratio,
                eviction_ratio: config.pool.eviction_ratio,
                lease_ttl_ms: config.pool.kv_lease_ttl_ms,
            };
            Ok(memory_pool(policy)?)
        }
        PoolBackend::Mooncake => mooncake(py, config),
    }
}

/// A Mooncake client of this connector's own, in the host interpreter. Connecting checks
/// that the master answers and may take seconds, so the GIL is released meanwhile (the
/// client takes it back for its Python calls).
#[cfg(feature = "mooncake")]
fn mooncake(py: Python<'_>, config: &Config) -> PyResult<Arc<dyn Pool>> {
    use kv_connector::pool::mooncake::{MooncakePool, MooncakeSettings};
    let settings = MooncakeSettings::from_config(config);
    let pool = py
        .detach(|| MooncakePool::connect(settings))
        .map_err(|error| errors::mooncake(&error))?;
    Ok(Arc::new(pool))
}

#[cfg(not(feature = "mooncake"))]
fn mooncake(_py: Python<'_>, _config: &Config) -> PyResult<Arc<dyn Pool>> {
    Err(errors::raise::<errors::ConfigError>(
        "mooncake_not_built",
        "pool.backend = \"mooncake\" needs a kv_connector build with the mooncake feature; \
         use pool.backend = \"memory\" or a wheel built with it"
            .to_owned(),
    ))
}
