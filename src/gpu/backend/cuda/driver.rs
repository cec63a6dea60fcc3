//! The bottom layer of the CUDA backend: one thin function per CUDA driver call, over
//! cudarc's `driver::sys` bindings (loaded at run time, `dynamic-loading`).
//!
//! Every function here is exactly one FFI operation in one `unsafe` block with its
//! `// SAFETY:` note, and turns the `CUresult` into a [`DriverError`]. Functions that take
//! raw handles or pointers are `unsafe fn` with a `# Safety` section; the RAII types in
//! `context.rs`, `memory.rs` and `queue.rs` are their only callers and uphold those contracts.
//!
//! Invariants:
//! - `cuda::driver::D1`. Nothing here is called before [`library_present`] returned `true`:
//!   cudarc's lazy loader panics when `libcuda` is missing, so `Device::open` checks presence
//!   first.
//! - `cuda::driver::D2`. No function here keeps a pointer past its return; ownership lives in the
//!   RAII layer.

use std::ffi::{c_int, c_uint, c_void};
use std::mem::MaybeUninit;

use cudarc::driver::sys;
use cudarc::driver::DriverError;

/// Raw handles, re-exported under names that say what they are.
pub(crate) use sys::{CUcontext as RawContext, CUdevice as RawDevice};
pub(crate) use sys::{CUdeviceptr as DevicePtr, CUevent as RawEvent, CUstream as RawStream};
pub(crate) use sys::{CUfunction as RawFunction, CUmodule as RawModule};

/// Whether the CUDA driver library (`libcuda.so`) can be loaded (`cuda::driver::D1`). Never panics.
pub(crate) fn library_present() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate library names and
    // drops each handle it opened; it calls no driver function.
    unsafe { sys::is_culib_present() }
}

/// `cuInit(0)`: initializes the driver API in this process (idempotent).
pub(crate) fn init() -> Result<(), DriverError> {
    // SAFETY: `cuInit` takes a flags value that must be 0 and touches no caller memory;
    // the library is present (`cuda::driver::D1`).
    unsafe { sys::cuInit(0) }.result()
}

/// `cuDeviceGetCount`: how many CUDA devices the driver sees.
pub(crate) fn device_count() -> Result<c_int, DriverError> {
    let mut count = MaybeUninit::<c_int>::uninit();
    // SAFETY: the out-pointer is valid for one `c_int` write for the whole call.
    unsafe { sys::cuDeviceGetCount(count.as_mut_ptr()) }.result()?;
    // SAFETY: the call succeeded, so the driver wrote the count.
    Ok(unsafe { count.assume_init() })
}

/// `cuDeviceGet`: the handle of device `ordinal`.
pub(crate) fn device_get(ordinal: c_int) -> Result<RawDevice, DriverError> {
    let mut device = MaybeUninit::<RawDevice>::uninit();
    // SAFETY: the out-pointer is valid for one handle write; a bad ordinal is an error code.
    unsafe { sys::cuDeviceGet(device.as_mut_ptr(), ordinal) }.result()?;
    // SAFETY: the call succeeded, so the driver wrote the handle.
    Ok(unsafe { device.assume_init() })
}

/// `cuDevicePrimaryCtxRetain`: retains (creating on first use) the device's primary context.
///
/// # Safety
/// `device` came from [`device_get`].
pub(crate) unsafe fn primary_context_retain(device: RawDevice) -> Result<RawContext, DriverError> {
    let mut context = MaybeUninit::<RawContext>::uninit();
    // SAFETY: the out-pointer is valid for one handle write; `device` is valid (caller).
    unsafe { sys::cuDevicePrimaryCtxRetain(context.as_mut_ptr(), device) }.result()?;
    // SAFETY: the call succeeded, so the driver wrote the context handle.
    Ok(unsafe { context.assume_init() })
}

/// `cuDevicePrimaryCtxRelease`: drops one retain of the device's primary context.
///
/// # Safety
/// Balances exactly one successful [`primary_context_retain`] of `device`.
pub(crate) unsafe fn primary_context_release(device: RawDevice) -> Result<(), DriverError> {
    // SAFETY: the caller balances one retain of this device; no memory is passed.
    unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) }.result()
}

/// `cuCtxSetCurrent`: binds `context` to the calling thread.
///
/// # Safety
/// `context` is a retained primary context that is still retained.
pub(crate) unsafe fn context_set_current(context: RawContext) -> Result<(), DriverError> {
    // SAFETY: the context is retained (caller), so the handle is live.
    unsafe { sys::cuCtxSetCurrent(context) }.result()
}

/// `cuMemAlloc`: `bytes` of device memory in the current context.
///
/// # Safety
/// The owning context is current on this thread.
pub(crate) unsafe fn mem_alloc(bytes: usize) -> Result<DevicePtr, DriverError> {
    let mut ptr = MaybeUninit::<DevicePtr>::uninit();
    // SAFETY: the out-pointer is valid for one `CUdeviceptr` write; a context is current.
    unsafe { sys::cuMemAlloc_v2(ptr.as_mut_ptr(), bytes) }.result()?;
    // SAFETY: the call succeeded, so the driver wrote the device address.
    Ok(unsafe { ptr.assume_init() })
}

/// `cuMemFree`: frees memory from [`mem_alloc`].
///
/// # Safety
/// `ptr` came from [`mem_alloc`], is freed once, and no copy still uses it.
pub(crate) unsafe fn mem_free(ptr: DevicePtr) -> Result<(), DriverError> {
    // SAFETY: single free of a live allocation with no pending users (caller).
    unsafe { sys::cuMemFree_v2(ptr) }.result()
}

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)`: the ordinal of the device
/// whose memory `ptr` points into (an error for memory the driver does not know).
pub(crate) fn pointer_device_ordinal(ptr: DevicePtr) -> Result<c_int, DriverError> {
    let mut ordinal = MaybeUninit::<c_int>::uninit();
    let attribute = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    // SAFETY: the out-pointer is valid for the one `int` this attribute writes; the driver
    // only inspects the address, never dereferences it, and answers an error for an unknown
    // one. The library is present (D1).
    unsafe { sys::cuPointerGetAttribute(ordinal.as_mut_ptr().cast::<c_void>(), attribute, ptr) }
        .result()?;
    // SAFETY: the call succeeded, so the driver wrote the ordinal.
    Ok(unsafe { ordinal.assume_init() })
}

/// `cuMemsetD8`: sets `bytes` bytes at `ptr` to `value`, synchronously.
///
/// # Safety
/// `ptr..ptr + bytes` lies inside one live [`mem_alloc`] allocation of the current context.
pub(crate) unsafe fn mem_set(ptr: DevicePtr, value: u8, bytes: usize) -> Result<(), DriverError> {
    // SAFETY: the range lies in a live device allocation (caller); no host memory is used.
    unsafe { sys::cuMemsetD8_v2(ptr, value, bytes) }.result()
}

/// `cuMemHostAlloc(bytes, 0)`: page-locked host memory, cached (flags 0, so NOT
/// write-combined: the CPU reads staging at full speed) and usable by DMA.
///
/// # Safety
/// The owning context is current on this thread.
pub(crate) unsafe fn host_alloc(bytes: usize) -> Result<*mut u8, DriverError> {
    let mut ptr = MaybeUninit::<*mut c_void>::uninit();
    // SAFETY: the out-pointer is valid for one pointer write; flags 0 is a valid value.
    unsafe { sys::cuMemHostAlloc(ptr.as_mut_ptr(), bytes, 0) }.result()?;
    // SAFETY: the call succeeded, so the driver wrote the host address.
    Ok(unsafe { ptr.assume_init() }.cast::<u8>())
}

/// `cuMemFreeHost`: frees memory from [`host_alloc`].
///
/// # Safety
/// `ptr` came from [`host_alloc`], is freed once, and no copy or reference still uses it.
pub(crate) unsafe fn host_free(ptr: *mut u8) -> Result<(), DriverError> {
    // SAFETY: single free of a live pinned allocation with no users left (caller).
    unsafe { sys::cuMemFreeHost(ptr.cast::<c_void>()) }.result()
}

/// `cuMemHostRegister(ptr, bytes, 0)`: page-locks host memory that something else
/// allocated, so DMA may read and write it like [`host_alloc`]'s.
///
/// # Safety
/// The owning context is current on this thread, and `ptr..ptr + bytes` stays mapped until
/// [`host_unregister`].
pub(crate) unsafe fn host_register(ptr: *mut u8, bytes: usize) -> Result<(), DriverError> {
    // SAFETY: the range is mapped host memory (caller); flags 0 is a valid value.
    unsafe { sys::cuMemHostRegister_v2(ptr.cast::<c_void>(), bytes, 0) }.result()
}

/// `cuMemHostUnregister`: ends a [`host_register`].
///
/// # Safety
/// `ptr` was registered with [`host_register`], once, and no copy still uses it.
pub(crate) unsafe fn host_unregister(ptr: *mut u8) -> Result<(), DriverError> {
    // SAFETY: single unregister of a live registration with no copies left (caller).
    unsafe { sys::cuMemHostUnregister(ptr.cast::<c_void>()) }.result()
}

/// `cuStreamCreate(CU_STREAM_NON_BLOCKING)`: a stream that never waits for stream 0.
///
/// # Safety
/// The owning context is current on this thread.
pub(crate) unsafe fn stream_create() -> Result<RawStream, DriverError> {
    let mut stream = MaybeUninit::<RawStream>::uninit();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
    // SAFETY: the out-pointer is valid for one handle write; the flag value is valid.
    unsafe { sys::cuStreamCreate(stream.as_mut_ptr(), flags) }.result()?;
    // SAFETY: the call succeeded, so the driver wrote the stream handle.
    Ok(unsafe { stream.assume_init() })
}

/// `cuStreamSynchronize`: blocks until all work queued on `stream` is done.
///
/// # Safety
/// `stream` came from [`stream_create`] and is not destroyed.
pub(crate) unsafe fn stream_synchronize(stream: RawStream) -> Result<(), DriverError> {
    // SAFETY: the stream handle is live (caller).
    unsafe { sys::cuStreamSynchronize(stream) }.result()
}

/// `cuStreamDestroy`: releases `stream` (queued work still completes).
///
/// # Safety
/// `stream` came from [`stream_create`] and is destroyed once.
pub(crate) unsafe fn stream_destroy(stream: RawStream) -> Result<(), DriverError> {
    // SAFETY: single destroy of a live stream (caller).
    unsafe { sys::cuStreamDestroy_v2(stream) }.result()
}

/// `cuEventCreate(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)`: an event whose
/// synchronize sleeps instead of spinning, and that records no timestamps.
///
/// # Safety
/// The owning context is current on this thread.
pub(crate) unsafe fn event_create() -> Result<RawEvent, DriverError> {
    let mut event = MaybeUninit::<RawEvent>::uninit();
    let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as c_uint
        | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
    // SAFETY: the out-pointer is valid for one handle write; the flags are valid values.
    unsafe { sys::cuEventCreate(event.as_mut_ptr(), flags) }.result()?;
    // SAFETY: the call succeeded, so the driver wrote the event handle.
    Ok(unsafe { event.assume_init() })
}

/// `cuEventRecord`: the event completes once all work queued on `stream` so far is done.
///
/// # Safety
/// Both handles are live and belong to the same context.
pub(crate) unsafe fn event_record(event: RawEvent, stream: RawStream) -> Result<(), DriverError> {
    // SAFETY: both handles are live (caller).
    unsafe { sys::cuEventRecord(event, stream) }.result()
}

/// `cuEventSynchronize`: blocks (sleeping, blocking-sync flag) until the event completes;
/// reports the error of any failed work before it.
///
/// # Safety
/// `event` came from [`event_create`] and is not destroyed.
pub(crate) unsafe fn event_synchronize(event: RawEvent) -> Result<(), DriverError> {
    // SAFETY: the event handle is live (caller).
    unsafe { sys::cuEventSynchronize(event) }.result()
}

/// `cuEventQuery`: `Ok` when complete, `CUDA_ERROR_NOT_READY` while pending. Never blocks.
///
/// # Safety
/// `event` came from [`event_create`] and is not destroyed.
pub(crate) unsafe fn event_query(event: RawEvent) -> Result<(), DriverError> {
    // SAFETY: the event handle is live (caller).
    unsafe { sys::cuEventQuery(event) }.result()
}

/// `cuEventDestroy`: releases `event`.
///
/// # Safety
/// `event` came from [`event_create`] and is destroyed once.
pub(crate) unsafe fn event_destroy(event: RawEvent) -> Result<(), DriverError> {
    // SAFETY: single destroy of a live event (caller).
    unsafe { sys::cuEventDestroy_v2(event) }.result()
}

/// `cuMemcpyHtoDAsync`: queues a copy of `bytes` bytes from host `src` to device `dst`.
///
/// # Safety
/// `dst..dst + bytes` lies in a live device allocation; `src..src + bytes` is readable host
/// memory that nobody writes, and that stays allocated, until the copy completes (pinned
/// for a truly asynchronous copy; pageable memory is staged before the call returns);
/// `stream` is live; all belong to the current context.
pub(crate) unsafe fn memcpy_to_device_async(
    dst: DevicePtr,
    src: *const u8,
    bytes: usize,
    stream: RawStream,
) -> Result<(), DriverError> {
    // SAFETY: both ranges and the stream are valid until completion (caller).
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast::<c_void>(), bytes, stream) }.result()
}

/// `cuMemcpyDtoHAsync`: queues a copy of `bytes` bytes from device `src` to host `dst`.
///
/// # Safety
/// `src..src + bytes` lies in a live device allocation; `dst..dst + bytes` is writable
/// host memory that nobody else reads or writes, and that stays allocated, until the copy
/// completes; `stream` is live; all belong to the current context.
pub(crate) unsafe fn memcpy_to_host_async(
    dst: *mut u8,
    src: DevicePtr,
    bytes: usize,
    stream: RawStream,
) -> Result<(), DriverError> {
    // SAFETY: both ranges and the stream are valid until completion (caller).
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast::<c_void>(), src, bytes, stream) }.result()
}

/// `cuCtxSynchronize`: blocks until all work of the current context is done.
///
/// # Safety
/// A context is current on this thread.
pub(crate) unsafe fn context_synchronize() -> Result<(), DriverError> {
    // SAFETY: no pointers; the current context is valid (caller).
    unsafe { sys::cuCtxSynchronize() }.result()
}

/// `cuMemcpy2DAsync`: queues `height` rows of `width` bytes between host and device, rows
/// `host_pitch` apart in host memory and `device_pitch` apart on the device; `to_device`
/// picks the direction.
///
/// # Safety
/// Every row `host + i * host_pitch .. + width` is host memory valid for the copy's
/// direction (readable for `to_device`, writable and untouched by anyone else otherwise)
/// until the copy completes, and every row `device + i * device_pitch .. + width` lies in a
/// live device allocation; `stream` is live; all belong to the current context.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per CUDA_MEMCPY2D field used"
)]
pub(crate) unsafe fn memcpy_2d_async(
    to_device: bool,
    host: *mut u8,
    host_pitch: usize,
    device: DevicePtr,
    device_pitch: usize,
    width: usize,
    height: usize,
    stream: RawStream,
) -> Result<(), DriverError> {
    let (host_side, device_side) = (
        sys::CUmemorytype::CU_MEMORYTYPE_HOST,
        sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
    );
    let mut copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: device_side,
        srcHost: std::ptr::null(),
        srcDevice: device,
        srcArray: std::ptr::null_mut(),
        srcPitch: device_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: host_side,
        dstHost: host.cast::<c_void>(),
        dstDevice: 0,
        dstArray: std::ptr::null_mut(),
        dstPitch: host_pitch,
        WidthInBytes: width,
        Height: height,
    };
    if to_device {
        copy.srcMemoryType = host_side;
        copy.srcHost = host.cast_const().cast::<c_void>();
        copy.srcDevice = 0;
        copy.srcPitch = host_pitch;
        copy.dstMemoryType = device_side;
        copy.dstHost = std::ptr::null_mut();
        copy.dstDevice = device;
        copy.dstPitch = device_pitch;
    }
    // SAFETY: the descriptor lives across the call (the driver reads it before returning);
    // the ranges it names are valid until completion (caller).
    unsafe { sys::cuMemcpy2DAsync_v2(&raw const copy, stream) }.result()
}

/// `cuModuleLoadData`: loads a module from NUL-terminated PTX text (the driver compiles
/// it for the current device).
///
/// # Safety
/// The owning context is current on this thread.
pub(crate) unsafe fn module_load_ptx(ptx: &std::ffi::CStr) -> Result<RawModule, DriverError> {
    let mut module = MaybeUninit::<RawModule>::uninit();
    // SAFETY: the out-pointer is valid for one write; `ptx` is NUL-terminated text that
    // outlives the call (the driver copies what it needs).
    unsafe { sys::cuModuleLoadData(module.as_mut_ptr(), ptx.as_ptr().cast::<c_void>()) }
        .result()?;
    // SAFETY: the call succeeded, so the driver wrote the handle.
    Ok(unsafe { module.assume_init() })
}

/// `cuModuleGetFunction`: the kernel `name` of `module`.
///
/// # Safety
/// `module` is live and its context is current.
pub(crate) unsafe fn module_function(
    module: RawModule,
    name: &std::ffi::CStr,
) -> Result<RawFunction, DriverError> {
    let mut function = MaybeUninit::<RawFunction>::uninit();
    // SAFETY: the out-pointer is valid for one write; the module is live (caller).
    unsafe { sys::cuModuleGetFunction(function.as_mut_ptr(), module, name.as_ptr()) }.result()?;
    // SAFETY: the call succeeded, so the driver wrote the handle.
    Ok(unsafe { function.assume_init() })
}

/// `cuModuleUnload`.
///
/// # Safety
/// `module` is live, unloaded once, and no queued launch of its functions is pending.
pub(crate) unsafe fn module_unload(module: RawModule) -> Result<(), DriverError> {
    // SAFETY: single unload of a live module with no pending work (caller).
    unsafe { sys::cuModuleUnload(module) }.result()
}

/// `cuLaunchKernel` with a one-dimensional grid and block and no dynamic shared memory.
///
/// # Safety
/// `function` is live; `params` points at one pointer per kernel parameter, each to a
/// value of the parameter's type, valid for the duration of the call (the driver copies
/// the values); every device address passed stays allocated until the launch completes;
/// `stream` is live; all belong to the current context.
pub(crate) unsafe fn launch_kernel(
    function: RawFunction,
    grid_blocks: c_uint,
    block_threads: c_uint,
    stream: RawStream,
    params: &mut [*mut c_void],
) -> Result<(), DriverError> {
    // SAFETY: arguments valid as documented (caller); no `extra` array.
    unsafe {
        sys::cuLaunchKernel(
            function,
            grid_blocks,
            1,
            1,
            block_threads,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}

/// Whether `error` is the "still running" answer of [`event_query`].
pub(crate) fn is_not_ready(error: DriverError) -> bool {
    error.0 == sys::CUresult::CUDA_ERROR_NOT_READY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_is_told_apart_from_errors() {
        assert!(is_not_ready(DriverError(
            sys::CUresult::CUDA_ERROR_NOT_READY
        )));
        assert!(!is_not_ready(DriverError(
            sys::CUresult::CUDA_ERROR_INVALID_VALUE
        )));
    }
}
