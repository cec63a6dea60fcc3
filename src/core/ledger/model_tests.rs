//! Model-based proptest in Vector's style: random sequences of reserve / replace /
//! `start_load` / complete / release / `take_finished` / `forget_request`, applied to the ledger
//! and to a naive `HashMap` model that recomputes everything from scratch.

use std::collections::{BTreeSet, HashMap};

use proptest::prelude::*;
use proptest::test_runner::RngSeed;

use crate::core::ids::{PageIndex, RequestId, ReservationId};
use crate::core::layout::GroupId;
use crate::core::ledger::{
    CompletionDisposition, Ledger, LoadFailure, LoadResult, LoadTicket, ReleaseOutcome,
    ReservationState, ReserveOutcome, ReservedPage, StaleReason,
};

const T: u64 = 4;
const FULL: GroupId = GroupId(0);
const WINDOW: GroupId = GroupId(1);
/// Budgets smaller than the page-index space, so both `ledger::I1` and `ledger::I2` refusals
/// happen.
const BUDGETS: [(GroupId, usize); 2] = [(FULL, 10), (WINDOW, 5)];

#[derive(Clone, Debug)]
struct ReserveSpec {
    id: u64,
    first_block: u64,
    blocks: u64,
    start_offset: u64,
    full_base: u32,
    window_base: u32,
    window_blocks: u64,
}

impl ReserveSpec {
    fn tokens(&self) -> std::ops::Range<u64> {
        self.first_block * T + self.start_offset..(self.first_block + self.blocks) * T
    }

    /// Full pages for every block; window pages for the last `window_blocks` blocks.
    fn pages(&self) -> Vec<ReservedPage> {
        let end = self.first_block + self.blocks;
        let mut pages = Vec::new();
        for (i, block_index) in (0_u32..).zip(self.first_block..end) {
            let page = PageIndex((self.full_base + i) % 16);
            pages.push(ReservedPage {
                block_index,
                group: FULL,
                page,
            });
            if block_index + self.window_blocks >= end {
                let page = PageIndex((self.window_base + i) % 8);
                pages.push(ReservedPage {
                    block_index,
                    group: WINDOW,
                    page,
                });
            }
        }
        pages
    }
}

#[derive(Clone, Debug)]
enum Op {
    Reserve {
        request: u64,
        spec: ReserveSpec,
    },
    /// Re-reserve the request of the `pick`-th live reservation (R26).
    Replace {
        pick: usize,
        spec: ReserveSpec,
    },
    StartLoad {
        id: u64,
    },
    Complete {
        pick: usize,
        failed: bool,
    },
    Release {
        id: u64,
        start: u64,
        len: u64,
    },
    TakeFinished,
    ForgetRequest {
        request: u64,
    },
}

fn spec() -> impl Strategy<Value = ReserveSpec> {
    (
        0..10_u64,
        0..6_u64,
        0..5_u64,
        0..T,
        0..16_u32,
        0..8_u32,
        0..3_u64,
    )
        .prop_map(
            |(id, first_block, blocks, start_offset, full_base, window_base, window_blocks)| {
                ReserveSpec {
                    id,
                    first_block,
                    blocks,
                    start_offset,
                    full_base,
                    window_base,
                    window_blocks,
                }
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..5_u64, spec()).prop_map(|(request, spec)| Op::Reserve { request, spec }),
        1 => (any::<usize>(), spec()).prop_map(|(pick, spec)| Op::Replace { pick, spec }),
        3 => (0..10_u64).prop_map(|id| Op::StartLoad { id }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, failed)| Op::Complete { pick, failed }),
        2 => (0..10_u64, 0..28_u64, 0..16_u64).prop_map(|(id, start, len)| Op::Release { id, start, len }),
        2 => Just(Op::TakeFinished),
        1 => (0..5_u64).prop_map(|request| Op::ForgetRequest { request }),
    ]
}

/// One live reservation of the model; tokens are kept as a plain set.
#[derive(Clone, Debug)]
struct ModelEntry {
    request: u64,
    instance: u64,
    state: ReservationState,
    tokens: BTreeSet<u64>,
    pages: Vec<ReservedPage>,
    finished_at: Option<u64>,
}

#[derive(Default)]
struct Model {
    live: HashMap<u64, ModelEntry>,
    /// Instance -> why it was retired; the model never forgets.
    retired: HashMap<u64, StaleReason>,
    next_instance: u64,
    next_finish: u64,
}

fn block_tokens(block_index: u64) -> std::ops::Range<u64> {
    block_index * T..(block_index + 1) * T
}

impl Model {
    fn holder(&self, group: GroupId, page: PageIndex) -> Option<u64> {
        self.live.iter().find_map(|(&id, e)| {
            e.pages
                .iter()
                .any(|p| p.group == group && p.page == page)
                .then_some(id)
        })
    }

    fn in_use(&self, group: GroupId, except: Option<u64>) -> usize {
        let others = self.live.iter().filter(|(&id, _)| Some(id) != except);
        others
            .map(|(_, e)| e.pages.iter().filter(|p| p.group == group).count())
            .sum()
    }

    fn acceptable(
        &self,
        id: u64,
        replaced: Option<u64>,
        pages: &[ReservedPage],
        tokens: &BTreeSet<u64>,
    ) -> bool {
        if self.live.contains_key(&id) || tokens.is_empty() {
            return false;
        }
        let blocks: BTreeSet<_> = pages.iter().map(|p| (p.block_index, p.group)).collect();
        let slots: BTreeSet<_> = pages.iter().map(|p| (p.group, p.page)).collect();
        let well_formed = blocks.len() == pages.len()
            && slots.len() == pages.len()
            && pages
                .iter()
                .all(|p| block_tokens(p.block_index).any(|t| tokens.contains(&t)))
            && pages
                .iter()
                .all(|p| BUDGETS.iter().any(|(g, _)| *g == p.group));
        let free_of_others = pages.iter().all(|p| {
            self.holder(p.group, p.page)
                .is_none_or(|holder| Some(holder) == replaced)
        });
        let within_budget = BUDGETS.iter().all(|&(group, capacity)| {
            let wanted = pages.iter().filter(|p| p.group == group).count();
            self.in_use(group, replaced) + wanted <= capacity
        });
        well_formed && free_of_others && within_budget
    }

    fn reserve(
        &mut self,
        request: u64,
        id: u64,
        pages: Vec<ReservedPage>,
        tokens: std::ops::Range<u64>,
    ) -> Option<ReserveOutcome> {
        let tokens: BTreeSet<u64> = tokens.collect();
        let replaced = self
            .live
            .iter()
            .find(|(_, e)| e.request == request)
            .map(|(&id, _)| id);
        if !self.acceptable(id, replaced, &pages, &tokens) {
            return None;
        }
        if let Some(old) = replaced {
            self.retire(old, StaleReason::Replaced);
        }
        let instance = self.next_instance;
        self.next_instance += 1;
        let state = ReservationState::Reserved;
        self.live.insert(
            id,
            ModelEntry {
                request,
                instance,
                state,
                tokens,
                pages,
                finished_at: None,
            },
        );
        Some(
            replaced.map_or(ReserveOutcome::New, |old| ReserveOutcome::Replaced {
                old: ReservationId(old),
            }),
        )
    }

    fn retire(&mut self, id: u64, reason: StaleReason) -> usize {
        let entry = self.live.remove(&id).map(|e| (e.instance, e.pages.len()));
        entry.map_or(0, |(instance, pages)| {
            self.retired.insert(instance, reason);
            pages
        })
    }

    fn start_load(&mut self, id: u64) -> Option<u64> {
        let entry = self
            .live
            .get_mut(&id)
            .filter(|e| e.state == ReservationState::Reserved)?;
        entry.state = ReservationState::Loading;
        Some(entry.instance)
    }

    fn complete(&mut self, id: u64, instance: u64, result: LoadResult) -> CompletionDisposition {
        let finish = self.next_finish;
        match self.live.get_mut(&id).filter(|e| e.instance == instance) {
            Some(entry) if entry.state == ReservationState::Loading => {
                entry.state = match result {
                    LoadResult::Filled => ReservationState::Filled,
                    LoadResult::Failed(failure) => ReservationState::Failed(failure),
                };
                entry.finished_at = Some(finish);
                self.next_finish += 1;
                CompletionDisposition::Accepted
            }
            Some(_) => CompletionDisposition::Stale {
                reason: StaleReason::AlreadyFinished,
            },
            None => {
                let reason = self
                    .retired
                    .get(&instance)
                    .copied()
                    .unwrap_or(StaleReason::Unknown);
                CompletionDisposition::Stale { reason }
            }
        }
    }

    fn release(&mut self, id: u64, start: u64, end: u64) -> ReleaseOutcome {
        let Some(entry) = self.live.get_mut(&id) else {
            return ReleaseOutcome::NotLive;
        };
        let before = entry.tokens.len();
        entry.tokens.retain(|t| !(start..end).contains(t));
        if entry.tokens.len() == before {
            return ReleaseOutcome::Unchanged;
        }
        if entry.tokens.is_empty() {
            let freed_pages = self.retire(id, StaleReason::Released);
            return ReleaseOutcome::Removed { freed_pages };
        }
        let before = entry.pages.len();
        let tokens = &entry.tokens;
        entry
            .pages
            .retain(|p| block_tokens(p.block_index).any(|t| tokens.contains(&t)));
        ReleaseOutcome::Trimmed {
            freed_pages: before - entry.pages.len(),
        }
    }

    fn take_finished(&mut self) -> Vec<(ReservationId, LoadResult)> {
        let mut done: Vec<(u64, u64, LoadResult)> = self
            .live
            .iter()
            .filter_map(|(&id, e)| {
                let result = match e.state {
                    ReservationState::Filled => LoadResult::Filled,
                    ReservationState::Failed(failure) => LoadResult::Failed(failure),
                    ReservationState::Reserved | ReservationState::Loading => return None,
                };
                Some((e.finished_at.unwrap_or(u64::MAX), id, result))
            })
            .collect();
        done.sort_unstable_by_key(|(at, ..)| *at);
        for (_, id, _) in &done {
            self.retire(*id, StaleReason::AlreadyFinished);
        }
        done.into_iter()
            .map(|(_, id, result)| (ReservationId(id), result))
            .collect()
    }

    fn forget_request(&mut self, request: u64) -> ReleaseOutcome {
        match self
            .live
            .iter()
            .find(|(_, e)| e.request == request)
            .map(|(&id, _)| id)
        {
            Some(id) => ReleaseOutcome::Removed {
                freed_pages: self.retire(id, StaleReason::Released),
            },
            None => ReleaseOutcome::NotLive,
        }
    }
}

/// Compares every observable of the ledger with the model.
fn same_state(ledger: &Ledger, model: &Model) -> Result<(), TestCaseError> {
    prop_assert!(
        ledger.check_invariants().is_ok(),
        "{:?}",
        ledger.check_invariants()
    );
    prop_assert_eq!(ledger.len(), model.live.len());
    let mut held = BTreeSet::new();
    for (&id, entry) in &model.live {
        let rid = ReservationId(id);
        prop_assert_eq!(ledger.state(rid), Some(entry.state));
        prop_assert_eq!(ledger.reservation_of(RequestId(entry.request)), Some(rid));
        let pages: BTreeSet<_> = ledger
            .pages(rid)
            .unwrap_or_default()
            .iter()
            .copied()
            .collect();
        prop_assert_eq!(
            &pages,
            &entry.pages.iter().copied().collect::<BTreeSet<_>>()
        );
        for page in &pages {
            prop_assert!(
                held.insert((page.group, page.page)),
                "ledger::I1: {:?} reserved twice",
                page
            );
        }
        let tokens: BTreeSet<u64> = ledger
            .reserved_tokens(rid)
            .unwrap_or_default()
            .iter()
            .flat_map(Clone::clone)
            .collect();
        prop_assert_eq!(&tokens, &entry.tokens, "ledger::I4");
    }
    for (group, capacity) in BUDGETS {
        let reserved = model.in_use(group, None);
        prop_assert_eq!(ledger.reserved_pages(group), Some(reserved), "ledger::I2");
        prop_assert_eq!(
            ledger.free_pages(group),
            Some(capacity - reserved),
            "ledger::I2"
        );
    }
    Ok(())
}

fn pick_live_request(model: &Model, pick: usize) -> Option<u64> {
    let mut requests: Vec<u64> = model.live.values().map(|e| e.request).collect();
    requests.sort_unstable();
    (!requests.is_empty()).then(|| requests[pick % requests.len()])
}

/// Applies one op to both; `tickets` pairs each ledger ticket with the model instance.
fn apply(
    ledger: &mut Ledger,
    model: &mut Model,
    tickets: &mut Vec<(LoadTicket, u64)>,
    op: Op,
) -> Result<(), TestCaseError> {
    match op {
        Op::Reserve { request, spec } => reserve_both(ledger, model, request, &spec)?,
        Op::Replace { pick, spec } => {
            if let Some(request) = pick_live_request(model, pick) {
                reserve_both(ledger, model, request, &spec)?;
            }
        }
        Op::StartLoad { id } => {
            let got = ledger.start_load(ReservationId(id)).ok();
            let want = model.start_load(id);
            prop_assert_eq!(got.is_some(), want.is_some(), "ledger::I6");
            if let (Some(ticket), Some(instance)) = (got, want) {
                tickets.push((ticket, instance));
            }
        }
        Op::Complete { pick, failed } if !tickets.is_empty() => {
            let (ticket, instance) = tickets[pick % tickets.len()];
            let result = if failed {
                LoadResult::Failed(LoadFailure::PoolError)
            } else {
                LoadResult::Filled
            };
            let want = model.complete(ticket.id().0, instance, result);
            prop_assert_eq!(ledger.complete(ticket, result), want, "ledger::I7");
        }
        Op::Complete { .. } => {}
        Op::Release { id, start, len } => {
            let want = model.release(id, start, start + len);
            prop_assert_eq!(ledger.release(ReservationId(id), start, start + len), want);
        }
        Op::TakeFinished => {
            prop_assert_eq!(ledger.take_finished(), model.take_finished(), "ledger::I5");
        }
        Op::ForgetRequest { request } => {
            prop_assert_eq!(
                ledger.forget_request(RequestId(request)),
                model.forget_request(request)
            );
        }
    }
    Ok(())
}

fn reserve_both(
    ledger: &mut Ledger,
    model: &mut Model,
    request: u64,
    spec: &ReserveSpec,
) -> Result<(), TestCaseError> {
    let got = ledger.reserve(
        RequestId(request),
        ReservationId(spec.id),
        spec.pages(),
        spec.tokens(),
    );
    let want = model.reserve(request, spec.id, spec.pages(), spec.tokens());
    prop_assert_eq!(
        got.as_ref().ok(),
        want.as_ref(),
        "reserve {:?}: ledger {:?}",
        spec,
        got
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x1ed9_e500),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn model_i1_i2_i5_i7_random_operations_match_a_naive_model(ops in prop::collection::vec(op(), 1..80)) {
        let mut ledger = Ledger::new(T, BUDGETS).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut model = Model::default();
        let mut tickets = Vec::new();
        for op in ops {
            apply(&mut ledger, &mut model, &mut tickets, op)?;
            same_state(&ledger, &model)?;
        }
    }
}
