//! Tests of the copy planner (`copy::C1`-C3).

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use super::*;

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

fn copy(group: u32, page: u32, staging_slot: u32, staging_offset: usize, len: usize) -> PageCopy {
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
    let err = plan_copies(CopyDirection::HostToDevice, &pages, staging, &same_page).unwrap_err();
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
    let err = plan_copies(CopyDirection::DeviceToHost, &pages, staging, &same_staging).unwrap_err();
    assert_eq!(err.kind(), "overlapping_copies");
    plan_copies(CopyDirection::HostToDevice, &pages, staging, &same_staging)?;
    Ok(())
}

/// Applies runs to a model of memory: `device[group]` regions and one staging buffer.
fn apply(direction: CopyDirection, runs: &[CopyRun], device: &mut [Vec<u8>], staging: &mut [u8]) {
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
