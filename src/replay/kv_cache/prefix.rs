//! The local prefix cache's side of [`KvCache`]: finding a prompt's local match, keeping
//! it recently used while the request waits, and caching a finished request's blocks
//! (the rules are in the parent module's docs, "Local prefix cache").

use crate::core::page_names::PromptHashes;

use super::{KvCache, RequestPages, SharedPrefix};

impl KvCache {
    /// The local match of a prompt: the largest block-aligned `e <= cap_tokens` whose
    /// blocks every group holds in the cache (`kv_cache` docs: every block before `e` in a
    /// full group; the sinks and the window of `e` in a window group). Never reaches the
    /// block holding the last prompt token; 0 when nothing matches.
    pub fn local_match(&self, hashes: &PromptHashes, prompt_len: usize, cap_tokens: usize) -> usize {
        let t = self.tokens_per_block;
        let mut end = (prompt_len.saturating_sub(1) / t)
            .min(hashes.chain().len())
            .min(cap_tokens / t);
        for group in &self.groups {
            if group.policy.is_full() {
                let names = hashes.names(group.policy.naming);
                end = names[..end.min(names.len())]
                    .iter()
                    .take_while(|hash| group.contains(hash))
                    .count();
            }
        }
        'walk: while end > 0 {
            for (index, group) in self.groups.iter().enumerate() {
                if group.policy.is_full() {
                    continue;
                }
                let missing = self
                    .load_blocks(index, end * t)
                    .into_iter()
                    .rev()
                    .find(|&block| {
                        hashes
                            .get(group.policy.naming, block)
                            .is_none_or(|hash| !group.contains(hash))
                    });
                if let Some(block) = missing {
                    // Every end in (block, end] needs `block` too: it is a sink below that
                    // end, or inside that end's window.
                    end = block;
                    continue 'walk;
                }
            }
            return end * t;
        }
        0
    }

    /// Marks the cached pages of a local match most recently used (a waiting request will
    /// share them), head blocks newest so that a tail is evicted before its head.
    pub fn touch_match(&mut self, shared: SharedPrefix<'_>) {
        for index in 0..self.groups.len() {
            let naming = self.groups[index].policy.naming;
            for block in self.load_blocks(index, shared.tokens).into_iter().rev() {
                if let Some(hash) = shared.hashes.get(naming, block) {
                    self.groups[index].touch(hash);
                }
            }
        }
    }

    /// Caches the pages of a finished request's computed full blocks under their chain
    /// hashes, in every group that holds them (workflow 4); blocks already cached keep
    /// their page. Returns how many pages were newly cached.
    pub fn publish(
        &mut self,
        pages: &RequestPages,
        hashes: &PromptHashes,
        computed_tokens: usize,
    ) -> usize {
        let blocks = computed_tokens / self.tokens_per_block;
        let mut cached = 0;
        for (group, table) in self.groups.iter_mut().zip(&pages.tables) {
            let names = hashes.names(group.policy.naming);
            for (hash, &page) in names.iter().zip(table).take(blocks) {
                if let Ok(page) = u32::try_from(page) {
                    cached += usize::from(group.register(*hash, page));
                }
            }
        }
        cached
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{admit, cache, hash, hashes, serve};
    use super::super::{GroupPolicy, KvCacheError};
    use super::*;

    #[test]
    fn a_finished_prompt_is_matched_by_whole_blocks_before_the_last_token(
    ) -> Result<(), KvCacheError> {
        let mut cache = KvCache::new(&[GroupPolicy::FULL], 100, 16, 32);
        let served = serve(&mut cache, 1, 160)?;
        assert_eq!(cache.free_pages(), vec![90]);
        assert_eq!(cache.evictable_pages(), vec![10]);
        // The same prompt: block 9 holds its last token, so 9 blocks match.
        assert_eq!(cache.local_match(&served, 160, usize::MAX), 144);
        // A longer prompt starting with it matches all 10 cached blocks.
        let mut longer = served.chain().to_vec();
        longer.extend([hash(1, 10), hash(1, 11)]);
        let longer = PromptHashes::from(longer);
        assert_eq!(cache.local_match(&longer, 200, usize::MAX), 160);
        // A prompt that diverges at block 4 matches 4 blocks; a cap cuts to whole blocks.
        let mut diverging = served.chain().to_vec();
        diverging[4] = hash(2, 4);
        let diverging = PromptHashes::from(diverging);
        assert_eq!(cache.local_match(&diverging, 200, usize::MAX), 64);
        assert_eq!(cache.local_match(&longer, 200, 50), 48);
        assert_eq!(cache.local_match(&hashes(3, 10), 200, usize::MAX), 0);
        Ok(())
    }

    #[test]
    fn eviction_takes_the_least_recently_used_prompt_tail_first() -> Result<(), KvCacheError> {
        let mut cache = KvCache::new(&[GroupPolicy::FULL], 12, 16, 32);
        let first = serve(&mut cache, 1, 64)?;
        let second = serve(&mut cache, 2, 64)?;
        assert_eq!(cache.local_match(&first, 65, usize::MAX), 64);
        assert_eq!(cache.local_match(&second, 65, usize::MAX), 64);
        // Six pages for a third prompt: four free ones, then the least recently used
        // cached pages, a prompt's tail first: the first prompt's blocks 3 and 2.
        let third = admit(&mut cache, 96)?;
        assert_eq!(cache.local_match(&first, 65, usize::MAX), 32);
        assert_eq!(cache.local_match(&second, 65, usize::MAX), 64);
        cache.release(third);
        // A waiting request matched the first prompt's head: the second prompt goes first.
        cache.touch_match(SharedPrefix {
            hashes: &first,
            tokens: 32,
        });
        let fourth = admit(&mut cache, 144)?;
        assert_eq!(cache.local_match(&first, 65, usize::MAX), 32);
        assert_eq!(cache.local_match(&second, 65, usize::MAX), 16);
        cache.release(fourth);
        Ok(())
    }

    #[test]
    fn a_hybrid_match_needs_the_sinks_and_window_of_its_resume_point() -> Result<(), KvCacheError> {
        // R = 0: a finished 320-token prompt keeps window blocks 16..20 and sink block 0.
        let mut cache = cache(100);
        let served = serve(&mut cache, 1, 320)?;
        assert_eq!(cache.evictable_pages(), vec![20, 5]);
        // A next turn extending it resumes at 320: window [256, 320) is cached.
        let next = hashes(1, 25);
        assert_eq!(cache.local_match(&next, 400, usize::MAX), 320);
        // The same prompt again may not resume at 320 (its last token); at 304 the window
        // needs block 15, gone; walking back, only e = 16 (the sink block) is complete.
        assert_eq!(cache.local_match(&served, 320, usize::MAX), 16);
        // Keeping R = 32 tokens more keeps blocks 14..20: e = 304 is complete.
        let policies = [GroupPolicy::FULL, GroupPolicy::window(64, 4, 32)];
        let mut rewind = KvCache::new(&policies, 100, 16, 32);
        let served = serve(&mut rewind, 1, 320)?;
        assert_eq!(rewind.local_match(&served, 320, usize::MAX), 304);
        // Sharing it takes exactly the sinks and the window of 304.
        let admission = rewind.admit(
            320,
            SharedPrefix {
                hashes: &served,
                tokens: 304,
            },
        )?;
        let window: Vec<usize> = (0..20)
            .filter(|&block| admission.pages.page(1, block).is_some())
            .collect();
        assert_eq!(window, vec![0, 15, 16, 17, 18]);
        assert_eq!(rewind.quota_for(320, 304)[1], admission.pages.quota[1]);
        Ok(())
    }
}
