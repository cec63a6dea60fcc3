//! Property tests of the order (`save_order::I2`, `save_order::I3`), and of shedding by
//! request and accounting against a naive model (`save_order::I1`, I4, I5, I7, I8), with
//! fixed seeds.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;

use proptest::prelude::*;
use proptest::test_runner::RngSeed;

use super::tests::Page;
use super::{Prioritized, PushOutcome, SavePriority, SaveQueue};
use crate::core::ids::RequestId;

/// Requests the operations pick from: few, so requests share the queue and get shed.
const REQUESTS: u64 = 4;

fn priority() -> impl Strategy<Value = SavePriority> {
    prop::sample::select(SavePriority::ALL.to_vec())
}

fn request() -> impl Strategy<Value = RequestId> {
    (0..REQUESTS).prop_map(RequestId)
}

/// The class rank the module doc promises, computed independently of the queue.
fn rank(priority: SavePriority, window_first: bool) -> u8 {
    match priority {
        SavePriority::Window if window_first => 0,
        SavePriority::Window | SavePriority::Full => 1,
        SavePriority::Resave => 2,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Push(SavePriority, RequestId),
    Pop,
    /// Remove the items whose id is `0` modulo 7 plus this offset.
    Remove(u64),
    Drain(RequestId),
    Shed(RequestId),
    End(RequestId),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (priority(), request()).prop_map(|(p, r)| Op::Push(p, r)),
        4 => Just(Op::Pop),
        1 => (0..7_u64).prop_map(Op::Remove),
        1 => request().prop_map(Op::Drain),
        1 => request().prop_map(Op::Shed),
        2 => request().prop_map(Op::End),
    ]
}

/// A queued item of the model: (id, request, class rank, priority). Ids grow with every
/// push, so the smallest id is the oldest.
type ModelEntry = (u64, RequestId, u8, SavePriority);

/// The naive model: a list of entries and the set of shed requests.
#[derive(Default)]
struct Model {
    entries: Vec<ModelEntry>,
    shed: BTreeSet<RequestId>,
}

impl Model {
    /// Takes every entry of `request`, in push order.
    fn take(&mut self, request: RequestId) -> Vec<Prioritized<Page>> {
        let (taken, kept) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|entry| entry.1 == request);
        self.entries = kept;
        taken.into_iter().map(prioritized).collect()
    }

    /// What a push must do (`save_order::I5`, `save_order::I7`).
    fn push(&mut self, incoming: ModelEntry, capacity: usize) -> PushOutcome<Page> {
        let request = incoming.1;
        let mut dropped = Vec::new();
        if self.entries.len() >= capacity && !self.shed.contains(&request) {
            let oldest = self.entries.iter().min_by_key(|entry| entry.0).map(|e| e.1);
            if let Some(oldest) = oldest {
                self.shed.insert(oldest);
                dropped = self.take(oldest);
            }
        }
        let queued = !self.shed.contains(&request);
        if queued {
            self.entries.push(incoming);
        } else {
            dropped.push(prioritized(incoming));
        }
        PushOutcome { queued, dropped }
    }
}

fn prioritized((id, request, _, priority): ModelEntry) -> Prioritized<Page> {
    Prioritized {
        item: Page { id, request },
        priority,
    }
}

/// What the test saw leave the queue, independently of the model.
#[derive(Default)]
struct Seen {
    /// Items that left, to check each leaves exactly once (`save_order::I4`).
    left: BTreeSet<u64>,
    /// Requests that lost an entry to shedding since they last ended.
    lost: BTreeSet<RequestId>,
}

impl Seen {
    fn record(&mut self, id: u64) -> Result<(), TestCaseError> {
        prop_assert!(
            self.left.insert(id),
            "save_order::I4: item {} left twice",
            id
        );
        Ok(())
    }

    fn record_dropped(&mut self, dropped: &[Prioritized<Page>]) -> Result<(), TestCaseError> {
        for entry in dropped {
            self.record(entry.item.id)?;
            self.lost.insert(entry.item.request);
        }
        Ok(())
    }
}

fn check_accounting(queue: &SaveQueue<Page>) -> Result<(), TestCaseError> {
    let counters = queue.counters();
    for priority in SavePriority::ALL {
        let left = counters.popped.get(priority)
            + counters.dropped.get(priority)
            + counters.removed.get(priority)
            + queue.queued().get(priority);
        prop_assert_eq!(counters.pushed.get(priority), left, "save_order::I4");
    }
    Ok(())
}

/// The checks after every operation: capacity, the model, what was shed, the index.
fn check_state(queue: &SaveQueue<Page>, model: &Model, seen: &Seen) -> Result<(), TestCaseError> {
    prop_assert!(queue.len() <= queue.capacity(), "save_order::I1");
    prop_assert_eq!(queue.len(), model.entries.len());
    let mut per_request: BTreeMap<RequestId, usize> = BTreeMap::new();
    for entry in queue.entries.values() {
        let request = entry.item.request;
        *per_request.entry(request).or_default() += 1;
        prop_assert!(
            !(seen.lost.contains(&request) && entry.priority == SavePriority::Window),
            "R22: request {} lost an entry to shedding but has a window page queued",
            request.0
        );
        prop_assert!(
            !model.shed.contains(&request),
            "save_order::I7: shed request {} has an entry queued",
            request.0
        );
    }
    prop_assert_eq!(queue.requests.len(), queue.len(), "save_order::I8");
    for (request, count) in per_request {
        prop_assert_eq!(queue.requests.len_of(request), count, "save_order::I8");
    }
    check_accounting(queue)
}

fn run_model(capacity: usize, window_first: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let capacity = NonZeroUsize::new(capacity).ok_or(TestCaseError::fail("capacity 0"))?;
    let mut queue = SaveQueue::new(capacity, window_first);
    let mut model = Model::default();
    let mut seen = Seen::default();
    let mut next_id = 0_u64;
    for op in ops {
        match op {
            Op::Push(priority, request) => {
                let incoming = (next_id, request, rank(priority, window_first), priority);
                next_id += 1;
                let want = model.push(incoming, capacity.get());
                let got = queue.push(
                    Page {
                        id: incoming.0,
                        request,
                    },
                    priority,
                );
                prop_assert_eq!(&got, &want, "save_order::I5, save_order::I7");
                seen.record_dropped(&got.dropped)?;
            }
            Op::Pop => {
                let best = model
                    .entries
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, e)| (e.2, e.0));
                let want = best
                    .map(|(index, _)| index)
                    .map(|index| model.entries.remove(index).0);
                let got = queue.pop().map(|page| page.id);
                prop_assert_eq!(got, want, "save_order::I2: smallest key first");
                if let Some(id) = got {
                    seen.record(id)?;
                }
            }
            Op::Remove(offset) => {
                let matches = |page: &Page| page.id % 7 == offset;
                model.entries.retain(|entry| entry.0 % 7 != offset);
                for removed in queue.remove_where(matches) {
                    seen.record(removed.item.id)?;
                }
            }
            Op::Drain(request) => {
                let want = model.take(request);
                let got = queue.drain_request(request);
                prop_assert_eq!(
                    &got,
                    &want,
                    "drain_request: the request's entries, push order"
                );
                for removed in got {
                    seen.record(removed.item.id)?;
                }
            }
            Op::Shed(request) => {
                model.shed.insert(request);
                let want = model.take(request);
                let got = queue.shed(request);
                prop_assert_eq!(&got, &want, "shed: the request's entries, push order");
                seen.record_dropped(&got)?;
            }
            Op::End(request) => {
                model.shed.remove(&request);
                seen.lost.remove(&request);
                queue.request_ended(request);
            }
        }
        check_state(&queue, &model, &seen)?;
    }
    while let Some(page) = queue.pop() {
        seen.record(page.id)?;
    }
    prop_assert_eq!(
        seen.left.len(),
        usize::try_from(next_id).unwrap_or(usize::MAX),
        "save_order::I4"
    );
    check_accounting(&queue)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x5a7e_0d3e),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn i2_i3_pops_come_out_in_nondecreasing_key_order_fifo_within_a_class(
        pushes in prop::collection::vec((priority(), request()), 0..64),
        window_first in any::<bool>(),
    ) {
        let capacity = NonZeroUsize::new(64).ok_or(TestCaseError::fail("capacity 0"))?;
        let mut queue = SaveQueue::new(capacity, window_first);
        for (id, &(priority, request)) in (0_u64..).zip(&pushes) {
            let outcome = queue.push(Page { id, request }, priority);
            prop_assert!(outcome.is_queued(), "room for every push");
        }
        let mut previous: Option<(u8, u64)> = None;
        while let Some(key) = queue.peek_key() {
            let id = queue.pop().ok_or(TestCaseError::fail("peeked but empty"))?.id;
            prop_assert_eq!(key.seq(), id, "save_order::I3: seq is the push order");
            let index = usize::try_from(id).unwrap_or(usize::MAX);
            let position = (rank(pushes[index].0, window_first), id);
            prop_assert!(previous.is_none_or(|p| p < position), "{:?} after {:?}", position, previous);
            previous = Some(position);
        }
    }

    #[test]
    fn i1_i4_i5_i7_i8_shedding_by_request_and_accounting_match_a_naive_model(
        capacity in 1_usize..8,
        window_first in any::<bool>(),
        ops in prop::collection::vec(op(), 0..160),
    ) {
        run_model(capacity, window_first, ops)?;
    }
}
