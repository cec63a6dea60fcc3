//! The save plan's rules, block by block and as properties.

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
        checkpoint_tokens: None,
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

/// R28: a chunk passing a checkpoint saves the window's sinks and the blocks overlapping
/// `[c - W, c)`; a chunk passing none saves nothing of a window group; the last chunk
/// adds the rewind tail, merged with a checkpoint it also passes.
#[test]
fn window_checkpoints_save_the_window_read_at_each_multiple_a_chunk_passes_r28() {
    let window = Attention::window(40, 4);
    let every = |tokens| SaveStep {
        checkpoint_tokens: NonZeroUsize::new(tokens),
        ..step(0, 0)
    };
    // Checkpoint 64 (block 4): window [24, 64) -> blocks 1..4, sinks block 0.
    let first = SaveStep {
        computed_before: 10,
        computed_after: 70,
        ..every(64)
    };
    assert_eq!(blocks(&blocks_to_save(window, &first)), vec![0, 1, 2, 3]);
    // The chunk [70, 100) passes no multiple of 64: nothing.
    let between = SaveStep {
        computed_before: 70,
        computed_after: 100,
        ..every(64)
    };
    assert!(blocks_to_save(window, &between).is_empty());
    // A chunk ending exactly at a checkpoint passes it; one starting there does not.
    let ends_at = SaveStep {
        computed_before: 100,
        computed_after: 128,
        ..every(64)
    };
    assert_eq!(blocks(&blocks_to_save(window, &ends_at)), vec![0, 5, 6, 7]);
    let starts_at = SaveStep {
        computed_before: 128,
        computed_after: 150,
        ..every(64)
    };
    assert!(blocks_to_save(window, &starts_at).is_empty());
    // Two checkpoints in one chunk (32 and 64), each with its own window.
    let two = SaveStep {
        computed_before: 0,
        computed_after: 64,
        ..every(32)
    };
    assert_eq!(blocks(&blocks_to_save(window, &two)), vec![0, 1, 2, 3]);
    // Last chunk [150, 200): checkpoint 192 (blocks 9..12) merges into the tail reaching
    // W + R = 72 tokens back (blocks 8..12).
    let last = SaveStep {
        computed_before: 150,
        computed_after: 200,
        last_chunk: true,
        ..every(64)
    };
    assert_eq!(
        blocks(&blocks_to_save(window, &last)),
        vec![0, 8, 9, 10, 11]
    );
    assert_eq!(
        checkpoint_only_blocks(window, &first),
        4,
        "sinks and window"
    );
    assert_eq!(checkpoint_only_blocks(window, &last), 0, "inside the tail");
    assert_eq!(checkpoint_only_blocks(Attention::FULL, &first), 0);
    // Full groups do not change, and a checkpoint inside reused tokens is not saved (R19).
    assert_eq!(
        blocks_to_save(Attention::FULL, &first),
        blocks_to_save(
            Attention::FULL,
            &SaveStep {
                checkpoint_tokens: None,
                ..first
            }
        )
    );
    let reused = SaveStep {
        reused_until: 96,
        computed_before: 96,
        computed_after: 130,
        ..every(64)
    };
    assert_eq!(blocks(&blocks_to_save(window, &reused)), vec![6, 7]);
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
                    let in_tail = step.last_chunk && block >= tail_start;
                    // R28, token by token: a checkpoint c the chunk passes wants the
                    // blocks overlapping [c - W, c).
                    let every = step.checkpoint_tokens.map_or(0, NonZeroUsize::get);
                    let passed = |c: usize| {
                        every > 0
                            && c % every == 0
                            && c > step.computed_before
                            && c <= step.computed_after.min(step.prompt_len)
                    };
                    let at_checkpoint = (1..=step.prompt_len).filter(|&c| passed(c)).any(|c| {
                        block * t < c && (block + 1) * t > c.saturating_sub(window_tokens)
                    });
                    let any_checkpoint = (1..=step.prompt_len).any(passed);
                    let is_sink = block < sink_blocks && (step.last_chunk || any_checkpoint);
                    let computed = (block + 1) * t <= step.computed_after;
                    let wanted = in_tail || at_checkpoint || is_sink;
                    if wanted && computed && block >= reused {
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
            checkpoint_blocks in 0usize..6,
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
                checkpoint_tokens: NonZeroUsize::new(checkpoint_blocks * t),
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
        checkpoint_blocks in 0_usize..8,
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
            checkpoint_tokens: NonZeroUsize::new(checkpoint_blocks * tokens_per_block),
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
