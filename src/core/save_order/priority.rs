//! The save priorities and the one place their order is written: [`SaveKey`]'s `Ord`.

use std::cmp::Ordering;

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
    /// The class the queue filed the item under (see [`super::SaveQueue::class_of`]).
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
/// Shedding does not use this order: a full queue sheds whole requests, the one with the
/// oldest queued entry first, whatever their classes (R22; see [`super::SaveQueue::push`]).
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
