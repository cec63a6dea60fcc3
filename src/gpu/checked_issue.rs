//! The backend half of checked submissions (`checked.rs`): the host backend copies and
//! checksums inside the call; CUDA queues one copy per page, the checksum kernel and the
//! copy of its results, then records an event (`cuda::K2` as for plain submissions).

#[cfg(feature = "cuda")]
use super::backend::cuda::{ChecksumScratch, HostCopy, PendingCopy};
use super::backend::host::HostDevice;
use super::checked::{CheckedEvent, HostAccess, ResolvedCopy};
use super::device::{Backend, Device};
use super::stream::StreamBackend;
use super::vocab::{CopyDirection, GpuError, StreamId};

impl Device {
    /// Issues validated copies of a checked submission on `stream` (which this device
    /// made), with the page checksums (`checked::V4`).
    ///
    /// # Errors
    /// [`GpuError::BackendMismatch`] for a stream of another backend; on CUDA
    /// `GpuError::Driver` while queueing (a sticky one poisons); the stream has been
    /// synchronized by then, so no queued copy still touches `memory` (`cuda::K2`).
    #[cfg_attr(
        not(feature = "cuda"),
        expect(
            clippy::unnecessary_wraps,
            reason = "only the cuda backend fails while issuing"
        )
    )]
    pub(crate) fn issue_checked(
        &self,
        stream: &StreamBackend,
        id: StreamId,
        direction: CopyDirection,
        copies: &[ResolvedCopy],
        memory: HostAccess<'_>,
    ) -> Result<CheckedEvent, GpuError> {
        let _ = (id, direction);
        match (self.backend(), stream) {
            (Backend::Host(host), StreamBackend::Host) => {
                Ok(CheckedEvent::Done(Ok(host_checked(host, copies, memory))))
            }
            #[cfg(feature = "cuda")]
            (Backend::Cuda(cuda), StreamBackend::Cuda(cuda_stream)) => {
                let raw = cuda_copies(copies, memory);
                let issued = cuda.issue_checked(cuda_stream, direction, &raw);
                let (event, scratch) = self.poison_if_sticky(issued)?;
                let bytes = copies.iter().map(|copy| copy.len).sum();
                let pending = PendingCopy::new(event, id, direction, bytes);
                Ok(CheckedEvent::Cuda {
                    pending,
                    scratch,
                    device: self.clone(),
                })
            }
            #[cfg(feature = "cuda")]
            _ => Err(GpuError::BackendMismatch { stream: id }),
        }
    }

    /// Gives a checksum scratch back for the next submission (CUDA only).
    #[cfg(feature = "cuda")]
    pub(crate) fn recycle_checksum_scratch(&self, scratch: ChecksumScratch) {
        if let Backend::Cuda(cuda) = self.backend() {
            cuda.recycle_scratch(scratch);
        }
    }
}

/// Host backend: copy each page range, then checksum the page (`checked::V4`).
fn host_checked(
    host: &HostDevice,
    copies: &[ResolvedCopy],
    mut memory: HostAccess<'_>,
) -> Vec<u64> {
    let mut sums = Vec::with_capacity(copies.len());
    for copy in copies {
        match &mut memory {
            HostAccess::Read(source) => {
                host.write_page_prefix(copy.pool, copy.page, source.source(copy));
                sums.push(host.page_checksum(copy.pool, copy.page, copy.len));
            }
            HostAccess::Write(target) => {
                sums.push(host.page_checksum(copy.pool, copy.page, copy.len));
                host.read_page_prefix(copy.pool, copy.page, target.target(copy));
            }
        }
    }
    sums
}

/// CUDA: each copy as (pool, page, host pointer, bytes); pointers stay valid while the
/// in-flight owns `memory` (`checked::V2`).
#[cfg(feature = "cuda")]
fn cuda_copies(copies: &[ResolvedCopy], mut memory: HostAccess<'_>) -> Vec<HostCopy> {
    copies
        .iter()
        .map(|copy| {
            let host = match &mut memory {
                // Read only: the cast is for the shared pointer type of `HostCopy`.
                HostAccess::Read(source) => source.source(copy).as_ptr().cast_mut(),
                HostAccess::Write(target) => target.target(copy).as_mut_ptr(),
            };
            HostCopy {
                pool: copy.pool,
                page: copy.page,
                host,
                len: copy.len,
            }
        })
        .collect()
}
