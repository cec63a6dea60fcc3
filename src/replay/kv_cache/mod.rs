//! The simulated engine's paged KV cache: one finite page pool per layer group, each
//! request's page tables, and the optional local prefix cache (`docs/DESIGN.md` section 1, "Page";
//! section 11, "a paged KV cache per layer group (window groups drop out-of-window
//! pages)").
//!
//! Workflow for one request:
//! 1. [`KvCache::admit`] promises the request its page quota in every group, or refuses
//!    when a group lacks pages (the request keeps waiting); it shares the cached pages of
//!    the request's local match ([`SharedPrefix`]) and allocates every other
//!    full-attention page of the prompt at once;
//! 2. window-group pages are allocated as they are needed ([`KvCache::ensure_block`]): the
//!    sink and window blocks of a reservation's resume point, then the blocks each chunk
//!    writes;
//! 3. after each step, [`KvCache::drop_out_of_window`] gives up window-group pages no later
//!    token reads (page index `-1` from then on);
//! 4. with the local prefix cache on, [`KvCache::publish`] caches the pages of the
//!    prompt's computed full blocks when the request finishes;
//! 5. [`KvCache::release`] gives up every page and gives the quota back.
//!
//! With a drafter ([`KvCache::with_extra_tokens`], see `draft`), every request's tables
//! and quota also cover `k` extra KV tokens past the prompt end (the draft length): full
//! groups get those pages at admission, window groups as each chunk reaches past its end
//! ([`KvCache::ensure_past_chunk_end`]); [`KvCache::rewind`] gives back the pages of
//! rejected draft tokens.
//!
//! A window group keeps its sink blocks and the blocks overlapping
//! `[computed - W - R, computed)`, where `R` is the planner's `swa_endpoint_rewind_tokens`:
//! the extra `R` tokens are what lets the connector save a prompt end's rewind range (R17).
//! With window checkpoints (`saver.window_checkpoint_tokens` = `I`, R28) it also keeps,
//! until the request is released, the blocks overlapping `[c - W, c)` of every multiple
//! `c` of `I` it computed: the connector saves them asynchronously, and a page it saves
//! must not pass to another request before the save read it (the engine's side of the
//! rule that a request keeps its pages until its saves settle, R22).
//!
//! ## Local prefix cache
//!
//! Off unless the engine publishes (`kv-connector replay --local-prefix-cache`). Pages of
//! finished requests' full blocks stay cached under their chain hash, in every group that
//! still holds them (see `group_pool` for page states, reference counts and eviction).
//! [`KvCache::local_match`] finds how much of a new prompt they serve:
//! - full-attention groups need every block before the resume point: the match is the
//!   longest run of leading blocks cached in every full group;
//! - window groups need only the sink blocks and the blocks overlapping `[e - W, e)` for a
//!   resume point `e` (the blocks a pool load fills, R15). Their pages survive only near
//!   the ends of finished prompts (a window group keeps `[P - W - R, P)`), so on a hybrid
//!   layout the match is walked back, block by block, to the largest `e` whose window is
//!   cached in every window group, or 0. A local hit never leaves a window page missing;
//! - the block holding the last prompt token is never matched (the engine computes at
//!   least one token).
//!
//! A request shares exactly those pages (the window ones also cost it up to
//! `ceil(W/T)` extra quota, since a pool load past the match adds the window of its own
//! resume point). Cached pages are evicted least recently used, the tail blocks of a
//! released prompt first, only when an allocation finds no free page.
//!
//! Invariants:
//! - `kv_cache::K1`. A page is free, held by table entries of one or more requests, or cached
//!   without a holder (evictable). Only a cached page is held by more than one request, and a
//!   cached page is never written (`kv_cache::K5`).
//! - `kv_cache::K2`. Per group, the pages a request holds (shared ones included) never exceed its
//!   quota, and the quotas of admitted requests never exceed the pool: an admitted request
//!   never runs out of pages (free plus evictable pages always cover every outstanding
//!   quota, because each held page is held by at least one request).
//! - `kv_cache::K3`. Full-attention groups hold a page for every block of the prompt from admission
//!   to release, except blocks whose pages the engine took back from a load in flight
//!   (`taken`), which get a fresh page when computed.
//! - `kv_cache::K4`. A page with a holder is never evicted, freed or handed to another allocation.
//! - `kv_cache::K5`. A request shares cached pages only below its local match, where neither the
//!   engine nor the connector writes ([`KvCache::ensure_writable`] guards the engine).

mod draft;
mod group_pool;
mod prefix;
mod taken;
#[cfg(test)]
mod testkit;

use std::ops::Range;

use crate::core::page_names::{PageNaming, PromptHashes};
use crate::core::layout::{Attention, GroupKind};

use group_pool::GroupPool;

/// How a group keeps pages: full attention holds every block's page until the request
/// ends (`kv_cache::K3`); a sliding window holds the sinks plus the blocks overlapping
/// `[c - W - keep_extra, c)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupPolicy {
    /// The group's attention, with `W` and `S` for a window group.
    pub attention: Attention,
    /// `R`: tokens a window group keeps beyond the window so the rewind range can be saved
    /// (R17); full groups ignore it.
    pub keep_extra_tokens: usize,
    /// `I`: a window group keeps the window of every multiple of it (R28); 0: none.
    pub checkpoint_tokens: usize,
    /// Which name its cached pages go under: the chain hash, or the next-token hash of a
    /// drafter's group (R37), whose page also depends on the token after the block.
    pub naming: PageNaming,
}

impl GroupPolicy {
    /// A full-attention group.
    #[cfg(feature = "internals")]
    pub const FULL: Self = Self {
        attention: Attention::FULL,
        keep_extra_tokens: 0,
        checkpoint_tokens: 0,
        naming: PageNaming::Chain,
    };

    /// A window group of `W` window tokens and `S` sinks, keeping `R` tokens more.
    #[cfg(feature = "internals")]
    pub const fn window(
        window_tokens: usize,
        sink_tokens: usize,
        keep_extra_tokens: usize,
    ) -> Self {
        Self {
            attention: Attention::window(window_tokens, sink_tokens),
            keep_extra_tokens,
            checkpoint_tokens: 0,
            naming: PageNaming::Chain,
        }
    }

    /// Whether this is a full-attention group.
    pub fn is_full(&self) -> bool {
        self.attention.kind == GroupKind::Full
    }
}

/// Why the cache refused an operation; each is a simulator bug, not a user error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvCacheError {
    /// A request needed more pages of a group than its quota (`kv_cache::K2`).
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
    /// A shared prefix was admitted whose pages are not all cached any more.
    #[error("the local match of {tokens} tokens is no longer cached")]
    SharedPrefixGone {
        /// The match that was asked for.
        tokens: usize,
    },
    /// A block below the local match needed a page the request does not share.
    #[error("block {block} of group index {group} is below the local match but not shared")]
    SharedPageMissing {
        /// Index of the group in layout order.
        group: usize,
        /// The block.
        block: usize,
    },
    /// A block a load reported filled must have filled has no page (or no hash): the
    /// page check could not look at it (`engine::E2`).
    #[error("block {block} of group index {group} was loaded but has no page to check")]
    LoadedPageMissing {
        /// Index of the group in layout order.
        group: usize,
        /// The block.
        block: usize,
    },
    /// The engine was about to write a cached page (`kv_cache::K5`).
    #[error("page {page} of group index {group} is cached and must not be written")]
    CachedPageWrite {
        /// Index of the group in layout order.
        group: usize,
        /// The page.
        page: u32,
    },
}

impl KvCacheError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::QuotaExceeded { .. } => "quota_exceeded",
            Self::NoRoom { .. } => "no_room",
            Self::BlockOutOfRange { .. } => "block_out_of_range",
            Self::SharedPrefixGone { .. } => "shared_prefix_gone",
            Self::SharedPageMissing { .. } => "shared_page_missing",
            Self::LoadedPageMissing { .. } => "loaded_page_missing",
            Self::CachedPageWrite { .. } => "cached_page_write",
        }
    }
}

/// The pages of one request: a table per group and its quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPages {
    /// Page index per block per group, `-1` where the group holds no page.
    tables: Vec<Vec<i32>>,
    /// Pages promised per group (`kv_cache::K2`).
    quota: Vec<u32>,
    /// Pages held per group (shared ones included).
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
}

/// A prompt's local match, as admission shares it: the names of the prompt's pages and
/// the block-aligned tokens served by cached pages (0: nothing shared).
#[derive(Clone, Copy, Debug)]
pub struct SharedPrefix<'a> {
    /// The names of the prompt's pages (R1, R37).
    pub hashes: &'a PromptHashes,
    /// Tokens of the match, a multiple of `T` ([`KvCache::local_match`]).
    pub tokens: usize,
}

impl SharedPrefix<'_> {
    /// No local match.
    #[cfg(feature = "internals")]
    pub fn none() -> SharedPrefix<'static> {
        static NONE: std::sync::LazyLock<PromptHashes> =
            std::sync::LazyLock::new(PromptHashes::default);
        SharedPrefix {
            hashes: &NONE,
            tokens: 0,
        }
    }
}

/// What [`KvCache::admit`] hands back.
#[derive(Debug)]
pub struct Admission {
    /// The request's pages.
    pub pages: RequestPages,
    /// `(group, page)` of every page allocated fresh (its bytes are whatever the last
    /// holder left: the engine writes the stale pattern). Shared pages are not listed.
    pub fresh: Vec<(usize, u32)>,
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
    /// KV tokens allocated past the prompt end and past each chunk end (a drafter's draft
    /// length; 0 without one).
    extra_tokens: usize,
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
                .map(|&policy| GroupPool::new(policy, num_pages))
                .collect(),
            tokens_per_block: tokens_per_block.max(1),
            max_chunk_tokens,
            num_pages,
            extra_tokens: 0,
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

    /// Pages a prompt of `prompt_len` tokens with a local match of `local_tokens` is promised per
    /// group: every block in a full group; in a window group the sinks, the kept range, one
    /// chunk and the windows of its checkpoints, plus one window when a local match is
    /// shared (`kv_cache::K2`). With extra tokens (a
    /// drafter) the blocks past the prompt end that they reach count too.
    pub fn quota_for(&self, prompt_len: usize, local_tokens: usize) -> Vec<u32> {
        let t = self.tokens_per_block;
        let blocks = blocks_for(prompt_len + self.extra_tokens, t);
        let extra_blocks = if self.extra_tokens > 0 {
            blocks_for(self.extra_tokens, t) + 1
        } else {
            0
        };
        self.groups
            .iter()
            .map(|group| {
                let keep_extra_tokens = group.policy.keep_extra_tokens;
                let checkpoints = prompt_len
                    .checked_div(group.policy.checkpoint_tokens)
                    .unwrap_or(0);
                let need = match group.policy.attention {
                    Attention {
                        kind: GroupKind::Full,
                        ..
                    } => blocks,
                    Attention {
                        kind: GroupKind::Window,
                        window_tokens,
                        sink_tokens,
                    } => {
                        let shared_window = if local_tokens > 0 {
                            blocks_for(window_tokens, t)
                        } else {
                            0
                        };
                        blocks_for(sink_tokens, t)
                            + blocks_for(window_tokens + keep_extra_tokens, t)
                            + blocks_for(self.max_chunk_tokens, t)
                            + 2
                            + shared_window
                            + extra_blocks
                            + checkpoints * (blocks_for(window_tokens, t) + 1)
                    }
                };
                u32::try_from(need.min(blocks)).unwrap_or(u32::MAX)
            })
            .collect()
    }

    /// Whether a prompt could ever be admitted (its quota fits an empty pool).
    pub fn fits_empty(&self, prompt_len: usize, local_tokens: usize) -> bool {
        self.quota_for(prompt_len, local_tokens)
            .iter()
            .all(|&quota| quota <= self.num_pages)
    }

    /// Whether a prompt can be admitted now.
    pub fn can_admit(&self, prompt_len: usize, local_tokens: usize) -> bool {
        self.quota_for(prompt_len, local_tokens)
            .iter()
            .zip(&self.groups)
            .all(|(&quota, group)| quota <= group.unpromised)
    }

    /// Admits a prompt: promises its quota, shares the cached pages of its local match
    /// (`shared`, as [`KvCache::local_match`] found it) and allocates every other
    /// full-group page (`kv_cache::K3`), evicting cached pages where no page is free.
    ///
    /// # Errors
    ///
    /// [`KvCacheError::NoRoom`] when a group lacks unpromised pages,
    /// [`KvCacheError::SharedPrefixGone`] when the match is no longer cached.
    pub fn admit(
        &mut self,
        prompt_len: usize,
        shared: SharedPrefix<'_>,
    ) -> Result<Admission, KvCacheError> {
        if !self.can_admit(prompt_len, shared.tokens) {
            return Err(KvCacheError::NoRoom { prompt_len });
        }
        if self.local_match(shared.hashes, prompt_len, shared.tokens) != shared.tokens {
            return Err(KvCacheError::SharedPrefixGone {
                tokens: shared.tokens,
            });
        }
        let blocks = blocks_for(prompt_len + self.extra_tokens, self.tokens_per_block);
        let mut pages = RequestPages {
            tables: vec![vec![-1; blocks]; self.groups.len()],
            held: vec![0; self.groups.len()],
            quota: self.quota_for(prompt_len, shared.tokens),
        };
        // Shared pages first: held, they can no longer be evicted by the allocations
        // (`kv_cache::K4`).
        for index in 0..self.groups.len() {
            for block in self.load_blocks(index, shared.tokens) {
                let naming = self.groups[index].policy.naming;
                let page = shared
                    .hashes
                    .get(naming, block)
                    .and_then(|hash| self.groups[index].share(hash))
                    .ok_or(KvCacheError::SharedPageMissing {
                        group: index,
                        block,
                    })?;
                pages.tables[index][block] = entry(page);
                pages.held[index] += 1;
            }
        }
        let mut fresh = Vec::new();
        for (index, group) in self.groups.iter_mut().enumerate() {
            group.unpromised -= pages.quota[index];
            if !group.policy.is_full() {
                continue;
            }
            for slot in pages.tables[index].iter_mut().filter(|slot| **slot < 0) {
                // The quota was checked against `unpromised`, which free and evictable
                // pages always cover (`kv_cache::K2`).
                if let Some(page) = group.take() {
                    *slot = entry(page);
                    pages.held[index] += 1;
                    fresh.push((index, page));
                }
            }
        }
        Ok(Admission { pages, fresh })
    }

    /// Makes sure `block` has a page in group `group`; returns the page if it was just
    /// allocated (its bytes are whatever the last holder left).
    ///
    /// # Errors
    ///
    /// [`KvCacheError::BlockOutOfRange`], or [`KvCacheError::QuotaExceeded`] (`kv_cache::K2`).
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
            .take()
            .ok_or(KvCacheError::QuotaExceeded { group, quota })?;
        *slot = entry(page);
        pages.held[group] += 1;
        Ok(Some(page))
    }

    /// Whether `page` of group `group` is cached (read-only, `kv_cache::K5`).
    pub fn is_cached(&self, group: usize, page: u32) -> bool {
        self.groups
            .get(group)
            .is_some_and(|pool| pool.is_cached(page))
    }

    /// Refuses a write to a cached page (`kv_cache::K5`).
    ///
    /// # Errors
    ///
    /// [`KvCacheError::CachedPageWrite`] when `page` is cached.
    pub fn ensure_writable(&self, group: usize, page: u32) -> Result<(), KvCacheError> {
        if self.is_cached(group, page) {
            return Err(KvCacheError::CachedPageWrite { group, page });
        }
        Ok(())
    }

    /// Gives up the request's page of `block` in group `group`, if held (a shared page
    /// stays with its other holders, or cached).
    pub fn drop_block(&mut self, pages: &mut RequestPages, group: usize, block: usize) {
        let Some(slot) = pages.tables.get_mut(group).and_then(|t| t.get_mut(block)) else {
            return;
        };
        if let Ok(page) = u32::try_from(*slot) {
            self.groups[group].put(page);
            pages.held[group] -= 1;
            *slot = -1;
        }
    }

    /// Gives up every window-group page of blocks `from_block..` (after a failed load
    /// resuming at `from_block`: the pages below it are the local match, still needed).
    pub fn drop_window_pages(&mut self, pages: &mut RequestPages, from_block: usize) {
        for group in 0..self.groups.len() {
            if !self.groups[group].policy.is_full() {
                for block in from_block..pages.tables[group].len() {
                    self.drop_block(pages, group, block);
                }
            }
        }
    }

    /// Gives up window-group pages that no token at or after `computed` reads (workflow 3).
    pub fn drop_out_of_window(&mut self, pages: &mut RequestPages, computed: usize) {
        let t = self.tokens_per_block;
        for group in 0..self.groups.len() {
            let GroupPolicy {
                attention:
                    Attention {
                        kind: GroupKind::Window,
                        window_tokens,
                        sink_tokens,
                    },
                keep_extra_tokens,
                checkpoint_tokens,
                ..
            } = self.groups[group].policy
            else {
                continue;
            };
            let keep_from = computed.saturating_sub(window_tokens + keep_extra_tokens);
            // Blocks ending at or before `keep_from` are out of the kept range.
            let dropped_end = keep_from / t;
            for block in blocks_for(sink_tokens, t)..dropped_end {
                // The first checkpoint after the block's start reads it if it lies within
                // `W` of the block's end (R28).
                let in_checkpoint = checkpoint_tokens > 0 && {
                    let next = (block * t / checkpoint_tokens + 1) * checkpoint_tokens;
                    next < (block + 1) * t + window_tokens
                };
                if !in_checkpoint {
                    self.drop_block(pages, group, block);
                }
            }
        }
    }

    /// Blocks of group `group` a request resuming at `resume` tokens needs (R15): every
    /// block before it in a full group; the sink blocks and the blocks overlapping
    /// `[resume - W, resume)` in a window group. A load fills them; a local match shares
    /// them.
    pub fn load_blocks(&self, group: usize, resume: usize) -> Vec<usize> {
        let t = self.tokens_per_block;
        let end = resume / t;
        match self.groups[group].policy.attention {
            Attention {
                kind: GroupKind::Full,
                ..
            } => (0..end).collect(),
            Attention {
                kind: GroupKind::Window,
                window_tokens,
                sink_tokens,
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

    /// Gives up every page of the request and gives its quota back (workflow 5). Cached
    /// pages nobody holds any more become evictable, tail blocks least recently used: a
    /// match starts at block 0, so a prompt's tail is worth less than its head.
    pub fn release(&mut self, pages: RequestPages) {
        let RequestPages { tables, quota, .. } = pages;
        for ((group, table), quota) in self.groups.iter_mut().zip(tables).zip(quota) {
            for page in table.into_iter().rev() {
                if let Ok(page) = u32::try_from(page) {
                    group.put(page);
                }
            }
            group.unpromised += quota;
        }
    }

    /// Free pages per group (for tests and reports).
    #[cfg(feature = "internals")]
    pub fn free_pages(&self) -> Vec<usize> {
        self.groups.iter().map(GroupPool::free_len).collect()
    }

    /// Cached pages nobody holds (evictable) per group.
    #[cfg(feature = "internals")]
    pub fn evictable_pages(&self) -> Vec<usize> {
        self.groups.iter().map(GroupPool::evictable_len).collect()
    }

    /// Table entries naming `page` of group `group` (for tests).
    #[cfg(feature = "internals")]
    pub fn holders(&self, group: usize, page: u32) -> u32 {
        self.groups.get(group).map_or(0, |pool| pool.holders(page))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::testkit::{admit, cache, compute, hashes, serve};
    use super::*;
    use crate::core::hash::BlockHash;

    #[test]
    fn admission_allocates_full_groups_and_promises_window_quota_k2_k3() -> Result<(), KvCacheError>
    {
        let mut cache = cache(100);
        // 1000 tokens: 63 blocks; window quota 1 + 4 + 2 + 2 = 9, plus a window (4) when a
        // local match is shared.
        assert_eq!(cache.quota_for(1000, 0), vec![63, 9]);
        assert_eq!(cache.quota_for(1000, 16), vec![63, 13]);
        let admission = cache.admit(1000, SharedPrefix::none())?;
        assert_eq!(admission.fresh.len(), 63);
        let pages = admission.pages;
        assert!(pages.tables()[0].iter().all(|&page| page >= 0));
        assert!(pages.tables()[1].iter().all(|&page| page == -1));
        assert_eq!(cache.free_pages(), vec![37, 100]);
        // 63 + 63 > 100: the second prompt waits.
        assert!(!cache.can_admit(1000, 0));
        assert_eq!(
            cache.admit(1000, SharedPrefix::none()).map(|a| a.fresh.len()),
            Err(KvCacheError::NoRoom { prompt_len: 1000 })
        );
        cache.release(pages);
        assert_eq!(cache.free_pages(), vec![100, 100]);
        assert!(cache.can_admit(1000, 0));
        Ok(())
    }

    #[test]
    fn window_pages_stay_within_quota_while_chunks_advance_k2() -> Result<(), KvCacheError> {
        let mut cache = cache(100);
        let mut pages = admit(&mut cache, 1000)?;
        let mut computed = 0;
        while computed < 1000 {
            let end = (computed + 32).min(1000);
            compute(&mut cache, &mut pages, computed, end)?;
            computed = end;
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
        let mut pages = admit(&mut cache, 1000)?;
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
    fn pages_are_never_shared_without_the_cache_k1() -> Result<(), KvCacheError> {
        let mut cache = KvCache::new(&[GroupPolicy::FULL], 10, 16, 32);
        let first = admit(&mut cache, 64)?;
        let second = admit(&mut cache, 64)?;
        let mut all: Vec<i32> = first.tables()[0]
            .iter()
            .chain(&second.tables()[0])
            .copied()
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 8);
        Ok(())
    }

    #[test]
    fn shared_pages_are_reference_counted_and_never_evicted_while_held_k4(
    ) -> Result<(), KvCacheError> {
        let mut cache = KvCache::new(&[GroupPolicy::FULL], 20, 16, 32);
        let served = serve(&mut cache, 1, 160)?;
        let shared = SharedPrefix {
            hashes: &served,
            tokens: 144,
        };
        let first = cache.admit(160, shared)?;
        let second = cache.admit(160, shared)?;
        // Each shares blocks 0..9 and gets a fresh page for block 9.
        assert_eq!((first.fresh.len(), second.fresh.len()), (1, 1));
        for block in 0..9 {
            assert_eq!(first.pages.page(0, block), second.pages.page(0, block));
            let page = first.pages.page(0, block).unwrap_or(u32::MAX);
            assert_eq!(cache.holders(0, page), 2);
        }
        assert_ne!(first.pages.page(0, 9), second.pages.page(0, 9));
        // 20 pages: 9 shared, 2 fresh, block 9 of the first prompt evictable, 8 free.
        assert_eq!(cache.evictable_pages(), vec![1]);
        assert_eq!(cache.free_pages(), vec![8]);
        cache.release(first.pages);
        for block in 0..9 {
            let page = second.pages.page(0, block).unwrap_or(u32::MAX);
            assert_eq!(cache.holders(0, page), 1, "block {block}");
        }
        // Taking every other page evicts only pages nobody holds.
        let filler = admit(&mut cache, 10 * 16)?;
        assert_eq!(cache.free_pages(), vec![0]);
        assert_eq!(cache.evictable_pages(), vec![0]);
        assert_eq!(cache.local_match(&served, 160, usize::MAX), 144);
        assert!(!cache.can_admit(16, 0));
        cache.release(filler);
        cache.release(second.pages);
        assert_eq!(cache.free_pages()[0] + cache.evictable_pages()[0], 20);
        Ok(())
    }

    #[test]
    fn cached_pages_are_read_only_and_a_gone_match_is_refused_k5() -> Result<(), KvCacheError> {
        let mut cache = KvCache::new(&[GroupPolicy::FULL], 4, 16, 32);
        let served = serve(&mut cache, 1, 64)?;
        let shared = SharedPrefix {
            hashes: &served,
            tokens: 48,
        };
        let admission = cache.admit(64, shared)?;
        let cached = admission.pages.page(0, 0).unwrap_or(u32::MAX);
        assert_eq!(
            cache.ensure_writable(0, cached),
            Err(KvCacheError::CachedPageWrite {
                group: 0,
                page: cached
            })
        );
        let (_, fresh) = admission.fresh[0];
        assert_eq!(cache.ensure_writable(0, fresh), Ok(()));
        cache.release(admission.pages);
        // Evict everything, then the old match cannot be admitted.
        let filler = admit(&mut cache, 64)?;
        cache.release(filler);
        assert_eq!(
            cache.admit(64, shared).map(|a| a.fresh.len()),
            Err(KvCacheError::SharedPrefixGone { tokens: 48 })
        );
        Ok(())
    }

    #[test]
    fn a_failed_load_keeps_the_window_pages_of_the_local_match() -> Result<(), KvCacheError> {
        let mut cache = cache(100);
        let served = serve(&mut cache, 1, 320)?;
        let next = hashes(1, 30);
        let mut pages = cache
            .admit(
                480,
                SharedPrefix {
                    hashes: &next,
                    tokens: 320,
                },
            )?
            .pages;
        // A load to 448 adds the window of 448: blocks 24..28 (the sink is shared).
        for block in cache.load_blocks(1, 448) {
            cache.ensure_block(&mut pages, 1, block)?;
        }
        cache.drop_window_pages(&mut pages, 320 / 16);
        let window: Vec<usize> = (0..30)
            .filter(|&block| pages.page(1, block).is_some())
            .collect();
        assert_eq!(window, vec![0, 16, 17, 18, 19]);
        assert_eq!(served.chain().len(), 20);
        cache.release(pages);
        Ok(())
    }

    /// One live request of the randomized test.
    struct Live {
        pages: RequestPages,
        hashes: PromptHashes,
        prompt_len: usize,
    }

    /// Checks `kv_cache::K1` and `kv_cache::K4` against the live requests' tables.
    fn check_pages(cache: &KvCache, live: &[Live], seed: u64) {
        for group in 0..2 {
            let mut holders: HashMap<u32, u32> = HashMap::new();
            for request in live {
                for &page in &request.pages.tables()[group] {
                    if let Ok(page) = u32::try_from(page) {
                        *holders.entry(page).or_default() += 1;
                    }
                }
            }
            for (&page, &count) in &holders {
                assert_eq!(cache.holders(group, page), count, "seed {seed:#x}");
                assert!(count == 1 || cache.is_cached(group, page), "seed {seed:#x}");
            }
            let total = cache.free_pages()[group] + cache.evictable_pages()[group] + holders.len();
            assert_eq!(total, 96, "seed {seed:#x}");
        }
    }

    #[test]
    fn randomized_sharing_keeps_content_and_page_counts_k1_k2_k4_k5() -> Result<(), KvCacheError> {
        const SEED: u64 = 0x10CA_1CAC;
        let policies = [GroupPolicy::FULL, GroupPolicy::window(64, 4, 32)];
        let mut cache = KvCache::new(&policies, 96, 16, 32);
        // What each page holds: the chain hash whose content was last written into it.
        let mut content: HashMap<(usize, u32), BlockHash> = HashMap::new();
        let mut live: Vec<Live> = Vec::new();
        let mut state = SEED;
        let mut next = |bound: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            usize::try_from(state >> 33).unwrap_or(0) % bound
        };
        let mut shared_tokens = 0;
        for _ in 0..400 {
            if live.len() >= 3 || (!live.is_empty() && next(3) == 0) {
                let request = live.swap_remove(next(live.len()));
                cache.publish(&request.pages, &request.hashes, request.prompt_len);
                cache.release(request.pages);
                check_pages(&cache, &live, SEED);
                continue;
            }
            let stream = u8::try_from(next(2)).unwrap_or(0);
            let prompt_len = 16 * (2 + next(30)) + next(16);
            let hashes = hashes(stream, prompt_len / 16);
            let local = cache.local_match(&hashes, prompt_len, usize::MAX);
            if !cache.can_admit(prompt_len, local) {
                continue;
            }
            let admission = cache.admit(
                prompt_len,
                SharedPrefix {
                    hashes: &hashes,
                    tokens: local,
                },
            )?;
            let mut pages = admission.pages;
            for (group, page) in admission.fresh {
                content.remove(&(group, page));
            }
            // The page check: every shared page holds its block's content.
            for group in 0..2 {
                for block in cache.load_blocks(group, local) {
                    let page = pages.page(group, block).unwrap_or(u32::MAX);
                    assert_eq!(content.get(&(group, page)), Some(&hashes.chain()[block]));
                }
            }
            shared_tokens += local;
            // Compute the rest chunk by chunk, writing each completed block (`kv_cache::K5`).
            let mut computed = local;
            while computed < prompt_len {
                let end = (computed + 32).min(prompt_len);
                for group in 0..2 {
                    for block in cache.chunk_blocks(&(computed..end)) {
                        if let Some(page) = cache.ensure_block(&mut pages, group, block)? {
                            content.remove(&(group, page));
                        }
                    }
                    let completed = hashes.chain().iter().enumerate().take(end / 16);
                    for (block, hash) in completed.skip(computed / 16) {
                        if let Some(page) = pages.page(group, block) {
                            cache.ensure_writable(group, page)?;
                            content.insert((group, page), *hash);
                        }
                    }
                }
                computed = end;
                cache.drop_out_of_window(&mut pages, computed);
            }
            live.push(Live {
                pages,
                hashes,
                prompt_len,
            });
            check_pages(&cache, &live, SEED);
        }
        assert!(shared_tokens > 10_000, "the test shares: {shared_tokens}");
        Ok(())
    }
}
