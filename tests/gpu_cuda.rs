//! Real-GPU tests of the CUDA backend (feature `cuda-tests`; need a driver and a device).
//!
//! They cover: pages that start zeroed and round-trip byte-identical through pinned staging (write,
//! gather, scatter to other pages, read back; `gpu::I1`, `gpu::I5`); several streams driven from
//! several threads at once (`gpu::I2`); an `InFlight` dropped without waiting (`gpu::I3`); rejected
//! submissions that hand staging back untouched (`gpu::I4`); failed copies and a poisoned device
//! reported as failed loads and saves (`gpu::I6`, `gpu::I7`, R25); driver errors that are typed and
//! not sticky; and the connector's own `save_pages` / `load_pages` over a `MemoryPool` with
//! gpt-oss-120b-sized pages (R5, R19, R24).
//!
//! Run on a GPU machine: `cargo test --release --features cuda-tests --test gpu_cuda`.

#![cfg(feature = "cuda-tests")]

use std::error::Error;
use std::sync::Arc;
use std::thread;

use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::core::layout::GroupId;
use kv_connector::core::ledger::LoadFailure;
use kv_connector::core::object::HEADER_BYTES;
use kv_connector::gpu::{
    CopyDirection, Device, DeviceKind, DeviceRequest, GpuError, PageCopy, StagingPool,
};
use kv_connector::pool::{MemoryPool, SystemClock};
use kv_connector::transfer::{save_pages, LoadMoved, PageRef, SaveResult};

mod gpu_common;

use gpu_common::{load_all, page_ref, spec, GPT_OSS_PAGE};

type TestResult = Result<(), Box<dyn Error>>;

/// Deterministic page contents, distinct per (group, page, salt).
fn pattern(group: GroupId, page: u32, salt: u32, len: usize) -> Vec<u8> {
    let seed = u64::from(group.0) * 0x9e37_79b9 + u64::from(page) * 0x85eb_ca6b + u64::from(salt);
    (0..len as u64)
        .map(|i| {
            let mixed = (i ^ seed).wrapping_mul(0x2545_f491_4f6c_dd1d);
            (mixed >> 56) as u8
        })
        .collect()
}

fn copy(group: GroupId, page: u32, slot: u32, offset: usize, len: usize) -> PageCopy {
    PageCopy {
        group,
        page,
        staging_slot: slot,
        staging_offset: offset,
        len,
    }
}

/// Scatters or gathers and waits; the copy's error becomes the test's error.
fn run(
    stream: &mut kv_connector::gpu::CopyStream,
    direction: CopyDirection,
    staging: StagingPool,
    copies: &[PageCopy],
) -> Result<StagingPool, GpuError> {
    let in_flight = match direction {
        CopyDirection::HostToDevice => stream.scatter(staging, copies),
        CopyDirection::DeviceToHost => stream.gather(staging, copies),
    }
    .map_err(|refused| refused.error)?;
    assert_eq!(in_flight.direction(), direction);
    let (staging, outcome) = in_flight.wait();
    outcome?;
    Ok(staging)
}

#[test]
fn auto_picks_cuda_and_pages_start_zeroed() -> TestResult {
    let device = Device::open(DeviceRequest::Auto, &[spec(0, 4096, 4)])?;
    assert_eq!(device.kind(), DeviceKind::Cuda);
    assert_eq!(device.cuda_ordinal(), Some(0));
    assert_eq!(device.read_page_to_vec(GroupId(0), 3)?, vec![0; 4096]);
    let staging = device.staging_pool(4096, 2)?;
    assert!(staging.is_pinned());
    assert_eq!(staging.slot(1)?, &[0; 4096][..]);
    Ok(())
}

/// Write pages, gather them into staging behind a header, scatter to other pages, read
/// back: every byte identical, also for coalesced runs and two groups of different sizes.
#[test]
fn pages_round_trip_byte_identical_through_staging() -> TestResult {
    let (small, large) = (GroupId(0), GroupId(1));
    let device = Device::open_cuda(0, &[spec(0, 4096 + 8, 16), spec(1, GPT_OSS_PAGE, 8)])?;
    let mut stream = device.stream()?;
    let header = 64;
    let mut staging = device.staging_pool(header + 4 * GPT_OSS_PAGE, 2)?;
    for page in 0..4 {
        device.write_page(small, page, &pattern(small, page, 1, 4096 + 8))?;
        device.write_page(large, page, &pattern(large, page, 1, GPT_OSS_PAGE))?;
    }
    // Large pages 0..4 back to back in slot 0 (one coalesced run); small pages in slot 1.
    let gather: Vec<PageCopy> = (0..4)
        .map(|p| {
            copy(
                large,
                p,
                0,
                header + p as usize * GPT_OSS_PAGE,
                GPT_OSS_PAGE,
            )
        })
        .chain((0..4).map(|p| copy(small, p, 1, header + p as usize * 5000, 4096 + 8)))
        .collect();
    staging = run(&mut stream, CopyDirection::DeviceToHost, staging, &gather)?;
    assert_eq!(stream.counters().runs_issued, 1 + 4);
    let slot0 = staging.slot(0)?;
    assert_eq!(
        &slot0[header..header + GPT_OSS_PAGE],
        &pattern(large, 0, 1, GPT_OSS_PAGE)[..]
    );
    // Scatter everything to pages 4..8 of each group and read back.
    let scatter: Vec<PageCopy> = gather
        .iter()
        .map(|c| PageCopy {
            page: c.page + 4,
            ..*c
        })
        .collect();
    run(&mut stream, CopyDirection::HostToDevice, staging, &scatter)?;
    for page in 0..4 {
        assert_eq!(
            device.read_page_to_vec(large, page + 4)?,
            pattern(large, page, 1, GPT_OSS_PAGE)
        );
        assert_eq!(
            device.read_page_to_vec(small, page + 4)?,
            pattern(small, page, 1, 4096 + 8)
        );
    }
    // Untouched pages stay zero.
    assert_eq!(device.read_page_to_vec(small, 15)?, vec![0; 4096 + 8]);
    Ok(())
}

/// Eight threads, each with its own stream and staging pool, round-trip their own pages
/// many times at once through one shared device.
#[test]
fn several_streams_from_several_threads() -> TestResult {
    const THREADS: u32 = 8;
    const PAGES_EACH: u32 = 8;
    const PAGE: usize = 256 * 1024;
    let group = GroupId(0);
    let device = Device::open_cuda(0, &[spec(0, PAGE, THREADS * PAGES_EACH * 2)])?;
    let workers: Vec<_> = (0..THREADS)
        .map(|worker| {
            let device = device.clone();
            thread::spawn(move || -> Result<u64, GpuError> {
                let mut stream = device.stream()?;
                let mut staging = device.staging_pool(PAGE, PAGES_EACH)?;
                let first = worker * PAGES_EACH * 2;
                let mut checked = 0;
                for round in 0..6_u32 {
                    for (slot, bytes) in staging.slots_mut().enumerate() {
                        let page = first + u32::try_from(slot).unwrap_or(0);
                        bytes.copy_from_slice(&pattern(group, page, round, PAGE));
                    }
                    let to_pages: Vec<PageCopy> = (0..PAGES_EACH)
                        .map(|s| copy(group, first + s, s, 0, PAGE))
                        .collect();
                    staging = run(&mut stream, CopyDirection::HostToDevice, staging, &to_pages)?;
                    // Gather into the other half of this worker's pages' staging, reversed.
                    let back: Vec<PageCopy> = (0..PAGES_EACH)
                        .map(|s| copy(group, first + s, PAGES_EACH - 1 - s, 0, PAGE))
                        .collect();
                    staging = run(&mut stream, CopyDirection::DeviceToHost, staging, &back)?;
                    for slot in 0..PAGES_EACH {
                        let page = first + (PAGES_EACH - 1 - slot);
                        assert_eq!(staging.slot(slot)?, &pattern(group, page, round, PAGE)[..]);
                        checked += 1;
                    }
                }
                Ok(checked)
            })
        })
        .collect();
    let mut checked = 0;
    for worker in workers {
        checked += worker.join().map_err(|_| "worker panicked")??;
    }
    assert_eq!(checked, u64::from(THREADS * PAGES_EACH) * 6);
    Ok(())
}

/// `gpu::I3`: an `InFlight` dropped without `wait` finishes its copy before staging is freed.
#[test]
fn dropping_an_in_flight_copy_finishes_it_first() -> TestResult {
    let group = GroupId(0);
    let device = Device::open_cuda(0, &[spec(0, 1 << 20, 8)])?;
    let mut stream = device.stream()?;
    let mut staging = device.staging_pool(8 << 20, 1)?;
    staging
        .slot_mut(0)?
        .copy_from_slice(&pattern(group, 0, 9, 8 << 20));
    let copies: Vec<PageCopy> = (0..8)
        .map(|p| copy(group, p, 0, (p as usize) << 20, 1 << 20))
        .collect();
    let in_flight = stream.scatter(staging, &copies).map_err(|r| r.error)?;
    drop(in_flight);
    let expected = pattern(group, 0, 9, 8 << 20);
    for page in 0..8_u32 {
        let start = (page as usize) << 20;
        assert_eq!(
            device.read_page_to_vec(group, page)?,
            &expected[start..start + (1 << 20)]
        );
    }
    Ok(())
}

/// `gpu::I4`: an invalid submission is rejected before any byte moves, staging comes back intact,
/// and the stream stays usable.
#[test]
fn invalid_submissions_are_rejected_and_hand_staging_back() -> TestResult {
    let group = GroupId(0);
    let device = Device::open_cuda(0, &[spec(0, 4096, 2)])?;
    let mut stream = device.stream()?;
    let mut staging = device.staging_pool(4096, 1)?;
    staging.slot_mut(0)?.fill(5);
    let refused = stream
        .scatter(
            staging,
            &[copy(group, 0, 0, 0, 4096), copy(group, 2, 0, 0, 4096)],
        )
        .err()
        .ok_or("out-of-range page accepted")?;
    assert_eq!(refused.kind(), "page_out_of_range");
    let (staging, _) = refused.into_parts();
    assert_eq!(staging.slot(0)?, &[5; 4096][..]);
    assert_eq!(device.read_page_to_vec(group, 0)?, vec![0; 4096]);
    run(
        &mut stream,
        CopyDirection::HostToDevice,
        staging,
        &[copy(group, 0, 0, 0, 4096)],
    )?;
    assert_eq!(device.read_page_to_vec(group, 0)?, vec![5; 4096]);
    Ok(())
}

/// Driver errors are typed, keep the driver's error as source, and are not sticky: a
/// page pool larger than the GPU fails in `cuMemAlloc` and another device opens fine; a
/// missing ordinal is refused with the host setting named.
#[test]
fn driver_errors_are_typed_and_recoverable() -> TestResult {
    let too_big = Device::open_cuda(0, &[spec(0, 1 << 30, 1024)]).unwrap_err(); // 1 TiB
    assert_eq!(too_big.kind(), "cuda_driver", "{too_big}");
    assert!(too_big.source().is_some());
    assert!(!too_big.is_sticky());
    let device = Device::open_cuda(0, &[spec(0, 4096, 1)])?;
    device.write_page(GroupId(0), 0, &[1; 4096])?;
    assert_eq!(device.read_page_to_vec(GroupId(0), 0)?, vec![1; 4096]);
    let missing = Device::open_cuda(999, &[spec(0, 4096, 1)]).unwrap_err();
    assert_eq!(missing.kind(), "cuda_no_device");
    assert!(missing.to_string().contains("device.kind = \"host\""));
    Ok(())
}

fn pool() -> Result<MemoryPool, Box<dyn Error>> {
    let policy = EvictionPolicy::mooncake_defaults(1 << 30);
    Ok(MemoryPool::new(policy, Arc::new(SystemClock::new()))?)
}

/// The connector's procedures on the GPU: `save_pages` (gather, seal, put) then
/// `load_pages` (get, verify, scatter) into other pages, in several staging batches;
/// every page comes back byte-identical (R5, R19, R24).
#[test]
fn connector_save_then_load_is_byte_identical() -> TestResult {
    let group = GroupId(0);
    let pool = pool()?;
    let device = Device::open_cuda(0, &[spec(0, GPT_OSS_PAGE, 32)])?;
    let (mut save_stream, mut load_stream) = (device.stream()?, device.stream()?);
    let slot_bytes = HEADER_BYTES + GPT_OSS_PAGE;
    let (mut save_staging, mut load_staging) = (
        device.staging_pool(slot_bytes, 4)?,
        device.staging_pool(slot_bytes, 3)?,
    );
    for page in 0..10 {
        device.write_page(group, page, &pattern(group, page, 3, GPT_OSS_PAGE))?;
    }
    let saves: Vec<PageRef> = (0..10).map(|b| page_ref(b, b)).collect();
    let results;
    (save_staging, results) = save_pages(&pool, &mut save_stream, save_staging, &saves);
    assert_eq!(results, vec![SaveResult::Stored; 10]);
    let again;
    (_, again) = save_pages(&pool, &mut save_stream, save_staging, &saves[..2]);
    assert_eq!(again, vec![SaveResult::SkippedPresent; 2], "R19");
    let loads: Vec<PageRef> = (0..10).map(|b| page_ref(b, 16 + b)).collect();
    let moved;
    (load_staging, moved) = load_all(&pool, &mut load_stream, load_staging, &loads, None);
    assert_eq!(
        moved,
        Ok(LoadMoved {
            pages: 10,
            bytes: 10 * GPT_OSS_PAGE as u64
        })
    );
    assert!(load_staging.is_pinned());
    for block in 0..10 {
        assert_eq!(
            device.read_page_to_vec(group, 16 + block)?,
            pattern(group, block, 3, GPT_OSS_PAGE)
        );
    }
    Ok(())
}

/// R25 on the GPU: an injected copy failure fails the load (and the save); a poisoned
/// device fails both with staging handed back; an invalid page fails the load.
#[test]
fn failed_copies_are_failed_loads_and_saves() -> TestResult {
    let group = GroupId(0);
    let pool = pool()?;
    let device = Device::open_cuda(0, &[spec(0, GPT_OSS_PAGE, 8)])?;
    let mut stream = device.stream()?;
    let mut staging = device.staging_pool(HEADER_BYTES + GPT_OSS_PAGE, 2)?;
    device.write_page(group, 0, &pattern(group, 0, 4, GPT_OSS_PAGE))?;

    device.inject_copy_failures(1);
    let results;
    (staging, results) = save_pages(&pool, &mut stream, staging, &[page_ref(1, 0)]);
    assert_eq!(results, vec![SaveResult::Failed]);
    let results;
    (staging, results) = save_pages(&pool, &mut stream, staging, &[page_ref(1, 0)]);
    assert_eq!(results, vec![SaveResult::Stored]);

    device.inject_copy_failures(1);
    let loaded;
    (staging, loaded) = load_all(&pool, &mut stream, staging, &[page_ref(1, 3)], None);
    assert_eq!(loaded, Err(LoadFailure::DeviceCopy));
    assert_eq!(stream.counters().issue_failures, 2);

    let loaded;
    (staging, loaded) = load_all(&pool, &mut stream, staging, &[page_ref(1, 99)], None);
    assert_eq!(loaded, Err(LoadFailure::DeviceCopy), "page out of range");

    let loaded;
    (staging, loaded) = load_all(&pool, &mut stream, staging, &[page_ref(1, 3)], None);
    assert_eq!(loaded.map(|m| m.pages), Ok(1));
    assert_eq!(
        device.read_page_to_vec(group, 3)?,
        pattern(group, 0, 4, GPT_OSS_PAGE)
    );

    device.poison();
    let loaded;
    (staging, loaded) = load_all(&pool, &mut stream, staging, &[page_ref(1, 4)], None);
    assert_eq!(loaded, Err(LoadFailure::DeviceCopy));
    let results;
    (staging, results) = save_pages(&pool, &mut stream, staging, &[page_ref(2, 0)]);
    assert_eq!(results, vec![SaveResult::Failed]);
    assert_eq!(staging.slots(), 2);
    assert!(matches!(device.stream(), Err(GpuError::Poisoned)));
    assert!(matches!(
        device.read_page_to_vec(group, 3),
        Err(GpuError::Poisoned)
    ));
    Ok(())
}
