//! [`HookError`]: an engine hook call the connector refuses. A refused call changes
//! nothing the engine relies on: no lookup starts, no load starts, nothing is reported.
//!
//! The refusals keep R32: a request's tokens are fixed from its first lookup to its end,
//! so every object the connector stores is keyed by the chain hash of the tokens whose KV
//! it carries, and a reservation is loaded only when `reserve_prefix` offered it.

use crate::core::ids::{RequestId, ReservationId};
use crate::core::lookup_record::RecordError;

/// An engine hook call refused by the connector (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// `lookup_prefix` for a request that is still live: looked up and not ended, or
    /// ended with saves pending. The request keeps the tokens of its first lookup, and the
    /// connector saves and loads nothing more for it (its engine has other tokens in mind).
    #[error(
        "request {request} is live (looked up and not ended, or ended with saves pending): \
         its tokens are fixed from its first lookup to its end; give the new prompt a new \
         request id, or end this one and wait for finished_saves to list it"
    )]
    LiveRequest {
        /// The request looked up again.
        request: RequestId,
    },
    /// `lookup_prefix_in_scope` with a cache salt or adapter on a connector that does not
    /// key request scopes (R34): nothing is looked up, so no scope shares KV through it.
    #[error(
        "request {request}: this connector does not key request scopes (cache salt, LoRA \
         adapter); look the request up without one, or use a connector that keys them"
    )]
    ScopeUnsupported {
        /// The request.
        request: RequestId,
    },
    /// `on_step` names a reservation that `reserve_prefix` did not offer tokens for, or
    /// not as the request's latest reservation.
    #[error(
        "request {request}: reservation {reservation} was not offered by reserve_prefix{}; \
         report as new_reservation only the reservation of the request's latest offer",
        offered.map_or_else(String::new, |id| format!(" (its latest offer is reservation {id})"))
    )]
    UnofferedReservation {
        /// The request.
        request: RequestId,
        /// The reservation named.
        reservation: ReservationId,
        /// The reservation of the request's latest offer not yet reported, if any.
        offered: Option<ReservationId>,
    },
    /// `on_step` names a reservation that an earlier step (or the same step) already
    /// reported: its load was started once.
    #[error(
        "request {request}: reservation {reservation} was already reported as \
         new_reservation; report each reservation once, in the step that allocated its pages"
    )]
    ReservationReported {
        /// The request.
        request: RequestId,
        /// The reservation named again.
        reservation: ReservationId,
    },
    /// `on_step` on a lookup-only connector: it serves no rank, so it has nothing to load
    /// into or save from.
    #[error(
        "this connector looks requests up only (it serves no rank): give the steps to the \
         connectors of the ranks, which adopt its lookups"
    )]
    LookupOnly,
}

/// `adopt_lookup` refused: nothing of the request changed.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// The request is live (as for `lookup_prefix`).
    #[error(transparent)]
    Hook(#[from] HookError),
    /// The record is not one this connector can take (`lookup_record::L2`).
    #[error("request {request}: {source}")]
    Record {
        /// The request.
        request: RequestId,
        /// Why.
        #[source]
        source: RecordError,
    },
}
