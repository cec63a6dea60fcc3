//! The simulated engine's paged KV cache: one finite page pool per layer group, and each
//! request's page tables (DESIGN section 1, "Page"; section 11, "a paged KV cache per
//! layer group (window groups drop out-of-window pages)").
//!
//! Workflow for one request:
//! 1. [`KvCache::admit`] promises the request its page quota in every group, or refuses
//!    when a group lacks free pages (the request keeps waiting), and allocates every
//!    full-attention page of the prompt at once;
//! 2. window-group pages are allocated as they are needed ([`KvCache::ensure_block`]): the
//!    sink and window blocks of a reservation's resume point, then the blocks each chunk
//!    writes;
//! 3. after each step, [`KvCache::drop_out_of_window`] frees window-group pages no later
//!    token reads (page index `-1` from then on);
//! 4. [`KvCache::release`] frees every page and gives the quota back.
//!
//! A window group keeps its sink blocks and the blocks overlapping
//! `[computed - W - R, computed)`, where `R` is the planner's `swa_endpoint_rewind_tokens`:
//! the extra `R` tokens are what lets the connector save a prompt end's rewind range (R17).
//!
//! Invariants:
//! - K1. A page is in at most one table entry of one request, or free; never both.
//! - K2. Per group, the pages a request holds never exceed its quota, and the quotas of
//!   admitted requests never exceed the pool: an admitted request never runs out of pages.
//! - K3. Full-attention groups hold a page for every block of the prompt from admission to
//!   release.

use std::ops::Range;

/// How a group keeps pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupPolicy {
    /// Full attention: every block's page is held until the request ends (K3).
    Full,
    /// Sliding window: sinks plus the blocks overlapping `[c - W - keep_extra, c)`.
    Window {
        /// `W`.
        window_tokens: usize,
        /// `S`.
        sink_tokens: usize,
        /// `R`: tokens kept beyond the window so the rewind range can be saved (R17).
        keep_extra_tokens: usize,
    },
}

/// Why the cache refused an operation; each is a simulator bug, not a user error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvCacheError {
    /// A request needed more pages of a group than its quota (K2).
    #[error("request needs more than its quota of {quota} pages in group index {group}")]
    QuotaExceeded {
        /// Index of the group in layout order.
        group: usize,
        /// The request's quota.
        quota: u32,
    },
    /// A request was admitted after the cache said it fits, and then it did not.
    #[error("a prompt of {prompt_len} tokens was admitted without room in the cache")]
    NoRoom {
        /// The prompt length.
        prompt_len: usize,
    },
    /// A block index past the request's page table.
    #[error("block {block} is past the {blocks} blocks of the request")]
    BlockOutOfRange {
        /// The block.
        block: usize,
        /// Blocks of the request.
        blocks: usize,
    },
}

impl KvCacheError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::QuotaExceeded { .. } => "quota_exceeded",
            Self::NoRoom { .. } => "no_room",
            Self::BlockOutOfRange { .. } => "block_out_of_range",
        }
    }
}

/// One group's pool.
#[derive(Debug)]
struct GroupPool {
    policy: GroupPolicy,
    /// Pages nobody holds (K1).
    free: Vec<u32>,
    /// Pages not promised to any admitted request (K2).
    unpromised: u32,
}

/// The pages of one request: a table per group and its quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPages {
    /// Page index per block per group, `-1` where the group holds no page.
    tables: Vec<Vec<i32>>,
    /// Pages promised per group (K2).
    quota: Vec<u32>,
    /// Pages held per group.
    held: Vec<u32>,
}

impl RequestPages {
    /// The page tables, one per group in layout order.
    pub fn tables(&self) -> &[Vec<i32>] {
        &self.tables
    }

    /// The page of `block` in group `group`, if one is held.
    pub fn page(&self, group: usize, block: usize) -> Option<u32> {
        let page = *self.tables.get(group)?.get(block)?;
        u32::try_from(page).ok()
    }

    /// Pages held in all groups.
    pub fn held_pages(&self) -> u64 {
        self.held.iter().map(|&held| u64::from(held)).sum()
    }
}

/// The page pools of one instance (one per group; every rank has the same tables).
#[derive(Debug)]
pub struct KvCache {
    groups: Vec<GroupPool>,
    /// `T`.
    tokens_per_block: usize,
    /// Most prompt tokens one step computes for a request (the chunk size bound).
    max_chunk_tokens: usize,
    /// Pages per group.
    num_pages: u32,
}

/// Blocks covering `tokens` tokens (the last one possibly partial).
pub fn blocks_for(tokens: usize, tokens_per_block: usize) -> usize {
    tokens.div_ceil(tokens_per_block.max(1))
}

/// Converts a page index to a table entry (pages are below `i32::MAX`, checked at build).
fn entry(page: u32) -> i32 {
    i32::try_from(page).unwrap_or(i32::MAX)
}

impl KvCache {
    /// A cache of `num_pages` pages per group (at most `i32::MAX`), groups in layout order.
    pub fn new(
        policies: &[GroupPolicy],
        num_pages: u32,
        tokens_per_block: usize,
        max_chunk_tokens: usize,
    ) -> Self {
        let num_pages = num_pages.min(u32::try_from(i32::MAX).unwrap_or(u32::MAX));
        Self {
            groups: policies
                .iter()
                .map(|&policy| GroupPool {
                    policy,
                    // Popped from the back: page 0 is handed out first.
                    free: (0..num_pages).rev().collect(),
                    unpromised: num_pages,
                })
                .collect(),
            tokens_per_block: tokens_per_block.max(1),
            max_chunk_tokens,
            num_pages,
        }
    }

    /// Pages per group.
    pub fn num_pages(&self) -> u32 {
        self.num_pages
    }

    /// `T`.
    pub fn tokens_per_block(&self) -> usize {
        self.tokens_per_block
    }

    /// The groups' policies, in layout order.
    pub fn policies(&self) -> impl Iterator<Item = GroupPolicy> + '_ {
        self.groups.iter().map(|group| group.policy)
    }

    /// Pages a prompt of `prompt_len` tokens is promised per group: every block in a full
    /// group; in a window group the sinks, the kept range and one chunk (K2).
    pub fn quota_for(&self, prompt_len: usize) -> Vec<u32> {
        let t = self.tokens_per_block;
        let blocks = blocks_for(prompt_len, t);
        self.groups
            .iter()
            .map(|group| {
                let need = match group.policy {
                    GroupPolicy::Full => blocks,
                    GroupPolicy::Window {
                        window_tokens,
                        sink_tokens,
                        keep_extra_tokens,
                    } => {
                        blocks_for(sink_tokens, t)
                            + blocks_for(window_tokens + keep_extra_tokens, t)
                            + blocks_for(self.max_chunk_tokens, t)
                            + 2
                    }
                };
                u32::try_from(need.min(blocks)).unwrap_or(u32::MAX)
            })
            .collect()
    }

    /// Whether a prompt of `prompt_len` tokens could ever be admitted (its quota fits an
    /// empty pool).
    pub fn fits_empty(&self, prompt_len: usize) -> bool {
        self.quota_for(prompt_len)
            .iter()
            .all(|&quota| quota <= self.num_pages)
    }

    /// Whether a prompt of `prompt_len` tokens can be admitted now.
    pub fn can_admit(&self, prompt_len: usize) -> bool {
        self.quota_for(prompt_len)
            .iter()
            .zip(&self.groups)
            .all(|(&quota, group)| quota <= group.unpromised)
    }

    /// Admits a prompt: promises its quota and allocates its full-group pages (K3).
    /// Returns the pages and the `(group, page)` pairs allocated (for the stale fill), or
    /// `None` when a group lacks pages.
    pub fn admit(&mut self, prompt_len: usize) -> Option<(RequestPages, Vec<(usize, u32)>)> {
        if !self.can_admit(prompt_len) {
            return None;
        }
        let quota = self.quota_for(prompt_len);
        let blocks = blocks_for(prompt_len, self.tokens_per_block);
        let mut pages = RequestPages {
            tables: vec![vec![-1; blocks]; self.groups.len()],
            held: vec![0; self.groups.len()],
            quota,
        };
        let mut allocated = Vec::new();
        for (index, group) in self.groups.iter_mut().enumerate() {
            group.unpromised -= pages.quota[index];
            if group.policy == GroupPolicy::Full {
                for slot in &mut pages.tables[index] {
                    // The quota was checked against `unpromised <= free.len()` (K2).
                    if let Some(page) = group.free.pop() {
                        *slot = entry(page);
                        pages.held[index] += 1;
                        allocated.push((index, page));
                    }
                }
            }
        }
        Some((pages, allocated))
    }

    /// Makes sure `block` has a page in group `group`; returns the page if it was just
    /// allocated (its bytes are whatever the last holder left).
    ///
    /// # Errors
    ///
    /// [`KvCacheError::BlockOutOfRange`], or [`KvCacheError::QuotaExceeded`] (K2).
    pub fn ensure_block(
        &mut self,
        pages: &mut RequestPages,
        group: usize,
        block: usize,
    ) -> Result<Option<u32>, KvCacheError> {
        let blocks = pages.tables.first().map_or(0, Vec::len);
        let slot = pages
            .tables
            .get_mut(group)
            .and_then(|table| table.get_mut(block))
            .ok_or(KvCacheError::BlockOutOfRange { block, blocks })?;
        if *slot >= 0 {
            return Ok(None);
        }
        let quota = pages.quota[group];
        if pages.held[group] >= quota {
            return Err(KvCacheError::QuotaExceeded { group, quota });
        }
        let page = self.groups[group]
            .free
            .pop()
            .ok_or(KvCacheError::QuotaExceeded { group, quota })?;
        *slot = entry(page);
        pages.held[group] += 1;
        Ok(Some(page))
    }

    /// Frees the page of `block` in group `group`, if held.
    pub fn drop_block(&mut self, pages: &mut RequestPages, group: usize, block: usize) {
        let Some(slot) = pages.tables.get_mut(group).and_then(|t| t.get_mut(block)) else {
            return;
        };
        if let Ok(page) = u32::try_from(*slot) {
            self.groups[group].free.push(page);
            pages.held[group] -= 1;
            *slot = -1;
        }
    }

    /// Frees every window-group page of the request (after a failed load, before
    /// computing from scratch).
    pub fn drop_window_pages(&mut self, pages: &mut RequestPages) {
        for group in 0..self.groups.len() {
            if self.groups[group].policy != GroupPolicy::Full {
                for block in 0..pages.tables[group].len() {
                    self.drop_block(pages, group, block);
                }
            }
        }
    }

    /// Frees window-group pages that no token at or after `computed` reads (workflow 3).
    pub fn drop_out_of_window(&mut self, pages: &mut RequestPages, computed: usize) {
        let t = self.tokens_per_block;
        for group in 0..self.groups.len() {
            let GroupPolicy::Window {
                window_tokens,
                sink_tokens,
                keep_extra_tokens,
            } = self.groups[group].policy
            else {
                continue;
            };
            let keep_from = computed.saturating_sub(window_tokens + keep_extra_tokens);
            // Blocks ending at or before `keep_from` are out of the kept range.
            let dropped_end = keep_from / t;
            for block in blocks_for(sink_tokens, t)..dropped_end {
                self.drop_block(pages, group, block);
            }
        }
    }

    /// Blocks of group `group` a load resuming at `resume` tokens fills (R15): every block
    /// before it in a full group; the sink blocks and the blocks overlapping
    /// `[resume - W, resume)` in a window group.
    pub fn load_blocks(&self, group: usize, resume: usize) -> Vec<usize> {
        let t = self.tokens_per_block;
        let end = resume / t;
        match self.groups[group].policy {
            GroupPolicy::Full => (0..end).collect(),
            GroupPolicy::Window {
                window_tokens,
                sink_tokens,
                ..
            } => {
                let sinks = blocks_for(sink_tokens, t).min(end);
                let window_start = (resume.saturating_sub(window_tokens) / t).max(sinks);
                (0..sinks).chain(window_start..end).collect()
            }
        }
    }

    /// Blocks a chunk computing tokens `range` writes into.
    pub fn chunk_blocks(&self, range: &Range<usize>) -> Range<usize> {
        if range.is_empty() {
            return 0..0;
        }
        range.start / self.tokens_per_block..blocks_for(range.end, self.tokens_per_block)
    }

    /// Frees every page of the request and gives its quota back (workflow 4).
    pub fn release(&mut self, pages: RequestPages) {
        for (index, table) in pages.tables.into_iter().enumerate() {
            let group = &mut self.groups[index];
            group.free.extend(
                table
                    .into_iter()
                    .filter_map(|page| u32::try_from(page).ok()),
            );
            group.unpromised += pages.quota[index];
        }
    }

    /// Free pages per group (for tests and reports).
    pub fn free_pages(&self) -> Vec<usize> {
        self.groups.iter().map(|group| group.free.len()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: GroupPolicy = GroupPolicy::Window {
        window_tokens: 64,
        sink_tokens: 4,
        keep_extra_tokens: 0,
    };

    fn cache(num_pages: u32) -> KvCache {
        KvCache::new(&[GroupPolicy::Full, WINDOW], num_pages, 16, 32)
    }

    #[test]
    fn admission_allocates_full_groups_and_promises_window_quota_k2_k3() {
        let mut cache = cache(100);
        // 1000 tokens: 63 blocks; window quota 1 + 4 + 2 + 2 = 9.
        assert_eq!(cache.quota_for(1000), vec![63, 9]);
        let Some((pages, allocated)) = cache.admit(1000) else {
            panic!("fits");
        };
        assert_eq!(allocated.len(), 63);
        assert!(pages.tables()[0].iter().all(|&page| page >= 0));
        assert!(pages.tables()[1].iter().all(|&page| page == -1));
        assert_eq!(cache.free_pages(), vec![37, 100]);
        // 63 + 63 > 100: the second prompt waits.
        assert!(!cache.can_admit(1000));
        assert!(cache.admit(1000).is_none());
        cache.release(pages);
        assert_eq!(cache.free_pages(), vec![100, 100]);
        assert!(cache.can_admit(1000));
    }

    #[test]
    fn window_pages_stay_within_quota_while_chunks_advance_k2() -> Result<(), KvCacheError> {
        let mut cache = cache(100);
        let Some((mut pages, _)) = cache.admit(1000) else {
            panic!("fits");
        };
        let mut computed = 0;
        while computed < 1000 {
            let end = (computed + 32).min(1000);
            for block in cache.chunk_blocks(&(computed..end)) {
                cache.ensure_block(&mut pages, 1, block)?;
            }
            computed = end;
            cache.drop_out_of_window(&mut pages, computed);
            // Sinks (block 0) stay; blocks overlapping [c - 64, c) stay.
            assert!(pages.page(1, 0).is_some());
            let first_kept = computed.saturating_sub(64) / 16;
            for block in 1..first_kept {
                assert_eq!(pages.page(1, block), None, "block {block} at {computed}");
            }
            for block in first_kept.max(1)..computed.div_ceil(16) {
                assert!(
                    pages.page(1, block).is_some(),
                    "block {block} at {computed}"
                );
            }
        }
        cache.release(pages);
        assert_eq!(cache.free_pages(), vec![100, 100]);
        Ok(())
    }

    #[test]
    fn quota_is_enforced_k2() -> Result<(), KvCacheError> {
        let mut cache = cache(100);
        let Some((mut pages, _)) = cache.admit(1000) else {
            panic!("fits");
        };
        for block in 0..9 {
            cache.ensure_block(&mut pages, 1, block)?;
        }
        assert_eq!(
            cache.ensure_block(&mut pages, 1, 9),
            Err(KvCacheError::QuotaExceeded { group: 1, quota: 9 })
        );
        assert!(matches!(
            cache.ensure_block(&mut pages, 0, 63),
            Err(KvCacheError::BlockOutOfRange { .. })
        ));
        Ok(())
    }

    #[test]
    fn loads_cover_full_prefix_and_window_sinks_r15() {
        let cache = cache(100);
        assert_eq!(cache.load_blocks(0, 160), (0..10).collect::<Vec<_>>());
        // Resume at 160: sinks [0, 1) and blocks overlapping [96, 160): 6..10.
        assert_eq!(cache.load_blocks(1, 160), vec![0, 6, 7, 8, 9]);
        // A short resume: the window reaches the sinks.
        assert_eq!(cache.load_blocks(1, 32), vec![0, 1]);
        assert!(cache.load_blocks(1, 0).is_empty());
    }

    #[test]
    fn pages_are_never_shared_between_requests_k1() {
        let mut cache = KvCache::new(&[GroupPolicy::Full], 10, 16, 32);
        let Some((first, _)) = cache.admit(64) else {
            panic!("fits");
        };
        let Some((second, _)) = cache.admit(64) else {
            panic!("fits");
        };
        let mut all: Vec<i32> = first.tables()[0]
            .iter()
            .chain(&second.tables()[0])
            .copied()
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 8);
    }
}
