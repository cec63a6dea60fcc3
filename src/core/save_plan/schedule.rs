//! A request's window saves point by point (R17, R28), for an engine that must know,
//! before each chunk runs, which window blocks the chunk saves: vLLM's scheduler reads the
//! ids of those blocks from its own tables, and asks once a request instead of once a
//! chunk.
//!
//! A window group saves only in a chunk that passes a *save point*: a checkpoint
//! `c <= P` (R28) or, while the window is not saved yet, the prompt end `P` (R17).
//! [`window_save_schedule`] lists each point with the blocks a chunk passing it saves.
//!
//! Invariant:
//!
//! - `save_plan::S4`. For any chunk `[before, after)` of the request, the blocks
//!   [`block_ranges_to_save`] plans for a window group lie in the union of the schedule's
//!   blocks over the points in `(before, after]`, and the union adds sink blocks only: a
//!   chunk saves a sink block once its tokens are computed (R16), the schedule lists every
//!   sink block of the prompt at each point. A chunk that passes no point saves no window
//!   block.

use std::ops::Range;

use super::{checkpoints_passed, ranges_up_to, SaveStep};
use crate::core::layout::{Attention, GroupKind};

/// Each save point of a window group with the blocks a chunk passing it saves, ascending
/// and disjoint (`save_plan::S4`); empty for a full group. `step` describes the request
/// (its chunk bounds are not read); its `last_chunk` says whether the prompt end is still
/// a save point, that is, whether the window is not saved yet.
pub fn window_save_schedule(
    attention: Attention,
    step: &SaveStep,
) -> Vec<(usize, Vec<Range<usize>>)> {
    let prompt_len = step.prompt_len;
    if attention.kind != GroupKind::Window || prompt_len == 0 {
        return Vec::new();
    }
    let whole = SaveStep {
        computed_before: 0,
        computed_after: prompt_len,
        ..*step
    };
    let mut points: Vec<usize> = checkpoints_passed(&whole).collect();
    if step.last_chunk && points.last() != Some(&prompt_len) {
        points.push(prompt_len);
    }
    let mut ranges = Vec::new();
    points
        .into_iter()
        .map(|point| {
            let at = SaveStep {
                computed_before: point - 1,
                computed_after: point,
                last_chunk: step.last_chunk && point == prompt_len,
                ..*step
            };
            // Capped at the prompt end, not at the point: a later chunk end completes the
            // sink blocks past it.
            ranges_up_to(attention, &at, prompt_len, &mut ranges);
            (point, ranges.drain(..).map(|(blocks, _)| blocks).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::num::NonZeroUsize;

    use proptest::prelude::*;

    use super::super::{block_ranges_to_save, SaveCap};
    use super::*;

    /// The blocks `ranges` cover.
    fn covered<'a>(ranges: impl IntoIterator<Item = &'a Range<usize>>) -> BTreeSet<usize> {
        ranges.into_iter().flat_map(Clone::clone).collect()
    }

    /// A 200-token prompt, blocks of 16, window 40 with 4 sinks, checkpoints every 64.
    fn request(window_saved: bool) -> SaveStep {
        SaveStep {
            tokens_per_block: 16,
            prompt_len: 200,
            computed_before: 0,
            computed_after: 0,
            reused_until: 0,
            hashed_blocks: 12,
            last_chunk: !window_saved,
            rewind_tokens: 32,
            checkpoint_tokens: NonZeroUsize::new(64),
            resave_min_tokens: None,
        }
    }

    #[test]
    #[expect(clippy::single_range_in_vec_init, reason = "a point's ranges, one of them")]
    fn the_points_are_the_checkpoints_and_the_prompt_end_while_the_window_is_unsaved() {
        let window = Attention::window(40, 4);
        let schedule = window_save_schedule(window, &request(false));
        // Checkpoint 64: window [24, 64) -> blocks 1..4 and sink block 0 merge into 0..4.
        // Prompt end 200: tail from 200 - 72 = 128 -> blocks 8..12, sink block 0.
        assert_eq!(
            schedule,
            vec![
                (64, vec![0..4]),
                (128, vec![0..1, 5..8]),
                (192, vec![0..1, 9..12]),
                (200, vec![0..1, 8..12]),
            ]
        );
        let saved = window_save_schedule(window, &request(true));
        assert_eq!(saved.last().map(|(point, _)| *point), Some(192));
        assert!(window_save_schedule(Attention::FULL, &request(false)).is_empty());
    }

    /// Sinks reaching past a checkpoint (49 sink tokens, blocks 0-6, a checkpoint every
    /// 16 tokens): a chunk that ends past them saves every sink block, though the last
    /// point it passes lies inside them, so each point lists them all.
    #[test]
    #[expect(clippy::single_range_in_vec_init, reason = "a point's ranges, one of them")]
    fn sink_blocks_past_a_point_are_listed_at_it() {
        let request = SaveStep {
            tokens_per_block: 8,
            prompt_len: 56,
            hashed_blocks: 7,
            last_chunk: false,
            rewind_tokens: 0,
            checkpoint_tokens: NonZeroUsize::new(16),
            ..request(true)
        };
        let schedule = window_save_schedule(Attention::window(50, 49), &request);
        assert_eq!(schedule.first(), Some(&(16, vec![0..7])));
        let chunk = SaveStep {
            computed_before: 0,
            computed_after: 56,
            ..request
        };
        let mut ranges = Vec::new();
        block_ranges_to_save(Attention::window(50, 49), &chunk, SaveCap::ChunkEnd, &mut ranges);
        assert_eq!(covered(ranges.iter().map(|(blocks, _)| blocks)), (0..7).collect());
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5a7e_91a4),
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]
        /// `save_plan::S4` for any chunk of any request.
        #[test]
        fn a_chunk_saves_what_its_points_list_but_sinks_yet_uncomputed_s4(
            tokens_per_block in 1_usize..12,
            prompt_len in 1_usize..600,
            before in 0_usize..600,
            chunk in 1_usize..200,
            reused_share in 0_usize..100,
            window_tokens in 1_usize..160,
            sink_tokens in 0_usize..80,
            checkpoint_blocks in 0_usize..8,
            window_saved in any::<bool>(),
            rewind_tokens in 0_usize..100,
        ) {
            let before = before % prompt_len;
            let after = before + chunk;
            let t = tokens_per_block;
            let sink_tokens = sink_tokens.min(window_tokens - 1);
            let attention = Attention::window(window_tokens, sink_tokens);
            let request = SaveStep {
                tokens_per_block: t,
                prompt_len,
                computed_before: 0,
                computed_after: 0,
                reused_until: before * reused_share / 100,
                hashed_blocks: prompt_len / t,
                last_chunk: !window_saved,
                rewind_tokens,
                checkpoint_tokens: NonZeroUsize::new(checkpoint_blocks * t),
                resave_min_tokens: None,
            };
            let step = SaveStep {
                computed_before: before,
                computed_after: after,
                last_chunk: after >= prompt_len && !window_saved,
                ..request
            };
            let mut ranges = Vec::new();
            block_ranges_to_save(attention, &step, SaveCap::ChunkEnd, &mut ranges);
            let saved = covered(ranges.iter().map(|(blocks, _)| blocks));
            let schedule = window_save_schedule(attention, &request);
            let listed = covered(
                schedule
                    .iter()
                    .filter(|(point, _)| before < *point && *point <= after)
                    .flat_map(|(_, blocks)| blocks),
            );
            prop_assert!(saved.is_subset(&listed), "saved {saved:?}, listed {listed:?}");
            let sinks = sink_tokens.div_ceil(t);
            prop_assert!(listed.difference(&saved).all(|&block| block < sinks));
            let points: Vec<usize> = schedule.iter().map(|(point, _)| *point).collect();
            prop_assert!(points.windows(2).all(|pair| pair[0] < pair[1]));
        }
    }
}
