//! The lookup planner: for one request, which blocks to probe in the pool and then which
//! prefix to offer (`docs/DESIGN.md` section 5, R10-R15).
//!
//! The planner knows nothing of keys, shards or the pool. It speaks in probe items
//! `(block index, group)`; the caller (the lookup-planner actor) turns each item into the
//! keys of every shard and reports the item present only if every one of them is (R3).
//! Probing is modelled as a pure state machine so that the caller can issue the probes of
//! one round concurrently, and so that the planner can guarantee that no item is probed
//! twice (R14).
//!
//! ## Workflow
//!
//! ```text
//! let mut lookup = Lookup::new(request)?;           // validates the request
//! while let Some(round) = lookup.next_round() {     // items to probe, in chunks
//!     let present = probe(&round);                  // one bool per item, in order
//!     lookup.record(&round, &present)?;
//! }
//! let plan = lookup.finish();                       // outcome, resume point, loads
//! ```
//!
//! 1. **Initial round.** Full groups for every candidate block, plus, for every window
//!    group, the sink blocks and the window blocks that the rewind walk (R12) would need
//!    if every candidate were a hit. In the common case (a full hit whose window was
//!    saved) this one round decides the lookup.
//! 2. **Walk round** (only if `H` turns out smaller than the candidate end): the window
//!    blocks of the actual walk from `H*T` down to `H*T - R` that are still unknown.
//! 3. **Fallback rounds** (R13, only with `window_fallback`): further back, at most
//!    `probe_chunk_items` items per round, stopping at the first complete window.
//!
//! Window blocks are probed even below the local match (a complete window is a fact
//! about the pool, and window pages are saved only at prompt ends, R17) but never loaded
//! there (R15: the engine holds them). `src/core/planner.md` lists the decisions the
//! rules leave open, the lease trade-off of the rounds, and the properties (`planner::P1`..P12) the
//! planner keeps; tests cite them by number.
//!
//! ## Vocabulary used in this module
//!
//! - `T` tokens per block, `P` prompt tokens, `L` local match tokens (`num_computed`).
//! - Candidate blocks are `[L/T, (P-1)/T)`: full blocks after the local match, never the
//!   block holding the last prompt token. `c_lo = L/T`, `c_hi = max(c_lo, (P-1)/T)`.
//! - `H` (hit blocks, counted from block 0) is `c_lo` plus the longest run of candidates
//!   present for every full group (R10). With no full group nothing constrains it and
//!   `H = c_hi`.
//! - A resume point `e` is always a block boundary `k*T`; the code mostly works with the
//!   end block `k`.

#[cfg(test)]
mod checkpoint_tests;
mod geometry;
mod lookup;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod testkit;

use std::fmt;

use crate::core::layout::{Attention, GroupId, Layout};

pub use lookup::Lookup;

/// The blocks a load resuming at `end_tokens` fills in a group of `attention` (R15), from
/// `start_tokens` on (the blocks below are the engine's own): every block for a full
/// group, the sink blocks and the window of the resume point for a window group; what a
/// plan's [`GroupLoad::blocks`] holds for that group. `T = tokens_per_block` (at least 1).
pub fn load_blocks(
    attention: crate::core::layout::Attention,
    tokens_per_block: usize,
    start_tokens: usize,
    end_tokens: usize,
) -> Vec<usize> {
    let t = tokens_per_block.max(1);
    let (floor, end_block) = (start_tokens.div_ceil(t), end_tokens / t);
    match attention.kind {
        crate::core::layout::GroupKind::Full => (floor..end_block).collect(),
        crate::core::layout::GroupKind::Window => geometry::window_resume_ranges(
            attention.window_tokens,
            attention.sink_tokens.div_ceil(t),
            t,
            end_block,
        )
        .into_iter()
        .flatten()
        .filter(|&block| block >= floor)
        .collect(),
    }
}

/// One layer group of the layout, reduced to what the planner needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannerGroup {
    /// The group id (the `lg{group}` key segment).
    pub id: GroupId,
    /// Full attention (every block before the resume point is needed) or a window of `W`
    /// tokens with `S` sinks.
    pub attention: Attention,
}

impl PlannerGroup {
    /// The planner's view of every group of `layout`, in layout order.
    pub fn of_layout(layout: &Layout) -> Vec<PlannerGroup> {
        layout
            .groups
            .iter()
            .map(|group| PlannerGroup {
                id: group.id,
                attention: group.attention(),
            })
            .collect()
    }
}

/// Everything the planner needs to know about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupRequest {
    /// `T`: tokens per KV block; at least 1.
    pub tokens_per_block: usize,
    /// `P`: tokens in the prompt.
    pub prompt_tokens: usize,
    /// `L`: tokens the engine already matched in its own cache (`num_computed`); block
    /// aligned and at most `prompt_tokens`.
    pub local_match_tokens: usize,
    /// The layout's groups (target and draft), in the order loads are reported.
    pub groups: Vec<PlannerGroup>,
    /// `R` (`swa_endpoint_rewind_tokens`): how far below `H*T` the walk may resume (R12).
    pub rewind_tokens: usize,
    /// Whether to probe further back for an earlier complete window (R13).
    pub window_fallback: bool,
    /// The window checkpoint interval `I` in tokens (R28), a multiple of `T`; `None`:
    /// off. Every positive multiple of it is a resume point like a prompt end.
    pub checkpoint_tokens: Option<std::num::NonZeroUsize>,
    /// Items per concurrent probe chunk: the configured `probe_chunk` keys divided by the
    /// number of shard keys behind one item, at least 1 (R10).
    pub probe_chunk_items: usize,
}

/// One thing to probe: a block of one group, across every shard (R3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProbeItem {
    /// The block index (block `i` covers tokens `[i*T, (i+1)*T)`).
    pub block: usize,
    /// The group the block belongs to.
    pub group: GroupId,
}

/// Identifies a round within one lookup, so a stale or foreign answer is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RoundId(pub u32);

impl fmt::Display for RoundId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a round was issued (for stats and traces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundKind {
    /// Full groups for every candidate, window groups for the walk at the largest `H`.
    Initial,
    /// Window blocks of the walk from the actual `H` that the initial round missed.
    Walk,
    /// Window blocks of checkpoints below the walk (R28).
    Checkpoint,
    /// Window blocks further back, for an earlier complete window (R13).
    Fallback,
}

impl RoundKind {
    /// A short, stable label for metrics and logs.
    #[cfg(feature = "internals")]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initial => "initial",
            Self::Walk => "walk",
            Self::Checkpoint => "checkpoint",
            Self::Fallback => "fallback",
        }
    }
}

/// A set of items the caller probes concurrently, then reports with [`Lookup::record`].
///
/// Items are sorted by (group order in the request, block) so that the caller can build
/// keys column-wise (R3). Only a [`Lookup`] creates rounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeRound {
    id: RoundId,
    kind: RoundKind,
    items: Vec<ProbeItem>,
    chunk_items: usize,
}

impl ProbeRound {
    /// This round's id.
    #[cfg(feature = "internals")]
    pub fn id(&self) -> RoundId {
        self.id
    }

    /// Why this round was issued.
    #[cfg(feature = "internals")]
    pub fn kind(&self) -> RoundKind {
        self.kind
    }

    /// Every item of the round; the answer to [`Lookup::record`] follows this order.
    pub fn items(&self) -> &[ProbeItem] {
        &self.items
    }

    /// The items split into chunks of at most `probe_chunk_items`, to issue concurrently.
    #[cfg(feature = "internals")]
    pub fn chunks(&self) -> std::slice::Chunks<'_, ProbeItem> {
        self.items.chunks(self.chunk_items)
    }
}

/// How a lookup ended (R11-R13); the labels are the stats names of R27.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum LookupOutcome {
    /// Resumes at `H*T`: every full group hit up to there and every window is complete.
    Full,
    /// Resumes within `R` tokens below `H*T`, where every window is complete (R12).
    Rewound,
    /// Resumes below the walk at a window checkpoint, a multiple of the checkpoint
    /// interval whose window is complete (R28).
    Checkpoint,
    /// Resumes further back, at an earlier complete window found by fallback (R13).
    Recovered,
    /// Full groups hit, but no complete window at an acceptable resume point.
    WindowMiss,
    /// No candidate block is present for every full group (`H*T <= L`).
    FullMiss,
}

impl LookupOutcome {
    /// The label used in stats (R27).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Rewound => "rewound",
            Self::Checkpoint => "checkpoint",
            Self::Recovered => "recovered",
            Self::WindowMiss => "window_miss",
            Self::FullMiss => "full_miss",
        }
    }

    /// Whether the outcome offers tokens to the engine.
    pub fn offers(self) -> bool {
        matches!(
            self,
            Self::Full | Self::Rewound | Self::Checkpoint | Self::Recovered
        )
    }
}

/// The blocks of one group to load from the pool (R15).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupLoad {
    /// The group.
    pub group: GroupId,
    /// Block indices, ascending, each seen present in this lookup.
    pub blocks: Vec<usize>,
}

/// The result of a lookup.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LookupPlan {
    /// How the lookup ended.
    pub outcome: LookupOutcome,
    /// `e`: the first token the engine computes; equals `local_match_tokens` when
    /// nothing is offered, otherwise a block boundary above it.
    pub resume_tokens: usize,
    /// `L`, echoed so that `resume_tokens - local_match_tokens` reads on its own.
    pub local_match_tokens: usize,
    /// `H*T`: how far every full group hit (R10), whatever the windows say.
    pub full_hit_tokens: usize,
    /// `e - L`: tokens offered to the engine (0 when nothing is offered).
    pub offered_tokens: usize,
    /// One entry per request group, in request order, when tokens are offered; empty
    /// otherwise. A window group whose window lies under the local match has no blocks.
    pub loads: Vec<GroupLoad>,
    /// Rounds issued by this lookup.
    pub rounds: usize,
    /// Items reported by [`Lookup::record`] (each probed once, R14).
    pub probed_items: usize,
}

impl LookupPlan {
    /// Total blocks to load, over every group.
    pub fn load_blocks(&self) -> usize {
        self.loads.iter().map(|load| load.blocks.len()).sum()
    }
}

/// Errors of the planner: an invalid request, or an answer that does not fit its round.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The layout's block size is zero.
    #[error("tokens_per_block must be at least 1 (for example 32), got 0")]
    ZeroTokensPerBlock,
    /// The local match does not end on a block boundary.
    #[error(
        "local match of {local_match_tokens} tokens is not a multiple of tokens_per_block {tokens_per_block}"
    )]
    LocalMatchNotBlockAligned {
        /// The local match passed.
        local_match_tokens: usize,
        /// `T`.
        tokens_per_block: usize,
    },
    /// The local match is longer than the prompt.
    #[error(
        "local match of {local_match_tokens} tokens exceeds the prompt of {prompt_tokens} tokens"
    )]
    LocalMatchBeyondPrompt {
        /// The local match passed.
        local_match_tokens: usize,
        /// `P`.
        prompt_tokens: usize,
    },
    /// The request lists no group.
    #[error("a lookup needs at least one layer group")]
    NoGroups,
    /// Two groups share an id.
    #[error("group {group} is listed twice")]
    DuplicateGroup {
        /// The repeated id.
        group: GroupId,
    },
    /// A window group has a window of zero tokens (R7).
    #[error("window group {group} has a window of 0 tokens; a window needs at least 1 token")]
    ZeroWindow {
        /// The group.
        group: GroupId,
    },
    /// A window group's sinks are not below its window (R7).
    #[error("window group {group} has {sink_tokens} sink tokens, not below its window of {window_tokens}")]
    SinksNotBelowWindow {
        /// The group.
        group: GroupId,
        /// `S`.
        sink_tokens: usize,
        /// `W`.
        window_tokens: usize,
    },
    /// The checkpoint interval is not a whole number of blocks (R28).
    #[error(
        "saver.window_checkpoint_tokens = {checkpoint_tokens} is not a multiple of tokens_per_block {tokens_per_block}; use a multiple such as {}",
        (checkpoint_tokens / tokens_per_block).max(1) * tokens_per_block
    )]
    CheckpointNotBlockAligned {
        /// `I`.
        checkpoint_tokens: usize,
        /// `T`.
        tokens_per_block: usize,
    },
    /// Probe chunks of zero items.
    #[error("probe_chunk_items must be at least 1 (probe_chunk = 4096 works)")]
    ZeroProbeChunk,
    /// An answer was recorded while no round was outstanding.
    #[error("answer for round {round} recorded, but no round is outstanding")]
    NoRoundPending {
        /// The round the answer claims to be for.
        round: RoundId,
    },
    /// An answer is for a round other than the outstanding one.
    #[error("answer for round {round} recorded, but round {pending} is outstanding")]
    UnknownRound {
        /// The round the answer claims to be for.
        round: RoundId,
        /// The outstanding round.
        pending: RoundId,
    },
    /// The answer names the outstanding round id but other items: a round of another
    /// lookup.
    #[error("round {round} does not belong to this lookup")]
    ForeignRound {
        /// The round the answer claims to be for.
        round: RoundId,
    },
    /// The answer has a different length than the round.
    #[error("round {round} has {expected} items, but {got} answers were recorded")]
    PresenceLengthMismatch {
        /// The round.
        round: RoundId,
        /// Items in the round.
        expected: usize,
        /// Answers recorded.
        got: usize,
    },
}

#[cfg(any(feature = "replay", feature = "internals"))]
impl PlanError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ZeroTokensPerBlock => "zero_tokens_per_block",
            Self::LocalMatchNotBlockAligned { .. } => "local_match_not_block_aligned",
            Self::LocalMatchBeyondPrompt { .. } => "local_match_beyond_prompt",
            Self::NoGroups => "no_groups",
            Self::DuplicateGroup { .. } => "duplicate_group",
            Self::ZeroWindow { .. } => "zero_window",
            Self::SinksNotBelowWindow { .. } => "sinks_not_below_window",
            Self::CheckpointNotBlockAligned { .. } => "checkpoint_not_block_aligned",
            Self::ZeroProbeChunk => "zero_probe_chunk",
            Self::NoRoundPending { .. } => "no_round_pending",
            Self::UnknownRound { .. } => "unknown_round",
            Self::ForeignRound { .. } => "foreign_round",
            Self::PresenceLengthMismatch { .. } => "presence_length_mismatch",
        }
    }
}
