//! The exception hierarchy of `kv_connector` and the mapping from the runtime's error enums.
//!
//! ```text
//! KvConnectorError            every error the package raises on its own
//!  ├── ConfigError            configuration sources, key segments, values
//!  ├── LayoutError            layouts and the KV cache tensors registered against them
//!  ├── PoolError              the pool: capacity, eviction policy, Mooncake client, staging
//!  └── DeviceError            the device layer: CUDA driver, borrowed pages, staging memory
//! ```
//!
//! Invariants:
//! - `python::errors::E1`. The message is the Rust error's `Display` followed by its `source()`
//!   chain, each joined with `": "`, so nothing the runtime said is lost.
//! - `python::errors::E2`. Every raised exception carries `kind`, the runtime error's stable
//!   `kind()` label (`"unknown_key"`, `"borrowed_overlap"`, ...), or a label of this package.
//! - `python::errors::E3`. Misuse of the Python API itself (a wrong argument type) raises the
//!   built-in `TypeError` / `ValueError`, not these classes.

use std::error::Error as StdError;

use kv_connector::{
    ConfigError as RustConfigError, GpuError, HashError, LayoutError as RustLayoutError,
    PoolError as RustPoolError, StartError,
};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::{create_exception, PyTypeInfo};

create_exception!(
    kv_connector,
    KvConnectorError,
    PyException,
    "Base class of every error kv_connector raises; `kind` holds the runtime's label."
);
create_exception!(
    kv_connector,
    ConfigError,
    KvConnectorError,
    "A configuration source, key segment or value was refused."
);
create_exception!(
    kv_connector,
    LayoutError,
    KvConnectorError,
    "A layout, or a KV cache tensor registered against it, was refused."
);
create_exception!(
    kv_connector,
    PoolError,
    KvConnectorError,
    "The pool (memory or Mooncake) refused or failed."
);
create_exception!(
    kv_connector,
    DeviceError,
    KvConnectorError,
    "The device layer (CUDA driver, borrowed pages, staging memory) refused or failed."
);

/// Adds the exception classes to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("KvConnectorError", py.get_type::<KvConnectorError>())?;
    module.add("ConfigError", py.get_type::<ConfigError>())?;
    module.add("LayoutError", py.get_type::<LayoutError>())?;
    module.add("PoolError", py.get_type::<PoolError>())?;
    module.add("DeviceError", py.get_type::<DeviceError>())?;
    Ok(())
}

/// `error`'s message with its source chain (`python::errors::E1`).
pub fn message(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// An exception of class `T` with `message` and the `kind` attribute (`python::errors::E2`).
pub fn raise<T: PyTypeInfo>(kind: &str, message: String) -> PyErr {
    let error = PyErr::new::<T, _>(message);
    Python::attach(|py| {
        // Setting an attribute on a fresh exception instance cannot fail in practice; if
        // it did, the exception still carries its message.
        let _ = error.value(py).setattr("kind", kind);
    });
    error
}

/// A configuration error.
pub fn config(error: &RustConfigError) -> PyErr {
    raise::<ConfigError>(error.kind(), message(error))
}

/// A layout error.
pub fn layout(error: &RustLayoutError) -> PyErr {
    raise::<LayoutError>(error.kind(), message(error))
}

/// A device-layer error.
pub fn device(error: &GpuError) -> PyErr {
    raise::<DeviceError>(error.kind(), message(error))
}

/// A pool error.
pub fn pool(error: &RustPoolError) -> PyErr {
    raise::<PoolError>(error.kind(), message(error))
}

/// A hashing error (tokens that shrank, a zero block size): a layout matter.
pub fn hash(error: &HashError) -> PyErr {
    raise::<LayoutError>(error.kind(), message(error))
}

/// A Mooncake client error.
#[cfg(feature = "mooncake")]
pub fn mooncake(error: &kv_connector::MooncakeError) -> PyErr {
    raise::<PoolError>(error.kind(), message(error))
}

/// Why a connector did not start, in the class of the layer that refused.
pub fn start(error: &StartError) -> PyErr {
    let text = message(error);
    match error {
        StartError::Layout(inner) => raise::<LayoutError>(inner.kind(), text),
        StartError::Share(_) => raise::<LayoutError>("rank", text),
        StartError::Keys(inner) => raise::<ConfigError>(inner.kind(), text),
        StartError::Gpu(inner) => raise::<DeviceError>(inner.kind(), text),
        StartError::Ledger(inner) => raise::<LayoutError>(inner.kind(), text),
        StartError::RegisterStaging { source, .. } | StartError::LendStaging { source, .. } => {
            raise::<PoolError>(source.kind(), text)
        }
        StartError::Config(inner) => raise::<ConfigError>(inner.kind(), text),
        StartError::CheckpointTokens { .. } => raise::<ConfigError>("checkpoint_tokens", text),
        StartError::StagingSlots { .. } => raise::<ConfigError>("staging_slots", text),
        StartError::StagingAlloc { .. } => raise::<ConfigError>("staging_alloc", text),
        StartError::Thread => raise::<KvConnectorError>("thread", text),
    }
}
