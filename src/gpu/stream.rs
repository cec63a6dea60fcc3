//! Copy streams: the ordered queue on which one loader (or the saver) issues its copies
//! (one stream per loader, one for saves, no `Arc<Mutex<..>>` around them).
//!
//! Workflow (a load; a save is the same with `gather`):
//! 1. The loader owns a [`CopyStream`] from `Device::stream` and its staging pool.
//! 2. It calls [`CopyStream::scatter`] with the pool and one [`PageCopy`] per page. The stream
//!    validates and plans the copies ([`plan_copies`], `gpu::I4`, `gpu::I5`), issues one transfer
//!    per planned run, and returns an [`InFlight`] that owns the pool (`gpu::I3`).
//! 3. The loader hands the `InFlight` to its own completion thread, which calls
//!    `InFlight::wait` and replies with the staging pool and the outcome.
//!
//! On the host backend the copy happens inside `scatter` / `gather` and the returned
//! `InFlight` is already complete. On CUDA, the copies are queued on the owner's stream
//! with one `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` per planned run, an event is
//! recorded with blocking sync, and `wait` sleeps on that event.
//!
//! Counters count at submission, on the owner's thread, with no atomics;
//! failures that surface only at `wait` are counted by whoever waits.
//!
//! A submission refused before any byte moved comes back as a [`SubmitError`], which owns
//! the staging pool it hands back; it lives here, with the pool's owner, and wraps the
//! vocabulary's plain [`GpuError`] (`error::E1`).

#[cfg(feature = "cuda")]
use super::backend::cuda::CudaStream;
use super::checked::ResolvedCopy;
use super::device::Device;
use super::event::InFlight;
use super::staging::StagingPool;
use super::vocab::{plan_copies, CopyDirection, CopyRun, GpuError, PageCopy, StreamId};

/// What one stream has submitted, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamCounters {
    /// `scatter` calls that passed validation.
    pub scatters_submitted: u64,
    /// `gather` calls that passed validation.
    pub gathers_submitted: u64,
    /// Calls rejected before any byte moved ([`SubmitError`]).
    pub submissions_rejected: u64,
    /// Submissions that failed while being issued (injected failures on either backend,
    /// driver errors while queueing on CUDA); their `wait` reports the error
    /// ([`GpuError::CopyFailed`] for injected ones).
    pub issue_failures: u64,
    /// Transfers issued after coalescing; compare with the page counts to see how much
    /// coalescing saved.
    pub runs_issued: u64,
    /// Pages issued host-to-device.
    pub pages_to_device: u64,
    /// Pages issued device-to-host.
    pub pages_to_host: u64,
    /// Bytes issued host-to-device.
    pub bytes_to_device: u64,
    /// Bytes issued device-to-host.
    pub bytes_to_host: u64,
}

impl StreamCounters {
    /// Records an issued submission of `pages` pages planned as `runs`.
    pub(super) fn record_issued(
        &mut self,
        direction: CopyDirection,
        pages: usize,
        runs: &[CopyRun],
    ) {
        let bytes: usize = runs.iter().map(|run| run.len).sum();
        self.runs_issued += runs.len() as u64;
        let (page_counter, byte_counter) = match direction {
            CopyDirection::HostToDevice => (&mut self.pages_to_device, &mut self.bytes_to_device),
            CopyDirection::DeviceToHost => (&mut self.pages_to_host, &mut self.bytes_to_host),
        };
        *page_counter += pages as u64;
        *byte_counter += bytes as u64;
    }
}

impl StreamCounters {
    /// Records an issued checked submission: one transfer per copy.
    pub(super) fn record_checked(&mut self, direction: CopyDirection, copies: &[ResolvedCopy]) {
        let bytes: usize = copies.iter().map(|copy| copy.len).sum();
        self.runs_issued += copies.len() as u64;
        let (page_counter, byte_counter) = match direction {
            CopyDirection::HostToDevice => (&mut self.pages_to_device, &mut self.bytes_to_device),
            CopyDirection::DeviceToHost => (&mut self.pages_to_host, &mut self.bytes_to_host),
        };
        *page_counter += copies.len() as u64;
        *byte_counter += bytes as u64;
    }
}

/// A rejected copy submission: the reason, and the staging pool handed back untouched.
///
/// `scatter` and `gather` take the staging pool by value (`gpu::I3`); a rejection must
/// not lose it, so it travels back inside the error, the way `std::sync::mpsc::SendError`
/// returns the value it could not send.
#[derive(Debug, thiserror::Error)]
#[error("copy submission rejected before any byte moved")]
pub struct SubmitError {
    /// The staging pool that was submitted, with its bytes unchanged.
    pub staging: StagingPool,
    /// Why the submission was rejected.
    #[source]
    pub error: GpuError,
}

impl SubmitError {
    /// The label of the underlying [`GpuError`].
    pub fn kind(&self) -> &'static str {
        self.error.kind()
    }

    /// Splits the error into the staging pool and the reason.
    pub fn into_parts(self) -> (StagingPool, GpuError) {
        (self.staging, self.error)
    }
}

/// The backend's stream. The host backend needs no state; the CUDA variant holds the
/// driver stream, synchronized and destroyed on drop.
#[derive(Debug)]
pub(crate) enum StreamBackend {
    /// Host backend: copies run inside the submission.
    Host,
    /// A non-blocking CUDA stream.
    #[cfg(feature = "cuda")]
    Cuda(CudaStream),
}

/// An ordered copy queue owned by one loader or the saver. `Send`, not `Clone`.
#[derive(Debug)]
pub struct CopyStream {
    id: StreamId,
    /// Keeps the page memory alive while copies on this stream may run.
    device: Device,
    backend: StreamBackend,
    counters: StreamCounters,
}

impl CopyStream {
    /// A stream on `device`; made only by `Device::stream`, which creates `backend`.
    pub(crate) fn new(id: StreamId, device: Device, backend: StreamBackend) -> Self {
        Self {
            id,
            device,
            backend,
            counters: StreamCounters::default(),
        }
    }

    /// This stream's id.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// What this stream has submitted so far.
    pub fn counters(&self) -> StreamCounters {
        self.counters
    }

    /// The device, backend and counters, for the checked submissions of `checked.rs`.
    pub(super) fn parts(&mut self) -> (&Device, &StreamBackend, &mut StreamCounters) {
        (&self.device, &self.backend, &mut self.counters)
    }

    /// Copies staging bytes into device pages (a load): for each copy, `len` bytes from
    /// `staging_offset` of `staging_slot` to the start of the page.
    ///
    /// # Errors
    /// A [`SubmitError`] holding the untouched staging pool when the device is poisoned or
    /// any copy is invalid (see [`plan_copies`]); no byte has moved then (`gpu::I4`). A failure
    /// after validation is reported by [`InFlight::wait`] instead.
    pub fn scatter(
        &mut self,
        staging: StagingPool,
        copies: &[PageCopy],
    ) -> Result<InFlight, SubmitError> {
        self.submit(CopyDirection::HostToDevice, staging, copies)
    }

    /// Copies device pages into staging (a save): for each copy, the first `len` bytes of
    /// the page to `staging_offset` of `staging_slot`.
    ///
    /// # Errors
    /// As [`scatter`](Self::scatter).
    pub fn gather(
        &mut self,
        staging: StagingPool,
        copies: &[PageCopy],
    ) -> Result<InFlight, SubmitError> {
        self.submit(CopyDirection::DeviceToHost, staging, copies)
    }

    /// Validates and plans, then issues; only validation errors come back synchronously.
    fn submit(
        &mut self,
        direction: CopyDirection,
        staging: StagingPool,
        copies: &[PageCopy],
    ) -> Result<InFlight, SubmitError> {
        let planned = self.device.ensure_usable().and_then(|()| {
            plan_copies(
                direction,
                self.device.geometry(),
                staging.geometry(),
                copies,
            )
        });
        let runs = match planned {
            Ok(runs) => runs,
            Err(error) => {
                self.counters.submissions_rejected += 1;
                return Err(SubmitError { staging, error });
            }
        };
        match direction {
            CopyDirection::HostToDevice => self.counters.scatters_submitted += 1,
            CopyDirection::DeviceToHost => self.counters.gathers_submitted += 1,
        }
        let bytes = runs.iter().map(|run| run.len).sum();
        if self.device.take_copy_failure() {
            // `host::H3`: an injected failure is taken before any byte moves, on every backend.
            self.counters.issue_failures += 1;
            let failed = GpuError::CopyFailed {
                stream: self.id,
                direction,
                bytes,
            };
            return Ok(InFlight::completed(
                staging,
                self.id,
                direction,
                bytes,
                Err(failed),
            ));
        }
        match self
            .device
            .issue(&self.backend, self.id, direction, &runs, staging)
        {
            Ok(in_flight) => {
                self.counters.record_issued(direction, copies.len(), &runs);
                Ok(in_flight)
            }
            Err((staging, error)) => {
                self.counters.issue_failures += 1;
                Ok(InFlight::completed(
                    staging,
                    self.id,
                    direction,
                    bytes,
                    Err(error),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::layout::GroupId;
    use crate::gpu::PagePoolSpec;

    fn page_copy(page: u32, staging_offset: usize) -> PageCopy {
        PageCopy {
            group: GroupId(0),
            page,
            staging_slot: 0,
            staging_offset,
            len: 4,
        }
    }

    fn setup() -> Result<(Device, CopyStream, StagingPool), GpuError> {
        let device = Device::open_host(&[PagePoolSpec {
            group: GroupId(0),
            page_bytes: 4,
            num_pages: 4,
        }])?;
        let stream = device.stream()?;
        let staging = device.staging_pool(16, 2)?;
        Ok((device, stream, staging))
    }

    #[test]
    fn counters_count_pages_runs_and_bytes_per_direction() -> Result<(), GpuError> {
        let (_device, mut stream, mut staging) = setup()?;
        staging.slot_mut(0)?.copy_from_slice(&[7; 16]);
        let copies = [page_copy(0, 0), page_copy(1, 4), page_copy(3, 12)];
        let (staging, result) = stream
            .scatter(staging, &copies)
            .map_err(|e| e.error)?
            .wait();
        result?;
        let (_staging, result) = stream
            .gather(staging, &copies[..1])
            .map_err(|e| e.error)?
            .wait();
        result?;
        let counters = stream.counters();
        assert_eq!(counters.scatters_submitted, 1);
        assert_eq!(counters.gathers_submitted, 1);
        assert_eq!(counters.pages_to_device, 3);
        assert_eq!(
            counters.runs_issued,
            2 + 1,
            "pages 0-1 coalesce, page 3 stands alone"
        );
        assert_eq!(counters.bytes_to_device, 12);
        assert_eq!(counters.bytes_to_host, 4);
        Ok(())
    }

    #[test]
    fn rejections_and_issue_failures_are_counted() -> Result<(), GpuError> {
        let (device, mut stream, staging) = setup()?;
        let rejected = stream.scatter(staging, &[page_copy(9, 0)]).unwrap_err();
        assert_eq!(rejected.kind(), "page_out_of_range");
        device.inject_copy_failures(1);
        let (_staging, result) = stream
            .scatter(rejected.staging, &[page_copy(0, 0)])
            .map_err(|e| e.error)?
            .wait();
        assert_eq!(result.map_err(|e| e.kind()), Err("copy_failed"));
        let counters = stream.counters();
        assert_eq!(
            (counters.submissions_rejected, counters.issue_failures),
            (1, 1)
        );
        assert_eq!(
            (counters.scatters_submitted, counters.bytes_to_device),
            (1, 0)
        );
        Ok(())
    }
}
