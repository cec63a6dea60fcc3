//! The host-memory part of the device layer: [`HostArena`], a slab allocator of host memory
//! for pool objects that copy streams can DMA straight from and into (zero-copy loads and
//! saves), and its slots [`HostSlot`] (owned, writable) and [`SharedSlot`] (shared,
//! read-only).
//!
//! It lives here, below the pool, because pinning memory and handing its raw pointers to
//! copy streams is device work that needs `unsafe` (kept inside `gpu`); the embedded pool
//! (`pool::memory`) only owns an arena and stores its slots. Nothing in this module knows
//! about pools or keys. It sits on the middle floor of `gpu` (the backends): it speaks the
//! vocabulary (`GpuError`) and takes pinned memory from the CUDA backend, and knows nothing
//! of the front (`Device` makes arenas, but the arena does not know `Device`). Outside
//! `gpu` it is reached as `gpu::host_memory`.
//!
//! The embedded pool keeps every object in a [`HostSlot`] from one arena. On the CUDA
//! backend (`Device::host_arena`) the arena's memory is pinned
//! (`cuMemHostAlloc`, flags 0, cached), so a loader moves a lent object to the device, and a
//! saver moves pages into a fresh object, without a CPU copy through staging, the way
//! Mooncake's transfer engine places bytes in registered memory. On the host backend
//! ([`HostArena::heap`]) the memory is ordinary zeroed heap memory.
//!
//! # Workflow
//!
//! 1. Make one arena per pool (`device.host_arena()` or `HostArena::heap()`) and clone it
//!    where needed; clones share the chunks and the free lists.
//! 2. `arena.alloc(len)` hands out a [`HostSlot`] of exactly `len` bytes. Its size class is
//!    `len` rounded up to [`SLOT_ALIGN`]. A slot comes from the class's free list first
//!    (most recently freed first), then from the class's newest chunk, and only then is a
//!    new chunk carved: `max(ARENA_CHUNK_BYTES, one slot)` bytes rounded down to whole slots,
//!    allocated zeroed and outside the arena's lock.
//! 3. The owner fills the slot (`DerefMut`, or a DMA through [`HostSlot::as_mut_ptr`]), then
//!    may [`share`](HostSlot::share) it as a read-only, cloneable [`SharedSlot`].
//!    A pool that holds its capacity up front instead calls `arena.reserve(len, slots)`
//!    once, after checking `arena.reserve_bytes(len, slots)` against the host's memory:
//!    the chunks are carved then, and heap ones prefaulted (touched page by page), so the
//!    memory is resident before work starts.
//! 4. Dropping the last owner puts the slot back on its class's free list. Chunks are
//!    never returned one by one: they are freed when the arena's last handle and its last
//!    slot are gone (every slot holds the arena's inner state).
//!
//! Memory held is therefore, per size class, the peak number of slots that class ever had
//! live, rounded up to whole chunks. Pool objects come in a few sizes (one per page size plus
//! header), so this stays close to the pool's capacity; a workload of many distinct sizes
//! would hold more.
//!
//! # Invariants
//!
//! - `host_memory::A1`. A slot's byte range `ptr..ptr + class_bytes` lies inside one chunk, and the chunk
//!   stays allocated while the slot lives (the slot holds the arena's inner `Arc`, which
//!   owns every chunk).
//! - `host_memory::A2`. No two live slots overlap: a slot place (chunk, index) is handed out by popping it
//!   off a free list or by advancing a chunk's fresh cursor past it, never both, and is
//!   pushed back only by the drop of the one slot that held it.
//! - `host_memory::A3`. A slot place is on at most one free list, once, and never while a slot owns it.
//! - `host_memory::A4`. Every byte of a slot is initialized: chunks are zeroed when carved, and a reused
//!   slot keeps the bytes its last owner left.
//! - `host_memory::A5`. Every slot starts on a [`SLOT_ALIGN`]-byte boundary.
//! - `host_memory::A6`. `live_slots + free_slots` equals the slots of every chunk carved so far.
//!
//! A copy stream that DMAs from or into a slot must hold the slot (or a [`SharedSlot`]
//! clone) until the copy has completed; that keeps the memory allocated and unreused (`host_memory::A1`,
//! `host_memory::A2`).

use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;

#[cfg(feature = "cuda")]
use crate::gpu::backend::cuda::Context;
use crate::gpu::vocab::GpuError;

mod chunk;
mod meminfo;
mod slot;

use chunk::Chunk;

pub use meminfo::{host_memory, HostMemory};
#[cfg(feature = "internals")]
pub use meminfo::parse_meminfo;
use slot::SlotOwner;
pub use slot::{HostSlot, SharedSlot};

/// Bytes a new chunk aims for; a chunk holds as many whole slots of its class as fit, and at
/// least one.
pub const ARENA_CHUNK_BYTES: usize = 64 << 20;

/// Alignment of every slot start, and the granularity of size classes (`host_memory::A5`).
pub const SLOT_ALIGN: usize = 64;

/// A slab allocator of host memory for pool objects; a cheap `Clone` (an `Arc`) whose clones
/// share chunks and free lists (module docs).
#[derive(Clone)]
pub struct HostArena {
    inner: Arc<ArenaInner>,
}

/// What every arena handle and every slot shares; owns the chunks (`host_memory::A1`).
struct ArenaInner {
    /// Where chunks come from.
    source: ChunkSource,
    /// Bytes a new chunk aims for ([`ARENA_CHUNK_BYTES`] unless a test asks for less).
    target_chunk_bytes: usize,
    /// Chunks, free lists and counts; held only for bookkeeping, never while allocating.
    state: Mutex<ArenaState>,
}

/// Where an arena's chunks come from.
enum ChunkSource {
    /// Zeroed heap memory.
    Heap,
    /// Pinned, cached host memory of one CUDA context, kept alive by this `Arc`.
    #[cfg(feature = "cuda")]
    Pinned(Arc<Context>),
}

/// The arena's bookkeeping.
#[derive(Default)]
struct ArenaState {
    /// Every chunk carved so far, in carving order; a [`SlotPlace`] indexes it.
    chunks: Vec<Chunk>,
    /// Free lists and fresh cursors per size class (slot bytes).
    classes: HashMap<usize, SizeClass>,
    /// Sum of chunk sizes.
    chunk_bytes: usize,
    /// Slots owned by a [`HostSlot`] now.
    live_slots: usize,
    /// Slots that can be handed out without carving (`host_memory::A6`).
    free_slots: usize,
}

/// One size class: its freed slots and the chunks not fully handed out yet.
#[derive(Default)]
struct SizeClass {
    /// Freed slot places, most recently freed last (`host_memory::A3`).
    free: Vec<SlotPlace>,
    /// Chunks of this class with slots never handed out, newest last.
    fresh: Vec<FreshRun>,
}

/// The never-handed-out tail of one chunk: slots `next..slots`.
struct FreshRun {
    chunk: usize,
    next: usize,
    slots: usize,
}

/// Where a slot lives: slot `index` of chunk `chunk` (its class gives the stride).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SlotPlace {
    chunk: usize,
    index: usize,
}

/// Counts of one arena, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Chunks carved so far.
    pub chunks: usize,
    /// Bytes of every chunk carved so far.
    pub chunk_bytes: usize,
    /// Slots owned by a [`HostSlot`] now.
    pub live_slots: usize,
    /// Slots ready to hand out without carving: freed ones and never-used ones (`host_memory::A6`).
    pub free_slots: usize,
}

impl HostArena {
    /// An arena of ordinary zeroed heap memory, in chunks of [`ARENA_CHUNK_BYTES`].
    pub fn heap() -> Self {
        Self::heap_with_chunk_bytes(ARENA_CHUNK_BYTES)
    }

    /// A heap arena whose chunks aim for `chunk_bytes` (at least one slot each): for tests
    /// and small pools.
    pub fn heap_with_chunk_bytes(chunk_bytes: usize) -> Self {
        Self::with_source(ChunkSource::Heap, chunk_bytes)
    }

    /// An arena of pinned, cached host memory of `context`, which it keeps alive.
    #[cfg(feature = "cuda")]
    pub(crate) fn pinned(context: Arc<Context>) -> Self {
        Self::with_source(ChunkSource::Pinned(context), ARENA_CHUNK_BYTES)
    }

    fn with_source(source: ChunkSource, target_chunk_bytes: usize) -> Self {
        Self {
            inner: Arc::new(ArenaInner {
                source,
                target_chunk_bytes,
                state: Mutex::new(ArenaState::default()),
            }),
        }
    }

    /// Whether slots are pinned memory that a CUDA copy can DMA from and into.
    pub fn is_pinned(&self) -> bool {
        self.inner.is_pinned()
    }

    /// A slot of exactly `len` bytes, from the free list of its size class, the class's
    /// newest chunk, or a new chunk (module workflow, step 2). Its bytes are initialized:
    /// zero in a new chunk, whatever the last owner left in a reused slot (`host_memory::A4`).
    ///
    /// # Errors
    /// [`GpuError::EmptyArenaSlot`] for `len == 0`; [`GpuError::SizeOverflow`] when `len`
    /// rounded to a size class does not fit the address space; a new chunk that cannot be
    /// allocated is [`GpuError::ArenaAllocFailed`] (heap) or `GpuError::Driver` from
    /// `cuMemHostAlloc` (pinned).
    pub fn alloc(&self, len: usize) -> Result<HostSlot, GpuError> {
        let class_bytes = class_bytes(len)?;
        loop {
            if let Some((place, ptr)) = self.inner.state.lock().take_slot(class_bytes) {
                return Ok(HostSlot {
                    ptr,
                    len,
                    owner: Some(SlotOwner {
                        arena: Arc::clone(&self.inner),
                        class_bytes,
                        place,
                    }),
                });
            }
            // Carve without the lock (a pinned allocation takes milliseconds); two threads
            // may both carve for one class, which only adds a chunk.
            let slots = (self.inner.target_chunk_bytes / class_bytes).max(1);
            let chunk = Chunk::allocate(&self.inner.source, len, class_bytes, slots)?;
            self.inner.state.lock().add_chunk(slots, chunk);
        }
    }

    /// Carves chunks until the size class of `len`-byte slots has at least `slots` slots to
    /// hand out without carving (free or never used), so that the next `slots` allocations
    /// of that size touch no allocator: a pool calls it once, before work starts, to hold
    /// its capacity up front (pinning memory takes milliseconds per chunk, and a copy stream
    /// waiting on it stalls). Heap chunks carved here are prefaulted (one write per page),
    /// so the memory is the process's when this returns, not when a save first writes it;
    /// pinned memory is resident once allocated. Nothing here checks the host has the
    /// memory: a caller asks [`reserve_bytes`](Self::reserve_bytes) first and checks that
    /// against the host's memory ([`host_memory`]), since touching more than the host has
    /// ends the process. Returns the chunks carved.
    ///
    /// # Errors
    /// As [`alloc`](Self::alloc); chunks carved before a failure stay in the arena.
    pub fn reserve(&self, len: usize, slots: usize) -> Result<usize, GpuError> {
        let class_bytes = class_bytes(len)?;
        let per_chunk = (self.inner.target_chunk_bytes / class_bytes).max(1);
        let mut carved = 0;
        while self.inner.state.lock().available(class_bytes) < slots {
            let chunk = Chunk::allocate(&self.inner.source, len, class_bytes, per_chunk)?;
            chunk.prefault();
            self.inner.state.lock().add_chunk(per_chunk, chunk);
            carved += 1;
        }
        Ok(carved)
    }

    /// The bytes [`reserve`](Self::reserve)`(len, slots)` would carve now: whole chunks for
    /// the slots the class cannot hand out yet (0 when it can).
    ///
    /// # Errors
    /// As [`alloc`](Self::alloc) for `len`.
    pub fn reserve_bytes(&self, len: usize, slots: usize) -> Result<u64, GpuError> {
        let class_bytes = class_bytes(len)?;
        let missing = slots.saturating_sub(self.inner.state.lock().available(class_bytes));
        let chunk_bytes = self.chunk_bytes(len)?;
        let per_chunk = chunk_bytes / class_bytes;
        Ok((missing.div_ceil(per_chunk) as u64).saturating_mul(chunk_bytes as u64))
    }

    /// The bytes of one chunk carved for slots of `len` bytes: as many whole slots as fit
    /// the arena's chunk size, and at least one.
    ///
    /// # Errors
    /// As [`alloc`](Self::alloc) for `len`.
    pub fn chunk_bytes(&self, len: usize) -> Result<usize, GpuError> {
        let class_bytes = class_bytes(len)?;
        Ok((self.inner.target_chunk_bytes / class_bytes).max(1) * class_bytes)
    }

    /// Counts of chunks and slots now.
    pub fn stats(&self) -> ArenaStats {
        let state = self.inner.state.lock();
        ArenaStats {
            chunks: state.chunks.len(),
            chunk_bytes: state.chunk_bytes,
            live_slots: state.live_slots,
            free_slots: state.free_slots,
        }
    }
}

impl fmt::Debug for HostArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostArena")
            .field("pinned", &self.is_pinned())
            .field("stats", &self.stats())
            .finish()
    }
}

impl ArenaInner {
    fn is_pinned(&self) -> bool {
        match self.source {
            ChunkSource::Heap => false,
            #[cfg(feature = "cuda")]
            ChunkSource::Pinned(_) => true,
        }
    }
}

/// The size class of a slot of `len` bytes: `len` rounded up to [`SLOT_ALIGN`].
fn class_bytes(len: usize) -> Result<usize, GpuError> {
    if len == 0 {
        return Err(GpuError::EmptyArenaSlot);
    }
    len.checked_next_multiple_of(SLOT_ALIGN)
        .ok_or(GpuError::SizeOverflow {
            what: "arena slot",
            count: 1,
            unit_bytes: len,
        })
}

impl ArenaState {
    /// Hands out a slot of `class_bytes`: the most recently freed one, else the next fresh
    /// one of the class's newest chunk; `None` when the class needs a new chunk (`host_memory::A2`, `host_memory::A3`).
    fn take_slot(&mut self, class_bytes: usize) -> Option<(SlotPlace, NonNull<u8>)> {
        let class = self.classes.get_mut(&class_bytes)?;
        let place = if let Some(place) = class.free.pop() {
            place
        } else {
            let run = class.fresh.last_mut()?;
            let place = SlotPlace {
                chunk: run.chunk,
                index: run.next,
            };
            run.next += 1;
            if run.next == run.slots {
                class.fresh.pop();
            }
            place
        };
        self.free_slots -= 1;
        self.live_slots += 1;
        Some((place, self.chunks[place.chunk].slot_ptr(place, class_bytes)))
    }

    /// Slots of `class_bytes` that can be handed out without carving: freed ones and the
    /// never-used tails of the class's chunks.
    fn available(&self, class_bytes: usize) -> usize {
        self.classes.get(&class_bytes).map_or(0, |class| {
            class.free.len()
                + class
                    .fresh
                    .iter()
                    .map(|run| run.slots - run.next)
                    .sum::<usize>()
        })
    }

    /// Adds a freshly carved chunk of `slots` slots to its class.
    fn add_chunk(&mut self, slots: usize, chunk: Chunk) {
        let class_bytes = chunk.class_bytes;
        debug_assert_eq!(chunk.bytes, slots * class_bytes, "A1: whole slots only");
        self.chunk_bytes += chunk.bytes;
        self.free_slots += slots;
        self.chunks.push(chunk);
        let run = FreshRun {
            chunk: self.chunks.len() - 1,
            next: 0,
            slots,
        };
        self.classes.entry(class_bytes).or_default().fresh.push(run);
    }

    /// Puts a dropped slot's place back on its class's free list (`host_memory::A3`).
    fn release(&mut self, class_bytes: usize, place: SlotPlace) {
        let class = self.classes.entry(class_bytes).or_default();
        class.free.push(place);
        self.live_slots -= 1;
        self.free_slots += 1;
    }
}

#[cfg(test)]
mod tests;
