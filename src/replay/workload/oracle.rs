//! The oracle: what an unbounded prefix pool would reuse (the denominator of DESIGN section
//! 11's "share of what an unbounded pool could give").
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
//! Invariants:
//! - O1. Prefix semantics: block `i` counts only if blocks `0..i` all count; the first
//!   unseen hash ends the reusable prefix, whatever follows it.
//! - O2. The engine always computes the last prompt token, so at most
//!   `floor((prompt_len - 1) / T)` blocks are reusable; a prompt of 0 tokens reuses 0.
//! - O3. Reusable tokens are a whole number of blocks, never more than `prompt_len - 1`.
//! - O4. The pool never forgets: a hash observed once stays reusable.

use std::collections::HashSet;

use crate::core::hash::BlockHash;

/// An unbounded prefix pool, keeping only the hashes it has seen.
#[derive(Clone, Debug, Default)]
pub struct Oracle {
    /// Every chain hash observed so far (O4); 16 bytes each, ~4 M blocks for the shared
    /// trace at `T = 16`.
    seen: HashSet<BlockHash>,
    /// Running totals of [`Oracle::admit`].
    totals: OracleTotals,
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
            totals: OracleTotals::default(),
        }
    }

    /// Tokens of a prompt an unbounded pool would reuse (O1..O3). `hashes` are the chain
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

    /// Remembers every hash of a prompt (O4).
    pub fn observe(&mut self, hashes: &[BlockHash]) {
        self.seen.extend(hashes.iter().copied());
    }

    /// [`Self::reusable_tokens`], then [`Self::observe`], adding the prompt to the totals;
    /// returns the reusable tokens.
    pub fn admit(
        &mut self,
        hashes: &[BlockHash],
        prompt_len: usize,
        tokens_per_block: usize,
    ) -> usize {
        let reusable = self.reusable_tokens(hashes, prompt_len, tokens_per_block);
        self.observe(hashes);
        self.totals.prompts += 1;
        self.totals.prompt_tokens += u64::try_from(prompt_len).unwrap_or(u64::MAX);
        self.totals.reusable_tokens += u64::try_from(reusable).unwrap_or(u64::MAX);
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
            }
        );
        assert!((totals.reusable_share() - 80.0 / 140.0).abs() < 1e-12);
        assert!(Oracle::new().totals().reusable_share().abs() < f64::EPSILON);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(0x0_0ac1e), ..ProptestConfig::default() })]

        /// O1..O3 against a naive model: count leading seen hashes up to the cap.
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
