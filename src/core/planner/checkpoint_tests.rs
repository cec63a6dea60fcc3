//! Window checkpoints in the lookup (R28): a checkpoint is a resume point below the walk
//! like a prompt end, probed before the fallback scans, and the fallback still wins when
//! it finds a later complete window.

use std::num::NonZeroUsize;

use super::testkit::{check_post_conditions, drive, full, items, request, window, Presence};
use super::{GroupLoad, LookupOutcome, LookupRequest, RoundKind};
use crate::core::layout::GroupId;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// T = 4, P = 33 (candidates 0..8), W = 8 and no sinks, rewind 0, checkpoints every 16
/// tokens (end blocks 4 and 8), fallback as given.
fn hybrid(fallback: bool, checkpoint_tokens: usize) -> LookupRequest {
    LookupRequest {
        window_fallback: fallback,
        checkpoint_tokens: NonZeroUsize::new(checkpoint_tokens),
        ..request(4, 33, 0, vec![full(0), window(1, 8, 0)])
    }
}

/// Every full block present; window group 1 holds the blocks of `windows`.
fn pool(windows: &[usize]) -> Presence {
    let mut present = items(0..8, &[0]);
    present.extend(items(windows.iter().copied(), &[1]));
    present
}

#[test]
fn the_walk_back_resumes_at_a_checkpoint_beyond_the_rewind_r28() -> TestResult {
    // The window of e = 16 (blocks 2 and 3) is stored; the prompt end at 32 has none.
    let present = pool(&[2, 3]);
    let request = hybrid(false, 16);
    let trace = drive(request.clone(), &present)?;
    check_post_conditions(&request, &present, &trace)?;
    assert_eq!(trace.plan.outcome, LookupOutcome::Checkpoint);
    assert_eq!(trace.plan.resume_tokens, 16);
    assert_eq!(
        trace.plan.loads,
        vec![
            GroupLoad {
                group: GroupId(0),
                blocks: (0..4).collect()
            },
            GroupLoad {
                group: GroupId(1),
                blocks: vec![2, 3]
            },
        ],
        "only the checkpoint's window is loaded (R15)"
    );
    assert_eq!(trace.count(RoundKind::Checkpoint), 1);
    // Without checkpoints and without fallback the same pool offers nothing.
    let off = drive(hybrid(false, 0), &present)?;
    assert_eq!(off.plan.outcome, LookupOutcome::WindowMiss);
    Ok(())
}

#[test]
fn only_multiples_of_the_interval_are_checkpoints_r28() -> TestResult {
    // The windows of e = 24 (blocks 4, 5) and e = 16 (2, 3) are stored; 24 is no
    // checkpoint, so without fallback the lookup resumes at 16.
    let present = pool(&[2, 3, 4, 5]);
    let trace = drive(hybrid(false, 16), &present)?;
    assert_eq!(
        (trace.plan.outcome, trace.plan.resume_tokens),
        (LookupOutcome::Checkpoint, 16)
    );
    Ok(())
}

#[test]
fn the_fallback_still_finds_a_later_complete_window_above_a_checkpoint_r13_r28() -> TestResult {
    let present = pool(&[2, 3, 4, 5]);
    let request = hybrid(true, 16);
    let trace = drive(request.clone(), &present)?;
    check_post_conditions(&request, &present, &trace)?;
    assert_eq!(
        (trace.plan.outcome, trace.plan.resume_tokens),
        (LookupOutcome::Recovered, 24)
    );
    let kinds: Vec<RoundKind> = trace.rounds.iter().map(super::ProbeRound::kind).collect();
    assert_eq!(
        kinds,
        vec![
            RoundKind::Initial,
            RoundKind::Checkpoint,
            RoundKind::Fallback
        ]
    );
    Ok(())
}

#[test]
fn the_fallback_falls_back_to_the_checkpoint_when_nothing_above_is_complete_r13_r28() -> TestResult
{
    // Window of 16 stored and block 5, block 4 missing: nothing between 16 and the walk
    // is complete (20 and 24 need block 4, 28 and 32 block 6).
    let present = pool(&[2, 3, 5]);
    let request = hybrid(true, 16);
    let trace = drive(request.clone(), &present)?;
    check_post_conditions(&request, &present, &trace)?;
    assert_eq!(
        (trace.plan.outcome, trace.plan.resume_tokens),
        (LookupOutcome::Checkpoint, 16)
    );
    // The fallback never scans below the checkpoint it already has.
    let probed_below: Vec<usize> = trace
        .rounds
        .iter()
        .filter(|round| round.kind() == RoundKind::Fallback)
        .flat_map(|round| round.items().iter().map(|item| item.block))
        .filter(|&block| block < 2)
        .collect();
    assert!(probed_below.is_empty(), "probed {probed_below:?}");
    Ok(())
}

#[test]
fn a_checkpoint_interval_that_is_not_whole_blocks_is_refused() {
    let error = super::Lookup::new(hybrid(true, 6)).err();
    assert_eq!(
        error.map(|error| error.kind()),
        Some("checkpoint_not_block_aligned")
    );
}
