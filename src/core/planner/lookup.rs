//! The probing state machine of one lookup (R10-R15).
//!
//! [`Lookup`] keeps one state per `(group, block)` item below the candidate end. Every
//! decision is recomputed from those states, so the rules read the same whether the
//! lookup is still probing or finishing:
//!
//! 1. `H` (R10): `c_lo` plus the leading candidates present in every full group.
//! 2. `H*T <= L`: `full_miss`. No window group: `full` at `H*T` (R11).
//! 3. Walk end blocks `k` from `H` down to `max(H - floor(R/T), c_lo + 1)`; the first
//!    complete window wins: `full` at `k = H`, `rewound` below it (R12).
//! 4. Checkpoints (R28, when on): the checkpoint end blocks below the walk, highest
//!    first; the highest complete one is the best so far (`checkpoint`).
//! 5. With `window_fallback`, continue down from below the walk to just above that best
//!    checkpoint (or to `c_lo + 1`): the first complete window is `recovered`; else the
//!    best checkpoint, or `window_miss` when there is none (R13).
//!
//! So the resume point is always the latest end block whose window is complete among
//! those the rules allow: the walk's, the checkpoints', and with fallback every other one
//! (`planner::P13`). Checkpoints are probed before the fallback scans: their windows are
//! few and cheap, and a complete one bounds how far the fallback scans.
//!
//! While probing, a window whose items are partly unknown is *undecided*; a window with
//! one absent item is *incomplete* whatever the rest say, so its unknown items are never
//! probed. A higher undecided window blocks a lower complete one from winning until its
//! items are known, which keeps the answer equal to the one R12/R13 give on full
//! knowledge.
//!
//! Invariants (cited in the code and the tests):
//!
//! - `lookup::I1`. An item goes `Unprobed -> InFlight -> Present | Absent`, never back, so it is
//!   issued in at most one round (R14, `planner::P6`).
//! - `lookup::I2`. At most one round is outstanding; [`Lookup::next_round`] returns it again
//!   until it is recorded.
//! - `lookup::I3`. After the initial round is recorded every full item is known, so `H` never
//!   changes again and the walk needs at most one more round.
//! - `lookup::I4`. Every fallback round but the last holds exactly `probe_chunk_items` items.

use super::geometry::Geometry;
use super::{
    LookupOutcome, LookupPlan, LookupRequest, PlanError, ProbeItem, ProbeRound, RoundId, RoundKind,
};

/// What the lookup knows about one item (`lookup::I1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ItemState {
    /// Never issued.
    Unprobed,
    /// Issued in the outstanding round.
    InFlight,
    /// Reported present on every shard.
    Present,
    /// Reported absent on at least one shard.
    Absent,
}

/// An item by position: `(group position in the request, block)`.
type Slot = (usize, usize);

/// Whether unknown items count as absent (finishing) or may still be probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Still probing: unknown items make a window undecided and get collected.
    Probing,
    /// Finishing: unknown items count as absent, nothing is collected.
    Final,
}

/// The state of the window of one end block, over every window group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WindowStatus {
    Complete,
    Incomplete,
    Undecided,
}

/// A settled lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Decision {
    outcome: LookupOutcome,
    /// `H`.
    hit_blocks: usize,
    /// `e/T` when the outcome offers tokens; unused otherwise.
    end_block: usize,
}

/// The next thing to do: probe these items, or stop.
#[derive(Debug)]
enum Step {
    Probe(RoundKind, Vec<Slot>),
    Done(Decision),
}

/// The outstanding round and where each of its answers goes.
#[derive(Clone, Debug)]
struct PendingRound {
    round: ProbeRound,
    slots: Vec<Slot>,
}

/// One request's lookup: issues probe rounds, takes their answers, and plans the loads.
///
/// See the module docs for the rules and `planner.md` for the properties it keeps.
#[derive(Clone, Debug)]
pub struct Lookup {
    geometry: Geometry,
    /// `[group position][block]` for blocks below the candidate end (`geometry::I3`).
    states: Vec<Vec<ItemState>>,
    initial_issued: bool,
    pending: Option<PendingRound>,
    /// Set once a probing decision settled the lookup.
    decided: Option<Decision>,
    /// Highest fallback end block not yet known incomplete; every fallback end block
    /// above it is incomplete, so scans resume here instead of at the top.
    fallback_top: Option<usize>,
    next_round_id: u32,
    rounds: usize,
    probed_items: usize,
}

impl Lookup {
    /// Starts a lookup.
    ///
    /// # Errors
    ///
    /// A [`PlanError`] when the request is invalid: zero block size or probe chunk, a
    /// local match not block aligned or longer than the prompt, no groups, a repeated
    /// group, a window of zero tokens, or sinks not below the window.
    pub fn new(request: LookupRequest) -> Result<Self, PlanError> {
        let geometry = Geometry::new(request)?;
        let states = vec![vec![ItemState::Unprobed; geometry.candidate_end]; geometry.groups.len()];
        Ok(Self {
            geometry,
            states,
            initial_issued: false,
            pending: None,
            decided: None,
            fallback_top: None,
            next_round_id: 0,
            rounds: 0,
            probed_items: 0,
        })
    }

    /// The next round to probe, or `None` once the lookup is settled.
    ///
    /// While a round is outstanding this returns that same round again (`lookup::I2`): probe it
    /// once, record it once.
    pub fn next_round(&mut self) -> Option<ProbeRound> {
        if let Some(pending) = &self.pending {
            return Some(pending.round.clone());
        }
        if self.decided.is_some() {
            return None;
        }
        if !self.initial_issued {
            self.initial_issued = true;
            let slots = self.initial_slots();
            if !slots.is_empty() {
                return Some(self.issue(RoundKind::Initial, slots));
            }
        }
        match self.decide(Mode::Probing) {
            Step::Probe(kind, slots) => Some(self.issue(kind, slots)),
            Step::Done(decision) => {
                self.decided = Some(decision);
                None
            }
        }
    }

    /// Records the answers to the outstanding round: `present[i]` is whether
    /// `round.items()[i]` is present on every shard (R3).
    ///
    /// # Errors
    ///
    /// [`PlanError::NoRoundPending`] when no round is outstanding (including a second
    /// record of the same round), [`PlanError::UnknownRound`] for another round id,
    /// [`PlanError::ForeignRound`] for a round of another lookup, and
    /// [`PlanError::PresenceLengthMismatch`] when `present` does not have one answer per
    /// item. The lookup is unchanged on error.
    pub fn record(&mut self, round: &ProbeRound, present: &[bool]) -> Result<(), PlanError> {
        let Some(pending) = &self.pending else {
            return Err(PlanError::NoRoundPending { round: round.id });
        };
        if pending.round.id != round.id {
            return Err(PlanError::UnknownRound {
                round: round.id,
                pending: pending.round.id,
            });
        }
        if pending.round.items != round.items {
            return Err(PlanError::ForeignRound { round: round.id });
        }
        if present.len() != pending.slots.len() {
            return Err(PlanError::PresenceLengthMismatch {
                round: round.id,
                expected: pending.slots.len(),
                got: present.len(),
            });
        }
        for (&(pos, block), &is_present) in pending.slots.iter().zip(present) {
            debug_assert_eq!(self.states[pos][block], ItemState::InFlight, "lookup::I1");
            self.states[pos][block] = if is_present {
                ItemState::Present
            } else {
                ItemState::Absent
            };
        }
        self.probed_items += present.len();
        self.pending = None;
        Ok(())
    }

    /// Ends the lookup and plans the loads (R15).
    ///
    /// Normally called once [`Lookup::next_round`] returned `None`. Called earlier (a
    /// probe failed, a deadline passed), it decides on what is known, counting every
    /// unprobed or unanswered item as absent, so it still never plans a block it did not
    /// see present.
    pub fn finish(mut self) -> LookupPlan {
        let decision = match self.decided {
            Some(decision) => decision,
            None => match self.decide(Mode::Final) {
                Step::Done(decision) => decision,
                // Final mode never finds an undecided window, so it never collects; if it
                // somehow did, offering nothing is the safe answer.
                Step::Probe(..) => {
                    debug_assert!(false, "final mode collected probe items");
                    Decision {
                        outcome: LookupOutcome::WindowMiss,
                        hit_blocks: self.geometry.first_candidate,
                        end_block: self.geometry.first_candidate,
                    }
                }
            },
        };
        self.plan(decision)
    }

    /// The plan for a settled decision.
    fn plan(&self, decision: Decision) -> LookupPlan {
        let geometry = &self.geometry;
        let tokens_per_block = geometry.tokens_per_block;
        let local_match_tokens = geometry.local_match_tokens;
        let offers = decision.outcome.offers();
        let resume_tokens = if offers {
            decision.end_block * tokens_per_block
        } else {
            local_match_tokens
        };
        LookupPlan {
            outcome: decision.outcome,
            resume_tokens,
            local_match_tokens,
            full_hit_tokens: decision.hit_blocks * tokens_per_block,
            offered_tokens: resume_tokens - local_match_tokens,
            loads: if offers {
                geometry.loads(decision.end_block)
            } else {
                Vec::new()
            },
            rounds: self.rounds,
            probed_items: self.probed_items,
        }
    }

    /// The initial round: full groups for every candidate, window groups for the walk
    /// from the candidate end (the largest `H`).
    fn initial_slots(&mut self) -> Vec<Slot> {
        let mut slots = Vec::new();
        if !self.geometry.has_candidates() {
            return slots;
        }
        let first = self.geometry.first_candidate;
        let end = self.geometry.candidate_end;
        for &pos in &self.geometry.full {
            for block in first..end {
                self.states[pos][block] = ItemState::InFlight;
                slots.push((pos, block));
            }
        }
        if !self.geometry.windows.is_empty() {
            for end_block in (self.geometry.walk_low(end)..=end).rev() {
                self.collect(end_block, &mut slots, usize::MAX);
            }
        }
        slots
    }

    /// Turns collected slots into the outstanding round.
    fn issue(&mut self, kind: RoundKind, mut slots: Vec<Slot>) -> ProbeRound {
        slots.sort_unstable();
        let items = slots
            .iter()
            .map(|&(pos, block)| ProbeItem {
                block,
                group: self.geometry.groups[pos].id,
            })
            .collect();
        let round = ProbeRound {
            id: RoundId(self.next_round_id),
            kind,
            items,
            chunk_items: self.geometry.probe_chunk_items,
        };
        self.next_round_id = self.next_round_id.wrapping_add(1);
        self.rounds += 1;
        self.pending = Some(PendingRound {
            round: round.clone(),
            slots,
        });
        round
    }

    /// Applies R10-R13 to what is known (see the module docs).
    fn decide(&mut self, mode: Mode) -> Step {
        let first = self.geometry.first_candidate;
        let hit_blocks = self.hit_blocks();
        let done = |outcome, end_block| {
            Step::Done(Decision {
                outcome,
                hit_blocks,
                end_block,
            })
        };
        if hit_blocks <= first {
            return done(LookupOutcome::FullMiss, first);
        }
        if self.geometry.windows.is_empty() {
            return done(LookupOutcome::Full, hit_blocks);
        }
        let walk_low = self.geometry.walk_low(hit_blocks);
        let mut slots = Vec::new();
        for end_block in (walk_low..=hit_blocks).rev() {
            match self.window_status(end_block, mode) {
                WindowStatus::Complete if slots.is_empty() => {
                    let outcome = if end_block == hit_blocks {
                        LookupOutcome::Full
                    } else {
                        LookupOutcome::Rewound
                    };
                    return done(outcome, end_block);
                }
                WindowStatus::Complete => break,
                WindowStatus::Incomplete => {}
                WindowStatus::Undecided => {
                    self.collect(end_block, &mut slots, usize::MAX);
                }
            }
        }
        if !slots.is_empty() {
            return Step::Probe(RoundKind::Walk, slots);
        }
        let checkpoint = match self.checkpoint(walk_low, mode) {
            Ok(checkpoint) => checkpoint,
            Err(slots) => return Step::Probe(RoundKind::Checkpoint, slots),
        };
        if !self.geometry.window_fallback {
            return match checkpoint {
                Some(end_block) => done(LookupOutcome::Checkpoint, end_block),
                None => done(LookupOutcome::WindowMiss, first),
            };
        }
        self.fallback(hit_blocks, walk_low - 1, checkpoint, mode)
    }

    /// R28: the highest complete checkpoint end block below `below`, `Ok(None)` when
    /// none is, or the items (at most `probe_chunk_items`) to probe before it is known.
    fn checkpoint(&mut self, below: usize, mode: Mode) -> Result<Option<usize>, Vec<Slot>> {
        let limit = self.geometry.probe_chunk_items;
        let checkpoints: Vec<usize> = self.geometry.checkpoints_below(below).collect();
        let mut slots = Vec::new();
        for end_block in checkpoints {
            match self.window_status(end_block, mode) {
                WindowStatus::Complete if slots.is_empty() => return Ok(Some(end_block)),
                WindowStatus::Complete => break,
                WindowStatus::Incomplete => {}
                WindowStatus::Undecided => {
                    if self.collect(end_block, &mut slots, limit) {
                        break;
                    }
                }
            }
        }
        if slots.is_empty() {
            Ok(None)
        } else {
            Err(slots)
        }
    }

    /// R13: scans end blocks from `top` (or the remembered fallback top) down to just
    /// above `checkpoint` (the best complete checkpoint, R28) or the local match,
    /// collecting at most `probe_chunk_items` items (`lookup::I4`). With nothing complete
    /// there, the checkpoint wins.
    fn fallback(
        &mut self,
        hit_blocks: usize,
        top: usize,
        checkpoint: Option<usize>,
        mode: Mode,
    ) -> Step {
        let first = self.geometry.first_candidate;
        let floor = checkpoint.unwrap_or(first);
        let limit = self.geometry.probe_chunk_items;
        let done = |outcome, end_block| {
            Step::Done(Decision {
                outcome,
                hit_blocks,
                end_block,
            })
        };
        let top = self.fallback_top.unwrap_or(top);
        let mut slots = Vec::new();
        for end_block in (floor + 1..=top).rev() {
            match self.window_status(end_block, mode) {
                WindowStatus::Complete if slots.is_empty() => {
                    return done(LookupOutcome::Recovered, end_block);
                }
                WindowStatus::Complete => break,
                WindowStatus::Incomplete => {
                    if slots.is_empty() && mode == Mode::Probing {
                        self.fallback_top = Some(end_block - 1);
                    }
                }
                WindowStatus::Undecided => {
                    if self.collect(end_block, &mut slots, limit) {
                        break;
                    }
                }
            }
        }
        match (slots.is_empty(), checkpoint) {
            (false, _) => Step::Probe(RoundKind::Fallback, slots),
            (true, Some(end_block)) => done(LookupOutcome::Checkpoint, end_block),
            (true, None) => done(LookupOutcome::WindowMiss, first),
        }
    }

    /// `H` (R10): with no full group, the candidate end (nothing constrains it).
    fn hit_blocks(&self) -> usize {
        let geometry = &self.geometry;
        let first = geometry.first_candidate;
        let run = (first..geometry.candidate_end)
            .take_while(|&block| {
                geometry
                    .full
                    .iter()
                    .all(|&pos| self.states[pos][block] == ItemState::Present)
            })
            .count();
        first + run
    }

    /// Whether the window of `end_block` is complete in every window group (R12).
    fn window_status(&self, end_block: usize, mode: Mode) -> WindowStatus {
        let mut undecided = false;
        for &window in &self.geometry.windows {
            for block in self
                .geometry
                .window_ranges(window, end_block)
                .into_iter()
                .flatten()
            {
                match self.states[window.pos][block] {
                    ItemState::Present => {}
                    ItemState::Absent => return WindowStatus::Incomplete,
                    ItemState::Unprobed | ItemState::InFlight => match mode {
                        Mode::Probing => undecided = true,
                        Mode::Final => return WindowStatus::Incomplete,
                    },
                }
            }
        }
        if undecided {
            WindowStatus::Undecided
        } else {
            WindowStatus::Complete
        }
    }

    /// Moves the unprobed items of the window of `end_block` into `slots`, marking them
    /// in flight, until `slots` holds `limit` items. Returns whether the limit was hit.
    fn collect(&mut self, end_block: usize, slots: &mut Vec<Slot>, limit: usize) -> bool {
        let Self {
            geometry, states, ..
        } = self;
        for &window in &geometry.windows {
            for block in geometry
                .window_ranges(window, end_block)
                .into_iter()
                .flatten()
            {
                if slots.len() >= limit {
                    return true;
                }
                let state = &mut states[window.pos][block];
                if *state == ItemState::Unprobed {
                    *state = ItemState::InFlight;
                    slots.push((window.pos, block));
                }
            }
        }
        slots.len() >= limit
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{
        check_post_conditions, drive, drive_at_most, full, items, request, window, Presence,
    };
    use super::super::{
        GroupLoad, Lookup, LookupOutcome, LookupRequest, PlanError, ProbeItem, ProbeRound,
        RoundKind,
    };
    use crate::core::layout::GroupId;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn load(group: u32, blocks: impl IntoIterator<Item = usize>) -> GroupLoad {
        GroupLoad {
            group: GroupId(group),
            blocks: blocks.into_iter().collect(),
        }
    }

    /// Drives `request` against `present` and checks every post-condition of planner.md.
    fn run(
        request: &LookupRequest,
        present: &Presence,
    ) -> Result<super::super::testkit::Trace, Box<dyn std::error::Error>> {
        let trace = drive(request.clone(), present)?;
        check_post_conditions(request, present, &trace)?;
        Ok(trace)
    }

    /// T = 4, P = 33: candidates are blocks 0..8 (block 8 holds token 32), e at most 32.
    fn hybrid(window_tokens: usize, sink_tokens: usize) -> LookupRequest {
        request(
            4,
            33,
            0,
            vec![full(0), window(1, window_tokens, sink_tokens)],
        )
    }

    #[test]
    fn r11_full_only_full_hit() -> TestResult {
        let trace = run(&request(4, 17, 0, vec![full(0)]), &items(0..4, &[0]))?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.resume_tokens, 16);
        assert_eq!(trace.plan.offered_tokens, 16);
        assert_eq!(trace.plan.loads, vec![load(0, 0..4)]);
        assert_eq!(trace.plan.rounds, 1);
        Ok(())
    }

    #[test]
    fn r10_full_hit_stops_at_first_gap() -> TestResult {
        let present = items([0, 1, 3], &[0]);
        let trace = run(&request(4, 17, 0, vec![full(0)]), &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.resume_tokens, 8);
        assert_eq!(trace.plan.loads, vec![load(0, 0..2)]);
        Ok(())
    }

    #[test]
    fn r11_full_miss_when_no_candidate_present() -> TestResult {
        for present in [Presence::new(), items([1, 2, 3], &[0])] {
            let trace = run(&request(4, 17, 0, vec![full(0)]), &present)?;
            assert_eq!(trace.plan.outcome, LookupOutcome::FullMiss);
            assert_eq!(trace.plan.resume_tokens, 0);
            assert_eq!(trace.plan.offered_tokens, 0);
            assert!(trace.plan.loads.is_empty());
        }
        Ok(())
    }

    #[test]
    fn r10_blocks_below_local_match_count_as_present_and_are_not_probed() -> TestResult {
        let trace = run(&request(4, 17, 8, vec![full(0)]), &items([2, 3], &[0]))?;
        assert_eq!(trace.plan.resume_tokens, 16);
        assert_eq!(trace.plan.offered_tokens, 8);
        assert_eq!(trace.plan.loads, vec![load(0, [2, 3])]);
        let probed: Vec<usize> = trace.probed().iter().map(|item| item.block).collect();
        assert_eq!(probed, vec![2, 3]);
        Ok(())
    }

    #[test]
    fn r10_every_full_group_must_hit() -> TestResult {
        let mut present = items(0..4, &[0]);
        present.extend(items(0..2, &[1]));
        let trace = run(&request(4, 17, 0, vec![full(0), full(1)]), &present)?;
        assert_eq!(trace.plan.resume_tokens, 8);
        assert_eq!(trace.plan.loads, vec![load(0, 0..2), load(1, 0..2)]);
        Ok(())
    }

    #[test]
    fn candidates_exclude_the_last_token_block_when_prompt_is_a_multiple_of_t() -> TestResult {
        let trace = run(&request(4, 16, 0, vec![full(0)]), &items(0..4, &[0]))?;
        assert_eq!(trace.plan.resume_tokens, 12);
        assert!(trace.probed().iter().all(|item| item.block < 3));
        Ok(())
    }

    #[test]
    fn prompt_of_at_most_one_block_probes_nothing() -> TestResult {
        for prompt_tokens in [0, 1, 3, 4] {
            let trace = run(
                &request(4, prompt_tokens, 0, vec![full(0)]),
                &items(0..2, &[0]),
            )?;
            assert_eq!(
                trace.plan.outcome,
                LookupOutcome::FullMiss,
                "P = {prompt_tokens}"
            );
            assert_eq!(trace.plan.rounds, 0);
        }
        // P = 5: block 0 is the only candidate.
        let trace = run(&request(4, 5, 0, vec![full(0)]), &items(0..2, &[0]))?;
        assert_eq!(trace.plan.resume_tokens, 4);
        Ok(())
    }

    #[test]
    fn local_match_covering_every_candidate_probes_nothing() -> TestResult {
        for (prompt_tokens, local) in [(17, 16), (16, 12), (16, 16)] {
            let groups = vec![full(0), window(1, 8, 0)];
            let trace = run(
                &request(4, prompt_tokens, local, groups),
                &items(0..5, &[0, 1]),
            )?;
            assert_eq!(trace.plan.outcome, LookupOutcome::FullMiss);
            assert_eq!(trace.plan.resume_tokens, local);
            assert_eq!(trace.plan.rounds, 0);
        }
        Ok(())
    }

    #[test]
    fn r12_full_when_window_of_h_is_complete() -> TestResult {
        let mut present = items(0..8, &[0]);
        present.extend(items([6, 7], &[1]));
        let trace = run(&hybrid(8, 0), &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.resume_tokens, 32);
        assert_eq!(trace.plan.loads, vec![load(0, 0..8), load(1, [6, 7])]);
        assert_eq!(trace.plan.rounds, 1);
        Ok(())
    }

    #[test]
    fn r12_rewound_within_rewind_tokens() -> TestResult {
        let mut present = items(0..8, &[0]);
        present.extend(items([4, 5], &[1]));
        let request = LookupRequest {
            rewind_tokens: 8,
            ..hybrid(8, 0)
        };
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Rewound);
        assert_eq!(trace.plan.resume_tokens, 24);
        assert_eq!(trace.plan.full_hit_tokens, 32);
        assert_eq!(trace.plan.loads, vec![load(0, 0..6), load(1, [4, 5])]);
        Ok(())
    }

    #[test]
    fn r13_recovered_when_rewind_falls_short() -> TestResult {
        let mut present = items(0..8, &[0]);
        present.extend(items([4, 5], &[1]));
        // R = 7 allows one block step at most (28): 24 needs the fallback.
        let request = LookupRequest {
            rewind_tokens: 7,
            ..hybrid(8, 0)
        };
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Recovered);
        assert_eq!(trace.plan.resume_tokens, 24);
        assert_eq!(trace.count(RoundKind::Fallback), 1);
        let request = LookupRequest {
            window_fallback: false,
            ..request
        };
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::WindowMiss);
        assert_eq!(trace.plan.resume_tokens, 0);
        assert!(trace.plan.loads.is_empty());
        assert_eq!(trace.count(RoundKind::Fallback), 0);
        Ok(())
    }

    #[test]
    fn r13_window_miss_when_no_window_is_complete() -> TestResult {
        let trace = run(&hybrid(8, 0), &items(0..8, &[0]))?;
        assert_eq!(trace.plan.outcome, LookupOutcome::WindowMiss);
        assert_eq!(trace.plan.full_hit_tokens, 32);
        assert_eq!(trace.plan.offered_tokens, 0);
        assert!(trace.plan.loads.is_empty());
        Ok(())
    }

    #[test]
    fn r12_sink_blocks_are_required() -> TestResult {
        let mut present = items(0..8, &[0]);
        present.extend(items([6, 7], &[1]));
        let trace = run(&hybrid(8, 2), &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::WindowMiss);
        present.insert((0, GroupId(1)));
        let trace = run(&hybrid(8, 2), &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.loads, vec![load(0, 0..8), load(1, [0, 6, 7])]);
        Ok(())
    }

    #[test]
    fn r12_sinks_at_or_past_the_resume_point_are_not_needed() -> TestResult {
        // S = 10 means sink blocks 0..3, but resuming at 8 computes tokens 8.. itself.
        let request = request(4, 9, 0, vec![window(1, 12, 10)]);
        let trace = run(&request, &items([0, 1], &[1]))?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.resume_tokens, 8);
        assert_eq!(trace.plan.loads, vec![load(1, [0, 1])]);
        assert!(trace.probed().iter().all(|item| item.block < 2));
        Ok(())
    }

    #[test]
    fn r12_window_blocks_below_local_match_are_probed_but_not_loaded() -> TestResult {
        let mut present = items([6, 7], &[0]);
        present.extend(items([5, 6, 7], &[1]));
        let request = request(4, 33, 24, vec![full(0), window(1, 12, 0)]);
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert!(trace.probed().contains(&ProbeItem {
            block: 5,
            group: GroupId(1)
        }));
        assert_eq!(trace.plan.loads, vec![load(0, [6, 7]), load(1, [6, 7])]);
        // Without block 5 in the pool the window is incomplete, whatever the engine holds.
        present.remove(&(5, GroupId(1)));
        assert_eq!(
            run(&request, &present)?.plan.outcome,
            LookupOutcome::WindowMiss
        );
        Ok(())
    }

    #[test]
    fn r12_offer_must_exceed_local_match() -> TestResult {
        // The only complete window is at e = 16 = L: nothing to offer.
        let mut present = items(4..8, &[0]);
        present.extend(items([2, 3], &[1]));
        let request = LookupRequest {
            rewind_tokens: 32,
            ..request(4, 33, 16, vec![full(0), window(1, 8, 0)])
        };
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::WindowMiss);
        assert_eq!(trace.plan.resume_tokens, 16);
        assert!(
            trace.probed().iter().all(|item| item.block >= 3),
            "no walk to e = L"
        );
        Ok(())
    }

    #[test]
    fn window_only_layout_takes_h_as_the_candidate_end() -> TestResult {
        let request = request(4, 33, 0, vec![window(1, 8, 0)]);
        let trace = run(&request, &items([6, 7], &[1]))?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.full_hit_tokens, 32);
        assert_eq!(trace.plan.loads, vec![load(1, [6, 7])]);
        let trace = run(&request, &Presence::new())?;
        assert_eq!(trace.plan.outcome, LookupOutcome::WindowMiss);
        assert_eq!(trace.plan.full_hit_tokens, 32);
        Ok(())
    }

    #[test]
    fn r12_a_rewind_of_exactly_r_is_rewound_and_one_token_less_is_not() -> TestResult {
        // W = 8: the window of e = 20 is blocks 3 and 4; H*T = 32, so e = 20 is 12 back.
        let mut present = items(0..8, &[0]);
        present.extend(items([3, 4], &[1]));
        let exactly = LookupRequest {
            rewind_tokens: 12,
            ..hybrid(8, 0)
        };
        let trace = run(&exactly, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Rewound);
        assert_eq!(trace.plan.resume_tokens, 20);
        assert_eq!(trace.plan.loads, vec![load(0, 0..5), load(1, [3, 4])]);
        assert_eq!(trace.count(RoundKind::Fallback), 0);
        // R = 11 walks down to 24 only: e = 20 is the fallback's.
        let short = LookupRequest {
            rewind_tokens: 11,
            ..exactly
        };
        let trace = run(&short, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Recovered);
        assert_eq!(trace.plan.resume_tokens, 20);
        Ok(())
    }

    #[test]
    fn r12_a_window_starting_at_token_0_needs_every_block_before_e() -> TestResult {
        // H = 2 (e = 8) and W = 12: the window [max(0, 8 - 12), 8) is blocks 0 and 1.
        let mut present = items(0..2, &[0]);
        present.extend(items([1], &[1]));
        let trace = run(&hybrid(12, 0), &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::WindowMiss);
        present.insert((0, GroupId(1)));
        let trace = run(&hybrid(12, 0), &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.resume_tokens, 8);
        assert_eq!(trace.plan.loads, vec![load(0, 0..2), load(1, [0, 1])]);
        Ok(())
    }

    #[test]
    fn r12_sinks_spanning_two_blocks_are_both_required_and_loaded() -> TestResult {
        // S = 6 with T = 4: sink blocks 0 and 1; the window of 32 is blocks 6 and 7.
        let mut present = items(0..8, &[0]);
        present.extend(items([0, 6, 7], &[1]));
        let trace = run(&hybrid(8, 6), &present)?;
        // Without sink block 1 only e = 4 is complete (its sinks and window are block 0).
        assert_eq!(trace.plan.outcome, LookupOutcome::Recovered);
        assert_eq!(trace.plan.resume_tokens, 4);
        assert_eq!(trace.plan.loads, vec![load(0, [0]), load(1, [0])]);
        present.insert((1, GroupId(1)));
        let trace = run(&hybrid(8, 6), &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.loads, vec![load(0, 0..8), load(1, [0, 1, 6, 7])]);
        Ok(())
    }

    #[test]
    fn r12_two_window_groups_with_different_windows_must_both_be_complete() -> TestResult {
        // Group 1: W = 4 (one block); group 2: W = 12 (three blocks). At 32 group 2 lacks
        // block 6; at 28 group 1 lacks block 6; at 24 both are complete.
        let groups = vec![full(0), window(1, 4, 0), window(2, 12, 0)];
        let request = LookupRequest {
            rewind_tokens: 8,
            ..request(4, 33, 0, groups)
        };
        let mut present = items(0..8, &[0]);
        present.extend(items([5, 7], &[1]));
        present.extend(items([3, 4, 5, 7], &[2]));
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Rewound);
        assert_eq!(trace.plan.resume_tokens, 24);
        assert_eq!(
            trace.plan.loads,
            vec![load(0, 0..6), load(1, [5]), load(2, [3, 4, 5])]
        );
        // Group 2's block 6 makes 32 complete for both.
        present.insert((6, GroupId(2)));
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.loads[1], load(1, [7]));
        assert_eq!(trace.plan.loads[2], load(2, [5, 6, 7]));
        Ok(())
    }

    #[test]
    fn r10_a_hole_in_the_full_chain_caps_h_whatever_the_window_groups_hold() -> TestResult {
        // Block 3 is missing from the full group; the window group holds every block.
        let mut present = items([0, 1, 2, 4, 5, 6, 7], &[0]);
        present.extend(items(0..8, &[1]));
        let request = LookupRequest {
            rewind_tokens: 32,
            ..hybrid(8, 0)
        };
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.full_hit_tokens, 12);
        assert_eq!(trace.plan.resume_tokens, 12);
        assert_eq!(trace.plan.loads, vec![load(0, 0..3), load(1, [1, 2])]);
        // A hole in block 0 is a full miss, even with every window page present.
        present.remove(&(0, GroupId(0)));
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::FullMiss);
        assert!(trace.plan.loads.is_empty());
        Ok(())
    }

    #[test]
    fn r14_initial_round_covers_full_candidates_sinks_and_walk_at_largest_h() -> TestResult {
        let request = LookupRequest {
            rewind_tokens: 4,
            ..hybrid(8, 2)
        };
        let mut lookup = Lookup::new(request)?;
        let round = lookup.next_round().ok_or("no round")?;
        assert_eq!(round.kind(), RoundKind::Initial);
        let mut expected: Vec<ProbeItem> = items(0..8, &[0])
            .into_iter()
            .chain(items([0, 5, 6, 7], &[1]))
            .map(|(block, group)| ProbeItem { block, group })
            .collect();
        expected.sort_by_key(|item| (item.group, item.block));
        assert_eq!(round.items(), expected.as_slice());
        lookup.record(&round, &vec![true; round.items().len()])?;
        assert!(
            lookup.next_round().is_none(),
            "a full hit settles in one round"
        );
        assert_eq!(lookup.finish().outcome, LookupOutcome::Full);
        Ok(())
    }

    #[test]
    fn r14_walk_round_only_probes_what_the_initial_round_missed() -> TestResult {
        let mut present = items(0..5, &[0]);
        present.extend(items([2, 3], &[1]));
        let request = LookupRequest {
            rewind_tokens: 4,
            ..hybrid(8, 0)
        };
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Rewound);
        assert_eq!(trace.plan.resume_tokens, 16);
        let kinds: Vec<RoundKind> = trace.rounds.iter().map(ProbeRound::kind).collect();
        assert_eq!(kinds, vec![RoundKind::Initial, RoundKind::Walk]);
        // Initial: window blocks 5..8 (walk 32, 28). Walk from H = 5: ends 20, 16.
        let walk: Vec<usize> = trace.rounds[1]
            .items()
            .iter()
            .map(|item| item.block)
            .collect();
        assert_eq!(walk, vec![2, 3, 4]);
        Ok(())
    }

    #[test]
    fn r14_fallback_rounds_are_chunked_and_stop_at_the_first_complete_window() -> TestResult {
        // W = T = 4: the window of end block k is block k-1 alone.
        let mut present = items(0..8, &[0]);
        present.extend(items([2, 5], &[1]));
        let request = LookupRequest {
            probe_chunk_items: 2,
            ..hybrid(4, 0)
        };
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Recovered);
        assert_eq!(trace.plan.resume_tokens, 24);
        let fallback: Vec<Vec<usize>> = trace
            .rounds
            .iter()
            .filter(|round| round.kind() == RoundKind::Fallback)
            .map(|round| round.items().iter().map(|item| item.block).collect())
            .collect();
        assert_eq!(fallback, vec![vec![5, 6]]);
        Ok(())
    }

    #[test]
    fn r14_fallback_stops_cleanly_when_the_chunk_splits_a_window() -> TestResult {
        // W = 12: each window is 3 blocks; chunk 2 cuts windows in the middle.
        let mut present = items(0..8, &[0]);
        present.extend(items([0, 1, 2], &[1]));
        let request = LookupRequest {
            probe_chunk_items: 2,
            ..hybrid(12, 0)
        };
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Recovered);
        assert_eq!(trace.plan.resume_tokens, 12);
        Ok(())
    }

    #[test]
    fn long_conversation_turn_settles_in_two_rounds() -> TestResult {
        // The previous turn ended at 120 000 tokens and saved its prefix and its window
        // (R16, R17); the next turn extends it to 150 000 tokens.
        let (t, end) = (32, 120_000 / 32);
        let mut present = items(0..end, &[0]);
        present.extend(items((120_000 - 4096 - 1024) / t..end, &[1]));
        present.insert((0, GroupId(1)));
        let request = LookupRequest {
            rewind_tokens: 1024,
            ..request(t, 150_000, 2048, vec![full(0), window(1, 4096, 4)])
        };
        let trace = run(&request, &present)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::Full);
        assert_eq!(trace.plan.resume_tokens, 120_000);
        assert_eq!(trace.rounds.len(), 2, "initial + walk");
        assert_eq!(trace.plan.loads[0].blocks.len(), end - 2048 / t);
        assert_eq!(trace.plan.loads[1].blocks.len(), 4096 / t);
        Ok(())
    }

    #[test]
    fn next_round_repeats_the_outstanding_round() -> TestResult {
        let mut lookup = Lookup::new(hybrid(8, 0))?;
        let first = lookup.next_round().ok_or("no round")?;
        assert_eq!(lookup.next_round(), Some(first.clone()));
        lookup.record(&first, &vec![false; first.items().len()])?;
        assert!(lookup.next_round().is_none());
        assert!(lookup.next_round().is_none());
        Ok(())
    }

    #[test]
    fn record_refuses_answers_that_do_not_fit() -> TestResult {
        let mut other = Lookup::new(request(4, 33, 0, vec![full(0)]))?;
        let foreign = other.next_round().ok_or("no round")?;
        let mut lookup = Lookup::new(hybrid(8, 0))?;
        let err = lookup.record(&foreign, &[]).err().ok_or("recorded")?;
        assert_eq!(err.kind(), "no_round_pending");
        let round = lookup.next_round().ok_or("no round")?;
        let err = lookup
            .record(&foreign, &vec![true; foreign.items().len()])
            .err()
            .ok_or("recorded")?;
        assert_eq!(err, PlanError::ForeignRound { round: round.id() });
        let err = lookup.record(&round, &[true]).err().ok_or("recorded")?;
        assert_eq!(err.kind(), "presence_length_mismatch");
        assert!(err.to_string().contains("answers"));
        lookup.record(&round, &vec![true; round.items().len()])?;
        let err = lookup
            .record(&round, &vec![true; round.items().len()])
            .err()
            .ok_or("recorded twice")?;
        assert_eq!(err.kind(), "no_round_pending");
        Ok(())
    }

    #[test]
    fn record_refuses_a_stale_round_id() -> TestResult {
        let mut lookup = Lookup::new(hybrid(8, 0))?;
        let initial = lookup.next_round().ok_or("no round")?;
        let mut answers = vec![true; initial.items().len()];
        // Block 4 of the full group misses: H = 4, a walk round follows.
        answers[4] = false;
        lookup.record(&initial, &answers)?;
        let walk = lookup.next_round().ok_or("no walk round")?;
        assert_eq!(walk.kind(), RoundKind::Walk);
        let err = lookup
            .record(&initial, &answers)
            .err()
            .ok_or("recorded stale")?;
        assert_eq!(
            err,
            PlanError::UnknownRound {
                round: initial.id(),
                pending: walk.id()
            }
        );
        assert_eq!(err.kind(), "unknown_round");
        Ok(())
    }

    #[test]
    fn request_validation_names_the_offending_value() {
        let cases = [
            (request(0, 33, 0, vec![full(0)]), "zero_tokens_per_block"),
            (
                LookupRequest {
                    probe_chunk_items: 0,
                    ..hybrid(8, 0)
                },
                "zero_probe_chunk",
            ),
            (
                request(4, 33, 6, vec![full(0)]),
                "local_match_not_block_aligned",
            ),
            (request(4, 7, 8, vec![full(0)]), "local_match_beyond_prompt"),
            (request(4, 33, 0, vec![]), "no_groups"),
            (
                request(4, 33, 0, vec![full(0), window(0, 8, 0)]),
                "duplicate_group",
            ),
            (request(4, 33, 0, vec![window(1, 0, 0)]), "zero_window"),
            (
                request(4, 33, 0, vec![window(1, 8, 8)]),
                "sinks_not_below_window",
            ),
        ];
        for (request, kind) in cases {
            let err = Lookup::new(request).err();
            assert_eq!(err.as_ref().map(PlanError::kind), Some(kind));
            let text = err.map(|err| err.to_string()).unwrap_or_default();
            assert_eq!(text, text.to_lowercase(), "{kind}: messages are lower-case");
        }
    }

    #[test]
    fn finish_early_counts_unknown_items_as_absent() -> TestResult {
        let mut present = items(0..8, &[0]);
        present.extend(items(0..8, &[1]));
        let trace = drive_at_most(hybrid(8, 0), &present, 0)?;
        assert_eq!(trace.plan.outcome, LookupOutcome::FullMiss);
        assert_eq!(trace.plan.rounds, 0);
        // An issued but unanswered round counts as absent too.
        let mut lookup = Lookup::new(hybrid(8, 0))?;
        let _round = lookup.next_round().ok_or("no round")?;
        let plan = lookup.finish();
        assert_eq!(plan.outcome, LookupOutcome::FullMiss);
        assert_eq!((plan.rounds, plan.probed_items), (1, 0));
        Ok(())
    }

    #[test]
    fn rounds_split_into_chunks_of_probe_chunk_items() -> TestResult {
        let request = LookupRequest {
            probe_chunk_items: 3,
            ..hybrid(8, 0)
        };
        let mut lookup = Lookup::new(request)?;
        let round = lookup.next_round().ok_or("no round")?;
        let sizes: Vec<usize> = round.chunks().map(<[ProbeItem]>::len).collect();
        assert_eq!(sizes, vec![3, 3, 3, 1]);
        Ok(())
    }

    /// Counter-example from `test_proptest_prefix_monotone` run with fallback off (the
    /// shrunk case had four groups; this is the hand-reduced one): a longer full hit moves
    /// the walk past the only complete window. planner.md (`planner::P9`) states monotonicity only
    /// with fallback on, where the planner recovers the earlier window.
    #[test]
    fn test_reproduce_no_fallback_is_not_prefix_monotone() -> TestResult {
        let request = LookupRequest {
            window_fallback: false,
            ..request(4, 17, 0, vec![full(0), window(1, 4, 0)])
        };
        let mut present = items([0, 1], &[0]);
        present.insert((1, GroupId(1)));
        let shorter = run(&request, &present)?;
        assert_eq!(
            (shorter.plan.outcome, shorter.plan.resume_tokens),
            (LookupOutcome::Full, 8)
        );
        present.extend(items([2, 3], &[0]));
        let longer = run(&request, &present)?;
        assert_eq!(
            (longer.plan.outcome, longer.plan.resume_tokens),
            (LookupOutcome::WindowMiss, 0)
        );
        let request = LookupRequest {
            window_fallback: true,
            ..request
        };
        let recovered = run(&request, &present)?;
        assert_eq!(
            (recovered.plan.outcome, recovered.plan.resume_tokens),
            (LookupOutcome::Recovered, 8)
        );
        Ok(())
    }

    #[test]
    fn outcome_and_round_labels() {
        let labels: Vec<&str> = [
            LookupOutcome::Full,
            LookupOutcome::Rewound,
            LookupOutcome::Recovered,
            LookupOutcome::WindowMiss,
            LookupOutcome::FullMiss,
        ]
        .map(LookupOutcome::as_str)
        .to_vec();
        assert_eq!(
            labels,
            ["full", "rewound", "recovered", "window_miss", "full_miss"]
        );
        assert_eq!(RoundKind::Fallback.as_str(), "fallback");
    }
}
