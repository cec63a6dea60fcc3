//! The engine-facing side of the connector (`docs/DESIGN.md` section 2).
//!
//! An engine (a real serving process, or the replay simulator) drives the connector
//! through the [`EngineConnector`] hooks, always from its scheduler thread. The hooks
//! never wait on pool I/O in async mode: lookups, loads and saves run on the actor
//! system, and their results come back through the polling hooks
//! ([`EngineConnector::reserve_prefix`] answers `Pending` until the lookup is done,
//! [`EngineConnector::get_finished_prefix_loads`] and
//! [`EngineConnector::get_finished_saves`] drain what completed).
//!
//! Request lifecycle, as the engine sees it:
//!
//! 1. a request arrives: [`EngineConnector::lookup_prefix`] starts the lookup, which the
//!    connector may queue until the engine's admission pass ends
//!    ([`EngineConnector::flush_lookups`]) so that a pass sends its planner one message;
//! 2. each step until admitted: [`EngineConnector::reserve_prefix`] returns `Pending`, or an
//!    [`ReserveAnswer::Offer`] of `extra_tokens` the connector can load;
//! 3. the engine allocates pages for the offered tokens and reports them in the next
//!    [`EngineConnector::on_step`] (`ScheduledRequest::new_reservation`); the connector
//!    starts the load and the request is parked (async) or loaded inside the step (sync);
//! 4. [`EngineConnector::get_finished_prefix_loads`] reports the reservation filled (the
//!    engine counts those tokens as computed) or failed (the engine releases the
//!    reservation and computes the prefix itself, R25);
//! 5. every step that computes prompt tokens is reported in `on_step`; the connector
//!    saves the blocks completed by the end of the chunk (R16, R17);
//! 6. [`EngineConnector::request_finished`] says whether the pages must stay until saves
//!    finish; [`EngineConnector::get_finished_saves`] says when they may be freed (R22).

use std::sync::Arc;

pub mod courier;
#[cfg(feature = "faults")]
pub mod gate;
mod handle;
mod refusal;
mod share;
mod start;

pub use handle::ConnectorHandle;
#[cfg(feature = "internals")]
pub use handle::{Progress, ProgressWaiter};
pub use refusal::{AdoptError, HookError};
pub use share::{RankShare, ShareError};
#[cfg(feature = "internals")]
pub use start::StagingRole;
pub use start::{ConnectorParams, StartError};

/// Defined with the other engine-inbox messages (the reservation manager sends it).
pub use crate::messages::FinishedLoad;

use crate::core::request_scope::RequestScope;
use crate::core::ids::{RequestId, ReservationId};

/// The connector's answer to `reserve_prefix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveAnswer {
    /// The lookup is still running: ask again next step (the request stays waiting).
    Pending,
    /// `extra_tokens` beyond `num_computed` can be loaded (0: nothing to offer);
    /// `is_async`: the load runs while the engine computes other requests.
    Offer {
        /// Tokens the connector will fill, counted from `num_computed`.
        extra_tokens: usize,
        /// Whether the request is parked while loaders fill its pages (R23).
        is_async: bool,
    },
}

/// Pages of one request in one layer group: page index per block, `-1` where the group
/// holds no page for that block (a window group that dropped it).
pub type PageTable = [i32];

/// One request in one engine step.
#[derive(Debug)]
pub struct ScheduledRequest<'a> {
    /// The request.
    pub request: RequestId,
    /// Prompt length `P` in tokens.
    pub prompt_len: usize,
    /// Tokens computed before this step (including loaded ones).
    pub computed_before: usize,
    /// Tokens computed by the end of this step: the chunk end (R16). Equal to
    /// `computed_before` for a request that computes nothing this step.
    pub computed_after: usize,
    /// A reservation whose pages were allocated in this step: the connector starts its load.
    pub new_reservation: Option<ReservationId>,
    /// The request's page table per layer group, in layout group order.
    pub page_tables: &'a [&'a PageTable],
}

/// What the engine scheduled in one step.
#[derive(Debug, Default)]
pub struct SchedulerOutput<'a> {
    /// Requests that computed tokens or got a reservation's pages this step.
    pub requests: Vec<ScheduledRequest<'a>>,
}

/// The engine hooks of `docs/DESIGN.md` section 2, called from the engine's scheduler thread.
pub trait EngineConnector {
    /// Starts the lookup of a new request's prompt (never blocks on the pool).
    /// `local_match_tokens` is the engine's own prefix-cache hit (block aligned). The
    /// prompt is the request's for good: every save of the request is keyed by its
    /// blocks (R32).
    ///
    /// # Errors
    /// [`HookError::LiveRequest`] when `request` is still live (looked up and not ended,
    /// or ended with saves pending): nothing is looked up, and nothing more of that
    /// request is saved or loaded (R32).
    fn lookup_prefix(
        &mut self,
        request: RequestId,
        prompt: Arc<[i64]>,
        local_match_tokens: usize,
    ) -> Result<(), HookError>;

    /// [`EngineConnector::lookup_prefix`] of a request with a scope of its own (R34): its
    /// cache salt and `LoRA` adapter seed its chain, so it shares KV only with requests of
    /// the same scope. An empty scope is a plain lookup. A connector that cannot key
    /// scopes refuses a non-empty one (the default), so scopes never share KV through it.
    ///
    /// # Errors
    /// As [`EngineConnector::lookup_prefix`]; [`HookError::ScopeUnsupported`] for a
    /// non-empty scope the connector does not key.
    fn lookup_prefix_in_scope(
        &mut self,
        request: RequestId,
        prompt: Arc<[i64]>,
        local_match_tokens: usize,
        scope: RequestScope,
    ) -> Result<(), HookError> {
        if scope.is_empty() {
            self.lookup_prefix(request, prompt, local_match_tokens)
        } else {
            Err(HookError::ScopeUnsupported { request })
        }
    }

    /// The engine has made the `lookup_prefix` calls of one admission pass: a connector
    /// that batches lookups sends them now (one message to its planner a pass). Calling
    /// it is optional: the connector also sends queued lookups at the next
    /// `get_finished_prefix_loads`, `on_step`, `get_finished_saves`, `wait_for_progress`
    /// or `settle_saves`. Until then `reserve_prefix` answers `Pending` for them.
    fn flush_lookups(&mut self) {}

    /// `reserve_prefix(req, num_computed, reservation_id)`: what the connector can load
    /// beyond `num_computed`. Starts no transfer.
    fn reserve_prefix(
        &mut self,
        request: RequestId,
        num_computed: usize,
        reservation: ReservationId,
    ) -> ReserveAnswer;

    /// The engine trims or gives up tokens `[start, end)` of a reservation.
    fn release_prefix_reservation(
        &mut self,
        request: RequestId,
        reservation: ReservationId,
        start: usize,
        end: usize,
    );

    /// Reservations whose loads ended since the last call.
    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad>;

    /// Plans saves and starts loads for what the engine scheduled this step. A
    /// `new_reservation` must be the one of the request's latest offer
    /// (`reserve_prefix`), reported once; one that is not is reported failed (or, named
    /// again, ignored) rather than loaded. `ConnectorHandle::check_step` refuses such a
    /// step before anything of it is done.
    fn on_step(&mut self, output: &SchedulerOutput<'_>);

    /// A request ended; `true` when its pages must stay until its saves finish.
    fn request_finished(&mut self, request: RequestId) -> bool;

    /// Requests whose saves are done (or dropped) since the last call: their pages may go.
    fn get_finished_saves(&mut self) -> Vec<RequestId>;

    /// Blocks until a lookup, load or save completes, or `timeout` passes. An idle engine
    /// (or the replay simulator, whose clock is simulated) calls it instead of spinning.
    fn wait_for_progress(&mut self, timeout: std::time::Duration);

    /// Blocks until every save enqueued so far is stored, skipped or dropped. Not an
    /// engine hook: the replay simulator calls it so that what simulated time says has
    /// been saved is in the pool before a later lookup (see `replay`'s docs).
    fn settle_saves(&mut self);
}

/// The baseline without a connector: never offers anything, saves nothing. Replay uses
/// it to measure what a deployment without a shared pool would do.
#[derive(Debug, Default)]
#[cfg(any(feature = "replay", feature = "internals"))]
pub struct NoConnector;

#[cfg(any(feature = "replay", feature = "internals"))]
impl EngineConnector for NoConnector {
    fn lookup_prefix(
        &mut self,
        _request: RequestId,
        _prompt: Arc<[i64]>,
        _local_match_tokens: usize,
    ) -> Result<(), HookError> {
        Ok(())
    }

    fn reserve_prefix(
        &mut self,
        _request: RequestId,
        _num_computed: usize,
        _reservation: ReservationId,
    ) -> ReserveAnswer {
        ReserveAnswer::Offer {
            extra_tokens: 0,
            is_async: false,
        }
    }

    fn release_prefix_reservation(
        &mut self,
        _request: RequestId,
        _reservation: ReservationId,
        _start: usize,
        _end: usize,
    ) {
    }

    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
        Vec::new()
    }

    fn on_step(&mut self, _output: &SchedulerOutput<'_>) {}

    fn request_finished(&mut self, _request: RequestId) -> bool {
        false
    }

    fn get_finished_saves(&mut self) -> Vec<RequestId> {
        Vec::new()
    }

    fn wait_for_progress(&mut self, _timeout: std::time::Duration) {}

    fn settle_saves(&mut self) {}
}
