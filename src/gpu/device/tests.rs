//! Tests of the device handle: page access, poison (`gpu::I7`), injected failures
//! (`host::H3`) and stream ids.

use super::*;

fn device() -> Result<Device, GpuError> {
    Device::open_host(&[
        PagePoolSpec {
            group: GroupId(0),
            page_bytes: 4,
            num_pages: 2,
        },
        PagePoolSpec {
            group: GroupId(5),
            page_bytes: 8,
            num_pages: 1,
        },
    ])
}

/// Page pools larger than the heap gives are an error, never an abort.
#[test]
fn page_pools_the_heap_refuses_are_an_error() {
    let spec = PagePoolSpec {
        group: GroupId(0),
        page_bytes: 1 << 46,
        num_pages: 2,
    };
    // `black_box`: an allocation nothing reads could be optimized away.
    let refused = std::hint::black_box(Device::open_host(&[spec])).map(|device| device.kind());
    assert!(
        matches!(
            refused,
            Err(GpuError::HostAllocFailed {
                what: "page pool",
                ..
            })
        ),
        "{refused:?}"
    );
}

#[test]
fn pages_start_zeroed_and_keep_what_was_written() -> Result<(), GpuError> {
    let device = device()?;
    assert_eq!(device.read_page_to_vec(GroupId(5), 0)?, vec![0; 8]);
    device.write_page(GroupId(0), 1, &[1, 2, 3, 4])?;
    let clone = device.clone();
    assert_eq!(clone.read_page_to_vec(GroupId(0), 1)?, vec![1, 2, 3, 4]);
    assert_eq!(clone.read_page_to_vec(GroupId(0), 0)?, vec![0; 4]);
    Ok(())
}

#[test]
fn page_access_errors_are_typed() -> Result<(), GpuError> {
    let device = device()?;
    let mut four = [0_u8; 4];
    assert!(matches!(
        device.write_page(GroupId(1), 0, &four),
        Err(GpuError::UnknownGroup { group: GroupId(1) })
    ));
    assert!(matches!(
        device.read_page(GroupId(0), 2, &mut four),
        Err(GpuError::PageOutOfRange {
            page: 2,
            num_pages: 2,
            ..
        })
    ));
    assert!(matches!(
        device.write_page(GroupId(5), 0, &four),
        Err(GpuError::LengthMismatch {
            expected: 8,
            actual: 4,
            ..
        })
    ));
    Ok(())
}

#[test]
fn i7_poisoned_device_rejects_new_work() -> Result<(), GpuError> {
    let device = device()?;
    let stream = device.stream()?;
    device.clone().poison();
    assert!(device.is_poisoned());
    assert!(matches!(
        device.write_page(GroupId(0), 0, &[0; 4]),
        Err(GpuError::Poisoned)
    ));
    assert!(matches!(device.staging_pool(4, 1), Err(GpuError::Poisoned)));
    assert!(matches!(device.stream(), Err(GpuError::Poisoned)));
    assert_eq!(stream.id(), StreamId(0));
    Ok(())
}

#[test]
fn h3_injected_failures_are_counted_down() -> Result<(), GpuError> {
    let device = device()?;
    assert!(!device.take_copy_failure());
    device.inject_copy_failures(2);
    assert!(device.clone().take_copy_failure());
    assert!(device.take_copy_failure());
    assert!(!device.take_copy_failure());
    Ok(())
}

#[test]
fn host_devices_have_no_cuda_ordinal_and_unpinned_staging() -> Result<(), GpuError> {
    let device = device()?;
    assert_eq!(device.cuda_ordinal(), None);
    assert!(!device.staging_pool(4, 1)?.is_pinned());
    assert!(!device.host_arena().is_pinned());
    assert!(format!("{device:?}").contains("cuda_ordinal: None"));
    Ok(())
}

#[test]
fn streams_get_distinct_ids() -> Result<(), GpuError> {
    let device = device()?;
    let ids = [
        device.stream()?.id(),
        device.stream()?.id(),
        device.clone().stream()?.id(),
    ];
    assert_eq!(ids, [StreamId(0), StreamId(1), StreamId(2)]);
    assert_eq!(device.kind().as_str(), "host");
    Ok(())
}
