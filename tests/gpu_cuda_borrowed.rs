//! Real-GPU tests of borrowed CUDA pages (`Device::borrow_cuda`, R31; feature `cuda-tests`,
//! need a driver and a device): memory allocated outside the device layer (here by cudarc
//! in the primary context, as torch allocates a KV cache) is used in place: nothing is
//! zeroed, a gather reads it, a scatter writes it, the connector's `save_pages` /
//! `load_pages` round-trip through it byte-identical (R5, R24), memory the driver does not
//! know as device memory is refused (B3), and the owner lives as long as the device (B4).
//!
//! Run on a GPU machine: `cargo test --release --features cuda-tests --test gpu_cuda_borrowed`.

#![cfg(feature = "cuda-tests")]

use std::error::Error;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::core::layout::GroupId;
use kv_connector::core::object::HEADER_BYTES;
use kv_connector::gpu::{BorrowedPages, Device, GpuError, PageCopy};
use kv_connector::pool::{MemoryPool, SystemClock};
use kv_connector::transfer::{save_pages, LoadMoved, PageRef, SaveResult};

mod gpu_common;

use gpu_common::{load_all, page_ref, GPT_OSS_PAGE};

type TestResult = Result<(), Box<dyn Error>>;

/// A cudarc stream and the allocation the test borrows pages from.
type Allocation = (Arc<CudaStream>, Arc<CudaSlice<u8>>);

const GROUP: GroupId = GroupId(0);

fn pattern(page: u32, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((i ^ (u64::from(page) * 0x9e37)).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8)
        .collect()
}

/// `pages` pages of `page_bytes` allocated by cudarc on device 0, page `p` filled with
/// `pattern(p)` for every `p` in `filled`.
fn allocate(pages: u32, page_bytes: usize, filled: &[u32]) -> Result<Allocation, Box<dyn Error>> {
    let stream = CudaContext::new(0)?.default_stream();
    let mut bytes = vec![0u8; pages as usize * page_bytes];
    for &page in filled {
        let start = page as usize * page_bytes;
        bytes[start..start + page_bytes].copy_from_slice(&pattern(page, page_bytes));
    }
    let slice = stream.clone_htod(&bytes)?;
    stream.synchronize()?;
    Ok((stream, Arc::new(slice)))
}

/// A device on `slice`, which the owner box keeps alive.
#[expect(
    unsafe_code,
    reason = "the one call that hands caller-owned memory to the device layer"
)]
fn borrow(
    stream: &Arc<CudaStream>,
    slice: &Arc<CudaSlice<u8>>,
    page_bytes: usize,
) -> Result<Device, GpuError> {
    let (base, _sync) = slice.device_ptr(stream);
    let region = BorrowedPages {
        group: GROUP,
        base,
        page_bytes,
        num_pages: u32::try_from(slice.len() / page_bytes).unwrap_or(0),
    };
    // SAFETY: the region is exactly the cudarc allocation on device 0, which the owner box
    // keeps alive while the device lives; the test reads it back only after copies waited.
    unsafe { Device::borrow_cuda(0, &[region], Box::new(Arc::clone(slice))) }
}

fn copy(page: u32, len: usize) -> PageCopy {
    PageCopy {
        group: GROUP,
        page,
        staging_slot: 0,
        staging_offset: 0,
        len,
    }
}

#[test]
fn borrowed_pages_are_read_and_written_in_place() -> TestResult {
    let page_bytes = 4096;
    let (stream, slice) = allocate(4, page_bytes, &[1])?;
    let device = borrow(&stream, &slice, page_bytes)?;
    assert!(device.is_borrowed());
    assert_eq!(device.cuda_ordinal(), Some(0));
    assert_eq!(
        device.read_page_to_vec(GROUP, 1)?,
        pattern(1, page_bytes),
        "not zeroed"
    );

    let mut copies = device.stream()?;
    let staging = device.staging_pool(page_bytes, 1)?;
    let (staging, outcome) = copies
        .gather(staging, &[copy(1, page_bytes)])
        .map_err(|refused| refused.error)?
        .wait();
    outcome?;
    let (_, outcome) = copies
        .scatter(staging, &[copy(3, page_bytes)])
        .map_err(|refused| refused.error)?
        .wait();
    outcome?;
    device.write_page(GROUP, 0, &pattern(9, page_bytes))?;

    let memory = stream.clone_dtoh(&*slice)?;
    assert_eq!(
        memory[3 * page_bytes..],
        pattern(1, page_bytes)[..],
        "scatter in place"
    );
    assert_eq!(
        memory[..page_bytes],
        pattern(9, page_bytes)[..],
        "write_page in place"
    );
    assert_eq!(
        memory[2 * page_bytes..3 * page_bytes],
        vec![0; page_bytes][..]
    );

    drop((copies, device));
    assert_eq!(
        Arc::strong_count(&slice),
        1,
        "B4: the owner went with the device"
    );
    Ok(())
}

/// The connector's procedures on borrowed pages: `save_pages` then `load_pages` into
/// other pages; every page comes back byte-identical (R5, R24).
#[test]
fn connector_save_then_load_through_borrowed_pages() -> TestResult {
    let (stream, slice) = allocate(24, GPT_OSS_PAGE, &(0..6).collect::<Vec<_>>())?;
    let device = borrow(&stream, &slice, GPT_OSS_PAGE)?;
    let pool = MemoryPool::new(
        EvictionPolicy::mooncake_defaults(1 << 30),
        Arc::new(SystemClock::new()),
    )?;
    let (mut save_stream, mut load_stream) = (device.stream()?, device.stream()?);
    let slot_bytes = HEADER_BYTES + GPT_OSS_PAGE;
    let saves: Vec<PageRef> = (0..6).map(|b| page_ref(b, b)).collect();
    let (_, results) = save_pages(
        &pool,
        &mut save_stream,
        device.staging_pool(slot_bytes, 4)?,
        &saves,
    );
    assert_eq!(results, vec![SaveResult::Stored; 6]);
    let loads: Vec<_> = (0..6).map(|b| page_ref(b, 12 + b)).collect();
    let (_, moved) = load_all(
        &pool,
        &mut load_stream,
        device.staging_pool(slot_bytes, 3)?,
        &loads,
        None,
    );
    assert_eq!(
        moved,
        Ok(LoadMoved {
            pages: 6,
            bytes: 6 * GPT_OSS_PAGE as u64
        })
    );
    let memory = stream.clone_dtoh(&*slice)?;
    for block in 0..6 {
        let start = (12 + block as usize) * GPT_OSS_PAGE;
        assert_eq!(
            memory[start..start + GPT_OSS_PAGE],
            pattern(block, GPT_OSS_PAGE)[..],
            "block {block}"
        );
    }
    Ok(())
}

#[test]
#[expect(
    unsafe_code,
    reason = "the call under test; it must refuse before any copy"
)]
fn host_memory_named_as_device_memory_is_refused() {
    let host = vec![0u64; 512];
    let region = BorrowedPages {
        group: GROUP,
        base: host.as_ptr() as u64,
        page_bytes: 4096,
        num_pages: 1,
    };
    // SAFETY: the driver check refuses the host address before any copy could use it.
    let refused = unsafe { Device::borrow_cuda(0, &[region], Box::new(())) };
    let err = refused.unwrap_err();
    assert!(
        matches!(err.kind(), "cuda_driver" | "borrowed_wrong_device"),
        "{err}"
    );
}
