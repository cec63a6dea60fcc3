//! The reservation ledger: the connector's record of the engine's prefix reservations
//! (`docs/DESIGN.md` section 2 engine hooks, R23-R26).
//!
//! # Problem
//!
//! At admission the engine calls `reserve_prefix(req, num_computed, reservation_id)`; the
//! connector offers the tokens it can load and the engine sets pages aside for them. Loaders
//! fill those pages off the engine's thread, `get_finished_prefix_loads` reports which
//! reservations are filled (or failed, R25), and `release_prefix_reservation` trims or gives
//! up token ranges at any time, including while a load is in flight. The engine may also
//! re-reserve a request under a new id. A late completion must never be reported for pages
//! the engine took back (R26), and no page may be handed to two reservations.
//!
//! # Workflow
//!
//! 1. The reservation manager calls [`Ledger::reserve`] with the engine's id, the token range
//!    offered and the pages set aside, one [`ReservedPage`] per (block, group).
//! 2. A loader takes the reservation: [`Ledger::start_load`] returns a [`LoadTicket`] (id plus
//!    a generation). The ledger does not guard the pages while they are written: a released
//!    page may belong to another request at once, so the engine's handle takes it back from
//!    the load's `transfer::LoadGrant` before the release returns, and loaders write only
//!    what the grant still lends (R29). The ledger's release only frees the page for later
//!    reservations.
//! 3. The loader reports with [`Ledger::complete`]. A completion that no longer matches a live,
//!    loading reservation is stale and ignored ([`CompletionDisposition::Stale`]).
//! 4. Every step `get_finished_prefix_loads` drains [`Ledger::take_finished`]; the reservations
//!    it returns are handed over to the engine and leave the ledger.
//! 5. `release_prefix_reservation` calls [`Ledger::release`]; `request_finished` calls
//!    [`Ledger::forget_request`].
//!
//! # Decisions
//!
//! - **Pages per block.** The caller passes each page with its block index; the ledger knows
//!   `tokens_per_block` (T) and maps a released token range to blocks: block `b` covers tokens
//!   `[b*T, (b+1)*T)`. Releases need not be block aligned: a page is freed only when no token
//!   of its block remains reserved, since the loader moves whole blocks.
//! - **Replacement is implicit.** A reservation is per request: reserving a request that
//!   already has a live reservation replaces it (R26). The old one is retired first, so the new
//!   one may reuse its pages; if the new one is refused, the old one stays untouched.
//! - **Capacity.** The ledger is built with a page budget per layer group: how many pages the
//!   engine lends to reservations at once. A reservation that would exceed it is refused.
//! - **Hand-over.** A reservation reported by `take_finished` becomes the engine's (computed
//!   pages, or pages it frees after a failure) and leaves the ledger; a release that follows is
//!   a harmless no-op ([`ReleaseOutcome::NotLive`]), as every late or duplicate release is.
//! - **Generations.** Engine ids are unique only while live, so each reservation also gets a
//!   ledger-wide generation, carried by its [`LoadTicket`]: a completion from before an id was
//!   reused is stale. The ledger remembers the last [`RETIRED_MEMORY`] retired tickets to name
//!   why a completion is stale; older ones report [`StaleReason::Unknown`], ignored all the same.
//!
//! # Invariants
//!
//! - `ledger::I1`. No page is reserved twice: each `(group, page)` is held by at most one live
//!   reservation, and the holder index lists exactly the pages of live reservations.
//! - `ledger::I2`. For every group, `free + reserved == capacity`, where `reserved` counts the
//!   pages of live reservations in that group (so `reserved <= capacity`).
//! - `ledger::I3`. A request has at most one live reservation, and the request index agrees with
//!   it.
//! - `ledger::I4`. A live reservation's token ranges are non-empty, sorted and disjoint, and
//!   every page it holds belongs to a block that overlaps them.
//! - `ledger::I5`. The finished set is exactly the live reservations in `Filled` or `Failed`, in
//!   completion order; [`Ledger::take_finished`] drains it and removes those reservations.
//! - `ledger::I6`. States only move `Reserved -> Loading -> Filled | Failed`.
//! - `ledger::I7`. A completion is accepted only for a live `Loading` reservation of the
//!   ticket's generation; any other completion is stale and changes nothing but a counter (R26).
//! - `ledger::I8`. A call that returns an error changes nothing.
//!
//! [`Ledger::check_invariants`] checks `ledger::I1`-I5; tests check `ledger::I6`-I8 by behaviour.
//!
//! # Files
//!
//! This file holds the ledger's state and its mutating calls, with unit tests at the bottom.
//! `ledger/types.rs` holds the vocabulary (pages, tickets, results, outcomes, counters),
//! `ledger/error.rs` the errors, `ledger/views.rs` the read-only views and the `ledger::I1`-I5
//! check, `ledger/random_tests.rs` the seeded randomized test (TGI style) and
//! `ledger/model_tests.rs` the model-based proptest (Vector style).

mod error;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod random_tests;
mod types;
mod views;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Range;

pub use error::{LedgerError, LedgerInvariant};
pub use types::{
    CompletionDisposition, LedgerCounters, LoadFailure, LoadResult, LoadTicket, ReleaseOutcome,
    ReservationState, ReserveOutcome, ReservedPage, StaleReason,
};

use crate::core::ids::{PageIndex, RequestId, ReservationId};
use crate::core::layout::GroupId;

/// How many retired reservations the ledger remembers to name the reason of a stale
/// completion; this bound only affects [`StaleReason`] diagnostics, never behaviour.
pub const RETIRED_MEMORY: usize = 4096;

/// One live reservation.
#[derive(Debug)]
struct Entry {
    request: RequestId,
    generation: u64,
    state: ReservationState,
    /// Token ranges still reserved: sorted, disjoint, non-empty (`ledger::I4`).
    tokens: Vec<Range<u64>>,
    pages: Vec<ReservedPage>,
    /// Position in the finished set once completed (`ledger::I5`).
    finished_seq: Option<u64>,
}

/// Pages a group lends to reservations; `free` is kept alongside the holder index so `ledger::I2`
/// is a real cross-check rather than a definition.
#[derive(Clone, Copy, Debug)]
struct GroupBudget {
    capacity: usize,
    free: usize,
}

/// The last [`RETIRED_MEMORY`] retired reservations, to name a stale completion's reason.
#[derive(Debug, Default)]
struct RetiredLog {
    order: VecDeque<(ReservationId, u64)>,
    reasons: HashMap<(ReservationId, u64), StaleReason>,
}

impl RetiredLog {
    fn record(&mut self, id: ReservationId, generation: u64, reason: StaleReason) {
        if self.order.len() == RETIRED_MEMORY {
            if let Some(oldest) = self.order.pop_front() {
                self.reasons.remove(&oldest);
            }
        }
        self.order.push_back((id, generation));
        self.reasons.insert((id, generation), reason);
    }

    fn reason(&self, ticket: LoadTicket) -> StaleReason {
        let key = (ticket.id, ticket.generation);
        self.reasons
            .get(&key)
            .copied()
            .unwrap_or(StaleReason::Unknown)
    }
}

/// The connector's record of the engine's prefix reservations; see the module doc for the
/// workflow and the invariants `ledger::I1`-I8.
#[derive(Debug)]
pub struct Ledger {
    tokens_per_block: u64,
    budgets: BTreeMap<GroupId, GroupBudget>,
    live: HashMap<ReservationId, Entry>,
    /// Request -> its one live reservation (`ledger::I3`); replacement looks it up.
    by_request: HashMap<RequestId, ReservationId>,
    /// Page -> the live reservation holding it (`ledger::I1`); refuses double reservation in O(1).
    page_holder: HashMap<(GroupId, PageIndex), ReservationId>,
    /// Completion order -> reservation, drained by `take_finished` (`ledger::I5`).
    finished: BTreeMap<u64, ReservationId>,
    next_finished_seq: u64,
    next_generation: u64,
    retired: RetiredLog,
    counters: LedgerCounters,
}

impl Ledger {
    /// Builds an empty ledger for blocks of `tokens_per_block` tokens, with a page budget per
    /// layer group: how many pages of that group the engine lends to reservations at once.
    ///
    /// # Errors
    ///
    /// [`LedgerError::ZeroTokensPerBlock`], [`LedgerError::GroupListedTwice`] or
    /// [`LedgerError::ZeroBudget`].
    pub fn new(
        tokens_per_block: u64,
        budgets: impl IntoIterator<Item = (GroupId, usize)>,
    ) -> Result<Self, LedgerError> {
        if tokens_per_block == 0 {
            return Err(LedgerError::ZeroTokensPerBlock);
        }
        let mut by_group = BTreeMap::new();
        for (group, capacity) in budgets {
            if capacity == 0 {
                return Err(LedgerError::ZeroBudget { group });
            }
            let budget = GroupBudget {
                capacity,
                free: capacity,
            };
            if by_group.insert(group, budget).is_some() {
                return Err(LedgerError::GroupListedTwice { group });
            }
        }
        Ok(Self {
            tokens_per_block,
            budgets: by_group,
            live: HashMap::new(),
            by_request: HashMap::new(),
            page_holder: HashMap::new(),
            finished: BTreeMap::new(),
            next_finished_seq: 0,
            next_generation: 0,
            retired: RetiredLog::default(),
            counters: LedgerCounters::default(),
        })
    }

    /// Records reservation `id` of `request` over `tokens`, holding `pages`. If the request
    /// already has a live reservation, that one is replaced (its completions become stale,
    /// R26) and its pages may be reused by this one.
    ///
    /// # Errors
    ///
    /// Refused, changing nothing (`ledger::I8`), when `id` is live, `tokens` is empty, a page names
    /// an unknown group, lies outside `tokens`, is listed twice, is held by another live
    /// reservation (`ledger::I1`), or a group's budget cannot cover the pages (`ledger::I2`).
    pub fn reserve(
        &mut self,
        request: RequestId,
        id: ReservationId,
        pages: Vec<ReservedPage>,
        tokens: Range<u64>,
    ) -> Result<ReserveOutcome, LedgerError> {
        let replaced = self.by_request.get(&request).copied();
        if let Err(error) = self.validate(id, replaced, &pages, &tokens) {
            self.counters.num_refused += 1;
            return Err(error);
        }
        let outcome = match replaced {
            Some(old) => {
                self.retire(old, StaleReason::Replaced);
                self.counters.num_replaced += 1;
                ReserveOutcome::Replaced { old }
            }
            None => ReserveOutcome::New,
        };
        for page in &pages {
            self.page_holder.insert((page.group, page.page), id);
            if let Some(budget) = self.budgets.get_mut(&page.group) {
                // `ledger::I2`: validate() checked the budget covers every page.
                budget.free -= 1;
            }
        }
        let entry = Entry {
            request,
            generation: self.next_generation,
            state: ReservationState::Reserved,
            tokens: vec![tokens],
            pages,
            finished_seq: None,
        };
        self.next_generation += 1;
        self.live.insert(id, entry);
        self.by_request.insert(request, id);
        self.counters.num_reserved += 1;
        Ok(outcome)
    }

    /// Checks a reservation without changing anything; `replaced` is the request's live
    /// reservation, whose pages count as free.
    fn validate(
        &self,
        id: ReservationId,
        replaced: Option<ReservationId>,
        pages: &[ReservedPage],
        tokens: &Range<u64>,
    ) -> Result<(), LedgerError> {
        if self.live.contains_key(&id) {
            return Err(LedgerError::IdAlreadyLive { id });
        }
        if tokens.start >= tokens.end {
            return Err(LedgerError::EmptyTokenRange {
                id,
                start: tokens.start,
                end: tokens.end,
            });
        }
        let needed = self.validate_pages(id, replaced, pages, tokens)?;
        for (group, requested) in needed {
            let returned = replaced.map_or(0, |old| self.pages_in_group(old, group));
            let free = self.budgets.get(&group).map_or(0, |budget| budget.free);
            let available = free + returned;
            if requested > available {
                return Err(LedgerError::BudgetExceeded {
                    id,
                    group,
                    requested,
                    available,
                });
            }
        }
        Ok(())
    }

    /// Checks each page (known group, inside `tokens`, listed once, not held by a live
    /// reservation other than `replaced`) and returns how many pages each group needs.
    fn validate_pages(
        &self,
        id: ReservationId,
        replaced: Option<ReservationId>,
        pages: &[ReservedPage],
        tokens: &Range<u64>,
    ) -> Result<BTreeMap<GroupId, usize>, LedgerError> {
        let mut blocks = HashSet::new();
        let mut slots = HashSet::new();
        let mut needed: BTreeMap<GroupId, usize> = BTreeMap::new();
        for &ReservedPage {
            block_index,
            group,
            page,
        } in pages
        {
            if !self.budgets.contains_key(&group) {
                return Err(LedgerError::UnknownGroup { id, group });
            }
            if !self.block_overlaps(block_index, std::slice::from_ref(tokens)) {
                let (start, end) = (tokens.start, tokens.end);
                return Err(LedgerError::BlockOutsideRange {
                    id,
                    block_index,
                    start,
                    end,
                });
            }
            if !blocks.insert((block_index, group)) {
                return Err(LedgerError::BlockListedTwice {
                    id,
                    block_index,
                    group,
                });
            }
            if !slots.insert((group, page)) {
                return Err(LedgerError::PageListedTwice { id, group, page });
            }
            match self.page_holder.get(&(group, page)) {
                Some(&holder) if Some(holder) != replaced => {
                    return Err(LedgerError::PageHeld {
                        id,
                        group,
                        page,
                        holder,
                    });
                }
                _ => {}
            }
            *needed.entry(group).or_default() += 1;
        }
        Ok(needed)
    }

    /// Hands reservation `id` to a loader: `Reserved -> Loading` (`ledger::I6`).
    ///
    /// # Errors
    ///
    /// [`LedgerError::NotLive`] or [`LedgerError::NotReserved`] (a load already started or
    /// finished); nothing changes (`ledger::I8`).
    pub fn start_load(&mut self, id: ReservationId) -> Result<LoadTicket, LedgerError> {
        let entry = self.live.get_mut(&id).ok_or(LedgerError::NotLive { id })?;
        if entry.state != ReservationState::Reserved {
            return Err(LedgerError::NotReserved {
                id,
                state: entry.state,
            });
        }
        entry.state = ReservationState::Loading;
        self.counters.num_loads_started += 1;
        Ok(LoadTicket {
            id,
            generation: entry.generation,
        })
    }

    /// Records a loader's report. Accepted only for a live `Loading` reservation of the ticket's
    /// generation (`ledger::I7`); it then joins the finished set (`ledger::I5`). Anything else is
    /// stale and ignored (R26).
    pub fn complete(&mut self, ticket: LoadTicket, result: LoadResult) -> CompletionDisposition {
        let entry = match self.live.get_mut(&ticket.id) {
            Some(entry) if entry.generation == ticket.generation => entry,
            _ => return self.stale(self.retired.reason(ticket)),
        };
        match entry.state {
            ReservationState::Loading => {}
            ReservationState::Filled | ReservationState::Failed(_) => {
                return self.stale(StaleReason::AlreadyFinished);
            }
            // Only start_load makes tickets, and it leaves the entry Loading.
            ReservationState::Reserved => return self.stale(StaleReason::Unknown),
        }
        entry.state = match result {
            LoadResult::Filled => ReservationState::Filled,
            LoadResult::Failed(failure) => ReservationState::Failed(failure),
        };
        entry.finished_seq = Some(self.next_finished_seq);
        self.finished.insert(self.next_finished_seq, ticket.id);
        self.next_finished_seq += 1;
        self.counters.num_completions_accepted += 1;
        CompletionDisposition::Accepted
    }

    fn stale(&mut self, reason: StaleReason) -> CompletionDisposition {
        self.counters.num_completions_stale += 1;
        CompletionDisposition::Stale { reason }
    }

    /// Drains the finished set in completion order for `get_finished_prefix_loads` and hands
    /// those reservations over to the engine: they leave the ledger and their pages leave the
    /// budget (`ledger::I5`). A later completion or release for them is harmless.
    pub fn take_finished(&mut self) -> Vec<(ReservationId, LoadResult)> {
        let finished = std::mem::take(&mut self.finished);
        let mut handed_over = Vec::with_capacity(finished.len());
        for id in finished.into_values() {
            let Some(result) = self.live.get(&id).and_then(|e| e.state.finished_result()) else {
                continue; // `ledger::I5` makes this unreachable; check_invariants reports it.
            };
            self.retire(id, StaleReason::AlreadyFinished);
            match result {
                LoadResult::Filled => self.counters.num_handed_over_filled += 1,
                LoadResult::Failed(_) => self.counters.num_handed_over_failed += 1,
            }
            handed_over.push((id, result));
        }
        handed_over
    }

    /// The engine trims or gives up tokens `[token_start, token_end)` of reservation `id`.
    /// Tokens outside what is still reserved are ignored, so late and duplicate releases are
    /// harmless. If nothing remains the reservation is removed (a load in flight for it will
    /// complete as stale); otherwise the pages of blocks with no reserved token left are freed.
    pub fn release(
        &mut self,
        id: ReservationId,
        token_start: u64,
        token_end: u64,
    ) -> ReleaseOutcome {
        let tokens_per_block = self.tokens_per_block;
        let Some(entry) = self.live.get_mut(&id) else {
            self.counters.num_release_not_live += 1;
            return ReleaseOutcome::NotLive;
        };
        if !subtract_range(&mut entry.tokens, token_start..token_end) {
            return ReleaseOutcome::Unchanged;
        }
        if entry.tokens.is_empty() {
            let freed_pages = self.retire(id, StaleReason::Released);
            self.counters.num_released += 1;
            return ReleaseOutcome::Removed { freed_pages };
        }
        let (kept, freed): (Vec<_>, Vec<_>) = entry
            .pages
            .iter()
            .copied()
            .partition(|page| overlaps(page.block_index, tokens_per_block, &entry.tokens));
        entry.pages = kept;
        for page in &freed {
            self.free_page(*page);
        }
        self.counters.num_trimmed += 1;
        ReleaseOutcome::Trimmed {
            freed_pages: freed.len(),
        }
    }

    /// Releases the whole live reservation of `request` (`request_finished`, or an abort).
    /// Returns [`ReleaseOutcome::NotLive`] when it has none.
    pub fn forget_request(&mut self, request: RequestId) -> ReleaseOutcome {
        let Some(&id) = self.by_request.get(&request) else {
            return ReleaseOutcome::NotLive;
        };
        let freed_pages = self.retire(id, StaleReason::Released);
        self.counters.num_released += 1;
        ReleaseOutcome::Removed { freed_pages }
    }

    /// Removes live reservation `id`, frees its pages and remembers why; returns the number
    /// of pages freed.
    fn retire(&mut self, id: ReservationId, reason: StaleReason) -> usize {
        let Some(entry) = self.live.remove(&id) else {
            return 0;
        };
        if self.by_request.get(&entry.request) == Some(&id) {
            self.by_request.remove(&entry.request);
        }
        if let Some(seq) = entry.finished_seq {
            self.finished.remove(&seq);
        }
        for page in &entry.pages {
            self.free_page(*page);
        }
        self.retired.record(id, entry.generation, reason);
        entry.pages.len()
    }

    fn free_page(&mut self, page: ReservedPage) {
        self.page_holder.remove(&(page.group, page.page));
        if let Some(budget) = self.budgets.get_mut(&page.group) {
            budget.free += 1;
        }
    }

    fn block_overlaps(&self, block_index: u64, tokens: &[Range<u64>]) -> bool {
        overlaps(block_index, self.tokens_per_block, tokens)
    }

    fn pages_in_group(&self, id: ReservationId, group: GroupId) -> usize {
        self.live.get(&id).map_or(0, |entry| {
            entry.pages.iter().filter(|p| p.group == group).count()
        })
    }
}

/// Whether block `block_index` (tokens `[b*T, (b+1)*T)`) overlaps any of `tokens`: the
/// rule by which a reservation keeps a page (a page goes only when no token of its block
/// is reserved any more), shared with `transfer::LoadGrant`.
pub fn overlaps(block_index: u64, tokens_per_block: u64, tokens: &[Range<u64>]) -> bool {
    let block_start = block_index.saturating_mul(tokens_per_block);
    let block_end = block_start.saturating_add(tokens_per_block);
    tokens
        .iter()
        .any(|range| range.start < block_end && block_start < range.end)
}

/// Removes `cut` from sorted, disjoint `ranges`, keeping them sorted, disjoint and non-empty;
/// returns whether anything was removed.
pub fn subtract_range(ranges: &mut Vec<Range<u64>>, cut: Range<u64>) -> bool {
    if cut.start >= cut.end
        || !ranges
            .iter()
            .any(|r| r.start < cut.end && cut.start < r.end)
    {
        return false;
    }
    let mut rest = Vec::with_capacity(ranges.len() + 1);
    for range in ranges.drain(..) {
        if range.end <= cut.start || cut.end <= range.start {
            rest.push(range);
            continue;
        }
        if range.start < cut.start {
            rest.push(range.start..cut.start);
        }
        if cut.end < range.end {
            rest.push(cut.end..range.end);
        }
    }
    *ranges = rest;
    true
}

#[cfg(test)]
mod tests {
    use super::{
        subtract_range, CompletionDisposition, Ledger, LedgerError, LoadFailure, LoadResult,
        LoadTicket, ReleaseOutcome, ReservationState, ReserveOutcome, ReservedPage, StaleReason,
        RETIRED_MEMORY,
    };
    use crate::core::ids::{PageIndex, RequestId, ReservationId};
    use crate::core::layout::GroupId;

    const FULL: GroupId = GroupId(0);
    const WINDOW: GroupId = GroupId(1);
    const T: u64 = 4;

    fn ledger() -> Result<Ledger, LedgerError> {
        Ledger::new(T, [(FULL, 8), (WINDOW, 4)])
    }

    fn page(block_index: u64, group: GroupId, page: u32) -> ReservedPage {
        ReservedPage {
            block_index,
            group,
            page: PageIndex(page),
        }
    }

    /// Full-group pages for `blocks`, on consecutive pages from `first_page`.
    fn full_pages(blocks: std::ops::Range<u64>, first_page: u32) -> Vec<ReservedPage> {
        blocks
            .zip(first_page..)
            .map(|(block, p)| page(block, FULL, p))
            .collect()
    }

    const R1: RequestId = RequestId(1);
    const R2: RequestId = RequestId(2);
    const A: ReservationId = ReservationId(10);
    const B: ReservationId = ReservationId(11);

    #[test]
    fn new_refuses_zero_block_size_zero_budget_and_a_group_listed_twice() {
        assert_eq!(
            Ledger::new(0, [(FULL, 1)]).err(),
            Some(LedgerError::ZeroTokensPerBlock)
        );
        assert_eq!(
            Ledger::new(T, [(FULL, 0)]).err(),
            Some(LedgerError::ZeroBudget { group: FULL })
        );
        let twice = Ledger::new(T, [(FULL, 1), (FULL, 2)]).err();
        assert_eq!(twice, Some(LedgerError::GroupListedTwice { group: FULL }));
    }

    #[test]
    fn i5_r24_a_filled_load_is_reported_once_and_handed_over() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        let outcome = ledger.reserve(R1, A, full_pages(2..5, 0), 8..20)?;
        assert_eq!(outcome, ReserveOutcome::New);
        assert_eq!(ledger.state(A), Some(ReservationState::Reserved));
        assert_eq!(ledger.free_pages(FULL), Some(5));
        let ticket = ledger.start_load(A)?;
        assert_eq!(ticket.id(), A);
        assert!(
            ledger.take_finished().is_empty(),
            "nothing finished while loading"
        );
        assert_eq!(
            ledger.complete(ticket, LoadResult::Filled),
            CompletionDisposition::Accepted
        );
        assert_eq!(ledger.state(A), Some(ReservationState::Filled));
        ledger.check_invariants()?;
        assert_eq!(ledger.take_finished(), vec![(A, LoadResult::Filled)]);
        assert!(ledger.take_finished().is_empty(), "reported once");
        assert!(ledger.is_empty());
        assert_eq!(
            ledger.free_pages(FULL),
            Some(8),
            "handed over pages leave the budget"
        );
        assert_eq!(
            ledger.release(A, 8, 20),
            ReleaseOutcome::NotLive,
            "release after hand-over"
        );
        assert_eq!(ledger.counters().num_handed_over_filled, 1);
        ledger.check_invariants()
    }

    #[test]
    fn r25_a_failed_load_is_reported_as_failed() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..2, 0), 0..8)?;
        let ticket = ledger.start_load(A)?;
        let failed = LoadResult::Failed(LoadFailure::Corrupt);
        assert_eq!(
            ledger.complete(ticket, failed),
            CompletionDisposition::Accepted
        );
        assert_eq!(
            ledger.state(A),
            Some(ReservationState::Failed(LoadFailure::Corrupt))
        );
        assert_eq!(ledger.take_finished(), vec![(A, failed)]);
        assert_eq!(ledger.counters().num_handed_over_failed, 1);
        ledger.check_invariants()
    }

    #[test]
    fn i1_i8_reserve_refuses_a_page_held_by_another_reservation() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..2, 0), 0..8)?;
        let clash = vec![page(0, FULL, 5), page(1, FULL, 1)];
        let refused = ledger.reserve(R2, B, clash, 0..8);
        let expected = LedgerError::PageHeld {
            id: B,
            group: FULL,
            page: PageIndex(1),
            holder: A,
        };
        assert_eq!(refused, Err(expected));
        assert_eq!(ledger.state(B), None, "ledger::I8: nothing recorded");
        assert_eq!(
            ledger.holder_of(FULL, PageIndex(5)),
            None,
            "ledger::I8: no page taken"
        );
        assert_eq!(ledger.free_pages(FULL), Some(6));
        assert_eq!(ledger.counters().num_refused, 1);
        ledger.check_invariants()
    }

    #[test]
    fn i8_reserve_refuses_an_id_that_is_live() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..1, 0), 0..4)?;
        let refused = ledger.reserve(R2, A, full_pages(0..1, 3), 0..4);
        assert_eq!(refused, Err(LedgerError::IdAlreadyLive { id: A }));
        assert_eq!(ledger.reservation_of(R2), None);
        assert_eq!(ledger.pages(A), Some(&[page(0, FULL, 0)][..]));
        ledger.check_invariants()
    }

    #[test]
    fn i2_reserve_refuses_what_the_budget_cannot_cover() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(
            R1,
            A,
            vec![page(0, WINDOW, 0), page(1, WINDOW, 1), page(2, WINDOW, 2)],
            0..12,
        )?;
        let refused = ledger.reserve(R2, B, vec![page(0, WINDOW, 3), page(1, WINDOW, 4)], 0..8);
        let expected = LedgerError::BudgetExceeded {
            id: B,
            group: WINDOW,
            requested: 2,
            available: 1,
        };
        assert_eq!(refused, Err(expected));
        assert_eq!(ledger.free_pages(WINDOW), Some(1));
        assert_eq!(ledger.reserved_pages(WINDOW), Some(3));
        assert_eq!(ledger.capacity(WINDOW), Some(4));
        ledger.check_invariants()
    }

    #[test]
    fn i4_i8_reserve_refuses_malformed_reservations() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        let cases = [
            (
                vec![],
                8..8,
                LedgerError::EmptyTokenRange {
                    id: A,
                    start: 8,
                    end: 8,
                },
            ),
            (
                vec![page(0, GroupId(7), 0)],
                0..4,
                LedgerError::UnknownGroup {
                    id: A,
                    group: GroupId(7),
                },
            ),
            (
                vec![page(3, FULL, 0)],
                0..12,
                LedgerError::BlockOutsideRange {
                    id: A,
                    block_index: 3,
                    start: 0,
                    end: 12,
                },
            ),
            (
                vec![page(0, FULL, 0), page(0, FULL, 1)],
                0..4,
                LedgerError::BlockListedTwice {
                    id: A,
                    block_index: 0,
                    group: FULL,
                },
            ),
            (
                vec![page(0, FULL, 2), page(1, FULL, 2)],
                0..8,
                LedgerError::PageListedTwice {
                    id: A,
                    group: FULL,
                    page: PageIndex(2),
                },
            ),
        ];
        for (pages, tokens, expected) in cases {
            assert_eq!(ledger.reserve(R1, A, pages, tokens), Err(expected));
            assert!(ledger.is_empty());
            assert_eq!(ledger.free_pages(FULL), Some(8));
        }
        // A block that only partly overlaps the range is inside it.
        ledger.reserve(R1, A, vec![page(2, FULL, 0)], 11..12)?;
        ledger.check_invariants()
    }

    #[test]
    fn r26_rereserving_a_request_replaces_it_and_the_old_completion_is_stale(
    ) -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..3, 0), 0..12)?;
        let old_ticket = ledger.start_load(A)?;
        // The new reservation reuses two of the old pages: they count as free.
        let outcome = ledger.reserve(R1, B, full_pages(0..2, 1), 0..8)?;
        assert_eq!(outcome, ReserveOutcome::Replaced { old: A });
        assert_eq!(ledger.state(A), None);
        assert_eq!(ledger.reservation_of(R1), Some(B));
        assert_eq!(
            ledger.holder_of(FULL, PageIndex(0)),
            None,
            "old-only page freed"
        );
        assert_eq!(ledger.holder_of(FULL, PageIndex(2)), Some(B));
        let stale = ledger.complete(old_ticket, LoadResult::Filled);
        assert_eq!(
            stale,
            CompletionDisposition::Stale {
                reason: StaleReason::Replaced
            }
        );
        assert_eq!(
            ledger.state(B),
            Some(ReservationState::Reserved),
            "ledger::I7: stale changes nothing"
        );
        assert!(ledger.take_finished().is_empty());
        assert_eq!(ledger.counters().num_replaced, 1);
        ledger.check_invariants()
    }

    #[test]
    fn i8_a_refused_replacement_keeps_the_old_reservation() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..2, 0), 0..8)?;
        ledger.reserve(R2, B, full_pages(0..1, 5), 0..4)?;
        let refused = ledger.reserve(R1, ReservationId(12), full_pages(0..2, 4), 0..8);
        assert!(matches!(
            refused,
            Err(LedgerError::PageHeld { holder: B, .. })
        ));
        assert_eq!(ledger.reservation_of(R1), Some(A));
        assert_eq!(ledger.pages(A), Some(&full_pages(0..2, 0)[..]));
        assert_eq!(ledger.counters().num_replaced, 0);
        ledger.check_invariants()
    }

    #[test]
    fn r26_releasing_the_whole_range_makes_the_load_in_flight_stale() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..3, 0), 0..12)?;
        let ticket = ledger.start_load(A)?;
        assert_eq!(
            ledger.release(A, 0, 12),
            ReleaseOutcome::Removed { freed_pages: 3 }
        );
        assert_eq!(ledger.free_pages(FULL), Some(8));
        let stale = ledger.complete(ticket, LoadResult::Filled);
        assert_eq!(
            stale,
            CompletionDisposition::Stale {
                reason: StaleReason::Released
            }
        );
        assert!(
            ledger.take_finished().is_empty(),
            "released pages are never reported filled"
        );
        ledger.check_invariants()
    }

    #[test]
    fn i4_a_tail_trim_frees_only_blocks_with_no_reserved_token_left() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        let window = [page(2, WINDOW, 0), page(3, WINDOW, 1)];
        let pages = full_pages(0..4, 0).into_iter().chain(window).collect();
        ledger.reserve(R1, A, pages, 0..16)?;
        // Tokens [6, 16): block 1 keeps tokens 4 and 5, blocks 2 and 3 go in both groups.
        assert_eq!(
            ledger.release(A, 6, 100),
            ReleaseOutcome::Trimmed { freed_pages: 4 }
        );
        assert_eq!(
            ledger.reserved_tokens(A),
            Some(std::slice::from_ref(&(0..6)))
        );
        assert_eq!(ledger.pages(A), Some(&full_pages(0..2, 0)[..]));
        assert_eq!(ledger.free_pages(WINDOW), Some(4));
        assert_eq!(ledger.free_pages(FULL), Some(6));
        assert_eq!(
            ledger.release(A, 6, 16),
            ReleaseOutcome::Unchanged,
            "already released"
        );
        assert_eq!(
            ledger.release(A, 0, 6),
            ReleaseOutcome::Removed { freed_pages: 2 }
        );
        ledger.check_invariants()
    }

    #[test]
    fn i4_a_release_in_the_middle_splits_the_range() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..4, 0), 0..16)?;
        assert_eq!(
            ledger.release(A, 4, 12),
            ReleaseOutcome::Trimmed { freed_pages: 2 }
        );
        assert_eq!(ledger.reserved_tokens(A), Some(&[0..4, 12..16][..]));
        let kept = [page(0, FULL, 0), page(3, FULL, 3)];
        assert_eq!(ledger.pages(A), Some(&kept[..]));
        // A freed page is free for another reservation.
        ledger.reserve(R2, B, vec![page(1, FULL, 1)], 4..8)?;
        ledger.check_invariants()
    }

    #[test]
    fn g6_late_duplicate_and_empty_releases_are_harmless() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        assert_eq!(
            ledger.release(A, 0, 4),
            ReleaseOutcome::NotLive,
            "never reserved"
        );
        ledger.reserve(R1, A, full_pages(0..2, 0), 0..8)?;
        assert_eq!(
            ledger.release(A, 5, 5),
            ReleaseOutcome::Unchanged,
            "empty range"
        );
        assert_eq!(
            ledger.release(A, 9, 3),
            ReleaseOutcome::Unchanged,
            "inverted range"
        );
        assert_eq!(
            ledger.release(A, 100, 200),
            ReleaseOutcome::Unchanged,
            "outside"
        );
        assert_eq!(
            ledger.release(A, 0, 8),
            ReleaseOutcome::Removed { freed_pages: 2 }
        );
        assert_eq!(
            ledger.release(A, 0, 8),
            ReleaseOutcome::NotLive,
            "duplicate"
        );
        assert_eq!(ledger.counters().num_release_not_live, 2);
        ledger.check_invariants()
    }

    #[test]
    fn i6_a_load_starts_only_from_reserved() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        assert_eq!(ledger.start_load(A), Err(LedgerError::NotLive { id: A }));
        ledger.reserve(R1, A, full_pages(0..1, 0), 0..4)?;
        let ticket = ledger.start_load(A)?;
        let again = ledger.start_load(A);
        assert_eq!(
            again,
            Err(LedgerError::NotReserved {
                id: A,
                state: ReservationState::Loading
            })
        );
        ledger.complete(ticket, LoadResult::Filled);
        let after = ledger.start_load(A);
        assert_eq!(
            after,
            Err(LedgerError::NotReserved {
                id: A,
                state: ReservationState::Filled
            })
        );
        ledger.check_invariants()
    }

    #[test]
    fn i7_a_duplicate_completion_is_stale() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..1, 0), 0..4)?;
        let ticket = ledger.start_load(A)?;
        assert_eq!(
            ledger.complete(ticket, LoadResult::Filled),
            CompletionDisposition::Accepted
        );
        let failed = LoadResult::Failed(LoadFailure::Timeout);
        let stale = CompletionDisposition::Stale {
            reason: StaleReason::AlreadyFinished,
        };
        assert_eq!(ledger.complete(ticket, failed), stale);
        assert_eq!(
            ledger.state(A),
            Some(ReservationState::Filled),
            "first report wins"
        );
        assert_eq!(ledger.take_finished(), vec![(A, LoadResult::Filled)]);
        assert_eq!(
            ledger.complete(ticket, LoadResult::Filled),
            stale,
            "after hand-over"
        );
        assert_eq!(ledger.counters().num_completions_stale, 2);
        ledger.check_invariants()
    }

    #[test]
    fn i7_a_completion_from_before_an_id_was_reused_is_stale() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..1, 0), 0..4)?;
        let old_ticket = ledger.start_load(A)?;
        ledger.release(A, 0, 4);
        // The engine reuses id A for another request.
        ledger.reserve(R2, A, full_pages(0..1, 0), 0..4)?;
        let new_ticket = ledger.start_load(A)?;
        let stale = ledger.complete(old_ticket, LoadResult::Filled);
        assert_eq!(
            stale,
            CompletionDisposition::Stale {
                reason: StaleReason::Released
            }
        );
        assert_eq!(ledger.state(A), Some(ReservationState::Loading));
        assert_eq!(
            ledger.complete(new_ticket, LoadResult::Filled),
            CompletionDisposition::Accepted
        );
        let forged = LoadTicket {
            id: ReservationId(99),
            generation: 0,
        };
        let unknown = CompletionDisposition::Stale {
            reason: StaleReason::Unknown,
        };
        assert_eq!(ledger.complete(forged, LoadResult::Filled), unknown);
        ledger.check_invariants()
    }

    #[test]
    fn r26_releasing_a_filled_unreported_reservation_drops_it_from_the_finished_set(
    ) -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..1, 0), 0..4)?;
        ledger.reserve(R2, B, full_pages(0..1, 1), 0..4)?;
        let ticket_a = ledger.start_load(A)?;
        let ticket_b = ledger.start_load(B)?;
        ledger.complete(ticket_b, LoadResult::Filled);
        ledger.complete(ticket_a, LoadResult::Filled);
        assert_eq!(
            ledger.release(A, 0, 4),
            ReleaseOutcome::Removed { freed_pages: 1 }
        );
        ledger.check_invariants()?;
        assert_eq!(ledger.take_finished(), vec![(B, LoadResult::Filled)]);
        ledger.check_invariants()
    }

    #[test]
    fn i5_finished_loads_come_out_in_completion_order() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        let ids = [ReservationId(3), ReservationId(1), ReservationId(2)];
        let mut tickets = Vec::new();
        for (n, id) in (0..).zip(ids) {
            ledger.reserve(
                RequestId(n),
                id,
                full_pages(0..1, u32::try_from(n).unwrap_or(0)),
                0..4,
            )?;
            tickets.push(ledger.start_load(id)?);
        }
        let failed = LoadResult::Failed(LoadFailure::Evicted);
        ledger.complete(tickets[1], LoadResult::Filled);
        ledger.complete(tickets[2], failed);
        ledger.complete(tickets[0], LoadResult::Filled);
        let expected = vec![
            (ids[1], LoadResult::Filled),
            (ids[2], failed),
            (ids[0], LoadResult::Filled),
        ];
        assert_eq!(ledger.take_finished(), expected);
        ledger.check_invariants()
    }

    #[test]
    fn trimming_while_loading_then_filling_reports_the_rest() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        ledger.reserve(R1, A, full_pages(0..4, 0), 0..16)?;
        let ticket = ledger.start_load(A)?;
        assert_eq!(
            ledger.release(A, 8, 16),
            ReleaseOutcome::Trimmed { freed_pages: 2 }
        );
        assert_eq!(
            ledger.pages(A),
            Some(&full_pages(0..2, 0)[..]),
            "what the loader may write"
        );
        // The freed pages go to another request while the load is in flight.
        ledger.reserve(R2, B, vec![page(2, FULL, 2)], 8..12)?;
        assert_eq!(
            ledger.complete(ticket, LoadResult::Filled),
            CompletionDisposition::Accepted
        );
        assert_eq!(ledger.take_finished(), vec![(A, LoadResult::Filled)]);
        assert_eq!(ledger.holder_of(FULL, PageIndex(2)), Some(B));
        ledger.check_invariants()
    }

    #[test]
    fn forget_request_releases_its_reservation() -> Result<(), LedgerError> {
        let mut ledger = ledger()?;
        assert_eq!(ledger.forget_request(R1), ReleaseOutcome::NotLive);
        ledger.reserve(R1, A, full_pages(0..3, 0), 0..12)?;
        let ticket = ledger.start_load(A)?;
        assert_eq!(
            ledger.forget_request(R1),
            ReleaseOutcome::Removed { freed_pages: 3 }
        );
        assert_eq!(ledger.reservation_of(R1), None);
        let stale = ledger.complete(ticket, LoadResult::Filled);
        assert_eq!(
            stale,
            CompletionDisposition::Stale {
                reason: StaleReason::Released
            }
        );
        ledger.check_invariants()
    }

    #[test]
    fn retired_memory_is_bounded_and_older_reasons_read_unknown() -> Result<(), LedgerError> {
        let mut ledger = Ledger::new(T, [(FULL, 1)])?;
        let mut first_ticket = None;
        for n in 0..=u64::try_from(RETIRED_MEMORY).unwrap_or(u64::MAX) {
            ledger.reserve(RequestId(n), ReservationId(n), vec![page(0, FULL, 0)], 0..4)?;
            let ticket = ledger.start_load(ReservationId(n))?;
            first_ticket.get_or_insert(ticket);
            ledger.release(ReservationId(n), 0, 4);
        }
        assert_eq!(ledger.retired.order.len(), RETIRED_MEMORY);
        assert_eq!(ledger.retired.reasons.len(), RETIRED_MEMORY);
        let oldest = first_ticket.map(|ticket| ledger.complete(ticket, LoadResult::Filled));
        assert_eq!(
            oldest,
            Some(CompletionDisposition::Stale {
                reason: StaleReason::Unknown
            })
        );
        ledger.check_invariants()
    }

    #[test]
    fn subtract_range_keeps_ranges_sorted_disjoint_and_non_empty() {
        let mut ranges = vec![0..10, 20..30];
        assert!(!subtract_range(&mut ranges, 10..20), "gap only");
        assert!(!subtract_range(&mut ranges, 5..5), "empty cut");
        assert!(subtract_range(&mut ranges, 5..25));
        assert_eq!(ranges, vec![0..5, 25..30]);
        assert!(subtract_range(&mut ranges, 0..2));
        assert_eq!(ranges, vec![2..5, 25..30]);
        assert!(subtract_range(&mut ranges, 0..100));
        assert!(ranges.is_empty());
    }

    #[test]
    fn error_messages_are_lower_case_and_kinds_are_stable() {
        let errors = [
            LedgerError::ZeroTokensPerBlock,
            LedgerError::BudgetExceeded {
                id: A,
                group: FULL,
                requested: 3,
                available: 1,
            },
            LedgerError::NotReserved {
                id: A,
                state: ReservationState::Loading,
            },
        ];
        for error in &errors {
            let text = error.to_string();
            assert_eq!(text, text.to_lowercase(), "{text}");
        }
        assert!(
            errors[1].to_string().contains("page budget"),
            "names the setting to change"
        );
        assert_eq!(errors[1].kind(), "budget_exceeded");
        assert_eq!(StaleReason::AlreadyFinished.as_str(), "already_finished");
        assert_eq!(LoadFailure::PoolError.as_str(), "pool_error");
    }
}
