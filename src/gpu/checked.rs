//! Checked submissions: page copies whose pages the device also checksums (R5), so the
//! CPU never reads a payload to verify or seal it.
//!
//! Workflow (a load; a save is the same with `gather_checked`):
//! 1. The loader holds its objects' bytes in a [`HostSide`]: its staging pool (a transport
//!    that copies into registered memory, such as Mooncake), or the objects a pool lent it
//!    (`Pool::lend`, zero-copy). Each [`PageCopy`] names a slot or object by index and the
//!    payload's offset inside it.
//! 2. [`CopyStream::scatter_checked`] validates every copy, moves the payloads into their
//!    pages and then computes each page's checksum (`core::object::checksum`) over the
//!    bytes that landed; `gather_checked` checksums the pages and copies them out.
//! 3. [`CheckedInFlight::wait`] hands back the memory and one checksum per copy, in order.
//!    The loader compares them with the headers' checksums; the saver seals headers with
//!    them.
//!
//! On the host backend all of it happens inside the call. On CUDA the copies (one per
//! page), the checksum kernel (`cuda/kernel.rs`) and the copy of its results are queued on
//! the stream and an event is recorded after them; `wait` sleeps on the event.
//!
//! Invariants:
//! - `checked::V1`. Validation comes first: a copy naming a missing page, slot or object, a range
//!   outside its page, slot or object, or two copies writing the same byte reject the
//!   whole submission before any byte moves ([`CheckedSubmitError`] returns the memory).
//! - `checked::V2`. The host memory is reachable only through the [`CheckedInFlight`] until the
//!   copies and the kernel are done (its event field drops first and synchronizes, as `gpu::I3`).
//! - `checked::V3`. Lent objects are read-only: they are not a [`HostTarget`], so a gather into
//!   them does not compile.
//! - `checked::V4`. Checksum `i` is that of copy `i`'s page range, computed on the device side:
//!   after the copy for a scatter, before it for a gather.

#[cfg(feature = "cuda")]
use super::backend::cuda::{ChecksumScratch, PendingCopy};
use super::backend::host_memory::{HostSlot, SharedSlot};
use super::device::Device;
use super::staging::StagingPool;
use super::stream::CopyStream;
use super::vocab::{locate_page, CopyDirection, GpuError, PageCopy, StreamId};

/// Host memory a checked submission reads payloads from: a [`StagingPool`] (copies name
/// slots) or a pool's objects (`Vec<SharedSlot>` lent for a load, `Vec<HostSlot>` to fill
/// for a save; copies name objects by index). Owned by the submission until it completes
/// (`checked::V2`).
pub trait HostSide: Send {
    /// The byte range `offset..offset + len` of slot or object `index`, as (object index,
    /// start): the start is absolute in the staging buffer for a staging pool (`checked::V1`).
    ///
    /// # Errors
    /// [`GpuError::StagingSlotOutOfRange`], [`GpuError::StagingRangeOutOfSlot`],
    /// [`GpuError::ObjectOutOfRange`] or [`GpuError::ObjectRangeOutOfObject`].
    fn locate(&self, index: u32, offset: usize, len: usize) -> Result<(usize, usize), GpuError>;

    /// The bytes a validated copy reads (a scatter).
    fn source(&self, copy: &ResolvedCopy) -> &[u8];
}

/// Host memory a checked submission may also write (a gather): not lent objects (`checked::V3`).
pub trait HostTarget: HostSide {
    /// The bytes a validated copy writes.
    fn target(&mut self, copy: &ResolvedCopy) -> &mut [u8];
}

impl HostSide for StagingPool {
    fn locate(&self, index: u32, offset: usize, len: usize) -> Result<(usize, usize), GpuError> {
        let slot = self.geometry().slot_range(index)?;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.slot_bytes())
        {
            return Err(GpuError::StagingRangeOutOfSlot {
                slot: index,
                offset,
                len,
                slot_bytes: self.slot_bytes(),
            });
        }
        Ok((0, slot.start + offset))
    }

    fn source(&self, copy: &ResolvedCopy) -> &[u8] {
        &self.bytes()[copy.host_range()]
    }
}

impl HostTarget for StagingPool {
    fn target(&mut self, copy: &ResolvedCopy) -> &mut [u8] {
        &mut self.bytes_mut()[copy.host_range()]
    }
}

impl HostSide for Vec<SharedSlot> {
    fn locate(&self, index: u32, offset: usize, len: usize) -> Result<(usize, usize), GpuError> {
        locate_object(self.iter().map(SharedSlot::len), index, offset, len)
    }

    fn source(&self, copy: &ResolvedCopy) -> &[u8] {
        &self[copy.object][copy.host_range()]
    }
}

impl HostSide for Vec<HostSlot> {
    fn locate(&self, index: u32, offset: usize, len: usize) -> Result<(usize, usize), GpuError> {
        locate_object(self.iter().map(HostSlot::len), index, offset, len)
    }

    fn source(&self, copy: &ResolvedCopy) -> &[u8] {
        &self[copy.object][copy.host_range()]
    }
}

impl HostTarget for Vec<HostSlot> {
    fn target(&mut self, copy: &ResolvedCopy) -> &mut [u8] {
        &mut self[copy.object][copy.host_range()]
    }
}

/// How a backend reaches the host bytes of one submission.
pub(crate) enum HostAccess<'a> {
    /// A scatter reads.
    Read(&'a dyn HostSide),
    /// A gather writes.
    Write(&'a mut dyn HostTarget),
}

fn locate_object(
    mut lens: impl ExactSizeIterator<Item = usize>,
    index: u32,
    offset: usize,
    len: usize,
) -> Result<(usize, usize), GpuError> {
    let objects = lens.len();
    let object_len = lens.nth(index as usize).ok_or(GpuError::ObjectOutOfRange {
        object: index,
        objects,
    })?;
    if offset.checked_add(len).is_none_or(|end| end > object_len) {
        return Err(GpuError::ObjectRangeOutOfObject {
            object: index,
            offset,
            len,
            object_len,
        });
    }
    Ok((index as usize, offset))
}

/// One validated copy: the page (pool index, page) and the host range. Made only by the
/// checked submissions' validation (`checked::V1`); opaque outside the device layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedCopy {
    /// Pool index in the device geometry.
    pub(crate) pool: usize,
    /// Page in that pool.
    pub(crate) page: u32,
    /// Object index (0 for staging).
    pub(crate) object: usize,
    /// Start in the object, or in the staging buffer.
    pub(crate) host_start: usize,
    /// Bytes, from the start of the page.
    pub(crate) len: usize,
}

impl ResolvedCopy {
    /// The host byte range inside its object or staging buffer.
    pub(crate) fn host_range(&self) -> std::ops::Range<usize> {
        self.host_start..self.host_start + self.len
    }
}

/// A checked submission refused before any byte moved (`checked::V1`), with its memory.
#[derive(Debug)]
pub struct CheckedSubmitError<M> {
    /// The untouched host memory.
    pub memory: M,
    /// Why it was refused.
    pub error: GpuError,
}

/// How a checked submission completes, per backend.
#[derive(Debug)]
pub(crate) enum CheckedEvent {
    /// Host backend, or a submission that failed while being issued.
    Done(Result<Vec<u64>, GpuError>),
    /// CUDA: copies, kernel and result copy queued; the scratch holds the results.
    #[cfg(feature = "cuda")]
    Cuda {
        /// The event after everything queued.
        pending: PendingCopy,
        /// The kernel's scratch; read after the event, then recycled.
        scratch: ChecksumScratch,
        /// Where the scratch goes back to; keeps the page memory alive and is poisoned on a
        /// sticky error (`cuda::queue::Q3`).
        device: Device,
    },
}

/// A submitted checked copy that owns its host memory until [`wait`](Self::wait).
#[must_use = "an in-flight copy holds its host memory; call wait() to get it back"]
#[derive(Debug)]
pub struct CheckedInFlight<M> {
    /// Declared first so it drops (and synchronizes) before `memory` (`checked::V2`).
    event: CheckedEvent,
    memory: M,
    lens: Vec<usize>,
    stream: StreamId,
    direction: CopyDirection,
}

impl<M> CheckedInFlight<M> {
    /// Blocks until the copies and checksums are done; returns the memory and one checksum per
    /// copy, in order (`checked::V4`). On failure the destination bytes must be treated as not
    /// written (`gpu::I6`).
    ///
    /// Call it on a loader's or saver's own thread, never on a shared actix arbiter.
    pub fn wait(self) -> (M, Result<Vec<u64>, GpuError>) {
        let Self {
            event,
            memory,
            lens,
            ..
        } = self;
        let sums = match event {
            CheckedEvent::Done(outcome) => {
                drop(lens);
                outcome
            }
            #[cfg(feature = "cuda")]
            CheckedEvent::Cuda {
                pending,
                scratch,
                device,
            } => {
                let outcome = device
                    .poison_if_sticky(pending.wait())
                    .map(|()| scratch.checksums(&lens));
                device.recycle_checksum_scratch(scratch);
                outcome
            }
        };
        (memory, sums)
    }

    /// The stream it was issued on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Which way it moves bytes.
    pub fn direction(&self) -> CopyDirection {
        self.direction
    }
}

impl CopyStream {
    /// Copies payloads from `memory` (a staging pool or lent objects) into device pages,
    /// then checksums each page range that was written (module workflow, `checked::V4`).
    ///
    /// # Errors
    /// A [`CheckedSubmitError`] with the untouched memory when the device is poisoned or a copy is
    /// invalid (`checked::V1`). Failures after that are reported by [`CheckedInFlight::wait`].
    pub fn scatter_checked<M: HostSide>(
        &mut self,
        memory: M,
        copies: &[PageCopy],
    ) -> Result<CheckedInFlight<M>, CheckedSubmitError<M>> {
        let resolved = match self.resolve_checked(CopyDirection::HostToDevice, &memory, copies) {
            Ok(resolved) => resolved,
            Err(error) => return Err(CheckedSubmitError { memory, error }),
        };
        let event = self.issue_checked(
            CopyDirection::HostToDevice,
            &resolved,
            HostAccess::Read(&memory),
        );
        Ok(self.in_flight(CopyDirection::HostToDevice, event, memory, &resolved))
    }

    /// Checksums each page range, then copies it into `memory` (a staging pool or fresh
    /// object buffers; lent objects cannot be written, `checked::V3`).
    ///
    /// # Errors
    /// As [`scatter_checked`](Self::scatter_checked).
    pub fn gather_checked<M: HostTarget>(
        &mut self,
        mut memory: M,
        copies: &[PageCopy],
    ) -> Result<CheckedInFlight<M>, CheckedSubmitError<M>> {
        let resolved = match self.resolve_checked(CopyDirection::DeviceToHost, &memory, copies) {
            Ok(resolved) => resolved,
            Err(error) => return Err(CheckedSubmitError { memory, error }),
        };
        let event = self.issue_checked(
            CopyDirection::DeviceToHost,
            &resolved,
            HostAccess::Write(&mut memory),
        );
        Ok(self.in_flight(CopyDirection::DeviceToHost, event, memory, &resolved))
    }

    /// Validation (`checked::V1`), counting a rejection.
    fn resolve_checked(
        &mut self,
        direction: CopyDirection,
        memory: &dyn HostSide,
        copies: &[PageCopy],
    ) -> Result<Vec<ResolvedCopy>, GpuError> {
        let (device, _, counters) = self.parts();
        let resolved = device
            .ensure_usable()
            .and_then(|()| resolve_all(device, direction, memory, copies));
        if resolved.is_err() {
            counters.submissions_rejected += 1;
        }
        resolved
    }

    /// Issues validated copies (or takes an injected failure, `host::H3`) and counts them.
    fn issue_checked(
        &mut self,
        direction: CopyDirection,
        resolved: &[ResolvedCopy],
        host: HostAccess<'_>,
    ) -> CheckedEvent {
        let id = self.id();
        let (device, backend, counters) = self.parts();
        match direction {
            CopyDirection::HostToDevice => counters.scatters_submitted += 1,
            CopyDirection::DeviceToHost => counters.gathers_submitted += 1,
        }
        if device.take_copy_failure() {
            counters.issue_failures += 1;
            let bytes = resolved.iter().map(|copy| copy.len).sum();
            return CheckedEvent::Done(Err(GpuError::CopyFailed {
                stream: id,
                direction,
                bytes,
            }));
        }
        match device.issue_checked(backend, id, direction, resolved, host) {
            Ok(event) => {
                counters.record_checked(direction, resolved);
                event
            }
            Err(error) => {
                counters.issue_failures += 1;
                CheckedEvent::Done(Err(error))
            }
        }
    }

    fn in_flight<M>(
        &self,
        direction: CopyDirection,
        event: CheckedEvent,
        memory: M,
        resolved: &[ResolvedCopy],
    ) -> CheckedInFlight<M> {
        CheckedInFlight {
            event,
            memory,
            lens: resolved.iter().map(|copy| copy.len).collect(),
            stream: self.id(),
            direction,
        }
    }
}

/// Validates every copy against the device geometry and the host memory (`checked::V1`,
/// `checked::V3`).
fn resolve_all(
    device: &Device,
    direction: CopyDirection,
    memory: &dyn HostSide,
    copies: &[PageCopy],
) -> Result<Vec<ResolvedCopy>, GpuError> {
    let mut resolved = Vec::with_capacity(copies.len());
    for copy in copies {
        let (pool_index, _) = locate_page(device.geometry(), copy)?;
        let (object, host_start) =
            memory.locate(copy.staging_slot, copy.staging_offset, copy.len)?;
        resolved.push(ResolvedCopy {
            pool: pool_index,
            page: copy.page,
            object,
            host_start,
            len: copy.len,
        });
    }
    check_disjoint(direction, &resolved)?;
    Ok(resolved)
}

/// Rejects two copies writing the same byte: pages for a scatter, host bytes for a gather.
fn check_disjoint(direction: CopyDirection, copies: &[ResolvedCopy]) -> Result<(), GpuError> {
    let destination = |copy: &ResolvedCopy| match direction {
        // Every copy starts at its page's first byte, so two copies of one page overlap.
        CopyDirection::HostToDevice => (copy.pool, copy.page as usize, 0, 1),
        CopyDirection::DeviceToHost => {
            (copy.object, 0, copy.host_start, copy.host_start + copy.len)
        }
    };
    let mut order: Vec<usize> = (0..copies.len()).collect();
    order.sort_by_key(|&index| destination(&copies[index]));
    for pair in order.windows(2) {
        let (object_a, page_a, _, end_a) = destination(&copies[pair[0]]);
        let (object_b, page_b, start_b, _) = destination(&copies[pair[1]]);
        let same_page = object_a == object_b && page_a == page_b;
        let overlaps = match direction {
            CopyDirection::HostToDevice => same_page,
            CopyDirection::DeviceToHost => same_page && start_b < end_a,
        };
        if overlaps {
            return Err(GpuError::OverlappingCopies {
                first: pair[0].min(pair[1]),
                second: pair[0].max(pair[1]),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
