//! The configuration of a Python connector: the runtime's layers (defaults < TOML < `KVC_*`
//! environment) with the TOML layer given as a path or a dict.
//!
//! Workflow ([`load`]):
//! 1. `None`: no TOML layer. A `str` / `os.PathLike`: the file, read by the runtime's loader.
//!    A `dict`: converted to TOML (`convert`, C1) and loaded as if it were a file named
//!    `<dict>`.
//! 2. The process environment's `KVC_*` and legacy `TRTLLM_MOONCAKE_STORE_*` variables apply
//!    over it ([`ConfigSources::from_process_env`]; `os.environ` changes are seen).
//! 3. The runtime validates the result; a refusal is a `ConfigError`, a warning (a legacy
//!    variable overridden by its `KVC_*` name) a Python `UserWarning`.
//! 4. `mooncake.venv_dir` left at its default (`.venv`) means the running interpreter's
//!    environment (`sys.prefix`): the Mooncake wheel is installed beside this package.

use std::path::{Path, PathBuf};

use kv_connector::config::{Config, ConfigSources, MooncakeConfig};
use pyo3::exceptions::{PyUserWarning, PyValueError};
use pyo3::prelude::*;

use crate::convert::{fspath, toml_table};
use crate::errors;

/// The effective configuration for `source` (module workflow).
pub fn load(py: Python<'_>, source: Option<&Bound<'_, PyAny>>) -> PyResult<Config> {
    let mut sources = ConfigSources::from_process_env();
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
    let loaded = loaded.map_err(|error| errors::config(&error))?;
    for warning in &loaded.warnings {
        let text = std::ffi::CString::new(warning.to_string()).unwrap_or_default();
        PyErr::warn(py, &py.get_type::<PyUserWarning>(), &text, 1)?;
    }
    let mut config = loaded.config;
    if config.mooncake.venv_dir == MooncakeConfig::default().venv_dir {
        config.mooncake.venv_dir = PathBuf::from(fspath(&py.import("sys")?.getattr("prefix")?)?);
    }
    Ok(config)
}
