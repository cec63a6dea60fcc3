//! The vocabulary's error: [`GpuError`], every failure of the device layer, as plain data.
//!
//! Workflow: validation errors (unknown group, page or slot out of range, bad lengths,
//! overlapping destinations) are found before any byte moves; `CopyStream::scatter` /
//! `gather` return them inside the front's `SubmitError`, which also hands back the untouched
//! staging pool (`gpu::I4`). Failures of a copy that was issued come back from
//! `InFlight::wait` as [`GpuError::CopyFailed`]. Once a device is poisoned, every call fails
//! with [`GpuError::Poisoned`] (`gpu::I7`).
//!
//! Opening a device reports why CUDA cannot be used ([`GpuError::CudaNotBuilt`],
//! [`GpuError::CudaDriverMissing`], `GpuError::CudaInit`, [`GpuError::CudaNoDevice`]),
//! each message naming `device.kind = "host"` as the setting that works without a GPU.
//! With the `cuda` feature, driver failures keep `cudarc::driver::DriverError` as their
//! `#[source]` (`GpuError::Driver`, `GpuError::CudaCopyFailed`); no variant
//! carries a `String` built from another error.
//!
//! Invariants:
//! - `error::E1`. A [`GpuError`] owns no resource (no buffer, handle or device): it is ids,
//!   sizes, labels and the driver's error code, so every floor can build, move and drop one.
//!   An error that must hand a resource back (a refused submission and its staging pool,
//!   `SubmitError`; a refused checked submission, `CheckedSubmitError`) is a type of the
//!   floor that owns the resource, wrapping a `GpuError`.
//!
//! Labels and stickiness (whether a driver error leaves the context unusable) are decided in
//! `classify.rs`, from the error alone.

use crate::core::layout::GroupId;

use super::copy::CopyDirection;
use super::stream_id::StreamId;

mod classify;

/// Any failure of the device layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// A device was opened without any page pool.
    #[error("a device needs at least one page pool (one per layer group of the layout)")]
    NoPagePools,

    /// Two page pool specs name the same layer group.
    #[error("layer group {group} has more than one page pool spec")]
    DuplicateGroup {
        /// The group named twice.
        group: GroupId,
    },

    /// A page pool spec has zero pages or pages of zero bytes.
    #[error(
        "page pool of layer group {group} is empty (page_bytes = {page_bytes}, \
         num_pages = {num_pages}); both must be at least 1"
    )]
    EmptyPagePool {
        /// The group of the spec.
        group: GroupId,
        /// Bytes per page asked for.
        page_bytes: usize,
        /// Pages asked for.
        num_pages: u32,
    },

    /// A staging pool was asked for with zero slots or slots of zero bytes.
    #[error(
        "staging pool is empty (slot_bytes = {slot_bytes}, slots = {slots}); \
         both must be at least 1"
    )]
    EmptyStagingPool {
        /// Bytes per slot asked for.
        slot_bytes: usize,
        /// Slots asked for.
        slots: u32,
    },

    /// A pool's byte size (`count * unit_bytes`) does not fit in the address space.
    #[error("{what} of {count} x {unit_bytes} bytes does not fit in the address space")]
    SizeOverflow {
        /// Which pool: `"page pool"` or `"staging pool"`.
        what: &'static str,
        /// Number of pages or slots.
        count: u32,
        /// Bytes per page or slot.
        unit_bytes: usize,
    },

    /// A layer group that has no page pool on this device.
    #[error("layer group {group} has no page pool on this device")]
    UnknownGroup {
        /// The group asked for.
        group: GroupId,
    },

    /// A page index at or past the end of its group's pool.
    #[error("page {page} of layer group {group} is out of range (the pool has {num_pages} pages)")]
    PageOutOfRange {
        /// The group addressed.
        group: GroupId,
        /// The page index asked for.
        page: u32,
        /// Pages in that group's pool.
        num_pages: u32,
    },

    /// A buffer handed to `write_page` / `read_page` is not exactly one page long.
    #[error(
        "buffer for page {page} of layer group {group} is {actual} bytes; \
         a page of that group is {expected} bytes"
    )]
    LengthMismatch {
        /// The group addressed.
        group: GroupId,
        /// The page addressed.
        page: u32,
        /// The group's page size.
        expected: usize,
        /// The buffer's length.
        actual: usize,
    },

    /// A copy of zero bytes or of more bytes than a page holds.
    #[error(
        "copy of {len} bytes for page {page} of layer group {group} is invalid; \
         it must be 1..={page_bytes} bytes"
    )]
    CopyLengthInvalid {
        /// The group addressed.
        group: GroupId,
        /// The page addressed.
        page: u32,
        /// The copy length asked for.
        len: usize,
        /// The group's page size.
        page_bytes: usize,
    },

    /// A staging slot index at or past the end of the staging pool.
    #[error("staging slot {slot} is out of range (the staging pool has {slots} slots)")]
    StagingSlotOutOfRange {
        /// The slot asked for.
        slot: u32,
        /// Slots in the staging pool.
        slots: u32,
    },

    /// A byte range that does not fit inside its staging slot.
    #[error(
        "staging range {offset}..{offset}+{len} does not fit in slot {slot} \
         of {slot_bytes} bytes"
    )]
    StagingRangeOutOfSlot {
        /// The slot addressed.
        slot: u32,
        /// Offset inside the slot.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Bytes per slot.
        slot_bytes: usize,
    },

    /// Two copies of one submission write overlapping destination bytes, so the result
    /// would depend on their order (`gpu::I5`).
    #[error("copies {first} and {second} of one submission write overlapping destination bytes")]
    OverlappingCopies {
        /// Index of one copy in the submitted list.
        first: usize,
        /// Index of the other copy in the submitted list.
        second: usize,
    },

    /// A host arena slot of zero bytes was asked for; slots hold at least one byte.
    #[error("a host arena slot must be at least 1 byte long")]
    EmptyArenaSlot,

    /// The heap refused a new host arena chunk.
    #[error(
        "could not allocate a host arena chunk of {chunk_bytes} bytes for an object of \
         {len} bytes; lower pool.capacity_bytes or free host memory"
    )]
    ArenaAllocFailed {
        /// The slot length asked for.
        len: usize,
        /// The chunk size that could not be allocated.
        chunk_bytes: usize,
    },

    /// The heap refused host memory for a staging pool or a page pool.
    #[error("could not allocate {bytes} bytes of host memory for {what}")]
    HostAllocFailed {
        /// What the memory was for (`staging pool`, `page pool`).
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
    },

    /// An issued copy failed; its destination bytes must be treated as not written (`gpu::I6`).
    #[error("{direction} copy of {bytes} bytes on stream {stream} failed")]
    CopyFailed {
        /// The stream the copy ran on.
        stream: StreamId,
        /// Which way the bytes were going.
        direction: CopyDirection,
        /// Bytes the submission would have moved.
        bytes: usize,
    },

    /// The device met an unrecoverable error earlier and rejects all new work (`gpu::I7`).
    #[error("device is poisoned by an earlier unrecoverable error and rejects new work")]
    Poisoned,

    /// CUDA was asked for, but this binary was built without the `cuda` feature.
    #[error(
        "device.kind = \"cuda\" needs a build with the cuda feature (cargo build --features cuda); \
         set device.kind = \"host\" to keep pages in host memory"
    )]
    CudaNotBuilt,

    /// CUDA was asked for, but the driver library (`libcuda.so`) does not load here.
    #[error(
        "no cuda driver on this machine (libcuda.so does not load); \
         set device.kind = \"host\" to keep pages in host memory"
    )]
    CudaDriverMissing,

    /// The CUDA driver loaded, but `cuInit` or the device count failed.
    #[cfg(feature = "cuda")]
    #[error(
        "cuda driver initialization failed; \
         set device.kind = \"host\" to keep pages in host memory"
    )]
    CudaInit {
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },

    /// The CUDA device asked for does not exist (or the driver sees none).
    #[error(
        "cuda device {ordinal} does not exist (the driver reports {devices} devices); \
         set device.kind = \"host\" to keep pages in host memory"
    )]
    CudaNoDevice {
        /// The device ordinal asked for.
        ordinal: u32,
        /// Devices the driver reports.
        devices: u32,
    },

    /// A CUDA driver call failed (allocation, stream or event management, engine copies).
    #[cfg(feature = "cuda")]
    #[error("cuda driver call {op} failed")]
    Driver {
        /// The driver function, e.g. `"cuMemAlloc"`.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },

    /// A stream was used with a device of another backend; streams come from
    /// `Device::stream`, so this is a bug in the caller.
    #[cfg(feature = "cuda")]
    #[error("stream {stream} belongs to a device of another backend")]
    BackendMismatch {
        /// The stream submitted on.
        stream: StreamId,
    },

    /// An issued copy failed in the CUDA driver; its destination must be treated as not
    /// written, and may be partly written (`gpu::I6`).
    #[cfg(feature = "cuda")]
    #[error("{direction} copy of {bytes} bytes on stream {stream} failed in the cuda driver")]
    CudaCopyFailed {
        /// The stream the copy ran on.
        stream: StreamId,
        /// Which way the bytes were going.
        direction: CopyDirection,
        /// Bytes the submission would have moved.
        bytes: usize,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },

    /// A CUDA page pool whose page size is not a multiple of 8 bytes: the checksum kernel
    /// reads pages in aligned 8-byte words.
    #[error(
        "page size {page_bytes} of group {group} is not a multiple of 8 bytes, which cuda \
         page pools need; use a layout whose page bytes are (every real layout's are), or \
         set device.kind = \"host\""
    )]
    PageBytesUnaligned {
        /// The group.
        group: GroupId,
        /// Its page size.
        page_bytes: usize,
    },

    /// The embedded checksum kernel could not be used (a build defect).
    #[cfg(feature = "cuda")]
    #[error("the page checksum kernel is unusable: {reason}")]
    ChecksumKernelInvalid {
        /// What is wrong.
        reason: &'static str,
    },

    /// A copy names an object that the submission does not hold.
    #[error("copy names object {object}, but the submission holds {objects}")]
    ObjectOutOfRange {
        /// The object index named.
        object: u32,
        /// Objects held.
        objects: usize,
    },

    /// A copy's byte range does not fit in its object.
    #[error("range {offset}+{len} does not fit in object {object} of {object_len} bytes")]
    ObjectRangeOutOfObject {
        /// The object index.
        object: u32,
        /// Start of the range inside the object.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// The object's length.
        object_len: usize,
    },
    /// A borrowed page region is unusable (`Device::borrow_host` / `borrow_cuda`, B1, B3).
    #[error(
        "the borrowed pages of layer group {group} at address {base:#x} are refused: {reason}"
    )]
    BorrowedRegionInvalid {
        /// The group of the region.
        group: GroupId,
        /// The region's base address.
        base: u64,
        /// What is wrong.
        reason: &'static str,
    },

    /// Two borrowed page regions overlap, so a copy into one would write the other (B2).
    #[error(
        "the borrowed pages of layer groups {first} and {second} overlap; give every group \
         its own memory"
    )]
    BorrowedOverlap {
        /// The group of the lower region.
        first: GroupId,
        /// The group of the region that starts inside it.
        second: GroupId,
    },

    /// Borrowed CUDA pages lie in memory of another device than the one named (B3).
    #[error(
        "the borrowed pages of layer group {group} at address {base:#x} are memory of cuda \
         device {actual}, not of device {expected}; put every cache of one rank on one device"
    )]
    BorrowedWrongDevice {
        /// The group of the region.
        group: GroupId,
        /// The region's base address.
        base: u64,
        /// The device the caller named.
        expected: u32,
        /// The device the driver says the memory belongs to.
        actual: i64,
    },
}
