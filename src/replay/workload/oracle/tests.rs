//! Unit and property tests of the oracle (`oracle::O1`..O6).

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::*;
use crate::core::hash::hash_blocks;

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
            window_checkpoint_reusable_tokens: 80,
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

/// X = blocks 1..=10 (170 tokens), Y shares X's first 8 blocks (128 tokens) and diverges:
/// no prompt ended within `R = 16` of Y's hit. Returns Y's window and checkpoint window
/// reusable tokens for the interval `I`.
fn checkpoint_scenario(interval: Option<usize>) -> (usize, usize) {
    let mut oracle = Oracle::with_window(16, interval.and_then(NonZeroUsize::new));
    let x: Vec<u8> = (1..=10).collect();
    let mut y: Vec<u8> = (1..=8).collect();
    y.extend(50..55);
    oracle.admit(&hashes(&x), 170, 16);
    let reusable = oracle.reusable_tokens(&hashes(&y), 210, 16);
    assert_eq!(reusable, 128);
    let window = oracle.window_reusable_tokens(&hashes(&y), reusable, 16);
    let checkpoint = oracle.window_checkpoint_reusable_tokens(reusable, window, 16);
    oracle.admit(&hashes(&y), 210, 16);
    let totals = oracle.totals();
    assert_eq!(totals.window_reusable_tokens, window as u64);
    assert_eq!(totals.window_checkpoint_reusable_tokens, checkpoint as u64);
    (window, checkpoint)
}

#[test]
fn o6_a_checkpoint_serves_a_resume_point_where_no_prompt_ended() {
    // X ended 42 tokens past Y's hit at 128, beyond R = 16: no prompt-end window.
    assert_eq!(checkpoint_scenario(None), (0, 0));
    // X computed through 128 = 2 * 64 and 96 = 2 * 48 and stored those windows.
    assert_eq!(checkpoint_scenario(Some(64)), (0, 128));
    assert_eq!(checkpoint_scenario(Some(48)), (0, 96));
    // An interval beyond the hit gives nothing; one not a multiple of T counts only at
    // block boundaries: 40 -> 80.
    assert_eq!(checkpoint_scenario(Some(256)), (0, 0));
    assert_eq!(checkpoint_scenario(Some(40)), (0, 80));
}

#[test]
fn o6_checkpoints_never_lower_the_prompt_end_oracle() {
    // B's hit 160 is served by A's end (R = 64); the checkpoint at 128 does not replace it.
    let mut oracle = Oracle::with_window(64, NonZeroUsize::new(64));
    let a: Vec<u8> = (1..=12).collect();
    let mut b: Vec<u8> = (1..=10).collect();
    b.extend(50..60);
    oracle.admit(&hashes(&a), 200, 16);
    oracle.admit(&hashes(&b), 330, 16);
    let totals = oracle.totals();
    assert_eq!(totals.window_reusable_tokens, 160);
    assert_eq!(totals.window_checkpoint_reusable_tokens, 160);
    // Without a window group both window oracles are the full oracle.
    let full = Oracle::new();
    assert_eq!(full.window_checkpoint_reusable_tokens(160, 160, 16), 160);
    assert_eq!(full.window_checkpoint_reusable_tokens(96, 0, 16), 96);
}

#[test]
fn least_common_multiple_handles_zero_and_overflow() {
    assert_eq!(least_common_multiple(8192, 32), Some(8192));
    assert_eq!(least_common_multiple(40, 16), Some(80));
    assert_eq!(least_common_multiple(7, 1), Some(7));
    assert_eq!(least_common_multiple(0, 16), None);
    assert_eq!(least_common_multiple(16, 0), None);
    assert_eq!(least_common_multiple(usize::MAX, usize::MAX - 1), None);
}

/// Prompts built from earlier ones: prompt `i` keeps a cut of a random earlier prompt and
/// appends its own tail, so prompts share prefixes of every length.
fn related_prompts(shapes: &[(usize, usize, Vec<i64>)]) -> Vec<Vec<i64>> {
    let mut prompts: Vec<Vec<i64>> = Vec::new();
    for (parent, cut, tail) in shapes {
        let mut prompt = match prompts.len() {
            0 => Vec::new(),
            len => {
                let parent = &prompts[parent % len];
                parent[..cut % (parent.len() + 1)].to_vec()
            }
        };
        prompt.extend_from_slice(tail);
        prompts.push(prompt);
    }
    prompts
}

/// The three oracles of one prompt by their definitions over tokens (module docs): `e`
/// counts for the full oracle when an earlier prompt holds the same first `e` tokens; for
/// the prompt-end window oracle when one such prompt is at most `e + R` long; for the
/// checkpoint window oracle also when `e` is a positive multiple of `I`.
fn naive_oracles(
    earlier: &[Vec<i64>],
    prompt: &[i64],
    tokens_per_block: usize,
    rewind: usize,
    interval: Option<usize>,
) -> [usize; 3] {
    let held = |e: usize| {
        earlier
            .iter()
            .filter(move |q| q.len() >= e && q[..e] == prompt[..e])
    };
    let max_blocks = prompt.len().saturating_sub(1) / tokens_per_block;
    let reusable = (1..=max_blocks)
        .map(|blocks| blocks * tokens_per_block)
        .take_while(|&e| held(e).next().is_some())
        .last()
        .unwrap_or(0);
    let largest = |counts: &dyn Fn(usize, usize) -> bool| {
        (1..=reusable / tokens_per_block)
            .rev()
            .map(|blocks| blocks * tokens_per_block)
            .find(|&e| held(e).any(|q| counts(e, q.len())))
            .unwrap_or(0)
    };
    let window = largest(&|e, len| len <= e + rewind);
    let checkpoint = largest(&|e, len| len <= e + rewind || interval.is_some_and(|i| e % i == 0));
    [reusable, window, checkpoint]
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

    /// `oracle::O1`..O6 against [`naive_oracles`] on prompts hashed into real chains:
    /// every prompt's reusable, window and checkpoint window tokens, with checkpoints off
    /// and without a window group too.
    #[test]
    fn window_oracles_match_a_naive_model(
        shapes in proptest::collection::vec(
            (0usize..8, 0usize..40, proptest::collection::vec(0i64..3, 0..20)),
            1..7,
        ),
        tokens_per_block in 1usize..5,
        rewind in 0usize..12,
        interval in 0usize..10,
    ) {
        let prompts = related_prompts(&shapes);
        let interval = NonZeroUsize::new(interval);
        let mut oracles = [
            Oracle::with_window(rewind, interval),
            Oracle::with_window_rewind(rewind),
            Oracle::new(),
        ];
        for (index, prompt) in prompts.iter().enumerate() {
            let chain = hash_blocks(BlockHash([7; 16]), prompt, tokens_per_block)
                .map_err(|err| TestCaseError::fail(err.to_string()))?;
            let before = oracles.each_ref().map(Oracle::totals);
            for oracle in &mut oracles {
                oracle.admit(&chain, prompt.len(), tokens_per_block);
            }
            let gained = |oracle: &Oracle, before: &OracleTotals| {
                let after = oracle.totals();
                [
                    after.reusable_tokens - before.reusable_tokens,
                    after.window_reusable_tokens - before.window_reusable_tokens,
                    after.window_checkpoint_reusable_tokens
                        - before.window_checkpoint_reusable_tokens,
                ]
                .map(|tokens| usize::try_from(tokens).unwrap_or(usize::MAX))
            };
            let earlier = &prompts[..index];
            let [reusable, window, checkpoint] = naive_oracles(
                earlier, prompt, tokens_per_block, rewind, interval.map(NonZeroUsize::get),
            );
            prop_assert_eq!(gained(&oracles[0], &before[0]), [reusable, window, checkpoint]);
            prop_assert_eq!(gained(&oracles[1], &before[1]), [reusable, window, window]);
            prop_assert_eq!(gained(&oracles[2], &before[2]), [reusable; 3]);
            prop_assert!(window <= checkpoint && checkpoint <= reusable);
        }
    }
}
