//! How a [`GpuError`] is classified, from the error alone: its metric label
//! ([`GpuError::kind`]) and whether it is a sticky CUDA error that poisons the device
//! ([`GpuError::is_sticky`], `gpu::I7`).
//!
//! Stickiness is a property of the driver's error code, so it is decided here, in the
//! vocabulary, and the CUDA backend needs no device handle to report it: the front reads
//! it and poisons (`cuda::queue::Q3`).

use super::GpuError;

impl GpuError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NoPagePools => "no_page_pools",
            Self::DuplicateGroup { .. } => "duplicate_group",
            Self::EmptyPagePool { .. } => "empty_page_pool",
            Self::EmptyStagingPool { .. } => "empty_staging_pool",
            Self::SizeOverflow { .. } => "size_overflow",
            Self::UnknownGroup { .. } => "unknown_group",
            Self::PageOutOfRange { .. } => "page_out_of_range",
            Self::LengthMismatch { .. } => "length_mismatch",
            Self::CopyLengthInvalid { .. } => "copy_length_invalid",
            Self::StagingSlotOutOfRange { .. } => "staging_slot_out_of_range",
            Self::StagingRangeOutOfSlot { .. } => "staging_range_out_of_slot",
            Self::OverlappingCopies { .. } => "overlapping_copies",
            Self::EmptyArenaSlot => "empty_arena_slot",
            Self::ArenaAllocFailed { .. } => "arena_alloc_failed",
            Self::HostAllocFailed { .. } => "host_alloc_failed",
            Self::CopyFailed { .. } => "copy_failed",
            Self::Poisoned => "poisoned",
            Self::CudaNotBuilt => "cuda_not_built",
            Self::CudaDriverMissing => "cuda_driver_missing",
            #[cfg(feature = "cuda")]
            Self::CudaInit { .. } => "cuda_init",
            Self::CudaNoDevice { .. } => "cuda_no_device",
            #[cfg(feature = "cuda")]
            Self::Driver { .. } => "cuda_driver",
            #[cfg(feature = "cuda")]
            Self::BackendMismatch { .. } => "backend_mismatch",
            #[cfg(feature = "cuda")]
            Self::CudaCopyFailed { .. } => "cuda_copy_failed",
            Self::PageBytesUnaligned { .. } => "page_bytes_unaligned",
            #[cfg(feature = "cuda")]
            Self::ChecksumKernelInvalid { .. } => "checksum_kernel_invalid",
            Self::ObjectOutOfRange { .. } => "object_out_of_range",
            Self::ObjectRangeOutOfObject { .. } => "object_range_out_of_object",
            Self::BorrowedRegionInvalid { .. } => "borrowed_region_invalid",
            Self::BorrowedOverlap { .. } => "borrowed_overlap",
            Self::BorrowedWrongDevice { .. } => "borrowed_wrong_device",
        }
    }

    /// Whether the error is a sticky CUDA error that leaves the context unusable, so the
    /// device must be poisoned (`gpu::I7`). Always `false` without the `cuda` feature.
    pub fn is_sticky(&self) -> bool {
        match self {
            #[cfg(feature = "cuda")]
            Self::Driver { source, .. } | Self::CudaCopyFailed { source, .. } => {
                is_sticky_driver_error(*source)
            }
            _ => false,
        }
    }

    /// Maps a driver error of the driver function `op` to [`GpuError::Driver`].
    #[cfg(feature = "cuda")]
    pub(crate) fn driver(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Driver { op, source }
    }
}

/// Whether `error` leaves the context unusable ("sticky"): every later call in the
/// process fails the same way, so the device must be poisoned (`gpu::I7`).
#[cfg(feature = "cuda")]
fn is_sticky_driver_error(error: cudarc::driver::DriverError) -> bool {
    use cudarc::driver::sys::CUresult as R;
    matches!(
        error.0,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_ECC_UNCORRECTABLE
            | R::CUDA_ERROR_NVLINK_UNCORRECTABLE
            | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
            | R::CUDA_ERROR_DEINITIALIZED
            | R::CUDA_ERROR_UNKNOWN
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::layout::GroupId;
    use crate::gpu::vocab::copy::CopyDirection;
    use crate::gpu::vocab::stream_id::StreamId;

    #[test]
    fn messages_are_lower_case_and_name_the_values() {
        let err = GpuError::PageOutOfRange {
            group: GroupId(3),
            page: 9,
            num_pages: 4,
        };
        let text = err.to_string();
        assert!(text.starts_with("page 9 of layer group 3"), "{text}");
        assert!(text.contains("4 pages"), "{text}");
        assert_eq!(err.kind(), "page_out_of_range");
    }

    #[test]
    fn cuda_refusals_name_the_setting_that_works() {
        for err in [
            GpuError::CudaNotBuilt,
            GpuError::CudaDriverMissing,
            GpuError::CudaNoDevice {
                ordinal: 1,
                devices: 1,
            },
        ] {
            let text = err.to_string();
            assert!(text.contains("device.kind = \"host\""), "{text}");
            assert!(!err.is_sticky());
        }
        assert!(GpuError::CudaNotBuilt
            .to_string()
            .contains("--features cuda"));
        assert_eq!(GpuError::CudaDriverMissing.kind(), "cuda_driver_missing");
    }

    #[test]
    fn copy_failed_names_stream_and_direction() {
        let err = GpuError::CopyFailed {
            stream: StreamId(2),
            direction: CopyDirection::HostToDevice,
            bytes: 64,
        };
        assert_eq!(
            err.to_string(),
            "host-to-device copy of 64 bytes on stream s2 failed"
        );
        assert_eq!(err.kind(), "copy_failed");
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn sticky_errors_are_told_apart_from_recoverable_ones() {
        use cudarc::driver::{sys, DriverError};
        assert!(is_sticky_driver_error(DriverError(
            sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        )));
        assert!(is_sticky_driver_error(DriverError(
            sys::CUresult::CUDA_ERROR_LAUNCH_FAILED
        )));
        assert!(!is_sticky_driver_error(DriverError(
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
        )));
        assert!(!is_sticky_driver_error(DriverError(
            sys::CUresult::CUDA_ERROR_INVALID_VALUE
        )));
    }
}
