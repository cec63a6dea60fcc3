//! Test support for the planner: a driver that answers rounds from a presence set, a
//! brute-force reference of R10-R15 written independently of the planner (in tokens,
//! straight from `docs/DESIGN.md` section 5), and the post-condition checks of `planner.md`.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    GroupLoad, Lookup, LookupOutcome, LookupPlan, LookupRequest, PlanError, PlannerGroup,
    ProbeItem, ProbeRound, RoundKind,
};
use crate::core::layout::{Attention, GroupId, GroupKind};

/// Items present in the pool, as `(block, group)`.
pub(super) type Presence = BTreeSet<(usize, GroupId)>;

/// A full-attention group.
pub(super) fn full(id: u32) -> PlannerGroup {
    PlannerGroup {
        id: GroupId(id),
        attention: Attention::FULL,
    }
}

/// A window group with `W` window tokens and `S` sink tokens.
pub(super) fn window(id: u32, window_tokens: usize, sink_tokens: usize) -> PlannerGroup {
    PlannerGroup {
        id: GroupId(id),
        attention: Attention::window(window_tokens, sink_tokens),
    }
}

/// A request with rewind 0, fallback on and large chunks; tests override fields.
pub(super) fn request(
    tokens_per_block: usize,
    prompt_tokens: usize,
    local_match_tokens: usize,
    groups: Vec<PlannerGroup>,
) -> LookupRequest {
    LookupRequest {
        tokens_per_block,
        prompt_tokens,
        local_match_tokens,
        groups,
        rewind_tokens: 0,
        window_fallback: true,
        checkpoint_tokens: None,
        probe_chunk_items: 4096,
    }
}

/// Whether `e` tokens is a window checkpoint of `request` (R28).
fn is_checkpoint(request: &LookupRequest, e: usize) -> bool {
    request
        .checkpoint_tokens
        .is_some_and(|every| e > 0 && e % every.get() == 0)
}

/// Every `(block, group)` with `block` in `blocks`, for each group in `groups`.
pub(super) fn items(blocks: impl IntoIterator<Item = usize>, groups: &[u32]) -> Presence {
    let blocks: Vec<usize> = blocks.into_iter().collect();
    let mut set = Presence::new();
    for &group in groups {
        set.extend(blocks.iter().map(|&block| (block, GroupId(group))));
    }
    set
}

/// What a lookup did: its rounds, the answers given, and the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Trace {
    pub(super) rounds: Vec<ProbeRound>,
    pub(super) answers: Vec<Vec<bool>>,
    pub(super) plan: LookupPlan,
}

impl Trace {
    /// Items answered present.
    pub(super) fn seen_present(&self) -> Presence {
        let mut set = Presence::new();
        for (round, answers) in self.rounds.iter().zip(&self.answers) {
            for (item, &present) in round.items().iter().zip(answers) {
                if present {
                    set.insert((item.block, item.group));
                }
            }
        }
        set
    }

    /// Every probed item, in issue order.
    pub(super) fn probed(&self) -> Vec<ProbeItem> {
        self.rounds
            .iter()
            .flat_map(|round| round.items().to_vec())
            .collect()
    }

    /// Rounds of one kind.
    pub(super) fn count(&self, kind: RoundKind) -> usize {
        self.rounds
            .iter()
            .filter(|round| round.kind() == kind)
            .count()
    }
}

/// Runs a lookup against `present`, stopping after `max_rounds` rounds (then finishing
/// early). Fails the test if the planner issues more than 100 000 rounds.
pub(super) fn drive_at_most(
    request: LookupRequest,
    present: &Presence,
    max_rounds: usize,
) -> Result<Trace, PlanError> {
    let mut lookup = Lookup::new(request)?;
    let mut rounds = Vec::new();
    let mut answers = Vec::new();
    while rounds.len() < max_rounds {
        let Some(round) = lookup.next_round() else {
            break;
        };
        assert!(rounds.len() < 100_000, "unbounded probing");
        let answer: Vec<bool> = round
            .items()
            .iter()
            .map(|item| present.contains(&(item.block, item.group)))
            .collect();
        lookup.record(&round, &answer)?;
        rounds.push(round);
        answers.push(answer);
    }
    let plan = lookup.finish();
    Ok(Trace {
        rounds,
        answers,
        plan,
    })
}

/// Runs a lookup against `present` to the end.
pub(super) fn drive(request: LookupRequest, present: &Presence) -> Result<Trace, PlanError> {
    drive_at_most(request, present, usize::MAX)
}

/// `(c_lo, c_hi)` straight from `docs/DESIGN.md` section 5.
pub(super) fn candidate_range(request: &LookupRequest) -> (usize, usize) {
    let t = request.tokens_per_block;
    let first = request.local_match_tokens / t;
    // Full blocks whose last token is before the prompt's last token P-1.
    let mut end = first;
    while (end + 1) * t < request.prompt_tokens {
        end += 1;
    }
    (first, end)
}

/// Whether block `block` is needed by window group (W, S) to resume at token `e`.
fn window_needs(
    t: usize,
    e: usize,
    window_tokens: usize,
    sink_tokens: usize,
    block: usize,
) -> bool {
    let start = block * t;
    let end = start + t;
    let in_window = start < e && end > e.saturating_sub(window_tokens);
    let is_sink = start < sink_tokens && start < e;
    in_window || is_sink
}

/// The window of resume point `e` is complete (R12), by brute force over blocks.
fn window_complete(request: &LookupRequest, present: &Presence, e: usize) -> bool {
    let t = request.tokens_per_block;
    request.groups.iter().all(|group| match group.attention {
        Attention {
            kind: GroupKind::Full,
            ..
        } => true,
        Attention {
            kind: GroupKind::Window,
            window_tokens,
            sink_tokens,
        } => (0..e.div_ceil(t))
            .filter(|&block| window_needs(t, e, window_tokens, sink_tokens, block))
            .all(|block| present.contains(&(block, group.id))),
    })
}

/// The reference `(outcome, e, H*T)` of R10-R13 for a request against `present`.
pub(super) fn reference(
    request: &LookupRequest,
    present: &Presence,
) -> (LookupOutcome, usize, usize) {
    let t = request.tokens_per_block;
    let local = request.local_match_tokens;
    let (first, end) = candidate_range(request);
    let is_full = |group: &&PlannerGroup| group.attention.kind == GroupKind::Full;
    let has_window = request.groups.iter().any(|group| !is_full(&group));
    let mut hit = first;
    while hit < end
        && request
            .groups
            .iter()
            .filter(is_full)
            .all(|group| present.contains(&(hit, group.id)))
    {
        hit += 1;
    }
    let hit_tokens = hit * t;
    if hit_tokens <= local {
        return (LookupOutcome::FullMiss, local, hit_tokens);
    }
    if !has_window {
        return (LookupOutcome::Full, hit_tokens, hit_tokens);
    }
    // The latest `e` the rules allow whose window is complete: within `R` of the hit
    // (R12), a checkpoint (R28), or with fallback any other (R13).
    let mut e = hit_tokens;
    while e > local {
        let within_rewind = hit_tokens - e <= request.rewind_tokens;
        let checkpoint = !within_rewind && is_checkpoint(request, e);
        let allowed = within_rewind || checkpoint || request.window_fallback;
        if allowed && window_complete(request, present, e) {
            let outcome = if e == hit_tokens {
                LookupOutcome::Full
            } else if within_rewind {
                LookupOutcome::Rewound
            } else if checkpoint {
                LookupOutcome::Checkpoint
            } else {
                LookupOutcome::Recovered
            };
            return (outcome, e, hit_tokens);
        }
        e -= t;
    }
    (LookupOutcome::WindowMiss, local, hit_tokens)
}

/// The reference loads of R15 for resuming at `e`.
pub(super) fn reference_loads(request: &LookupRequest, e: usize) -> Vec<GroupLoad> {
    let t = request.tokens_per_block;
    let first = request.local_match_tokens / t;
    request
        .groups
        .iter()
        .map(|group| {
            let blocks = (first..e / t)
                .filter(|&block| match group.attention {
                    Attention {
                        kind: GroupKind::Full,
                        ..
                    } => true,
                    Attention {
                        kind: GroupKind::Window,
                        window_tokens,
                        sink_tokens,
                    } => window_needs(t, e, window_tokens, sink_tokens, block),
                })
                .collect();
            GroupLoad {
                group: group.id,
                blocks,
            }
        })
        .collect()
}

/// Checks `planner::P1`-P8 and `planner::P12` of `planner.md` for one finished trace of `request`
/// against `present`. Returns a description of the first violation.
pub(super) fn check_post_conditions(
    request: &LookupRequest,
    present: &Presence,
    trace: &Trace,
) -> Result<(), String> {
    let plan = &trace.plan;
    let t = request.tokens_per_block;
    let (first, end) = candidate_range(request);
    // `planner::P1`: only blocks seen present are loaded.
    let seen = trace.seen_present();
    for load in &plan.loads {
        for &block in &load.blocks {
            if !seen.contains(&(block, load.group)) {
                return Err(format!(
                    "planner::P1: loads block {block} of group {} unseen",
                    load.group
                ));
            }
        }
    }
    // `planner::P2`, `planner::P3`: resume point.
    let e = plan.resume_tokens;
    let offers = plan.outcome.offers();
    if offers && (e > end * t || e >= request.prompt_tokens) {
        return Err(format!(
            "planner::P2: resumes at {e}, past the last full block before token P-1"
        ));
    }
    if e % t != 0 || offers != (e > request.local_match_tokens) {
        return Err(format!(
            "planner::P3: resume {e} not aligned or not above local match"
        ));
    }
    if !offers && !plan.loads.is_empty() {
        return Err("planner::P3: loads without an offer".into());
    }
    if plan.offered_tokens != e - request.local_match_tokens {
        return Err("planner::P3: offered tokens differ from e - L".into());
    }
    // `planner::P4`: R10-R13.
    let (outcome, expected_e, hit_tokens) = reference(request, present);
    if (plan.outcome, e, plan.full_hit_tokens) != (outcome, expected_e, hit_tokens) {
        return Err(format!(
            "planner::P4: got {:?} at {e} (H*T {}), reference {outcome:?} at {expected_e} \
             (H*T {hit_tokens})",
            plan.outcome, plan.full_hit_tokens
        ));
    }
    // `planner::P5`: R15.
    if offers && plan.loads != reference_loads(request, e) {
        return Err(format!("planner::P5: loads {:?}", plan.loads));
    }
    check_probing(request, trace, first, end)
}

/// `planner::P6`-P8 and the counters: what was probed, in how many rounds and chunks.
fn check_probing(
    request: &LookupRequest,
    trace: &Trace,
    first: usize,
    end: usize,
) -> Result<(), String> {
    let plan = &trace.plan;
    let probed = trace.probed();
    let unique: BTreeSet<_> = probed.iter().collect();
    if unique.len() != probed.len() {
        return Err("planner::P6: an item was probed twice".into());
    }
    for item in &probed {
        let group = request.groups.iter().find(|group| group.id == item.group);
        let Some(group) = group else {
            return Err(format!("planner::P6: unknown group {}", item.group));
        };
        let floor = if group.attention.kind == GroupKind::Full {
            first
        } else {
            0
        };
        if item.block < floor || item.block >= end {
            return Err(format!(
                "planner::P6: probed block {} of group {}",
                item.block, item.group
            ));
        }
    }
    if trace.rounds.iter().any(|round| round.items().is_empty()) {
        return Err("planner::P6: empty round".into());
    }
    let windows = request
        .groups
        .iter()
        .filter(|g| g.attention.is_window())
        .count();
    let chunk = request.probe_chunk_items;
    let scan_rounds = (windows * end).div_ceil(chunk);
    let checkpoint_rounds = if request.checkpoint_tokens.is_some() {
        scan_rounds
    } else {
        0
    };
    let bound = match (end > first, windows, request.window_fallback) {
        (false, _, _) => 0,
        (true, 0, _) => 1,
        (true, _, false) => 2 + checkpoint_rounds,
        (true, _, true) => 2 + checkpoint_rounds + scan_rounds,
    };
    if trace.rounds.len() > bound {
        return Err(format!(
            "planner::P7: {} rounds, bound {bound}",
            trace.rounds.len()
        ));
    }
    let kinds: Vec<RoundKind> = trace.rounds.iter().map(ProbeRound::kind).collect();
    let walks = trace.count(RoundKind::Walk);
    let in_order = kinds.first().is_none_or(|&kind| kind == RoundKind::Initial)
        && kinds.iter().skip(1).all(|&kind| kind != RoundKind::Initial)
        && walks <= 1
        && (walks == 0 || kinds.get(1) == Some(&RoundKind::Walk))
        && (walks == 0 || plan.full_hit_tokens < end * request.tokens_per_block)
        && (request.window_fallback || trace.count(RoundKind::Fallback) == 0)
        && (request.checkpoint_tokens.is_some() || trace.count(RoundKind::Checkpoint) == 0)
        && kinds
            .windows(2)
            .all(|pair| !(pair[0] == RoundKind::Fallback && pair[1] == RoundKind::Checkpoint));
    if !in_order {
        return Err(format!("planner::P7: round kinds {kinds:?}"));
    }
    // `planner::P8`: chunks, and full fallback and checkpoint rounds but the last.
    let short = [RoundKind::Checkpoint, RoundKind::Fallback]
        .into_iter()
        .any(|kind| {
            let rounds: Vec<&ProbeRound> = trace
                .rounds
                .iter()
                .filter(|round| round.kind() == kind)
                .collect();
            rounds
                .iter()
                .rev()
                .skip(1)
                .any(|round| round.items().len() != chunk)
        });
    if short
        || trace
            .rounds
            .iter()
            .any(|round| round.chunks().any(|c| c.len() > chunk))
    {
        return Err("planner::P8: chunk sizes".into());
    }
    if plan.rounds != trace.rounds.len() || plan.probed_items != probed.len() {
        return Err("counters differ from the trace".into());
    }
    check_no_needless_probe(request, trace, first, end)
}

/// `planner::P12`: the initial round probes only full candidates and the windows of the walk from
/// the candidate end; every later item belongs to the window of a resume point that,
/// given the answers so far, could still win: in the walk range for a walk round, below
/// it for a fallback round, not ruled out by an absent item, not yet known complete,
/// and above every window already known complete.
fn check_no_needless_probe(
    request: &LookupRequest,
    trace: &Trace,
    first: usize,
    end: usize,
) -> Result<(), String> {
    let scan = Scan {
        request,
        first,
        end,
        hit: trace.plan.full_hit_tokens / request.tokens_per_block,
    };
    let mut known = BTreeMap::new();
    for (round, answers) in trace.rounds.iter().zip(&trace.answers) {
        let allowed = scan.allowed(round.kind(), &known);
        for item in round.items() {
            if !allowed.contains(&(item.block, item.group)) {
                return Err(format!(
                    "planner::P12: {:?} round {} probes block {} of group {} needlessly",
                    round.kind(),
                    round.id(),
                    item.block,
                    item.group
                ));
            }
        }
        for (item, &present) in round.items().iter().zip(answers) {
            known.insert((item.block, item.group), present);
        }
    }
    Ok(())
}

/// The candidate range and final `H` of one lookup, for `planner::P12`.
struct Scan<'a> {
    request: &'a LookupRequest,
    first: usize,
    end: usize,
    hit: usize,
}

impl Scan<'_> {
    /// The lowest end block of the walk from `hit`.
    fn walk_low(&self, hit: usize) -> usize {
        let rewind_blocks = self.request.rewind_tokens / self.request.tokens_per_block;
        hit.saturating_sub(rewind_blocks).max(self.first + 1)
    }

    /// Every window item needed to resume at end block `k`.
    fn needs(&self, k: usize) -> Vec<(usize, GroupId)> {
        let t = self.request.tokens_per_block;
        let mut needed = Vec::new();
        for group in &self.request.groups {
            if let Attention {
                kind: GroupKind::Window,
                window_tokens,
                sink_tokens,
            } = group.attention
            {
                needed.extend(
                    (0..k)
                        .filter(|&block| window_needs(t, k * t, window_tokens, sink_tokens, block))
                        .map(|block| (block, group.id)),
                );
            }
        }
        needed
    }

    /// The items a round of `kind` may probe, given what is `known`.
    fn allowed(&self, kind: RoundKind, known: &BTreeMap<(usize, GroupId), bool>) -> Presence {
        let mut allowed = Presence::new();
        if kind == RoundKind::Initial {
            for group in &self.request.groups {
                if group.attention.kind == GroupKind::Full {
                    allowed.extend((self.first..self.end).map(|block| (block, group.id)));
                }
            }
            if self.end > self.first {
                for k in self.walk_low(self.end)..=self.end {
                    allowed.extend(self.needs(k));
                }
            }
            return allowed;
        }
        let t = self.request.tokens_per_block;
        // (absent item known, every item known present)
        let status = |k: usize| {
            let needed = self.needs(k);
            let absent = needed.iter().any(|item| known.get(item) == Some(&false));
            let complete = needed.iter().all(|item| known.get(item) == Some(&true));
            (absent, complete)
        };
        let highest_complete = (self.first + 1..=self.hit)
            .rev()
            .find(|&k| status(k) == (false, true));
        let range = if kind == RoundKind::Walk {
            self.walk_low(self.hit)..self.hit + 1
        } else {
            self.first + 1..self.walk_low(self.hit)
        };
        let checkpoints_only = kind == RoundKind::Checkpoint;
        for k in range.filter(|&k| !checkpoints_only || is_checkpoint(self.request, k * t)) {
            if status(k) == (false, false) && highest_complete.is_none_or(|c| k > c) {
                allowed.extend(self.needs(k));
            }
        }
        allowed
    }
}
