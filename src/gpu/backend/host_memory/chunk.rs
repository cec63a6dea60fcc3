//! The chunks of a [`HostArena`](super::HostArena): one block of zeroed heap memory, or of
//! pinned memory of a CUDA context, carved into slots of one size class (`host_memory::A1`,
//! `host_memory::A4`, `host_memory::A5`).

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;
#[cfg(feature = "cuda")]
use std::sync::Arc;

#[cfg(feature = "cuda")]
use crate::gpu::backend::cuda::PinnedBuffer;
use crate::gpu::vocab::GpuError;

use super::{ChunkSource, SlotPlace, SLOT_ALIGN};

/// One block of host memory, carved into slots of one class.
pub(super) struct Chunk {
    /// The first slot's address: [`SLOT_ALIGN`]-aligned, valid for `bytes` bytes.
    pub(super) base: NonNull<u8>,
    /// Usable bytes from `base`: `slots` slots of `class_bytes`.
    pub(super) bytes: usize,
    /// The size class this chunk is carved into.
    pub(super) class_bytes: usize,
    /// Owns the allocation; frees it on drop.
    memory: ChunkMemory,
}

// SAFETY: a chunk owns its allocation like a `Box<[u8]>`; the raw pointers are addresses
// into it, and heap and pinned memory may be used and freed from any thread.
unsafe impl Send for Chunk {}
// SAFETY: `&Chunk` gives no access to the bytes; slots reach them only under `host_memory::A1`-`host_memory::A3`.
unsafe impl Sync for Chunk {}

/// The allocation behind a chunk.
enum ChunkMemory {
    /// From `alloc_zeroed` with `layout`; freed with `dealloc`.
    Heap { raw: NonNull<u8>, layout: Layout },
    /// A pinned buffer, which frees itself.
    #[cfg(feature = "cuda")]
    Pinned(
        #[expect(
            dead_code,
            reason = "held only for its drop, which frees the pinned memory"
        )]
        PinnedBuffer,
    ),
}

impl Drop for ChunkMemory {
    fn drop(&mut self) {
        match self {
            Self::Heap { raw, layout } => {
                // SAFETY: `raw` came from `alloc_zeroed(layout)` and is freed once, here; no
                // slot uses it, since every slot holds the arena that owns this chunk (`host_memory::A1`).
                unsafe { alloc::dealloc(raw.as_ptr(), *layout) };
            }
            #[cfg(feature = "cuda")]
            Self::Pinned(_) => {}
        }
    }
}

impl Chunk {
    /// Allocates a zeroed chunk of `slots` slots of `class_bytes` from `source`, starting on
    /// a [`SLOT_ALIGN`] boundary (`host_memory::A4`, `host_memory::A5`). `slot_len` only labels the error.
    pub(super) fn allocate(
        source: &ChunkSource,
        slot_len: usize,
        class_bytes: usize,
        slots: usize,
    ) -> Result<Self, GpuError> {
        // `slots * class_bytes <= max(target, class_bytes)`, so this cannot overflow.
        let bytes = slots.saturating_mul(class_bytes);
        let overflow = || GpuError::SizeOverflow {
            what: "arena chunk",
            count: 1,
            unit_bytes: bytes,
        };
        // Over-allocate so an aligned start fits whatever alignment the allocator gives.
        let padded = bytes.checked_add(SLOT_ALIGN - 1).ok_or_else(overflow)?;
        let (raw, memory) = match source {
            ChunkSource::Heap => {
                let layout = Layout::array::<u8>(padded).map_err(|_| overflow())?;
                // SAFETY: `layout` has a non-zero size (`padded >= SLOT_ALIGN`). Alignment 1
                // lets the allocator use `calloc`, whose big blocks are zeroed lazily.
                let raw = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).ok_or(
                    GpuError::ArenaAllocFailed {
                        len: slot_len,
                        chunk_bytes: bytes,
                    },
                )?;
                (raw, ChunkMemory::Heap { raw, layout })
            }
            #[cfg(feature = "cuda")]
            ChunkSource::Pinned(context) => {
                let mut buffer = PinnedBuffer::zeroed(Arc::clone(context), padded)?;
                let raw = NonNull::from(buffer.as_mut_slice()).cast::<u8>();
                (raw, ChunkMemory::Pinned(buffer))
            }
        };
        let offset = raw.as_ptr().addr().wrapping_neg() % SLOT_ALIGN;
        // SAFETY: `offset < SLOT_ALIGN`, so `raw + offset .. raw + offset + bytes` lies in
        // the allocation of `bytes + SLOT_ALIGN - 1` bytes.
        let base = unsafe { raw.add(offset) };
        Ok(Self {
            base,
            bytes,
            class_bytes,
            memory,
        })
    }

    /// Writes a zero into every page of a heap chunk, so that the kernel backs all of it
    /// now: `calloc` maps big blocks lazily, and memory first touched by a save, on a host
    /// that has run out meanwhile, is an OOM kill instead of a refusal at start. Pinned
    /// memory is resident already. Every 4 KiB is written, which reaches every page of any
    /// page size Linux uses.
    pub(super) fn prefault(&self) {
        const PAGE_BYTES: usize = 4096;
        if !matches!(self.memory, ChunkMemory::Heap { .. }) {
            return;
        }
        for offset in (0..self.bytes).step_by(PAGE_BYTES) {
            // SAFETY: `offset < bytes`, so the byte lies inside the chunk's allocation
            // (`host_memory::A1`); the chunk is not in the arena yet, so no slot reads or
            // writes it meanwhile, and it is zero already (`host_memory::A4` holds).
            unsafe { self.base.add(offset).as_ptr().write_volatile(0) };
        }
    }

    /// The address of slot `place.index` of this chunk, for slots of `class_bytes`.
    pub(super) fn slot_ptr(&self, place: SlotPlace, class_bytes: usize) -> NonNull<u8> {
        let offset = place.index * class_bytes;
        debug_assert!(
            offset + class_bytes <= self.bytes,
            "A1: slot past its chunk"
        );
        // SAFETY: `place.index` is below the chunk's slot count (it came from a fresh run or
        // a free list of this class), so `offset + class_bytes <= bytes` (`host_memory::A1`).
        unsafe { self.base.add(offset) }
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pinned = !matches!(self.memory, ChunkMemory::Heap { .. });
        f.debug_struct("Chunk")
            .field("bytes", &self.bytes)
            .field("class_bytes", &self.class_bytes)
            .field("pinned", &pinned)
            .finish_non_exhaustive()
    }
}
