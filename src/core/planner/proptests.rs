//! Property tests of the planner: the post-conditions of `planner.md` against random
//! presence oracles (uniform, and shaped like saved prompts), an exhaustive sweep of
//! small cases against the brute-force reference, monotonicity, early finish and
//! stability. Seeds are fixed (`SEED`); proptest prints the failing input, which then
//! becomes a named regression test in `lookup.rs` or below.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use super::testkit::{
    check_post_conditions, drive, drive_at_most, full, reference, reference_loads, window,
    Presence, Trace,
};
use super::{LookupRequest, PlannerGroup};
use crate::core::layout::GroupId;
use crate::core::layout::{Attention, GroupKind};

/// The fixed seed of every property test here.
const SEED: u64 = 0x6b76_636f_6e6e_6563;
/// Blocks per group in a generated oracle; above any candidate end (P <= 40, T >= 1).
const UNIVERSE_BLOCKS: usize = 48;
/// Groups per generated layout, at most.
const MAX_GROUPS: usize = 4;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(SEED),
        failure_persistence: None,
        ..Config::default()
    }
}

/// Up to two full and two window groups, at least one group; ids in layout order.
fn groups() -> impl Strategy<Value = Vec<PlannerGroup>> {
    let windows = prop::collection::vec((1usize..=12, 0usize..12), 0..=2);
    (0usize..=2, windows)
        .prop_filter("at least one group", |(fulls, windows)| {
            fulls + windows.len() > 0
        })
        .prop_map(|(fulls, windows)| {
            let mut groups: Vec<PlannerGroup> = (0..fulls).map(|id| full(id_of(id))).collect();
            for (index, (window_tokens, sink_seed)) in windows.into_iter().enumerate() {
                let sink_tokens = sink_seed % window_tokens;
                groups.push(window(id_of(fulls + index), window_tokens, sink_tokens));
            }
            groups
        })
}

fn id_of(index: usize) -> u32 {
    u32::try_from(index).unwrap_or(u32::MAX)
}

/// Small requests: T in 1..=4, P in 0..=40, any aligned local match, R in 0..=12.
fn requests() -> impl Strategy<Value = LookupRequest> {
    // Mostly no local match and prompts of several blocks, so that most cases probe.
    let prompt = prop_oneof![1 => 0usize..=8, 4 => 8usize..=40];
    let local_blocks = prop_oneof![2 => Just(0usize), 1 => 0usize..=12];
    // Checkpoints off half of the time, else every 1 to 6 blocks (R28).
    let checkpoint_blocks = prop_oneof![1 => Just(0usize), 1 => 1usize..=6];
    let knobs = (
        groups(),
        0usize..=12,
        any::<bool>(),
        1usize..=6,
        checkpoint_blocks,
    );
    (1usize..=4, prompt, local_blocks, knobs).prop_map(
        |(t, prompt, local_blocks, (groups, rewind, fallback, chunk, checkpoint))| LookupRequest {
            tokens_per_block: t,
            prompt_tokens: prompt,
            local_match_tokens: local_blocks.min(prompt / t) * t,
            groups,
            rewind_tokens: rewind,
            window_fallback: fallback,
            checkpoint_tokens: std::num::NonZeroUsize::new(checkpoint * t),
            probe_chunk_items: chunk,
        },
    )
}

/// A bit per `(group index, block)` of the universe.
fn bits(probability: f64) -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(
        prop::bool::weighted(probability),
        MAX_GROUPS * UNIVERSE_BLOCKS,
    )
}

fn from_bits(request: &LookupRequest, bits: &[bool]) -> Presence {
    let mut present = Presence::new();
    for (index, group) in request.groups.iter().enumerate() {
        for block in 0..UNIVERSE_BLOCKS {
            if bits[index * UNIVERSE_BLOCKS + block] {
                present.insert((block, group.id));
            }
        }
    }
    present
}

/// Each item present independently, at a density drawn per case.
fn uniform_cases() -> impl Strategy<Value = (LookupRequest, Presence)> {
    let density = prop_oneof![Just(0.3), Just(0.7), Just(0.9), Just(0.97)];
    (requests(), density).prop_flat_map(|(request, density)| {
        bits(density).prop_map(move |bits| {
            let present = from_bits(&request, &bits);
            (request.clone(), present)
        })
    })
}

/// What earlier prompts ending at `ends` saved (R16, R17 with save rewind `rewind`),
/// minus evicted items, plus stray ones.
fn saved(
    request: &LookupRequest,
    ends: &[usize],
    rewind: usize,
    evicted: &[bool],
    stray: &[bool],
) -> Presence {
    let t = request.tokens_per_block;
    let mut present = Presence::new();
    for &end in ends {
        for block in (0..UNIVERSE_BLOCKS).filter(|block| (block + 1) * t <= end) {
            for group in &request.groups {
                let keep = match group.attention {
                    Attention {
                        kind: GroupKind::Full,
                        ..
                    } => true,
                    Attention {
                        kind: GroupKind::Window,
                        window_tokens,
                        sink_tokens,
                    } => {
                        block * t < sink_tokens
                            || (block + 1) * t > end.saturating_sub(window_tokens + rewind)
                    }
                };
                if keep {
                    present.insert((block, group.id));
                }
            }
        }
    }
    let bit = |(block, group): (usize, GroupId), bits: &[bool]| {
        let index = usize::try_from(group.0).unwrap_or(0) * UNIVERSE_BLOCKS + block;
        bits.get(index).copied().unwrap_or(false)
    };
    present.retain(|&item| !bit(item, evicted));
    let all: Vec<(usize, GroupId)> = request
        .groups
        .iter()
        .flat_map(|group| (0..UNIVERSE_BLOCKS).map(move |block| (block, group.id)))
        .collect();
    present.extend(all.into_iter().filter(|&item| bit(item, stray)));
    present
}

/// Presence shaped like saved prompts: prefixes and windows at prompt ends.
fn saved_cases() -> impl Strategy<Value = (LookupRequest, Presence)> {
    let ends = prop::collection::vec(1usize..=44, 0..=5);
    (requests(), ends, 0usize..=12, bits(0.06), bits(0.02)).prop_map(
        |(request, ends, rewind, evicted, stray)| {
            let present = saved(&request, &ends, rewind, &evicted, &stray);
            (request, present)
        },
    )
}

/// Drives a lookup to the end, turning a planner error into a test failure.
fn run(request: &LookupRequest, present: &Presence) -> Result<Trace, TestCaseError> {
    drive(request.clone(), present).map_err(|e| TestCaseError::fail(e.to_string()))
}

fn any_case() -> impl Strategy<Value = (LookupRequest, Presence)> {
    prop_oneof![uniform_cases(), saved_cases()]
}

proptest! {
    #![proptest_config(config(2048))]

    /// `planner::P1`-P8, `planner::P10` against uniform oracles.
    #[test]
    fn test_proptest_post_conditions_uniform((request, present) in uniform_cases()) {
        let trace = run(&request, &present)?;
        check_post_conditions(&request, &present, &trace).map_err(TestCaseError::fail)?;
    }

    /// `planner::P1`-P8, `planner::P10` against oracles shaped like saved prompts.
    #[test]
    fn test_proptest_post_conditions_saved_prompts((request, present) in saved_cases()) {
        let trace = run(&request, &present)?;
        check_post_conditions(&request, &present, &trace).map_err(TestCaseError::fail)?;
    }

    /// `planner::P9`: adding present items never lowers `e` with window fallback on (which
    /// includes every full-only layout: fallback plays no part there).
    #[test]
    fn test_proptest_prefix_monotone((request, present) in any_case(), extra in bits(0.2)) {
        // Without fallback a longer full hit can move the walk past the only complete
        // window (regression `no_fallback_is_not_prefix_monotone`), so fallback is on.
        let request = LookupRequest { window_fallback: true, ..request };
        let mut more = present.clone();
        more.extend(from_bits(&request, &extra));
        let fewer = run(&request, &present)?;
        let added = run(&request, &more)?;
        prop_assert!(added.plan.resume_tokens >= fewer.plan.resume_tokens,
            "e fell from {} to {}", fewer.plan.resume_tokens, added.plan.resume_tokens);
    }

    /// `planner::P11`: finishing after any number of rounds decides exactly as R10-R15 would on the
    /// items seen present, so it never loads an unseen block.
    #[test]
    fn test_proptest_early_finish((request, present) in any_case(), max_rounds in 0usize..=4) {
        let trace = drive_at_most(request.clone(), &present, max_rounds)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let seen = trace.seen_present();
        let (outcome, e, hit_tokens) = reference(&request, &seen);
        let plan = &trace.plan;
        let got = (plan.outcome, plan.resume_tokens, plan.full_hit_tokens);
        prop_assert_eq!(got, (outcome, e, hit_tokens));
        if outcome.offers() {
            prop_assert_eq!(&trace.plan.loads, &reference_loads(&request, e));
        } else {
            prop_assert!(trace.plan.loads.is_empty());
        }
    }

    /// `planner::P14`: an offering plan loads, per group, exactly `load_blocks` from the
    /// local match to `e`.
    #[test]
    fn test_proptest_load_blocks_is_what_plans_load((request, present) in any_case()) {
        let trace = run(&request, &present)?;
        let plan = &trace.plan;
        if plan.outcome.offers() {
            for (load, group) in plan.loads.iter().zip(&request.groups) {
                let expected = super::load_blocks(
                    group.attention,
                    request.tokens_per_block,
                    request.local_match_tokens,
                    plan.resume_tokens,
                );
                prop_assert_eq!(&load.blocks, &expected, "group {}", group.id.0);
            }
        }
    }

    /// `planner::P10`: identical input and answers give identical rounds and plans.
    #[test]
    fn test_proptest_stable((request, present) in any_case()) {
        let first = run(&request, &present)?;
        let second = run(&request, &present)?;
        prop_assert_eq!(first, second);
    }
}

/// `planner::P1`-P8 for every presence set of small hybrid layouts (one full, one window group),
/// checked against the brute-force reference.
#[test]
fn test_exhaustive_small_hybrid_layouts() -> Result<(), String> {
    let mut checked = 0usize;
    for t in 1..=2 {
        for prompt in 0..=(5 * t + 1) {
            for local in (0..=prompt).step_by(t) {
                for (window_tokens, sink_tokens) in [(1, 0), (2, 1), (3, 0), (3, 2)] {
                    for rewind in 0..=2 {
                        // Checkpoints (R28) every 2 blocks with fallback off, off with it on.
                        for (fallback, chunk, checkpoint) in [
                            (false, 4096, 2),
                            (false, 4096, 0),
                            (true, 1, 0),
                            (true, 3, 2),
                        ] {
                            let request = LookupRequest {
                                tokens_per_block: t,
                                prompt_tokens: prompt,
                                local_match_tokens: local,
                                groups: vec![full(0), window(1, window_tokens, sink_tokens)],
                                rewind_tokens: rewind,
                                window_fallback: fallback,
                                checkpoint_tokens: std::num::NonZeroUsize::new(checkpoint * t),
                                probe_chunk_items: chunk,
                            };
                            checked += check_every_presence(&request)?;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100_000, "sweep shrank to {checked} cases");
    Ok(())
}

/// Runs `request` against every subset of the items below the candidate end.
fn check_every_presence(request: &LookupRequest) -> Result<usize, String> {
    let t = request.tokens_per_block;
    let end = request.prompt_tokens.saturating_sub(1) / t;
    let universe: Vec<(usize, GroupId)> = (0..end)
        .flat_map(|block| [(block, GroupId(0)), (block, GroupId(1))])
        .collect();
    let subsets = 1u32 << universe.len();
    for mask in 0..subsets {
        let present: Presence = universe
            .iter()
            .enumerate()
            .filter(|(index, _)| mask & (1 << index) != 0)
            .map(|(_, &item)| item)
            .collect();
        let trace = drive(request.clone(), &present).map_err(|e| e.to_string())?;
        check_post_conditions(request, &present, &trace)
            .map_err(|violation| format!("{violation} for {request:?} and {present:?}"))?;
    }
    Ok(usize::try_from(subsets).unwrap_or(usize::MAX))
}
