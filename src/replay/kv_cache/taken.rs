//! Pages the engine takes back from a load in flight and hands to another request at once
//! (`kv-connector replay --release-during-loads`, R29).
//!
//! Workflow: [`KvCache::can_promise`] checks the groups have the unpromised pages; for each
//! page, [`KvCache::take_back`] moves it from the request's table to a stand-in holder (the
//! page keeps its one holder and its promise moves from the request to the stand-in); the
//! request gets a fresh page for that block when it computes it ([`KvCache::ensure_block`]);
//! [`KvCache::give_back`] frees the stand-in's page once the load settled.
//!
//! Invariant:
//!
//! - `kv_cache::taken::T1`. A stand-in's page is promised like a request's quota, so
//!   `kv_cache::K2` holds with pages taken back (the request's quota still covers the
//!   fresh pages it takes instead).

use super::{KvCache, RequestPages};

impl KvCache {
    /// Whether every group has `needed[group]` pages nobody was promised (for a stand-in).
    pub fn can_promise(&self, needed: &[u32]) -> bool {
        self.groups
            .iter()
            .zip(needed)
            .all(|(group, &needed)| needed <= group.unpromised)
    }

    /// Moves the request's page of `block` in group `group` to a stand-in holder and
    /// returns it; `None` (nothing changes) when the request holds no page there, the page
    /// is cached (shared pages are never taken back), or the group has no unpromised page.
    pub fn take_back(
        &mut self,
        pages: &mut RequestPages,
        group: usize,
        block: usize,
    ) -> Option<u32> {
        let page = pages.page(group, block)?;
        let pool = self.groups.get_mut(group)?;
        if pool.is_cached(page) || pool.unpromised == 0 {
            return None;
        }
        pool.unpromised -= 1;
        pages.tables[group][block] = -1;
        pages.held[group] -= 1;
        Some(page)
    }

    /// The stand-in gives `page` of group `group` back: it is free again, and so is its
    /// promise.
    pub fn give_back(&mut self, group: usize, page: u32) {
        if let Some(pool) = self.groups.get_mut(group) {
            pool.put(page);
            pool.unpromised += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{admit, cache};
    use super::super::KvCacheError;

    #[test]
    fn a_page_taken_back_is_replaced_when_computed_and_freed_with_its_promise_t1(
    ) -> Result<(), KvCacheError> {
        let mut cache = cache(64);
        let mut pages = admit(&mut cache, 4 * 16)?;
        let free_before = cache.free_pages();
        let taken = cache.take_back(&mut pages, 0, 3).unwrap_or(u32::MAX);
        assert_eq!(pages.page(0, 3), None);
        let fresh = cache.ensure_block(&mut pages, 0, 3)?;
        assert!(
            fresh.is_some_and(|page| page != taken),
            "a fresh page for block 3"
        );
        assert!(
            !cache.can_admit(60 * 16, 0),
            "the stand-in's page is promised: 60 full pages are not all there"
        );
        cache.give_back(0, taken);
        cache.release(pages);
        assert_eq!(
            cache.free_pages()[0],
            free_before[0] + 4,
            "every page is free again"
        );
        assert!(cache.can_admit(64 * 16, 0), "and every promise given back");
        Ok(())
    }
}
