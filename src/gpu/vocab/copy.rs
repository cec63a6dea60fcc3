//! Copy descriptions and the copy planner: from a list of page copies to the fewest
//! contiguous transfers the memory layout allows.
//!
//! Workflow:
//! 1. A loader or the saver lists one [`PageCopy`] per page: which page of which group,
//!    and where its payload sits in staging (a slot, and an offset past the object header).
//! 2. [`plan_copies`] resolves each copy to absolute byte ranges ([`CopyRun`]), checks every
//!    bound (`gpu::I4`), rejects overlapping destinations (`gpu::I5`), then coalesces neighbours.
//! 3. A backend issues one transfer per run: on CUDA one `cuMemcpy*Async` each, on the host
//!    backend one `copy_from_slice` per page touched.
//!
//! Device memory of a group is one region with page `p` at byte `p * page_bytes`; staging
//! is one buffer with slot `s` at byte `s * slot_bytes`. Two runs merge when both their
//! device ranges and their staging ranges are back to back, in the same group.
//!
//! Invariants:
//! - `copy::C1`. Every run lies inside its group's region and inside the staging buffer.
//! - `copy::C2`. The planned runs move exactly the bytes the copy list names: each destination byte
//!   gets the same source byte (proptest `c2_coalescing_moves_the_same_bytes`).
//! - `copy::C3`. No two neighbouring output runs could be merged (runs are sorted by group, device
//!   offset, staging offset; each is merged into its predecessor whenever possible).

use std::fmt;

use crate::core::layout::GroupId;

use super::error::GpuError;
use super::pages::{PageGeometry, PagePoolSpec};
use super::staging::StagingGeometry;

/// Which way a copy moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyDirection {
    /// Staging to device pages (a load; `scatter`).
    HostToDevice,
    /// Device pages to staging (a save; `gather`).
    DeviceToHost,
}

impl CopyDirection {
    /// A short, stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HostToDevice => "host-to-device",
            Self::DeviceToHost => "device-to-host",
        }
    }
}

impl fmt::Display for CopyDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One page's worth of copy: the first `len` bytes of a page, to or from
/// `staging_offset..staging_offset + len` of a staging slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageCopy {
    /// The page's layer group.
    pub group: GroupId,
    /// The page index in the group's pool.
    pub page: u32,
    /// The staging slot holding (or receiving) the payload.
    pub staging_slot: u32,
    /// Where the payload starts inside the slot (after the object header, R5).
    pub staging_offset: usize,
    /// Bytes to move: normally the group's `page_bytes`; `1..=page_bytes` is allowed and
    /// moves a prefix of the page.
    pub len: usize,
}

/// One contiguous transfer: `len` bytes at `device_offset` of `group`'s page region, and at
/// `staging_offset` of the staging buffer (absolute, not per slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyRun {
    /// The layer group whose page region the run touches.
    pub group: GroupId,
    /// Byte offset in the group's page region.
    pub device_offset: usize,
    /// Byte offset in the staging buffer.
    pub staging_offset: usize,
    /// Bytes to move.
    pub len: usize,
}

impl CopyRun {
    /// One past the last device byte.
    pub fn device_end(&self) -> usize {
        self.device_offset + self.len
    }

    /// One past the last staging byte.
    pub fn staging_end(&self) -> usize {
        self.staging_offset + self.len
    }

    /// Whether `next` continues this run in both memories (`copy::C3`).
    fn continues_with(&self, next: &Self) -> bool {
        self.group == next.group
            && self.device_end() == next.device_offset
            && self.staging_end() == next.staging_offset
    }
}

/// Resolves, checks and coalesces `copies` for one submission in `direction`.
///
/// An empty list plans no runs. The result is sorted by group, then device offset.
///
/// # Errors
/// The first invalid copy's error (`gpu::I4`): [`GpuError::UnknownGroup`],
/// [`GpuError::PageOutOfRange`], [`GpuError::CopyLengthInvalid`],
/// [`GpuError::StagingSlotOutOfRange`], [`GpuError::StagingRangeOutOfSlot`]; or
/// [`GpuError::OverlappingCopies`] when two copies write the same destination byte (`gpu::I5`).
pub fn plan_copies(
    direction: CopyDirection,
    pages: &PageGeometry,
    staging: StagingGeometry,
    copies: &[PageCopy],
) -> Result<Vec<CopyRun>, GpuError> {
    let runs = copies
        .iter()
        .map(|copy| resolve(pages, staging, copy))
        .collect::<Result<Vec<_>, _>>()?;
    check_disjoint_destinations(direction, &runs)?;
    Ok(coalesce(runs))
}

/// The pool index and spec of a copy's page, once the page exists and the length is
/// `1..=page_bytes` (`copy::C1`).
///
/// # Errors
/// [`GpuError::UnknownGroup`], [`GpuError::PageOutOfRange`], [`GpuError::CopyLengthInvalid`].
pub(crate) fn locate_page(
    pages: &PageGeometry,
    copy: &PageCopy,
) -> Result<(usize, PagePoolSpec), GpuError> {
    let (pool_index, pool) = pages.locate(copy.group, copy.page)?;
    if copy.len == 0 || copy.len > pool.page_bytes {
        return Err(GpuError::CopyLengthInvalid {
            group: copy.group,
            page: copy.page,
            len: copy.len,
            page_bytes: pool.page_bytes,
        });
    }
    Ok((pool_index, pool))
}

/// Checks one copy against both geometries and turns it into absolute byte ranges (`copy::C1`).
fn resolve(
    pages: &PageGeometry,
    staging: StagingGeometry,
    copy: &PageCopy,
) -> Result<CopyRun, GpuError> {
    let (_, pool) = locate_page(pages, copy)?;
    let slot = staging.slot_range(copy.staging_slot)?;
    let fits = copy
        .staging_offset
        .checked_add(copy.len)
        .is_some_and(|end| end <= staging.slot_bytes());
    if !fits {
        return Err(GpuError::StagingRangeOutOfSlot {
            slot: copy.staging_slot,
            offset: copy.staging_offset,
            len: copy.len,
            slot_bytes: staging.slot_bytes(),
        });
    }
    Ok(CopyRun {
        group: copy.group,
        device_offset: pool.page_offset(copy.page),
        staging_offset: slot.start + copy.staging_offset,
        len: copy.len,
    })
}

/// Rejects two runs that write the same destination byte (`gpu::I5`): device bytes for
/// host-to-device, staging bytes for device-to-host. Sources may overlap freely.
fn check_disjoint_destinations(direction: CopyDirection, runs: &[CopyRun]) -> Result<(), GpuError> {
    // (group, start, end) of each destination; staging is one buffer for every group.
    let destination = |run: &CopyRun| match direction {
        CopyDirection::HostToDevice => (Some(run.group), run.device_offset, run.device_end()),
        CopyDirection::DeviceToHost => (None, run.staging_offset, run.staging_end()),
    };
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&index| destination(&runs[index]));
    // Sorted by start, disjoint neighbours imply all pairs are disjoint.
    for pair in order.windows(2) {
        let (group_a, _, end_a) = destination(&runs[pair[0]]);
        let (group_b, start_b, _) = destination(&runs[pair[1]]);
        if group_a == group_b && start_b < end_a {
            return Err(GpuError::OverlappingCopies {
                first: pair[0].min(pair[1]),
                second: pair[0].max(pair[1]),
            });
        }
    }
    Ok(())
}

/// Sorts runs by group and device offset and merges each run into its predecessor when it
/// continues it in both memories (`copy::C2`, `copy::C3`).
///
/// Reordering is safe because the destinations of one submission are disjoint (`gpu::I5`) and
/// sources are never written by the same submission.
pub fn coalesce(mut runs: Vec<CopyRun>) -> Vec<CopyRun> {
    runs.sort_by_key(|run| (run.group, run.device_offset, run.staging_offset));
    let mut merged: Vec<CopyRun> = Vec::with_capacity(runs.len());
    for run in runs {
        match merged.last_mut() {
            Some(last) if last.continues_with(&run) => last.len += run.len,
            _ => merged.push(run),
        }
    }
    merged
}

#[cfg(test)]
mod tests;
