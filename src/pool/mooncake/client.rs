//! The thin layer over the Python `MooncakeDistributedStore` object: one Rust method per
//! store call, integers in and out. Pointers cross as integers (`addr as usize`), so no
//! `unsafe` is needed here; what they point at is the pool's business (`pool.rs`).
//!
//! # Invariants (the lock-then-GIL order)
//!
//! - `mooncake::client::I1`. A Rust lock is only ever taken *before* entering Python
//!   (`Python::attach`), never inside: a thread holding the GIL never waits on a Rust lock, so no
//!   thread can hold a lock while another holding the GIL waits for it.
//! - `mooncake::client::I2`. Every call holds the `store` read lock for its whole length;
//!   [`StoreClient::close`] takes the write lock, so it waits for calls in flight, and later calls
//!   find `None` (the pybind object must not be used after its `close`).
//! - `mooncake::client::I3`. The GIL is held only to build argument lists and read results: the
//!   batch calls (`batch_is_exist`, `batch_put_from`, `batch_get_into`) release it inside Mooncake
//!   while they wait on the network. `setup`, `register_buffer` and `close` do not; `close` holds
//!   it for about two seconds (it joins the client's threads).
//!
//! # Conversions
//!
//! Keys cross as `bytes`, not `str`: pybind11 reads either into the same `std::string`
//! (a key put as one is found as the other), and a `bytes` object is a copy where a `str`
//! is a validated decode. Per-key answers are read by walking the returned list rather
//! than through the generic sequence extraction. Both run with the GIL held, so chunks
//! of a concurrent probe wait on each other for them. For the 10,624 keys of a
//! 170k-token prompt (`benches/mooncake.rs`, group `pyo3_conversion`, ten runs on a
//! loaded 2-core VM) the key list took 0.84-3.1 ms as `bytes` against 0.97-2.7 ms as
//! `str` (less in nine runs of ten), and the answers 0.10-0.21 ms walked against
//! 0.14-0.37 ms extracted (less in all ten): about 0.3 ms saved per probe, next to
//! 10-20 ms for the call itself.

use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::error::PYTHON_CALL_FAILED;
use super::python::{self, python_error};
use super::reach::{check_metadata_answers, check_reachable};
use super::shared::{SharedLease, SharedMemory};
use super::{MooncakeError, MooncakeSettings};
use crate::pool::PoolError;

/// Why a store call gave no per-key answers.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The client was closed (`mooncake::client::I2`).
    Closed,
    /// The call raised, or answered a list of the wrong length.
    Failed,
}

impl CallError {
    /// The per-key error every key of the call gets.
    pub(crate) fn pool_error(&self) -> PoolError {
        match self {
            Self::Closed => PoolError::Unavailable,
            Self::Failed => PoolError::Backend {
                code: PYTHON_CALL_FAILED,
            },
        }
    }
}

/// One Mooncake Store client, driven through the embedded interpreter.
pub(crate) struct StoreClient {
    /// The Python store object; `None` once closed (`mooncake::client::I2`).
    store: RwLock<Option<Py<PyAny>>>,
    /// A dummy client's shared memory (`shared.rs`); `None` for a client of its own.
    shared: Option<SharedMemory>,
}

impl StoreClient {
    /// Imports the client and runs `setup` with `settings`, or `setup_dummy` when
    /// `settings.real_client_address` names the node's real client (`shared.rs`).
    pub(crate) fn connect(settings: &MooncakeSettings) -> Result<Self, MooncakeError> {
        check_reachable("mooncake.master_address", &settings.master_address)?;
        let dummy = !settings.real_client_address.is_empty();
        if dummy {
            check_reachable("mooncake.real_client_address", &settings.real_client_address)?;
        } else {
            check_metadata_answers(settings)?;
        }
        python::prepare(settings)?;
        let store = Python::attach(|py| -> Result<Py<PyAny>, MooncakeError> {
            let store = py
                .import("mooncake.store")
                .and_then(|module| module.getattr("MooncakeDistributedStore"))
                .and_then(|class| class.call0())
                .map_err(python_error("create MooncakeDistributedStore"))?;
            if dummy {
                setup_dummy(&store, settings)?;
            } else {
                setup(&store, settings)?;
            }
            Ok(store.unbind())
        })?;
        Ok(Self {
            store: RwLock::new(Some(store)),
            shared: dummy.then(|| SharedMemory::new(settings.shared_memory_bytes)),
        })
    }

    /// `len` bytes of a dummy client's shared memory (`alloc_from_mem_pool`), leased for a
    /// staging pool or the fallback buffer; `None` for a client of its own.
    pub(crate) fn lend(&self, len: usize) -> Option<Result<SharedLease, MooncakeError>> {
        let shared = self.shared.as_ref()?;
        let guard = self.store.read(); // `mooncake::client::I1`
        let Some(store) = guard.as_ref() else {
            return Some(Err(MooncakeError::Closed));
        };
        Some(shared.lease(len, |len| {
            Python::attach(|py| {
                let addr: usize = store
                    .bind(py)
                    .call_method1("alloc_from_mem_pool", (len,))?
                    .extract()?;
                Ok((addr != 0).then(|| (addr, store.clone_ref(py))))
            })
            .map_err(python_error("alloc_from_mem_pool"))
        }))
    }

    /// `register_buffer(addr, len)` or `unregister_buffer(addr)`; `Ok` for code 0.
    pub(crate) fn register(
        &self,
        call: &'static str,
        addr: usize,
        len: usize,
    ) -> Result<(), MooncakeError> {
        let guard = self.store.read(); // `mooncake::client::I1`
        let store = guard.as_ref().ok_or(MooncakeError::Closed)?;
        let code: i64 = Python::attach(|py| {
            let store = store.bind(py);
            let answer = if call == "register_buffer" {
                store.call_method1(call, (addr, len))
            } else {
                store.call_method1(call, (addr,))
            };
            answer.and_then(|answer| answer.extract())
        })
        .map_err(python_error(call))?;
        if code == 0 {
            Ok(())
        } else {
            Err(MooncakeError::Register {
                call,
                code,
                addr,
                len,
            })
        }
    }

    /// `batch_is_exist(keys)`: `1` present, `0` absent, negative an error.
    pub(crate) fn batch_is_exist(&self, keys: &[&str]) -> Result<Vec<i64>, CallError> {
        self.call_per_key("batch_is_exist", keys.len(), |py| {
            (key_list(py, keys)?,).into_pyobject(py)
        })
    }

    /// `batch_put_from(keys, addrs, sizes)`: `0` stored, negative an error.
    pub(crate) fn batch_put_from(
        &self,
        keys: &[&str],
        addrs: &[usize],
        sizes: &[usize],
    ) -> Result<Vec<i64>, CallError> {
        self.call_per_key("batch_put_from", keys.len(), |py| {
            (key_list(py, keys)?, addrs, sizes).into_pyobject(py)
        })
    }

    /// `batch_get_into(keys, addrs, sizes)`: bytes read, negative an error.
    pub(crate) fn batch_get_into(
        &self,
        keys: &[&str],
        addrs: &[usize],
        sizes: &[usize],
    ) -> Result<Vec<i64>, CallError> {
        self.call_per_key("batch_get_into", keys.len(), |py| {
            (key_list(py, keys)?, addrs, sizes).into_pyobject(py)
        })
    }

    /// `batch_remove(keys, force=True)`: `0` removed, negative an error.
    pub(crate) fn batch_remove(&self, keys: &[&str]) -> Result<Vec<i64>, CallError> {
        self.call_per_key("batch_remove", keys.len(), |py| {
            (key_list(py, keys)?, true).into_pyobject(py)
        })
    }

    /// `get_size(key)`: the object's bytes, negative an error.
    pub(crate) fn get_size(&self, key: &str) -> Result<i64, CallError> {
        let guard = self.store.read(); // `mooncake::client::I1`
        let store = guard.as_ref().ok_or(CallError::Closed)?;
        Python::attach(|py| {
            store
                .bind(py)
                .call_method1("get_size", (PyBytes::new(py, key.as_bytes()),))
                .and_then(|answer| answer.extract())
                .map_err(|err| log_failure("get_size", &err))
        })
    }

    /// Tears the client down; later calls answer [`CallError::Closed`]. Idempotent.
    /// Blocks for about two seconds with the GIL held (`mooncake::client::I3`).
    pub(crate) fn close(&self) -> Result<(), MooncakeError> {
        let Some(store) = self.store.write().take() else {
            return Ok(());
        };
        if self.shared.as_ref().is_some_and(SharedMemory::leased) {
            // `mooncake::shared::S1`: a staging pool still uses the shared memory.
            tracing::debug!("mooncake dummy client left open: its shared memory is still leased");
            Python::attach(|_py| drop(store));
            return Ok(());
        }
        let code: i64 = Python::attach(|py| {
            let answer = store.bind(py).call_method0("close");
            drop(store);
            answer.and_then(|answer| answer.extract())
        })
        .map_err(python_error("close"))?;
        if code == 0 {
            Ok(())
        } else {
            Err(MooncakeError::Close { code })
        }
    }

    /// Calls `method` with the arguments `args` builds and reads one integer per key.
    fn call_per_key<F>(
        &self,
        method: &'static str,
        keys: usize,
        args: F,
    ) -> Result<Vec<i64>, CallError>
    where
        F: for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
    {
        let guard = self.store.read(); // `mooncake::client::I1`, `mooncake::client::I2`
        let store = guard.as_ref().ok_or(CallError::Closed)?;
        let answers = Python::attach(|py| {
            let args = args(py)?;
            per_key_codes(&store.bind(py).call_method1(method, args)?)
        })
        .map_err(|err| log_failure(method, &err))?;
        if answers.len() == keys {
            Ok(answers)
        } else {
            tracing::warn!(
                method,
                keys,
                answers = answers.len(),
                "mooncake answered the wrong number of results"
            );
            Err(CallError::Failed)
        }
    }
}

/// `setup` of a client of its own, holding a segment.
fn setup(store: &Bound<'_, PyAny>, settings: &MooncakeSettings) -> Result<(), MooncakeError> {
    let code: i64 = store
        .call_method1(
            "setup",
            (
                &settings.local_hostname,
                &settings.metadata_server,
                settings.global_segment_size_bytes,
                settings.local_buffer_size_bytes,
                &settings.protocol,
                &settings.device_name,
                &settings.master_address,
            ),
        )
        .and_then(|answer| answer.extract())
        .map_err(python_error("setup"))?;
    if code == 0 {
        Ok(())
    } else {
        Err(MooncakeError::Setup {
            code,
            master_address: settings.master_address.clone(),
            metadata_server: settings.metadata_server.clone(),
        })
    }
}

/// `setup_dummy` of a dummy client of the node's real client (`shared.rs`).
fn setup_dummy(store: &Bound<'_, PyAny>, settings: &MooncakeSettings) -> Result<(), MooncakeError> {
    let code: i64 = store
        .call_method1(
            "setup_dummy",
            (
                settings.shared_memory_bytes,
                settings.local_buffer_size_bytes,
                &settings.real_client_address,
            ),
        )
        .and_then(|answer| answer.extract())
        .map_err(python_error("setup_dummy"))?;
    if code == 0 {
        Ok(())
    } else {
        Err(MooncakeError::DummySetup {
            code,
            real_client_address: settings.real_client_address.clone(),
            shared_memory_bytes: settings.shared_memory_bytes,
        })
    }
}

/// `keys` as a Python list of `bytes` (module docs, Conversions).
fn key_list<'py>(py: Python<'py>, keys: &[&str]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, keys.iter().map(|key| PyBytes::new(py, key.as_bytes())))
}

/// The integers of a per-key answer: a list walked item by item, anything else through
/// the generic extraction (module docs, Conversions).
fn per_key_codes(answer: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    match answer.cast::<PyList>() {
        Ok(list) => list.iter().map(|code| code.extract::<i64>()).collect(),
        Err(_) => answer.extract(),
    }
}

/// Logs a raised call; its keys get [`PYTHON_CALL_FAILED`].
fn log_failure(method: &'static str, err: &PyErr) -> CallError {
    tracing::warn!(method, error = %err, "mooncake python call raised");
    CallError::Failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cross_as_their_utf8_bytes_in_order() -> PyResult<()> {
        python::ensure_interpreter();
        let keys = ["kvc/m/w1r0/lg0/t32b64/00ff", "", "clé"];
        Python::attach(|py| {
            let list = key_list(py, &keys)?;
            let read: Vec<Vec<u8>> = list
                .iter()
                .map(|item| Ok(item.cast::<PyBytes>()?.as_bytes().to_vec()))
                .collect::<PyResult<_>>()?;
            let expected: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
            assert_eq!(read, expected);
            Ok(())
        })
    }

    #[test]
    fn per_key_codes_read_lists_and_other_sequences_and_refuse_non_integers() -> PyResult<()> {
        python::ensure_interpreter();
        Python::attach(|py| {
            let list = PyList::new(py, [1_i64, 0, -704, 262_144])?;
            assert_eq!(per_key_codes(list.as_any())?, [1, 0, -704, 262_144]);
            let tuple = PyTuple::new(py, [0_i64, -900])?;
            assert_eq!(per_key_codes(tuple.as_any())?, [0, -900]);
            let mixed = PyList::new(py, [PyBytes::new(py, b"x").into_any()])?;
            assert!(per_key_codes(mixed.as_any()).is_err());
            Ok(())
        })
    }
}
