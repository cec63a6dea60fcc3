//! Which blocks of a request to save in one step, and at which priority (R16-R21): pure
//! logic, tested without actors.
//!
//! - Full-attention groups save the blocks completed by the end of the current chunk
//!   (R16), except those that came from the pool or the local match (R19).
//! - Window groups save once, at the prompt's last chunk: the sink blocks and the blocks
//!   overlapping `[P - W - R, P)`, full blocks only (R17).
//! - Window checkpoints (R28): at every multiple `c` of the checkpoint interval that a
//!   chunk passes (`computed_before < c <= computed_after`, `c <= P`), window groups
//!   also save the sink blocks and the blocks overlapping `[c - W, c)`: what their window
//!   reads to resume at `c`. A step's window ranges are merged, so no block is listed
//!   twice.
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

mod schedule;

pub use schedule::window_save_schedule;

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
    /// The window checkpoint interval (R28); `None`: off.
    pub checkpoint_tokens: Option<NonZeroUsize>,
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
#[cfg(feature = "internals")]
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
#[cfg(feature = "internals")]
fn each_block(ranges: Vec<(Range<usize>, SavePriority)>) -> Vec<(usize, SavePriority)> {
    ranges
        .into_iter()
        .flat_map(|(blocks, priority)| blocks.map(move |block| (block, priority)))
        .collect()
}

/// [`blocks_to_save`] (with an explicit cap) as ascending, disjoint ranges with their
/// priority, written into a caller's buffer (cleared first): the engine thread reuses one
/// buffer and copies page numbers range by range.
pub fn block_ranges_to_save(
    attention: Attention,
    step: &SaveStep,
    cap: SaveCap,
    ranges: &mut Vec<(Range<usize>, SavePriority)>,
) {
    let cap_tokens = match cap {
        SaveCap::ChunkEnd => step.computed_after,
        #[cfg(test)]
        SaveCap::PromptEnd => step.prompt_len,
    };
    ranges_up_to(attention, step, cap_tokens, ranges);
}

/// [`block_ranges_to_save`] with the cap in tokens: no planned block ends past
/// `cap_tokens`.
fn ranges_up_to(
    attention: Attention,
    step: &SaveStep,
    cap_tokens: usize,
    ranges: &mut Vec<(Range<usize>, SavePriority)>,
) {
    ranges.clear();
    let t = step.tokens_per_block.max(1);
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
        } => {
            // R16: a sink block past a mid-prompt chunk end waits for a later chunk.
            let end = cap_tokens.min(step.prompt_len) / t;
            for blocks in window_spans(step, window_tokens, sink_tokens) {
                push(
                    blocks.start..blocks.end.min(end),
                    reused_blocks,
                    SavePriority::Window,
                );
            }
        }
    }
}

/// How many of the blocks [`blocks_to_save`] plans for `attention` this step are there
/// for window checkpoints alone (R28): neither sinks nor tail a prompt end saves (R17).
/// Zero for full groups, with checkpoints off, or when the chunk passes no checkpoint.
pub fn checkpoint_only_blocks(attention: Attention, step: &SaveStep) -> usize {
    if attention.kind != GroupKind::Window || checkpoints_passed(step).next().is_none() {
        return 0;
    }
    let count = |step: &SaveStep| {
        let mut ranges = Vec::new();
        block_ranges_to_save(attention, step, SaveCap::ChunkEnd, &mut ranges);
        ranges.iter().map(|(blocks, _)| blocks.len()).sum::<usize>()
    };
    let without = SaveStep {
        checkpoint_tokens: None,
        ..*step
    };
    count(step).saturating_sub(count(&without))
}

/// The window group's blocks to save this step (R17, R28), as ascending, disjoint,
/// non-adjacent ranges (before the prompt-block and reuse bounds): the sink blocks and
/// each checkpoint window the chunk passes, and at the last chunk the tail reaching
/// `W + R` back; nothing when neither happens.
fn window_spans(
    step: &SaveStep,
    window_tokens: usize,
    sink_tokens: usize,
) -> impl Iterator<Item = Range<usize>> {
    let t = step.tokens_per_block.max(1);
    let mut spans: Vec<Range<usize>> = checkpoints_passed(step)
        .map(|c| c.saturating_sub(window_tokens) / t..c / t)
        .collect();
    if step.last_chunk {
        let reach = window_tokens + step.rewind_tokens;
        spans.push(step.prompt_len.saturating_sub(reach) / t..step.prompt_len / t);
    }
    if !spans.is_empty() {
        spans.push(0..sink_tokens.div_ceil(t));
    }
    spans.sort_unstable_by_key(|span| span.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans.into_iter().filter(|span| !span.is_empty()) {
        match merged.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    merged.into_iter()
}

/// The checkpoints this step's chunk passes (R28): multiples `c` of the interval with
/// `computed_before < c <= min(computed_after, P)`, ascending.
fn checkpoints_passed(step: &SaveStep) -> impl Iterator<Item = usize> {
    let every = step.checkpoint_tokens.map_or(0, NonZeroUsize::get);
    let end = step.computed_after.min(step.prompt_len);
    let first = match every {
        0 => usize::MAX,
        _ => (step.computed_before / every + 1).saturating_mul(every),
    };
    std::iter::successors(Some(first), move |&c| c.checked_add(every))
        .take_while(move |&c| every > 0 && c <= end)
}

#[cfg(test)]
mod tests;
