//! The one-node layout: this process as a dummy client of the node's `mooncake_client`
//! (the "real client", which holds the segment), over shared memory.
//!
//! A dummy client maps `mooncake.shared_memory_bytes` of shared memory with the real client
//! at `setup_dummy`, and Mooncake moves data only between that memory and the segment: a
//! put or get of any other buffer is refused. So the loaders' and the saver's staging pools
//! and the fallback buffer are taken from it (`alloc_from_mem_pool`, a bump allocator that
//! never frees) and registered as usual; each piece is a [`SharedLease`], which the staging
//! pool holds for its whole life.
//!
//! # Invariants
//!
//! - `mooncake::shared::S1`. A lease keeps the Python store object alive, and the client is not
//!   closed while a lease lives ([`SharedMemory::leased`]): closing it would unmap the memory.
//!   A close then only forgets the store; the last lease to go drops it.
//! - `mooncake::shared::S2`. Leases never overlap: each is a fresh `alloc_from_mem_pool`.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::MooncakeError;
use crate::config::MOONCAKE_SHARED_MEMORY_SPARE_BYTES;
use crate::gpu::LentHostMemory;

/// The dummy client's shared memory: its size, what was taken, and the live leases.
#[derive(Debug)]
pub(crate) struct SharedMemory {
    /// `mooncake.shared_memory_bytes`.
    total: u64,
    /// Bytes handed out so far (never given back: Mooncake's pool does not free).
    used: Mutex<u64>,
    /// One clone per live lease (`mooncake::shared::S1`).
    alive: Arc<()>,
}

impl SharedMemory {
    /// The memory of a dummy client set up with `total` bytes.
    pub(crate) fn new(total: u64) -> Self {
        Self {
            total,
            used: Mutex::new(0),
            alive: Arc::new(()),
        }
    }

    /// Whether a lease still lives (`mooncake::shared::S1`).
    pub(crate) fn leased(&self) -> bool {
        Arc::strong_count(&self.alive) > 1
    }

    /// Takes `len` bytes with `alloc`, which asks Mooncake's pool for them and answers
    /// their address with a reference to the store object, or `None` when the pool has
    /// none left; the lease keeps that store alive.
    pub(crate) fn lease(
        &self,
        len: usize,
        alloc: impl FnOnce(usize) -> Result<Option<(usize, Py<PyAny>)>, MooncakeError>,
    ) -> Result<SharedLease, MooncakeError> {
        let asked = u64::try_from(len).unwrap_or(u64::MAX);
        let mut used = self.used.lock();
        let spent = || MooncakeError::SharedMemorySpent {
            asked,
            used: *used,
            total: self.total,
            suggested: used
                .saturating_add(asked)
                .saturating_add(MOONCAKE_SHARED_MEMORY_SPARE_BYTES),
        };
        if len == 0 || used.saturating_add(asked) > self.total {
            return Err(spent());
        }
        let Some((addr, store)) = alloc(len)? else {
            return Err(spent());
        };
        *used = used.saturating_add(asked);
        Ok(SharedLease {
            addr,
            len,
            store,
            _alive: Arc::clone(&self.alive),
        })
    }
}

/// Bytes of a dummy client's shared memory, mapped while this value lives.
pub(crate) struct SharedLease {
    addr: usize,
    len: usize,
    /// Keeps the store object, and so its mapping, alive (`mooncake::shared::S1`).
    store: Py<PyAny>,
    /// Counts this lease in [`SharedMemory::leased`].
    _alive: Arc<()>,
}

impl Drop for SharedLease {
    /// Lets go of the store object with the GIL held, so that a last reference destroys the
    /// client here and now (while its real client still runs) instead of at whichever
    /// later moment some thread takes the GIL.
    fn drop(&mut self) {
        Python::attach(|py| {
            let store = std::mem::replace(&mut self.store, py.None());
            drop(store);
        });
    }
}

#[expect(
    unsafe_code,
    reason = "the lender's promise behind a staging pool in Mooncake's shared memory; the bytes are dereferenced only in `gpu::lent`"
)]
// SAFETY: `addr..addr + len` is a block of the dummy client's shared memory that
// `alloc_from_mem_pool` gave this lease alone (`mooncake::shared::S2`); the store object maps
// it until it is destroyed or closed, and the lease holds the object while the client is
// never closed under a live lease (`mooncake::shared::S1`). `len` is at least 1 (`lease`), and
// Mooncake touches the bytes only in the transfers the holder asks for.
unsafe impl LentHostMemory for SharedLease {
    fn addr(&self) -> usize {
        self.addr
    }

    fn len(&self) -> usize {
        self.len
    }
}
