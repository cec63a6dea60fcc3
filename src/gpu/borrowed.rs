//! Borrowed page memory: a [`Device`] whose page pools are memory the caller owns (an
//! engine's own KV cache tensors, R31), on the host backend or on CUDA.
//!
//! # Workflow
//!
//! 1. The caller describes each layer group's pages with a [`BorrowedPages`]: the address of
//!    page 0, the page size and the page count. Page `p` of a group starts at
//!    `base + p * page_bytes`: pages are back to back, as in a C-contiguous page-major
//!    tensor.
//! 2. [`Device::borrow_host`] or [`Device::borrow_cuda`] validates the regions (`borrowed::B1`-B3)
//!    and opens a device on them. Nothing is allocated for pages and nothing is zeroed: the pages
//!    hold whatever the caller's memory holds.
//! 3. From then on the device behaves as one opened with `open_host` / `open_cuda`: loads
//!    write pages in place, saves read them, checked submissions checksum them, and
//!    `write_page` / `read_page` work (the copy and checksum contracts of the module docs).
//! 4. The `owner` box the caller hands over (for example the references that keep tensors
//!    alive) is dropped after the device's last clone, so after the last copy.
//!
//! # Invariants
//!
//! - `borrowed::B1`. Every region starts at a non-null address and `base + page_bytes * num_pages`
//!   does not overflow the address space.
//! - `borrowed::B2`. No two regions overlap, so a copy into one group's page never writes
//!   another's.
//! - `borrowed::B3`. On CUDA every base is 8-byte aligned and every page size a multiple of 8 (the
//!   checksum kernel reads aligned 8-byte words), and every base lies in memory of the
//!   device whose primary context the device retains.
//! - `borrowed::B4`. The owner box outlives every access: it is the last field of the device's
//!   shared state, dropped after the backend, which every stream and in-flight copy keeps alive.

use std::any::Any;

use crate::core::layout::GroupId;

#[cfg(feature = "cuda")]
use super::backend::cuda::CudaDevice;
use super::backend::host::HostDevice;
use super::device::{Backend, Device};
use super::vocab::{GpuError, PageGeometry, PagePoolSpec};

/// Whatever keeps borrowed page memory alive (tensor references, a mapping); dropped after
/// the device's last use (`borrowed::B4`).
pub type PageOwner = Box<dyn Any + Send + Sync>;

/// One layer group's pages in memory the caller owns: `num_pages` pages of `page_bytes`
/// each, back to back from `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BorrowedPages {
    /// The layer group the pages belong to.
    pub group: GroupId,
    /// Address of page 0: a host address for [`Device::borrow_host`], a CUDA device
    /// address for [`Device::borrow_cuda`].
    pub base: u64,
    /// Bytes of one page.
    pub page_bytes: usize,
    /// Pages in the region, addressed `0..num_pages`.
    pub num_pages: u32,
}

impl BorrowedPages {
    /// The page pool this region provides.
    pub fn spec(&self) -> PagePoolSpec {
        PagePoolSpec {
            group: self.group,
            page_bytes: self.page_bytes,
            num_pages: self.num_pages,
        }
    }
}

impl Device {
    /// Opens a host-memory device on pages the caller owns (module workflow). The pages are
    /// used as they are; nothing is zeroed.
    ///
    /// # Safety
    /// For every region, `base..base + page_bytes * num_pages` is host memory, valid for
    /// reads and writes for as long as the returned device or any clone of it lives (`owner`
    /// may be what keeps it so). While a loader, the saver or `write_page` / `read_page`
    /// works on a page, nothing outside this device writes it and nothing reads a page that
    /// a load is filling: the engine hands pages to the connector through the reservation
    /// protocol and does not touch them until the connector hands them back.
    ///
    /// # Errors
    /// The spec errors of [`PageGeometry::new`]; [`GpuError::BorrowedRegionInvalid`]
    /// (`borrowed::B1`); [`GpuError::BorrowedOverlap`] (`borrowed::B2`).
    pub unsafe fn borrow_host(
        regions: &[BorrowedPages],
        owner: PageOwner,
    ) -> Result<Self, GpuError> {
        let (geometry, bases) = validate(regions)?;
        // SAFETY: every base addresses its pool's bytes for the device's whole life and the
        // regions are disjoint (`borrowed::B1`, `borrowed::B2`; the caller's contract above).
        let host = unsafe { HostDevice::borrowed(&geometry, &bases) };
        Ok(Self::from_borrowed(geometry, Backend::Host(host), owner))
    }

    /// Opens CUDA device `ordinal` (its primary context, the one frameworks such as torch
    /// use) on device pages the caller owns (module workflow).
    ///
    /// # Safety
    /// For every region, `base..base + page_bytes * num_pages` is device memory of device
    /// `ordinal`, allocated for as long as the returned device or any clone of it lives
    /// (`owner` may be what keeps it so). While a loader, the saver or `write_page` /
    /// `read_page` works on a page, no other stream writes it and none reads a page that a
    /// load is filling (the reservation protocol, as for [`borrow_host`](Self::borrow_host)).
    ///
    /// # Errors
    /// As [`borrow_host`](Self::borrow_host); [`GpuError::BorrowedRegionInvalid`] for an
    /// unaligned base (`borrowed::B3`), [`GpuError::PageBytesUnaligned`],
    /// [`GpuError::BorrowedWrongDevice`]; the errors of [`Device::open_cuda`] when the
    /// driver or the device is missing; [`GpuError::CudaNotBuilt`] without the `cuda`
    /// feature.
    pub unsafe fn borrow_cuda(
        ordinal: u32,
        regions: &[BorrowedPages],
        owner: PageOwner,
    ) -> Result<Self, GpuError> {
        let (geometry, bases) = validate(regions)?;
        if let Some(region) = regions.iter().find(|region| region.base % 8 != 0) {
            return Err(GpuError::BorrowedRegionInvalid {
                group: region.group,
                base: region.base,
                reason: "cuda pages must start on an 8-byte boundary",
            });
        }
        #[cfg(feature = "cuda")]
        {
            // SAFETY: the caller's contract above: device memory of `ordinal`, allocated
            // while the device lives, disjoint regions (`borrowed::B2`).
            let cuda = unsafe { CudaDevice::borrow(ordinal, &geometry, &bases) }?;
            Ok(Self::from_borrowed(geometry, Backend::Cuda(cuda), owner))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (ordinal, geometry, bases, owner);
            Err(GpuError::CudaNotBuilt)
        }
    }
}

/// Checks `borrowed::B1` and `borrowed::B2` and the spec rules; returns the geometry and each
/// pool's base, in the geometry's pool order.
fn validate(regions: &[BorrowedPages]) -> Result<(PageGeometry, Vec<u64>), GpuError> {
    let specs: Vec<PagePoolSpec> = regions.iter().map(BorrowedPages::spec).collect();
    let geometry = PageGeometry::new(&specs)?;
    let mut spans = Vec::with_capacity(regions.len());
    for region in regions {
        let invalid = |reason| GpuError::BorrowedRegionInvalid {
            group: region.group,
            base: region.base,
            reason,
        };
        if region.base == 0 {
            return Err(invalid("the base address is null"));
        }
        // `pages::P3`: the geometry checked that the pool's size fits in usize.
        let bytes = region.spec().pool_bytes().unwrap_or(usize::MAX);
        let end = u64::try_from(bytes)
            .ok()
            .and_then(|bytes| region.base.checked_add(bytes))
            .filter(|&end| usize::try_from(end).is_ok())
            .ok_or_else(|| invalid("the region runs past the end of the address space"))?;
        spans.push((region.base, end, region.group));
    }
    spans.sort_unstable();
    for pair in spans.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(GpuError::BorrowedOverlap {
                first: pair[0].2,
                second: pair[1].2,
            });
        }
    }
    let bases = geometry
        .pools()
        .iter()
        .map(|spec| {
            regions
                .iter()
                .find(|region| region.group == spec.group)
                .map_or(0, |region| region.base)
        })
        .collect();
    Ok((geometry, bases))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(group: u32, base: u64, page_bytes: usize, num_pages: u32) -> BorrowedPages {
        BorrowedPages {
            group: GroupId(group),
            base,
            page_bytes,
            num_pages,
        }
    }

    #[test]
    fn b1_null_and_wrapping_regions_are_refused() {
        let null = validate(&[region(0, 0, 8, 1)]).unwrap_err();
        assert_eq!(null.kind(), "borrowed_region_invalid");
        assert!(null.to_string().contains("null"), "{null}");
        let wraps = validate(&[region(3, u64::MAX - 8, 8, 2)]).unwrap_err();
        assert!(wraps.to_string().contains("group 3"), "{wraps}");
    }

    #[test]
    fn b2_overlapping_regions_are_refused_and_touching_ones_accepted() -> Result<(), GpuError> {
        let overlap = validate(&[region(0, 4096, 64, 4), region(1, 4096 + 255, 64, 1)]);
        assert!(matches!(
            overlap,
            Err(GpuError::BorrowedOverlap {
                first: GroupId(0),
                second: GroupId(1)
            })
        ));
        let (geometry, bases) = validate(&[region(5, 4096 + 256, 32, 2), region(2, 4096, 64, 4)])?;
        assert_eq!(geometry.pools()[0].group, GroupId(2));
        assert_eq!(
            bases,
            vec![4096, 4096 + 256],
            "bases follow the geometry order"
        );
        Ok(())
    }

    #[test]
    fn spec_errors_come_first() {
        assert!(matches!(validate(&[]), Err(GpuError::NoPagePools)));
        assert_eq!(
            validate(&[region(0, 64, 0, 1)]).unwrap_err().kind(),
            "empty_page_pool"
        );
    }
}
