//! The slots of a [`HostArena`](super::HostArena): [`HostSlot`] owns `len` bytes of arena
//! memory (`host_memory::A2`) and gives them back on drop; [`SharedSlot`] is its read-only, cloneable
//! form, as a pool lends stored objects.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use super::{ArenaInner, SlotPlace};

/// The arena side of a non-empty slot: returned to its free list on drop.
pub(super) struct SlotOwner {
    pub(super) arena: Arc<ArenaInner>,
    pub(super) class_bytes: usize,
    pub(super) place: SlotPlace,
}

/// The unique owner of `len` bytes of arena memory, like a `Box<[u8]>` (`host_memory::A2`). Dropping it
/// puts the slot back on its class's free list.
pub struct HostSlot {
    /// The first byte; dangling (never read) for an empty slot.
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    /// `None` only for [`HostSlot::empty`], which owns no memory.
    pub(super) owner: Option<SlotOwner>,
}

// SAFETY: a slot owns its bytes exclusively (`host_memory::A2`) inside a chunk that may be used from any
// thread; its drop only takes the arena's lock.
unsafe impl Send for HostSlot {}
// SAFETY: `&HostSlot` gives only `&[u8]` and the read-only address.
unsafe impl Sync for HostSlot {}

impl HostSlot {
    /// A slot of zero bytes that owns no arena memory: how the embedded pool stores an
    /// empty object (the arena itself refuses zero-length slots).
    pub(crate) fn empty() -> Self {
        Self {
            ptr: NonNull::dangling(),
            len: 0,
            owner: None,
        }
    }

    /// Bytes of the slot (exactly what `alloc` was asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slot has no bytes (only an empty pool object).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the slot is pinned memory a CUDA copy can DMA from and into.
    pub fn is_pinned(&self) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|owner| owner.arena.is_pinned())
    }

    /// The first byte's address, for a copy that reads the slot; valid while the slot lives.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The first byte's address, for a copy that writes the slot (a DMA from the device);
    /// valid while the slot lives, and the only writer while `&mut self` is held or the copy
    /// holds the slot.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Turns the slot into a read-only, cloneable handle.
    pub fn share(self) -> SharedSlot {
        SharedSlot {
            slot: Arc::new(self),
        }
    }
}

impl Deref for HostSlot {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` lies in a live chunk (`host_memory::A1`; dangling with `len == 0` for an
        // empty slot), is initialized (`host_memory::A4`) and owned by this slot alone (`host_memory::A2`); `&self`
        // excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HostSlot {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostSlot {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            owner
                .arena
                .state
                .lock()
                .release(owner.class_bytes, owner.place);
        }
    }
}

impl fmt::Debug for HostSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSlot")
            .field("len", &self.len)
            .field("pinned", &self.is_pinned())
            .finish_non_exhaustive()
    }
}

/// A read-only, cloneable handle to a filled [`HostSlot`]; the slot goes back to the arena
/// when the last clone drops. A pool lends stored objects as these.
#[derive(Clone)]
pub struct SharedSlot {
    slot: Arc<HostSlot>,
}

impl SharedSlot {
    /// Bytes of the slot.
    pub fn len(&self) -> usize {
        self.slot.len()
    }

    /// Whether the slot has no bytes (only an empty pool object).
    pub fn is_empty(&self) -> bool {
        self.slot.is_empty()
    }

    /// Whether the slot is pinned memory a CUDA copy can DMA from.
    pub fn is_pinned(&self) -> bool {
        self.slot.is_pinned()
    }

    /// The first byte's address, for a copy that reads the slot; valid while this handle
    /// (or a clone) lives.
    pub fn as_ptr(&self) -> *const u8 {
        self.slot.as_ptr()
    }
}

impl Deref for SharedSlot {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.slot
    }
}

impl fmt::Debug for SharedSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSlot")
            .field("len", &self.len())
            .field("pinned", &self.is_pinned())
            .field("holders", &Arc::strong_count(&self.slot))
            .finish()
    }
}
