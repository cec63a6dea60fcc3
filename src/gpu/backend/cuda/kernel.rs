//! The page checksum kernel on CUDA (R5): [`ChecksumKernel`] (the module loaded from
//! `checksum.ptx` when a device opens) and [`ChecksumScratch`] (the device and pinned host
//! memory one checked submission uses for its page list and results).
//!
//! Workflow of one checked submission (`CudaDevice::issue_checked`):
//! 1. [`ChecksumScratch::stage`] writes each page's device address and length into the
//!    pinned half of the scratch;
//! 2. [`ChecksumKernel::queue`] queues, on the submission's stream, the copy of that list to
//!    the device, one launch of `kvc_page_term_sums` (`split` blocks of 256 threads per page,
//!    `checksum.ll`) and the copy of the per-block sums back to pinned memory;
//! 3. after the submission's event completes, [`ChecksumScratch::checksums`] adds each
//!    page's `split` block sums and applies `finish` (`core::object::checksum`).
//!
//! Invariants:
//! - `kernel::I1`. Pages handed to the kernel start at 8-byte aligned device addresses (page pools
//!   are `cuMemAlloc` allocations and CUDA devices refuse page sizes that are not a
//!   multiple of 8), so its 8-byte loads are aligned.
//! - `kernel::I2`. A scratch is used by one submission at a time: it is taken from the stream's
//!   free list at submission and given back only after the submission's event completed.

use std::ffi::{c_uint, c_void, CStr};
use std::fmt;
use std::sync::Arc;

use super::context::Context;
use super::driver::{self, DevicePtr, RawFunction, RawModule};
use super::memory::{DeviceRegion, PinnedBuffer};
use super::queue::CudaStream;
use crate::core::object::finish_checksum;
use crate::gpu::vocab::GpuError;

/// The kernel's PTX (generated from `checksum.ll` by `scripts/gen-ptx`), NUL-terminated.
const CHECKSUM_PTX: &str = concat!(include_str!("checksum.ptx"), "\0");
/// The kernel's entry point.
const KERNEL_NAME: &CStr = c"kvc_page_term_sums";
/// Threads per block (the kernel's shared array and stride assume exactly this).
const BLOCK_THREADS: c_uint = 256;
/// Most blocks per page; enough to fill an H200 with 64 pages in flight.
const MAX_SPLIT: u32 = 32;
/// Words each block should have at least, so small pages use one block.
const WORDS_PER_BLOCK: usize = 4096;

/// The loaded checksum module of one context.
pub(crate) struct ChecksumKernel {
    context: Arc<Context>,
    module: RawModule,
    function: RawFunction,
}

// SAFETY: module and function handles may be used from any thread of the process; the
// driver serializes launches, and the value is only read after construction.
unsafe impl Send for ChecksumKernel {}
// SAFETY: as above: `&self` only launches, which the driver allows from any thread.
unsafe impl Sync for ChecksumKernel {}

impl ChecksumKernel {
    /// Loads the module into `context` (the driver compiles the PTX for the device).
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuModuleLoadData` or `cuModuleGetFunction`.
    pub(crate) fn load(context: Arc<Context>) -> Result<Self, GpuError> {
        context.make_current()?;
        let ptx = CStr::from_bytes_with_nul(CHECKSUM_PTX.as_bytes()).map_err(|_| {
            GpuError::ChecksumKernelInvalid {
                reason: "the embedded PTX contains a NUL byte",
            }
        })?;
        // SAFETY: the context is current on this thread (line above).
        let module = unsafe { driver::module_load_ptx(ptx) }
            .map_err(GpuError::driver("cuModuleLoadData"))?;
        // SAFETY: the module was just loaded in the current context.
        let function = match unsafe { driver::module_function(module, KERNEL_NAME) } {
            Ok(function) => function,
            Err(error) => {
                // SAFETY: loaded above, nothing launched from it yet.
                let _ = unsafe { driver::module_unload(module) };
                return Err(GpuError::driver("cuModuleGetFunction")(error));
            }
        };
        Ok(Self {
            context,
            module,
            function,
        })
    }

    /// Queues the list copy, the launch and the result copy for the pages staged in
    /// `scratch` on `stream` (workflow step 2). The context must be current.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from a copy or the launch.
    pub(crate) fn queue(
        &self,
        stream: &CudaStream,
        scratch: &mut ChecksumScratch,
    ) -> Result<(), GpuError> {
        let pages = scratch.pages;
        let blocks = pages * scratch.split as usize;
        let list_bytes = 2 * pages * 8;
        let device = scratch.device.address(0);
        let mut addrs: DevicePtr = device;
        let mut lens: DevicePtr = device + (pages * 8) as DevicePtr;
        let mut sums: DevicePtr = device + list_bytes as DevicePtr;
        let mut split: u32 = scratch.split;
        let host = scratch.host.as_mut_ptr();
        // SAFETY: the pinned list (`stage` wrote it) and the device scratch are both at
        // least `list_bytes` long; the scratch is owned by this submission until its event
        // completes (`kernel::I2`), so nobody writes the pinned list meanwhile.
        unsafe { driver::memcpy_to_device_async(device, host, list_bytes, stream.raw()) }
            .map_err(GpuError::driver("cuMemcpyHtoDAsync"))?;
        let grid = c_uint::try_from(blocks).map_err(|_| GpuError::ChecksumKernelInvalid {
            reason: "too many blocks for one launch",
        })?;
        let mut params: [*mut c_void; 4] = [
            (&raw mut addrs).cast::<c_void>(),
            (&raw mut lens).cast::<c_void>(),
            (&raw mut sums).cast::<c_void>(),
            (&raw mut split).cast::<c_void>(),
        ];
        // SAFETY: four parameters matching the kernel's (three device pointers, one u32),
        // each pointing at a live local; the addresses lie in the scratch allocation and
        // the pages (`kernel::I1`), which stay allocated until the event completes (the submission
        // holds the device); the stream is live in the current context.
        unsafe {
            driver::launch_kernel(
                self.function,
                grid,
                BLOCK_THREADS,
                stream.raw(),
                &mut params,
            )
        }
        .map_err(GpuError::driver("cuLaunchKernel"))?;
        // SAFETY: the pinned result area starts `list_bytes` into the host scratch and holds
        // `blocks` words; no one reads it before the event completes (`kernel::I2`).
        unsafe {
            driver::memcpy_to_host_async(host.add(list_bytes), sums, blocks * 8, stream.raw())
        }
        .map_err(GpuError::driver("cuMemcpyDtoHAsync"))
    }
}

impl Drop for ChecksumKernel {
    fn drop(&mut self) {
        if self.context.make_current().is_err() {
            return;
        }
        // SAFETY: unloaded once; every stream of the device was synchronized and destroyed
        // before the device (which owns the kernel) drops.
        if let Err(error) = unsafe { driver::module_unload(self.module) } {
            tracing::warn!(%error, "unloading the checksum module failed");
        }
    }
}

impl fmt::Debug for ChecksumKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChecksumKernel").finish_non_exhaustive()
    }
}

/// Device and pinned memory for one checked submission's page list and block sums (`kernel::I2`).
pub(crate) struct ChecksumScratch {
    device: DeviceRegion,
    host: PinnedBuffer,
    /// Pages the scratch has room for at [`MAX_SPLIT`].
    capacity_pages: usize,
    /// Pages and split of the submission staged last.
    pages: usize,
    split: u32,
}

impl ChecksumScratch {
    /// Scratch for up to `capacity_pages` pages (at least 1).
    ///
    /// # Errors
    /// [`GpuError::Driver`] when device or pinned memory cannot be allocated.
    pub(crate) fn new(context: &Arc<Context>, capacity_pages: usize) -> Result<Self, GpuError> {
        let capacity_pages = capacity_pages.max(1);
        let bytes = Self::bytes_for(capacity_pages);
        Ok(Self {
            device: DeviceRegion::allocate(Arc::clone(context), bytes, 8)?,
            host: PinnedBuffer::zeroed(Arc::clone(context), bytes)?,
            capacity_pages,
            pages: 0,
            split: 1,
        })
    }

    fn bytes_for(pages: usize) -> usize {
        (2 + MAX_SPLIT as usize) * pages * 8
    }

    /// Pages this scratch can take.
    pub(crate) fn capacity_pages(&self) -> usize {
        self.capacity_pages
    }

    /// Writes the page list (device address, length) and picks the blocks per page
    /// (workflow step 1). The caller checked `pages.len() <= capacity_pages`.
    pub(crate) fn stage(&mut self, pages: &[(DevicePtr, usize)]) {
        debug_assert!(pages.len() <= self.capacity_pages);
        let longest = pages.iter().map(|&(_, len)| len).max().unwrap_or(0);
        let split = (longest / 8 / WORDS_PER_BLOCK).clamp(1, MAX_SPLIT as usize);
        self.split = u32::try_from(split).unwrap_or(1);
        self.pages = pages.len();
        let host = self.host.as_mut_slice();
        let (addrs, rest) = host.split_at_mut(pages.len() * 8);
        for ((address, _), out) in pages.iter().zip(addrs.chunks_exact_mut(8)) {
            out.copy_from_slice(&address.to_le_bytes());
        }
        for ((_, len), out) in pages.iter().zip(rest.chunks_exact_mut(8)) {
            out.copy_from_slice(&(*len as u64).to_le_bytes());
        }
    }

    /// Each staged page's checksum, from the block sums the kernel wrote (workflow step 3).
    /// Call only after the submission's event completed successfully.
    pub(crate) fn checksums(&self, lens: &[usize]) -> Vec<u64> {
        let split = self.split as usize;
        let host = self.host.as_slice();
        let sums = &host[2 * self.pages * 8..(2 + split) * self.pages * 8];
        sums.chunks_exact(8 * split)
            .zip(lens)
            .map(|(blocks, &len)| {
                let sum = blocks.chunks_exact(8).fold(0_u64, |sum, word| {
                    let mut bytes = [0_u8; 8];
                    bytes.copy_from_slice(word);
                    sum.wrapping_add(u64::from_le_bytes(bytes))
                });
                finish_checksum(sum, len as u64)
            })
            .collect()
    }
}

impl fmt::Debug for ChecksumScratch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChecksumScratch")
            .field("capacity_pages", &self.capacity_pages)
            .finish_non_exhaustive()
    }
}
