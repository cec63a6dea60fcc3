//! Extra KV tokens for a speculative drafter (`docs/DESIGN.md` section 11: "optionally a
//! drafter that allocates extra KV tokens"; R16, R18).
//!
//! An EAGLE-style drafter proposes `k` draft tokens after the target's token; the engine
//! verifies them in the next step, so the KV cache reserves room for `k` tokens past the
//! prompt end and past the end of every chunk. Workflow, per request:
//! 1. admission promises and (full groups) allocates pages for `P + k` tokens
//!    ([`KvCache::quota_for`] and [`KvCache::admit`] count the extra tokens);
//! 2. after each chunk, [`KvCache::ensure_past_chunk_end`] gives window groups the pages of
//!    the blocks overlapping `[chunk end, chunk end + k)` (full groups already hold them);
//!    those pages hold the stale pattern until their blocks are computed;
//! 3. at the last chunk the engine writes the draft tokens into the pages of
//!    [`KvCache::draft_blocks`]; after verification [`KvCache::rewind`] gives back the
//!    pages that hold only rejected tokens.
//!
//! Invariants:
//! - `kv_cache::draft::X1`. A rewind never gives back a page of a block holding a prompt token:
//!   only blocks at or past `ceil(kept / T)` with `kept >= P` (so a rejected draft never rewinds a
//!   page the connector may address, R18).
//! - `kv_cache::draft::X2`. The extra pages stay within the request's quota (`kv_cache::K2` holds
//!   with a drafter).

use std::ops::Range;

use super::{blocks_for, KvCache, KvCacheError, RequestPages};

impl KvCache {
    /// The same cache with `extra_tokens` KV tokens allocated past the prompt end and each
    /// chunk end (a drafter's draft length; 0 turns it off).
    #[must_use]
    pub fn with_extra_tokens(mut self, extra_tokens: usize) -> Self {
        self.extra_tokens = extra_tokens;
        self
    }

    /// The extra KV tokens (0 without a drafter).
    #[cfg(feature = "internals")]
    pub fn extra_tokens(&self) -> usize {
        self.extra_tokens
    }

    /// Blocks overlapping the extra tokens past a chunk ending at `chunk_end`, within the
    /// request's tables.
    pub fn draft_blocks(&self, pages: &RequestPages, chunk_end: usize) -> Range<usize> {
        if self.extra_tokens == 0 {
            return 0..0;
        }
        let blocks = pages.tables.first().map_or(0, Vec::len);
        let t = self.tokens_per_block;
        let start = (chunk_end / t).min(blocks);
        start..blocks_for(chunk_end + self.extra_tokens, t).min(blocks)
    }

    /// Allocates the pages of the blocks past a chunk ending at `chunk_end` that the extra
    /// tokens reach (workflow 2); returns `(group, page)` of each page allocated now (its
    /// bytes are whatever the last holder left: the engine writes the stale pattern).
    ///
    /// # Errors
    ///
    /// [`KvCacheError::QuotaExceeded`] (`kv_cache::draft::X2`; a simulator bug).
    pub fn ensure_past_chunk_end(
        &mut self,
        pages: &mut RequestPages,
        chunk_end: usize,
    ) -> Result<Vec<(usize, u32)>, KvCacheError> {
        let mut fresh = Vec::new();
        for block in self.draft_blocks(pages, chunk_end) {
            for group in 0..self.groups.len() {
                if let Some(page) = self.ensure_block(pages, group, block)? {
                    fresh.push((group, page));
                }
            }
        }
        Ok(fresh)
    }

    /// Gives back every page of blocks that hold no token below `kept` (the prompt plus the
    /// accepted draft tokens, `kept >= P`); returns how many pages were given back
    /// (`kv_cache::draft::X1`).
    pub fn rewind(&mut self, pages: &mut RequestPages, kept: usize) -> u64 {
        let first_rewound = blocks_for(kept, self.tokens_per_block);
        let mut rewound = 0;
        for group in 0..self.groups.len() {
            let blocks = pages.tables[group].len();
            for block in first_rewound..blocks {
                if pages.page(group, block).is_some() {
                    self.drop_block(pages, group, block);
                    rewound += 1;
                }
            }
        }
        rewound
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{admit, cache};
    use super::*;

    #[test]
    fn extra_tokens_widen_the_quota_and_the_tables_x2() -> Result<(), KvCacheError> {
        // 1000 tokens = 63 blocks; 3 extra tokens reach one more block (1000 + 3 = 1003).
        let plain = cache(200);
        let drafting = cache(200).with_extra_tokens(3);
        assert_eq!(plain.quota_for(1000, 0), vec![63, 9]);
        assert_eq!(drafting.quota_for(1000, 0), vec![63, 11]);
        assert_eq!(drafting.quota_for(1008, 0), vec![64, 11]);
        let mut drafting = drafting;
        let pages = admit(&mut drafting, 1008)?;
        assert_eq!(pages.tables()[0].len(), 64);
        // Full groups hold the page past the prompt end from admission on (stale).
        assert!(pages.page(0, 63).is_some());
        drafting.release(pages);
        assert_eq!(drafting.free_pages(), vec![200, 200]);
        Ok(())
    }

    #[test]
    fn window_groups_get_the_pages_past_each_chunk_end() -> Result<(), KvCacheError> {
        let mut cache = cache(200).with_extra_tokens(20);
        let mut pages = admit(&mut cache, 1000)?;
        // A chunk ending at 40 reaches [40, 60): blocks 2 and 3.
        assert_eq!(cache.draft_blocks(&pages, 40), 2..4);
        let fresh = cache.ensure_past_chunk_end(&mut pages, 40)?;
        assert_eq!(
            fresh.iter().map(|&(group, _)| group).collect::<Vec<_>>(),
            vec![1, 1]
        );
        assert!(pages.page(1, 2).is_some() && pages.page(1, 3).is_some());
        assert!(cache.ensure_past_chunk_end(&mut pages, 40)?.is_empty());
        // At the prompt end: the partial block 62 and block 63 (tokens up to 1020).
        assert_eq!(cache.draft_blocks(&pages, 1000), 62..64);
        assert_eq!(pages.tables()[1].len(), 64);
        Ok(())
    }

    #[test]
    fn rewind_gives_back_only_pages_past_the_kept_tokens_x1() -> Result<(), KvCacheError> {
        let mut cache = cache(200).with_extra_tokens(40);
        // P = 1000: blocks 0..62 hold prompt tokens (block 62 partially); 63..65 drafts.
        let mut pages = admit(&mut cache, 1000)?;
        cache.ensure_past_chunk_end(&mut pages, 1000)?;
        assert_eq!(pages.tables()[0].len(), 65);
        // Keep 1000 + 5: block 62 (tokens 992..1008) stays, 63 and 64 go in both groups.
        let free_before = cache.free_pages();
        assert_eq!(cache.rewind(&mut pages, 1005), 4);
        assert!(pages.page(0, 62).is_some() && pages.page(1, 62).is_some());
        assert!(pages.page(0, 63).is_none() && pages.page(1, 64).is_none());
        assert_eq!(
            cache.free_pages(),
            vec![free_before[0] + 2, free_before[1] + 2]
        );
        // Nothing of the prompt goes, even with every draft rejected.
        assert_eq!(cache.rewind(&mut pages, 1000), 0);
        assert!(pages.page(0, 62).is_some());
        cache.release(pages);
        assert_eq!(cache.free_pages(), vec![200, 200]);
        Ok(())
    }
}
