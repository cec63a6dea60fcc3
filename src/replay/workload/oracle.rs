//! The oracle: what an unbounded prefix pool would reuse (the denominator of the "share of
//! what an unbounded pool could have given" in `docs/DESIGN.md` section 11).
//!
//! Workflow, for each prompt in arrival order:
//! 1. hash the prompt's full blocks into a chain (R1); a chain hash identifies the whole
//!    prefix up to and including its block;
//! 2. [`Oracle::reusable_tokens`]: the longest run of leading hashes already seen, in tokens,
//!    capped so that the block holding the last prompt token is never reused;
//! 3. [`Oracle::observe`]: remember every hash of the prompt for later prompts.
//!
//! [`Oracle::admit`] does steps 2 and 3 and keeps running totals.
//!
//! Window oracle (layouts with a window group, [`Oracle::with_window_rewind`]): window
//! groups are stored only at prompt ends (R17), so a resume point `e` (a block boundary at
//! most the full-attention hit) counts only if some earlier prompt sharing the prefix
//! through `e` ended within `[e, e + R]` (its window tail was saved there). The window-reusable tokens of a prompt are the largest such `e`, whatever lies
//! between it and the hit (the planner's walk plus fallback, R12/R13). For every full
//! block ending within `R` of its prompt's end, the oracle keeps the shortest prompt
//! that holds it: a later `e` qualifies iff that prompt ended by `e + R` (every prompt
//! holding the block through `e` ended at or after `e`). `scripts/window-oracle` computes
//! the same figure from the trace file ("window" columns); the two agree on the shared
//! trace.
//!
//! Invariants:
//! - `oracle::O1`. Prefix semantics: block `i` counts only if blocks `0..i` all count; the first
//!   unseen hash ends the reusable prefix, whatever follows it.
//! - `oracle::O2`. The engine always computes the last prompt token, so at most
//!   `floor((prompt_len - 1) / T)` blocks are reusable; a prompt of 0 tokens reuses 0.
//! - `oracle::O3`. Reusable tokens are a whole number of blocks, never more than `prompt_len - 1`.
//! - `oracle::O4`. The pool never forgets: a hash observed once stays reusable.
//! - `oracle::O5`. Window-reusable tokens never exceed reusable tokens, and equal them when the
//!   layout has no window group.

use std::collections::{HashMap, HashSet};

use crate::core::hash::BlockHash;

/// An unbounded prefix pool, keeping only the hashes it has seen.
#[derive(Clone, Debug, Default)]
pub struct Oracle {
    /// Every chain hash observed so far (`oracle::O4`); 16 bytes each, ~4 M blocks for the shared
    /// trace at `T = 16`.
    seen: HashSet<BlockHash>,
    /// Running totals of [`Oracle::admit`].
    totals: OracleTotals,
    /// `R`, when the layout has a window group (module docs); `None` for full attention.
    window_rewind_tokens: Option<usize>,
    /// Per chain hash of a block ending within `R` of its prompt's end: the shortest such
    /// prompt's length.
    shortest_end: HashMap<BlockHash, usize>,
}

/// Running totals of the prompts given to [`Oracle::admit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OracleTotals {
    /// Prompts admitted.
    pub prompts: u64,
    /// Sum of their lengths.
    pub prompt_tokens: u64,
    /// Sum of their reusable tokens.
    pub reusable_tokens: u64,
    /// Sum of their window-reusable tokens (module docs); `reusable_tokens` for a
    /// full-attention layout (`oracle::O5`).
    pub window_reusable_tokens: u64,
}

impl OracleTotals {
    /// Reusable tokens as a share of prompt tokens, in `[0, 1]`; 0 before any prompt.
    #[expect(
        clippy::cast_precision_loss,
        reason = "a ratio for reports; token counts far below 2^52 are exact"
    )]
    pub fn reusable_share(&self) -> f64 {
        if self.prompt_tokens == 0 {
            return 0.0;
        }
        self.reusable_tokens as f64 / self.prompt_tokens as f64
    }
}

impl Oracle {
    /// An empty pool.
    pub fn new() -> Self {
        Oracle::default()
    }

    /// An empty pool with room for `blocks` hashes.
    pub fn with_capacity(blocks: usize) -> Self {
        Oracle {
            seen: HashSet::with_capacity(blocks),
            ..Oracle::default()
        }
    }

    /// An empty pool for a layout with window groups stored at prompt ends with rewind
    /// `rewind_tokens` (module docs).
    pub fn with_window_rewind(rewind_tokens: usize) -> Self {
        Oracle {
            window_rewind_tokens: Some(rewind_tokens),
            ..Oracle::default()
        }
    }

    /// Tokens of a prompt an unbounded pool holding window groups only at prompt ends
    /// would reuse: the largest block boundary `e <= reusable` (the prompt's
    /// [`Self::reusable_tokens`]) that an earlier prompt sharing the prefix through `e`
    /// ended within `[e, e + R]` of. Equals `reusable` without a window group (`oracle::O5`).
    pub fn window_reusable_tokens(
        &self,
        hashes: &[BlockHash],
        reusable: usize,
        tokens_per_block: usize,
    ) -> usize {
        let Some(rewind) = self.window_rewind_tokens else {
            return reusable;
        };
        let Some(hit_blocks) = reusable.checked_div(tokens_per_block) else {
            return 0;
        };
        (1..=hit_blocks.min(hashes.len()))
            .rev()
            .map(|blocks| blocks * tokens_per_block)
            .find(|&end| {
                self.shortest_end
                    .get(&hashes[end / tokens_per_block - 1])
                    .is_some_and(|&prompt_end| prompt_end <= end + rewind)
            })
            .unwrap_or(0)
    }

    /// Remembers the blocks of a prompt ending within `R` of its end (window oracle).
    fn observe_end(&mut self, hashes: &[BlockHash], prompt_len: usize, tokens_per_block: usize) {
        let Some(rewind) = self.window_rewind_tokens else {
            return;
        };
        let full_blocks = hashes.len().min(prompt_len / tokens_per_block.max(1));
        for (block, hash) in hashes.iter().enumerate().take(full_blocks) {
            if (block + 1) * tokens_per_block + rewind >= prompt_len {
                let shortest = self.shortest_end.entry(*hash).or_insert(prompt_len);
                *shortest = (*shortest).min(prompt_len);
            }
        }
    }

    /// Tokens of a prompt an unbounded pool would reuse (`oracle::O1`..O3). `hashes` are the chain
    /// hashes of the prompt's full blocks of `tokens_per_block` tokens, in order; extra
    /// hashes beyond the cap are ignored. A `tokens_per_block` of 0 reuses nothing.
    pub fn reusable_tokens(
        &self,
        hashes: &[BlockHash],
        prompt_len: usize,
        tokens_per_block: usize,
    ) -> usize {
        let Some(max_blocks) = prompt_len.saturating_sub(1).checked_div(tokens_per_block) else {
            return 0;
        };
        let blocks = hashes
            .iter()
            .take(max_blocks)
            .take_while(|hash| self.seen.contains(hash))
            .count();
        blocks * tokens_per_block
    }

    /// Remembers every hash of a prompt (`oracle::O4`).
    pub fn observe(&mut self, hashes: &[BlockHash]) {
        self.seen.extend(hashes.iter().copied());
    }

    /// [`Self::reusable_tokens`] and [`Self::window_reusable_tokens`], then
    /// [`Self::observe`], adding the prompt to the totals; returns the reusable tokens.
    pub fn admit(
        &mut self,
        hashes: &[BlockHash],
        prompt_len: usize,
        tokens_per_block: usize,
    ) -> usize {
        let reusable = self.reusable_tokens(hashes, prompt_len, tokens_per_block);
        let window_reusable = self.window_reusable_tokens(hashes, reusable, tokens_per_block);
        self.observe(hashes);
        self.observe_end(hashes, prompt_len, tokens_per_block);
        self.totals.prompts += 1;
        self.totals.prompt_tokens += u64::try_from(prompt_len).unwrap_or(u64::MAX);
        self.totals.reusable_tokens += u64::try_from(reusable).unwrap_or(u64::MAX);
        self.totals.window_reusable_tokens += u64::try_from(window_reusable).unwrap_or(u64::MAX);
        reusable
    }

    /// Totals of the prompts admitted so far.
    pub fn totals(&self) -> OracleTotals {
        self.totals
    }

    /// Distinct hashes seen.
    pub fn seen_blocks(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn hash(byte: u8) -> BlockHash {
        BlockHash([byte; 16])
    }

    fn hashes(bytes: &[u8]) -> Vec<BlockHash> {
        bytes.iter().copied().map(hash).collect()
    }

    #[test]
    fn an_empty_pool_reuses_nothing() {
        let oracle = Oracle::new();
        assert_eq!(oracle.reusable_tokens(&hashes(&[1, 2, 3]), 64, 16), 0);
    }

    #[test]
    fn o1_a_block_counts_only_after_a_seen_prefix() {
        let mut oracle = Oracle::new();
        oracle.observe(&hashes(&[1, 2, 3, 4]));
        assert_eq!(oracle.reusable_tokens(&hashes(&[1, 2, 9, 4]), 100, 16), 32);
        assert_eq!(oracle.reusable_tokens(&hashes(&[9, 2, 3, 4]), 100, 16), 0);
        assert_eq!(
            oracle.reusable_tokens(&hashes(&[1, 2, 3, 4, 5]), 100, 16),
            64
        );
    }

    #[test]
    fn o2_the_block_with_the_last_token_is_never_reused() {
        let mut oracle = Oracle::new();
        oracle.observe(&hashes(&[1, 2, 3, 4]));
        let four = hashes(&[1, 2, 3, 4]);
        // 64 tokens = 4 full blocks: the last token lies in block 3, so 3 blocks at most.
        assert_eq!(oracle.reusable_tokens(&four, 64, 16), 48);
        // 65 tokens: the last token starts block 4, so all 4 full blocks are reusable.
        assert_eq!(oracle.reusable_tokens(&four, 65, 16), 64);
        assert_eq!(oracle.reusable_tokens(&four, 49, 16), 48);
        assert_eq!(oracle.reusable_tokens(&four, 48, 16), 32);
        assert_eq!(oracle.reusable_tokens(&four, 1, 16), 0);
        assert_eq!(oracle.reusable_tokens(&four, 0, 16), 0);
        assert_eq!(oracle.reusable_tokens(&four, 65, 0), 0);
    }

    #[test]
    fn admit_reuses_only_earlier_prompts_and_sums_totals() {
        let mut oracle = Oracle::with_capacity(8);
        assert_eq!(oracle.admit(&hashes(&[1, 2]), 40, 16), 0);
        assert_eq!(oracle.admit(&hashes(&[1, 2, 3]), 50, 16), 32);
        assert_eq!(oracle.admit(&hashes(&[1, 2, 3]), 50, 16), 48);
        assert_eq!(oracle.seen_blocks(), 3);
        let totals = oracle.totals();
        assert_eq!(
            totals,
            OracleTotals {
                prompts: 3,
                prompt_tokens: 140,
                reusable_tokens: 80,
                window_reusable_tokens: 80,
            }
        );
        assert!((totals.reusable_share() - 80.0 / 140.0).abs() < 1e-12);
        assert!(Oracle::new().totals().reusable_share().abs() < f64::EPSILON);
    }

    /// X = blocks 1..=4 (64 tokens), A extends it to 200 tokens (blocks 1..=12), B shares
    /// A's first 10 blocks and diverges: `H` = 160 tokens.
    fn window_scenario(rewind: usize) -> (usize, OracleTotals) {
        let mut oracle = Oracle::with_window_rewind(rewind);
        let x: Vec<u8> = (1..=4).collect();
        let a: Vec<u8> = (1..=12).collect();
        let mut b: Vec<u8> = (1..=10).collect();
        b.extend(50..60);
        oracle.admit(&hashes(&x), 64, 16);
        oracle.admit(&hashes(&a), 200, 16);
        let reusable = oracle.reusable_tokens(&hashes(&b), 330, 16);
        let window = oracle.window_reusable_tokens(&hashes(&b), reusable, 16);
        assert_eq!(reusable, 160);
        oracle.admit(&hashes(&b), 330, 16);
        (window, oracle.totals())
    }

    #[test]
    fn o5_a_resume_point_needs_an_earlier_prompt_end_within_the_rewind() {
        // A ended at 200 <= 160 + 64: B resumes at its full hit.
        let (window, totals) = window_scenario(64);
        assert_eq!(window, 160);
        // A ended 40 tokens past e = 160 > R = 16; only X's end at 64 serves a window.
        let (window, totals_short) = window_scenario(16);
        assert_eq!(window, 64);
        // A reuses X's 4 blocks in both (X ended exactly at e = 64).
        assert_eq!(totals.reusable_tokens, 64 + 160);
        assert_eq!(totals.window_reusable_tokens, 64 + 160);
        assert_eq!(totals_short.window_reusable_tokens, 64 + 64);
        // R = 0 still counts a prompt ending exactly at the block boundary (X).
        assert_eq!(window_scenario(0).0, 64);
    }

    #[test]
    fn o5_the_window_oracle_is_the_full_oracle_without_window_groups() {
        let mut oracle = Oracle::new();
        oracle.admit(&hashes(&[1, 2, 3, 4, 5, 6]), 100, 16);
        let reused = oracle.admit(&hashes(&[1, 2, 3, 9]), 70, 16);
        assert_eq!(reused, 48);
        let totals = oracle.totals();
        assert_eq!(totals.window_reusable_tokens, totals.reusable_tokens);
        assert_eq!(oracle.window_reusable_tokens(&hashes(&[1, 2]), 32, 16), 32);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(0x0_0ac1e), ..ProptestConfig::default() })]

        /// `oracle::O1`..O3 against a naive model: count leading seen hashes up to the cap.
        #[test]
        fn reusable_tokens_match_a_naive_model(
            earlier in proptest::collection::vec(proptest::collection::vec(0u8..6, 0..8), 0..5),
            prompt in proptest::collection::vec(0u8..6, 0..8),
            extra_tokens in 0usize..40,
            tokens_per_block in 1usize..20,
        ) {
            let mut oracle = Oracle::new();
            let mut seen = Vec::new();
            for bytes in &earlier {
                oracle.observe(&hashes(bytes));
                seen.extend_from_slice(bytes);
            }
            let prompt_len = prompt.len() * tokens_per_block + extra_tokens % tokens_per_block;
            let cap = prompt_len.saturating_sub(1) / tokens_per_block;
            let mut blocks = 0;
            while blocks < cap.min(prompt.len()) && seen.contains(&prompt[blocks]) {
                blocks += 1;
            }
            let reusable = oracle.reusable_tokens(&hashes(&prompt), prompt_len, tokens_per_block);
            prop_assert_eq!(reusable, blocks * tokens_per_block);
            prop_assert!(reusable < prompt_len.max(1));
        }
    }
}
