//! The end of a connector: `shutdown` once (idempotent), the wait for the tensors'
//! release (`python::tensors::T5`), the shutdown of a dropped connector, and of every live one at
//! interpreter exit (`python::connector::G3`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use kv_connector::{ConnectorHandle, ConnectorStats};
use parking_lot::Mutex;
use pyo3::prelude::*;

use super::PyConnector;
use crate::tensors::Released;

/// Every connector's state that may still be running, for [`shutdown_all`]
/// (`python::connector::G3`). Locked only briefly, never while waiting for the GIL.
static LIVE: Mutex<Vec<Weak<Mutex<State>>>> = Mutex::new(Vec::new());

/// What the hooks change.
pub(super) struct State {
    pub handle: ConnectorHandle,
    /// The report of `shutdown`, returned again by later calls.
    pub final_stats: Option<ConnectorStats>,
    /// Per rank: told when the device lets go of the tensors (`python::tensors::T5`).
    released: Vec<Arc<Released>>,
}

/// A started connector's state, remembered for [`shutdown_all`].
pub(super) fn register(state: State) -> Arc<Mutex<State>> {
    let state = Arc::new(Mutex::new(state));
    let mut live = LIVE.lock();
    live.retain(|state| state.strong_count() > 0);
    live.push(Arc::downgrade(&state));
    state
}

/// How long shutdown waits for the actor threads to drop the tensor references.
const RELEASE_LIMIT: Duration = Duration::from_secs(30);

impl State {
    /// A running connector's state.
    pub(super) fn new(handle: ConnectorHandle, released: Vec<Arc<Released>>) -> Self {
        Self {
            handle,
            final_stats: None,
            released,
        }
    }

    /// Shuts the handle down once and waits until the tensors are released (`python::tensors::T5`);
    /// returns the final report (idempotent).
    pub(super) fn close(&mut self) -> ConnectorStats {
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
    /// `python::connector::G3`: shut down a connector the engine forgot, without holding the GIL if
    /// possible.
    fn drop(&mut self) {
        let close = || drop(self.state.lock().close());
        if Python::try_attach(|py| py.detach(close)).is_none() {
            drop(self.state.lock().close());
        }
    }
}

/// Shuts down every connector still running (`python::connector::G3`), with the GIL released.
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
