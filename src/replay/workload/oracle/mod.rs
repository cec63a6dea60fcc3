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
//! Window oracles (layouts with a window group, [`Oracle::with_window`]): a resume point `e`
//! (a block boundary at most the full-attention hit) counts only if the window groups' pages
//! of `e`'s window were stored. Two are computed in one pass:
//!
//! - the prompt-end window oracle: window groups are stored at prompt ends (R17), so `e`
//!   counts only if some earlier prompt sharing the prefix through `e` ended within
//!   `[e, e + R]` (its window tail was saved there). For every full block ending within `R`
//!   of its prompt's end, the oracle keeps the shortest prompt that holds it: a later `e`
//!   qualifies iff that prompt ended by `e + R` (every prompt holding the block through `e`
//!   ended at or after `e`). `scripts/window-oracle` computes the same figure from the trace
//!   file ("window" columns); the two agree on the shared trace.
//! - the checkpoint window oracle: window checkpoints every `I` tokens (R28) also store the
//!   window of every positive multiple `c` of `I` a prompt computes through, so `e` also
//!   counts when it is such a `c` and an earlier prompt shares the prefix through `e` (so
//!   its length is at least `e`). Every block boundary up to the full-attention hit has a
//!   seen chain hash, so some earlier prompt held that prefix, and the first such prompt
//!   computed through `e` itself (no earlier prompt held it to load from): the largest
//!   block-aligned multiple of `I` at most the hit always counts.
//!
//! The window-reusable tokens of a prompt are the largest such `e`, whatever lies between
//! it and the hit (the planner's walk plus fallback, R12/R13).
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
//! - `oracle::O6`. Checkpoint-window-reusable tokens lie between the window-reusable and the
//!   reusable tokens; they equal the window-reusable tokens with checkpoints off and the
//!   reusable tokens without a window group.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;

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
    /// `I`, the window checkpoint interval (R28); `None` when checkpoints are off or the
    /// layout has no window group.
    window_checkpoint_tokens: Option<NonZeroUsize>,
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
    /// Sum of their window-reusable tokens at prompt ends (module docs); `reusable_tokens`
    /// for a full-attention layout (`oracle::O5`).
    pub window_reusable_tokens: u64,
    /// Sum of their window-reusable tokens at prompt ends and window checkpoints (module
    /// docs); between the two above (`oracle::O6`).
    pub window_checkpoint_reusable_tokens: u64,
}

impl OracleTotals {
    /// Reusable tokens as a share of prompt tokens, in `[0, 1]`; 0 before any prompt.
    #[expect(
        clippy::cast_precision_loss,
        reason = "a ratio for reports; token counts far below 2^52 are exact"
    )]
    #[cfg(feature = "internals")]
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
    #[cfg(feature = "internals")]
    pub fn with_capacity(blocks: usize) -> Self {
        Oracle {
            seen: HashSet::with_capacity(blocks),
            ..Oracle::default()
        }
    }

    /// An empty pool for a layout with window groups stored at prompt ends with rewind
    /// `rewind_tokens`, without window checkpoints (module docs).
    #[cfg(feature = "internals")]
    pub fn with_window_rewind(rewind_tokens: usize) -> Self {
        Oracle::with_window(rewind_tokens, None)
    }

    /// An empty pool for a layout with window groups stored at prompt ends with rewind
    /// `rewind_tokens` and, when `checkpoint_tokens` is given, at every multiple of it a
    /// prompt computes through (R28; module docs).
    pub fn with_window(rewind_tokens: usize, checkpoint_tokens: Option<NonZeroUsize>) -> Self {
        Oracle {
            window_rewind_tokens: Some(rewind_tokens),
            window_checkpoint_tokens: checkpoint_tokens,
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

    /// Tokens of a prompt an unbounded pool holding window groups at prompt ends and at
    /// window checkpoints would reuse: the larger of `window_reusable` (the prompt's
    /// [`Self::window_reusable_tokens`]) and the largest positive multiple of `I` that is a
    /// block boundary at most `reusable` (the prompt's [`Self::reusable_tokens`], whose
    /// blocks all were seen; module docs). `window_reusable` with checkpoints off,
    /// `reusable` without a window group (`oracle::O6`).
    pub fn window_checkpoint_reusable_tokens(
        &self,
        reusable: usize,
        window_reusable: usize,
        tokens_per_block: usize,
    ) -> usize {
        if self.window_rewind_tokens.is_none() {
            return reusable;
        }
        let Some(interval) = self.window_checkpoint_tokens else {
            return window_reusable;
        };
        let Some(step) = least_common_multiple(interval.get(), tokens_per_block) else {
            return window_reusable;
        };
        window_reusable.max(reusable / step * step)
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

    /// [`Self::reusable_tokens`], [`Self::window_reusable_tokens`] and
    /// [`Self::window_checkpoint_reusable_tokens`], then [`Self::observe`], adding the prompt
    /// to the totals; returns the reusable tokens.
    pub fn admit(
        &mut self,
        hashes: &[BlockHash],
        prompt_len: usize,
        tokens_per_block: usize,
    ) -> usize {
        let reusable = self.reusable_tokens(hashes, prompt_len, tokens_per_block);
        let window_reusable = self.window_reusable_tokens(hashes, reusable, tokens_per_block);
        let checkpoint_reusable =
            self.window_checkpoint_reusable_tokens(reusable, window_reusable, tokens_per_block);
        debug_assert!(
            window_reusable <= checkpoint_reusable && checkpoint_reusable <= reusable,
            "oracle::O6"
        );
        self.observe(hashes);
        self.observe_end(hashes, prompt_len, tokens_per_block);
        let tokens = |count: usize| u64::try_from(count).unwrap_or(u64::MAX);
        self.totals.prompts += 1;
        self.totals.prompt_tokens += tokens(prompt_len);
        self.totals.reusable_tokens += tokens(reusable);
        self.totals.window_reusable_tokens += tokens(window_reusable);
        self.totals.window_checkpoint_reusable_tokens += tokens(checkpoint_reusable);
        reusable
    }

    /// Totals of the prompts admitted so far.
    pub fn totals(&self) -> OracleTotals {
        self.totals
    }

    /// Distinct hashes seen.
    #[cfg(feature = "internals")]
    pub fn seen_blocks(&self) -> usize {
        self.seen.len()
    }
}

/// The least common multiple of two positive numbers; `None` when either is 0 or it
/// overflows. The checkpoint interval is a multiple of `T` in a validated setup, so this is
/// usually the interval itself.
fn least_common_multiple(left: usize, right: usize) -> Option<usize> {
    let (mut a, mut b) = (left, right);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    (left / a.max(1)).checked_mul(right).filter(|&lcm| lcm > 0)
}

#[cfg(test)]
mod tests;
