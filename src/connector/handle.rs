//! [`ConnectorHandle`]: the real connector behind the engine hooks. It runs on the
//! engine's thread and only hands messages to the courier (`handoff`, which wakes no
//! thread while the courier polls) and drains bounded channels; the actor system does the
//! I/O.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;

use super::courier::{ActorRecipients, Courier, CourierTiming};
use super::start::{start_actors, ConnectorParams, StagingRegistrations, StartError, Started};
use super::{EngineConnector, FinishedLoad, HookError, ReserveAnswer, SchedulerOutput};
use crate::actors::stats_reporter::StatsReporter;
use crate::core::ids::{LookupTicket, RequestId, ReservationId};
use crate::core::keys::KeySpace;
use crate::core::request_scope::RequestScope;
use crate::core::layout::{Attention, Layout};
use crate::core::save_order::SavePriority;
use crate::messages::courier::{LookupAnswer, Outgoing};
use crate::messages::lookup_planner::LookupPrefix;
use crate::messages::prompt::Prompt;
use crate::messages::reservation_manager::{ReleaseReservation, StartLoad};
use crate::messages::saver_queue::{EnqueueSave, SettleSaves};
use crate::messages::{EngineInbox, LoadAnswer, LookupCompleted, SavesSettled};
use crate::stats::ConnectorStats;
use crate::transfer::LoadGrant;

#[cfg(feature = "faults")]
mod gates;
mod handoff;
mod loads;
mod lookups;
mod progress;
mod records;
mod report;
mod reservations;
mod saves;
mod shutdown;
mod windows;

#[cfg(feature = "internals")]
pub use progress::{Progress, ProgressWaiter};

/// Capacity of each engine inbox channel: results wait here until the next step drains them.
const ENGINE_INBOX_CAPACITY: usize = 4096;

/// The handle's record of one request, from its lookup until it is forgotten (ended, its
/// saves settled): while it exists the request is live (R32).
#[derive(Debug, Default)]
struct RequestState {
    /// The ticket of the request's one lookup: only that lookup's result is taken.
    ticket: LookupTicket,
    lookup: Option<LookupAnswer>,
    /// The engine looked the live request up again with other tokens in mind: nothing
    /// more of it is saved or loaded (R32).
    disputed: bool,
    /// The reservation of the latest offer (`reserve_prefix`), until a step reports it.
    offered: Option<ReservationId>,
    /// The reservation a step reported last (its load started).
    reported: Option<ReservationId>,
    /// Tokens that came from the pool or the local match: never saved again (R19).
    reused_until: usize,
    pending_saves: u64,
    finished: bool,
    window_saved: bool,
    /// The load in flight for this request: its reservation and the pages the engine
    /// lends it (R29; `loads` module).
    load: Option<(ReservationId, Arc<LoadGrant>)>,
}

/// A layer group as the handle needs it for saves.
#[derive(Clone, Copy, Debug)]
struct SaveGroup {
    attention: Attention,
    replicated: bool,
}

/// The connector of one serving instance.
pub struct ConnectorHandle {
    /// Delivers every message for the planner, the manager and the savers (in order).
    courier: Courier,
    /// Tensor-parallel ranks this connector serves: one saver each.
    ranks: usize,
    /// Whether it stores the replicated groups' pages (it holds rank 0).
    saves_replicated: bool,
    reporter: Addr<StatsReporter>,
    keys: Arc<KeySpace>,
    system: actix::System,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The staging pools registered with the pool; released once the actors have stopped.
    staging: StagingRegistrations,
    lookups: flume::Receiver<LookupCompleted>,
    loads: flume::Receiver<LoadAnswer>,
    saves: flume::Receiver<SavesSettled>,
    finished_loads: Vec<FinishedLoad>,
    /// Lookups started but not sent yet (`lookups`): sent as one message when the
    /// engine's admission pass ends. A batch the planner's full mailbox refused stays
    /// here and is retried at every `reserve_prefix` (which answers `Pending`
    /// meanwhile), so no request goes without its hashes and therefore without its saves.
    unsent_lookups: Vec<LookupPrefix>,
    /// The last batch was refused by a full mailbox.
    lookups_refused: bool,
    /// The last lookup ticket issued (R32).
    last_ticket: LookupTicket,
    /// The loads of the step `on_step` is reporting, sent as one message at its end.
    step_loads: Vec<StartLoad>,
    /// One save batch per rank for the step `on_step` is reporting (empty between steps).
    step_saves: Vec<EnqueueSave>,
    requests: HashMap<RequestId, RequestState>,
    /// Finished requests whose last save settled: reported by the next
    /// `get_finished_saves` without scanning every request.
    saves_done: Vec<RequestId>,
    /// Lookup results of requests the handle forgot this step, freed by the courier
    /// (`Outgoing::Discard`) rather than on the engine thread.
    discarded: Vec<LookupAnswer>,
    /// Requests the handle forgot since the last save batches: named in the next ones, so
    /// every saver forgets whether it shed them before the engine may reuse an id (R22).
    ended: Vec<RequestId>,
    /// Reused for each group's block list in `plan_saves` (no allocation per request).
    save_ranges: Vec<(std::ops::Range<usize>, SavePriority)>,
    groups: Vec<SaveGroup>,
    tokens_per_block: usize,
    rewind_tokens: usize,
    /// `saver.resave_min_tokens`; `None`: re-save off (R20).
    resave_min_tokens: Option<NonZeroUsize>,
    /// `saver.window_checkpoint_tokens`; `None`: no window checkpoints (R28).
    checkpoint_tokens: Option<NonZeroUsize>,
    sync_load: bool,
    /// Pages refused by a full saver mailbox (R22), counted here.
    saves_refused: u64,
    /// Pages handed to the savers whose block ends past the chunk end of its step (R16;
    /// the required number is 0).
    published_past_chunk_end: u64,
    /// Window pages planned for checkpoints alone (R28), every rank.
    checkpoint_pages_planned: u64,
    /// Lookups a full planner mailbox deferred to a later step.
    lookups_deferred: u64,
    /// Loads the engine asked for (`start_load`) and loads the reservation manager took:
    /// the difference failed here at once and is counted started and failed (accounting).
    loads_asked: u64,
    loads_sent: u64,
    /// Loads sent to the reservation manager whose completion has not come back yet
    /// (the shutdown protocol waits for them).
    loads_in_flight: u64,
    /// `saver.shutdown_drain_timeout_ms`: how long `shutdown` lets queued work finish (at
    /// most one day, validated).
    drain_timeout: Duration,
    /// `stats.instance` ("0" when unset): names this connector in its lifecycle lines.
    instance: String,
    /// The report of the first `close`, for a repeated call.
    final_stats: Option<ConnectorStats>,
    runtime: tokio::runtime::Runtime,
}

impl ConnectorHandle {
    /// Starts the actor system and returns the handle.
    ///
    /// # Errors
    /// [`StartError`] when the configuration is refused ([`Config::validate`]), or devices,
    /// keys or the actor thread cannot be set up.
    ///
    /// [`Config::validate`]: crate::config::Config::validate
    pub fn start(params: ConnectorParams) -> Result<Self, StartError> {
        let (lookups_tx, lookups) = flume::bounded(ENGINE_INBOX_CAPACITY);
        let (loads_tx, loads) = flume::bounded(ENGINE_INBOX_CAPACITY);
        let (saves_tx, saves) = flume::bounded(ENGINE_INBOX_CAPACITY);
        let inbox = EngineInbox {
            lookups: lookups_tx,
            loads: loads_tx,
            saves: saves_tx,
        };
        // Validated once, here: everything below takes the typed values as they are.
        let config = params.config.validate()?;
        let instance = match params.config.stats.instance.as_str() {
            "" => "0".to_owned(),
            named => named.to_owned(),
        };
        let groups = save_groups(&params.layout);
        let saves_replicated = params.share.saves_replicated();
        let tokens_per_block = params.layout.tokens_per_block as usize;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|_| StartError::Thread)?;
        let (
            Started {
                planner,
                manager,
                savers,
                reporter,
                keys,
                system,
                staging,
            },
            thread,
        ) = start_actors(params, config.clone(), inbox)?;
        let ranks = savers.len();
        let recipients = ActorRecipients {
            planner,
            manager,
            savers,
        };
        let timing = CourierTiming::of(&config.handoff);
        let Ok(courier) = Courier::start(recipients, config.handoff.outbox_capacity, timing) else {
            system.stop();
            let _ = thread.join();
            return Err(StartError::Thread);
        };
        Ok(ConnectorHandle {
            courier,
            ranks,
            saves_replicated,
            reporter,
            keys,
            system,
            thread: Some(thread),
            staging,
            lookups,
            loads,
            saves,
            finished_loads: Vec::new(),
            unsent_lookups: Vec::new(),
            lookups_refused: false,
            last_ticket: LookupTicket::default(),
            step_loads: Vec::new(),
            step_saves: Vec::new(),
            requests: HashMap::new(),
            saves_done: Vec::new(),
            discarded: Vec::new(),
            ended: Vec::new(),
            save_ranges: Vec::new(),
            groups,
            tokens_per_block,
            rewind_tokens: config.planner.rewind_tokens,
            resave_min_tokens: config.saver.resave_min_tokens,
            checkpoint_tokens: config.saver.window_checkpoint_tokens,
            sync_load: config.loaders.sync_load,
            saves_refused: 0,
            published_past_chunk_end: 0,
            checkpoint_pages_planned: 0,
            lookups_deferred: 0,
            loads_asked: 0,
            loads_sent: 0,
            loads_in_flight: 0,
            drain_timeout: config.saver.shutdown_drain_timeout,
            instance,
            final_stats: None,
            runtime,
        })
    }

    /// The fingerprinted key space (for tools that print where pages live).
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// Drops a request's record, keeping its lookup result for the courier to free; the
    /// savers hear of it with the next save batches.
    fn forget(&mut self, request: RequestId) {
        self.ended.push(request);
        if let Some(RequestState {
            lookup: Some(answer),
            ..
        }) = self.requests.remove(&request)
        {
            self.discarded.push(answer);
        }
    }

    /// Hands the forgotten lookup results to the courier, which frees them.
    fn discard_forgotten(&mut self) {
        if !self.discarded.is_empty() {
            let discarded = std::mem::take(&mut self.discarded);
            self.hand_off(Outgoing::Discard(discarded));
        }
    }
}

fn save_groups(layout: &Layout) -> Vec<SaveGroup> {
    layout
        .groups
        .iter()
        .map(|group| SaveGroup {
            attention: group.attention(),
            replicated: group.replicated,
        })
        .collect()
}

impl Drop for ConnectorHandle {
    /// A handle dropped without `shutdown` still stops its actors (queued saves are lost).
    fn drop(&mut self) {
        self.stop();
    }
}

impl EngineConnector for ConnectorHandle {
    fn lookup_prefix(
        &mut self,
        request: RequestId,
        prompt: Arc<[i64]>,
        local_match_tokens: usize,
    ) -> Result<(), HookError> {
        self.lookup_prefix_in_scope(request, prompt, local_match_tokens, RequestScope::default())
    }

    fn lookup_prefix_in_scope(
        &mut self,
        request: RequestId,
        prompt: Arc<[i64]>,
        local_match_tokens: usize,
        scope: RequestScope,
    ) -> Result<(), HookError> {
        self.lookup_prompt(request, Prompt::from(prompt), local_match_tokens, scope)
    }

    fn flush_lookups(&mut self) {
        self.flush_queued_lookups();
    }

    fn reserve_prefix(
        &mut self,
        request: RequestId,
        num_computed: usize,
        reservation: ReservationId,
    ) -> ReserveAnswer {
        // A new reservation replaces one whose load may still run: its pages go back (R29).
        self.take_back_load(request, Some(reservation));
        self.drain_lookups();
        self.drain_returns();
        if self.lookups_refused {
            self.flush_queued_lookups();
        }
        let nothing = ReserveAnswer::Offer {
            extra_tokens: 0,
            is_async: false,
        };
        let Some(state) = self.requests.get_mut(&request) else {
            return nothing;
        };
        let answer = match &state.lookup {
            None => return ReserveAnswer::Pending,
            Some(_) if state.disputed => nothing,
            // The plan was made for the local match given to `lookup_prefix`; an engine
            // whose `num_computed` differs gets nothing rather than a load that would write
            // below its computed tokens or skip blocks above them.
            Some((Some(plan), _))
                if plan.outcome.offers()
                    && plan.local_match_tokens == num_computed
                    && plan.resume_tokens > num_computed =>
            {
                ReserveAnswer::Offer {
                    extra_tokens: plan.resume_tokens - num_computed,
                    is_async: !self.sync_load,
                }
            }
            Some(_) => nothing,
        };
        // Only the latest offer may be reported as a new reservation (`check_step`).
        state.offered = (answer != nothing).then_some(reservation);
        answer
    }

    fn release_prefix_reservation(
        &mut self,
        request: RequestId,
        reservation: ReservationId,
        start: usize,
        end: usize,
    ) {
        // The loaders stop writing the released pages before this returns (R29); the
        // ledger frees them when the message arrives.
        self.release_load_pages(request, reservation, start as u64..end as u64);
        self.hand_off(Outgoing::Release(ReleaseReservation {
            reservation,
            start: start as u64,
            end: end as u64,
        }));
    }

    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
        self.flush_queued_lookups();
        self.drain_returns();
        while let Ok(answer) = self.loads.try_recv() {
            self.accept_load(answer);
        }
        std::mem::take(&mut self.finished_loads)
    }

    fn on_step(&mut self, output: &SchedulerOutput<'_>) {
        self.flush_queued_lookups();
        self.drain_lookups();
        self.drain_returns();
        let now = Instant::now();
        // The list is kept between steps (no allocation per step); the batches go out.
        let mut per_rank = std::mem::take(&mut self.step_saves);
        let (pages, runs) = self.save_batch_capacity(output);
        per_rank.extend((0..self.ranks).map(|_| EnqueueSave::with_capacity(now, pages, runs)));
        let new_loads = output
            .requests
            .iter()
            .filter(|scheduled| scheduled.new_reservation.is_some())
            .count();
        self.step_loads.reserve_exact(new_loads);
        for scheduled in &output.requests {
            if let Some(reservation) = scheduled.new_reservation {
                self.plan_load(scheduled, reservation);
            }
            if scheduled.computed_after > scheduled.computed_before {
                self.plan_saves(scheduled, &mut per_rank);
            }
        }
        self.send_loads();
        self.send_saves(&mut per_rank);
        self.step_saves = per_rank;
    }

    fn request_finished(&mut self, request: RequestId) -> bool {
        // The engine frees the request's pages after this: a load still running for it
        // writes none of them any more (R29).
        self.take_back_load(request, None);
        self.drain_returns();
        self.drain_saves();
        let keep = self
            .requests
            .get(&request)
            .is_some_and(|state| state.pending_saves > 0);
        if keep {
            if let Some(state) = self.requests.get_mut(&request) {
                state.finished = true;
            }
        } else {
            self.forget(request);
            self.discard_forgotten();
        }
        keep
    }

    fn get_finished_saves(&mut self) -> Vec<RequestId> {
        self.flush_queued_lookups();
        self.drain_returns();
        self.drain_saves();
        let mut done = std::mem::take(&mut self.saves_done);
        // A request enters `saves_done` once, when its last pending save settles after
        // it finished; the check keeps the answer exact even so.
        done.retain(|request| {
            self.requests
                .get(request)
                .is_some_and(|state| state.finished && state.pending_saves == 0)
        });
        for &request in &done {
            self.forget(request);
        }
        self.discard_forgotten();
        done
    }

    fn wait_for_progress(&mut self, timeout: Duration) {
        self.flush_queued_lookups();
        let deadline = Instant::now().checked_add(timeout);
        if let Some(event) = self.wait_event(None, deadline) {
            self.accept_event(event);
        }
    }

    fn settle_saves(&mut self) {
        self.flush_queued_lookups();
        for rank in 0..self.ranks {
            let (done, settled) = flume::bounded(1);
            let message = SettleSaves { done };
            // A request that could not be handed off drops `done`: the wait ends at once.
            self.hand_off_control(Outgoing::Settle { rank, message }, None);
            self.wait_settled(&settled, None);
        }
        // Settlements sent before the answers are in the channel now.
        self.drain_saves();
    }
}
