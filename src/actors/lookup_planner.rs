//! The lookup planner actor: runs each new prompt's lookup and sends the plan to the
//! engine (R10-R15).
//!
//! A thin shell: the handler only starts the work, [`crate::transfer::lookup`]'s
//! procedure (hashing, probe rounds in concurrent chunks), on tokio's blocking pool (pool
//! probes block); the pure state machine [`crate::core::planner::Lookup`] decides what to
//! probe and what to offer. The actor owns the counters, the answer to the engine and the
//! lookups in flight.
//! Mailbox: `planner.mailbox_capacity`; the engine's handle reaches it through the
//! courier (`try_send`), and a full mailbox defers the lookups to the handle's next flush
//! point.
//!
//! # Lookups in flight
//!
//! - `lookup_planner::Q1`. At most `planner.max_concurrent_lookups` lookups run at once
//!   (so at most that many lookups' probe threads); later ones wait in the planner's queue,
//!   first come first started, and each ending lookup starts the next.
//! - `lookup_planner::Q2`. The queue holds at most `planner.mailbox_capacity` lookups
//!   (`queue_capacity`); a lookup arriving to a full queue is answered at once with
//!   nothing offered, counted `shed`: its request computes its prompt and never waits, and
//!   the answer still carries the prompt's hashes, so its pages are saved (`arch::I7`).
//!
//! # Outages (R30)
//!
//! A lookup has a deadline (`planner.lookup_timeout_ms` from when its work starts), checked
//! before each probe round, and each probe has its own (`pool.probe_timeout_ms`, kept by
//! the connector's guarded pool). A probe call whose every key answered that the pool is
//! unreachable or late, or a lookup past its deadline, ends the lookup with nothing
//! offered, counted `outage` (never `full_miss`): while the pool is marked unreachable the
//! guard refuses every probe at once, so such lookups answer at once.
//!
//! # Supervision: restart in place
//!
//! The planner's only state is its settings and its interval counters, which a panic cannot
//! leave wrong in a way that matters (a count at worst). A panic while a lookup starts (on
//! the actor's thread) is caught ([`crate::actors::supervisor::catch`]): that lookup is
//! answered with nothing offered (counted `failed`), and the planner serves the next. A
//! panic inside a lookup's work (hashing, probes, planning: on the blocking pool) ends
//! that task, which is answered the same way. Every lookup the planner receives is
//! answered, so no request waits for a lookup forever.

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;

use super::supervisor::catch;
use crate::core::ids::{LookupTicket, RequestId};
use crate::core::keys::KeySpace;
use crate::core::planner::LookupOutcome;
use crate::messages::lookup_planner::{CollectLookupStats, LookupPrefix, LookupPrefixes};
use crate::messages::{EngineInbox, LookupCompleted};
use crate::pool::{actor_fault_fires, ActorFault, Pool};
use crate::stats::LookupStats;
pub use crate::transfer::lookup::PlannerSettings;
use crate::transfer::lookup::{hash_only, run_lookup, LookupResult};

/// The lookup planner actor.
pub struct LookupPlanner {
    pool: Arc<dyn Pool>,
    keys: Arc<KeySpace>,
    settings: Arc<PlannerSettings>,
    inbox: EngineInbox,
    mailbox_capacity: usize,
    /// Lookups running now; at most `max_running` (`lookup_planner::Q1`).
    running: usize,
    max_running: usize,
    /// Lookups waiting for a free slot, oldest first; at most `queue_capacity`
    /// (`lookup_planner::Q2`).
    waiting: VecDeque<LookupPrefix>,
    queue_capacity: usize,
    stats: LookupStats,
}

/// How many lookups the planner runs at once and how many may wait (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannerCapacity {
    /// `planner.mailbox_capacity`: the actor's mailbox (messages) and its queue (lookups).
    pub mailbox: usize,
    /// `planner.max_concurrent_lookups`.
    pub max_concurrent_lookups: usize,
}

impl LookupPlanner {
    /// Builds the planner.
    pub fn new(
        pool: Arc<dyn Pool>,
        keys: Arc<KeySpace>,
        settings: PlannerSettings,
        inbox: EngineInbox,
        capacity: PlannerCapacity,
    ) -> Self {
        LookupPlanner {
            pool,
            keys,
            settings: Arc::new(settings),
            inbox,
            mailbox_capacity: capacity.mailbox.max(1),
            running: 0,
            max_running: capacity.max_concurrent_lookups.max(1),
            waiting: VecDeque::with_capacity(capacity.mailbox.max(1)),
            queue_capacity: capacity.mailbox.max(1),
            stats: LookupStats::default(),
        }
    }

    fn count(&mut self, result: &LookupResult) {
        self.stats.keys_probed += result.keys_probed;
        self.stats.probe_time.record(result.probe_time);
        match &result.plan {
            None if result.lost_to_outage => self.stats.outage += 1,
            None => self.stats.failed += 1,
            Some(plan) => {
                self.stats.tokens_offered += plan.offered_tokens as u64;
                match plan.outcome {
                    LookupOutcome::Full => self.stats.full += 1,
                    LookupOutcome::Rewound => self.stats.rewound += 1,
                    LookupOutcome::Checkpoint => self.stats.checkpoint += 1,
                    LookupOutcome::Recovered => self.stats.recovered += 1,
                    LookupOutcome::WindowMiss => self.stats.window_miss += 1,
                    LookupOutcome::FullMiss => self.stats.full_miss += 1,
                }
            }
        }
    }
}

impl Actor for LookupPlanner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
    }
}

/// Lookups interleave (`ResponseActFuture`-style spawn): state is touched only to count
/// the finished lookup, which needs no ordering between lookups.
impl Handler<LookupPrefix> for LookupPlanner {
    type Result = ();

    fn handle(&mut self, message: LookupPrefix, ctx: &mut Self::Context) {
        self.admit(message, ctx);
    }
}

impl Handler<LookupPrefixes> for LookupPlanner {
    type Result = ();

    fn handle(&mut self, message: LookupPrefixes, ctx: &mut Self::Context) {
        for lookup in message.lookups {
            self.admit(lookup, ctx);
        }
    }
}

impl LookupPlanner {
    /// Starts a lookup if a slot is free, else queues it, else sheds it
    /// (`lookup_planner::Q1`, `lookup_planner::Q2`).
    fn admit(&mut self, message: LookupPrefix, ctx: &mut Context<Self>) {
        if self.running < self.max_running {
            self.start_supervised(message, ctx);
        } else if self.waiting.len() < self.queue_capacity {
            self.waiting.push_back(message);
        } else {
            self.shed(message, ctx);
        }
    }

    /// Answers a lookup past the queue with nothing offered, but with its prompt's hashes
    /// (hashed off the actor's thread, no probes), so its computed pages are still saved.
    fn shed(&mut self, message: LookupPrefix, ctx: &mut Context<Self>) {
        self.stats.shed += 1;
        tracing::debug!(request = %message.request, "lookup planner queue full; lookup shed, nothing offered");
        let settings = Arc::clone(&self.settings);
        let keys = Arc::clone(&self.keys);
        let asked = (message.request, message.ticket);
        let work = tokio::task::spawn_blocking(move || match read(&message) {
            Some(prompt) => hash_only(&settings, &keys, &prompt, &message.scope),
            None => LookupResult::failed(),
        });
        ctx.spawn(work.into_actor(self).map(move |joined, actor, ctx| {
            actor.send(
                joined.unwrap_or_else(|_| LookupResult::failed()),
                asked,
                ctx,
            );
        }));
    }

    /// Starts one lookup; one that panics is answered with nothing (module docs).
    fn start_supervised(&mut self, message: LookupPrefix, ctx: &mut Context<Self>) {
        let (request, ticket) = (message.request, message.ticket);
        self.running += 1;
        if let Err(panicked) = catch(|| self.start_lookup(message, ctx)) {
            tracing::error!(%request, panic = panicked.message(), "lookup planner panicked starting a lookup; nothing offered, planner restarted");
            self.answer(LookupResult::failed(), (request, ticket), ctx);
        }
    }

    /// Runs one lookup off the actor's thread and answers through the engine inbox.
    fn start_lookup(&mut self, message: LookupPrefix, ctx: &mut Context<Self>) {
        assert!(
            !actor_fault_fires(&*self.pool, ActorFault::PlannerPanic),
            "injected fault planner_panic: the lookup planner panicked starting a lookup"
        );
        let pool = Arc::clone(&self.pool);
        let keys = Arc::clone(&self.keys);
        let settings = Arc::clone(&self.settings);
        let asked = (message.request, message.ticket);
        let work = tokio::task::spawn_blocking(move || {
            let Some(prompt) = read(&message) else {
                return LookupResult::failed();
            };
            run_lookup(
                pool.as_ref(),
                &keys,
                &settings,
                &prompt,
                message.local_match_tokens,
                &message.scope,
            )
        });
        ctx.spawn(work.into_actor(self).map(move |joined, actor, ctx| {
            let result = joined.unwrap_or_else(|_| LookupResult::failed());
            actor.answer(result, asked, ctx);
        }));
    }

    /// Counts a finished lookup, sends its result to the engine and starts the next
    /// waiting lookup in its slot.
    fn answer(
        &mut self,
        result: LookupResult,
        asked: (RequestId, LookupTicket),
        ctx: &mut Context<Self>,
    ) {
        self.count(&result);
        self.send(result, asked, ctx);
        self.running = self.running.saturating_sub(1);
        if let Some(next) = self.waiting.pop_front() {
            self.start_supervised(next, ctx);
        }
    }

    /// Sends a lookup's result to the engine.
    fn send(
        &mut self,
        result: LookupResult,
        (request, ticket): (RequestId, LookupTicket),
        ctx: &mut Context<Self>,
    ) {
        let completed = LookupCompleted {
            request,
            ticket,
            plan: result.plan,
            hashes: result.hashes,
        };
        let inbox = self.inbox.clone();
        ctx.spawn(
            async move {
                if inbox.lookups.send_async(completed).await.is_err() {
                    tracing::debug!(%request, "engine handle gone; lookup result dropped");
                }
            }
            .into_actor(self),
        );
    }
}

impl Handler<CollectLookupStats> for LookupPlanner {
    type Result = MessageResult<CollectLookupStats>;

    fn handle(&mut self, _message: CollectLookupStats, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(std::mem::take(&mut self.stats))
    }
}

/// The tokens of a lookup's prompt, read here if the engine deferred them; `None` (logged)
/// when they cannot be read: the lookup then offers and hashes nothing (`prompt::P2`).
fn read(message: &LookupPrefix) -> Option<Arc<[i64]>> {
    match message.prompt.tokens() {
        Ok(tokens) => Some(tokens),
        Err(why) => {
            tracing::warn!(request = %message.request, error = %why, "the prompt could not be read; nothing offered or saved for it");
            None
        }
    }
}
