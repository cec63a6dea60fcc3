//! Errors of the reservation ledger, and the invariants its self-check names.

use std::fmt;

use super::ReservationState;
use crate::core::ids::{PageIndex, ReservationId};
use crate::core::layout::GroupId;

/// The invariant [`Ledger::check_invariants`](super::Ledger::check_invariants) found broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LedgerInvariant {
    /// `ledger::I1`: no page reserved twice.
    PageHeldOnce,
    /// `ledger::I2`: `free + reserved == capacity`.
    Budget,
    /// `ledger::I3`: one live reservation per request.
    OnePerRequest,
    /// `ledger::I4`: token ranges well formed and covering every held page.
    TokenRanges,
    /// `ledger::I5`: the finished set matches the finished states.
    FinishedSet,
}

impl fmt::Display for LedgerInvariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::PageHeldOnce => "i1 (no page reserved twice)",
            Self::Budget => "i2 (free + reserved == capacity)",
            Self::OnePerRequest => "i3 (one live reservation per request)",
            Self::TokenRanges => "i4 (token ranges cover every held page)",
            Self::FinishedSet => "i5 (finished set matches finished states)",
        })
    }
}

/// Errors of the reservation ledger. Every refused call changed nothing (`ledger::I8`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The ledger was built with `tokens_per_block == 0`.
    #[error("tokens_per_block is 0; use the engine's block size, e.g. 32")]
    ZeroTokensPerBlock,
    /// A group was given a budget twice.
    #[error("layer group {group} has two page budgets; give each group one")]
    GroupListedTwice {
        /// The group listed twice.
        group: GroupId,
    },
    /// A group was given a budget of zero pages.
    #[error("layer group {group} has a page budget of 0; give it at least 1 page")]
    ZeroBudget {
        /// The group with no budget.
        group: GroupId,
    },
    /// The reservation id is already live.
    #[error("reservation {id} is already live")]
    IdAlreadyLive {
        /// The id.
        id: ReservationId,
    },
    /// The token range is empty.
    #[error("reservation {id} has an empty token range [{start}, {end})")]
    EmptyTokenRange {
        /// The reservation.
        id: ReservationId,
        /// First token.
        start: u64,
        /// One past the last token.
        end: u64,
    },
    /// A page names a group the ledger has no budget for.
    #[error("reservation {id} names layer group {group}, which has no page budget")]
    UnknownGroup {
        /// The reservation.
        id: ReservationId,
        /// The unknown group.
        group: GroupId,
    },
    /// A page's block does not overlap the reservation's token range.
    #[error("reservation {id}: block {block_index} lies outside tokens [{start}, {end})")]
    BlockOutsideRange {
        /// The reservation.
        id: ReservationId,
        /// The block.
        block_index: u64,
        /// First token of the reservation.
        start: u64,
        /// One past its last token.
        end: u64,
    },
    /// The same block of the same group was given two pages.
    #[error("reservation {id}: block {block_index} of group {group} is listed twice")]
    BlockListedTwice {
        /// The reservation.
        id: ReservationId,
        /// The block.
        block_index: u64,
        /// The group.
        group: GroupId,
    },
    /// The same page was listed twice in one reservation.
    #[error("reservation {id}: page {page} of group {group} is listed twice")]
    PageListedTwice {
        /// The reservation.
        id: ReservationId,
        /// The group.
        group: GroupId,
        /// The page.
        page: PageIndex,
    },
    /// A page is held by another live reservation (`ledger::I1`).
    #[error("reservation {id}: page {page} of group {group} is held by reservation {holder}")]
    PageHeld {
        /// The reservation refused.
        id: ReservationId,
        /// The group.
        group: GroupId,
        /// The page.
        page: PageIndex,
        /// The live reservation holding it.
        holder: ReservationId,
    },
    /// The group's page budget cannot cover the reservation (`ledger::I2`).
    #[error(
        "reservation {id} needs {requested} pages of group {group} but {available} are free; \
         raise the group's reservation page budget or offer fewer tokens"
    )]
    BudgetExceeded {
        /// The reservation refused.
        id: ReservationId,
        /// The group.
        group: GroupId,
        /// Pages it asked for in that group.
        requested: usize,
        /// Pages free in that group (counting those of a reservation it would replace).
        available: usize,
    },
    /// The reservation is not live.
    #[error("reservation {id} is not live")]
    NotLive {
        /// The id.
        id: ReservationId,
    },
    /// A load can start only from `Reserved` (`ledger::I6`).
    #[error("reservation {id} cannot start a load in state {state}")]
    NotReserved {
        /// The reservation.
        id: ReservationId,
        /// Its current state.
        state: ReservationState,
    },
    /// [`Ledger::check_invariants`](super::Ledger::check_invariants) found a broken invariant: a bug in the ledger.
    #[error("ledger invariant broken: {invariant}")]
    InvariantBroken {
        /// Which invariant.
        invariant: LedgerInvariant,
    },
}

impl LedgerError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ZeroTokensPerBlock => "zero_tokens_per_block",
            Self::GroupListedTwice { .. } => "group_listed_twice",
            Self::ZeroBudget { .. } => "zero_budget",
            Self::IdAlreadyLive { .. } => "id_already_live",
            Self::EmptyTokenRange { .. } => "empty_token_range",
            Self::UnknownGroup { .. } => "unknown_group",
            Self::BlockOutsideRange { .. } => "block_outside_range",
            Self::BlockListedTwice { .. } => "block_listed_twice",
            Self::PageListedTwice { .. } => "page_listed_twice",
            Self::PageHeld { .. } => "page_held",
            Self::BudgetExceeded { .. } => "budget_exceeded",
            Self::NotLive { .. } => "not_live",
            Self::NotReserved { .. } => "not_reserved",
            Self::InvariantBroken { .. } => "invariant_broken",
        }
    }
}
