//! Checked submissions on the host backend (`checked::V1`-V4).

use super::*;
use crate::core::layout::GroupId;
use crate::core::object::checksum;
use crate::gpu::host_memory::HostArena;
use crate::gpu::{Device, PagePoolSpec};

const PAGE: usize = 64;

fn device() -> Result<Device, GpuError> {
    Device::open_host(&[
        PagePoolSpec {
            group: GroupId(0),
            page_bytes: PAGE,
            num_pages: 4,
        },
        PagePoolSpec {
            group: GroupId(1),
            page_bytes: PAGE / 2,
            num_pages: 2,
        },
    ])
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

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i % 256).to_le_bytes()[0]
                .wrapping_mul(7)
                .wrapping_add(seed)
        })
        .collect()
}

#[test]
fn scatter_from_lent_objects_writes_pages_and_checksums_what_landed_v4() -> Result<(), GpuError> {
    let device = device()?;
    let mut stream = device.stream()?;
    let arena = HostArena::heap();
    let mut objects = Vec::new();
    for seed in [1_u8, 2] {
        let mut slot = arena.alloc(8 + PAGE)?;
        slot[8..].copy_from_slice(&pattern(seed, PAGE));
        objects.push(slot.share());
    }
    let copies = [copy(0, 3, 0, 8, PAGE), copy(0, 1, 1, 8, PAGE)];
    let (objects, sums) = stream
        .scatter_checked(objects, &copies)
        .map_err(|refused| refused.error)?
        .wait();
    assert_eq!(objects.len(), 2, "the lent objects come back");
    assert_eq!(
        sums?,
        vec![checksum(&pattern(1, PAGE)), checksum(&pattern(2, PAGE))]
    );
    assert_eq!(device.read_page_to_vec(GroupId(0), 3)?, pattern(1, PAGE));
    assert_eq!(device.read_page_to_vec(GroupId(0), 1)?, pattern(2, PAGE));
    Ok(())
}

#[test]
fn gather_into_objects_checksums_the_pages_it_copies_v4() -> Result<(), GpuError> {
    let device = device()?;
    device.write_page(GroupId(1), 1, &pattern(9, PAGE / 2))?;
    let mut stream = device.stream()?;
    let arena = HostArena::heap();
    let objects = vec![arena.alloc(4 + PAGE / 2)?];
    let (objects, sums) = stream
        .gather_checked(objects, &[copy(1, 1, 0, 4, PAGE / 2)])
        .map_err(|refused| refused.error)?
        .wait();
    assert_eq!(sums?, vec![checksum(&pattern(9, PAGE / 2))]);
    assert_eq!(&objects[0][4..], &pattern(9, PAGE / 2)[..]);
    assert_eq!(stream.counters().pages_to_host, 1);
    Ok(())
}

#[test]
fn staging_round_trip_with_checksums() -> Result<(), GpuError> {
    let device = device()?;
    let mut stream = device.stream()?;
    let mut staging = device.staging_pool(PAGE + 16, 2)?;
    staging.slot_mut(1)?[16..].copy_from_slice(&pattern(5, PAGE));
    let (staging, sums) = stream
        .scatter_checked(staging, &[copy(0, 0, 1, 16, PAGE)])
        .map_err(|refused| refused.error)?
        .wait();
    assert_eq!(sums?, vec![checksum(&pattern(5, PAGE))]);
    let (staging, sums) = stream
        .gather_checked(staging, &[copy(0, 0, 0, 0, PAGE / 2)])
        .map_err(|refused| refused.error)?
        .wait();
    assert_eq!(
        sums?,
        vec![checksum(&pattern(5, PAGE)[..PAGE / 2])],
        "a prefix is checksummed as copied"
    );
    assert_eq!(&staging.slot(0)?[..PAGE / 2], &pattern(5, PAGE)[..PAGE / 2]);
    Ok(())
}

#[test]
fn invalid_copies_are_refused_before_any_byte_moves_v1() -> Result<(), GpuError> {
    let device = device()?;
    let mut stream = device.stream()?;
    let arena = HostArena::heap();
    let mut slot = arena.alloc(PAGE)?;
    slot.fill(7);
    let objects = vec![slot.share()];
    let cases = [
        (copy(0, 0, 1, 0, PAGE), "object_out_of_range"),
        (copy(0, 0, 0, 1, PAGE), "object_range_out_of_object"),
        (copy(0, 9, 0, 0, PAGE), "page_out_of_range"),
        (copy(1, 0, 0, 0, PAGE), "copy_length_invalid"),
        (copy(5, 0, 0, 0, 1), "unknown_group"),
    ];
    let mut objects = objects;
    for (bad, kind) in cases {
        let refused = stream.scatter_checked(objects, &[bad]).unwrap_err();
        assert_eq!(refused.error.kind(), kind);
        objects = refused.memory;
    }
    let twice = [copy(0, 2, 0, 0, 8), copy(0, 2, 0, 8, 8)];
    let refused = stream.scatter_checked(objects, &twice).unwrap_err();
    assert_eq!(refused.error.kind(), "overlapping_copies");
    assert_eq!(
        device.read_page_to_vec(GroupId(0), 0)?,
        vec![0; PAGE],
        "nothing moved"
    );
    assert_eq!(stream.counters().submissions_rejected, 6);
    let staging = device.staging_pool(16, 1)?;
    let overlapping = [copy(0, 0, 0, 0, 8), copy(0, 1, 0, 4, 8)];
    let refused = stream.gather_checked(staging, &overlapping).unwrap_err();
    assert_eq!(refused.error.kind(), "overlapping_copies");
    Ok(())
}

#[test]
fn an_injected_copy_failure_is_reported_by_wait() -> Result<(), GpuError> {
    let device = device()?;
    let mut stream = device.stream()?;
    device.inject_copy_failures(1);
    let staging = device.staging_pool(PAGE, 1)?;
    let (_staging, sums) = stream
        .scatter_checked(staging, &[copy(0, 0, 0, 0, PAGE)])
        .map_err(|refused| refused.error)?
        .wait();
    assert_eq!(sums.map_err(|error| error.kind()), Err("copy_failed"));
    assert_eq!(stream.counters().issue_failures, 1);
    Ok(())
}
