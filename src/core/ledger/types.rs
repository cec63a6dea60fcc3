//! The ledger's vocabulary: pages, tickets, load results, states and the outcomes of its
//! calls. See the parent module for the workflow and the invariants `ledger::I1`-I8.

use std::fmt;

use crate::core::ids::{PageIndex, ReservationId};
use crate::core::layout::GroupId;

/// One page set aside by the engine: block `block_index` of layer group `group` goes to page
/// `page` of that group's page table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReservedPage {
    /// Block index in the prompt: the block covers tokens `[b*T, (b+1)*T)`.
    pub block_index: u64,
    /// Layer group whose page table holds the page.
    pub group: GroupId,
    /// The page in that group's page table.
    pub page: PageIndex,
}

/// Proof that a loader started loading one reservation; passed back to
/// [`Ledger::complete`](super::Ledger::complete). Only the ledger makes tickets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoadTicket {
    pub(super) id: ReservationId,
    /// Ledger-wide number of the reservation, so a reused engine id cannot match an old load.
    pub(super) generation: u64,
}

impl LoadTicket {
    /// The engine's id of the reservation being loaded.
    pub fn id(&self) -> ReservationId {
        self.id
    }
}

/// Why a load could not fill its pages (R25); the engine then computes the prefix itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoadFailure {
    /// An object was evicted from the pool since the probe.
    Evicted,
    /// The pool returned an error.
    PoolError,
    /// An object failed its integrity check (R5).
    Corrupt,
    /// The load did not finish in time.
    Timeout,
    /// The loader stopped before finishing.
    LoaderGone,
    /// The staging -> device copy failed or was refused.
    DeviceCopy,
}

impl LoadFailure {
    /// A short, stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::PoolError => "pool_error",
            Self::Corrupt => "corrupt",
            Self::Timeout => "timeout",
            Self::LoaderGone => "loader_gone",
            Self::DeviceCopy => "device_copy",
        }
    }
}

/// What a loader reports, and what `get_finished_prefix_loads` hands to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoadResult {
    /// Every page still reserved was loaded and verified (R24).
    Filled,
    /// The load failed; no page of it may be treated as computed (R25).
    Failed(LoadFailure),
}

/// Where a live reservation stands (`ledger::I6`: only `Reserved -> Loading -> Filled | Failed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReservationState {
    /// Pages are set aside; no loader has it yet.
    Reserved,
    /// A loader is filling the pages.
    Loading,
    /// The pages are filled; waiting for `take_finished`.
    Filled,
    /// The load failed; waiting for `take_finished`.
    Failed(LoadFailure),
}

impl ReservationState {
    /// A short, stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Loading => "loading",
            Self::Filled => "filled",
            Self::Failed(_) => "failed",
        }
    }

    /// The result to report, for the two finished states.
    pub(super) fn finished_result(self) -> Option<LoadResult> {
        match self {
            Self::Filled => Some(LoadResult::Filled),
            Self::Failed(failure) => Some(LoadResult::Failed(failure)),
            Self::Reserved | Self::Loading => None,
        }
    }
}

impl fmt::Display for ReservationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a completion was ignored (R26).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StaleReason {
    /// The ledger does not know (or no longer remembers) the reservation.
    Unknown,
    /// The engine released the reservation, or its request finished.
    Released,
    /// The engine re-reserved the request under a new id.
    Replaced,
    /// The reservation was already completed (and perhaps handed over).
    AlreadyFinished,
}

impl StaleReason {
    /// A short, stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Released => "released",
            Self::Replaced => "replaced",
            Self::AlreadyFinished => "already_finished",
        }
    }
}

/// What [`Ledger::complete`](super::Ledger::complete) did with a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompletionDisposition {
    /// The reservation is now `Filled` or `Failed` and will be reported by `take_finished`.
    Accepted,
    /// Ignored; nothing changed but a counter (`ledger::I7`).
    Stale {
        /// Why the completion no longer applies.
        reason: StaleReason,
    },
}

/// What [`Ledger::reserve`](super::Ledger::reserve) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReserveOutcome {
    /// The request had no live reservation.
    New,
    /// The request's previous reservation was retired; its completions are now stale.
    Replaced {
        /// The retired reservation.
        old: ReservationId,
    },
}

/// What [`Ledger::release`](super::Ledger::release) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseOutcome {
    /// No token remained reserved: the reservation is gone and all its pages are free.
    Removed {
        /// Pages returned to the budget.
        freed_pages: usize,
    },
    /// Part of the range remains; pages of blocks with no reserved token left are free.
    Trimmed {
        /// Pages returned to the budget.
        freed_pages: usize,
    },
    /// The range held no token still reserved; nothing changed.
    Unchanged,
    /// The id is not live (never reserved, released, replaced or handed over); harmless.
    NotLive,
}

/// Counters the reservation manager reports (plain fields; the actor owns them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(clippy::struct_field_names, reason = "the counters keep the names they are reported under")]
pub struct LedgerCounters {
    /// Reservations accepted, replacements included.
    pub num_reserved: u64,
    /// Reservations retired because their request was re-reserved.
    pub num_replaced: u64,
    /// Reservations refused with an error.
    pub num_refused: u64,
    /// Reservations removed by a release or `forget_request`.
    pub num_released: u64,
    /// Releases that kept part of the reservation.
    pub num_trimmed: u64,
    /// Releases for an id that was not live.
    pub num_release_not_live: u64,
    /// Loads started.
    pub num_loads_started: u64,
    /// Completions accepted.
    pub num_completions_accepted: u64,
    /// Completions ignored as stale.
    pub num_completions_stale: u64,
    /// Reservations handed over as filled.
    pub num_handed_over_filled: u64,
    /// Reservations handed over as failed.
    pub num_handed_over_failed: u64,
}
