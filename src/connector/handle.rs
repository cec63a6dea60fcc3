//! [`ConnectorHandle`]: the real connector behind the engine hooks. It runs on the
//! engine's thread and only sends messages (`try_send`) and drains bounded channels; the
//! actor system does the I/O.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;

use super::save_plan::{blocks_to_save, SaveStep};
use super::start::{start_actors, ConnectorParams, StagingRegistrations, StartError, Started};
use super::{EngineConnector, FinishedLoad, ReserveAnswer, ScheduledRequest, SchedulerOutput};
use crate::actors::keyspace::KeySpace;
use crate::actors::lookup_planner::LookupPlanner;
use crate::actors::reservation_manager::ReservationManager;
use crate::actors::saver_queue::SaverQueue;
use crate::actors::stats_reporter::StatsReporter;
use crate::core::hash::BlockHash;
use crate::core::ids::{PageIndex, RequestId, ReservationId};
use crate::core::layout::{Attention, Layout};
use crate::core::planner::LookupPlan;
use crate::core::save_order::{SaveItem, SavePriority};
use crate::messages::lookup_planner::LookupPrefix;
use crate::messages::reservation_manager::{ReleaseReservation, StartLoad};
use crate::messages::saver_queue::{EnqueueSave, SettleSaves};
use crate::messages::stats_reporter::CollectNow;
use crate::messages::{EngineInbox, LookupCompleted, SavesSettled};
use crate::stats::ConnectorStats;

/// Capacity of each engine inbox channel: results wait here until the next step drains them.
const ENGINE_INBOX_CAPACITY: usize = 4096;

/// A finished lookup: its plan (`None` when it failed) and the prompt's chain hashes.
type LookupAnswer = (Option<Arc<LookupPlan>>, Arc<[BlockHash]>);

/// The handle's record of one request.
#[derive(Debug, Default)]
struct RequestState {
    lookup: Option<LookupAnswer>,
    /// A lookup the planner's full mailbox refused: retried at every `reserve_prefix`
    /// (which answers `Pending` meanwhile), so no request goes without its hashes and
    /// therefore without its saves.
    unsent_lookup: Option<LookupPrefix>,
    /// Tokens that came from the pool or the local match: never saved again (R19).
    reused_until: usize,
    pending_saves: u64,
    finished: bool,
    window_saved: bool,
}

/// A layer group as the handle needs it for saves.
#[derive(Clone, Copy, Debug)]
struct SaveGroup {
    attention: Attention,
    replicated: bool,
}

/// The connector of one serving instance.
pub struct ConnectorHandle {
    planner: Addr<LookupPlanner>,
    manager: Addr<ReservationManager>,
    savers: Vec<Addr<SaverQueue>>,
    reporter: Addr<StatsReporter>,
    keys: Arc<KeySpace>,
    system: actix::System,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The staging pools registered with the pool; released once the actors have stopped.
    staging: StagingRegistrations,
    lookups: flume::Receiver<LookupCompleted>,
    loads: flume::Receiver<FinishedLoad>,
    saves: flume::Receiver<SavesSettled>,
    finished_loads: Vec<FinishedLoad>,
    requests: HashMap<RequestId, RequestState>,
    groups: Vec<SaveGroup>,
    tokens_per_block: usize,
    rewind_tokens: usize,
    resave_min_tokens: usize,
    sync_load: bool,
    /// Pages refused by a full saver mailbox (R22), counted here.
    saves_refused: u64,
    /// Lookups a full planner mailbox deferred to a later step.
    lookups_deferred: u64,
    runtime: tokio::runtime::Runtime,
}

impl ConnectorHandle {
    /// Starts the actor system and returns the handle.
    ///
    /// # Errors
    /// [`StartError`] when devices, keys or the actor thread cannot be set up.
    pub fn start(params: ConnectorParams) -> Result<Self, StartError> {
        let (lookups_tx, lookups) = flume::bounded(ENGINE_INBOX_CAPACITY);
        let (loads_tx, loads) = flume::bounded(ENGINE_INBOX_CAPACITY);
        let (saves_tx, saves) = flume::bounded(ENGINE_INBOX_CAPACITY);
        let inbox = EngineInbox {
            lookups: lookups_tx,
            loads: loads_tx,
            saves: saves_tx,
        };
        let groups = save_groups(&params.layout);
        let tokens_per_block = params.layout.tokens_per_block as usize;
        let rewind_tokens =
            usize::try_from(params.config.planner.swa_endpoint_rewind_tokens).unwrap_or(usize::MAX);
        let sync_load = params.config.loaders.sync_load;
        let resave_min_tokens =
            usize::try_from(params.config.saver.resave_min_tokens).unwrap_or(usize::MAX);
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
        ) = start_actors(params, inbox)?;
        Ok(ConnectorHandle {
            planner,
            manager,
            savers,
            reporter,
            keys,
            system,
            thread: Some(thread),
            staging,
            lookups,
            loads,
            saves,
            finished_loads: Vec::new(),
            requests: HashMap::new(),
            groups,
            tokens_per_block,
            rewind_tokens,
            resave_min_tokens,
            sync_load,
            saves_refused: 0,
            lookups_deferred: 0,
            runtime,
        })
    }

    /// The fingerprinted key space (for tools that print where pages live).
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// Everything counted since start (blocks briefly for the actors' answers).
    pub fn stats(&self) -> ConnectorStats {
        let mut stats = self
            .runtime
            .block_on(self.reporter.send(CollectNow))
            .unwrap_or_default();
        stats.saves.saves_dropped += self.saves_refused;
        stats.lookups.deferred += self.lookups_deferred;
        stats
    }

    /// A handle on this connector's statistics that another thread (the metrics endpoint)
    /// can query without going through the engine thread. It does not see the two counts
    /// kept on the engine thread (mailbox-refused saves, deferred lookups).
    pub fn stats_source(&self) -> crate::metrics::StatsSource {
        crate::metrics::StatsSource::new(self.reporter.clone())
    }

    /// Settles saves, collects the final report and stops the actor system.
    pub fn shutdown(mut self) -> ConnectorStats {
        self.settle_saves();
        let stats = self.stats();
        self.stop();
        tracing::info!(
            lookups = stats.lookups.lookups(),
            loads_done = stats.loads.loads_done,
            saves_done = stats.saves.saves_done,
            "connector stopped"
        );
        stats
    }

    /// Stops the actor system, joins its thread and unregisters the staging pools from
    /// the pool (idempotent).
    fn stop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.system.stop();
            if thread.join().is_err() {
                tracing::error!("the actor system thread panicked");
            }
        }
        self.staging.release();
    }

    /// Sends a request's lookup if it has not gone out yet. A full mailbox keeps it for the
    /// next attempt; a planner that is gone ends the lookup with nothing offered.
    fn send_lookup(&mut self, request: RequestId) {
        let Some(state) = self.requests.get_mut(&request) else {
            return;
        };
        let Some(message) = state.unsent_lookup.take() else {
            return;
        };
        match self.planner.try_send(message) {
            Ok(()) => {}
            Err(actix::prelude::SendError::Full(message)) => {
                self.lookups_deferred += 1;
                state.unsent_lookup = Some(message);
            }
            Err(actix::prelude::SendError::Closed(_)) => {
                tracing::error!(%request, "lookup planner gone; nothing offered, nothing saved");
                state.lookup = Some((None, Arc::from(Vec::new())));
            }
        }
    }

    fn drain_lookups(&mut self) {
        while let Ok(done) = self.lookups.try_recv() {
            self.accept_lookup(done);
        }
    }

    fn accept_lookup(&mut self, done: LookupCompleted) {
        if let Some(state) = self.requests.get_mut(&done.request) {
            state.lookup = Some((done.plan.map(Arc::new), done.hashes));
        }
    }

    fn drain_saves(&mut self) {
        while let Ok(settled) = self.saves.try_recv() {
            self.accept_settled(settled);
        }
    }

    fn accept_settled(&mut self, settled: SavesSettled) {
        if let Some(state) = self.requests.get_mut(&settled.request) {
            state.pending_saves = state.pending_saves.saturating_sub(settled.pages);
        }
    }

    /// Starts the load of a reservation whose pages the engine allocated this step.
    fn start_load(&mut self, scheduled: &ScheduledRequest<'_>, reservation: ReservationId) {
        let request = scheduled.request;
        let failed = FinishedLoad {
            reservation,
            request,
            filled: false,
        };
        let Some(state) = self.requests.get_mut(&request) else {
            return self.finished_loads.push(failed);
        };
        let Some((Some(plan), hashes)) = &state.lookup else {
            return self.finished_loads.push(failed);
        };
        // Only the page indices are copied here (4 bytes a block); the reservation manager
        // pairs them with blocks and hashes off the engine thread.
        let mut pages = Vec::with_capacity(plan.load_blocks());
        for load in &plan.loads {
            let Some(position) = self.keys.index_of(load.group) else {
                return self.finished_loads.push(failed);
            };
            let table = scheduled.page_tables.get(position).copied().unwrap_or(&[]);
            for &block in &load.blocks {
                let page = table
                    .get(block)
                    .copied()
                    .and_then(|page| u32::try_from(page).ok());
                let (Some(page), true) = (page, block < hashes.len()) else {
                    return self.finished_loads.push(failed);
                };
                pages.push(page);
            }
        }
        state.reused_until = plan.resume_tokens;
        let message = StartLoad {
            request,
            reservation,
            tokens: scheduled.computed_before as u64..plan.resume_tokens as u64,
            plan: Arc::clone(plan),
            hashes: Arc::clone(hashes),
            pages,
            enqueued_at: Instant::now(),
        };
        if self.manager.try_send(message).is_err() {
            tracing::warn!(%request, %reservation, "reservation manager full or gone; load failed");
            self.finished_loads.push(failed);
        } else if self.sync_load {
            self.wait_for_load(reservation);
        }
    }

    /// `sync_load`: blocks until the reservation's load is reported (R23).
    fn wait_for_load(&mut self, reservation: ReservationId) {
        while let Ok(finished) = self.loads.recv() {
            let done = finished.reservation == reservation;
            self.finished_loads.push(finished);
            if done {
                return;
            }
        }
    }

    /// Plans the saves of one scheduled request (R16-R21, see `save_plan`) into the step's
    /// per-rank batches (replicated groups on rank 0 only).
    fn plan_saves(
        &mut self,
        scheduled: &ScheduledRequest<'_>,
        per_rank: &mut [Vec<(SaveItem, SavePriority)>],
    ) {
        let Some(state) = self.requests.get_mut(&scheduled.request) else {
            return;
        };
        let Some((_, hashes)) = &state.lookup else {
            return;
        };
        let hashes = Arc::clone(hashes);
        let last_chunk = scheduled.computed_after >= scheduled.prompt_len && !state.window_saved;
        state.window_saved |= last_chunk;
        let step = SaveStep {
            tokens_per_block: self.tokens_per_block,
            prompt_len: scheduled.prompt_len,
            computed_before: scheduled.computed_before,
            computed_after: scheduled.computed_after,
            reused_until: state.reused_until,
            hashed_blocks: hashes.len(),
            last_chunk,
            rewind_tokens: self.rewind_tokens,
            resave_min_tokens: self.resave_min_tokens,
        };
        for (position, group) in self.groups.iter().enumerate() {
            let (Some(keys), Some(table)) = (
                self.keys.group(position),
                scheduled.page_tables.get(position),
            ) else {
                continue;
            };
            for (block, priority) in blocks_to_save(group.attention, &step) {
                let Some(page) = table
                    .get(block)
                    .copied()
                    .and_then(|page| u32::try_from(page).ok())
                else {
                    continue;
                };
                let item = SaveItem {
                    request: scheduled.request,
                    group: keys.group,
                    block_index: block as u64,
                    page: PageIndex(page),
                    hash: hashes[block],
                };
                for (rank, items) in per_rank.iter_mut().enumerate() {
                    if rank == 0 || !group.replicated {
                        items.push((item, priority));
                    }
                }
            }
        }
    }

    /// Sends one step's saves: one message per rank, so a step costs each saver one
    /// wake-up however many requests it covers. Pages a full mailbox refuses are counted
    /// dropped and never become pending (R22).
    fn send_saves(&mut self, per_rank: Vec<Vec<(SaveItem, SavePriority)>>) {
        for (saver, items) in self.savers.iter().zip(per_rank) {
            if items.is_empty() {
                continue;
            }
            let mut pages: Vec<(RequestId, u64)> = Vec::new();
            for (item, _) in &items {
                match pages.last_mut() {
                    Some((request, count)) if *request == item.request => *count += 1,
                    _ => pages.push((item.request, 1)),
                }
            }
            if saver
                .try_send(EnqueueSave {
                    items,
                    enqueued_at: Instant::now(),
                })
                .is_err()
            {
                self.saves_refused += pages.iter().map(|(_, count)| count).sum::<u64>();
                continue;
            }
            for (request, count) in pages {
                if let Some(state) = self.requests.get_mut(&request) {
                    state.pending_saves += count;
                }
            }
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
    fn lookup_prefix(&mut self, request: RequestId, prompt: Arc<[i64]>, local_match_tokens: usize) {
        let message = LookupPrefix {
            request,
            prompt,
            local_match_tokens,
            enqueued_at: Instant::now(),
        };
        let state = self.requests.entry(request).or_default();
        state.reused_until = local_match_tokens;
        state.unsent_lookup = Some(message);
        self.send_lookup(request);
    }

    fn reserve_prefix(
        &mut self,
        request: RequestId,
        num_computed: usize,
        _reservation: ReservationId,
    ) -> ReserveAnswer {
        self.drain_lookups();
        self.send_lookup(request);
        let Some(state) = self.requests.get(&request) else {
            return ReserveAnswer::Offer {
                extra_tokens: 0,
                is_async: false,
            };
        };
        match &state.lookup {
            None => ReserveAnswer::Pending,
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
            Some(_) => ReserveAnswer::Offer {
                extra_tokens: 0,
                is_async: false,
            },
        }
    }

    fn release_prefix_reservation(
        &mut self,
        _request: RequestId,
        reservation: ReservationId,
        start: usize,
        end: usize,
    ) {
        let message = ReleaseReservation {
            reservation,
            start: start as u64,
            end: end as u64,
        };
        if self.manager.try_send(message).is_err() {
            tracing::debug!(%reservation, "reservation manager full or gone; release not recorded");
        }
    }

    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
        self.finished_loads.extend(self.loads.try_iter());
        std::mem::take(&mut self.finished_loads)
    }

    fn on_step(&mut self, output: &SchedulerOutput<'_>) {
        self.drain_lookups();
        let mut per_rank: Vec<Vec<(SaveItem, SavePriority)>> = vec![Vec::new(); self.savers.len()];
        for scheduled in &output.requests {
            if let Some(reservation) = scheduled.new_reservation {
                self.start_load(scheduled, reservation);
            }
            if scheduled.computed_after > scheduled.computed_before {
                self.plan_saves(scheduled, &mut per_rank);
            }
        }
        self.send_saves(per_rank);
    }

    fn request_finished(&mut self, request: RequestId) -> bool {
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
            self.requests.remove(&request);
        }
        keep
    }

    fn get_finished_saves(&mut self) -> Vec<RequestId> {
        self.drain_saves();
        let done: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, state)| state.finished && state.pending_saves == 0)
            .map(|(id, _)| *id)
            .collect();
        for request in &done {
            self.requests.remove(request);
        }
        done
    }

    fn wait_for_progress(&mut self, timeout: Duration) {
        enum Event {
            Lookup(LookupCompleted),
            Load(FinishedLoad),
            Save(SavesSettled),
            Closed,
        }
        let event = flume::Selector::new()
            .recv(&self.lookups, |message| {
                message.map_or(Event::Closed, Event::Lookup)
            })
            .recv(&self.loads, |message| {
                message.map_or(Event::Closed, Event::Load)
            })
            .recv(&self.saves, |message| {
                message.map_or(Event::Closed, Event::Save)
            })
            .wait_timeout(timeout);
        match event {
            Ok(Event::Lookup(done)) => self.accept_lookup(done),
            Ok(Event::Load(finished)) => self.finished_loads.push(finished),
            Ok(Event::Save(settled)) => self.accept_settled(settled),
            Ok(Event::Closed) | Err(_) => {}
        }
    }

    fn settle_saves(&mut self) {
        enum Wake {
            Answered,
            Settled(SavesSettled),
        }
        let savers = self.savers.clone();
        for saver in &savers {
            let (done, settled) = flume::bounded(1);
            if saver.try_send(SettleSaves { done }).is_err() {
                continue;
            }
            // Drain settlements while waiting: a saver with a full channel waits for us.
            loop {
                let wake = flume::Selector::new()
                    .recv(&settled, |_| Wake::Answered)
                    .recv(&self.saves, |message| {
                        message.map_or(Wake::Answered, Wake::Settled)
                    })
                    .wait();
                match wake {
                    Wake::Answered => break,
                    Wake::Settled(message) => self.accept_settled(message),
                }
            }
        }
        // Settlements sent before the answers are in the channel now.
        self.drain_saves();
    }
}
