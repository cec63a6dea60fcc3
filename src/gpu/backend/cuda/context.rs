//! The CUDA context: the retained primary context of one device, made current on whatever
//! thread calls into the backend.
//!
//! Workflow:
//! 1. [`probe`] checks that the driver library loads (`cuda::driver::D1`), runs `cuInit` and counts
//!    devices; `Device::open` uses it for `auto` and to turn "no driver" into a clear error.
//! 2. [`Context::retain`] retains the primary context of a device (`cuDevicePrimaryCtxRetain`),
//!    the one the CUDA runtime and frameworks share, so pages are visible to the engine.
//! 3. Every backend entry point (allocation, copy submission, wait, free) first calls
//!    [`Context::make_current`], so loader threads, the saver's thread and the engine thread
//!    need no setup of their own.
//!
//! Invariants:
//! - `cuda::context::X1`. A [`Context`] holds exactly one retain; `Drop` releases it. Every RAII
//!   type that frees driver objects holds an `Arc<Context>`, so the context outlives them all.
//! - `cuda::context::X2`. `make_current` is called before every driver call that uses the context;
//!   it is a cheap thread-local store in the driver.

use std::ffi::c_int;
use std::fmt;

use super::driver::{self, RawContext, RawDevice};
use crate::gpu::vocab::GpuError;

/// What [`probe`] found: the driver works and sees `devices` devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DriverProbe {
    /// Devices the driver reports (at least 1).
    pub devices: u32,
}

/// Checks, in order, that `libcuda` loads (`cuda::driver::D1`), that `cuInit` succeeds, and that at
/// least one device exists. Never panics, also on machines without a driver.
///
/// # Errors
/// [`GpuError::CudaDriverMissing`], [`GpuError::CudaInit`] or [`GpuError::CudaNoDevice`].
pub(crate) fn probe() -> Result<DriverProbe, GpuError> {
    if !driver::library_present() {
        return Err(GpuError::CudaDriverMissing);
    }
    driver::init().map_err(|source| GpuError::CudaInit { source })?;
    let count = driver::device_count().map_err(|source| GpuError::CudaInit { source })?;
    match u32::try_from(count) {
        Ok(devices) if devices > 0 => Ok(DriverProbe { devices }),
        _ => Err(GpuError::CudaNoDevice {
            ordinal: 0,
            devices: 0,
        }),
    }
}

/// One retain of a device's primary context (`cuda::context::X1`).
pub(crate) struct Context {
    device: RawDevice,
    raw: RawContext,
    ordinal: u32,
}

// SAFETY: a `CUcontext` handle may be used from any thread (the driver API is thread-safe,
// and `make_current` binds it per thread); the struct owns no thread-local state.
unsafe impl Send for Context {}
// SAFETY: shared use only reads the handles and calls thread-safe driver functions.
unsafe impl Sync for Context {}

impl Context {
    /// Probes the driver and retains the primary context of device `ordinal`, current on
    /// this thread afterwards.
    ///
    /// # Errors
    /// The errors of [`probe`]; [`GpuError::CudaNoDevice`] if `ordinal` is past the last
    /// device; [`GpuError::Driver`] if a driver call fails.
    pub(crate) fn retain(ordinal: u32) -> Result<Self, GpuError> {
        let found = probe()?;
        if ordinal >= found.devices {
            return Err(GpuError::CudaNoDevice {
                ordinal,
                devices: found.devices,
            });
        }
        let raw_ordinal = c_int::try_from(ordinal).map_err(|_| GpuError::CudaNoDevice {
            ordinal,
            devices: found.devices,
        })?;
        let device = driver::device_get(raw_ordinal).map_err(GpuError::driver("cuDeviceGet"))?;
        // SAFETY: `device` came from `cuDeviceGet` just above.
        let raw = unsafe { driver::primary_context_retain(device) }
            .map_err(GpuError::driver("cuDevicePrimaryCtxRetain"))?;
        let retained = Self {
            device,
            raw,
            ordinal,
        };
        retained.make_current()?;
        Ok(retained)
    }

    /// Binds the context to the calling thread (`cuda::context::X2`).
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuCtxSetCurrent`.
    pub(crate) fn make_current(&self) -> Result<(), GpuError> {
        // SAFETY: `self` holds a retain of this context (`cuda::context::X1`), so the handle is
        // live.
        unsafe { driver::context_set_current(self.raw) }
            .map_err(GpuError::driver("cuCtxSetCurrent"))
    }

    /// The device's ordinal.
    pub(crate) fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the one retain this value holds (`cuda::context::X1`); every user of the
        // context holds an `Arc<Context>`, so none is left.
        if let Err(error) = unsafe { driver::primary_context_release(self.device) } {
            tracing::warn!(ordinal = self.ordinal, %error, "releasing the cuda primary context failed");
        }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}
