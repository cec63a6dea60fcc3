//! The simulated drafter: an EAGLE-style hidden-state drafter that proposes `k` draft
//! tokens after the prompt's last chunk (`docs/DESIGN.md` section 11; R16, R18).
//!
//! What it changes in the engine (the cache side is `kv_cache`'s `draft` module):
//! 1. the KV cache reserves `k` extra tokens past the prompt end and past every chunk end;
//!    after each chunk the pages those tokens reach are allocated and hold the stale
//!    pattern, so a connector that published past the chunk end (R16) would publish
//!    detectably wrong bytes;
//! 2. at the prompt's last chunk the drafter writes its `k` draft tokens into the pages of
//!    the blocks overlapping `[P, P + k)` (the generation pages, and the prompt's partial
//!    last block): they hold the draft pattern, which is never a computed block's content;
//! 3. after `on_step` the target verifies the drafts: each is accepted with probability
//!    `acceptance`, in order, until the first rejection (a deterministic draw per request
//!    and position); the pages holding only rejected tokens are rewound (given back);
//! 4. decoding on the generation stage advances `1 + accepted` tokens per step on average
//!    ([`DrafterSetup::tokens_per_step`]), which shortens the time to the next turn.
//!
//! Draft-model layer groups (layouts with `role = "draft"` groups) are computed with every
//! chunk like the target's and saved and loaded like them; this module only adds the draft
//! tokens.
//!
//! Invariants:
//! - `engine::draft::F1`. The drafter never writes a page of a full prompt block: drafts start at
//!   `P`, and a full block ends at or before `P`.
//! - `engine::draft::F2`. Rewinding never gives back a page holding a prompt token
//!   (`kv_cache::draft::X1`).
//! - `engine::draft::F3`. The same request id gives the same accepted count in every run
//!   (`engine::E4`).

use xxhash_rust::xxh3::xxh3_64;

use crate::core::ids::RequestId;

use super::Engine;
use crate::replay::error::ReplayError;

/// The drafter's settings (`kv-connector replay --drafter`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DrafterSetup {
    /// `k`: draft tokens per step, the extra KV tokens the cache allocates (at least 1).
    pub draft_tokens: usize,
    /// Probability that one draft token is accepted, given that the ones before it were
    /// (0 to 1).
    pub acceptance: f64,
}

impl DrafterSetup {
    /// Draft tokens the target accepts for `request` (`engine::draft::F3`): the leading run of
    /// accepted positions, each accepted when its draw falls below `acceptance`.
    pub fn accepted(&self, request: RequestId) -> usize {
        (0..self.draft_tokens)
            .take_while(|&position| unit_draw(request, position) < self.acceptance)
            .count()
    }

    /// Expected tokens one decode step advances: the target's token plus the expected run
    /// of accepted drafts, `1 + a + a^2 + ... + a^k`.
    pub fn tokens_per_step(&self) -> f64 {
        let mut term = 1.0;
        let mut sum = 1.0;
        for _ in 0..self.draft_tokens {
            term *= self.acceptance.clamp(0.0, 1.0);
            sum += term;
        }
        sum
    }
}

/// A draw in `[0, 1)` for (request, draft position), the same on every machine
/// (`engine::draft::F3`).
#[expect(
    clippy::cast_precision_loss,
    reason = "53 bits of the hash, exactly representable in an f64"
)]
fn unit_draw(request: RequestId, position: usize) -> f64 {
    let mut input = [0_u8; 24];
    input[..8].copy_from_slice(b"kvc-drft");
    input[8..16].copy_from_slice(&request.0.to_le_bytes());
    input[16..].copy_from_slice(&u64::try_from(position).unwrap_or(u64::MAX).to_le_bytes());
    (xxh3_64(&input) >> 11) as f64 / (1_u64 << 53) as f64
}

impl Engine {
    /// Workflow 1 and 2 for the chunk of `active[index]` that ended at `chunk_end`: the
    /// pages past the chunk end (stale), and the draft tokens after the last chunk.
    pub(super) fn draft_past_chunk_end(
        &mut self,
        index: usize,
        chunk_end: usize,
    ) -> Result<(), ReplayError> {
        let Some(drafter) = self.drafter else {
            return Ok(());
        };
        let active = &mut self.active[index];
        for (group, page) in self
            .cache
            .ensure_past_chunk_end(&mut active.pages, chunk_end)?
        {
            self.checker
                .write_stale(&self.devices, self.groups[group].id, page)?;
        }
        if chunk_end < active.request.prompt_len {
            return Ok(());
        }
        for block in self.cache.draft_blocks(&active.pages, chunk_end) {
            for (group, content) in self.groups.iter().enumerate() {
                if let Some(page) = active.pages.page(group, block) {
                    self.cache.ensure_writable(group, page)?;
                    self.checker.write_draft(&self.devices, content.id, page)?;
                    self.counters.draft_pages_written += 1;
                }
            }
        }
        self.counters.draft_tokens_proposed += u64::try_from(drafter.draft_tokens).unwrap_or(0);
        Ok(())
    }

    /// Workflow 3 for `active[index]`, whose prompt is done: verify its drafts and rewind
    /// the pages of rejected ones (`engine::draft::F2`).
    pub(super) fn verify_drafts(&mut self, index: usize) {
        let Some(drafter) = self.drafter else {
            return;
        };
        let active = &mut self.active[index];
        let accepted = drafter.accepted(active.request.id);
        let kept = active.request.prompt_len + accepted;
        self.counters.draft_pages_rewound += self.cache.rewind(&mut active.pages, kept);
        self.counters.draft_tokens_accepted += u64::try_from(accepted).unwrap_or(0);
        let by_prefix = &mut self.counters.drafts_by_prefix;
        let tally = if active.reused_tokens > 0 {
            &mut by_prefix.pool
        } else if active.local_hit_tokens > 0 {
            &mut by_prefix.local
        } else {
            &mut by_prefix.computed
        };
        tally.requests += 1;
        tally.tokens_proposed += u64::try_from(drafter.draft_tokens).unwrap_or(0);
        tally.tokens_accepted += u64::try_from(accepted).unwrap_or(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptance_draws_are_deterministic_and_follow_the_rate_f3() {
        let drafter = DrafterSetup {
            draft_tokens: 3,
            acceptance: 0.7,
        };
        let counts: Vec<usize> = (0..4_000)
            .map(|id| drafter.accepted(RequestId(id)))
            .collect();
        let again: Vec<usize> = (0..4_000)
            .map(|id| drafter.accepted(RequestId(id)))
            .collect();
        assert_eq!(counts, again);
        assert!(counts.iter().all(|&count| count <= 3));
        // The mean run is 0.7 + 0.49 + 0.343 = 1.533: about 6,132 over 4,000 requests.
        let total = counts.iter().sum::<usize>();
        assert!((5_900..6_360).contains(&total), "{total} accepted");
        assert!((drafter.tokens_per_step() - 2.533).abs() < 1e-9);
        let never = DrafterSetup {
            acceptance: 0.0,
            ..drafter
        };
        let always = DrafterSetup {
            acceptance: 1.0,
            ..drafter
        };
        assert_eq!(never.accepted(RequestId(5)), 0);
        assert_eq!(always.accepted(RequestId(5)), 3);
        assert!((never.tokens_per_step() - 1.0).abs() < 1e-9);
        assert!((always.tokens_per_step() - 4.0).abs() < 1e-9);
    }
}
