//! `kv_connector._native`: the Python extension of kv-connector (R31). Engines written in
//! Python embed the runtime through it; the pure-Python package `kv_connector` re-exports
//! everything here and adds nothing but type stubs and an exit hook.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `connector` | `Connector`: the engine hooks over `ConnectorHandle`; threads and the GIL |
//! | `tensors` | KV cache tensors: the registration rules and the one `unsafe` call |
//! | `layout` | `Layout`: from a dict, a TOML file or a preset |
//! | `config` | the configuration layers (defaults < TOML path or dict < `KVC_*`) |
//! | `check` | `load_config`: the effective configuration, validated without a connector |
//! | `logs` | the runtime's log records queued for `forward_logs` (no GIL on logging threads) |
//! | `pool` | `MemoryPool` and the pool a connector gets from its configuration |
//! | `step` | `StepRequest`: one request of one engine step |
//! | `stats` | the statistics as a dict |
//! | `errors` | the exception hierarchy |
//! | `convert` | Python values to TOML, JSON values to Python, integer sequences |
//!
//! The extension runs in its host interpreter and does not link libpython (maturin builds
//! it with `PYO3_BUILD_EXTENSION_MODULE`); one abi3 wheel serves Python 3.10 and later.

#![deny(unsafe_code)]

mod check;
mod config;
mod connector;
mod convert;
mod errors;
mod layout;
mod logs;
mod pool;
mod stats;
mod step;
mod tensors;

use pyo3::prelude::*;

/// The cargo features this extension was built with (`faults` adds the test hooks).
const FEATURES: &[&str] = &[
    #[cfg(feature = "mooncake")]
    "mooncake",
    #[cfg(feature = "cuda")]
    "cuda",
    #[cfg(feature = "faults")]
    "faults",
];

/// Sends the runtime's log lines (`tracing`, filtered by `RUST_LOG`, warnings and errors
/// without it) to stderr as text or, with `json=True`, JSON lines. Call it once; a second
/// call raises `KvConnectorError`.
#[pyfunction]
#[pyo3(signature = (json = false))]
fn init_logging(json: bool) -> PyResult<()> {
    let format = if json {
        kv_connector::logging::LogFormat::Json
    } else {
        kv_connector::logging::LogFormat::Text
    };
    kv_connector::logging::init(format).map_err(|error| {
        errors::raise::<errors::KvConnectorError>(error.kind(), errors::message(&error))
    })
}

/// The extension module.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<layout::PyLayout>()?;
    module.add_class::<pool::PyMemoryPool>()?;
    module.add_class::<connector::PyConnector>()?;
    module.add_class::<step::PyStepRequest>()?;
    module.add_function(wrap_pyfunction!(init_logging, module)?)?;
    module.add_function(wrap_pyfunction!(connector::shutdown_all, module)?)?;
    module.add_function(wrap_pyfunction!(check::load_config, module)?)?;
    logs::register(module)?;
    module.add("FEATURES", FEATURES.to_vec())?;
    module.add("COUNTERS", stats::counters(module.py())?)?;
    module.add("METRIC_FAMILIES", stats::metric_families(module.py())?)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(module)?;
    Ok(())
}
