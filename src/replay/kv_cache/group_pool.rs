//! One layer group's page pool: free pages, reference counts, and the local prefix cache's
//! pages of that group, indexed by chain hash and evicted least recently used.
//!
//! A page is in one of three states:
//! - **free**: nobody holds it and it has no chain hash (it is in `free`);
//! - **held**: `refs >= 1` request table entries name it;
//! - **cached**: it carries a chain hash in `index` (a finished request registered it,
//!   [`GroupPool::register`]). A cached page may also be held (by the request that
//!   registered it, and by later requests that share it); a cached page nobody holds is
//!   *evictable* and sits in `lru` until a request shares it again or an allocation evicts
//!   it.
//!
//! Invariants:
//! - `group_pool::P1`. A free page has no hash and no holder; a held page is never in `free` or
//!   `lru`.
//! - `group_pool::P2`. `index[hash] == page` exactly when `hash_of[page] == Some(hash)`.
//! - `group_pool::P3`. `lru` holds exactly the cached pages with no holder, each under its
//!   `tick_of`.
//! - `group_pool::P4`. `free + lru + held = num_pages`.
//! - `group_pool::P5`. Only [`GroupPool::take`] removes a page from the cache, and it evicts only
//!   from `lru`: a page any request holds is never evicted, freed or handed out again.
//! - `group_pool::P6`. A cached page is read-only (`is_cached`): requests share it only below their
//!   local match, where nothing writes (the engine checks before every write).

use std::collections::{BTreeSet, HashMap};

use crate::core::hash::BlockHash;

use super::GroupPolicy;

/// One group's pages (module docs).
#[derive(Debug)]
pub(super) struct GroupPool {
    /// How the group keeps pages.
    pub(super) policy: GroupPolicy,
    /// Pages not promised to any admitted request (`kv_cache::K2`).
    pub(super) unpromised: u32,
    /// Free pages, popped from the back (`group_pool::P1`).
    free: Vec<u32>,
    /// Table entries naming each page.
    refs: Vec<u32>,
    /// The chain hash of each cached page (`group_pool::P2`).
    hash_of: Vec<Option<BlockHash>>,
    /// When each evictable page last lost its last holder or was touched (`group_pool::P3`).
    tick_of: Vec<u64>,
    /// Cached pages by chain hash (`group_pool::P2`).
    index: HashMap<BlockHash, u32>,
    /// Evictable pages, least recently used first (`group_pool::P3`).
    lru: BTreeSet<(u64, u32)>,
    /// The LRU clock: incremented on every use.
    clock: u64,
}

/// Converts a page index to a vector position.
fn slot(page: u32) -> usize {
    usize::try_from(page).unwrap_or(usize::MAX)
}

impl GroupPool {
    /// A pool of `num_pages` free pages; page 0 is handed out first.
    pub(super) fn new(policy: GroupPolicy, num_pages: u32) -> Self {
        let len = slot(num_pages);
        Self {
            policy,
            unpromised: num_pages,
            free: (0..num_pages).rev().collect(),
            refs: vec![0; len],
            hash_of: vec![None; len],
            tick_of: vec![0; len],
            index: HashMap::new(),
            lru: BTreeSet::new(),
            clock: 0,
        }
    }

    /// Free pages.
    #[cfg(feature = "internals")]
    pub(super) fn free_len(&self) -> usize {
        self.free.len()
    }

    /// Cached pages nobody holds (evictable).
    #[cfg(feature = "internals")]
    pub(super) fn evictable_len(&self) -> usize {
        self.lru.len()
    }

    /// Table entries naming `page`.
    #[cfg(feature = "internals")]
    pub(super) fn holders(&self, page: u32) -> u32 {
        self.refs.get(slot(page)).copied().unwrap_or(0)
    }

    /// Whether `page` is cached (read-only, `group_pool::P6`).
    pub(super) fn is_cached(&self, page: u32) -> bool {
        self.hash_of.get(slot(page)).is_some_and(Option::is_some)
    }

    /// Whether a page with chain hash `hash` is cached.
    pub(super) fn contains(&self, hash: &BlockHash) -> bool {
        self.index.contains_key(hash)
    }

    /// Hands out a page with one holder: a free one, or else the least recently used
    /// evictable one, which leaves the cache (`group_pool::P5`). `None` when neither exists.
    pub(super) fn take(&mut self) -> Option<u32> {
        let page = if let Some(page) = self.free.pop() {
            page
        } else {
            let (_, page) = self.lru.pop_first()?;
            if let Some(hash) = self.hash_of[slot(page)].take() {
                self.index.remove(&hash);
            }
            page
        };
        self.refs[slot(page)] = 1;
        Some(page)
    }

    /// Drops one holder of `page`. A page nobody holds any more becomes evictable if it is
    /// cached (most recently used), free otherwise.
    pub(super) fn put(&mut self, page: u32) {
        let position = slot(page);
        let Some(refs) = self.refs.get_mut(position) else {
            return;
        };
        debug_assert!(*refs > 0, "page {page} released without a holder");
        *refs = refs.saturating_sub(1);
        if *refs > 0 {
            return;
        }
        if self.hash_of[position].is_some() {
            self.clock += 1;
            self.tick_of[position] = self.clock;
            self.lru.insert((self.clock, page));
        } else {
            self.free.push(page);
        }
    }

    /// Adds a holder to the cached page of `hash` (taking it out of `lru` if nobody held
    /// it); `None` when no page of that hash is cached.
    pub(super) fn share(&mut self, hash: &BlockHash) -> Option<u32> {
        let page = *self.index.get(hash)?;
        let position = slot(page);
        if self.refs[position] == 0 {
            self.lru.remove(&(self.tick_of[position], page));
        }
        self.refs[position] += 1;
        Some(page)
    }

    /// Caches a held page under `hash`. Returns `false` (and changes nothing) when `hash`
    /// is cached already, the page is cached already, or nobody holds it.
    pub(super) fn register(&mut self, hash: BlockHash, page: u32) -> bool {
        let position = slot(page);
        if self.index.contains_key(&hash)
            || self.hash_of.get(position).is_none_or(Option::is_some)
            || self.refs[position] == 0
        {
            return false;
        }
        self.hash_of[position] = Some(hash);
        self.index.insert(hash, page);
        true
    }

    /// Marks the evictable page of `hash` most recently used (a waiting request matched
    /// it); held or unknown pages are left alone.
    pub(super) fn touch(&mut self, hash: &BlockHash) {
        let Some(&page) = self.index.get(hash) else {
            return;
        };
        let position = slot(page);
        if self.refs[position] == 0 && self.lru.remove(&(self.tick_of[position], page)) {
            self.clock += 1;
            self.tick_of[position] = self.clock;
            self.lru.insert((self.clock, page));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(byte: u8) -> BlockHash {
        BlockHash([byte; 16])
    }

    fn pool(pages: u32) -> GroupPool {
        GroupPool::new(GroupPolicy::FULL, pages)
    }

    /// Takes `n` pages and caches them under hashes `first..first + n`.
    fn cached(pool: &mut GroupPool, first: u8, n: u8) -> Vec<u32> {
        (first..first + n)
            .map(|byte| {
                let page = pool.take().unwrap_or(u32::MAX);
                assert!(pool.register(hash(byte), page));
                page
            })
            .collect()
    }

    #[test]
    fn uncached_pages_go_back_to_the_free_list_p1() {
        let mut pool = pool(2);
        assert_eq!(pool.take(), Some(0));
        assert_eq!(pool.take(), Some(1));
        assert_eq!(pool.take(), None);
        pool.put(1);
        assert_eq!((pool.free_len(), pool.evictable_len()), (1, 0));
        assert_eq!(pool.take(), Some(1));
    }

    #[test]
    fn shared_pages_are_reference_counted_and_never_handed_out_while_held_p5() {
        let mut pool = pool(2);
        let pages = cached(&mut pool, 1, 1);
        // A second holder shares the cached page.
        assert_eq!(pool.share(&hash(1)), Some(pages[0]));
        assert_eq!(pool.holders(pages[0]), 2);
        pool.put(pages[0]);
        assert_eq!(pool.holders(pages[0]), 1);
        assert_eq!(pool.evictable_len(), 0, "still held: not evictable");
        // The only other page is free; once it is taken nothing is left to evict.
        assert_eq!(pool.take(), Some(1));
        assert_eq!(pool.take(), None, "a held cached page is never evicted");
        pool.put(pages[0]);
        assert_eq!(pool.evictable_len(), 1);
        assert!(pool.contains(&hash(1)), "evictable pages stay cached");
        // Now it is evicted for the next allocation and leaves the index.
        assert_eq!(pool.take(), Some(pages[0]));
        assert!(!pool.contains(&hash(1)));
        assert!(!pool.is_cached(pages[0]));
        assert_eq!(pool.share(&hash(1)), None);
    }

    #[test]
    fn eviction_takes_the_least_recently_used_page_first_p3() {
        let mut pool = pool(3);
        let pages = cached(&mut pool, 1, 3);
        // Released in the order 2, 0, 1: page 2 is the least recently used.
        for &page in &[pages[2], pages[0], pages[1]] {
            pool.put(page);
        }
        // Touching page 2 (a waiting request matched it) makes page 0 the oldest.
        pool.touch(&hash(3));
        assert_eq!(pool.take(), Some(pages[0]));
        // Sharing and releasing page 1 makes it the newest: page 2 goes next.
        assert_eq!(pool.share(&hash(2)), Some(pages[1]));
        pool.put(pages[1]);
        assert_eq!(pool.take(), Some(pages[2]));
        assert_eq!(pool.take(), Some(pages[1]));
        assert_eq!(pool.take(), None);
    }

    #[test]
    fn a_hash_or_page_is_cached_once_and_only_while_held_p2() {
        let mut pool = pool(3);
        let first = pool.take().unwrap_or(u32::MAX);
        let second = pool.take().unwrap_or(u32::MAX);
        assert!(pool.register(hash(1), first));
        assert!(!pool.register(hash(1), second), "hash already cached");
        assert!(!pool.register(hash(2), first), "page already cached");
        pool.put(second);
        assert!(!pool.register(hash(2), second), "nobody holds it");
        assert!(!pool.is_cached(second));
        assert!(pool.is_cached(first));
    }

    #[test]
    fn page_states_always_add_up_p4() {
        // A seeded walk of take / put / share / register against the counts.
        let mut pool = pool(8);
        let mut held: Vec<u32> = Vec::new();
        let mut state: u64 = 0x5EED;
        for _ in 0..2_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let pick = usize::try_from(state >> 60).unwrap_or(0);
            match pick % 4 {
                0 => {
                    if let Some(page) = pool.take() {
                        held.push(page);
                    }
                }
                1 if !held.is_empty() => {
                    let page = held.swap_remove(pick % held.len());
                    pool.put(page);
                }
                2 if !held.is_empty() => {
                    let page = held[pick % held.len()];
                    let _ = pool.register(hash(u8::try_from(pick).unwrap_or(0)), page);
                }
                _ => {
                    if let Some(page) = pool.share(&hash(u8::try_from(pick).unwrap_or(0))) {
                        held.push(page);
                    }
                }
            }
            let mut distinct = held.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(
                pool.free_len() + pool.evictable_len() + distinct.len(),
                8,
                "seed 0x5EED"
            );
            for &page in &distinct {
                let count = held.iter().filter(|&&other| other == page).count();
                assert_eq!(slot(pool.holders(page)), count);
            }
        }
    }
}
