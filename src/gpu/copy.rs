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
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    use super::*;
    use crate::gpu::pages::PagePoolSpec;

    const PAGE: usize = 8;

    fn geometry() -> Result<(PageGeometry, StagingGeometry), GpuError> {
        let spec = |group, page_bytes| PagePoolSpec {
            group: GroupId(group),
            page_bytes,
            num_pages: 8,
        };
        Ok((
            PageGeometry::new(&[spec(0, PAGE), spec(1, 4)])?,
            StagingGeometry::new(4 * PAGE, 4)?,
        ))
    }

    fn copy(
        group: u32,
        page: u32,
        staging_slot: u32,
        staging_offset: usize,
        len: usize,
    ) -> PageCopy {
        PageCopy {
            group: GroupId(group),
            page,
            staging_slot,
            staging_offset,
            len,
        }
    }

    #[test]
    fn neighbouring_pages_in_one_slot_become_one_run() -> Result<(), GpuError> {
        let (pages, staging) = geometry()?;
        // Pages 2, 3, 4 back to back in slot 1 after a 4-byte header, listed out of order.
        let copies = [
            copy(0, 4, 1, 4 + 2 * PAGE, PAGE),
            copy(0, 2, 1, 4, PAGE),
            copy(0, 3, 1, 4 + PAGE, PAGE),
        ];
        let runs = plan_copies(CopyDirection::HostToDevice, &pages, staging, &copies)?;
        assert_eq!(
            runs,
            vec![CopyRun {
                group: GroupId(0),
                device_offset: 2 * PAGE,
                staging_offset: 4 * PAGE + 4,
                len: 3 * PAGE,
            }]
        );
        Ok(())
    }

    #[test]
    fn gaps_groups_and_short_pages_break_runs() -> Result<(), GpuError> {
        let (pages, staging) = geometry()?;
        let copies = [
            copy(0, 0, 0, 0, PAGE),
            copy(0, 1, 0, PAGE + 1, PAGE), // staging gap of one byte
            copy(0, 5, 2, 0, PAGE - 1),    // short page: the device range ends mid-page
            copy(0, 6, 2, PAGE - 1, PAGE), // so this one cannot continue it
            copy(1, 0, 3, 0, 4),           // other group
        ];
        let runs = plan_copies(CopyDirection::DeviceToHost, &pages, staging, &copies)?;
        assert_eq!(runs.len(), 5);
        Ok(())
    }

    #[test]
    fn i4_every_bound_is_checked() -> Result<(), GpuError> {
        let (pages, staging) = geometry()?;
        let plan = |c: PageCopy| plan_copies(CopyDirection::HostToDevice, &pages, staging, &[c]);
        let kind = |c| plan(c).map_or_else(|e| e.kind(), |_| "ok");
        assert_eq!(kind(copy(9, 0, 0, 0, PAGE)), "unknown_group");
        assert_eq!(kind(copy(0, 8, 0, 0, PAGE)), "page_out_of_range");
        assert_eq!(kind(copy(0, 0, 0, 0, 0)), "copy_length_invalid");
        assert_eq!(kind(copy(0, 0, 0, 0, PAGE + 1)), "copy_length_invalid");
        assert_eq!(kind(copy(0, 0, 4, 0, PAGE)), "staging_slot_out_of_range");
        assert_eq!(
            kind(copy(0, 0, 0, 3 * PAGE + 1, PAGE)),
            "staging_range_out_of_slot"
        );
        assert_eq!(
            kind(copy(0, 0, 0, usize::MAX, PAGE)),
            "staging_range_out_of_slot"
        );
        assert_eq!(kind(copy(0, 0, 0, 3 * PAGE, PAGE)), "ok");
        Ok(())
    }

    #[test]
    fn i5_overlapping_destinations_are_rejected_per_direction() -> Result<(), GpuError> {
        let (pages, staging) = geometry()?;
        // Same page from two staging places: bad for a scatter, fine for a gather.
        let same_page = [
            copy(0, 3, 0, 0, PAGE),
            copy(0, 1, 0, PAGE, PAGE),
            copy(0, 3, 1, 0, PAGE),
        ];
        let err =
            plan_copies(CopyDirection::HostToDevice, &pages, staging, &same_page).unwrap_err();
        assert!(
            matches!(
                err,
                GpuError::OverlappingCopies {
                    first: 0,
                    second: 2
                }
            ),
            "{err}"
        );
        plan_copies(CopyDirection::DeviceToHost, &pages, staging, &same_page)?;
        // Two pages into overlapping staging bytes: bad for a gather, fine for a scatter.
        let same_staging = [copy(0, 1, 0, 0, PAGE), copy(1, 1, 0, 4, 4)];
        let err =
            plan_copies(CopyDirection::DeviceToHost, &pages, staging, &same_staging).unwrap_err();
        assert_eq!(err.kind(), "overlapping_copies");
        plan_copies(CopyDirection::HostToDevice, &pages, staging, &same_staging)?;
        Ok(())
    }

    /// Applies runs to a model of memory: `device[group]` regions and one staging buffer.
    fn apply(
        direction: CopyDirection,
        runs: &[CopyRun],
        device: &mut [Vec<u8>],
        staging: &mut [u8],
    ) {
        for run in runs {
            let region = &mut device[run.group.0 as usize];
            let dev = run.device_offset..run.device_end();
            let stg = run.staging_offset..run.staging_end();
            match direction {
                CopyDirection::HostToDevice => region[dev].copy_from_slice(&staging[stg]),
                CopyDirection::DeviceToHost => staging[stg].copy_from_slice(&region[dev]),
            }
        }
    }

    /// Copies of distinct pages (so scatters never overlap). Half sit at their "natural"
    /// staging place (group 0 in slots 0-1, group 1 in slot 2, pages back to back, so runs
    /// form and cross slot edges); the rest land at random places in slot 3 or elsewhere.
    fn arb_copies() -> impl Strategy<Value = Vec<PageCopy>> {
        let pages = Just((0..16_u32).collect::<Vec<_>>()).prop_shuffle();
        let params = prop::collection::vec(
            (
                any::<bool>(),
                0..4_u32,
                0..4_usize,
                prop::bool::weighted(0.8),
            ),
            0..16,
        );
        (pages, params).prop_map(|(pages, params)| {
            pages
                .into_iter()
                .zip(params)
                .map(|(group_page, (natural, slot, step, whole))| {
                    let (group, page) = (group_page / 8, group_page % 8);
                    let page_bytes = if group == 0 { PAGE } else { 4 };
                    let len = if whole { page_bytes } else { page_bytes - 1 };
                    if natural {
                        let at = page as usize * page_bytes;
                        let slot = 2 * group + u32::try_from(at / (4 * PAGE)).unwrap_or(0);
                        copy(group, page, slot, at % (4 * PAGE), len)
                    } else {
                        copy(group, page, slot, step * page_bytes, len)
                    }
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(Config {
            cases: 256,
            rng_seed: RngSeed::Fixed(0x6770_755f_636f_7079),
            failure_persistence: None,
            ..Config::default()
        })]

        /// `copy::C2` and `copy::C3` on random copy lists (invalid and overlapping lists are
        /// dropped).
        #[test]
        fn c2_coalescing_moves_the_same_bytes(
            copies in arb_copies(),
            to_device in any::<bool>(),
        ) {
            let (pages, staging) = geometry().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let direction = if to_device { CopyDirection::HostToDevice } else { CopyDirection::DeviceToHost };
            let Ok(planned) = plan_copies(direction, &pages, staging, &copies) else {
                return Ok(());
            };
            let one_by_one: Vec<CopyRun> = copies.iter().map(|c| resolve(&pages, staging, c)).collect::<Result<_, _>>()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let init_device = || vec![(0..64_u8).collect::<Vec<u8>>(), (100..132_u8).collect()];
            let init_staging = || (0..128_u8).map(|b| b.wrapping_mul(7)).collect::<Vec<u8>>();
            let (mut dev_a, mut stg_a) = (init_device(), init_staging());
            let (mut dev_b, mut stg_b) = (init_device(), init_staging());
            apply(direction, &one_by_one, &mut dev_a, &mut stg_a);
            apply(direction, &planned, &mut dev_b, &mut stg_b);
            prop_assert_eq!(dev_a, dev_b);
            prop_assert_eq!(stg_a, stg_b);
            let total = |runs: &[CopyRun]| runs.iter().map(|r| r.len).sum::<usize>();
            prop_assert_eq!(total(&one_by_one), total(&planned));
            prop_assert!(planned.len() <= copies.len());
            for pair in planned.windows(2) {
                prop_assert!(!pair[0].continues_with(&pair[1]), "copy::C3: {:?}", pair);
            }
        }
    }
}
