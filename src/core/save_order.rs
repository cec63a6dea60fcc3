//! The save queue: which planned save goes next, and which one is shed when the queue is
//! full (R19, R21, R22).
//!
//! # Workflow
//!
//! 1. The saver actor's `EnqueueSave` handler calls [`SaveQueue::push`] for each planned save
//!    with its [`SavePriority`] and returns at once: a push never blocks and never fails (R22).
//! 2. When the queue is full, the push sheds exactly one entry and hands it back
//!    ([`PushOutcome`]): the oldest entry of the lowest priority class, or the incoming item
//!    itself when its class ranks below every queued entry. The caller counts the drop for
//!    the item's request and, once none of that request's saves is left, reports the request
//!    in `get_finished_saves` so its pages go back to the engine (R22).
//! 3. The saver's I/O loop calls [`SaveQueue::pop`] for the next save, in the order of
//!    [`SaveKey`]'s `Ord`: window pages first (R21), then full-attention blocks, then re-saves
//!    (R20), first in first out within a class.
//! 4. A request that is aborted has its queued saves removed with
//!    [`SaveQueue::drain_request`] (or [`SaveQueue::remove_where`]).
//!
//! The queue decides order and shedding only. What to save is the planner's decision
//! (R16-R20); blocks already present in the pool are skipped by the saver when it pops them
//! (R19), so the queue does not deduplicate. Items name pages ([`SaveItem`]: request, group,
//! block, page, hash), never pinned buffers, so a queued save holds no staging memory.
//!
//! `window_first` (R21, `TRTLLM_MOONCAKE_STORE_WINDOW_FIRST`) is a constructor argument: off,
//! window pages join the full-attention class and the two are saved first in first out.
//!
//! # Invariants
//!
//! - **`save_order::I1`** `len() <= capacity()` after every call.
//! - **`save_order::I2`** [`SaveQueue::pop`] returns the queued entry with the smallest
//!   [`SaveKey`].
//! - **`save_order::I3`** `seq` grows by one with every push, so keys are unique and a class is
//!   first in first out.
//! - **`save_order::I4`** Accounting, per priority: `pushed == popped + dropped + removed +
//!   queued`; every pushed item leaves exactly once, and every dropped or removed item is handed
//!   back.
//! - **`save_order::I5`** A push into a full queue drops exactly one entry: the oldest of the
//!   lowest class, or the incoming item when its class ranks below every queued entry.
//! - **`save_order::I6`** With `window_first` off, window and full-attention saves share one class;
//!   the counters still use each item's own priority.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::num::NonZeroUsize;

use crate::core::hash::BlockHash;
use crate::core::ids::{PageIndex, RequestId};
use crate::core::layout::GroupId;

/// What kind of save an item is. The order between kinds is defined once, by [`SaveKey`].
///
/// `SavePriority` deliberately has no `Ord` of its own, so no second ordering can drift from
/// the one in `SaveKey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SavePriority {
    /// A window group's page at a prompt's last chunk (R17).
    Window,
    /// A full-attention block completed by a chunk (R16).
    Full,
    /// A full-attention block listed again by re-save (R20).
    Resave,
}

impl SavePriority {
    /// Every priority, for iteration in counters and tests.
    pub const ALL: [Self; 3] = [Self::Window, Self::Full, Self::Resave];

    /// A short, stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Window => "window",
            Self::Full => "full",
            Self::Resave => "resave",
        }
    }
}

/// The position of an entry in the queue: its priority class and its push sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SaveKey {
    /// The class the queue filed the item under (see [`SaveQueue::class_of`]).
    class: SavePriority,
    /// Push sequence number, one more for every push (`save_order::I3`).
    seq: u64,
}

impl SaveKey {
    /// A key for `class` at sequence number `seq`.
    pub fn new(class: SavePriority, seq: u64) -> Self {
        Self { class, seq }
    }

    /// The class the item was filed under.
    pub fn class(&self) -> SavePriority {
        self.class
    }

    /// The push sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// **The save order, written once.** A smaller key is saved first:
///
/// 1. by class: [`SavePriority::Window`] before [`SavePriority::Full`] before
///    [`SavePriority::Resave`] (R21: window pages first, re-saves last);
/// 2. within a class, by `seq`: the older push first (first in first out).
///
/// The queue sheds from the other end of the class order: the lowest class (the largest
/// class in this order), oldest entry first (R22; see [`SaveQueue::push`]).
impl Ord for SaveKey {
    fn cmp(&self, other: &Self) -> Ordering {
        fn rank(class: SavePriority) -> u8 {
            match class {
                SavePriority::Window => 0,
                SavePriority::Full => 1,
                SavePriority::Resave => 2,
            }
        }
        rank(self.class)
            .cmp(&rank(other.class))
            .then(self.seq.cmp(&other.seq))
    }
}

impl PartialOrd for SaveKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One planned save: which page of which block to write, and under which chain hash.
/// It names the page; the bytes are read from the device only when the save is popped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SaveItem {
    /// The request whose page this is; drops and completions are counted per request.
    pub request: RequestId,
    /// The page's layer group.
    pub group: GroupId,
    /// The block's index in the prompt.
    pub block_index: u64,
    /// The page in the group's page table.
    pub page: PageIndex,
    /// The block's chain hash, the last segment of its pool key (R3).
    pub hash: BlockHash,
}

/// An item with the priority it was pushed with, as handed back when it is dropped or
/// removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prioritized<T> {
    /// The item.
    pub item: T,
    /// The priority it was pushed with (not the class it was filed under, `save_order::I6`).
    pub priority: SavePriority,
}

/// What [`SaveQueue::push`] did. A push never blocks (R22).
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a dropped save must be counted and its request's pages released (R22)"]
pub enum PushOutcome<T> {
    /// Queued; the queue had room.
    Queued,
    /// Queued; to make room the queue dropped this entry, the oldest of the lowest class.
    QueuedAfterDrop(Prioritized<T>),
    /// Not queued: the queue is full and the item's class ranks below every queued entry.
    DroppedIncoming(Prioritized<T>),
}

impl<T> PushOutcome<T> {
    /// Whether the pushed item is now queued.
    pub fn is_queued(&self) -> bool {
        !matches!(self, Self::DroppedIncoming(_))
    }

    /// The entry this push dropped, if any.
    pub fn into_dropped(self) -> Option<Prioritized<T>> {
        match self {
            Self::Queued => None,
            Self::QueuedAfterDrop(dropped) | Self::DroppedIncoming(dropped) => Some(dropped),
        }
    }
}

/// A count per save priority.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerPriority {
    /// Window pages.
    pub window: u64,
    /// Full-attention blocks.
    pub full: u64,
    /// Re-saves.
    pub resave: u64,
}

impl PerPriority {
    /// The count for `priority`.
    pub fn get(&self, priority: SavePriority) -> u64 {
        match priority {
            SavePriority::Window => self.window,
            SavePriority::Full => self.full,
            SavePriority::Resave => self.resave,
        }
    }

    /// The sum over every priority.
    pub fn total(&self) -> u64 {
        self.window + self.full + self.resave
    }

    fn add_one(&mut self, priority: SavePriority) {
        match priority {
            SavePriority::Window => self.window += 1,
            SavePriority::Full => self.full += 1,
            SavePriority::Resave => self.resave += 1,
        }
    }
}

/// Counters the saver reports, by the priority each item was pushed with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SaveQueueCounters {
    /// Items pushed, dropped incoming ones included.
    pub pushed: PerPriority,
    /// Items popped for saving.
    pub popped: PerPriority,
    /// Items shed because the queue was full (R22).
    pub dropped: PerPriority,
    /// Items removed by [`SaveQueue::remove_where`] or [`SaveQueue::drain_request`].
    pub removed: PerPriority,
}

/// A bounded priority queue of planned saves; see the module doc for the order, the
/// shedding rule and the invariants `save_order::I1`-I6.
#[derive(Debug)]
pub struct SaveQueue<T = SaveItem> {
    capacity: NonZeroUsize,
    /// R21: whether window pages get a class ahead of full-attention blocks.
    window_first: bool,
    /// The next push's sequence number; a plain field, the queue has one owner.
    next_seq: u64,
    entries: BTreeMap<SaveKey, Prioritized<T>>,
    counters: SaveQueueCounters,
}

impl<T> SaveQueue<T> {
    /// An empty queue holding at most `capacity` items. With `window_first` (R21, on by
    /// default in the configuration) window pages form their own class ahead of
    /// full-attention blocks; off, the two share one class (`save_order::I6`).
    pub fn new(capacity: NonZeroUsize, window_first: bool) -> Self {
        Self {
            capacity,
            window_first,
            next_seq: 0,
            entries: BTreeMap::new(),
            counters: SaveQueueCounters::default(),
        }
    }

    /// The class an item of `priority` is filed under: itself, except window pages with
    /// `window_first` off, which join the full-attention class (`save_order::I6`).
    pub fn class_of(&self, priority: SavePriority) -> SavePriority {
        match priority {
            SavePriority::Window if !self.window_first => SavePriority::Full,
            other => other,
        }
    }

    /// Queues `item`. Never blocks (R22): when the queue is full, exactly one entry is dropped and
    /// handed back (`save_order::I5`): the oldest entry of the lowest class queued, or the incoming
    /// item itself if its class ranks below every queued entry. An incoming item of the same class
    /// as the lowest queued one is newer, so the older queued entry goes.
    pub fn push(&mut self, item: T, priority: SavePriority) -> PushOutcome<T> {
        let key = SaveKey::new(self.class_of(priority), self.next_seq);
        self.next_seq += 1;
        self.counters.pushed.add_one(priority);
        let incoming = Prioritized { item, priority };
        let last = match self.entries.last_key_value() {
            Some((last, _)) if self.entries.len() >= self.capacity.get() => *last,
            _ => {
                self.entries.insert(key, incoming);
                return PushOutcome::Queued;
            }
        };
        // The incoming key is the newest, so it sorts after every entry of its class and of
        // better classes: it ranks below every entry exactly when it sorts after the last one
        // and is of another class.
        if key > last && key.class != last.class {
            self.counters.dropped.add_one(priority);
            return PushOutcome::DroppedIncoming(incoming);
        }
        let oldest_of_lowest = self
            .entries
            .range(SaveKey::new(last.class, 0)..)
            .next()
            .map_or(last, |(victim, _)| *victim);
        let dropped = self.entries.remove(&oldest_of_lowest);
        self.entries.insert(key, incoming);
        debug_assert!(self.entries.len() <= self.capacity.get(), "save_order::I1");
        match dropped {
            Some(dropped) => {
                self.counters.dropped.add_one(dropped.priority);
                PushOutcome::QueuedAfterDrop(dropped)
            }
            None => PushOutcome::Queued,
        }
    }

    /// Takes the next save: the entry with the smallest [`SaveKey`] (`save_order::I2`).
    pub fn pop(&mut self) -> Option<T> {
        let (_, next) = self.entries.pop_first()?;
        self.counters.popped.add_one(next.priority);
        Some(next.item)
    }

    /// The key [`SaveQueue::pop`] would take next.
    pub fn peek_key(&self) -> Option<SaveKey> {
        self.entries.first_key_value().map(|(key, _)| *key)
    }

    /// Removes every queued item for which `matches` is true (an aborted request, say) and
    /// hands them back in save order. Removed items are counted apart from drops.
    pub fn remove_where(&mut self, mut matches: impl FnMut(&T) -> bool) -> Vec<Prioritized<T>> {
        let keys: Vec<SaveKey> = self
            .entries
            .iter()
            .filter(|(_, queued)| matches(&queued.item))
            .map(|(key, _)| *key)
            .collect();
        let removed: Vec<Prioritized<T>> = keys
            .iter()
            .filter_map(|key| self.entries.remove(key))
            .collect();
        for entry in &removed {
            self.counters.removed.add_one(entry.priority);
        }
        removed
    }

    /// Items queued now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most items the queue holds (`save_order::I1`).
    pub fn capacity(&self) -> usize {
        self.capacity.get()
    }

    /// Whether window pages are filed ahead of full-attention blocks (R21).
    pub fn window_first(&self) -> bool {
        self.window_first
    }

    /// Items queued now, per priority pushed with.
    pub fn queued(&self) -> PerPriority {
        let mut queued = PerPriority::default();
        for entry in self.entries.values() {
            queued.add_one(entry.priority);
        }
        queued
    }

    /// The counters so far.
    pub fn counters(&self) -> SaveQueueCounters {
        self.counters
    }
}

impl SaveQueue<SaveItem> {
    /// Removes every queued save of `request` (it was aborted) and hands them back in save
    /// order, so the caller can release the pages.
    pub fn drain_request(&mut self, request: RequestId) -> Vec<Prioritized<SaveItem>> {
        self.remove_where(|item| item.request == request)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::num::NonZeroUsize;

    use super::{
        PerPriority, Prioritized, PushOutcome, SaveItem, SaveKey, SavePriority, SaveQueue,
    };
    use crate::core::hash::BlockHash;
    use crate::core::ids::{PageIndex, RequestId};
    use crate::core::layout::GroupId;

    use SavePriority::{Full, Resave, Window};

    type TestResult = Result<(), Box<dyn Error>>;

    fn queue(capacity: usize, window_first: bool) -> Result<SaveQueue<u64>, Box<dyn Error>> {
        Ok(SaveQueue::new(
            NonZeroUsize::try_from(capacity)?,
            window_first,
        ))
    }

    fn pop_all<T>(queue: &mut SaveQueue<T>) -> Vec<T> {
        std::iter::from_fn(|| queue.pop()).collect()
    }

    fn push_all(queue: &mut SaveQueue<u64>, script: &[(u64, SavePriority)]) {
        for &(item, priority) in script {
            assert_eq!(queue.push(item, priority), PushOutcome::Queued);
        }
    }

    const SCRIPT: [(u64, SavePriority); 6] = [
        (1, Full),
        (2, Resave),
        (3, Window),
        (4, Full),
        (5, Window),
        (6, Resave),
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
    fn r22_a_full_queue_sheds_the_oldest_of_the_lowest_class_first() -> TestResult {
        let mut queue = queue(3, true)?;
        push_all(&mut queue, &[(1, Full), (2, Resave), (3, Resave)]);
        let shed = |item, priority| PushOutcome::QueuedAfterDrop(Prioritized { item, priority });
        assert_eq!(
            queue.push(4, Window),
            shed(2, Resave),
            "oldest re-save first"
        );
        assert_eq!(queue.push(5, Window), shed(3, Resave));
        assert_eq!(
            queue.push(6, Full),
            shed(1, Full),
            "then the oldest full block"
        );
        assert_eq!(queue.len(), 3, "save_order::I1");
        assert_eq!(pop_all(&mut queue), vec![4, 5, 6]);
        assert_eq!(
            queue.counters().dropped,
            PerPriority {
                window: 0,
                full: 1,
                resave: 2
            }
        );
        Ok(())
    }

    #[test]
    fn r22_an_incoming_item_below_everything_queued_is_dropped_itself() -> TestResult {
        let mut queue = queue(2, true)?;
        push_all(&mut queue, &[(1, Window), (2, Full)]);
        let outcome = queue.push(3, Resave);
        assert!(!outcome.is_queued());
        let dropped = outcome.into_dropped();
        assert_eq!(
            dropped,
            Some(Prioritized {
                item: 3,
                priority: Resave
            })
        );
        assert_eq!(pop_all(&mut queue), vec![1, 2], "queue unchanged");
        assert_eq!(queue.counters().dropped.resave, 1);
        Ok(())
    }

    #[test]
    fn r22_an_incoming_item_of_the_lowest_class_replaces_the_older_one() -> TestResult {
        let mut queue = queue(2, true)?;
        push_all(&mut queue, &[(1, Full), (2, Full)]);
        let outcome = queue.push(3, Full);
        assert!(outcome.is_queued());
        assert_eq!(
            outcome.into_dropped(),
            Some(Prioritized {
                item: 1,
                priority: Full
            })
        );
        assert_eq!(pop_all(&mut queue), vec![2, 3]);
        Ok(())
    }

    #[test]
    fn r22_i6_window_first_off_sheds_a_window_page_as_the_oldest_of_the_shared_class() -> TestResult
    {
        let mut queue = queue(2, false)?;
        push_all(&mut queue, &[(1, Window), (2, Full)]);
        let outcome = queue.push(3, Full);
        assert_eq!(
            outcome.into_dropped(),
            Some(Prioritized {
                item: 1,
                priority: Window
            })
        );
        assert_eq!(
            queue.counters().dropped.window,
            1,
            "counted under its own priority"
        );
        assert_eq!(
            queue.push(4, Resave).into_dropped().map(|d| d.item),
            Some(4)
        );
        Ok(())
    }

    #[test]
    fn r22_a_queue_of_one_keeps_the_best_item() -> TestResult {
        let mut queue = queue(1, true)?;
        assert_eq!(queue.capacity(), 1);
        push_all(&mut queue, &[(1, Resave)]);
        assert_eq!(
            queue.push(2, Window).into_dropped().map(|d| d.item),
            Some(1)
        );
        assert_eq!(queue.push(3, Full).into_dropped().map(|d| d.item), Some(3));
        assert_eq!(
            queue.push(4, Window).into_dropped().map(|d| d.item),
            Some(2),
            "fifo"
        );
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
    fn drain_request_removes_only_that_requests_saves_in_save_order() -> TestResult {
        let mut queue: SaveQueue = SaveQueue::new(NonZeroUsize::try_from(8)?, true);
        for (item, priority) in [(save(1, 0), Full), (save(2, 0), Full), (save(1, 1), Window)] {
            assert_eq!(queue.push(item, priority), PushOutcome::Queued);
        }
        let removed = queue.drain_request(RequestId(1));
        let removed_blocks: Vec<(u64, SavePriority)> = removed
            .iter()
            .map(|r| (r.item.block_index, r.priority))
            .collect();
        assert_eq!(removed_blocks, vec![(1, Window), (0, Full)]);
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
        Ok(())
    }

    #[test]
    fn i4_counters_account_for_every_push() -> TestResult {
        let mut queue = queue(2, true)?;
        push_all(&mut queue, &[(1, Window), (2, Resave)]);
        let _ = queue.push(3, Full);
        let _ = queue.push(4, Resave);
        queue.pop();
        let _ = queue.remove_where(|&item| item == 3);
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
                resave: 2
            }
        );
        assert_eq!(
            counters.dropped,
            PerPriority {
                window: 0,
                full: 0,
                resave: 2
            }
        );
        Ok(())
    }
}

/// Property tests of the order (`save_order::I2`, `save_order::I3`) and of shedding and accounting
/// against a naive model (`save_order::I1`, `save_order::I4`, `save_order::I5`), with fixed seeds.
#[cfg(test)]
mod proptests {
    use std::collections::BTreeSet;
    use std::num::NonZeroUsize;

    use proptest::prelude::*;
    use proptest::test_runner::RngSeed;

    use super::{Prioritized, PushOutcome, SavePriority, SaveQueue};

    fn priority() -> impl Strategy<Value = SavePriority> {
        prop::sample::select(SavePriority::ALL.to_vec())
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
        Push(SavePriority),
        Pop,
        /// Remove the items whose id is `0` modulo 7 plus this offset.
        Remove(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => priority().prop_map(Op::Push),
            3 => Just(Op::Pop),
            1 => (0..7_u64).prop_map(Op::Remove),
        ]
    }

    /// A queued item of the model: (id, class rank, priority). Ids grow with every push, so
    /// the smallest id of a rank is the oldest.
    type ModelEntry = (u64, u8, SavePriority);

    fn oldest_of(model: &[ModelEntry], rank_wanted: u8) -> Option<usize> {
        model
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry.1 == rank_wanted)
            .min_by_key(|(_, entry)| entry.0)
            .map(|(index, _)| index)
    }

    /// What the model says a push into a full queue must drop (`save_order::I5`).
    fn expected_shed(model: &mut Vec<ModelEntry>, incoming: ModelEntry) -> PushOutcome<u64> {
        let lowest = model.iter().map(|entry| entry.1).max().unwrap_or(0);
        if incoming.1 > lowest {
            let (item, _, priority) = incoming;
            return PushOutcome::DroppedIncoming(Prioritized { item, priority });
        }
        let victim = oldest_of(model, lowest).map(|index| model.remove(index));
        model.push(incoming);
        victim.map_or(PushOutcome::Queued, |(item, _, priority)| {
            PushOutcome::QueuedAfterDrop(Prioritized { item, priority })
        })
    }

    /// Items that left the queue, to check each leaves exactly once (`save_order::I4`).
    #[derive(Default)]
    struct Left {
        ids: BTreeSet<u64>,
    }

    impl Left {
        fn record(&mut self, id: u64) -> Result<(), TestCaseError> {
            prop_assert!(
                self.ids.insert(id),
                "save_order::I4: item {} left twice",
                id
            );
            Ok(())
        }
    }

    fn check_accounting(queue: &SaveQueue<u64>) -> Result<(), TestCaseError> {
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

    fn run_model(capacity: usize, window_first: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let capacity = NonZeroUsize::new(capacity).ok_or(TestCaseError::fail("capacity 0"))?;
        let mut queue = SaveQueue::new(capacity, window_first);
        let mut model: Vec<ModelEntry> = Vec::new();
        let mut left = Left::default();
        let mut next_id = 0_u64;
        for op in ops {
            match op {
                Op::Push(priority) => {
                    let incoming = (next_id, rank(priority, window_first), priority);
                    next_id += 1;
                    let want = if model.len() < capacity.get() {
                        model.push(incoming);
                        PushOutcome::Queued
                    } else {
                        expected_shed(&mut model, incoming)
                    };
                    let got = queue.push(incoming.0, priority);
                    prop_assert_eq!(&got, &want, "save_order::I5");
                    if let Some(dropped) = got.into_dropped() {
                        left.record(dropped.item)?;
                    }
                }
                Op::Pop => {
                    let best = model.iter().enumerate().min_by_key(|(_, e)| (e.1, e.0));
                    let want = best
                        .map(|(index, _)| index)
                        .map(|index| model.remove(index).0);
                    let got = queue.pop();
                    prop_assert_eq!(got, want, "save_order::I2: smallest key first");
                    if let Some(id) = got {
                        left.record(id)?;
                    }
                }
                Op::Remove(offset) => {
                    let matches = |id: &u64| id % 7 == offset;
                    model.retain(|entry| !matches(&entry.0));
                    for removed in queue.remove_where(matches) {
                        left.record(removed.item)?;
                    }
                }
            }
            prop_assert!(queue.len() <= queue.capacity(), "save_order::I1");
            prop_assert_eq!(queue.len(), model.len());
            check_accounting(&queue)?;
        }
        while let Some(id) = queue.pop() {
            left.record(id)?;
        }
        prop_assert_eq!(
            left.ids.len(),
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
            priorities in prop::collection::vec(priority(), 0..64),
            window_first in any::<bool>(),
        ) {
            let capacity = NonZeroUsize::new(64).ok_or(TestCaseError::fail("capacity 0"))?;
            let mut queue = SaveQueue::new(capacity, window_first);
            for (id, &priority) in (0_u64..).zip(&priorities) {
                prop_assert!(queue.push(id, priority).is_queued());
            }
            let mut previous: Option<(u8, u64)> = None;
            while let Some(key) = queue.peek_key() {
                let id = queue.pop().ok_or(TestCaseError::fail("peeked but empty"))?;
                prop_assert_eq!(key.seq(), id, "save_order::I3: seq is the push order");
                let index = usize::try_from(id).unwrap_or(usize::MAX);
                let position = (rank(priorities[index], window_first), id);
                prop_assert!(previous.is_none_or(|p| p < position), "{:?} after {:?}", position, previous);
                previous = Some(position);
            }
        }

        #[test]
        fn i1_i4_i5_shedding_and_accounting_match_a_naive_model(
            capacity in 1_usize..6,
            window_first in any::<bool>(),
            ops in prop::collection::vec(op(), 0..120),
        ) {
            run_model(capacity, window_first, ops)?;
        }
    }
}
