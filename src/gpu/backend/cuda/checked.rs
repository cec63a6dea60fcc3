//! Checked submissions on CUDA (the front's `checked.rs`): one copy per page, or one 2D
//! copy per strided run of pages (`strided::T2`), the checksum kernel (`kernel.rs`) and the
//! copy of its results, then an event (`cuda::K2` as for plain submissions). Scratch of
//! finished submissions is kept for the next ones (`kernel::I2`).

use std::sync::Arc;

use super::driver;
use super::kernel::ChecksumScratch;
use super::queue::{CudaEvent, CudaStream};
use super::{CudaDevice, SPARE_SCRATCHES};
use crate::gpu::vocab::{strided_runs, CopyDirection, GpuError};

/// One page copy of a checked submission: the page and the host bytes (kept alive by the
/// submission, `checked::V2`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostCopy {
    /// Pool index (`cuda::K1`).
    pub(crate) pool: usize,
    /// Page in the pool (checked against the geometry).
    pub(crate) page: u32,
    /// First host byte: read for a scatter, written for a gather.
    pub(crate) host: *mut u8,
    /// Bytes from the start of the page.
    pub(crate) len: usize,
}

impl CudaDevice {
    /// Queues a checked submission (`checked.rs`): for a scatter the page copies and then the
    /// checksum kernel, for a gather the kernel and then the copies (`checked::V4`); then the copy
    /// of the kernel's results and an event. Returns the event and the scratch that will hold the
    /// results.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from an allocation, a copy, the launch or the event; the
    /// stream has been synchronized by then (`cuda::K2`).
    pub(crate) fn issue_checked(
        &self,
        stream: &CudaStream,
        direction: CopyDirection,
        copies: &[HostCopy],
    ) -> Result<(CudaEvent, ChecksumScratch), GpuError> {
        self.context.make_current()?;
        let event = CudaEvent::create(Arc::clone(&self.context))?;
        let mut scratch = self.take_scratch(copies.len())?;
        let pages: Vec<(driver::DevicePtr, usize)> = copies
            .iter()
            .map(|copy| (self.regions[copy.pool].page_address(copy.page), copy.len))
            .collect();
        scratch.stage(&pages);
        let queue_copies = || Self::queue_page_copies(stream, direction, copies, &pages);
        let queued = match direction {
            CopyDirection::HostToDevice => {
                queue_copies().and_then(|()| self.kernel.queue(stream, &mut scratch))
            }
            CopyDirection::DeviceToHost => self
                .kernel
                .queue(stream, &mut scratch)
                .and_then(|()| queue_copies()),
        }
        .and_then(|()| event.record(stream));
        match queued {
            Ok(()) => Ok((event, scratch)),
            Err(error) => {
                // `cuda::K2`: what was queued finishes before the memory goes back.
                if let Err(sync_error) = stream.synchronize() {
                    tracing::warn!(error = %sync_error, "synchronizing after a failed submission failed");
                }
                self.recycle_scratch(scratch);
                Err(error)
            }
        }
    }

    /// Queues the page copies of a checked submission: each strided run of copies
    /// (`strided.rs`) as one 2D copy, single copies as plain ones.
    fn queue_page_copies(
        stream: &CudaStream,
        direction: CopyDirection,
        copies: &[HostCopy],
        pages: &[(driver::DevicePtr, usize)],
    ) -> Result<(), GpuError> {
        let addresses: Vec<(u64, u64, usize)> = copies
            .iter()
            .zip(pages)
            .map(|(copy, &(device, _))| (copy.host.addr() as u64, device, copy.len))
            .collect();
        for run in strided_runs(&addresses) {
            let copy = &copies[run.first];
            let device = pages[run.first].0;
            if run.count == 1 {
                Self::queue_page_copy(stream, direction, copy, device)?;
                continue;
            }
            let (host_pitch, device_pitch) = (
                usize::try_from(run.host_stride).unwrap_or(usize::MAX),
                usize::try_from(run.device_stride).unwrap_or(usize::MAX),
            );
            let to_device = direction == CopyDirection::HostToDevice;
            // SAFETY: row i of the run is copy `run.first + i` (`strided::T2`): its page range was
            // checked against the geometry (`cuda::K1`) and its host range against the memory the
            // in-flight owns until the event completes (`checked::V1`, `checked::V2`); rows never
            // overlap (`strided::T2`) and destinations of one submission are disjoint
            // (`checked::V1`).
            let queued = unsafe {
                driver::memcpy_2d_async(
                    to_device,
                    copy.host,
                    host_pitch,
                    device,
                    device_pitch,
                    copy.len,
                    run.count,
                    stream.raw(),
                )
            };
            if let Err(error) = queued {
                // A 2D copy the driver refuses (a pitch over its limit) is queued page by
                // page instead; nothing of it was queued.
                tracing::warn!(%error, rows = run.count, host_pitch, device_pitch, "2d copy refused; copying page by page");
                for (copy, &(device, _)) in copies[run.first..run.first + run.count]
                    .iter()
                    .zip(&pages[run.first..])
                {
                    Self::queue_page_copy(stream, direction, copy, device)?;
                }
            }
        }
        Ok(())
    }

    /// Queues one page's copy of a checked submission.
    fn queue_page_copy(
        stream: &CudaStream,
        direction: CopyDirection,
        copy: &HostCopy,
        device: driver::DevicePtr,
    ) -> Result<(), GpuError> {
        match direction {
            CopyDirection::HostToDevice => {
                // SAFETY: the page range was checked against the geometry (`cuda::K1`) and the
                // host range against its memory, which the in-flight owns until the event
                // completes and nobody writes meanwhile (`checked::V1`, `checked::V2`).
                unsafe { driver::memcpy_to_device_async(device, copy.host, copy.len, stream.raw()) }
                    .map_err(GpuError::driver("cuMemcpyHtoDAsync"))
            }
            CopyDirection::DeviceToHost => {
                // SAFETY: as above; the host range is written only by this copy until the event
                // completes, and the destinations of one submission are disjoint (`checked::V1`).
                unsafe { driver::memcpy_to_host_async(copy.host, device, copy.len, stream.raw()) }
                    .map_err(GpuError::driver("cuMemcpyDtoHAsync"))
            }
        }
    }

    /// A scratch for `pages` pages: a spare one that is large enough, or a new one.
    fn take_scratch(&self, pages: usize) -> Result<ChecksumScratch, GpuError> {
        let spare = {
            let mut spares = self.scratch.lock();
            let position = spares
                .iter()
                .position(|scratch| scratch.capacity_pages() >= pages);
            position.map(|index| spares.swap_remove(index))
        };
        match spare {
            Some(scratch) => Ok(scratch),
            None => ChecksumScratch::new(&self.context, pages.max(64)),
        }
    }

    /// Keeps a finished submission's scratch for the next one (`kernel::I2`).
    pub(crate) fn recycle_scratch(&self, scratch: ChecksumScratch) {
        let mut spares = self.scratch.lock();
        if spares.len() < SPARE_SCRATCHES {
            spares.push(scratch);
        }
    }
}
