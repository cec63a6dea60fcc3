//! Real-GPU tests of checked submissions and the zero-copy pool path (feature
//! `cuda-tests`; need a driver and a device).
//!
//! They cover: the checksum kernel agrees with the CPU definition (`core::object::checksum`) for
//! pages of many sizes, prefixes that end inside a word, and pages large enough to be split over
//! many blocks (`checked::V4`, `checksum::C3`); scatters from pinned pool objects and gathers into
//! them (`checked::V2`); the connector's `save_pages` / `load_pages` over a `MemoryPool` whose
//! objects live in pinned memory (lend, alloc, commit: no CPU copy, no CPU checksum) coming back
//! byte-identical (R5, R24); a corrupted stored payload failing the load as corrupt (R5, R25); page
//! sizes the kernel cannot read refused at open.
//!
//! Run on a GPU machine: `cargo test --release --features cuda-tests --test gpu_cuda_checked`.

#![cfg(feature = "cuda-tests")]

use std::error::Error;
use std::sync::Arc;

use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::core::layout::GroupId;
use kv_connector::core::ledger::LoadFailure;
use kv_connector::core::object::{self, checksum, HEADER_BYTES};
use kv_connector::gpu::{Device, PageCopy, PagePoolSpec};
use kv_connector::pool::{MemoryPool, Pool, SystemClock};
use kv_connector::transfer::{save_pages, LoadMoved, PageRef, SaveResult};

mod gpu_common;

use gpu_common::{identity, load_all, page_ref, spec, GPT_OSS_PAGE};

type TestResult = Result<(), Box<dyn Error>>;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            ((i ^ seed.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

fn copy(group: u32, page: u32, slot: u32, offset: usize, len: usize) -> PageCopy {
    PageCopy {
        group: GroupId(group),
        page,
        staging_slot: slot,
        staging_offset: offset,
        len,
    }
}

/// (page bytes, copy length): small, tails of 1-7 bytes, one block, many blocks.
const SHAPES: [(usize, usize); 8] = [
    (8, 8),
    (8, 5),
    (64, 61),
    (4096, 4096),
    (40_960, 40_953),
    (1 << 20, 1 << 20),
    (GPT_OSS_PAGE, GPT_OSS_PAGE),
    (GPT_OSS_PAGE, GPT_OSS_PAGE - 3),
];

#[test]
fn kernel_checksums_match_the_cpu_definition() -> TestResult {
    let specs: Vec<PagePoolSpec> = (0_u32..)
        .zip(SHAPES)
        .map(|(group, (page_bytes, _))| spec(group, page_bytes, 2))
        .collect();
    let device = Device::open_cuda(0, &specs)?;
    let mut stream = device.stream()?;
    let arena = device.host_arena();
    assert!(arena.is_pinned());
    let mut objects = Vec::new();
    let mut copies = Vec::new();
    let mut expected = Vec::new();
    for (group, &(_, len)) in SHAPES.iter().enumerate() {
        let payload = pattern(group as u64 + 1, len);
        let mut object = arena.alloc(16 + len)?;
        object[16..].copy_from_slice(&payload);
        objects.push(object.share());
        let group = u32::try_from(group)?;
        copies.push(copy(group, 1, group, 16, len));
        expected.push(checksum(&payload));
    }
    let (objects, sums) = stream
        .scatter_checked(objects, &copies)
        .map_err(|r| r.error)?
        .wait();
    assert_eq!(sums?, expected, "scatter: device checksums of what landed");
    for (group, &(_, len)) in SHAPES.iter().enumerate() {
        let page = device.read_page_to_vec(GroupId(u32::try_from(group)?), 1)?;
        assert_eq!(&page[..len], &objects[group][16..]);
    }
    let targets = SHAPES
        .iter()
        .map(|&(_, len)| arena.alloc(len))
        .collect::<Result<Vec<_>, _>>()?;
    let back: Vec<PageCopy> = copies
        .iter()
        .map(|c| PageCopy {
            staging_offset: 0,
            ..*c
        })
        .collect();
    let (targets, sums) = stream
        .gather_checked(targets, &back)
        .map_err(|r| r.error)?
        .wait();
    assert_eq!(
        sums?, expected,
        "gather: device checksums of the source pages"
    );
    for (target, object) in targets.iter().zip(&objects) {
        assert_eq!(&target[..], &object[16..]);
    }
    Ok(())
}

fn pinned_pool(device: &Device) -> Result<MemoryPool, Box<dyn Error>> {
    let policy = EvictionPolicy::mooncake_defaults(1 << 30);
    Ok(MemoryPool::with_arena(
        policy,
        Arc::new(SystemClock::new()),
        device.host_arena(),
    )?)
}

/// Zero-copy on the GPU: saves gather into pinned pool objects and commit them, loads
/// scatter straight from lent objects; every page comes back byte-identical (R5, R24).
#[test]
fn zero_copy_save_then_load_is_byte_identical() -> TestResult {
    let device = Device::open_cuda(0, &[spec(0, GPT_OSS_PAGE, 32)])?;
    let pool = pinned_pool(&device)?;
    let (mut save_stream, mut load_stream) = (device.stream()?, device.stream()?);
    let slot_bytes = HEADER_BYTES + GPT_OSS_PAGE;
    let (save_staging, load_staging) = (
        device.staging_pool(slot_bytes, 4)?,
        device.staging_pool(slot_bytes, 3)?,
    );
    for page in 0..10 {
        device.write_page(
            GroupId(0),
            page,
            &pattern(u64::from(page) + 100, GPT_OSS_PAGE),
        )?;
    }
    let saves: Vec<PageRef> = (0..10).map(|b| page_ref(b, b)).collect();
    let (_, results) = save_pages(&pool, &mut save_stream, save_staging, &saves);
    assert_eq!(results, vec![SaveResult::Stored; 10]);
    assert_eq!(pool.counters().puts, 10);
    let loads: Vec<PageRef> = (0..10).map(|b| page_ref(b, 16 + b)).collect();
    let (_, moved) = load_all(&pool, &mut load_stream, load_staging, &loads, None);
    assert_eq!(
        moved,
        Ok(LoadMoved {
            pages: 10,
            bytes: 10 * GPT_OSS_PAGE as u64
        })
    );
    for block in 0..10 {
        assert_eq!(
            device.read_page_to_vec(GroupId(0), 16 + block)?,
            pattern(u64::from(block) + 100, GPT_OSS_PAGE)
        );
    }
    Ok(())
}

/// A stored payload that no longer matches its header's checksum is caught by the device
/// checksum of the landed page, and the load fails as corrupt (R5, R25).
#[test]
fn a_corrupted_payload_fails_the_load_as_corrupt() -> TestResult {
    let device = Device::open_cuda(0, &[spec(0, GPT_OSS_PAGE, 4)])?;
    let pool = pinned_pool(&device)?;
    let mut object = vec![0; HEADER_BYTES + GPT_OSS_PAGE];
    object[HEADER_BYTES..].copy_from_slice(&pattern(7, GPT_OSS_PAGE));
    object::seal(&identity(1), &mut object, GPT_OSS_PAGE)?;
    object[HEADER_BYTES + 123_457] ^= 0x10;
    for result in pool.put(&["gpt-oss/1"], &[&object]) {
        result?;
    }
    let mut stream = device.stream()?;
    let staging = device.staging_pool(HEADER_BYTES + GPT_OSS_PAGE, 2)?;
    let (_, loaded) = load_all(&pool, &mut stream, staging, &[page_ref(1, 2)], None);
    assert_eq!(loaded, Err(LoadFailure::Corrupt));
    Ok(())
}

#[test]
fn page_sizes_the_kernel_cannot_read_are_refused() {
    let refused = Device::open_cuda(0, &[spec(0, 12, 4)]).unwrap_err();
    assert_eq!(refused.kind(), "page_bytes_unaligned");
    assert!(refused.to_string().contains("multiple of 8"));
}

/// Equally spaced staging slots to consecutive pages go as one 2D copy (strided runs), and
/// the bytes and checksums are those of one copy per page, both ways.
#[test]
fn strided_runs_move_the_same_bytes_as_single_copies() -> TestResult {
    let page = 4096 + 512;
    let device = Device::open_cuda(0, &[spec(0, page, 32)])?;
    let mut stream = device.stream()?;
    let mut staging = device.staging_pool(HEADER_BYTES + page, 8)?;
    let payloads: Vec<Vec<u8>> = (0..8).map(|slot| pattern(slot + 40, page)).collect();
    for (slot, payload) in (0_u32..).zip(&payloads) {
        staging.slot_mut(slot)?[HEADER_BYTES..].copy_from_slice(payload);
    }
    // Slots 0-5 to pages 10-15 (one run), then 6 and 7 to pages 3 and 1 (single copies).
    let targets = [10, 11, 12, 13, 14, 15, 3, 1];
    let copies: Vec<PageCopy> = (0_u32..)
        .zip(targets)
        .map(|(slot, page_index)| copy(0, page_index, slot, HEADER_BYTES, page))
        .collect();
    let (staging, sums) = stream
        .scatter_checked(staging, &copies)
        .map_err(|r| r.error)?
        .wait();
    let expected: Vec<u64> = payloads.iter().map(|payload| checksum(payload)).collect();
    assert_eq!(sums?, expected);
    for (payload, page_index) in payloads.iter().zip(targets) {
        assert_eq!(&device.read_page_to_vec(GroupId(0), page_index)?, payload);
    }
    let arena = device.host_arena();
    let objects = (0..8)
        .map(|_| arena.alloc(HEADER_BYTES + page))
        .collect::<Result<Vec<_>, _>>()?;
    let (objects, sums) = stream
        .gather_checked(objects, &copies)
        .map_err(|r| r.error)?
        .wait();
    assert_eq!(sums?, expected);
    for (object, payload) in objects.iter().zip(&payloads) {
        assert_eq!(&object[HEADER_BYTES..], &payload[..]);
    }
    drop(staging);
    Ok(())
}
