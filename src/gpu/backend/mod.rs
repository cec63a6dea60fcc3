//! The middle floor of `gpu`: the backends, which own memory and move bytes. The front
//! (`Device`, `CopyStream`, `InFlight`, ...) dispatches to them over closed enums; they
//! speak only the vocabulary (`gpu::vocab`) and never name a front type.
//!
//! - `host`: device pages in heap memory, copies as `memcpy` under per-page locks
//!   (always built); also the non-aborting heap allocation the front's host staging uses.
//! - `cuda` (feature `cuda`): device memory, pinned memory, streams, events and the
//!   checksum kernel over cudarc's driver API, one FFI call per `unsafe` block.
//! - [`host_memory`]: the arena of device-visible host memory that pool objects live in
//!   (heap, or pinned memory of a CUDA context); public as `gpu::host_memory`.
//!
//! Invariants:
//! - `backend::F1`. A backend receives only resolved, bounds-checked work (pool indices,
//!   `CopyRun`s, byte slices the front owns) and reports outcomes as `GpuError`; it holds
//!   no handle of the front, so deciding what an outcome means for the device (poison,
//!   `gpu::I7`) and keeping memory alive until a copy ends (`gpu::I3`) are the front's.
//! - `backend::F2`. Inside this floor the order is `host` and `cuda` (each only the
//!   vocabulary), then `host_memory` (the vocabulary and `cuda`'s pinned memory): `cuda`
//!   and `host` import neither each other nor `host_memory` (`tests/gpu_layers.rs`).

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod host;
pub mod host_memory;
