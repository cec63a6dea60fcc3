//! Read-only views of the ledger for the actors and tests, and the `ledger::I1`-I5 self-check.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::{
    Entry, Ledger, LedgerCounters, LedgerError, LedgerInvariant, ReservationState, ReservedPage,
};
use crate::core::ids::{PageIndex, RequestId, ReservationId};
use crate::core::layout::GroupId;

/// Read-only views, for the actors and for tests.
impl Ledger {
    /// Tokens per block (T).
    pub fn tokens_per_block(&self) -> u64 {
        self.tokens_per_block
    }

    /// The state of live reservation `id`.
    pub fn state(&self, id: ReservationId) -> Option<ReservationState> {
        self.live.get(&id).map(|entry| entry.state)
    }

    /// The pages live reservation `id` still holds. A loader re-reads this right before its
    /// device copy and writes only into these pages.
    pub fn pages(&self, id: ReservationId) -> Option<&[ReservedPage]> {
        self.live.get(&id).map(|entry| entry.pages.as_slice())
    }

    /// The token ranges live reservation `id` still holds (sorted, disjoint; `ledger::I4`).
    pub fn reserved_tokens(&self, id: ReservationId) -> Option<&[Range<u64>]> {
        self.live.get(&id).map(|entry| entry.tokens.as_slice())
    }

    /// The live reservation of `request`, if any (`ledger::I3`).
    pub fn reservation_of(&self, request: RequestId) -> Option<ReservationId> {
        self.by_request.get(&request).copied()
    }

    /// The live reservation holding `page` of `group`, if any (`ledger::I1`).
    pub fn holder_of(&self, group: GroupId, page: PageIndex) -> Option<ReservationId> {
        self.page_holder.get(&(group, page)).copied()
    }

    /// The page budget of `group`; `None` for a group the ledger has no budget for.
    pub fn capacity(&self, group: GroupId) -> Option<usize> {
        self.budgets.get(&group).map(|budget| budget.capacity)
    }

    /// Pages of `group` not held by any live reservation.
    pub fn free_pages(&self, group: GroupId) -> Option<usize> {
        self.budgets.get(&group).map(|budget| budget.free)
    }

    /// Pages of `group` held by live reservations (`capacity - free`, `ledger::I2`).
    pub fn reserved_pages(&self, group: GroupId) -> Option<usize> {
        self.budgets
            .get(&group)
            .map(|budget| budget.capacity - budget.free)
    }

    /// Number of live reservations.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no reservation is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The counters so far.
    pub fn counters(&self) -> LedgerCounters {
        self.counters
    }

    /// Checks `ledger::I1`-I5 over the whole ledger; linear in its size, meant for tests.
    ///
    /// # Errors
    ///
    /// [`LedgerError::InvariantBroken`] naming the first invariant found broken.
    pub fn check_invariants(&self) -> Result<(), LedgerError> {
        let broken = |invariant| Err(LedgerError::InvariantBroken { invariant });
        let mut held: HashMap<(GroupId, PageIndex), ReservationId> = HashMap::new();
        let mut reserved: BTreeMap<GroupId, usize> = BTreeMap::new();
        for (&id, entry) in &self.live {
            for page in &entry.pages {
                let slot = (page.group, page.page);
                if held.insert(slot, id).is_some() || self.page_holder.get(&slot) != Some(&id) {
                    return broken(LedgerInvariant::PageHeldOnce);
                }
                *reserved.entry(page.group).or_default() += 1;
            }
            if self.by_request.get(&entry.request) != Some(&id) {
                return broken(LedgerInvariant::OnePerRequest);
            }
            if !self.entry_tokens_well_formed(entry) {
                return broken(LedgerInvariant::TokenRanges);
            }
        }
        if held.len() != self.page_holder.len() {
            return broken(LedgerInvariant::PageHeldOnce);
        }
        for (group, budget) in &self.budgets {
            let in_use = reserved.get(group).copied().unwrap_or(0);
            if budget.free + in_use != budget.capacity {
                return broken(LedgerInvariant::Budget);
            }
        }
        if self.by_request.len() != self.live.len() {
            return broken(LedgerInvariant::OnePerRequest);
        }
        if !self.finished_set_matches() {
            return broken(LedgerInvariant::FinishedSet);
        }
        Ok(())
    }

    fn entry_tokens_well_formed(&self, entry: &Entry) -> bool {
        let ranges_ok = !entry.tokens.is_empty()
            && entry.tokens.iter().all(|range| range.start < range.end)
            && entry
                .tokens
                .windows(2)
                .all(|pair| pair[0].end < pair[1].start);
        ranges_ok
            && entry
                .pages
                .iter()
                .all(|page| self.block_overlaps(page.block_index, &entry.tokens))
    }

    fn finished_set_matches(&self) -> bool {
        let terminal = self
            .live
            .values()
            .filter(|entry| entry.state.finished_result().is_some());
        let all_listed = terminal.clone().all(|entry| {
            entry.finished_seq.is_some_and(|seq| {
                self.finished
                    .get(&seq)
                    .and_then(|id| self.live.get(id))
                    .map(|e| e.generation)
                    == Some(entry.generation)
            })
        });
        all_listed && terminal.count() == self.finished.len()
    }
}
