//! The configuration of a Python connector: the runtime's layers (defaults < TOML < `KVC_*`
//! environment) with the TOML layer given as a path or a dict.
//!
//! Workflow ([`load`]):
//! 1. `None`: no TOML layer. A `str` / `os.PathLike`: the file, read by the runtime's loader.
//!    A `dict`: converted to TOML (`python::convert::C1`) and loaded as if it were a file named
//!    `<dict>`.
//! 2. The process environment's `KVC_*` and legacy `TRTLLM_MOONCAKE_STORE_*` variables apply
//!    over it ([`ConfigSources::from_process_env`]; `os.environ` changes are seen).
//! 3. The runtime validates the result; a refusal is a `ConfigError`, a warning (a legacy
//!    variable overridden by its `KVC_*` name) a Python `UserWarning`.
//! 4. `mooncake.venv_dir` left at its default (`.venv`) means the running interpreter's
//!    environment (`sys.prefix`): the Mooncake wheel is installed beside this package.
//! 5. Keys the package does not read are refused ([`refuse_unread_keys`]): a
//!    `ConfigError` naming the key and what to use instead, rather than a setting that
//!    silently does nothing.
//!
//! A connector given a `MemoryPool` loads through [`load_for_pool`]: the pool's capacity
//! is one more layer, over the environment, as `pool.capacity_bytes`, so the node memory
//! budget (R9) and the host check count the pool actually used.

use std::path::{Path, PathBuf};

use kv_connector::{Config, ConfigError, ConfigSources, ModelConfig, MooncakeConfig, StatsConfig};
use pyo3::exceptions::{PyUserWarning, PyValueError};
use pyo3::prelude::*;

use crate::convert::{fspath, toml_table};
use crate::errors;

/// The effective configuration for `source` (module workflow).
pub fn load(py: Python<'_>, source: Option<&Bound<'_, PyAny>>) -> PyResult<Config> {
    load_for_pool(py, source, None)
}

/// As [`load`], for a connector given a `MemoryPool` of `pool_capacity_bytes` (module
/// docs); `None` for none.
pub fn load_for_pool(
    py: Python<'_>,
    source: Option<&Bound<'_, PyAny>>,
    pool_capacity_bytes: Option<u64>,
) -> PyResult<Config> {
    let mut sources = ConfigSources::from_process_env();
    if let Some(capacity) = pool_capacity_bytes {
        let layer = ("pool.capacity_bytes".to_owned(), capacity.to_string());
        sources.cli_overrides.push(layer);
    }
    let loaded = match source {
        None => Config::load(&sources),
        Some(value) if value.is_none() => Config::load(&sources),
        Some(value) if value.cast::<pyo3::types::PyDict>().is_ok() => {
            let table = toml_table(value, "config")?;
            let text = toml::to_string(&table)
                .map_err(|error| PyValueError::new_err(format!("config: {error}")))?;
            Config::load_toml_text(&text, Path::new("<dict>"), &sources)
        }
        Some(value) => {
            sources.toml_path = Some(PathBuf::from(fspath(value)?));
            Config::load(&sources)
        }
    };
    let loaded = loaded.map_err(|error| refusal(&error, pool_capacity_bytes))?;
    for warning in &loaded.warnings {
        let text = std::ffi::CString::new(warning.to_string()).unwrap_or_default();
        PyErr::warn(py, &py.get_type::<PyUserWarning>(), &text, 1)?;
    }
    let mut config = loaded.config;
    if config.mooncake.venv_dir == MooncakeConfig::default().venv_dir {
        config.mooncake.venv_dir = PathBuf::from(fspath(&py.import("sys")?.getattr("prefix")?)?);
    }
    refuse_unread_keys(&config)?;
    Ok(config)
}

/// The `ConfigError` of a refused load; a budget refusal says the pool given counted.
fn refusal(error: &ConfigError, pool_capacity_bytes: Option<u64>) -> PyErr {
    match (error, pool_capacity_bytes) {
        (ConfigError::Budget { .. }, Some(capacity)) => errors::raise::<errors::ConfigError>(
            error.kind(),
            format!(
                "the pool given, MemoryPool(capacity_bytes={capacity}), counts as \
                 pool.capacity_bytes: {}",
                errors::message(error)
            ),
        ),
        _ => errors::config(error),
    }
}

/// Refuses keys that parse and validate but that the package never reads (step 5): the
/// layout comes from the `layout` argument, not `[model]`, and no metrics endpoint is
/// served. A key at its default value passes (it asks for nothing).
fn refuse_unread_keys(config: &Config) -> PyResult<()> {
    let model = ModelConfig::default();
    let unread = |key: &str, value: &str, instead: String| {
        Err(errors::raise::<errors::ConfigError>(
            "unread_key",
            format!(
                "{key} = {value:?} is not read by the kv_connector package; leave it out \
                 and {instead}"
            ),
        ))
    };
    let metrics_addr = &config.stats.metrics_addr;
    if *metrics_addr != StatsConfig::default().metrics_addr {
        return unread(
            "stats.metrics_addr",
            metrics_addr,
            "read the counters from conn.stats() (the vLLM connector also reports them to \
             vLLM's Prometheus metrics); the package serves no metrics endpoint"
                .to_owned(),
        );
    }
    if config.model.preset != model.preset {
        let preset = &config.model.preset;
        return unread(
            "model.preset",
            preset,
            format!("give the layout as Connector(layout=kv_connector.Layout.preset({preset:?}))"),
        );
    }
    if let Some(path) = config.model.layout_file() {
        let path = path.display().to_string();
        return unread(
            "model.layout_file",
            &path,
            format!("give the layout as Connector(layout=kv_connector.Layout.from_toml({path:?}))"),
        );
    }
    Ok(())
}
