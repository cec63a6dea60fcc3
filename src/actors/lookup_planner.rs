//! The lookup planner actor: runs each new prompt's lookup and sends the plan to the
//! engine (R10-R15).
//!
//! A thin shell: the handler only starts the work, [`crate::transfer::lookup`]'s
//! procedure (hashing, probe rounds in concurrent chunks), on tokio's blocking pool (pool
//! probes block), several lookups at once; the pure state machine
//! [`crate::core::planner::Lookup`] decides what to probe and what to offer. The actor
//! owns the counters and the answer to the engine.
//! Mailbox: `planner.mailbox_capacity`; the engine's handle reaches it through the
//! courier (`try_send`), and a full mailbox defers the lookups to the handle's next flush
//! point.
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
use crate::transfer::lookup::{run_lookup, LookupResult};

/// The lookup planner actor.
pub struct LookupPlanner {
    pool: Arc<dyn Pool>,
    keys: Arc<KeySpace>,
    settings: Arc<PlannerSettings>,
    inbox: EngineInbox,
    mailbox_capacity: usize,
    stats: LookupStats,
}

impl LookupPlanner {
    /// Builds the planner.
    pub fn new(
        pool: Arc<dyn Pool>,
        keys: Arc<KeySpace>,
        settings: PlannerSettings,
        inbox: EngineInbox,
        mailbox_capacity: usize,
    ) -> Self {
        LookupPlanner {
            pool,
            keys,
            settings: Arc::new(settings),
            inbox,
            mailbox_capacity,
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
        self.start_supervised(message, ctx);
    }
}

impl Handler<LookupPrefixes> for LookupPlanner {
    type Result = ();

    fn handle(&mut self, message: LookupPrefixes, ctx: &mut Self::Context) {
        for lookup in message.lookups {
            self.start_supervised(lookup, ctx);
        }
    }
}

impl LookupPlanner {
    /// Starts one lookup; one that panics is answered with nothing (module docs).
    fn start_supervised(&mut self, message: LookupPrefix, ctx: &mut Context<Self>) {
        let (request, ticket) = (message.request, message.ticket);
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
            run_lookup(
                pool.as_ref(),
                &keys,
                &settings,
                &message.prompt,
                message.local_match_tokens,
            )
        });
        ctx.spawn(work.into_actor(self).map(move |joined, actor, ctx| {
            let result = joined.unwrap_or_else(|_| LookupResult::failed());
            actor.answer(result, asked, ctx);
        }));
    }

    /// Counts a finished lookup and sends its result to the engine.
    fn answer(
        &mut self,
        result: LookupResult,
        (request, ticket): (RequestId, LookupTicket),
        ctx: &mut Context<Self>,
    ) {
        self.count(&result);
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
