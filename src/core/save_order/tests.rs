//! Unit tests of the save order (R21), of shedding by request (R22) and of the accounting.

use std::error::Error;
use std::num::NonZeroUsize;

use super::{
    OfRequest, PerPriority, Prioritized, PushOutcome, SaveItem, SaveKey, SavePriority, SaveQueue,
};
use crate::core::hash::BlockHash;
use crate::core::ids::{PageIndex, RequestId};
use crate::core::layout::GroupId;

use SavePriority::{Full, Resave, Window};

type TestResult = Result<(), Box<dyn Error>>;

/// A test item: a push id and the request it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Page {
    /// Unique per push, so a test can tell items apart.
    pub(super) id: u64,
    /// Whose page it is.
    pub(super) request: RequestId,
}

impl OfRequest for Page {
    fn request(&self) -> RequestId {
        self.request
    }
}

/// Page `id` of request `request`.
fn page(id: u64, request: u64) -> Page {
    Page {
        id,
        request: RequestId(request),
    }
}

fn queue(capacity: usize, window_first: bool) -> Result<SaveQueue<Page>, Box<dyn Error>> {
    Ok(SaveQueue::new(
        NonZeroUsize::try_from(capacity)?,
        window_first,
    ))
}

fn pop_all(queue: &mut SaveQueue<Page>) -> Vec<u64> {
    std::iter::from_fn(|| queue.pop())
        .map(|page| page.id)
        .collect()
}

/// Pushes `(id, request, priority)` items that must all be queued without a drop.
fn push_all(queue: &mut SaveQueue<Page>, script: &[(u64, u64, SavePriority)]) {
    for &(id, request, priority) in script {
        assert_eq!(
            queue.push(page(id, request), priority),
            PushOutcome::queued()
        );
    }
}

/// The ids and priorities a push dropped, and whether it queued its item.
fn outcome_of(outcome: PushOutcome<Page>) -> (bool, Vec<(u64, SavePriority)>) {
    let queued = outcome.is_queued();
    let dropped = outcome
        .into_dropped()
        .into_iter()
        .map(|dropped| (dropped.item.id, dropped.priority))
        .collect();
    (queued, dropped)
}

/// One request per item: order only, no request has two entries.
const SCRIPT: [(u64, u64, SavePriority); 6] = [
    (1, 1, Full),
    (2, 2, Resave),
    (3, 3, Window),
    (4, 4, Full),
    (5, 5, Window),
    (6, 6, Resave),
];

#[test]
fn r21_window_pages_first_then_full_blocks_then_resaves_fifo_within() -> TestResult {
    let mut queue = queue(16, true)?;
    push_all(&mut queue, &SCRIPT);
    assert_eq!(queue.peek_key(), Some(SaveKey::new(Window, 2)));
    assert_eq!(pop_all(&mut queue), vec![3, 5, 1, 4, 2, 6]);
    assert!(queue.is_empty());
    Ok(())
}

#[test]
fn r21_i6_window_first_off_saves_window_and_full_first_in_first_out() -> TestResult {
    let mut queue = queue(16, false)?;
    assert!(!queue.window_first());
    assert_eq!(queue.class_of(Window), Full);
    push_all(&mut queue, &SCRIPT);
    assert_eq!(pop_all(&mut queue), vec![1, 3, 4, 5, 2, 6]);
    let counters = queue.counters();
    assert_eq!(
        counters.popped,
        PerPriority {
            window: 2,
            full: 2,
            resave: 2
        },
        "save_order::I6"
    );
    Ok(())
}

#[test]
fn save_key_orders_by_class_then_sequence() {
    let mut keys = [
        SaveKey::new(Resave, 0),
        SaveKey::new(Full, 5),
        SaveKey::new(Window, 9),
        SaveKey::new(Full, 1),
        SaveKey::new(Window, 3),
    ];
    keys.sort();
    let order: Vec<(SavePriority, u64)> = keys.iter().map(|k| (k.class(), k.seq())).collect();
    assert_eq!(
        order,
        vec![(Window, 3), (Window, 9), (Full, 1), (Full, 5), (Resave, 0)]
    );
}

#[test]
fn r22_i5_a_full_queue_sheds_the_oldest_request_whole_of_every_priority() -> TestResult {
    let mut queue = queue(4, true)?;
    // Request 7 is the oldest (item 1), request 8 has the best-ranked page.
    push_all(
        &mut queue,
        &[(1, 7, Full), (2, 7, Resave), (3, 8, Window), (4, 7, Window)],
    );
    assert_eq!(
        outcome_of(queue.push(page(5, 9), Resave)),
        (true, vec![(1, Full), (2, Resave), (4, Window)]),
        "the whole oldest request, in push order, though the incoming item ranks lowest"
    );
    assert_eq!(queue.len(), 2);
    assert_eq!(pop_all(&mut queue), vec![3, 5], "R21 pop order unchanged");
    let counters = queue.counters();
    assert_eq!(
        counters.dropped,
        PerPriority {
            window: 1,
            full: 1,
            resave: 1
        }
    );
    assert_eq!(counters.requests_shed, 1);
    Ok(())
}

#[test]
fn r22_i5_the_oldest_request_is_the_one_with_the_oldest_queued_entry() -> TestResult {
    let mut queue = queue(3, true)?;
    push_all(&mut queue, &[(1, 7, Full), (2, 8, Full), (3, 7, Full)]);
    // Request 7's oldest entry is popped: request 8 is the oldest now.
    assert_eq!(queue.pop().map(|page| page.id), Some(1));
    push_all(&mut queue, &[(4, 9, Full)]);
    assert_eq!(
        outcome_of(queue.push(page(5, 9), Full)),
        (true, vec![(2, Full)])
    );
    assert_eq!(pop_all(&mut queue), vec![3, 4, 5]);
    Ok(())
}

#[test]
fn r22_i5_i7_the_incoming_items_own_request_when_oldest_leaves_with_it() -> TestResult {
    let mut queue = queue(3, true)?;
    push_all(&mut queue, &[(1, 7, Full), (2, 7, Full), (3, 7, Resave)]);
    assert_eq!(
        outcome_of(queue.push(page(4, 7), Window)),
        (false, vec![(1, Full), (2, Full), (3, Resave), (4, Window)]),
        "its queued entries and the incoming window page leave together"
    );
    assert!(queue.is_empty(), "no part of the request stays queued");
    assert_eq!(
        outcome_of(queue.push(page(5, 7), Full)),
        (false, vec![(5, Full)]),
        "save_order::I7: a shed request's later pushes are dropped, room or not"
    );
    push_all(&mut queue, &[(6, 8, Full)]);
    assert_eq!(pop_all(&mut queue), vec![6]);
    assert_eq!(queue.counters().dropped.total(), 5);
    Ok(())
}

#[test]
fn r22_a_request_that_alone_fills_the_queue_is_shed_whole_and_newer_requests_stay() -> TestResult {
    let mut queue = queue(3, true)?;
    push_all(&mut queue, &[(1, 7, Full), (2, 8, Full), (3, 8, Full)]);
    assert_eq!(
        outcome_of(queue.push(page(4, 8), Full)),
        (true, vec![(1, Full)]),
        "the older request goes first"
    );
    assert_eq!(
        outcome_of(queue.push(page(5, 8), Window)),
        (false, vec![(2, Full), (3, Full), (4, Full), (5, Window)]),
        "then the request that fills the queue, with its incoming page"
    );
    push_all(&mut queue, &[(6, 9, Full), (7, 10, Full), (8, 10, Window)]);
    assert_eq!(
        outcome_of(queue.push(page(9, 10), Full)),
        (true, vec![(6, Full)]),
        "request 9 is older than 10: it goes, and 10 stays"
    );
    assert_eq!(pop_all(&mut queue), vec![8, 7, 9]);
    assert_eq!(queue.counters().requests_shed, 3);
    Ok(())
}

#[test]
fn r22_i7_an_ended_request_is_forgotten_so_its_id_may_be_used_again() -> TestResult {
    let mut queue = queue(1, true)?;
    push_all(&mut queue, &[(1, 7, Full)]);
    assert_eq!(
        outcome_of(queue.push(page(2, 8), Full)),
        (true, vec![(1, Full)])
    );
    queue.request_ended(RequestId(9));
    assert_eq!(
        outcome_of(queue.push(page(3, 7), Window)),
        (false, vec![(3, Window)]),
        "another request's end changes nothing"
    );
    queue.request_ended(RequestId(7));
    assert_eq!(
        outcome_of(queue.push(page(4, 7), Window)),
        (true, vec![(2, Full)]),
        "after it ended, the id is a new request: queued, and the older request is shed"
    );
    assert_eq!(pop_all(&mut queue), vec![4]);
    Ok(())
}

#[test]
fn r22_i7_shed_drops_a_request_now_and_its_later_pushes() -> TestResult {
    let mut queue = queue(8, true)?;
    push_all(&mut queue, &[(1, 7, Full), (2, 8, Full), (3, 7, Window)]);
    let shed: Vec<u64> = queue.shed(RequestId(7)).iter().map(|d| d.item.id).collect();
    assert_eq!(shed, vec![1, 3]);
    assert_eq!(
        outcome_of(queue.push(page(4, 7), Full)),
        (false, vec![(4, Full)])
    );
    assert!(
        queue.shed(RequestId(9)).is_empty(),
        "nothing queued, still shed"
    );
    assert_eq!(
        outcome_of(queue.push(page(5, 9), Full)),
        (false, vec![(5, Full)])
    );
    assert_eq!(pop_all(&mut queue), vec![2]);
    let counters = queue.counters();
    assert_eq!(counters.dropped.total(), 4);
    assert_eq!(counters.requests_shed, 2);
    Ok(())
}

#[test]
fn r22_i6_window_first_off_sheds_by_request_and_counts_each_priority() -> TestResult {
    let mut queue = queue(2, false)?;
    push_all(&mut queue, &[(1, 7, Window), (2, 8, Full)]);
    assert_eq!(
        outcome_of(queue.push(page(3, 9), Resave)),
        (true, vec![(1, Window)])
    );
    assert_eq!(
        queue.counters().dropped.window,
        1,
        "counted under its own priority"
    );
    assert_eq!(pop_all(&mut queue), vec![2, 3]);
    Ok(())
}

#[test]
fn r22_a_queue_of_one_keeps_the_newest_request() -> TestResult {
    let mut queue = queue(1, true)?;
    assert_eq!(queue.capacity(), 1);
    push_all(&mut queue, &[(1, 7, Resave)]);
    assert_eq!(
        outcome_of(queue.push(page(2, 8), Window)),
        (true, vec![(1, Resave)])
    );
    assert_eq!(
        outcome_of(queue.push(page(3, 8), Full)),
        (false, vec![(2, Window), (3, Full)]),
        "a second page of the only request: the request goes"
    );
    assert_eq!(outcome_of(queue.push(page(4, 9), Full)), (true, vec![]));
    assert_eq!(pop_all(&mut queue), vec![4]);
    Ok(())
}

fn save(request: u64, block_index: u64) -> SaveItem {
    SaveItem {
        request: RequestId(request),
        group: GroupId(0),
        block_index,
        page: PageIndex(u32::try_from(block_index).unwrap_or(0)),
        hash: BlockHash([u8::try_from(block_index).unwrap_or(0); 16]),
    }
}

#[test]
fn drain_request_removes_only_that_requests_saves_in_push_order() -> TestResult {
    let mut queue: SaveQueue = SaveQueue::new(NonZeroUsize::try_from(8)?, true);
    for (item, priority) in [(save(1, 0), Full), (save(2, 0), Full), (save(1, 1), Window)] {
        assert_eq!(queue.push(item, priority), PushOutcome::queued());
    }
    let removed = queue.drain_request(RequestId(1));
    let removed_blocks: Vec<(u64, SavePriority)> = removed
        .iter()
        .map(|r| (r.item.block_index, r.priority))
        .collect();
    assert_eq!(removed_blocks, vec![(0, Full), (1, Window)]);
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.pop(), Some(save(2, 0)));
    let counters = queue.counters();
    assert_eq!(
        counters.removed,
        PerPriority {
            window: 1,
            full: 1,
            resave: 0
        }
    );
    assert_eq!(counters.pushed.total(), 3);
    assert_eq!(
        queue.push(save(1, 2), Full),
        PushOutcome::queued(),
        "a drained request is not shed"
    );
    Ok(())
}

#[test]
fn i4_counters_account_for_every_push() -> TestResult {
    let mut queue = queue(2, true)?;
    push_all(&mut queue, &[(1, 1, Window), (2, 2, Resave)]);
    assert_eq!(
        outcome_of(queue.push(page(3, 3), Full)).1,
        vec![(1, Window)]
    );
    assert_eq!(
        outcome_of(queue.push(page(4, 4), Resave)).1,
        vec![(2, Resave)]
    );
    assert_eq!(
        outcome_of(queue.push(page(5, 1), Resave)).1,
        vec![(5, Resave)]
    );
    queue.pop();
    let removed = queue.remove_where(|page| page.id == 4);
    assert_eq!(
        removed,
        vec![Prioritized {
            item: page(4, 4),
            priority: Resave
        }]
    );
    let counters = queue.counters();
    for priority in SavePriority::ALL {
        let left = counters.popped.get(priority)
            + counters.dropped.get(priority)
            + counters.removed.get(priority)
            + queue.queued().get(priority);
        assert_eq!(
            counters.pushed.get(priority),
            left,
            "save_order::I4 for {}",
            priority.as_str()
        );
    }
    assert_eq!(
        counters.pushed,
        PerPriority {
            window: 1,
            full: 1,
            resave: 3
        }
    );
    assert_eq!(
        counters.dropped,
        PerPriority {
            window: 1,
            full: 0,
            resave: 2
        }
    );
    assert!(queue.is_empty());
    Ok(())
}
