//! `kv_connector.Connector`: the runtime's `ConnectorHandle` behind the engine hooks of
//! DESIGN section 2, for an engine whose KV caches are torch tensors (R31).
//!
//! # Threads and the GIL
//!
//! - G1. Every hook converts its Python arguments while holding the GIL, then releases it
//!   (`detach`) before it takes the connector's lock and calls the runtime. So a hook that
//!   waits (`wait_for_progress`, `settle_saves`, `stats`, `shutdown`) never holds the GIL,
//!   and a thread holding the GIL never waits for the lock: the lock-then-GIL order of the
//!   Mooncake backend (whose client threads take the GIL for their Python calls) holds.
//! - G2. Loaders and savers never take the GIL; only the Mooncake client does, on the
//!   actor threads that call it.
//! - G3. A connector dropped without `shutdown` is shut down then, with the GIL released
//!   when the interpreter is still running. Connectors still live at interpreter exit are
//!   shut down by an `atexit` hook ([`shutdown_all`], registered by `__init__.py`) before
//!   the interpreter finalizes, while a Mooncake client's threads can still take the GIL.

use std::sync::{Arc, Weak};
use std::time::Duration;

use kv_connector::config::DeviceKind;
use kv_connector::connector::{
    ConnectorHandle, ConnectorParams, EngineConnector, ReserveAnswer, ScheduledRequest,
    SchedulerOutput,
};
use kv_connector::core::hash::{hash_blocks, scope_seed, BlockHash, Scope};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Layout;
use kv_connector::pool::Pool;
use kv_connector::stats::ConnectorStats;
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::convert::int_sequence;
use crate::errors::{self, ConfigError};
use crate::layout::PyLayout;
use crate::pool::{self, PyMemoryPool};
use crate::step::PyStepRequest;
use crate::tensors::{self, Placement, Released};
use crate::{config, stats};

/// Every connector's state that may still be running, for [`shutdown_all`] (G3). Locked
/// only briefly, never while waiting for the GIL.
static LIVE: Mutex<Vec<Weak<Mutex<State>>>> = Mutex::new(Vec::new());

/// The connector of one serving instance (module docs: threads and the GIL).
#[pyclass(name = "Connector", module = "kv_connector", frozen)]
pub struct PyConnector {
    /// The handle and the final report; locked only with the GIL released (G1).
    state: Arc<Mutex<State>>,
    layout: Layout,
    /// Scope seed of every chain (R1): the salt's.
    seed: BlockHash,
    placements: Vec<Placement>,
    pool_name: &'static str,
    model_key: String,
    namespace: String,
}

/// What the hooks change.
struct State {
    handle: ConnectorHandle,
    /// The report of `shutdown`, returned again by later calls.
    final_stats: Option<ConnectorStats>,
    /// Per rank: told when the device lets go of the tensors (`tensors` T5).
    released: Vec<Arc<Released>>,
}

/// One `StepRequest`, copied out of Python so the runtime can run without the GIL.
struct StepCopy {
    request: RequestId,
    prompt_len: usize,
    computed_before: usize,
    computed_after: usize,
    new_reservation: Option<ReservationId>,
    page_tables: Vec<Vec<i32>>,
}

#[pymethods]
impl PyConnector {
    /// Starts a connector on the engine's KV cache tensors (one per layer group, in layout
    /// order; a list of such lists with world size > 1). `pool`: a shared `MemoryPool`, or
    /// `None` for the configured backend. `config`: `None`, a TOML path or a dict; `KVC_*`
    /// variables apply over it. Raises `ConfigError`, `LayoutError`, `PoolError` or
    /// `DeviceError` when refused.
    #[new]
    #[pyo3(signature = (layout, kv_caches, pool = None, config = None, model_key = None, namespace = None, salt = None))]
    fn new(
        layout: &Bound<'_, PyAny>,
        kv_caches: &Bound<'_, PyAny>,
        pool: Option<&Bound<'_, PyMemoryPool>>,
        config: Option<&Bound<'_, PyAny>>,
        model_key: Option<String>,
        namespace: Option<String>,
        salt: Option<&str>,
    ) -> PyResult<Self> {
        let py = layout.py();
        let layout = PyLayout::from_arg(layout)?;
        let mut config = config::load(py, config)?;
        if let Some(namespace) = namespace {
            config.keys.namespace = namespace;
        }
        let model_key = model_key
            .or_else(|| Some(config.keys.model_key.clone()).filter(|key| !key.is_empty()))
            .unwrap_or_else(|| layout.name.clone());
        let mut devices = Vec::new();
        let mut placements = Vec::new();
        let mut released = Vec::new();
        for (rank, tensors) in tensors::per_rank(kv_caches, &layout)?.iter().enumerate() {
            let opened = tensors::open_device(&layout, rank, tensors)?;
            check_device_kind(config.device.kind, opened.placement)?;
            devices.push(opened.device);
            placements.push(opened.placement);
            released.push(opened.released);
        }
        let pool: Arc<dyn Pool> = match pool {
            Some(shared) => shared.get().inner.clone(),
            None => pool::from_config(py, &config)?,
        };
        let seed = scope_seed(&Scope {
            salt: salt.map(str::to_owned),
            ..Scope::default()
        });
        let namespace = config.keys.namespace.clone();
        let params = ConnectorParams {
            config,
            layout: layout.clone(),
            pool: Arc::clone(&pool),
            devices,
            seed,
            model_key: model_key.clone(),
        };
        let handle = py
            .detach(|| ConnectorHandle::start(params))
            .map_err(|error| errors::start(&error))?;
        let state = Arc::new(Mutex::new(State {
            handle,
            final_stats: None,
            released,
        }));
        let mut live = LIVE.lock();
        live.retain(|state| state.strong_count() > 0);
        live.push(Arc::downgrade(&state));
        drop(live);
        Ok(Self {
            state,
            layout,
            seed,
            placements,
            pool_name: pool.name(),
            model_key,
            namespace,
        })
    }

    /// Starts the lookup of a new request's prompt; never blocks. `tokens`: a list of ints
    /// or a 1-D integer array or tensor. `local_match_tokens`: the engine's own prefix-cache
    /// hit (block aligned).
    #[pyo3(signature = (request_id, tokens, local_match_tokens = 0))]
    fn lookup(
        &self,
        py: Python<'_>,
        request_id: u64,
        tokens: &Bound<'_, PyAny>,
        local_match_tokens: usize,
    ) -> PyResult<()> {
        let tokens: Arc<[i64]> = int_sequence(tokens, "tokens")?.into();
        self.with(py, |state| {
            state
                .handle
                .lookup_prefix(RequestId(request_id), tokens, local_match_tokens);
        });
        Ok(())
    }

    /// Sends the lookups queued since the last call now (optional: the next hook does).
    fn flush(&self, py: Python<'_>) {
        self.with(py, |state| state.handle.flush_lookups());
    }

    /// `None` while the lookup runs (ask again next step); else `(extra_tokens, is_async)`:
    /// tokens loadable beyond `num_computed`, and whether the load runs while the engine
    /// computes other requests. Starts no transfer.
    fn reserve(
        &self,
        py: Python<'_>,
        request_id: u64,
        num_computed: usize,
        reservation_id: u64,
    ) -> Option<(usize, bool)> {
        let answer = self.with(py, |state| {
            state.handle.reserve_prefix(
                RequestId(request_id),
                num_computed,
                ReservationId(reservation_id),
            )
        });
        match answer {
            ReserveAnswer::Pending => None,
            ReserveAnswer::Offer {
                extra_tokens,
                is_async,
            } => Some((extra_tokens, is_async)),
        }
    }

    /// The engine trims or gives up tokens `[start, end)` of a reservation.
    fn release(
        &self,
        py: Python<'_>,
        request_id: u64,
        reservation_id: u64,
        start: usize,
        end: usize,
    ) {
        self.with(py, |state| {
            state.handle.release_prefix_reservation(
                RequestId(request_id),
                ReservationId(reservation_id),
                start,
                end,
            );
        });
    }

    /// Plans saves and starts loads for what the engine scheduled this step: a list of
    /// `StepRequest`, each with one page table per layer group.
    fn on_step(&self, py: Python<'_>, requests: Vec<PyRef<'_, PyStepRequest>>) -> PyResult<()> {
        let groups = self.layout.groups.len();
        let copies = requests
            .iter()
            .map(|request| {
                if request.page_tables.len() != groups {
                    return Err(PyValueError::new_err(format!(
                        "request {}: {} page tables given, the layout has {groups} groups",
                        request.request_id,
                        request.page_tables.len()
                    )));
                }
                Ok(StepCopy {
                    request: RequestId(request.request_id),
                    prompt_len: request.prompt_len,
                    computed_before: request.computed_before,
                    computed_after: request.computed_after,
                    new_reservation: request.new_reservation.map(ReservationId),
                    page_tables: request.page_tables.clone(),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        drop(requests);
        self.with(py, |state| {
            let tables: Vec<Vec<&[i32]>> = copies
                .iter()
                .map(|copy| copy.page_tables.iter().map(Vec::as_slice).collect())
                .collect();
            let output = SchedulerOutput {
                requests: copies
                    .iter()
                    .zip(&tables)
                    .map(|(copy, tables)| ScheduledRequest {
                        request: copy.request,
                        prompt_len: copy.prompt_len,
                        computed_before: copy.computed_before,
                        computed_after: copy.computed_after,
                        new_reservation: copy.new_reservation,
                        page_tables: tables,
                    })
                    .collect(),
            };
            state.handle.on_step(&output);
        });
        Ok(())
    }

    /// Loads that ended since the last call: `(reservation_id, request_id, filled)`;
    /// `filled=False` means the engine computes that prefix itself (R25).
    fn finished_loads(&self, py: Python<'_>) -> Vec<(u64, u64, bool)> {
        self.with(py, |state| state.handle.get_finished_prefix_loads())
            .into_iter()
            .map(|load| (load.reservation.0, load.request.0, load.filled))
            .collect()
    }

    /// A request ended; `True`: keep its pages until `finished_saves` lists it.
    fn request_finished(&self, py: Python<'_>, request_id: u64) -> bool {
        self.with(py, |state| {
            state.handle.request_finished(RequestId(request_id))
        })
    }

    /// Requests whose saves are done (or dropped) since the last call: their pages may go.
    fn finished_saves(&self, py: Python<'_>) -> Vec<u64> {
        self.with(py, |state| state.handle.get_finished_saves())
            .into_iter()
            .map(|request| request.0)
            .collect()
    }

    /// Blocks, without the GIL, until a lookup, load or save completes or `timeout_s`
    /// seconds pass.
    fn wait_for_progress(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        let timeout = Duration::try_from_secs_f64(timeout_s).map_err(|_| {
            PyValueError::new_err(format!(
                "timeout_s must be a non-negative number, got {timeout_s}"
            ))
        })?;
        self.with(py, |state| state.handle.wait_for_progress(timeout));
        Ok(())
    }

    /// Blocks, without the GIL, until every save enqueued so far is stored, skipped or
    /// dropped.
    fn settle_saves(&self, py: Python<'_>) {
        self.with(py, |state| state.handle.settle_saves());
    }

    /// Everything counted so far (see `shutdown` for the layout of the dict).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let counted = self.with(py, |state| match &state.final_stats {
            Some(done) => done.clone(),
            None => state.handle.stats(),
        });
        stats::to_dict(py, &counted)
    }

    /// Drains per the stop order and returns the final statistics: `{"lookups": {...},
    /// "loads": {...}, "saves": {...}}`. Idempotent: later calls return the same report.
    /// The KV cache tensors are released once it returns.
    fn shutdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let report = self.with(py, State::close);
        stats::to_dict(py, &report)
    }

    /// The pool keys of every full block of `tokens`, per block: every group's key for every
    /// shard, in layout order (as `kv-connector keys` prints them).
    fn keys(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<String>>> {
        let tokens = int_sequence(tokens, "tokens")?;
        let hashes = hash_blocks(self.seed, &tokens, self.layout.tokens_per_block as usize)
            .map_err(|error| errors::hash(&error))?;
        Ok(self.with(py, |state| {
            let keys = state.handle.keys();
            hashes
                .iter()
                .map(|hash| {
                    keys.groups
                        .iter()
                        .flat_map(|group| group.all_shard_keys(hash))
                        .collect()
                })
                .collect()
        }))
    }

    /// The layout served.
    #[getter]
    fn layout(&self) -> PyLayout {
        PyLayout {
            inner: self.layout.clone(),
        }
    }

    /// Where each rank's KV caches live, as torch names them (`cpu`, `cuda:0`).
    #[getter]
    fn devices(&self) -> Vec<String> {
        self.placements
            .iter()
            .map(|placement| placement.torch_name())
            .collect()
    }

    /// The pool backend: `memory` or `mooncake`.
    #[getter]
    fn pool_backend(&self) -> &'static str {
        self.pool_name
    }

    /// The model key segment (the layout fingerprint is appended in keys).
    #[getter]
    fn model_key(&self) -> &str {
        &self.model_key
    }

    /// The namespace segment.
    #[getter]
    fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether `shutdown` has run.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        self.with(py, |state| state.final_stats.is_some())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.shutdown(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "Connector(layout={:?}, devices={:?}, pool={:?}, namespace={:?}, model_key={:?})",
            self.layout.name,
            self.devices(),
            self.pool_name,
            self.namespace,
            self.model_key
        )
    }
}

impl PyConnector {
    /// Runs `f` on the state with the GIL released (G1).
    fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut State) -> R + Send) -> R {
        py.detach(|| f(&mut self.state.lock()))
    }
}

/// How long shutdown waits for the actor threads to drop the tensor references.
const RELEASE_LIMIT: Duration = Duration::from_secs(30);

impl State {
    /// Shuts the handle down once and waits until the tensors are released (T5); returns
    /// the final report (idempotent).
    fn close(&mut self) -> ConnectorStats {
        if self.final_stats.is_none() {
            self.final_stats = Some(self.handle.close());
            for (rank, released) in self.released.iter().enumerate() {
                if !released.wait(RELEASE_LIMIT) {
                    tracing::warn!(
                        rank,
                        "kv cache tensors still held by connector threads after shutdown"
                    );
                }
            }
        }
        self.final_stats.clone().unwrap_or_default()
    }
}

impl Drop for PyConnector {
    /// G3: shut down a connector the engine forgot, without holding the GIL if possible.
    fn drop(&mut self) {
        let close = || drop(self.state.lock().close());
        if Python::try_attach(|py| py.detach(close)).is_none() {
            drop(self.state.lock().close());
        }
    }
}

/// Shuts down every connector still running (G3), with the GIL released.
#[pyfunction]
pub fn shutdown_all(py: Python<'_>) {
    let live: Vec<Arc<Mutex<State>>> = LIVE
        .lock()
        .drain(..)
        .filter_map(|state| state.upgrade())
        .collect();
    py.detach(|| {
        for state in live {
            drop(state.lock().close());
        }
    });
}

/// Refuses tensors on a device that `device.kind` excludes (`auto` takes the tensors').
fn check_device_kind(kind: DeviceKind, placement: Placement) -> PyResult<()> {
    let refused = match (kind, placement) {
        (DeviceKind::Cuda, Placement::Host) => {
            "device.kind = \"cuda\" but the kv caches are cpu tensors"
        }
        (DeviceKind::Host, Placement::Cuda(_)) => {
            "device.kind = \"host\" but the kv caches are cuda tensors"
        }
        _ => return Ok(()),
    };
    Err(errors::raise::<ConfigError>(
        "device_kind",
        format!("{refused}; set device.kind = \"auto\" (the tensors decide)"),
    ))
}
