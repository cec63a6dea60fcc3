//! The host-memory backend: device pages in ordinary heap memory, copies as `memcpy`,
//! completion at once. It is the CPU backend behind the same API as CUDA, and what every
//! actor test and the replay simulator run on.
//!
//! It sits on the middle floor of `gpu`, beside the CUDA backend, and speaks only the
//! vocabulary (page geometry, copy runs, `GpuError`): the front (`Device`, `CopyStream`) has
//! already bounds-checked every access (`gpu::I1`, `copy::C1`), so nothing here re-validates.
//! It also holds [`try_zeroed`], the heap allocation that refuses instead of aborting, which
//! the front's host staging pools use too. Pages are owned boxes, or windows into memory the
//! caller owns (`Device::borrow_host`, [`PageMemory::Borrowed`]); only the latter needs
//! `unsafe`.
//!
//! Invariants:
//! - `host::H1`. Each page has its own lock; concurrent work on different pages never contends,
//!   and work on one page is serialized (`gpu::I2`).
//! - `host::H2`. No code path holds two page locks at once, so the backend cannot deadlock.
//! - `host::H3`. An injected copy failure (`Device::inject_copy_failures`, counted on the device
//!   for every backend) is taken before any byte moves, so a failed copy leaves its destination
//!   unchanged (`gpu::I6`).
//! - `host::H4`. Page checksums are `core::object::checksum`'s, bit for bit, whichever build
//!   of it runs ([`payload_checksum`]: AVX-512 or AVX2 where the CPU has it).

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use parking_lot::RwLock;

use crate::gpu::vocab::{CopyDirection, CopyRun, GpuError, PageGeometry, PagePoolSpec};

/// One group's pages. Each page has its own lock (`host::H1`).
struct HostPagePool {
    page_bytes: usize,
    pages: Vec<RwLock<PageMemory>>,
}

/// The bytes of one page.
enum PageMemory {
    /// A separate allocation of this device.
    Owned(Box<[u8]>),
    /// `len` bytes at `ptr` (never null, B1) in memory the caller of `Device::borrow_host`
    /// owns.
    Borrowed { ptr: *mut u8, len: usize },
}

// SAFETY: a borrowed page is host memory that stays valid while the device lives and that
// only this device touches while it works on the page (`Device::borrow_host`'s contract);
// like the owned box it may be read and written from any thread under the page's lock.
unsafe impl Send for PageMemory {}
// SAFETY: `&PageMemory` only gives `&[u8]`; writers need `&mut`, which the page lock makes
// exclusive (H1).
unsafe impl Sync for PageMemory {}

impl Deref for PageMemory {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned(bytes) => bytes,
            // SAFETY: `ptr..ptr + len` is valid for reads while the device lives, and no one
            // writes it while this shared borrow (under the page's read lock) lasts
            // (`Device::borrow_host`'s contract).
            Self::Borrowed { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

impl DerefMut for PageMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Self::Owned(bytes) => bytes,
            // SAFETY: as in `deref`, and the page's write lock makes this the only access
            // from this device; nothing outside it touches the page meanwhile (contract).
            Self::Borrowed { ptr, len } => unsafe { std::slice::from_raw_parts_mut(*ptr, *len) },
        }
    }
}

/// Page memory of every group.
pub(crate) struct HostDevice {
    /// In the order of [`PageGeometry::pools`], so a pool index from the geometry works here.
    pools: Vec<HostPagePool>,
}

impl HostDevice {
    /// Allocates zeroed pages for every pool of `geometry`.
    ///
    /// # Errors
    /// [`GpuError::HostAllocFailed`] when the heap refuses the memory (never an abort).
    pub(crate) fn new(geometry: &PageGeometry) -> Result<Self, GpuError> {
        let refused = |spec: &PagePoolSpec| GpuError::HostAllocFailed {
            what: "page pool",
            bytes: spec.page_bytes.saturating_mul(spec.num_pages as usize),
        };
        let mut pools = Vec::with_capacity(geometry.pools().len());
        for spec in geometry.pools() {
            let mut pages = Vec::new();
            pages
                .try_reserve_exact(spec.num_pages as usize)
                .map_err(|_| refused(spec))?;
            for _ in 0..spec.num_pages {
                let memory = try_zeroed(spec.page_bytes).ok_or_else(|| refused(spec))?;
                pages.push(RwLock::new(PageMemory::Owned(memory)));
            }
            pools.push(HostPagePool {
                page_bytes: spec.page_bytes,
                pages,
            });
        }
        Ok(Self { pools })
    }

    /// Pages in memory the caller owns: pool `i` of `geometry` starts at `bases[i]`, page
    /// `p` at `bases[i] + p * page_bytes`.
    ///
    /// # Safety
    /// Every `bases[i]..bases[i] + page_bytes * num_pages` is non-null host memory, valid
    /// for reads and writes while the device lives, the ranges are disjoint, and nothing
    /// outside the device touches a page while it works on it (`Device::borrow_host`).
    pub(crate) unsafe fn borrowed(geometry: &PageGeometry, bases: &[u64]) -> Self {
        let pools = geometry
            .pools()
            .iter()
            .zip(bases)
            .map(|(spec, &base)| HostPagePool {
                page_bytes: spec.page_bytes,
                pages: (0..spec.num_pages)
                    .map(|page| {
                        // B1: `base + pool bytes` fits in usize, so neither step overflows.
                        let base = usize::try_from(base).unwrap_or(usize::MAX);
                        let address = base + spec.page_offset(page);
                        RwLock::new(PageMemory::Borrowed {
                            ptr: std::ptr::with_exposed_provenance_mut(address),
                            len: spec.page_bytes,
                        })
                    })
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
        payload_checksum(&self.pools[pool].pages[page as usize].read()[..len])
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

/// The object checksum (R5) of `payload`: `core::object::checksum` itself, compiled for
/// the widest vector unit the CPU has (`host::H4`), as built otherwise.
///
/// The checksum is the host device's own work in every checked copy. On the 2-core
/// development VM, where the copy beside it runs at 9 GB/s, a generic x86-64 build computes
/// it at about 2.5 GB/s per 1.125 MiB page; with AVX2 its lanes run in vector registers, at
/// 5.4-6.0; with AVX-512 (whose `vpmullq` multiplies 64-bit lanes without emulation) at
/// 7.6-8.1.
fn payload_checksum(payload: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: the CPU has AVX-512 F, DQ and VL, detected just above: all that
            // calling a function compiled for them requires.
            return unsafe { checksum_avx512(payload) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, detected just above: all that calling a function
            // compiled for it requires.
            return unsafe { checksum_avx2(payload) };
        }
    }
    crate::core::object::checksum(payload)
}

/// Whether the CPU has the AVX-512 subsets [`checksum_avx512`] is compiled for.
#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// `core::object::checksum` compiled for AVX2 (it is inlined here, so it is compiled with
/// this function's target features).
///
/// # Safety
///
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn checksum_avx2(payload: &[u8]) -> u64 {
    crate::core::object::checksum(payload)
}

/// `core::object::checksum` compiled for AVX-512 (F, DQ for 64-bit lane multiplies, VL),
/// as [`checksum_avx2`] is for AVX2.
///
/// # Safety
///
/// The CPU must have AVX-512 F, DQ and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl")]
unsafe fn checksum_avx512(payload: &[u8]) -> u64 {
    crate::core::object::checksum(payload)
}

impl fmt::Debug for HostDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostDevice")
            .field("pools", &self.pools.len())
            .finish()
    }
}

/// A zeroed heap buffer of `len` bytes, or `None` when the allocator refuses it: unlike
/// `vec![0; len]`, a refusal never aborts the process. Alignment 1 lets the allocator use
/// `calloc`, whose big blocks are zeroed lazily (untouched pages cost no memory).
pub(crate) fn try_zeroed(len: usize) -> Option<Box<[u8]>> {
    if len == 0 {
        return Some(Box::default());
    }
    let layout = Layout::array::<u8>(len).ok()?;
    // SAFETY: `layout` has a non-zero size (`len >= 1`).
    let raw = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
    let slice = std::ptr::slice_from_raw_parts_mut(raw.as_ptr(), len);
    // SAFETY: `raw` points to `len` zeroed (initialized) bytes from the global allocator
    // with the layout of `[u8; len]`, which is the layout a `Box<[u8]>` of `len` bytes frees
    // with; the box becomes its only owner.
    Some(unsafe { Box::from_raw(slice) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::layout::GroupId;

    fn device() -> Result<HostDevice, GpuError> {
        let geometry = PageGeometry::new(&[PagePoolSpec {
            group: GroupId(0),
            page_bytes: 4,
            num_pages: 3,
        }])?;
        HostDevice::new(&geometry)
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

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x4a4b_0004),
            ..proptest::test_runner::Config::default()
        })]
        /// `host::H4`: the build the CPU runs, and each vector build the CPU can run, gives
        /// `core::object::checksum`'s value over whole rounds of lanes and every tail.
        #[test]
        fn page_checksums_are_the_core_checksum_h4(
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1200),
        ) {
            let core = crate::core::object::checksum(&payload);
            proptest::prop_assert_eq!(payload_checksum(&payload), core);
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, detected just above.
                    proptest::prop_assert_eq!(unsafe { checksum_avx2(&payload) }, core);
                }
                if has_avx512() {
                    // SAFETY: the CPU has AVX-512 F, DQ and VL, detected just above.
                    proptest::prop_assert_eq!(unsafe { checksum_avx512(&payload) }, core);
                }
            }
        }
    }
}
