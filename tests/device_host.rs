//! Integration tests of the device layer on the host backend: page round trips through staging,
//! concurrent streams, injected copy failures (`gpu::I6`, R25), staging bounds and all-or-nothing
//! validation (`gpu::I1`, `gpu::I4`), and coalescing that moves the same bytes (`gpu::I5`,
//! `copy::C2`).

use std::error::Error;

use kv_connector::core::layout::GroupId;
use kv_connector::gpu::{Device, GpuError, PageCopy, PagePoolSpec, StagingPool, SubmitError};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

type TestResult = Result<(), Box<dyn Error>>;

/// Bytes in front of each payload in a staging slot, like a stored object's header (R5).
const HEADER: usize = 16;

/// Deterministic page contents, distinct per (group, page, salt).
fn pattern(group: GroupId, page: u32, salt: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let mixed = (group.0 * 131 + page * 31 + salt * 7) as usize + i * 13;
            u8::try_from(mixed % 251).unwrap_or(u8::MAX)
        })
        .collect()
}

fn spec(group: u32, page_bytes: usize, num_pages: u32) -> PagePoolSpec {
    PagePoolSpec {
        group: GroupId(group),
        page_bytes,
        num_pages,
    }
}

/// One page per slot, payload after the header: the layout a loader uses.
fn page_in_slot(group: GroupId, page: u32, slot: u32, page_bytes: usize) -> PageCopy {
    PageCopy {
        group,
        page,
        staging_slot: slot,
        staging_offset: HEADER,
        len: page_bytes,
    }
}

fn wait_ok(
    submitted: Result<kv_connector::gpu::InFlight, SubmitError>,
) -> Result<StagingPool, Box<dyn Error>> {
    let (staging, outcome) = submitted?.wait();
    outcome?;
    Ok(staging)
}

#[test]
fn pages_round_trip_through_staging_byte_identical() -> TestResult {
    let (full, window) = (GroupId(0), GroupId(2));
    let device = Device::open_host(&[spec(0, 64, 8), spec(2, 32, 4)])?;
    let mut stream = device.stream()?;
    let staging = device.staging_pool(HEADER + 64, 6)?;
    for page in 0..4 {
        device.write_page(full, page, &pattern(full, page, 1, 64))?;
    }
    device.write_page(window, 1, &pattern(window, 1, 1, 32))?;

    // Save side: gather pages 0..4 of the full group and page 1 of the window group.
    let mut copies: Vec<PageCopy> = (0..4)
        .map(|page| page_in_slot(full, page, page, 64))
        .collect();
    copies.push(page_in_slot(window, 1, 5, 32));
    let staging = wait_ok(stream.gather(staging, &copies))?;
    for page in 0..4 {
        assert_eq!(
            staging.slot(page)?[HEADER..],
            pattern(full, page, 1, 64)[..]
        );
    }
    assert_eq!(
        staging.slot(5)?[HEADER..HEADER + 32],
        pattern(window, 1, 1, 32)[..]
    );

    // Load side: scatter the same slots into other pages.
    let mut targets: Vec<PageCopy> = (0..4)
        .map(|slot| page_in_slot(full, slot + 4, slot, 64))
        .collect();
    targets.push(page_in_slot(window, 3, 5, 32));
    let _staging = wait_ok(stream.scatter(staging, &targets))?;
    for page in 0..4 {
        assert_eq!(
            device.read_page_to_vec(full, page + 4)?,
            pattern(full, page, 1, 64)
        );
    }
    assert_eq!(
        device.read_page_to_vec(window, 3)?,
        pattern(window, 1, 1, 32)
    );
    let counters = stream.counters();
    assert_eq!((counters.pages_to_host, counters.pages_to_device), (5, 5));
    assert_eq!(
        (counters.bytes_to_host, counters.bytes_to_device),
        (4 * 64 + 32, 4 * 64 + 32)
    );
    Ok(())
}

/// `gpu::I2`: several streams on several threads, each on its own pages, with the engine-side
/// calls mixed in; every page ends up with exactly the bytes its owner put there.
#[test]
fn i2_concurrent_streams_on_different_pages_keep_bytes_intact() -> TestResult {
    const THREADS: u32 = 4;
    const PAGES_PER_THREAD: u32 = 16;
    const ROUNDS: u32 = 25;
    let group = GroupId(1);
    let page_bytes = 256;
    let device = Device::open_host(&[spec(1, page_bytes, THREADS * PAGES_PER_THREAD)])?;

    std::thread::scope(|scope| -> TestResult {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let device = device.clone();
                scope.spawn(move || -> Result<(), GpuError> {
                    let mut stream = device.stream()?;
                    let mut staging = device.staging_pool(HEADER + page_bytes, 8)?;
                    let first = thread * PAGES_PER_THREAD;
                    for round in 0..ROUNDS {
                        let salt = thread * 1000 + round;
                        for page in first..first + 8 {
                            device.write_page(
                                group,
                                page,
                                &pattern(group, page, salt, page_bytes),
                            )?;
                        }
                        let gather: Vec<PageCopy> = (0..8)
                            .map(|slot| page_in_slot(group, first + slot, slot, page_bytes))
                            .collect();
                        let (back, outcome) =
                            stream.gather(staging, &gather).map_err(|e| e.error)?.wait();
                        outcome?;
                        let scatter: Vec<PageCopy> = (0..8)
                            .map(|slot| page_in_slot(group, first + 8 + slot, slot, page_bytes))
                            .collect();
                        let (back, outcome) =
                            stream.scatter(back, &scatter).map_err(|e| e.error)?.wait();
                        outcome?;
                        staging = back;
                        for page in first..first + 8 {
                            let copied = device.read_page_to_vec(group, page + 8)?;
                            assert_eq!(
                                copied,
                                pattern(group, page, salt, page_bytes),
                                "thread {thread} round {round}"
                            );
                        }
                    }
                    assert_eq!(
                        stream.counters().bytes_to_device,
                        u64::from(ROUNDS * 8) * page_bytes as u64
                    );
                    Ok(())
                })
            })
            .collect();
        for worker in workers {
            worker.join().map_err(|_| "worker thread panicked")??;
        }
        Ok(())
    })?;

    for thread in 0..THREADS {
        let salt = thread * 1000 + ROUNDS - 1;
        for page in 0..8 {
            let source = thread * PAGES_PER_THREAD + page;
            assert_eq!(
                device.read_page_to_vec(group, source)?,
                pattern(group, source, salt, page_bytes)
            );
            assert_eq!(
                device.read_page_to_vec(group, source + 8)?,
                pattern(group, source, salt, page_bytes)
            );
        }
    }
    Ok(())
}

/// `gpu::I6` on the host backend: a failed copy is reported by `wait` and moves no byte, so the
/// destination keeps its old contents; the next copy (no failure pending) succeeds.
/// Needs `Device::inject_copy_failures`, built with the `faults` feature.
#[cfg(feature = "faults")]
#[test]
fn i6_injected_copy_failure_is_reported_and_leaves_destination_unchanged() -> TestResult {
    let group = GroupId(0);
    let device = Device::open_host(&[spec(0, 32, 8)])?;
    let mut stream = device.stream()?;
    let staging = device.staging_pool(HEADER + 32, 4)?;
    let old = vec![0xAB; 32];
    for page in 0..4 {
        device.write_page(group, page, &pattern(group, page, 9, 32))?;
        device.write_page(group, page + 4, &old)?;
    }
    let from: Vec<PageCopy> = (0..4)
        .map(|page| page_in_slot(group, page, page, 32))
        .collect();
    let to: Vec<PageCopy> = (0..4)
        .map(|slot| page_in_slot(group, slot + 4, slot, 32))
        .collect();
    let staging = wait_ok(stream.gather(staging, &from))?;

    // A failed scatter (a load).
    device.inject_copy_failures(1);
    let in_flight = stream.scatter(staging, &to)?;
    assert!(in_flight.is_complete());
    let (staging, outcome) = in_flight.wait();
    match outcome {
        Err(GpuError::CopyFailed {
            stream: id,
            direction,
            bytes,
        }) => {
            assert_eq!(
                (id, direction, bytes),
                (
                    stream.id(),
                    kv_connector::gpu::CopyDirection::HostToDevice,
                    4 * 32
                )
            );
        }
        other => return Err(format!("expected copy_failed, got {other:?}").into()),
    }
    for page in 4..8 {
        assert_eq!(
            device.read_page_to_vec(group, page)?,
            old,
            "page {page} must be unchanged"
        );
    }
    assert_eq!(
        staging.slot(2)?[HEADER..],
        pattern(group, 2, 9, 32)[..],
        "staging came back intact"
    );

    // The failure was used up: the same scatter now lands.
    let mut staging = wait_ok(stream.scatter(staging, &to))?;
    for page in 4..8 {
        assert_eq!(
            device.read_page_to_vec(group, page)?,
            pattern(group, page - 4, 9, 32)
        );
    }

    // A failed gather (a save) leaves staging unchanged.
    for slot in staging.slots_mut() {
        slot.fill(0xEE);
    }
    device.inject_copy_failures(1);
    let (staging, outcome) = stream.gather(staging, &from)?.wait();
    assert_eq!(outcome.map_err(|e| e.kind()), Err("copy_failed"));
    assert!(staging.slot(0)?.iter().all(|&b| b == 0xEE));
    assert_eq!(stream.counters().issue_failures, 2);
    Ok(())
}

/// `gpu::I1`, `gpu::I4`: staging bounds are checked, and a rejected submission hands the staging
/// pool back untouched and moves no byte, even when only one copy of the list is bad.
#[test]
fn i4_staging_slot_bounds_and_rejection_return_staging_untouched() -> TestResult {
    let group = GroupId(0);
    let device = Device::open_host(&[spec(0, 32, 4)])?;
    let mut stream = device.stream()?;
    let mut staging = device.staging_pool(HEADER + 32, 2)?;
    assert_eq!(
        (staging.slots(), staging.slot_bytes(), staging.len()),
        (2, HEADER + 32, 2 * (HEADER + 32))
    );
    assert!(!staging.as_ptr().is_null());
    assert!(matches!(
        staging.slot(2),
        Err(GpuError::StagingSlotOutOfRange { slot: 2, slots: 2 })
    ));
    staging.slot_mut(0)?.fill(0x11);
    staging.slot_mut(1)?.fill(0x22);

    let good = page_in_slot(group, 0, 0, 32);
    let bad_slot = page_in_slot(group, 1, 2, 32);
    let past_slot_end = PageCopy {
        staging_offset: HEADER + 1,
        ..page_in_slot(group, 1, 1, 32)
    };
    for (bad, kind) in [
        (bad_slot, "staging_slot_out_of_range"),
        (past_slot_end, "staging_range_out_of_slot"),
    ] {
        let rejected = stream
            .scatter(staging, &[good, bad])
            .err()
            .ok_or("bad copy was accepted")?;
        assert_eq!(rejected.kind(), kind);
        let (back, _) = rejected.into_parts();
        staging = back;
        assert!(staging.slot(0)?.iter().all(|&b| b == 0x11));
        assert_eq!(
            device.read_page_to_vec(group, 0)?,
            vec![0; 32],
            "the good copy must not run"
        );
    }
    let rejected = stream
        .gather(staging, &[good, bad_slot])
        .err()
        .ok_or("bad copy was accepted")?;
    assert!(
        rejected.staging.slot(0)?.iter().all(|&b| b == 0x11),
        "gather wrote nothing"
    );
    assert_eq!(stream.counters().submissions_rejected, 3);
    Ok(())
}

/// `gpu::I7`: after `poison`, submissions are rejected with the staging pool handed back.
#[test]
fn i7_poisoned_device_rejects_submissions_and_returns_staging() -> TestResult {
    let device = Device::open_host(&[spec(0, 8, 2)])?;
    let mut stream = device.stream()?;
    let staging = device.staging_pool(8, 1)?;
    device.poison();
    let rejected = stream
        .scatter(staging, &[page_in_slot(GroupId(0), 0, 0, 8)])
        .err()
        .ok_or("accepted")?;
    assert!(matches!(rejected.error, GpuError::Poisoned));
    assert_eq!(rejected.staging.slots(), 1);
    Ok(())
}

/// Both directions' copy lists for the property test: distinct pages, half of them at a
/// natural staging place (so neighbours coalesce, also across slot edges).
fn arb_copies() -> impl Strategy<Value = Vec<PageCopy>> {
    let pages = Just((0..24_u32).collect::<Vec<_>>()).prop_shuffle();
    let params = prop::collection::vec((any::<bool>(), 0..4_u32, 0..4_usize), 0..24);
    (pages, params).prop_map(|(pages, params)| {
        pages
            .into_iter()
            .zip(params)
            .map(|(index, (natural, slot, step))| {
                // Group 0: 16 pages of 8 bytes; group 3: 8 pages of 4 bytes; slots of 40 bytes.
                let (group, page, page_bytes) = if index < 16 {
                    (0, index, 8)
                } else {
                    (3, index - 16, 4)
                };
                let (slot, offset) = if natural {
                    let at = page as usize * page_bytes + if group == 3 { 3 * 40 } else { 0 };
                    (u32::try_from(at / 40).unwrap_or(u32::MAX), at % 40)
                } else {
                    (slot, step * page_bytes)
                };
                PageCopy {
                    group: GroupId(group),
                    page,
                    staging_slot: slot,
                    staging_offset: offset,
                    len: page_bytes,
                }
            })
            .collect()
    })
}

/// A device and staging pool with the same deterministic contents each time.
fn seeded_device() -> Result<(Device, StagingPool), GpuError> {
    let device = Device::open_host(&[spec(0, 8, 16), spec(3, 4, 8)])?;
    for spec in device.geometry().pools() {
        for page in 0..spec.num_pages {
            device.write_page(
                spec.group,
                page,
                &pattern(spec.group, page, 5, spec.page_bytes),
            )?;
        }
    }
    let mut staging = device.staging_pool(40, 5)?;
    for (slot, bytes) in (0..).zip(staging.slots_mut()) {
        bytes.copy_from_slice(&pattern(GroupId(99), slot, 6, 40));
    }
    Ok((device, staging))
}

fn snapshot(device: &Device, staging: &StagingPool) -> Result<Vec<Vec<u8>>, GpuError> {
    let mut all = Vec::new();
    for spec in device.geometry().pools() {
        for page in 0..spec.num_pages {
            all.push(device.read_page_to_vec(spec.group, page)?);
        }
    }
    for slot in 0..staging.slots() {
        all.push(staging.slot(slot)?.to_vec());
    }
    Ok(all)
}

fn fail(error: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(error.to_string())
}

proptest! {
    #![proptest_config(Config {
        cases: 128,
        rng_seed: RngSeed::Fixed(0x0064_6576_6963_6573),
        failure_persistence: None,
        ..Config::default()
    })]

    /// `gpu::I5` / `copy::C2` end to end: one coalesced submission leaves pages and staging exactly
    /// as the same copies submitted one at a time, in fewer or equal transfers.
    #[test]
    fn i5_coalesced_submission_moves_the_same_bytes_as_one_copy_at_a_time(
        copies in arb_copies(),
        to_device in any::<bool>(),
    ) {
        let (batched_device, batched_staging) = seeded_device().map_err(fail)?;
        let (single_device, mut single_staging) = seeded_device().map_err(fail)?;
        let mut batched_stream = batched_device.stream().map_err(fail)?;
        let mut single_stream = single_device.stream().map_err(fail)?;
        let submit = |stream: &mut kv_connector::gpu::CopyStream, staging, copies: &[PageCopy]| {
            if to_device { stream.scatter(staging, copies) } else { stream.gather(staging, copies) }
        };
        let batched_staging = match submit(&mut batched_stream, batched_staging, &copies) {
            Ok(in_flight) => {
                let (staging, outcome) = in_flight.wait();
                outcome.map_err(fail)?;
                staging
            }
            // Two gathers into the same staging bytes: rejected, nothing to compare.
            Err(rejected) => {
                prop_assert_eq!(rejected.kind(), "overlapping_copies");
                prop_assert!(!to_device);
                return Ok(());
            }
        };
        for copy in &copies {
            let (staging, outcome) = submit(&mut single_stream, single_staging, std::slice::from_ref(copy))
                .map_err(|e| fail(e.error))?
                .wait();
            outcome.map_err(fail)?;
            single_staging = staging;
        }
        prop_assert_eq!(
            snapshot(&batched_device, &batched_staging).map_err(fail)?,
            snapshot(&single_device, &single_staging).map_err(fail)?
        );
        let (batched, single) = (batched_stream.counters(), single_stream.counters());
        prop_assert_eq!(batched.bytes_to_device + batched.bytes_to_host, single.bytes_to_device + single.bytes_to_host);
        prop_assert!(batched.runs_issued <= single.runs_issued);
    }
}
