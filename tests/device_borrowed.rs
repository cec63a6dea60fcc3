//! Integration tests of borrowed page memory on the host backend (`Device::borrow_host`,
//! R31): the device uses the caller's memory as it is (nothing zeroed), loads write pages
//! in place and saves read them (plain and checked submissions, whose checksums are those
//! of the caller's bytes), the engine-side page calls reach the same memory, regions are
//! validated (B1, B2), and the owner is dropped only after the device's last clone (B4).

use std::error::Error;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use kv_connector::core::layout::GroupId;
use kv_connector::core::object::checksum;
use kv_connector::gpu::{BorrowedPages, Device, GpuError, PageCopy, StagingPool, SubmitError};

type TestResult = Result<(), Box<dyn Error>>;

/// Caller-owned memory the device writes through raw pointers: atomics, so the writes are
/// mutation through a shared handle (interior mutability), read back with `load`.
type Memory = Arc<[AtomicU8]>;

const FULL: GroupId = GroupId(0);
const WINDOW: GroupId = GroupId(1);
/// Group 0: 4 pages of 64 bytes at offset 0; group 1: 2 pages of 32 bytes right after.
const FULL_PAGE: usize = 64;
const WINDOW_PAGE: usize = 32;
const WINDOW_OFFSET: usize = 4 * FULL_PAGE;
const MEMORY_BYTES: usize = WINDOW_OFFSET + 2 * WINDOW_PAGE;

fn memory() -> Memory {
    (0..MEMORY_BYTES).map(|_| AtomicU8::new(0)).collect()
}

fn read(memory: &Memory, offset: usize, len: usize) -> Vec<u8> {
    memory[offset..offset + len]
        .iter()
        .map(|byte| byte.load(Ordering::Relaxed))
        .collect()
}

fn write(memory: &Memory, offset: usize, bytes: &[u8]) {
    for (cell, &byte) in memory[offset..].iter().zip(bytes) {
        cell.store(byte, Ordering::Relaxed);
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            seed.wrapping_mul(31)
                .wrapping_add(u8::try_from(i % 251).unwrap_or(0))
        })
        .collect()
}

fn regions(memory: &Memory) -> [BorrowedPages; 2] {
    let base = memory.as_ptr() as u64;
    [
        BorrowedPages {
            group: FULL,
            base,
            page_bytes: FULL_PAGE,
            num_pages: 4,
        },
        BorrowedPages {
            group: WINDOW,
            base: base + WINDOW_OFFSET as u64,
            page_bytes: WINDOW_PAGE,
            num_pages: 2,
        },
    ]
}

/// A host device on `memory`, which the owner box keeps alive.
#[expect(
    unsafe_code,
    reason = "the one call that hands caller-owned memory to the device layer"
)]
fn borrow(memory: &Memory, regions: &[BorrowedPages]) -> Result<Device, GpuError> {
    // SAFETY: every region lies inside `memory` (an allocation of MEMORY_BYTES that the
    // owner box keeps alive while the device lives); the test touches a page only between
    // device calls, never while a copy runs.
    unsafe { Device::borrow_host(regions, Box::new(Arc::clone(memory))) }
}

fn copy(group: GroupId, page: u32, slot: u32, len: usize) -> PageCopy {
    PageCopy {
        group,
        page,
        staging_slot: slot,
        staging_offset: 0,
        len,
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
fn pages_are_the_callers_memory_in_place() -> TestResult {
    let memory = memory();
    let page1 = pattern(1, FULL_PAGE);
    write(&memory, FULL_PAGE, &page1);
    let device = borrow(&memory, &regions(&memory))?;
    assert!(device.is_borrowed());
    assert_eq!(
        device.read_page_to_vec(FULL, 1)?,
        page1,
        "nothing is zeroed"
    );

    // A save reads the page, a load writes another one in place.
    let mut stream = device.stream()?;
    let staging = device.staging_pool(FULL_PAGE, 2)?;
    let staging = wait_ok(stream.gather(staging, &[copy(FULL, 1, 0, FULL_PAGE)]))?;
    assert_eq!(staging.slot(0)?, &page1[..]);
    let _staging = wait_ok(stream.scatter(staging, &[copy(FULL, 3, 0, FULL_PAGE)]))?;
    assert_eq!(read(&memory, 3 * FULL_PAGE, FULL_PAGE), page1);

    // The engine-side calls reach the same memory; the neighbours stay untouched.
    let window = pattern(7, WINDOW_PAGE);
    device.write_page(WINDOW, 1, &window)?;
    assert_eq!(
        read(&memory, WINDOW_OFFSET + WINDOW_PAGE, WINDOW_PAGE),
        window
    );
    assert_eq!(
        read(&memory, WINDOW_OFFSET, WINDOW_PAGE),
        vec![0; WINDOW_PAGE]
    );
    assert_eq!(read(&memory, 2 * FULL_PAGE, FULL_PAGE), vec![0; FULL_PAGE]);
    Ok(())
}

#[test]
fn checked_submissions_checksum_the_callers_bytes() -> TestResult {
    let memory = memory();
    let page = pattern(3, WINDOW_PAGE);
    write(&memory, WINDOW_OFFSET, &page);
    let device = borrow(&memory, &regions(&memory))?;
    let mut stream = device.stream()?;
    let staging = device.staging_pool(WINDOW_PAGE, 1)?;
    let (staging, sums) = stream
        .gather_checked(staging, &[copy(WINDOW, 0, 0, WINDOW_PAGE)])
        .map_err(|refused| refused.error)?
        .wait();
    assert_eq!(sums?, vec![checksum(&page)]);
    let (_, sums) = stream
        .scatter_checked(staging, &[copy(FULL, 2, 0, WINDOW_PAGE)])
        .map_err(|refused| refused.error)?
        .wait();
    assert_eq!(sums?, vec![checksum(&page)]);
    assert_eq!(
        read(&memory, 2 * FULL_PAGE, WINDOW_PAGE),
        page,
        "a prefix load lands in place"
    );
    Ok(())
}

#[test]
fn b4_the_owner_outlives_every_clone_and_stream() -> TestResult {
    let memory = memory();
    let device = borrow(&memory, &regions(&memory))?;
    let clone = device.clone();
    let stream = device.stream()?;
    drop(device);
    assert_eq!(Arc::strong_count(&memory), 2, "the owner is still held");
    drop(clone);
    assert_eq!(
        Arc::strong_count(&memory),
        2,
        "the stream still holds the device"
    );
    drop(stream);
    assert_eq!(
        Arc::strong_count(&memory),
        1,
        "the owner went with the last user"
    );
    Ok(())
}

#[test]
fn b1_b2_bad_regions_are_refused_and_the_owner_dropped() {
    let memory = memory();
    let [full, window] = regions(&memory);
    let overlapping = BorrowedPages {
        base: full.base + FULL_PAGE as u64,
        ..window
    };
    let err = borrow(&memory, &[full, overlapping]).unwrap_err();
    assert!(matches!(
        err,
        GpuError::BorrowedOverlap {
            first: FULL,
            second: WINDOW
        }
    ));
    assert!(err.to_string().contains("overlap"), "{err}");
    let null = BorrowedPages { base: 0, ..full };
    assert_eq!(
        borrow(&memory, &[null]).unwrap_err().kind(),
        "borrowed_region_invalid"
    );
    let twice = borrow(
        &memory,
        &[
            full,
            BorrowedPages {
                group: FULL,
                ..window
            },
        ],
    )
    .unwrap_err();
    assert_eq!(twice.kind(), "duplicate_group");
    assert_eq!(
        Arc::strong_count(&memory),
        1,
        "a refused borrow drops its owner"
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
#[expect(unsafe_code, reason = "the call under test; it refuses before any use")]
fn cuda_borrow_without_the_cuda_build_is_refused() {
    let memory = memory();
    // SAFETY: without the `cuda` feature the call fails before anything could touch the
    // memory.
    let refused = unsafe { Device::borrow_cuda(0, &regions(&memory), Box::new(())) };
    assert!(matches!(refused, Err(GpuError::CudaNotBuilt)));
}

#[test]
#[expect(unsafe_code, reason = "the call under test; it refuses before any use")]
fn b3_unaligned_cuda_pages_are_refused_before_the_driver() {
    let memory = memory();
    let [full, _] = regions(&memory);
    let unaligned = BorrowedPages {
        base: full.base + 1,
        ..full
    };
    // SAFETY: the call fails on the alignment check, before any driver call or any use of
    // the (host) memory.
    let refused = unsafe { Device::borrow_cuda(0, &[unaligned], Box::new(())) };
    let err = refused.unwrap_err();
    assert_eq!(err.kind(), "borrowed_region_invalid");
    assert!(err.to_string().contains("8-byte"), "{err}");
}
