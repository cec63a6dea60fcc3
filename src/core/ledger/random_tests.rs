//! Seeded randomized invariant test in TGI's style: random operations, invariants checked
//! after every one, from the public views as well as from `check_invariants`.

use crate::core::ids::{PageIndex, RequestId, ReservationId};
use crate::core::layout::GroupId;
use crate::core::ledger::{
    Ledger, LedgerError, LoadFailure, LoadResult, LoadTicket, ReservationState, ReservedPage,
};

const GROUPS: [(GroupId, usize); 2] = [(GroupId(0), 12), (GroupId(1), 6)];
const IDS: u64 = 16;

/// `SplitMix64`: a tiny deterministic generator, so the seed alone replays a run.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    fn page(&mut self, bound: u64) -> PageIndex {
        PageIndex(u32::try_from(self.below(bound)).unwrap_or(0))
    }
}

fn random_pages(rng: &mut SplitMix64, first_block: u64, blocks: u64) -> Vec<ReservedPage> {
    let mut pages = Vec::new();
    for block_index in first_block..first_block + blocks {
        for (group, capacity) in GROUPS {
            if rng.below(3) > 0 {
                let page = rng.page(capacity as u64 + 4);
                pages.push(ReservedPage {
                    block_index,
                    group,
                    page,
                });
            }
        }
    }
    pages
}

/// `ledger::I1` and `ledger::I2` from the public views only.
fn check_public_views(ledger: &Ledger) {
    let mut seen = std::collections::HashSet::new();
    let mut in_use = std::collections::BTreeMap::new();
    for id in (0..IDS).map(ReservationId) {
        for page in ledger.pages(id).unwrap_or_default() {
            assert!(
                seen.insert((page.group, page.page)),
                "ledger::I1: {page:?} reserved twice"
            );
            assert_eq!(
                ledger.holder_of(page.group, page.page),
                Some(id),
                "ledger::I1"
            );
            *in_use.entry(page.group).or_insert(0) += 1;
        }
    }
    for (group, capacity) in GROUPS {
        let reserved = in_use.get(&group).copied().unwrap_or(0);
        assert_eq!(ledger.reserved_pages(group), Some(reserved), "ledger::I2");
        assert_eq!(
            ledger.free_pages(group),
            Some(capacity - reserved),
            "ledger::I2"
        );
    }
}

/// A live id whose state passes `wanted`, or any id (often not live) when none does.
fn pick_id(
    ledger: &Ledger,
    rng: &mut SplitMix64,
    wanted: impl Fn(ReservationState) -> bool,
) -> ReservationId {
    let live: Vec<ReservationId> = (0..IDS)
        .map(ReservationId)
        .filter(|&id| ledger.state(id).is_some_and(&wanted))
        .collect();
    match live.len() {
        0 => ReservationId(rng.below(IDS)),
        n => live[usize::try_from(rng.below(n as u64)).unwrap_or(0)],
    }
}

fn step(ledger: &mut Ledger, rng: &mut SplitMix64, tickets: &mut Vec<LoadTicket>) {
    match rng.below(8) {
        0 | 1 => {
            let (first_block, blocks) = (rng.below(6), rng.below(5));
            let pages = random_pages(rng, first_block, blocks);
            let start = first_block * 4 + rng.below(4);
            let tokens = start..(first_block + blocks) * 4;
            let id = ReservationId(rng.below(IDS));
            // Refusals are expected; `ledger::I8` says they change nothing, checked below.
            let _ = ledger.reserve(RequestId(rng.below(6)), id, pages, tokens);
        }
        2 | 3 => {
            let id = pick_id(ledger, rng, |state| state == ReservationState::Reserved);
            tickets.extend(ledger.start_load(id).ok());
        }
        4 if !tickets.is_empty() => {
            // Mostly recent tickets (likely live), sometimes any (likely stale).
            let span = if rng.below(4) == 0 {
                tickets.len()
            } else {
                tickets.len().min(4)
            };
            let back = usize::try_from(rng.below(span as u64)).unwrap_or(0);
            let ticket = tickets[tickets.len() - 1 - back];
            let result = match rng.below(3) {
                0 => LoadResult::Failed(LoadFailure::Evicted),
                _ => LoadResult::Filled,
            };
            ledger.complete(ticket, result);
        }
        5 => {
            let id = pick_id(ledger, rng, |_| true);
            let start = rng.below(28);
            ledger.release(id, start, start + rng.below(16));
        }
        6 => {
            for (finished, _) in ledger.take_finished() {
                assert_eq!(ledger.state(finished), None, "ledger::I5: handed over");
            }
        }
        _ => {
            ledger.forget_request(RequestId(rng.below(6)));
        }
    }
}

#[test]
fn i1_i2_seeded_random_operations_keep_every_invariant() -> Result<(), LedgerError> {
    for seed in [1_u64, 7, 42, 0x5eed_cafe, 0xdead_beef] {
        eprintln!("ledger random invariant test: seed {seed:#x}");
        let mut rng = SplitMix64(seed);
        let mut ledger = Ledger::new(4, GROUPS)?;
        let mut tickets = Vec::new();
        for _ in 0..5_000 {
            step(&mut ledger, &mut rng, &mut tickets);
            ledger.check_invariants()?;
            check_public_views(&ledger);
        }
        let counters = ledger.counters();
        eprintln!("{counters:?}");
        assert!(
            counters.num_reserved > 100,
            "seed {seed:#x}: too few reservations"
        );
        assert!(
            counters.num_refused > 100,
            "seed {seed:#x}: too few refusals"
        );
        assert!(
            counters.num_handed_over_filled > 30,
            "seed {seed:#x}: too few fills"
        );
        for id in (0..IDS).map(ReservationId) {
            ledger.release(id, 0, u64::MAX);
        }
        assert!(ledger.is_empty());
        for (group, capacity) in GROUPS {
            assert_eq!(
                ledger.free_pages(group),
                Some(capacity),
                "ledger::I2: all pages back"
            );
        }
        ledger.check_invariants()?;
    }
    Ok(())
}
