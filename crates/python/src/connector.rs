//! `kv_connector.Connector`: the runtime's `ConnectorHandle` behind the engine hooks of
//! DESIGN section 2, for an engine whose KV caches are torch tensors (R31).
//!
//! # Threads and the GIL
//!
//! - `python::connector::G1`. A hook converts its Python arguments while holding the GIL, then
//!   releases it (`detach`) before it takes the connector's lock and calls the runtime, so a hook
//!   that waits (`settle_saves`, `stats`, `shutdown`) never holds the GIL meanwhile;
//!   `wait_for_progress` holds neither the GIL nor the lock while it waits (a `ProgressWaiter`), so
//!   other threads' hooks go on and signals are seen. The hooks of the engine step (`lookup`,
//!   `flush`, `reserve`, `release`, `on_step`, `finished_loads`, `request_finished`,
//!   `finished_saves`) are the exception: they never wait for the actors (under the lock they only
//!   try-send to and try-receive from channels), so they keep the GIL when the lock is free at once
//!   (releasing and re-taking it would cost more than their work) and release it only to wait for
//!   the lock. Either way a thread holding the GIL never waits, for the lock or for an actor: the
//!   lock-then-GIL order of the Mooncake backend (whose client threads take the GIL for their
//!   Python calls) holds.
//! - `python::connector::G2`. Loaders and savers never take the GIL; only the Mooncake client does,
//!   on the actor threads that call it.
//! - `python::connector::G3`. A connector dropped without `shutdown` is shut down then, with the
//!   GIL released when the interpreter is still running. Connectors still live at interpreter exit
//!   are shut down by an `atexit` hook ([`shutdown_all`], registered by `__init__.py`) before the
//!   interpreter finalizes, while a Mooncake client's threads can still take the GIL.

mod lifecycle;
mod start;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kv_connector::{
    BlockHash, EngineConnector, HookError, Layout, Prompt, PromptHashes, RequestId, RequestScope,
    ReservationId, ReserveAnswer, ScheduledRequest, SchedulerOutput,
};
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

pub use self::lifecycle::shutdown_all;
use self::lifecycle::State;
use self::start::StartArgs;
use crate::convert::{arg, int_sequence, read_list_later};
use crate::errors;
use crate::layout::PyLayout;
use crate::pool::PyMemoryPool;
use crate::stats;
use crate::step::{PyStepRequest, StepCopy};
use crate::tensors::Placement;

/// How often `wait_for_progress` looks for a pending signal (a `KeyboardInterrupt`).
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// The connector of one serving instance (module docs: threads and the GIL).
#[pyclass(name = "Connector", module = "kv_connector", frozen)]
pub struct PyConnector {
    /// The handle and the final report; locked only with the GIL released
    /// (`python::connector::G1`).
    state: Arc<Mutex<State>>,
    layout: Layout,
    /// Scope seed of every chain (R1): the salt's.
    seed: BlockHash,
    placements: Vec<Placement>,
    /// Per layer group, the pages of its tensor: `on_step` checks page tables against it.
    page_counts: Vec<u32>,
    pool_name: &'static str,
    model_key: String,
    namespace: String,
}

#[pymethods]
impl PyConnector {
    /// Starts a connector on the engine's KV cache tensors (one per layer group, in layout
    /// order; a list of such lists with world size > 1). `pool`: a shared `MemoryPool`, or
    /// `None` for the configured backend. `config`: `None`, a TOML path or a dict; `KVC_*`
    /// variables apply over it. A deployment whose ranks live in separate processes (R33)
    /// gives each process's connector `rank` (of its first list of tensors) and its own
    /// stage's `layout`, and its scheduler a lookup-only connector (`kv_caches=None`: it
    /// looks up and offers, its Mooncake client stores nothing) on the union of the
    /// `stages`' layouts, whose `lookup_record`s the ranks adopt. Raises
    /// `ConfigError`, `LayoutError`, `PoolError` or `DeviceError` when refused.
    #[new]
    #[pyo3(signature = (layout, kv_caches, pool = None, config = None, model_key = None, namespace = None, salt = None, *, rank = None, stages = None))]
    #[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn new(
        layout: &Bound<'_, PyAny>,
        kv_caches: Option<&Bound<'_, PyAny>>,
        pool: Option<&Bound<'_, PyMemoryPool>>,
        config: Option<&Bound<'_, PyAny>>,
        model_key: Option<String>,
        namespace: Option<String>,
        salt: Option<&str>,
        rank: Option<u32>,
        stages: Option<Vec<Bound<'_, PyAny>>>,
    ) -> PyResult<Self> {
        start::start(StartArgs {
            layout,
            kv_caches,
            pool,
            config,
            model_key,
            namespace,
            salt,
            rank,
            stages,
        })
    }

    /// A finished lookup as bytes for the connectors of the deployment's ranks in other
    /// processes (`adopt_lookup`); `None` while it runs, or for an unknown request.
    fn lookup_record<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::request_id)] request_id: u64,
    ) -> Option<Bound<'py, PyBytes>> {
        let record = self.with_nowait(py, |state| {
            state.handle.lookup_record(RequestId(request_id))
        })?;
        Some(PyBytes::new(py, &record))
    }

    /// Takes another connector's `lookup_record` as this request's finished lookup, in place
    /// of `lookup`: the request is then reserved, loaded and saved as if looked up here.
    /// Raises `ValueError` for a live request, or a record of another deployment.
    fn adopt_lookup(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::request_id)] request_id: u64,
        record: &[u8],
    ) -> PyResult<()> {
        let record = record.to_vec();
        self.with_nowait(py, |state| {
            state.handle.adopt_lookup(RequestId(request_id), &record)
        })
        .map_err(|refused| PyValueError::new_err(refused.to_string()))
    }

    /// Starts the lookup of a new request's prompt; never blocks. `tokens`: a list of ints
    /// or a 1-D integer array or tensor. `local_match_tokens`: the engine's own prefix-cache
    /// hit (block aligned). The tokens are the request's until it ends (R32): a lookup for
    /// a live request id (looked up and not ended, or ended with saves pending) raises
    /// `ValueError`, and nothing more of that request is saved or loaded. `cache_salt` and
    /// `adapter` (a `LoRA` adapter, named by what identifies its weights) scope the request
    /// (R34): it shares KV only with requests of the same salt and adapter. `read_later`:
    /// a list is copied now (its item references, at C speed) and read on the runtime's
    /// planner thread, so the caller's thread does not convert every token; an item that is
    /// not an int then ends the lookup with nothing offered or saved (logged) instead of
    /// raising. `append_only` (with `read_later`): the caller guarantees that the list's
    /// first `len(tokens)` items stay as they are until the request ends (items may only be
    /// appended), so not even the copy is made: those items are read from the caller's list.
    #[pyo3(signature = (request_id, tokens, local_match_tokens = 0, cache_salt = None, adapter = None, *, read_later = false, append_only = false))]
    #[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn lookup(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::request_id)] request_id: u64,
        tokens: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = arg::local_match_tokens)] local_match_tokens: usize,
        cache_salt: Option<String>,
        adapter: Option<String>,
        read_later: bool,
        append_only: bool,
    ) -> PyResult<()> {
        if append_only && !read_later {
            return Err(PyValueError::new_err(
                "append_only=True needs read_later=True: only a list read later is left uncopied",
            ));
        }
        let tokens = match tokens.cast::<PyList>() {
            Ok(list) if read_later => {
                let len = list.len();
                let list = if append_only {
                    list.clone().unbind()
                } else {
                    list.get_slice(0, len).unbind()
                };
                Prompt::read_later(move || read_list_later(list, len))
            }
            _ => Prompt::from(Arc::<[i64]>::from(int_sequence(tokens, "tokens")?)),
        };
        let scope = RequestScope {
            cache_salt,
            adapter,
        };
        self.with_nowait(py, |state| {
            state
                .handle
                .lookup_prompt(RequestId(request_id), tokens, local_match_tokens, scope)
        })
        .map_err(|refused| PyValueError::new_err(refused.to_string()))
    }

    /// Sends the lookups queued since the last call now (optional: the next hook does).
    fn flush(&self, py: Python<'_>) {
        self.with_nowait(py, |state| state.handle.flush_lookups());
    }

    /// `None` while the lookup runs (ask again next step); else `(extra_tokens, is_async)`:
    /// tokens loadable beyond `num_computed`, and whether the load runs while the engine
    /// computes other requests. Starts no transfer.
    fn reserve(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::request_id)] request_id: u64,
        #[pyo3(from_py_with = arg::num_computed)] num_computed: usize,
        #[pyo3(from_py_with = arg::reservation_id)] reservation_id: u64,
    ) -> Option<(usize, bool)> {
        let answer = self.with_nowait(py, |state| {
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

    /// The blocks of each window group that `on_step` would save for this chunk of the
    /// request (R17 at the prompt's last chunk, R28 at each checkpoint it passes), per
    /// layout group; empty for full groups. An engine that copies window blocks aside
    /// before handing them over (vLLM's bounce pages) copies exactly these.
    fn window_save_blocks(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::request_id)] request_id: u64,
        #[pyo3(from_py_with = arg::prompt_len)] prompt_len: usize,
        #[pyo3(from_py_with = arg::computed_before)] computed_before: usize,
        #[pyo3(from_py_with = arg::computed_after)] computed_after: usize,
    ) -> Vec<Vec<usize>> {
        self.with_nowait(py, |state| {
            state.handle.window_blocks_to_save(
                RequestId(request_id),
                prompt_len,
                computed_before..computed_after,
            )
        })
    }

    /// `window_save_blocks` for every chunk at once: each save point of the prompt (a
    /// window checkpoint, and the prompt end while the window is not saved), ascending,
    /// with per layout group the blocks a chunk passing it saves. A chunk
    /// `[computed_before, computed_after)` saves a subset of the union over the points `p`
    /// with `computed_before < p <= computed_after`, which adds only sink blocks the chunk
    /// has not computed yet. A scheduler that reads window blocks' ids asks once a
    /// request instead of once a chunk.
    fn window_save_schedule(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::request_id)] request_id: u64,
        #[pyo3(from_py_with = arg::prompt_len)] prompt_len: usize,
    ) -> Vec<(usize, Vec<Vec<usize>>)> {
        self.with_nowait(py, |state| {
            state
                .handle
                .window_save_schedule(RequestId(request_id), prompt_len)
        })
    }

    /// The engine trims or gives up tokens `[start, end)` of a reservation.
    fn release(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::request_id)] request_id: u64,
        #[pyo3(from_py_with = arg::reservation_id)] reservation_id: u64,
        #[pyo3(from_py_with = arg::start)] start: usize,
        #[pyo3(from_py_with = arg::end)] end: usize,
    ) {
        self.with_nowait(py, |state| {
            state.handle.release_prefix_reservation(
                RequestId(request_id),
                ReservationId(reservation_id),
                start,
                end,
            );
        });
    }

    /// Plans saves and starts loads for what the engine scheduled this step: a list of
    /// `StepRequest`, each with one page table per layer group. Raises `ValueError`, and
    /// does nothing of the step, for a page index outside its group's tensor, or a
    /// `new_reservation` that is not the request's latest offer from `reserve` or was
    /// reported before.
    fn on_step(&self, py: Python<'_>, requests: Vec<PyRef<'_, PyStepRequest>>) -> PyResult<()> {
        let copies = requests
            .iter()
            .map(|request| StepCopy::of(request, &self.page_counts))
            .collect::<PyResult<Vec<_>>>()?;
        drop(requests);
        self.with_nowait(py, |state| {
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
            state.handle.check_step(&output)?;
            state.handle.on_step(&output);
            Ok(())
        })
        .map_err(|refused: HookError| PyValueError::new_err(refused.to_string()))
    }

    /// Loads that ended since the last call: `(reservation_id, request_id, filled)`;
    /// `filled=False` means the engine computes that prefix itself (R25).
    fn finished_loads(&self, py: Python<'_>) -> Vec<(u64, u64, bool)> {
        self.with_nowait(py, |state| state.handle.get_finished_prefix_loads())
            .into_iter()
            .map(|load| (load.reservation.0, load.request.0, load.filled))
            .collect()
    }

    /// A request ended; `True`: keep its pages until `finished_saves` lists it.
    fn request_finished(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::request_id)] request_id: u64,
    ) -> bool {
        self.with_nowait(py, |state| {
            state.handle.request_finished(RequestId(request_id))
        })
    }

    /// Requests whose saves are done (or dropped) since the last call: their pages may go.
    fn finished_saves(&self, py: Python<'_>) -> Vec<u64> {
        self.with_nowait(py, |state| state.handle.get_finished_saves())
            .into_iter()
            .map(|request| request.0)
            .collect()
    }

    /// Blocks, without the GIL and without the connector's lock (other threads' hooks
    /// go on), until a lookup, load or save completes or `timeout_s` seconds pass. Signals
    /// are checked every [`SIGNAL_CHECK`]: a `KeyboardInterrupt` is raised within it.
    fn wait_for_progress(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        let timeout = Duration::try_from_secs_f64(timeout_s).map_err(|_| {
            PyValueError::new_err(format!(
                "timeout_s must be a non-negative number, got {timeout_s}"
            ))
        })?;
        let deadline = Instant::now().checked_add(timeout);
        let waiter = self.with_nowait(py, |state| state.handle.progress_waiter());
        loop {
            let now = Instant::now();
            let slice_end = now + SIGNAL_CHECK;
            let until = deadline.map_or(slice_end, |deadline| deadline.min(slice_end));
            if let Some(progress) = py.detach(|| waiter.wait(until)) {
                self.with_nowait(py, |state| state.handle.accept_progress(progress));
                return Ok(());
            }
            py.check_signals()?;
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Ok(());
            }
        }
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
    /// "loads": {...}, "saves": {...}, "pool": {...}}` (the last: the pool's health, R30).
    /// Idempotent: later calls return the same report.
    /// The KV cache tensors are released once it returns.
    fn shutdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let report = self.with(py, State::close);
        stats::to_dict(py, &report)
    }

    /// The pool keys of every full block of `tokens`, per block: every group's key for every
    /// shard, in layout order (as `kv-connector keys` prints them), chained from the scope
    /// of `cache_salt` and `adapter` (R34).
    #[pyo3(signature = (tokens, cache_salt = None, adapter = None))]
    fn keys(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        cache_salt: Option<String>,
        adapter: Option<String>,
    ) -> PyResult<Vec<Vec<String>>> {
        let scope = RequestScope {
            cache_salt,
            adapter,
        };
        let tokens = int_sequence(tokens, "tokens")?;
        self.with(py, |state| {
            let keys = state.handle.keys();
            let hashes = PromptHashes::of_prompt(
                scope.seed(self.seed),
                &tokens,
                self.layout.tokens_per_block as usize,
                keys.needs_next_token(),
            )
            .map_err(|error| errors::hash(&error))?;
            // A drafter's group is keyed by its next-token names (R37): it has no key for a
            // block whose next token is not in `tokens`.
            PyResult::Ok(
                (0..hashes.chain().len())
                    .map(|block| {
                        keys.groups
                            .iter()
                            .filter_map(|group| Some((group, hashes.get(group.naming, block)?)))
                            .flat_map(|(group, hash)| group.all_shard_keys(hash))
                            .collect()
                    })
                    .collect(),
            )
        })
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

    /// The model key given (argument, `keys.model_key`, or the layout's name); keys carry
    /// it with the layout fingerprint appended, as [`pool_model_key`](Self::pool_model_key).
    #[getter]
    fn model_key(&self) -> &str {
        &self.model_key
    }

    /// The model key segment as it stands in pool keys, `{model_key}.{fingerprint}`: what
    /// `kv-connector keys --model-key` takes to print the keys `keys()` returns.
    #[getter]
    fn pool_model_key(&self) -> String {
        format!("{}.{}", self.model_key, self.layout.fingerprint())
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
    /// Runs `f`, which may wait, on the state with the GIL released (`python::connector::G1`).
    fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut State) -> R + Send) -> R {
        py.detach(|| f(&mut self.state.lock()))
    }

    /// Runs `f`, which never waits, on the state: with the GIL held when the lock is free,
    /// else as [`with`](Self::with) (`python::connector::G1`).
    fn with_nowait<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut State) -> R + Send) -> R {
        match self.state.try_lock() {
            Some(mut state) => f(&mut state),
            None => self.with(py, f),
        }
    }
}
