//! The save queue: which planned save goes next, and what is shed when the queue is full
//! (R19, R21, R22).
//!
//! # Workflow
//!
//! 1. The saver actor's `EnqueueSave` handler calls [`SaveQueue::push`] for each planned save
//!    with its [`SavePriority`] and returns at once: a push never blocks and never fails (R22).
//! 2. When the queue is full, the push sheds a whole request, the oldest (the one whose
//!    oldest queued entry was pushed first), which makes room: every queued entry of a shed
//!    request leaves at once, window pages, full-attention blocks and re-saves alike (a
//!    window is of no use without the chain below it), and is handed back in
//!    [`PushOutcome`]. The caller counts each drop for its request and settles it, so
//!    once none of a request's saves is left the engine gets its pages back (R22).
//! 3. A shed request stays shed: its later pushes are dropped and handed back too, until
//!    the engine ends it ([`SaveQueue::request_ended`]), which frees its id for reuse.
//! 4. The saver's I/O loop calls [`SaveQueue::pop`] for the next save, in the order of
//!    [`SaveKey`]'s `Ord`: window pages first (R21), then full-attention blocks, then re-saves
//!    (R20), first in first out within a class.
//! 5. A request that is aborted has its queued saves removed with
//!    [`SaveQueue::drain_request`] (or [`SaveQueue::remove_where`]).
//!
//! Two cases follow from shedding oldest first. When the incoming item's own request is the
//! oldest queued, it is the one shed: its queued entries and the incoming item leave
//! together, and its later pushes are dropped, so no part of it stays queued (requests
//! newer than it stay). A request that alone fills the queue is therefore shed whole, at
//! the first push that finds the queue full once no older request is left queued. The
//! saver pushes a whole step's batch before it saves any of it, so a request with more
//! pages in one step than the capacity is never saved from that step on: the capacity
//! should hold at least one step's pages of a request.
//!
//! The queue decides order and shedding only. What to save is the planner's decision
//! (R16-R20); blocks already present in the pool are skipped by the saver when it pops them
//! (R19), so the queue does not deduplicate. Items name pages ([`SaveItem`]: request, group,
//! block, page, hash), never pinned buffers, so a queued save holds no staging memory.
//!
//! `window_first` (R21, `TRTLLM_MOONCAKE_STORE_WINDOW_FIRST`) is a constructor argument: off,
//! window pages join the full-attention class and the two are saved first in first out.
//! Shedding is the same either way.
//!
//! # Invariants
//!
//! - `save_order::I1`. `len() <= capacity()` after every call.
//! - `save_order::I2`. [`SaveQueue::pop`] returns the queued entry with the smallest
//!   [`SaveKey`].
//! - `save_order::I3`. `seq` grows by one with every push, so keys are unique and a class is
//!   first in first out.
//! - `save_order::I4`. Accounting, per priority: `pushed == popped + dropped + removed +
//!   queued`; every pushed item leaves exactly once, and every dropped or removed item is handed
//!   back.
//! - `save_order::I5`. A push sheds only when the queue is full, and then exactly one
//!   request, the oldest, whole: every queued entry of it leaves, of every priority; when that
//!   is the incoming item's own request, the incoming item is dropped with it.
//! - `save_order::I6`. With `window_first` off, window and full-attention saves share one class;
//!   the counters still use each item's own priority.
//! - `save_order::I7`. A request shed since it last ended ([`SaveQueue::request_ended`]) has
//!   no entry queued: each later push of it is dropped. So no window page is ever queued
//!   without the blocks of its chain that were shed.
//! - `save_order::I8`. The index by request holds exactly the queued entries' keys, so
//!   finding the oldest request and shedding it cost O(log n) per entry.

use std::collections::{BTreeMap, HashSet};
use std::num::NonZeroUsize;

use crate::core::ids::RequestId;

mod counters;
mod index;
mod item;
mod priority;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

#[cfg(feature = "internals")]
pub use counters::PerPriority;
pub use counters::SaveQueueCounters;
pub use item::{OfRequest, Prioritized, PushOutcome, SaveItem};
pub use priority::{SaveKey, SavePriority};

use index::RequestIndex;

/// A bounded priority queue of planned saves; see the module doc for the order, the
/// shedding rule and the invariants `save_order::I1`-I8.
#[derive(Debug)]
pub struct SaveQueue<T = SaveItem> {
    capacity: NonZeroUsize,
    /// R21: whether window pages get a class ahead of full-attention blocks.
    window_first: bool,
    /// The next push's sequence number; a plain field, the queue has one owner.
    next_seq: u64,
    entries: BTreeMap<SaveKey, Prioritized<T>>,
    /// The entries' keys by request, and the oldest request (`save_order::I8`).
    requests: RequestIndex,
    /// Requests shed and not ended since (`save_order::I7`): their pushes are dropped. An
    /// id leaves when the engine ends the request, so the set holds live requests only.
    shed: HashSet<RequestId>,
    counters: SaveQueueCounters,
}

impl<T: OfRequest> SaveQueue<T> {
    /// An empty queue holding at most `capacity` items. With `window_first` (R21, on by
    /// default in the configuration) window pages form their own class ahead of
    /// full-attention blocks; off, the two share one class (`save_order::I6`).
    pub fn new(capacity: NonZeroUsize, window_first: bool) -> Self {
        Self {
            capacity,
            window_first,
            next_seq: 0,
            entries: BTreeMap::new(),
            requests: RequestIndex::default(),
            shed: HashSet::new(),
            counters: SaveQueueCounters::default(),
        }
    }

    /// The class an item of `priority` is filed under: itself, except window pages with
    /// `window_first` off, which join the full-attention class (`save_order::I6`).
    pub fn class_of(&self, priority: SavePriority) -> SavePriority {
        match priority {
            SavePriority::Window if !self.window_first => SavePriority::Full,
            other => other,
        }
    }

    /// Queues `item`. Never blocks (R22). A full queue sheds its oldest request whole, which
    /// makes room, and hands every dropped entry back (`save_order::I5`); if that is the
    /// item's own request, or the request was shed before and has not ended, the item is
    /// dropped too (`save_order::I7`).
    pub fn push(&mut self, item: T, priority: SavePriority) -> PushOutcome<T> {
        let key = SaveKey::new(self.class_of(priority), self.next_seq);
        self.next_seq += 1;
        self.counters.pushed.add_one(priority);
        let request = item.request();
        let mut dropped = Vec::new();
        // Every queued request has an entry, so shedding the oldest one makes room.
        if self.entries.len() >= self.capacity.get() && !self.shed.contains(&request) {
            if let Some(oldest) = self.requests.oldest() {
                self.shed_into(oldest, &mut dropped);
            }
        }
        let incoming = Prioritized { item, priority };
        if self.shed.contains(&request) {
            self.counters.dropped.add_one(priority);
            dropped.push(incoming);
            return PushOutcome {
                queued: false,
                dropped,
            };
        }
        self.requests.insert(request, key);
        self.entries.insert(key, incoming);
        debug_assert!(self.entries.len() <= self.capacity.get(), "save_order::I1");
        PushOutcome {
            queued: true,
            dropped,
        }
    }

    /// Sheds `request` now, as a full queue would (R22): its queued entries are dropped and
    /// handed back in push order, and its later pushes are dropped until it ends
    /// (`save_order::I7`).
    pub fn shed(&mut self, request: RequestId) -> Vec<Prioritized<T>> {
        let mut dropped = Vec::new();
        self.shed_into(request, &mut dropped);
        dropped
    }

    /// The engine ended `request` (it sends no more saves for it): the queue forgets that it
    /// shed it, so the id may be used again (`save_order::I7`).
    pub fn request_ended(&mut self, request: RequestId) {
        self.shed.remove(&request);
    }

    /// Takes the next save: the entry with the smallest [`SaveKey`] (`save_order::I2`).
    pub fn pop(&mut self) -> Option<T> {
        let (key, next) = self.entries.pop_first()?;
        self.requests.remove(next.item.request(), key);
        self.counters.popped.add_one(next.priority);
        Some(next.item)
    }

    /// Removes every queued item for which `matches` is true and hands them back in save
    /// order. Removed items are counted apart from drops.
    #[cfg(feature = "internals")]
    pub fn remove_where(&mut self, mut matches: impl FnMut(&T) -> bool) -> Vec<Prioritized<T>> {
        let keys: Vec<SaveKey> = self
            .entries
            .iter()
            .filter(|(_, queued)| matches(&queued.item))
            .map(|(key, _)| *key)
            .collect();
        let mut removed = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(entry) = self.entries.remove(&key) {
                self.requests.remove(entry.item.request(), key);
                self.counters.removed.add_one(entry.priority);
                removed.push(entry);
            }
        }
        removed
    }

    /// Removes every queued save of `request` (it was aborted) and hands them back in push
    /// order, so the caller can release the pages. The request is not shed: a later push of
    /// it is queued as usual.
    #[cfg(feature = "internals")]
    pub fn drain_request(&mut self, request: RequestId) -> Vec<Prioritized<T>> {
        let mut removed = Vec::new();
        for key in self.requests.take(request) {
            if let Some(entry) = self.entries.remove(&key) {
                self.counters.removed.add_one(entry.priority);
                removed.push(entry);
            }
        }
        removed
    }

    /// Drops every queued entry of `request` into `dropped`, in push order, and marks the
    /// request shed (`save_order::I5`, `save_order::I7`).
    fn shed_into(&mut self, request: RequestId, dropped: &mut Vec<Prioritized<T>>) {
        self.shed.insert(request);
        self.counters.requests_shed += 1;
        for key in self.requests.take(request) {
            if let Some(entry) = self.entries.remove(&key) {
                self.counters.dropped.add_one(entry.priority);
                dropped.push(entry);
            }
        }
    }
}

impl<T> SaveQueue<T> {
    /// The key [`SaveQueue::pop`] would take next.
    #[cfg(feature = "internals")]
    pub fn peek_key(&self) -> Option<SaveKey> {
        self.entries.first_key_value().map(|(key, _)| *key)
    }

    /// Items queued now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most items the queue holds (`save_order::I1`).
    #[cfg(feature = "internals")]
    pub fn capacity(&self) -> usize {
        self.capacity.get()
    }

    /// Whether window pages are filed ahead of full-attention blocks (R21).
    #[cfg(feature = "internals")]
    pub fn window_first(&self) -> bool {
        self.window_first
    }

    /// Items queued now, per priority pushed with.
    #[cfg(feature = "internals")]
    pub fn queued(&self) -> PerPriority {
        let mut queued = PerPriority::default();
        for entry in self.entries.values() {
            queued.add_one(entry.priority);
        }
        queued
    }

    /// The counters so far.
    #[cfg(feature = "internals")]
    pub fn counters(&self) -> SaveQueueCounters {
        self.counters
    }
}
