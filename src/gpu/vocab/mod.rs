//! The bottom floor of `gpu`: the shared vocabulary every other floor speaks. Page pools
//! ([`PagePoolSpec`], [`PageGeometry`]), the shape of staging ([`StagingGeometry`]), copy
//! plans ([`PageCopy`], [`CopyRun`], [`plan_copies`], [`coalesce`], [`CopyDirection`], and
//! the strided runs of the CUDA backend's 2D copies), stream ids ([`StreamId`]) and the
//! error, [`GpuError`].
//!
//! Workflow: the front validates what a caller asks for with these types (a geometry when a
//! device opens, a plan per submission) and hands a backend only resolved, bounds-checked
//! values from here (pool indices, [`CopyRun`]s, byte slices).
//!
//! Invariants:
//! - `vocab::W1`. Nothing here owns a resource: no memory, handle, stream or device, and no
//!   `unsafe`; every type is plain data (`Copy` or an owned description), so a plan can be
//!   built, tested and dropped without a device (`error::E1` for the error).
//! - `vocab::W2`. Nothing here imports from `backend` or the front (the module docs of `gpu`;
//!   `tests/gpu_layers.rs` checks it): of the crate, only `core` and this folder.

mod copy;
mod error;
mod pages;
mod staging;
mod stream_id;
#[cfg(any(feature = "cuda", test))]
mod strided;

pub(crate) use copy::locate_page;
#[cfg(feature = "internals")]
pub use copy::coalesce;
pub use copy::{plan_copies, CopyDirection, CopyRun, PageCopy};
pub use error::GpuError;
pub use pages::{PageGeometry, PagePoolSpec};
pub use staging::StagingGeometry;
pub use stream_id::StreamId;
#[cfg(feature = "cuda")]
pub(crate) use strided::strided_runs;
