//! The crate error: one variant per layer, each wrapping that layer's typed error (G10).
//!
//! Layers return their own enums (`LayoutError`, `ConfigError`, ...); code that crosses
//! layers (the CLI, the replay driver, the connector start-up) returns [`Error`], which
//! keeps the layer's error as its `source` and labels it with [`Error::kind`].

use crate::config::ConfigError;
use crate::connector::StartError;
use crate::core::hash::HashError;
use crate::core::keys::KeyError;
use crate::core::layout::LayoutError;
use crate::core::ledger::LedgerError;
use crate::core::object::ObjectError;
use crate::core::planner::PlanError;
use crate::gpu::GpuError;
use crate::pool::PoolError;
use crate::replay::workload::{GenerateError, TraceError};

/// Any error the crate returns to a caller outside one layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Configuration could not be loaded or is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The KV layout is invalid or could not be read.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Hashing refused its input.
    #[error(transparent)]
    Hash(#[from] HashError),
    /// A pool key could not be built.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// The lookup planner refused a request or an answer.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The reservation ledger refused an operation.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// A device operation failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// A pool operation failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A stored object failed verification.
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// The connector could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A trace file is malformed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// Generator parameters are invalid.
    #[error(transparent)]
    Generate(#[from] GenerateError),
}

impl Error {
    /// A short, stable label for metrics and logs: the layer.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Config(_) => "config",
            Error::Layout(_) => "layout",
            Error::Hash(_) => "hash",
            Error::Keys(_) => "keys",
            Error::Plan(_) => "plan",
            Error::Ledger(_) => "ledger",
            Error::Gpu(_) => "gpu",
            Error::Pool(_) => "pool",
            Error::Object(_) => "object",
            Error::Start(_) => "start",
            Error::Trace(_) => "trace",
            Error::Generate(_) => "generate",
        }
    }
}

/// Shorthand for results carrying the crate [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
