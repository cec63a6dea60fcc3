//! The CUDA backend (feature `cuda`): device page memory, pinned staging, streams and
//! events over the CUDA driver API through cudarc, behind the same `Device` /
//! `StagingPool` / `CopyStream` / `InFlight` API as the host backend.
//!
//! It sits on the middle floor of `gpu` and speaks only the vocabulary (`gpu::vocab`: page
//! geometry, copy runs, stream ids, `GpuError`): it never names `Device`, `CopyStream` or
//! any other front type, and it holds no device handle. What the front must do with an
//! outcome (poison on a sticky error, keep page memory alive until a copy ends) the front
//! does itself (`cuda::queue::Q3`).
//!
//! ```text
//!  Device, StagingPool, CopyStream, InFlight   (the front: safe API, closed enums over backends)
//!      v
//!  CudaDevice (this file)      one DeviceRegion per page pool, an engine stream
//!  checked.rs                  checked submissions: page copies, 2D copies, checksum kernel
//!  context.rs                  primary context retain, current on each entry (`cuda::context::X2`)
//!  memory.rs                   DeviceRegion (cuMemAlloc), PinnedBuffer (cuMemHostAlloc 0),
//!                              HostRegistration (cuMemHostRegister 0)
//!  kernel.rs                   the page checksum kernel and its scratch
//!  queue.rs                    CudaStream, CudaEvent, PendingCopy
//!      v
//!  driver.rs                   one driver call per `unsafe` block, each with SAFETY
//! ```
//!
//! Workflow:
//! 1. `Device::open_cuda(ordinal, specs)` probes the driver (library present first, then
//!    `cuInit`, then a device count), retains the device's primary context and allocates
//!    one zeroed region of `num_pages * page_bytes` per page pool ([`CudaDevice::open`]).
//! 2. `Device::staging_pool` allocates pinned, cached memory; `Device::stream` creates a
//!    non-blocking stream per loader and for the saver.
//! 3. `scatter` / `gather` plan runs with `plan_copies`, then [`CudaDevice::issue`] queues
//!    one `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` per run and records an event; the
//!    `InFlight` waits on that event on the waiter's own thread.
//! 4. The engine's `write_page` / `read_page` copy on a device-internal stream and
//!    synchronize it before returning, so a page written by the engine is on the device
//!    before any loader or saver stream can see it.
//!
//! Invariants:
//! - `cuda::K1`. Regions are in [`PageGeometry::pools`] order, so a pool index from the geometry
//!   indexes `regions`; every offset is bounds-checked by the caller (`gpu::I1`).
//! - `cuda::K2`. A submission is queued as a whole or not at all from the caller's view: if
//!   queueing a run fails, the stream is synchronized before the staging pool is handed back with
//!   the error, so no queued run still touches it (`gpu::I3`, `gpu::I6`).
//! - `cuda::K3`. The context is made current at the start of every entry point
//!   (`cuda::context::X2`).

#![deny(unsafe_op_in_unsafe_fn)]

mod checked;
mod context;
mod driver;
mod kernel;
mod memory;
mod queue;

use std::sync::Arc;

pub(crate) use checked::HostCopy;
pub(crate) use context::{probe, Context};
pub(crate) use kernel::ChecksumScratch;
pub(crate) use memory::{HostRegistration, PinnedBuffer};
pub(crate) use queue::{CudaEvent, CudaStream, PendingCopy};

use self::kernel::ChecksumKernel;
use self::memory::DeviceRegion;
use crate::gpu::vocab::{CopyDirection, CopyRun, GpuError, PageGeometry};

/// Page memory of every group on one CUDA device, plus the engine's copy stream.
#[derive(Debug)]
pub(crate) struct CudaDevice {
    context: Arc<Context>,
    /// In the order of [`PageGeometry::pools`] (`cuda::K1`).
    regions: Vec<DeviceRegion>,
    /// Carries `write_page` / `read_page`; synchronized by each of them (workflow step 4).
    engine_stream: CudaStream,
    /// The page checksum kernel of checked submissions (`kernel.rs`).
    kernel: ChecksumKernel,
    /// Scratch of finished checked submissions, reused by the next ones (`kernel::I2`).
    scratch: parking_lot::Mutex<Vec<ChecksumScratch>>,
}

/// Scratches kept for reuse; more in flight at once are allocated and freed.
const SPARE_SCRATCHES: usize = 32;

impl CudaDevice {
    /// Retains device `ordinal`'s primary context and allocates zeroed page memory for every
    /// pool of `geometry`.
    ///
    /// # Errors
    /// [`GpuError::CudaDriverMissing`], [`GpuError::CudaInit`], [`GpuError::CudaNoDevice`],
    /// or [`GpuError::Driver`] (e.g. out of device memory).
    pub(crate) fn open(ordinal: u32, geometry: &PageGeometry) -> Result<Self, GpuError> {
        check_page_alignment(geometry)?;
        let context = Arc::new(Context::retain(ordinal)?);
        let regions = geometry
            .pools()
            .iter()
            .map(|spec| DeviceRegion::zeroed(Arc::clone(&context), spec))
            .collect::<Result<Vec<_>, _>>()?;
        Self::with_regions(context, regions)
    }

    /// Retains device `ordinal`'s primary context and uses the caller's device memory as
    /// page pools: pool `i` of `geometry` at `bases[i]` (`Device::borrow_cuda`). Checks
    /// that every base is memory of that device (B3).
    ///
    /// # Safety
    /// Every `bases[i]..bases[i] + pool bytes` is device memory of device `ordinal`,
    /// allocated while the device lives (`Device::borrow_cuda`'s contract).
    ///
    /// # Errors
    /// As [`open`](Self::open); [`GpuError::BorrowedWrongDevice`] for memory of another
    /// device; [`GpuError::Driver`] when the driver does not know an address.
    pub(crate) unsafe fn borrow(
        ordinal: u32,
        geometry: &PageGeometry,
        bases: &[u64],
    ) -> Result<Self, GpuError> {
        check_page_alignment(geometry)?;
        let context = Arc::new(Context::retain(ordinal)?);
        let mut regions = Vec::with_capacity(bases.len());
        for (spec, &base) in geometry.pools().iter().zip(bases) {
            let actual = driver::pointer_device_ordinal(base)
                .map_err(GpuError::driver("cuPointerGetAttribute"))?;
            if i64::from(actual) != i64::from(ordinal) {
                return Err(GpuError::BorrowedWrongDevice {
                    group: spec.group,
                    base,
                    expected: ordinal,
                    actual: i64::from(actual),
                });
            }
            // SAFETY: device memory of `ordinal` (checked just above for its base; the
            // caller's contract for the rest), allocated while the device lives.
            regions.push(unsafe { DeviceRegion::borrowed(Arc::clone(&context), base, spec) });
        }
        Self::with_regions(context, regions)
    }

    /// The engine stream, the checksum kernel and the scratch list around `regions`.
    fn with_regions(context: Arc<Context>, regions: Vec<DeviceRegion>) -> Result<Self, GpuError> {
        let engine_stream = CudaStream::create(Arc::clone(&context))?;
        let kernel = ChecksumKernel::load(Arc::clone(&context))?;
        Ok(Self {
            context,
            regions,
            engine_stream,
            kernel,
            scratch: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// The retained context, for memory that outlives this device value (host arenas).
    pub(crate) fn context(&self) -> Arc<Context> {
        Arc::clone(&self.context)
    }

    /// The device's ordinal.
    pub(crate) fn ordinal(&self) -> u32 {
        self.context.ordinal()
    }

    /// Pinned, zeroed staging memory of `len` bytes.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuMemHostAlloc`.
    pub(crate) fn pinned(&self, len: usize) -> Result<PinnedBuffer, GpuError> {
        PinnedBuffer::zeroed(Arc::clone(&self.context), len)
    }

    /// Page-locks `len` bytes at `ptr`, allocated elsewhere, for this device's copies.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuMemHostRegister`.
    pub(crate) fn register_host(&self, ptr: *mut u8, len: usize) -> Result<HostRegistration, GpuError> {
        HostRegistration::register(Arc::clone(&self.context), ptr, len)
    }

    /// A new non-blocking stream.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuStreamCreate`.
    pub(crate) fn stream(&self) -> Result<CudaStream, GpuError> {
        CudaStream::create(Arc::clone(&self.context))
    }

    /// Overwrites page `page` of pool `pool` with `bytes` (one page) and waits until they
    /// are on the device. The caller checked the page and the length (`cuda::K1`).
    ///
    /// # Errors
    /// [`GpuError::Driver`] from the copy or the synchronize.
    pub(crate) fn write_page(&self, pool: usize, page: u32, bytes: &[u8]) -> Result<(), GpuError> {
        self.context.make_current()?;
        let dst = self.regions[pool].page_address(page);
        let stream = self.engine_stream.raw();
        // SAFETY: the range was bounds-checked against the region (`cuda::K1`); `bytes` is borrowed
        // until the synchronize below returns, so it outlives the copy.
        unsafe { driver::memcpy_to_device_async(dst, bytes.as_ptr(), bytes.len(), stream) }
            .map_err(GpuError::driver("cuMemcpyHtoDAsync"))?;
        self.engine_stream.synchronize()
    }

    /// Copies page `page` of pool `pool` into `out` (one page) and waits for it.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from the copy or the synchronize.
    pub(crate) fn read_page(&self, pool: usize, page: u32, out: &mut [u8]) -> Result<(), GpuError> {
        self.context.make_current()?;
        let src = self.regions[pool].page_address(page);
        let stream = self.engine_stream.raw();
        // SAFETY: the range was bounds-checked (`cuda::K1`); `out` is exclusively borrowed until
        // the synchronize below returns, so nothing else touches it during the copy.
        unsafe { driver::memcpy_to_host_async(out.as_mut_ptr(), src, out.len(), stream) }
            .map_err(GpuError::driver("cuMemcpyDtoHAsync"))?;
        self.engine_stream.synchronize()
    }

    /// Queues one copy per run on `stream` and records an event after them (`cuda::K2`).
    /// `runs[i].0` is the run's pool index; the runs were planned against this device's
    /// geometry and the staging geometry of `staging` (`copy::C1`).
    ///
    /// # Errors
    /// [`GpuError::Driver`] when creating the event, queueing a run or recording fails;
    /// the stream has been synchronized by then (`cuda::K2`).
    pub(crate) fn issue(
        &self,
        stream: &CudaStream,
        direction: CopyDirection,
        runs: &[(usize, CopyRun)],
        staging: &mut [u8],
    ) -> Result<CudaEvent, GpuError> {
        self.context.make_current()?;
        let event = CudaEvent::create(Arc::clone(&self.context))?;
        let queued = runs
            .iter()
            .try_for_each(|(pool, run)| self.queue_run(stream, direction, *pool, run, staging))
            .and_then(|()| event.record(stream));
        match queued {
            Ok(()) => Ok(event),
            Err(error) => {
                // `cuda::K2`: runs already queued must finish before the staging pool goes back.
                if let Err(sync_error) = stream.synchronize() {
                    tracing::warn!(error = %sync_error, "synchronizing after a failed submission failed");
                }
                Err(error)
            }
        }
    }

    /// Queues one run's copy.
    fn queue_run(
        &self,
        stream: &CudaStream,
        direction: CopyDirection,
        pool: usize,
        run: &CopyRun,
        staging: &mut [u8],
    ) -> Result<(), GpuError> {
        let device = self.regions[pool].address(run.device_offset);
        let host = &mut staging[run.staging_offset..run.staging_end()];
        match direction {
            CopyDirection::HostToDevice => {
                // SAFETY: the device range lies in the region (`copy::C1`, `cuda::K1`); the staging
                // range lies in the pool's pinned memory, which the `InFlight` owns and nobody
                // touches until the recorded event completes (`gpu::I3`).
                unsafe {
                    driver::memcpy_to_device_async(device, host.as_ptr(), run.len, stream.raw())
                }
                .map_err(GpuError::driver("cuMemcpyHtoDAsync"))
            }
            CopyDirection::DeviceToHost => {
                // SAFETY: as above; the staging range is written only by this copy until
                // the event completes (`gpu::I3`), and the destinations of one submission are
                // disjoint (`gpu::I5`).
                unsafe {
                    driver::memcpy_to_host_async(host.as_mut_ptr(), device, run.len, stream.raw())
                }
                .map_err(GpuError::driver("cuMemcpyDtoHAsync"))
            }
        }
    }
}

/// `kernel::I1`: the checksum kernel reads pages in aligned 8-byte words.
fn check_page_alignment(geometry: &PageGeometry) -> Result<(), GpuError> {
    match geometry
        .pools()
        .iter()
        .find(|spec| spec.page_bytes % 8 != 0)
    {
        Some(spec) => Err(GpuError::PageBytesUnaligned {
            group: spec.group,
            page_bytes: spec.page_bytes,
        }),
        None => Ok(()),
    }
}
