//! The host-memory backend: device pages in ordinary heap memory, copies as `memcpy`,
//! completion at once. It is the CPU backend behind the same API as CUDA, and what every
//! actor test and the replay simulator run on.
//!
//! This is the bottom layer of the sandwich for the host backend; the CUDA backend's bottom
//! layer is `cuda/driver.rs` (cudarc driver calls) instead. Callers above (`Device`,
//! `CopyStream`) have already bounds-checked every access (`gpu::I1`, `copy::C1`), so nothing here
//! re-validates, and no `unsafe` is needed.
//!
//! Invariants:
//! - `host::H1`. Each page has its own lock; concurrent work on different pages never contends,
//!   and work on one page is serialized (`gpu::I2`).
//! - `host::H2`. No code path holds two page locks at once, so the backend cannot deadlock.
//! - `host::H3`. An injected copy failure (`Device::inject_copy_failures`, counted on the device
//!   for every backend) is taken before any byte moves, so a failed copy leaves its destination
//!   unchanged (`gpu::I6`).

use std::fmt;

use parking_lot::RwLock;

use super::copy::{CopyDirection, CopyRun};
use super::pages::PageGeometry;

/// One group's pages. Pages are separate allocations so each gets its own lock (`host::H1`).
struct HostPagePool {
    page_bytes: usize,
    pages: Vec<RwLock<Box<[u8]>>>,
}

/// Page memory of every group.
pub(crate) struct HostDevice {
    /// In the order of [`PageGeometry::pools`], so a pool index from the geometry works here.
    pools: Vec<HostPagePool>,
}

impl HostDevice {
    /// Allocates zeroed pages for every pool of `geometry`.
    pub(crate) fn new(geometry: &PageGeometry) -> Self {
        let pools = geometry
            .pools()
            .iter()
            .map(|spec| HostPagePool {
                page_bytes: spec.page_bytes,
                pages: (0..spec.num_pages)
                    .map(|_| RwLock::new(vec![0; spec.page_bytes].into_boxed_slice()))
                    .collect(),
            })
            .collect();
        Self { pools }
    }

    /// Overwrites a whole page. `bytes.len()` is the page size (checked by the caller).
    pub(crate) fn write_page(&self, pool: usize, page: u32, bytes: &[u8]) {
        self.pools[pool].pages[page as usize]
            .write()
            .copy_from_slice(bytes);
    }

    /// Copies a whole page out. `out.len()` is the page size (checked by the caller).
    pub(crate) fn read_page(&self, pool: usize, page: u32, out: &mut [u8]) {
        out.copy_from_slice(&self.pools[pool].pages[page as usize].read());
    }

    /// Overwrites the first `bytes.len()` bytes of a page (a checked load). The caller
    /// checked the page and that the length is at most the page size.
    pub(crate) fn write_page_prefix(&self, pool: usize, page: u32, bytes: &[u8]) {
        self.pools[pool].pages[page as usize].write()[..bytes.len()].copy_from_slice(bytes);
    }

    /// Copies the first `out.len()` bytes of a page out (a checked save); checked as above.
    pub(crate) fn read_page_prefix(&self, pool: usize, page: u32, out: &mut [u8]) {
        out.copy_from_slice(&self.pools[pool].pages[page as usize].read()[..out.len()]);
    }

    /// The object checksum of the first `len` bytes of a page (R5); checked as above.
    pub(crate) fn page_checksum(&self, pool: usize, page: u32, len: usize) -> u64 {
        crate::core::object::checksum(&self.pools[pool].pages[page as usize].read()[..len])
    }

    /// Moves one run's bytes, one page lock at a time (`host::H2`). `pool` is the run's group's
    /// index; the run lies inside the region and the staging buffer (`copy::C1`).
    pub(crate) fn copy_run(
        &self,
        direction: CopyDirection,
        pool: usize,
        run: &CopyRun,
        staging: &mut [u8],
    ) {
        let pool = &self.pools[pool];
        let mut done = 0;
        while done < run.len {
            let device_offset = run.device_offset + done;
            let page = device_offset / pool.page_bytes;
            let in_page = device_offset % pool.page_bytes;
            let len = (pool.page_bytes - in_page).min(run.len - done);
            let in_staging = run.staging_offset + done;
            let staging = &mut staging[in_staging..in_staging + len];
            match direction {
                CopyDirection::HostToDevice => {
                    pool.pages[page].write()[in_page..in_page + len].copy_from_slice(staging);
                }
                CopyDirection::DeviceToHost => {
                    staging.copy_from_slice(&pool.pages[page].read()[in_page..in_page + len]);
                }
            }
            done += len;
        }
    }
}

impl fmt::Debug for HostDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostDevice")
            .field("pools", &self.pools.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::layout::GroupId;
    use crate::gpu::error::GpuError;
    use crate::gpu::pages::PagePoolSpec;

    fn device() -> Result<HostDevice, GpuError> {
        let geometry = PageGeometry::new(&[PagePoolSpec {
            group: GroupId(0),
            page_bytes: 4,
            num_pages: 3,
        }])?;
        Ok(HostDevice::new(&geometry))
    }

    #[test]
    fn a_run_spanning_pages_is_split_at_page_edges() -> Result<(), GpuError> {
        let host = device()?;
        let mut staging: Vec<u8> = (1..=16).collect();
        let run = CopyRun {
            group: GroupId(0),
            device_offset: 2,
            staging_offset: 3,
            len: 8,
        };
        host.copy_run(CopyDirection::HostToDevice, 0, &run, &mut staging);
        let mut pages = [[0_u8; 4]; 3];
        for (page, out) in (0..).zip(pages.iter_mut()) {
            host.read_page(0, page, out);
        }
        assert_eq!(pages, [[0, 0, 4, 5], [6, 7, 8, 9], [10, 11, 0, 0]]);

        let mut back = vec![0_u8; 16];
        host.copy_run(CopyDirection::DeviceToHost, 0, &run, &mut back);
        assert_eq!(back[3..11], staging[3..11]);
        assert_eq!(back[..3], [0, 0, 0]);
        Ok(())
    }
}
