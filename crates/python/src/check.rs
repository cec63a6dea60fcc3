//! `kv_connector.load_config`: the effective configuration a `Connector` would start
//! with, validated as it would be, without starting one: for embedders (the vLLM connector
//! among them) that check their settings before the engine loads its weights.
//!
//! Workflow:
//! 1. The configuration layers of `config` (`None`, a TOML path or a dict) and the `KVC_*`
//!    environment load and validate exactly as `Connector(config=...)` does
//!    (`crate::config::load`), with the same `ConfigError`s and warnings.
//! 2. `model_key` and `namespace`, given as a `Connector`'s arguments would be, replace
//!    `keys.model_key` and `keys.namespace` and the result is validated again, so a key
//!    segment the runtime refuses is a `ConfigError` naming that key.
//! 3. The result is returned as a dict of the TOML tree, every section and key present.

use pyo3::prelude::*;

use crate::config;
use crate::convert::to_py;
use crate::errors;

/// The effective configuration of a `Connector(config=config, model_key=model_key,
/// namespace=namespace)` as a dict of the TOML tree (module workflow). Raises the
/// `ConfigError` that connector would raise for its configuration.
///
/// # Errors
///
/// `ConfigError` for an unreadable or malformed file, an unknown key or a refused value;
/// `TypeError` / `ValueError` for a `config` that is neither a path nor a dict.
#[pyfunction]
#[pyo3(signature = (config = None, *, model_key = None, namespace = None))]
pub fn load_config<'py>(
    py: Python<'py>,
    config: Option<&Bound<'py, PyAny>>,
    model_key: Option<String>,
    namespace: Option<String>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut loaded = config::load(py, config)?;
    if model_key.is_some() || namespace.is_some() {
        if let Some(model_key) = model_key {
            loaded.keys.model_key = model_key;
        }
        if let Some(namespace) = namespace {
            loaded.keys.namespace = namespace;
        }
        loaded.validate().map_err(|error| errors::config(&error))?;
    }
    to_py(py, &loaded)
}
