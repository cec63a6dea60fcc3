//! Which blocks of a request to save in one step, and at which priority (R16-R21): pure
//! logic, tested without actors.
//!
//! - Full-attention groups save the blocks completed by the end of the current chunk
//!   (R16), except those that came from the pool or the local match (R19).
//! - Window groups save once, at the prompt's last chunk: the sink blocks and the blocks
//!   overlapping `[P - W - R, P)`, full blocks only (R17).
//! - Re-save (R20): at the last chunk of a prompt that computed at least
//!   `resave_min_tokens`, every full-attention block of the prompt is listed again at the
//!   lowest priority (the blocks saved in this very step keep their normal priority).
//!
//! Invariants (checked by the tests below and, at run time, by the handle, which counts
//! every planned block past the cap as `published_past_chunk_end`, R16):
//! - `save_plan::S1`. No planned block ends past the chunk end: `(block + 1) * T <= computed_after`
//!   ([`past_chunk_end`] is false for every block [`blocks_to_save`] returns). Pages a
//!   drafter's extra KV tokens reach past the chunk end are never published (R16).
//! - `save_plan::S2`. Only prompt blocks are planned: `(block + 1) * T <= P`, so draft and
//!   generation pages are never published, with or without a drafter (R18).
//! - `save_plan::S3`. A block below `reused_until` is planned only as a re-save (R19, R20).

use std::num::NonZeroUsize;
use std::ops::Range;

use crate::core::layout::{Attention, GroupKind};
use crate::core::save_order::SavePriority;

/// One request's step, as far as saves are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveStep {
    /// `T`.
    pub tokens_per_block: usize,
    /// `P`.
    pub prompt_len: usize,
    /// Tokens computed before this step.
    pub computed_before: usize,
    /// Tokens computed by the end of this step (the chunk end).
    pub computed_after: usize,
    /// Tokens that came from the pool or the local match (never saved again, R19).
    pub reused_until: usize,
    /// Full blocks whose chain hash is known (the prompt's full blocks).
    pub hashed_blocks: usize,
    /// Whether this step is the prompt's last chunk (window saves happen once, here).
    pub last_chunk: bool,
    /// `R` (R17).
    pub rewind_tokens: usize,
    /// Re-save threshold in computed tokens; `None`: off (R20).
    pub resave_min_tokens: Option<NonZeroUsize>,
}

/// Where a step's saves end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveCap {
    /// R16: at the end of the current chunk (the only cap the connector uses).
    ChunkEnd,
    /// At the prompt end, whatever the chunk computed: the cap bypassed. Wrong by design
    /// (it publishes pages whose tokens are not computed yet); it exists, in test builds
    /// only, so that tests can show what the R16 cap prevents.
    #[cfg(test)]
    PromptEnd,
}

/// Whether `block` ends past the chunk end of `step` (a publication R16 forbids).
pub fn past_chunk_end(step: &SaveStep, block: usize) -> bool {
    (block + 1).saturating_mul(step.tokens_per_block.max(1)) > step.computed_after
}

/// The blocks of one group to save this step, each with its priority, ascending
/// (`save_plan::S1`-S3).
pub fn blocks_to_save(attention: Attention, step: &SaveStep) -> Vec<(usize, SavePriority)> {
    let mut ranges = Vec::new();
    block_ranges_to_save(attention, step, SaveCap::ChunkEnd, &mut ranges);
    each_block(ranges)
}

/// [`blocks_to_save`] with an explicit cap (test builds only: the connector never passes
/// another cap than [`SaveCap::ChunkEnd`]).
#[cfg(test)]
pub fn blocks_to_save_capped(
    attention: Attention,
    step: &SaveStep,
    cap: SaveCap,
) -> Vec<(usize, SavePriority)> {
    let mut ranges = Vec::new();
    block_ranges_to_save(attention, step, cap, &mut ranges);
    each_block(ranges)
}

/// The blocks of `ranges`, one by one, each with its range's priority.
fn each_block(ranges: Vec<(Range<usize>, SavePriority)>) -> Vec<(usize, SavePriority)> {
    ranges
        .into_iter()
        .flat_map(|(blocks, priority)| blocks.map(move |block| (block, priority)))
        .collect()
}

/// [`blocks_to_save`] (with an explicit cap) as at most two ascending, disjoint ranges with their
/// priority, written into a caller's buffer (cleared first): the engine thread reuses one
/// buffer and copies page numbers range by range.
pub fn block_ranges_to_save(
    attention: Attention,
    step: &SaveStep,
    cap: SaveCap,
    ranges: &mut Vec<(Range<usize>, SavePriority)>,
) {
    ranges.clear();
    let t = step.tokens_per_block.max(1);
    let cap_tokens = match cap {
        SaveCap::ChunkEnd => step.computed_after,
        #[cfg(test)]
        SaveCap::PromptEnd => step.prompt_len,
    };
    let prompt_blocks = (step.prompt_len / t).min(step.hashed_blocks);
    let reused_blocks = step.reused_until.div_ceil(t);
    // Every range is kept only when it holds a block; `floor` is the lowest block it may
    // start at (R19 keeps reused blocks out, except for R20's re-listing).
    let mut push = |blocks: Range<usize>, floor: usize, priority: SavePriority| {
        let blocks = blocks.start.max(floor)..blocks.end.min(prompt_blocks);
        if !blocks.is_empty() {
            ranges.push((blocks, priority));
        }
    };
    match attention {
        Attention {
            kind: GroupKind::Full,
            ..
        } => {
            let first = (step.computed_before / t).max(reused_blocks);
            // R16: only blocks whose every token is computed by the end of this chunk.
            let end = cap_tokens.min(step.prompt_len) / t;
            let computed = step.prompt_len.saturating_sub(step.reused_until);
            if step.last_chunk
                && step
                    .resave_min_tokens
                    .is_some_and(|min| computed >= min.get())
            {
                push(0..first.min(end), 0, SavePriority::Resave);
            }
            push(first..end, first, SavePriority::Full);
        }
        Attention {
            kind: GroupKind::Window,
            window_tokens,
            sink_tokens,
        } if step.last_chunk => {
            let sink_blocks = sink_tokens.div_ceil(t);
            let reach = window_tokens + step.rewind_tokens;
            let tail_start = step.prompt_len.saturating_sub(reach) / t;
            push(
                0..sink_blocks.min(tail_start),
                reused_blocks,
                SavePriority::Window,
            );
            push(
                tail_start..prompt_blocks,
                reused_blocks,
                SavePriority::Window,
            );
        }
        Attention {
            kind: GroupKind::Window,
            ..
        } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(before: usize, after: usize) -> SaveStep {
        SaveStep {
            tokens_per_block: 16,
            prompt_len: 200,
            computed_before: before,
            computed_after: after,
            reused_until: 0,
            hashed_blocks: 12,
            last_chunk: after >= 200,
            rewind_tokens: 32,
            resave_min_tokens: None,
        }
    }

    fn blocks(saves: &[(usize, SavePriority)]) -> Vec<usize> {
        saves.iter().map(|(block, _)| *block).collect()
    }

    /// R16: a chunk ending inside a block does not save that block; the next one does.
    #[test]
    fn only_blocks_complete_by_the_chunk_end_are_saved_r16() {
        assert_eq!(
            blocks(&blocks_to_save(Attention::FULL, &step(0, 37))),
            vec![0, 1]
        );
        assert_eq!(
            blocks(&blocks_to_save(Attention::FULL, &step(37, 100))),
            vec![2, 3, 4, 5]
        );
        // The partial last block (200 = 12 * 16 + 8) is never saved.
        assert_eq!(
            blocks(&blocks_to_save(Attention::FULL, &step(100, 200))),
            vec![6, 7, 8, 9, 10, 11]
        );
    }

    /// R19: blocks that came from the pool are not saved again.
    #[test]
    fn reused_blocks_are_not_saved_again_r19() {
        let reused = SaveStep {
            reused_until: 64,
            ..step(64, 120)
        };
        assert_eq!(
            blocks(&blocks_to_save(Attention::FULL, &reused)),
            vec![4, 5, 6]
        );
    }

    /// R17: window groups save sinks and the tail reaching back `W + R`, at the last chunk only.
    #[test]
    fn window_groups_save_sinks_and_the_rewind_tail_at_the_last_chunk_r17() {
        let window = Attention::window(64, 4);
        assert!(blocks_to_save(window, &step(0, 100)).is_empty());
        // P = 200, W + R = 96: tail from token 104 -> block 6; sinks: block 0.
        let saves = blocks_to_save(window, &step(100, 200));
        assert_eq!(blocks(&saves), vec![0, 6, 7, 8, 9, 10, 11]);
        assert!(saves
            .iter()
            .all(|(_, priority)| *priority == SavePriority::Window));
    }

    /// R20: re-save lists every full block again at the last chunk, lowest priority, only
    /// for prompts that computed at least the threshold.
    #[test]
    fn resave_relists_the_whole_prompt_at_the_last_chunk_r20() {
        let on = SaveStep {
            resave_min_tokens: NonZeroUsize::new(150),
            ..step(100, 200)
        };
        let saves = blocks_to_save(Attention::FULL, &on);
        let resaved: Vec<usize> = saves
            .iter()
            .filter(|(_, p)| *p == SavePriority::Resave)
            .map(|(b, _)| *b)
            .collect();
        let full: Vec<usize> = saves
            .iter()
            .filter(|(_, p)| *p == SavePriority::Full)
            .map(|(b, _)| *b)
            .collect();
        assert_eq!(resaved, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(full, vec![6, 7, 8, 9, 10, 11]);
        let below_threshold = SaveStep {
            resave_min_tokens: NonZeroUsize::new(150),
            reused_until: 64,
            ..step(100, 200)
        };
        assert!(blocks_to_save(Attention::FULL, &below_threshold)
            .iter()
            .all(|(_, p)| *p == SavePriority::Full));
        let not_last = SaveStep {
            resave_min_tokens: NonZeroUsize::new(1),
            ..step(0, 100)
        };
        assert!(blocks_to_save(Attention::FULL, &not_last)
            .iter()
            .all(|(_, p)| *p == SavePriority::Full));
    }

    /// The ranges say the same as the rules block by block: R16/R19 for full groups,
    /// R20's re-listing at the last chunk, R17's sinks and tail for window groups.
    mod ranges_match_the_rules {
        use super::*;
        use proptest::prelude::*;

        fn expected(attention: Attention, step: &SaveStep) -> Vec<(usize, SavePriority)> {
            let t = step.tokens_per_block;
            let prompt_blocks = (step.prompt_len / t).min(step.hashed_blocks);
            let reused = step.reused_until.div_ceil(t);
            let mut out = Vec::new();
            for block in 0..prompt_blocks {
                match attention {
                    Attention {
                        kind: GroupKind::Full,
                        ..
                    } => {
                        let first = (step.computed_before / t).max(reused);
                        let end = (step.computed_after.min(step.prompt_len) / t).min(prompt_blocks);
                        let computed = step.prompt_len.saturating_sub(step.reused_until);
                        let resave = step.last_chunk
                            && step
                                .resave_min_tokens
                                .is_some_and(|min| computed >= min.get());
                        if resave && block < first.min(end) {
                            out.push((block, SavePriority::Resave));
                        }
                        if block >= first && block < end {
                            out.push((block, SavePriority::Full));
                        }
                    }
                    Attention {
                        kind: GroupKind::Window,
                        window_tokens,
                        sink_tokens,
                    } => {
                        let sink_blocks = sink_tokens.div_ceil(t);
                        let reach = window_tokens + step.rewind_tokens;
                        let tail_start = step.prompt_len.saturating_sub(reach) / t;
                        let wanted = block < sink_blocks || block >= tail_start;
                        if step.last_chunk && wanted && block >= reused {
                            out.push((block, SavePriority::Window));
                        }
                    }
                }
            }
            out.sort_by_key(|(block, priority)| (*priority != SavePriority::Resave, *block));
            out
        }

        proptest! {
            #![proptest_config(proptest::test_runner::Config {
                rng_seed: proptest::test_runner::RngSeed::Fixed(0x5a7e_91a2),
                ..proptest::test_runner::Config::default()
            })]
            #[test]
            fn for_any_step(
                prompt_len in 1usize..600,
                before_share in 0usize..100,
                chunk in 1usize..300,
                reused_share in 0usize..100,
                hashed_cut in 0usize..5,
                window in prop::option::of((1usize..200, 0usize..40)),
                rewind_tokens in 0usize..100,
                resave_min_tokens in 0usize..300,
            ) {
                let t = 16;
                let computed_before = prompt_len * before_share / 100;
                let computed_after = (computed_before + chunk).min(prompt_len);
                let step = SaveStep {
                    tokens_per_block: t,
                    prompt_len,
                    computed_before,
                    computed_after,
                    reused_until: computed_before * reused_share / 100,
                    hashed_blocks: (prompt_len / t).saturating_sub(hashed_cut),
                    last_chunk: computed_after >= prompt_len,
                    rewind_tokens,
                    resave_min_tokens: NonZeroUsize::new(resave_min_tokens),
                };
                let attention = match window {
                    Some((window_tokens, sink_tokens)) => {
                        Attention::window(window_tokens + sink_tokens, sink_tokens)
                    }
                    None => Attention::FULL,
                };
                prop_assert_eq!(blocks_to_save(attention, &step), expected(attention, &step));
            }
        }
    }

    /// R16 with the cap bypassed: the same step plans blocks past the chunk end, which
    /// `past_chunk_end` flags (what the handle counts as `published_past_chunk_end`).
    #[test]
    fn bypassing_the_cap_plans_blocks_past_the_chunk_end_r16() {
        let first_chunk = step(0, 40);
        let capped = blocks_to_save(Attention::FULL, &first_chunk);
        assert!(capped
            .iter()
            .all(|&(block, _)| !past_chunk_end(&first_chunk, block)));
        let bypassed = blocks_to_save_capped(Attention::FULL, &first_chunk, SaveCap::PromptEnd);
        let past: Vec<usize> = bypassed
            .iter()
            .map(|&(block, _)| block)
            .filter(|&block| past_chunk_end(&first_chunk, block))
            .collect();
        assert_eq!(past, (2..12).collect::<Vec<_>>());
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5a7e_91a3),
            ..proptest::test_runner::Config::default()
        })]
        /// `save_plan::S1`-S3 for any chunking, reuse, threshold and attention.
        #[test]
        fn planned_blocks_stay_within_the_chunk_and_the_prompt_s1_s2_s3(
            tokens_per_block in 1_usize..64,
            prompt_len in 1_usize..4_000,
            before_share in 0.0_f64..1.0,
            chunk in 1_usize..2_000,
            reused_share in 0.0_f64..1.0,
            resave_min_tokens in 0_usize..3_000,
            window in proptest::option::of((1_usize..512, 0_usize..8)),
        ) {
            let before = to_tokens(before_share, prompt_len);
            let step = SaveStep {
                tokens_per_block,
                prompt_len,
                computed_before: before,
                computed_after: (before + chunk).min(prompt_len),
                reused_until: to_tokens(reused_share, before),
                hashed_blocks: prompt_len / tokens_per_block,
                last_chunk: before + chunk >= prompt_len,
                rewind_tokens: 64,
                resave_min_tokens: NonZeroUsize::new(resave_min_tokens),
            };
            let attention = window.map_or(Attention::FULL, |(window_tokens, sinks)| {
                Attention::window(window_tokens, sinks.min(window_tokens - 1))
            });
            for (block, priority) in blocks_to_save(attention, &step) {
                proptest::prop_assert!(
                    !past_chunk_end(&step, block),
                    "save_plan::S1: block {block}"
                );
                proptest::prop_assert!(
                    (block + 1) * tokens_per_block <= prompt_len,
                    "save_plan::S2"
                );
                if block < step.reused_until / tokens_per_block
                    && attention == Attention::FULL
                {
                    proptest::prop_assert_eq!(priority, SavePriority::Resave, "save_plan::S3");
                }
            }
        }
    }

    /// `share` of `tokens`, rounded down.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a share in [0, 1) of a few thousand tokens"
    )]
    fn to_tokens(share: f64, tokens: usize) -> usize {
        (share * tokens as f64) as usize
    }
}
