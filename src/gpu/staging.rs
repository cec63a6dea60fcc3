//! Staging pools: CPU-accessible buffers of fixed-size slots between the pool transport and
//! device pages (R23, R24). Each staging pool has one owner: a loader or the saver.
//!
//! Workflow (a load):
//! 1. A loader gets one pool from `Device::staging_pool` at start and owns it by value.
//! 2. The pool transport fills slots (a batch get into registered memory: the transport
//!    registers [`StagingPool::as_mut_ptr`] / [`StagingPool::len`] once).
//! 3. The loader verifies each object header in [`StagingPool::slot`] (R5), then moves the
//!    pool into `CopyStream::scatter`; `InFlight::wait` hands it back (`gpu::I3`).
//!
//! A save runs the other way with the saver's own pool: `gather`, wait, then put slots.
//!
//! On the host backend the memory is an ordinary zeroed heap buffer; on CUDA it is zeroed
//! pinned (page-locked) host memory, cached and never write-combined, so DMA can read and
//! write it and the CPU reads it at full speed. The pool's shape is the vocabulary's
//! [`StagingGeometry`] (`staging::S1`); this front type owns the memory behind it, and a
//! backend sees only the bytes (`&mut [u8]`) of one submission.
//!
//! Invariants:
//! - `staging::S2`. Only the owner can touch the bytes: the pool is not `Clone`, and shared access
//!   goes through `&self` / `&mut self` like any owned buffer.

use std::fmt;
use std::slice::ChunksExactMut;

#[cfg(feature = "cuda")]
use super::backend::cuda::PinnedBuffer;
use super::backend::host::try_zeroed;
use super::lent::{LentBuffer, LentHostMemory};
use super::vocab::{GpuError, StagingGeometry};

/// Where the bytes live. A closed enum over backends, not a trait object.
enum StagingMemory {
    /// An ordinary heap buffer (host backend).
    Host(Box<[u8]>),
    /// Pinned host memory of a CUDA context; frees itself with the driver on drop.
    #[cfg(feature = "cuda")]
    Pinned(PinnedBuffer),
    /// Memory a pool's client lends (`gpu::lent`), page-locked on CUDA.
    Lent(LentBuffer),
}

/// A CPU-accessible buffer of fixed-size slots, owned by value by one loader or the saver.
///
/// Made only by `Device::staging_pool`, so on CUDA every pool is pinned memory of the right
/// context. Not `Clone` (`staging::S2`); `Debug` prints the shape, not the bytes.
pub struct StagingPool {
    geometry: StagingGeometry,
    memory: StagingMemory,
}

impl StagingPool {
    /// A zeroed host-memory pool of the given shape.
    ///
    /// # Errors
    /// [`GpuError::HostAllocFailed`] when the heap refuses the memory (never an abort).
    pub(crate) fn new_host(geometry: StagingGeometry) -> Result<Self, GpuError> {
        let bytes = geometry.total_bytes();
        let memory = try_zeroed(bytes).ok_or(GpuError::HostAllocFailed {
            what: "staging pool",
            bytes,
        })?;
        Ok(Self {
            geometry,
            memory: StagingMemory::Host(memory),
        })
    }

    /// A pool over pinned memory of `geometry.total_bytes()` bytes (CUDA backend).
    #[cfg(feature = "cuda")]
    pub(crate) fn new_pinned(geometry: StagingGeometry, memory: PinnedBuffer) -> Self {
        Self {
            geometry,
            memory: StagingMemory::Pinned(memory),
        }
    }

    /// A pool over lent memory of at least `geometry.total_bytes()` bytes; the slots use the
    /// first bytes of it.
    pub(crate) fn new_lent(geometry: StagingGeometry, memory: LentBuffer) -> Self {
        Self {
            geometry,
            memory: StagingMemory::Lent(memory),
        }
    }

    /// A pool of one slot of `bytes` in lent memory, for a pool transport's own use with
    /// the CPU (never page-locked for a device).
    ///
    /// # Errors
    /// [`GpuError::HostAllocFailed`] when the lease is smaller or has no address;
    /// [`GpuError::EmptyStagingPool`] for 0 bytes.
    pub fn lent_host(bytes: usize, lease: Box<dyn LentHostMemory>) -> Result<Self, GpuError> {
        let geometry = StagingGeometry::new(bytes, 1)?;
        let memory = LentBuffer::take(lease, bytes, "buffer in lent memory")?;
        Ok(Self::new_lent(geometry, memory))
    }

    /// The pool's shape.
    pub fn geometry(&self) -> StagingGeometry {
        self.geometry
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.geometry.slot_bytes()
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.geometry.slots()
    }

    /// Bytes of the whole buffer, for registering it with a pool transport.
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// Always `false`: a pool has at least one slot of at least one byte (`staging::S1`).
    pub fn is_empty(&self) -> bool {
        self.bytes().is_empty()
    }

    /// Start of the buffer, for registering it with a pool transport.
    pub fn as_ptr(&self) -> *const u8 {
        self.bytes().as_ptr()
    }

    /// Start of the buffer for a transport that writes into it (a batch get into registered
    /// memory). The pointer is valid for [`len`](Self::len) bytes while the pool lives and is
    /// not moved into a copy.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.bytes_mut().as_mut_ptr()
    }

    /// The bytes of `slot`.
    ///
    /// # Errors
    /// [`GpuError::StagingSlotOutOfRange`] if `slot >= slots`.
    pub fn slot(&self, slot: u32) -> Result<&[u8], GpuError> {
        let range = self.geometry.slot_range(slot)?;
        Ok(&self.bytes()[range])
    }

    /// The bytes of `slot`, writable.
    ///
    /// # Errors
    /// [`GpuError::StagingSlotOutOfRange`] if `slot >= slots`.
    pub fn slot_mut(&mut self, slot: u32) -> Result<&mut [u8], GpuError> {
        let range = self.geometry.slot_range(slot)?;
        Ok(&mut self.bytes_mut()[range])
    }

    /// Every slot, writable at once (for a batch get that fills many slots in one call).
    pub fn slots_mut(&mut self) -> ChunksExactMut<'_, u8> {
        let slot_bytes = self.geometry.slot_bytes();
        self.bytes_mut().chunks_exact_mut(slot_bytes)
    }

    /// The whole buffer.
    pub(crate) fn bytes(&self) -> &[u8] {
        match &self.memory {
            StagingMemory::Host(bytes) => bytes,
            #[cfg(feature = "cuda")]
            StagingMemory::Pinned(pinned) => pinned.as_slice(),
            StagingMemory::Lent(lent) => &lent.as_slice()[..self.geometry.total_bytes()],
        }
    }

    /// The whole buffer, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.memory {
            StagingMemory::Host(bytes) => bytes,
            #[cfg(feature = "cuda")]
            StagingMemory::Pinned(pinned) => pinned.as_mut_slice(),
            StagingMemory::Lent(lent) => &mut lent.as_mut_slice()[..self.geometry.total_bytes()],
        }
    }

    /// Whether the memory is pinned (page-locked) host memory of a CUDA context.
    pub fn is_pinned(&self) -> bool {
        match &self.memory {
            StagingMemory::Host(_) => false,
            #[cfg(feature = "cuda")]
            StagingMemory::Pinned(_) => true,
            StagingMemory::Lent(lent) => lent.is_registered(),
        }
    }

    /// Whether the memory is lent by a pool's client (`gpu::lent`): a new pool cannot be
    /// made of the heap in its place.
    pub fn is_lent(&self) -> bool {
        matches!(self.memory, StagingMemory::Lent(_))
    }
}

impl fmt::Debug for StagingPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let memory = match (self.is_lent(), self.is_pinned()) {
            (true, _) => "lent",
            (false, true) => "pinned",
            (false, false) => "host",
        };
        f.debug_struct("StagingPool")
            .field("slot_bytes", &self.geometry.slot_bytes())
            .field("slots", &self.geometry.slots())
            .field("memory", &memory)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A staging pool larger than the heap gives is an error naming it, never an abort.
    #[test]
    fn a_staging_pool_the_heap_refuses_is_an_error() -> Result<(), GpuError> {
        let geometry = StagingGeometry::new(1 << 46, 2)?;
        // `black_box`: an allocation nothing reads could be optimized away.
        let refused = std::hint::black_box(StagingPool::new_host(geometry)).map(|pool| pool.len());
        assert!(
            matches!(
                refused,
                Err(GpuError::HostAllocFailed {
                    what: "staging pool",
                    bytes
                }) if bytes == 1 << 47
            ),
            "{refused:?}"
        );
        Ok(())
    }

    #[test]
    fn slots_are_disjoint_consecutive_ranges() -> Result<(), GpuError> {
        let mut pool = StagingPool::new_host(StagingGeometry::new(4, 3)?)?;
        assert_eq!(pool.len(), 12);
        assert!(!pool.is_empty());
        pool.slot_mut(1)?.copy_from_slice(&[1, 2, 3, 4]);
        for (index, slot) in pool.slots_mut().enumerate() {
            if index == 2 {
                slot.fill(9);
            }
        }
        assert_eq!(pool.slot(0)?, &[0, 0, 0, 0]);
        assert_eq!(pool.slot(1)?, &[1, 2, 3, 4]);
        assert_eq!(pool.bytes(), &[0, 0, 0, 0, 1, 2, 3, 4, 9, 9, 9, 9]);
        Ok(())
    }

    #[test]
    fn slot_out_of_range_is_an_error() -> Result<(), GpuError> {
        let mut pool = StagingPool::new_host(StagingGeometry::new(4, 3)?)?;
        assert!(matches!(
            pool.slot(3),
            Err(GpuError::StagingSlotOutOfRange { slot: 3, slots: 3 })
        ));
        assert!(pool.slot_mut(u32::MAX).is_err());
        Ok(())
    }

    #[test]
    fn debug_prints_the_shape_not_the_bytes() -> Result<(), GpuError> {
        let pool = StagingPool::new_host(StagingGeometry::new(2, 5)?)?;
        let text = format!("{pool:?}");
        assert_eq!(
            text,
            r#"StagingPool { slot_bytes: 2, slots: 5, memory: "host" }"#
        );
        Ok(())
    }
}
