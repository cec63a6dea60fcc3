//! Owned CUDA memory: [`DeviceRegion`] (one group's page memory, `cuMemAlloc`) and
//! [`PinnedBuffer`] (page-locked staging memory, `cuMemHostAlloc` with flags 0) and
//! [`HostRegistration`] (host memory allocated elsewhere, page-locked with
//! `cuMemHostRegister` for as long as the registration lives).
//!
//! Workflow: `CudaDevice::open` allocates one region per page pool (`num_pages *
//! page_bytes`, zeroed like host pages); `Device::staging_pool` allocates one pinned buffer
//! per staging pool (zeroed, so every byte is initialized before it is seen as `&[u8]`).
//! Both free themselves on `Drop`, after making their context current.
//!
//! Invariants:
//! - `cuda::memory::M1`. A region's address range `ptr..ptr + bytes` is one live allocation while
//!   the value lives; callers bounds-check offsets against the geometry before any copy
//!   (`gpu::I1`).
//! - `cuda::memory::M2`. A pinned buffer is initialized (zeroed) at allocation and owned like a
//!   `Box<[u8]>`: `&self` gives `&[u8]`, `&mut self` gives `&mut [u8]`.
//! - `cuda::memory::M3`. Pinned memory is cached (flags 0, never `CU_MEMHOSTALLOC_WRITECOMBINED`):
//!   the pool transport and the header checks read staging with the CPU.

use std::fmt;
use std::sync::Arc;

use super::context::Context;
use super::driver::{self, DevicePtr};
use crate::gpu::vocab::{GpuError, PagePoolSpec};

/// One layer group's page memory on the device (`cuda::memory::M1`).
pub(crate) struct DeviceRegion {
    context: Arc<Context>,
    ptr: DevicePtr,
    bytes: usize,
    page_bytes: usize,
    /// `false` for memory the caller owns (`Device::borrow_cuda`): never freed here.
    owned: bool,
}

impl DeviceRegion {
    /// Allocates the pool of `spec` (`num_pages * page_bytes`, validated by the geometry)
    /// as one device allocation and zeroes it.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuMemAlloc` (out of device memory) or `cuMemsetD8`.
    pub(crate) fn zeroed(context: Arc<Context>, spec: &PagePoolSpec) -> Result<Self, GpuError> {
        // `pages::P3`: the geometry checked that the product fits.
        let bytes = spec.pool_bytes().unwrap_or(usize::MAX);
        let region = Self::allocate(context, bytes, spec.page_bytes)?;
        // SAFETY: `ptr..ptr + bytes` is the allocation just made (`cuda::memory::M1`); its context
        // is current.
        unsafe { driver::mem_set(region.ptr, 0, bytes) }.map_err(GpuError::driver("cuMemsetD8"))?;
        // The memset runs on the legacy default stream, which the loaders' non-blocking
        // streams do not wait for: finish it before any stream can touch the pages.
        // SAFETY: the context is current (`allocate` made it so).
        unsafe { driver::context_synchronize() }.map_err(GpuError::driver("cuCtxSynchronize"))?;
        Ok(region)
    }

    /// Allocates `bytes` (at least 1) of device memory addressed in units of `page_bytes`,
    /// not initialized (the checksum kernel's scratch, which every use writes before it
    /// reads; device memory is never seen as Rust memory).
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuMemAlloc`.
    pub(crate) fn allocate(
        context: Arc<Context>,
        bytes: usize,
        page_bytes: usize,
    ) -> Result<Self, GpuError> {
        context.make_current()?;
        // SAFETY: the context is current on this thread (line above).
        let ptr = unsafe { driver::mem_alloc(bytes) }.map_err(GpuError::driver("cuMemAlloc"))?;
        Ok(Self {
            context,
            ptr,
            bytes,
            page_bytes,
            owned: true,
        })
    }

    /// The pool of `spec` in device memory the caller owns, from `ptr`; never freed here.
    ///
    /// # Safety
    /// `ptr..ptr + num_pages * page_bytes` is device memory of `context`'s device, allocated
    /// for as long as this value lives (M1; `Device::borrow_cuda`'s contract).
    pub(crate) unsafe fn borrowed(
        context: Arc<Context>,
        ptr: DevicePtr,
        spec: &PagePoolSpec,
    ) -> Self {
        Self {
            context,
            ptr,
            // P3: the geometry checked that the product fits.
            bytes: spec.pool_bytes().unwrap_or(usize::MAX),
            page_bytes: spec.page_bytes,
            owned: false,
        }
    }

    /// The device address `offset` bytes into the region. The caller has checked
    /// `offset <= bytes` (`cuda::memory::M1`).
    pub(crate) fn address(&self, offset: usize) -> DevicePtr {
        debug_assert!(
            offset <= self.bytes,
            "cuda::memory::M1 needs a checked offset"
        );
        self.ptr + offset as DevicePtr
    }

    /// The device address of page `page`. The caller has checked `page < num_pages`
    /// (`cuda::memory::M1`).
    pub(crate) fn page_address(&self, page: u32) -> DevicePtr {
        self.address(page as usize * self.page_bytes)
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        if !self.owned || self.context.make_current().is_err() {
            return;
        }
        // SAFETY: the allocation is freed once, here; every stream and in-flight copy that
        // could use it holds a `Device` clone, so none is left when the last one drops.
        if let Err(error) = unsafe { driver::mem_free(self.ptr) } {
            tracing::warn!(bytes = self.bytes, %error, "freeing cuda device pages failed");
        }
    }
}

impl fmt::Debug for DeviceRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRegion")
            .field("bytes", &self.bytes)
            .field("owned", &self.owned)
            .finish_non_exhaustive()
    }
}

/// Page-locked, cached host memory for staging (`cuda::memory::M2`, `cuda::memory::M3`).
pub(crate) struct PinnedBuffer {
    context: Arc<Context>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is owned exclusively, like a `Box<[u8]>`; pinned memory may be freed
// from any thread once its context is made current, which `Drop` does.
unsafe impl Send for PinnedBuffer {}
// SAFETY: `&PinnedBuffer` only hands out `&[u8]` (`cuda::memory::M2`), which is safe to share.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` (at least 1) bytes of pinned memory and zeroes them (`cuda::memory::M2`).
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuMemHostAlloc` (out of pinnable memory).
    pub(crate) fn zeroed(context: Arc<Context>, len: usize) -> Result<Self, GpuError> {
        context.make_current()?;
        // SAFETY: the context is current on this thread (line above).
        let ptr = unsafe { driver::host_alloc(len) }.map_err(GpuError::driver("cuMemHostAlloc"))?;
        // SAFETY: `ptr` is a fresh, exclusively owned allocation of `len` bytes.
        unsafe { ptr.write_bytes(0, len) };
        Ok(Self { context, ptr, len })
    }

    /// The whole buffer.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialized bytes while `self` lives
        // (`cuda::memory::M2`), and `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The first byte, for queueing copies into the buffer while it is borrowed mutably.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// The whole buffer, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.context.make_current().is_err() {
            return;
        }
        // SAFETY: freed once, here; no copy uses it, since an in-flight copy owns the
        // staging pool and finishes before releasing it (`gpu::I3`).
        if let Err(error) = unsafe { driver::host_free(self.ptr) } {
            tracing::warn!(bytes = self.len, %error, "freeing pinned staging memory failed");
        }
    }
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Host memory that something else allocated, page-locked for this context's copies while
/// the value lives (`cuMemHostRegister`); the owner of the memory must outlive it.
pub(crate) struct HostRegistration {
    context: Arc<Context>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the registration only names an address range; it may end on any thread once its
// context is made current, which `Drop` does.
unsafe impl Send for HostRegistration {}
// SAFETY: `&HostRegistration` gives no access to the memory.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Page-locks `ptr..ptr + len` for the copies of `context`.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuMemHostRegister` (the range is not mapped host memory,
    /// or the host cannot lock that much).
    pub(crate) fn register(context: Arc<Context>, ptr: *mut u8, len: usize) -> Result<Self, GpuError> {
        context.make_current()?;
        // SAFETY: the context is current on this thread (line above); the caller keeps the
        // range mapped for longer than the registration lives.
        unsafe { driver::host_register(ptr, len) }.map_err(GpuError::driver("cuMemHostRegister"))?;
        Ok(Self { context, ptr, len })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.context.make_current().is_err() {
            return;
        }
        // SAFETY: registered once in `register`, ended once, here; no copy uses the range,
        // since an in-flight copy owns the staging pool and finishes before releasing it
        // (`gpu::I3`).
        if let Err(error) = unsafe { driver::host_unregister(self.ptr) } {
            tracing::warn!(bytes = self.len, %error, "unregistering lent staging memory failed");
        }
    }
}

impl fmt::Debug for HostRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRegistration")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}
