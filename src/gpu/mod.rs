//! Device memory and copies: page pools per layer group, staging pools, copy streams and
//! completion handles (`docs/DESIGN.md` sections 2 and 7). Two backends sit behind
//! one API: host memory (always built) and CUDA through cudarc (feature `cuda`).
//!
//! # Three floors
//!
//! The files of this folder stand on three floors, and a floor imports only from the
//! floors below it, never from a floor above (cudarc's sys / result / safe layering):
//!
//! ```text
//!  actors (loaders, saver), the pool, the engine simulator
//!      | see only the re-exports below: Device, StagingPool, CopyStream, InFlight, ...
//!      v
//!  top: the front           device.rs (+ device/), staging.rs, lent.rs, stream.rs, event.rs,
//!                           checked.rs, checked_issue.rs, borrowed.rs, select.rs
//!      | owns memory, streams and events; frees them on Drop; validates every address;
//!      | dispatches over closed enums of backends (no trait objects, no downcasts);
//!      | holds the errors that hand resources back (SubmitError, CheckedSubmitError)
//!      v
//!  middle: the backends     backend/host.rs (memcpy under per-page locks, no unsafe but
//!                           borrowed pages), backend/cuda/ (feature `cuda`: cudarc driver
//!                           calls in cuda/driver.rs, one FFI call per `unsafe` block, under
//!                           RAII types), backend/host_memory/ (the pinned host arena)
//!      | own device memory, pinned memory, driver streams and events; speak only the
//!      | vocabulary; know no front type (a CUDA pending copy holds no Device)
//!      v
//!  bottom: the vocabulary   vocab/: PagePoolSpec, PageGeometry, StagingGeometry, PageCopy,
//!                           CopyRun, plan_copies, coalesce, strided runs, StreamId, GpuError
//!        owns nothing: plain data and pure functions, no unsafe
//! ```
//!
//! The rule, as invariants:
//! - `gpu::L1`. A file of `vocab/` imports, of the crate, only `core` and `vocab/`.
//! - `gpu::L2`. A file of `backend/` imports only `core`, `vocab/` and `backend/`; inside
//!   it, `cuda/` and `host.rs` import neither each other nor `host_memory/` (`backend::F2`).
//! - `gpu::L3`. The front imports any floor; nothing of `gpu` imports the crate above `core`.
//!
//! `tests/gpu_layers.rs` reads the sources of this folder and fails on an import that
//! breaks `gpu::L1`-L3 (`use` trees and inline paths alike).
//!
//! # Layer
//!
//! `gpu` sits below `pool` (and below `config`, which uses [`DeviceRequest`] for
//! `device.kind`) and imports nothing of the crate but `core`. The pool's objects live in
//! device-visible host memory, which is this module's [`host_memory`] (the arena and its
//! slots, pinned on CUDA), so a copy stream can DMA them without the pool knowing about
//! devices. The pool uses `host_memory`; nothing here uses the pool.
//!
//! Only this module may contain `unsafe` (the crate root denies it elsewhere), but for the
//! `unsafe impl` of [`LentHostMemory`] by a lender: its promise that memory it maps stays
//! mapped (`lent.rs`; Mooncake's dummy client is the one lender). Host-pinned
//! staging memory ([`StagingPool`]) and device page memory (inside [`Device`]) are distinct
//! types: staging is CPU-readable through slices, pages only through explicit copies.
//!
//! # Workflow
//!
//! 1. Start: `Device::open(request, &[PagePoolSpec { group, page_bytes, num_pages }, ..])`
//!    with the configured [`DeviceRequest`] (`device.kind`: auto, cuda or host), or
//!    `Device::open_host` / `Device::open_cuda` directly; an engine that owns its KV cache
//!    memory (torch tensors) opens one on it with `Device::borrow_host` /
//!    `Device::borrow_cuda` (`borrowed.rs`). The handle is cloned into the engine
//!    simulator, every loader and the saver.
//! 2. Each loader (and the saver) takes one [`StagingPool`] (`device.staging_pool`) and one
//!    [`CopyStream`] (`device.stream`), and owns both by value.
//! 3. A load: the pool transport fills staging slots, the loader verifies headers, then
//!    `stream.scatter(staging, &copies)` returns an [`InFlight`]; the loader's completion
//!    thread calls `wait()`, gets the staging pool back and reports the outcome (R24, R25).
//! 4. A save: `stream.gather(staging, &copies)`, wait, then the saver puts the slots.
//! 5. The engine reads and writes pages directly with `write_page` / `read_page`.
//!
//! # Ownership rules
//!
//! - [`Device`] is `Clone + Send + Sync` (an `Arc`); clones share the same pages.
//! - [`StagingPool`] and [`CopyStream`] are not `Clone` and have one owner each: one loader
//!   or the saver. No `Arc<Mutex<..>>` around them.
//! - Submitting a copy moves the staging pool into the [`InFlight`]; `wait` moves it back,
//!   and a rejected submission returns it inside [`SubmitError`].
//!
//! # Invariants
//!
//! - `gpu::I1`. Every page access and every copy is bounds-checked against the device's
//!   [`PageGeometry`] and the pool's [`StagingGeometry`] before any byte moves.
//! - `gpu::I2`. Different pages may be read and written from any threads at once. On the host
//!   backend each page has its own lock, so accesses to one page are serialized. On CUDA
//!   the caller must not target one page from two places at once; the reservation protocol
//!   (engine, loaders, saver) guarantees that.
//! - `gpu::I3`. Nobody touches staging memory while a copy reads or writes it: the pool is owned by
//!   the [`InFlight`] until `wait` returns it, and an `InFlight` dropped without waiting
//!   finishes its copy before the memory is freed.
//! - `gpu::I4`. A submission is validated as a whole; a rejected submission moves no bytes and
//!   hands the staging pool back untouched.
//! - `gpu::I5`. The destinations of one submission are disjoint, so its copies may be coalesced
//!   and reordered ([`plan_copies`]) without changing the bytes moved.
//! - `gpu::I6`. A copy that fails reports [`GpuError::CopyFailed`] from `wait`, and its destination
//!   must be treated as not written. The host backend moves no byte of a failed copy (the
//!   destination keeps its old contents); CUDA may leave it partly written (the error is
//!   then `CudaCopyFailed`). A loader reports such a load as failed and never as computed
//!   (R25).
//! - `gpu::I7`. [`Device::poison`] marks the device unusable after an unrecoverable error; from
//!   then on every call that starts device work fails with [`GpuError::Poisoned`]. Poison is never
//!   cleared (fjall's `PoisonDart`). On CUDA the front poisons by itself when a driver call or a
//!   wait reports a sticky error ([`GpuError::is_sticky`]); the backend only reports it.
//! - `gpu::I8`. `InFlight::wait` blocks; it runs on a loader's own completion thread or in
//!   `spawn_blocking`, never on a shared arbiter.
//!
//! # Test aid
//!
//! `Device::inject_copy_failures` (test builds and feature `faults` only) makes the next N
//! submissions fail, on either backend, so tests can show that a failed copy becomes a
//! failed load.
//!
//! # CUDA specifics
//!
//! - Context: the device's primary context is retained once per `Device` and made current
//!   on the calling thread at the start of every backend call, so loader threads, the
//!   saver and the engine thread need no setup.
//! - Memory: one `cuMemAlloc` per page pool; staging is `cuMemHostAlloc` with flags 0
//!   (pinned and cached, never write-combined, since the CPU reads staging).
//! - Copies: one non-blocking stream per [`CopyStream`]; one `cuMemcpy*Async` per planned
//!   run; an event (`BLOCKING_SYNC | DISABLE_TIMING`) after each submission, which
//!   [`InFlight::wait`] synchronizes on the waiting thread.

#![deny(missing_docs)]

// Bottom floor: the vocabulary.
mod vocab;

// Middle floor: the backends.
mod backend;

// Top floor: the front.
mod borrowed;
mod checked;
mod checked_issue;
mod device;
mod event;
mod lent;
mod select;
mod staging;
mod stream;

pub use backend::host_memory;
pub use borrowed::BorrowedPages;
pub use checked::CheckedInFlight;
pub use device::Device;
pub use lent::LentHostMemory;
pub use select::DeviceRequest;
pub use staging::StagingPool;
pub use stream::CopyStream;
pub use vocab::{GpuError, PageCopy, PagePoolSpec, StagingGeometry};
// What the crate's own tests and benches reach below the front.
#[cfg(feature = "internals")]
pub use {
    borrowed::PageOwner,
    checked::{CheckedSubmitError, HostSide, HostTarget, ResolvedCopy},
    device::DeviceKind,
    event::InFlight,
    select::cuda_devices,
    stream::{StreamCounters, SubmitError},
    vocab::{coalesce, plan_copies, CopyDirection, CopyRun, PageGeometry, StreamId},
};
