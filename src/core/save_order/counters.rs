//! The save queue's counters, per priority (`save_order::I4`).

use super::SavePriority;

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
    #[cfg(feature = "internals")]
    pub fn get(&self, priority: SavePriority) -> u64 {
        match priority {
            SavePriority::Window => self.window,
            SavePriority::Full => self.full,
            SavePriority::Resave => self.resave,
        }
    }

    /// The sum over every priority.
    #[cfg(feature = "internals")]
    pub fn total(&self) -> u64 {
        self.window + self.full + self.resave
    }

    pub(super) fn add_one(&mut self, priority: SavePriority) {
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
    /// Items dropped by shedding (R22): the queued entries of a shed request, and incoming
    /// items of a request that is shed or was shed before (`save_order::I5`,
    /// `save_order::I7`).
    pub dropped: PerPriority,
    /// Items removed by [`super::SaveQueue::remove_where`] or
    /// [`super::SaveQueue::drain_request`].
    pub removed: PerPriority,
    /// Requests shed (R22), each counted once per shedding.
    pub requests_shed: u64,
}
