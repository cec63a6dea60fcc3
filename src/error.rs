//! The crate error: one variant per layer, each wrapping that layer's typed error (G10).
//!
//! Layers return their own enums (`LayoutError`, `ConfigError`, ...); code that crosses
//! layers (the CLI, the replay driver, the connector start-up) returns [`Error`], which
//! keeps the layer's error as its `source` and labels it with [`Error::kind`].

use crate::config::ConfigError;
use crate::core::layout::LayoutError;
use crate::core::object::ObjectError;
use crate::gpu::GpuError;
use crate::pool::PoolError;

/// Any error the crate returns to a caller outside one layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Configuration could not be loaded or is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The KV layout is invalid or could not be read.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A device operation failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// A pool operation failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A stored object failed verification.
    #[error(transparent)]
    Object(#[from] ObjectError),
}

impl Error {
    /// A short, stable label for metrics and logs: `layer.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Config(_) => "config",
            Error::Layout(_) => "layout",
            Error::Object(_) => "object",
            Error::Gpu(_) => "gpu",
            Error::Pool(_) => "pool",
        }
    }
}

/// Shorthand for results carrying the crate [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
