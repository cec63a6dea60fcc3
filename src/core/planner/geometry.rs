//! The validated shape of one lookup: candidate range, walk range, window spans, loads.
//!
//! Everything here is arithmetic on block indices; it knows nothing of what is present.
//! Invariants, established by [`Geometry::new`]:
//!
//! - `geometry::I1`. `tokens_per_block >= 1`, `probe_chunk_items >= 1`, at least one group, group
//!   ids unique, every window `W >= 1` with `S < W`.
//! - `geometry::I2`. `first_candidate <= candidate_end`, and `candidate_end * T <= P - 1` whenever
//!   there is a candidate, so no resume point reaches the block holding the last prompt
//!   token.
//! - `geometry::I3`. Every block a window span of an end block `k <= candidate_end` names is below
//!   `k`, so every probe item lies in `[0, candidate_end)`.

use std::ops::Range;

use super::{GroupLoad, LookupRequest, PlanError, PlannerGroup};
use crate::core::layout::{Attention, GroupKind};

/// A window group, with its sinks already in blocks.
#[derive(Clone, Copy, Debug)]
pub(super) struct WindowSpec {
    /// Position of the group in the request.
    pub(super) pos: usize,
    /// `W`.
    pub(super) window_tokens: usize,
    /// `ceil(S/T)`: the sink blocks are `[0, sink_blocks)` (R12).
    pub(super) sink_blocks: usize,
}

/// The validated request (`geometry::I1`..G-I3).
#[derive(Clone, Debug)]
pub(super) struct Geometry {
    /// `T`.
    pub(super) tokens_per_block: usize,
    /// `L`.
    pub(super) local_match_tokens: usize,
    /// `c_lo = L/T`: the first candidate block.
    pub(super) first_candidate: usize,
    /// `c_hi`: one past the last candidate block; never the block of token `P-1`.
    pub(super) candidate_end: usize,
    /// `floor(R/T)`: how many block steps the walk may take below `H` (R12).
    pub(super) rewind_blocks: usize,
    /// R13 on or off.
    pub(super) window_fallback: bool,
    /// `I/T`: checkpoint end blocks are its positive multiples (R28); `None`: off.
    pub(super) checkpoint_blocks: Option<usize>,
    /// Items per probe chunk, and per fallback round.
    pub(super) probe_chunk_items: usize,
    /// The groups, in request order.
    pub(super) groups: Vec<PlannerGroup>,
    /// Positions of the full groups.
    pub(super) full: Vec<usize>,
    /// The window groups.
    pub(super) windows: Vec<WindowSpec>,
}

impl Geometry {
    /// Validates a request (`geometry::I1`) and derives the candidate range (`geometry::I2`).
    pub(super) fn new(request: LookupRequest) -> Result<Self, PlanError> {
        let LookupRequest {
            tokens_per_block,
            prompt_tokens,
            local_match_tokens,
            groups,
            rewind_tokens,
            window_fallback,
            checkpoint_tokens,
            probe_chunk_items,
        } = request;
        if tokens_per_block == 0 {
            return Err(PlanError::ZeroTokensPerBlock);
        }
        if probe_chunk_items == 0 {
            return Err(PlanError::ZeroProbeChunk);
        }
        if local_match_tokens % tokens_per_block != 0 {
            return Err(PlanError::LocalMatchNotBlockAligned {
                local_match_tokens,
                tokens_per_block,
            });
        }
        if local_match_tokens > prompt_tokens {
            return Err(PlanError::LocalMatchBeyondPrompt {
                local_match_tokens,
                prompt_tokens,
            });
        }
        let checkpoint_blocks = match checkpoint_tokens.map(std::num::NonZeroUsize::get) {
            None => None,
            Some(tokens) if tokens % tokens_per_block == 0 => Some(tokens / tokens_per_block),
            Some(checkpoint_tokens) => {
                return Err(PlanError::CheckpointNotBlockAligned {
                    checkpoint_tokens,
                    tokens_per_block,
                })
            }
        };
        let (full, windows) = split_groups(&groups, tokens_per_block)?;
        let first_candidate = local_match_tokens / tokens_per_block;
        // The block holding token P-1 is never a candidate: the engine computes at least
        // one token. `(P-1)/T` is that block's index, so it is also the candidate end.
        let last_token_block = prompt_tokens.saturating_sub(1) / tokens_per_block;
        let candidate_end = last_token_block.max(first_candidate);
        Ok(Self {
            tokens_per_block,
            local_match_tokens,
            first_candidate,
            candidate_end,
            rewind_blocks: rewind_tokens / tokens_per_block,
            window_fallback,
            checkpoint_blocks,
            probe_chunk_items,
            groups,
            full,
            windows,
        })
    }

    /// Whether any block is a candidate at all.
    pub(super) fn has_candidates(&self) -> bool {
        self.candidate_end > self.first_candidate
    }

    /// The lowest end block the walk from `hit_blocks` visits (R12): `R` tokens below
    /// `H*T`, but always above the local match (an offer must exceed it).
    pub(super) fn walk_low(&self, hit_blocks: usize) -> usize {
        hit_blocks
            .saturating_sub(self.rewind_blocks)
            .max(self.first_candidate + 1)
    }

    /// The checkpoint end blocks below `below` and above the local match, highest first
    /// (R28); none when checkpoints are off.
    pub(super) fn checkpoints_below(&self, below: usize) -> impl Iterator<Item = usize> {
        let every = self.checkpoint_blocks.unwrap_or(0);
        let first = self.first_candidate;
        let highest = match every {
            0 => 0,
            _ => below.saturating_sub(1) / every * every,
        };
        std::iter::successors(Some(highest), move |&block| block.checked_sub(every))
            .take_while(move |&block| every > 0 && block > first)
    }

    /// The blocks of `window` needed to resume at end block `end_block` (R12): the sink
    /// blocks and the blocks overlapping `[max(0, e-W), e)`, as two disjoint ascending
    /// ranges, both below `end_block` (`geometry::I3`). Sink blocks at or past `e` are not needed:
    /// the engine computes those tokens.
    pub(super) fn window_ranges(&self, window: WindowSpec, end_block: usize) -> [Range<usize>; 2] {
        window_resume_ranges(
            window.window_tokens,
            window.sink_blocks,
            self.tokens_per_block,
            end_block,
        )
    }

    /// The loads for resuming at `end_block` (R15), one entry per group in request
    /// order. Blocks below the local match are left out: the engine holds them.
    pub(super) fn loads(&self, end_block: usize) -> Vec<GroupLoad> {
        let floor = self.first_candidate;
        self.groups
            .iter()
            .enumerate()
            .map(|(pos, group)| {
                let blocks = match self.windows.iter().find(|window| window.pos == pos) {
                    None => (floor..end_block).collect(),
                    Some(&window) => self
                        .window_ranges(window, end_block)
                        .into_iter()
                        .flatten()
                        .filter(|&block| block >= floor)
                        .collect(),
                };
                GroupLoad {
                    group: group.id,
                    blocks,
                }
            })
            .collect()
    }
}

/// Checks the groups (`geometry::I1`) and splits them into full positions and window specs.
fn split_groups(
    groups: &[PlannerGroup],
    tokens_per_block: usize,
) -> Result<(Vec<usize>, Vec<WindowSpec>), PlanError> {
    if groups.is_empty() {
        return Err(PlanError::NoGroups);
    }
    let mut full = Vec::new();
    let mut windows = Vec::new();
    for (pos, group) in groups.iter().enumerate() {
        if groups[..pos].iter().any(|earlier| earlier.id == group.id) {
            return Err(PlanError::DuplicateGroup { group: group.id });
        }
        match group.attention {
            Attention {
                kind: GroupKind::Full,
                ..
            } => full.push(pos),
            Attention {
                kind: GroupKind::Window,
                window_tokens,
                sink_tokens,
            } => {
                if window_tokens == 0 {
                    return Err(PlanError::ZeroWindow { group: group.id });
                }
                if sink_tokens >= window_tokens {
                    return Err(PlanError::SinksNotBelowWindow {
                        group: group.id,
                        sink_tokens,
                        window_tokens,
                    });
                }
                windows.push(WindowSpec {
                    pos,
                    window_tokens,
                    sink_blocks: sink_tokens.div_ceil(tokens_per_block),
                });
            }
        }
    }
    Ok((full, windows))
}

/// The blocks of a window group of `W = window_tokens` and `sink_blocks` sink blocks
/// needed to resume at end block `end_block` (R12, R15): the sink blocks and the blocks
/// overlapping `[max(0, e-W), e)`, as two disjoint ascending ranges, both below
/// `end_block` (`geometry::I3`).
pub(super) fn window_resume_ranges(
    window_tokens: usize,
    sink_blocks: usize,
    tokens_per_block: usize,
    end_block: usize,
) -> [Range<usize>; 2] {
    let sinks = 0..sink_blocks.min(end_block);
    let resume_tokens = end_block * tokens_per_block;
    let first = resume_tokens.saturating_sub(window_tokens) / tokens_per_block;
    let span = first.max(sinks.end)..end_block;
    [sinks, span]
}
