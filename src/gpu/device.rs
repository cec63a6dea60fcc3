//! The device handle: page memory per layer group, the factory for staging pools and copy
//! streams, engine-side page access, and the poison flag.
//!
//! Workflow:
//! 1. At start, `Device::open(request, specs)` (select.rs) picks a backend, or a caller
//!    names one with [`Device::open_host`] / [`Device::open_cuda`]; every group's pages are
//!    allocated, zeroed; the handle is cloned into the engine simulator, each loader and
//!    the saver.
//! 2. Each loader and the saver asks for its own [`StagingPool`] and [`CopyStream`].
//! 3. The engine writes and reads pages directly with [`Device::write_page`] /
//!    [`Device::read_page`]; loaders and the saver move pages only through their stream.
//!
//! `Device` is a cheap `Clone` (an `Arc`); it is `Send + Sync`. Dispatch is a closed enum
//! over backends, so CUDA is a variant and a match arm, never a trait object.
//! On CUDA, every call makes the device's primary context current on the calling thread
//! first, so callers on any thread need no setup.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use crate::core::layout::GroupId;

#[cfg(feature = "cuda")]
use super::backend::cuda::CudaDevice;
use super::backend::host::HostDevice;
use super::backend::host_memory::HostArena;
use super::borrowed::PageOwner;
use super::lent::{LentBuffer, LentHostMemory};
use super::staging::StagingPool;
use super::stream::{CopyStream, StreamBackend};
use super::vocab::{GpuError, PageGeometry, PagePoolSpec, StagingGeometry, StreamId};

/// Which backend a device runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceKind {
    /// Pages in host memory; copies are `memcpy` and complete at once.
    Host,
    /// Pages in CUDA device memory; copies are asynchronous DMA on CUDA streams (only
    /// with the `cuda` feature).
    Cuda,
}

impl DeviceKind {
    /// A short, stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Cuda => "cuda",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The backend behind a device.
#[derive(Debug)]
pub(crate) enum Backend {
    Host(HostDevice),
    #[cfg(feature = "cuda")]
    Cuda(CudaDevice),
}

/// State shared by every clone of a [`Device`].
struct Shared {
    geometry: PageGeometry,
    backend: Backend,
    /// Set once by [`Device::poison`], never cleared (`gpu::I7`).
    poisoned: AtomicBool,
    /// Source of [`StreamId`]s, so log lines can tell streams apart.
    next_stream: AtomicU32,
    /// Submissions still to fail, set by [`Device::inject_copy_failures`] (`host::H3`).
    pending_copy_failures: AtomicU32,
    /// What keeps borrowed page memory alive (`borrowed.rs`); `None` for owned pages.
    /// Declared last so it drops after the backend (B4).
    owner: Option<PageOwner>,
}

/// A handle to one device's page memory. Clones share the same memory.
#[derive(Clone)]
pub struct Device {
    shared: Arc<Shared>,
}

impl Device {
    /// Opens a host-memory device with one zeroed page pool per spec.
    ///
    /// # Errors
    /// The spec errors of [`PageGeometry::new`]: no pools, a duplicate group, an empty pool,
    /// or a pool too large to address; [`GpuError::HostAllocFailed`] when the heap refuses
    /// the pages.
    pub fn open_host(specs: &[PagePoolSpec]) -> Result<Self, GpuError> {
        let geometry = PageGeometry::new(specs)?;
        let backend = Backend::Host(HostDevice::new(&geometry)?);
        Ok(Self::from_parts(geometry, backend))
    }

    /// Opens CUDA device `ordinal` (its primary context) with one zeroed page pool per spec,
    /// each one device allocation of `num_pages * page_bytes`.
    ///
    /// # Errors
    /// The spec errors of [`PageGeometry::new`]; [`GpuError::CudaNotBuilt`] without the
    /// `cuda` feature; [`GpuError::CudaDriverMissing`] when `libcuda` does not load;
    /// `GpuError::CudaInit`, [`GpuError::CudaNoDevice`], or `GpuError::Driver` (e.g. out
    /// of device memory).
    pub fn open_cuda(ordinal: u32, specs: &[PagePoolSpec]) -> Result<Self, GpuError> {
        let geometry = PageGeometry::new(specs)?;
        #[cfg(feature = "cuda")]
        {
            let backend = Backend::Cuda(CudaDevice::open(ordinal, &geometry)?);
            Ok(Self::from_parts(geometry, backend))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (ordinal, geometry);
            Err(GpuError::CudaNotBuilt)
        }
    }

    fn from_parts(geometry: PageGeometry, backend: Backend) -> Self {
        Self::with_owner(geometry, backend, None)
    }

    /// A device on borrowed page memory that `owner` keeps alive (`borrowed.rs`, B4).
    pub(super) fn from_borrowed(
        geometry: PageGeometry,
        backend: Backend,
        owner: PageOwner,
    ) -> Self {
        Self::with_owner(geometry, backend, Some(owner))
    }

    fn with_owner(geometry: PageGeometry, backend: Backend, owner: Option<PageOwner>) -> Self {
        Self {
            shared: Arc::new(Shared {
                geometry,
                backend,
                poisoned: AtomicBool::new(false),
                next_stream: AtomicU32::new(0),
                pending_copy_failures: AtomicU32::new(0),
                owner,
            }),
        }
    }

    /// Whether the pages are memory the caller owns ([`Device::borrow_host`],
    /// [`Device::borrow_cuda`]).
    pub fn is_borrowed(&self) -> bool {
        self.shared.owner.is_some()
    }

    /// The backend this device runs on.
    pub fn kind(&self) -> DeviceKind {
        match self.shared.backend {
            Backend::Host(_) => DeviceKind::Host,
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => DeviceKind::Cuda,
        }
    }

    /// The CUDA device ordinal; `None` on the host backend.
    pub fn cuda_ordinal(&self) -> Option<u32> {
        match &self.shared.backend {
            Backend::Host(_) => None,
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => Some(cuda.ordinal()),
        }
    }

    /// The device's page pools.
    pub fn geometry(&self) -> &PageGeometry {
        &self.shared.geometry
    }

    /// The page pool of `group`.
    ///
    /// # Errors
    /// [`GpuError::UnknownGroup`] if the device has no pool for `group`.
    pub fn page_pool(&self, group: GroupId) -> Result<PagePoolSpec, GpuError> {
        self.shared.geometry.pool(group)
    }

    /// Overwrites page `page` of `group` with `bytes` (engine side: the simulator computing
    /// KV). On CUDA this is a synchronous copy: the bytes are on the device on return.
    ///
    /// # Errors
    /// [`GpuError::Poisoned`], [`GpuError::UnknownGroup`], [`GpuError::PageOutOfRange`],
    /// [`GpuError::LengthMismatch`] unless `bytes` is exactly one page; on CUDA
    /// `GpuError::Driver` (a sticky one poisons the device).
    pub fn write_page(&self, group: GroupId, page: u32, bytes: &[u8]) -> Result<(), GpuError> {
        let pool = self.check_page_buffer(group, page, bytes.len())?;
        match &self.shared.backend {
            Backend::Host(host) => {
                host.write_page(pool, page, bytes);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => self.poison_if_sticky(cuda.write_page(pool, page, bytes)),
        }
    }

    /// Copies page `page` of `group` into `out` (engine side: the replay page check).
    ///
    /// # Errors
    /// As [`write_page`](Self::write_page), with `out` as the buffer.
    pub fn read_page(&self, group: GroupId, page: u32, out: &mut [u8]) -> Result<(), GpuError> {
        let pool = self.check_page_buffer(group, page, out.len())?;
        match &self.shared.backend {
            Backend::Host(host) => {
                host.read_page(pool, page, out);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => self.poison_if_sticky(cuda.read_page(pool, page, out)),
        }
    }

    /// Page `page` of `group` as a new vector.
    ///
    /// # Errors
    /// As [`read_page`](Self::read_page).
    pub fn read_page_to_vec(&self, group: GroupId, page: u32) -> Result<Vec<u8>, GpuError> {
        let mut out = vec![0; self.page_pool(group)?.page_bytes];
        self.read_page(group, page, &mut out)?;
        Ok(out)
    }

    /// A new zeroed staging pool of `slots` slots of `slot_bytes` each, for one loader or
    /// the saver (pinned, cached host memory on CUDA).
    ///
    /// # Errors
    /// [`GpuError::Poisoned`], [`GpuError::EmptyStagingPool`], [`GpuError::SizeOverflow`];
    /// on CUDA `GpuError::Driver` when pinned memory runs out.
    pub fn staging_pool(&self, slot_bytes: usize, slots: u32) -> Result<StagingPool, GpuError> {
        self.ensure_usable()?;
        let geometry = StagingGeometry::new(slot_bytes, slots)?;
        match &self.shared.backend {
            Backend::Host(_) => StagingPool::new_host(geometry),
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => {
                let pinned = self.poison_if_sticky(cuda.pinned(geometry.total_bytes()))?;
                Ok(StagingPool::new_pinned(geometry, pinned))
            }
        }
    }

    /// A staging pool of `slots` slots of `slot_bytes` in memory a pool's client lends
    /// (`gpu::lent`), page-locked for this device's copies on CUDA.
    ///
    /// # Errors
    /// [`GpuError::HostAllocFailed`] when the lease is smaller than the pool or has no
    /// address; [`GpuError::Poisoned`]; on CUDA `GpuError::Driver` from `cuMemHostRegister`.
    pub fn staging_pool_lent(
        &self,
        slot_bytes: usize,
        slots: u32,
        lease: Box<dyn LentHostMemory>,
    ) -> Result<StagingPool, GpuError> {
        self.ensure_usable()?;
        let geometry = StagingGeometry::new(slot_bytes, slots)?;
        #[cfg_attr(not(feature = "cuda"), expect(unused_mut, reason = "registered only on CUDA"))]
        let mut memory =
            LentBuffer::take(lease, geometry.total_bytes(), "staging pool in lent memory")?;
        #[cfg(feature = "cuda")]
        if let Backend::Cuda(cuda) = &self.shared.backend {
            self.poison_if_sticky(memory.register_with(cuda))?;
        }
        Ok(StagingPool::new_lent(geometry, memory))
    }

    /// A new arena of host memory for pool objects that this device's copies can DMA from
    /// and into without staging: pinned, cached memory of this device's context on CUDA
    /// (which the arena keeps alive), [`HostArena::heap`] on the host backend. Each call
    /// makes a new arena; make one per pool and clone it.
    pub fn host_arena(&self) -> HostArena {
        match &self.shared.backend {
            Backend::Host(_) => HostArena::heap(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => HostArena::pinned(cuda.context()),
        }
    }

    /// A new copy stream, for one loader or the saver (a non-blocking stream on CUDA).
    ///
    /// # Errors
    /// [`GpuError::Poisoned`]; on CUDA `GpuError::Driver` from stream creation.
    pub fn stream(&self) -> Result<CopyStream, GpuError> {
        self.ensure_usable()?;
        let backend = match &self.shared.backend {
            Backend::Host(_) => StreamBackend::Host,
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => StreamBackend::Cuda(self.poison_if_sticky(cuda.stream())?),
        };
        let id = StreamId(self.shared.next_stream.fetch_add(1, Ordering::Relaxed));
        Ok(CopyStream::new(id, self.clone(), backend))
    }

    /// Test aid: the next `copies` submissions (each `scatter` or `gather` call that passes
    /// validation) fail, on any stream of this device, on either backend. A failed
    /// submission moves no bytes, and its `InFlight::wait` reports [`GpuError::CopyFailed`]
    /// (`gpu::I6`). Calls add up.
    ///
    /// Meant for tests that show a failed copy becomes a failed load (R25); built only for
    /// tests and with the `faults` feature, production code never calls it.
    #[cfg(any(test, feature = "faults"))]
    pub fn inject_copy_failures(&self, copies: u32) {
        self.shared
            .pending_copy_failures
            .fetch_add(copies, Ordering::Relaxed);
    }

    /// Marks the device unusable after an unrecoverable error (for CUDA, a sticky context
    /// error, which the device detects by itself in what the backend reports). Every later
    /// call that starts device work fails with [`GpuError::Poisoned`] (`gpu::I7`). Copies
    /// already issued still complete or fail on their own.
    pub fn poison(&self) {
        if !self.shared.poisoned.swap(true, Ordering::AcqRel) {
            tracing::error!(device = %self.kind(), "device poisoned; all new device work is rejected");
        }
    }

    /// Whether [`poison`](Self::poison) was called.
    pub fn is_poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::Acquire)
    }

    /// Fails with [`GpuError::Poisoned`] once the device is poisoned (`gpu::I7`).
    pub(crate) fn ensure_usable(&self) -> Result<(), GpuError> {
        if self.is_poisoned() {
            return Err(GpuError::Poisoned);
        }
        Ok(())
    }

    /// Poisons the device when `result` is a sticky driver error (`gpu::I7`); passes it through.
    #[cfg(feature = "cuda")]
    pub(crate) fn poison_if_sticky<T>(&self, result: Result<T, GpuError>) -> Result<T, GpuError> {
        if let Err(error) = &result {
            if error.is_sticky() {
                self.poison();
            }
        }
        result
    }

    /// Consumes one injected failure, if any is pending (`host::H3`).
    pub(crate) fn take_copy_failure(&self) -> bool {
        self.shared
            .pending_copy_failures
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// The backend, for the checked submissions of `checked_issue.rs`.
    pub(crate) fn backend(&self) -> &Backend {
        &self.shared.backend
    }

    /// Checks poison, the page address and the buffer length; returns the pool index.
    fn check_page_buffer(&self, group: GroupId, page: u32, len: usize) -> Result<usize, GpuError> {
        self.ensure_usable()?;
        let (pool, spec) = self.shared.geometry.locate(group, page)?;
        if len != spec.page_bytes {
            return Err(GpuError::LengthMismatch {
                group,
                page,
                expected: spec.page_bytes,
                actual: len,
            });
        }
        Ok(pool)
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("kind", &self.kind())
            .field("cuda_ordinal", &self.cuda_ordinal())
            .field("pools", &self.shared.geometry.pools())
            .field("borrowed", &self.is_borrowed())
            .field("poisoned", &self.is_poisoned())
            .finish()
    }
}

mod issue;
#[cfg(test)]
mod tests;
