//! Choosing the backend at start: `device.kind = "auto" | "cuda" | "host"` (config
//! `[device]`) becomes a [`DeviceRequest`], and [`Device::open`] turns it into a device.
//!
//! Workflow:
//! - `host` opens host memory and never touches the CUDA driver.
//! - `cuda` opens CUDA device 0, or fails with an error that names `device.kind = "host"`
//!   as the setting that works: [`GpuError::CudaNotBuilt`] without the `cuda` feature,
//!   [`GpuError::CudaDriverMissing`] when `libcuda` does not load, and so on.
//! - `auto` probes (library present first, since cudarc's lazy loader panics without a
//!   driver; then `cuInit`; then a device count above 0) and opens CUDA device 0 when the
//!   probe succeeds, host memory otherwise. Either way it logs what it picked and why at
//!   `info` level. A CUDA device that is present but fails to open (out of memory, say) is
//!   an error, not a silent fallback.

use serde::{Deserialize, Serialize};

use super::device::Device;
use super::vocab::{GpuError, PagePoolSpec};

/// Which backend the configuration asks for: the type of `device.kind` (what a device
/// turned out to be once open is [`DeviceKind`](super::DeviceKind), which has no `auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceRequest {
    /// CUDA device 0 when a driver and a device are present, host memory otherwise.
    Auto,
    /// CUDA device 0, or an error (start fails without a device).
    Cuda,
    /// Host memory, even on a machine with a GPU (tests, replay without a GPU); the CUDA
    /// driver is never loaded.
    Host,
}

impl DeviceRequest {
    /// The spellings accepted in TOML, the environment and on the command line.
    pub const NAMES: &'static [&'static str] = &["auto", "cuda", "host"];

    /// The setting's spelling in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cuda => "cuda",
            Self::Host => "host",
        }
    }
}

impl Device {
    /// Opens the device that `request` asks for, with one zeroed page pool per spec (see
    /// the module docs for how `auto` decides).
    ///
    /// # Errors
    /// The spec errors of [`PageGeometry::new`](super::PageGeometry::new); for
    /// [`DeviceRequest::Cuda`] the errors of [`Device::open_cuda`], each naming
    /// `device.kind = "host"`; for [`DeviceRequest::Auto`] only errors of a CUDA device that
    /// is present but fails to open.
    pub fn open(request: DeviceRequest, specs: &[PagePoolSpec]) -> Result<Self, GpuError> {
        match request {
            DeviceRequest::Host => {
                tracing::info!(
                    request = request.as_str(),
                    device = "host",
                    "device opened in host memory"
                );
                Self::open_host(specs)
            }
            DeviceRequest::Cuda => {
                let device = Self::open_cuda(0, specs)?;
                tracing::info!(
                    request = request.as_str(),
                    device = "cuda",
                    ordinal = 0,
                    "cuda device opened"
                );
                Ok(device)
            }
            DeviceRequest::Auto => match cuda_devices() {
                Ok(devices) => {
                    let device = Self::open_cuda(0, specs)?;
                    tracing::info!(
                        request = request.as_str(),
                        device = "cuda",
                        ordinal = 0,
                        devices,
                        "cuda device found and opened"
                    );
                    Ok(device)
                }
                Err(reason) => {
                    tracing::info!(request = request.as_str(), device = "host", %reason, "no usable cuda device; pages stay in host memory");
                    Self::open_host(specs)
                }
            },
        }
    }
}

/// How many CUDA devices the driver sees, or why CUDA cannot be used. Never panics.
///
/// # Errors
/// [`GpuError::CudaNotBuilt`] without the `cuda` feature; [`GpuError::CudaDriverMissing`],
/// `GpuError::CudaInit` or [`GpuError::CudaNoDevice`] with it.
pub fn cuda_devices() -> Result<u32, GpuError> {
    #[cfg(feature = "cuda")]
    {
        super::backend::cuda::probe().map(|found| found.devices)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(GpuError::CudaNotBuilt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::layout::GroupId;
    use crate::gpu::DeviceKind;

    fn specs() -> [PagePoolSpec; 1] {
        [PagePoolSpec {
            group: GroupId(0),
            page_bytes: 8,
            num_pages: 2,
        }]
    }

    #[test]
    fn host_request_opens_host_memory() -> Result<(), GpuError> {
        let device = Device::open(DeviceRequest::Host, &specs())?;
        assert_eq!(device.kind(), DeviceKind::Host);
        Ok(())
    }

    /// On a machine without a driver (CI, this workplace's build machine) `auto` must fall
    /// back to host memory; where a driver and a device exist it must pick CUDA.
    #[test]
    fn auto_falls_back_to_host_without_a_cuda_device() -> Result<(), GpuError> {
        let device = Device::open(DeviceRequest::Auto, &specs())?;
        match cuda_devices() {
            Ok(_) => assert_eq!(device.kind(), DeviceKind::Cuda),
            Err(reason) => {
                assert_eq!(device.kind(), DeviceKind::Host, "{reason}");
                device.write_page(GroupId(0), 1, &[7; 8])?;
                assert_eq!(device.read_page_to_vec(GroupId(0), 1)?, vec![7; 8]);
            }
        }
        Ok(())
    }

    #[test]
    fn cuda_request_without_a_device_names_the_host_setting() {
        let Err(reason) = cuda_devices() else {
            return; // A real GPU is present: gpu_cuda.rs covers that machine.
        };
        let err = Device::open(DeviceRequest::Cuda, &specs()).unwrap_err();
        assert_eq!(err.kind(), reason.kind());
        let text = err.to_string();
        assert!(text.contains("device.kind = \"host\""), "{text}");
        if cfg!(feature = "cuda") {
            assert!(
                matches!(
                    err,
                    GpuError::CudaDriverMissing | GpuError::CudaNoDevice { .. }
                ) || err.kind() == "cuda_init",
                "{err}"
            );
        } else {
            assert!(matches!(err, GpuError::CudaNotBuilt), "{err}");
            assert!(text.contains("--features cuda"), "{text}");
        }
    }

    #[test]
    fn requests_follow_the_configured_kind() {
        let requests = [
            DeviceRequest::Auto,
            DeviceRequest::Cuda,
            DeviceRequest::Host,
        ];
        let spellings: Vec<&str> = requests.iter().map(|request| request.as_str()).collect();
        assert_eq!(spellings, DeviceRequest::NAMES);
        assert_eq!(DeviceRequest::Host.as_str(), "host");
    }
}
