//! The lookup planner actor: hashes a new prompt, probes the pool in concurrent chunks
//! and sends the plan to the engine (R10-R15).
//!
//! The handler only starts the work: each lookup runs on tokio's blocking pool (pool
//! probes block), several lookups at once; the pure state machine
//! [`crate::core::planner::Lookup`] decides what to probe and what to offer.
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

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use super::supervisor::catch;
use crate::core::hash::{hash_blocks, BlockHash};
use crate::core::ids::{LookupTicket, RequestId};
use crate::core::keys::KeySpace;
use crate::core::layout::Layout;
use crate::core::planner::{Lookup, LookupOutcome, LookupPlan, LookupRequest, PlannerGroup};
use crate::messages::lookup_planner::{CollectLookupStats, LookupPrefix, LookupPrefixes};
use crate::messages::{EngineInbox, LookupCompleted};
use crate::pool::{actor_fault_fires, ActorFault, Pool};
use crate::stats::LookupStats;

/// What every lookup of this deployment shares.
#[derive(Debug)]
pub struct PlannerSettings {
    /// `T`.
    pub tokens_per_block: usize,
    /// The layout's groups as the planner sees them.
    pub groups: Vec<PlannerGroup>,
    /// `R` (R12).
    pub rewind_tokens: usize,
    /// R13.
    pub window_fallback: bool,
    /// `saver.window_checkpoint_tokens` (R28); `None`: off.
    pub checkpoint_tokens: Option<NonZeroUsize>,
    /// Keys per concurrent probe (R10).
    pub probe_chunk_keys: NonZeroUsize,
    /// Scope seed of the chain (R1).
    pub seed: BlockHash,
    /// Deadline of one lookup from when its work starts (R30).
    pub lookup_timeout: std::time::Duration,
}

impl PlannerSettings {
    /// The settings of the validated configuration (`[planner]`, and the checkpoint
    /// interval of `[saver]`) for `layout`, chaining from `seed`.
    pub fn new(
        config: &crate::config::runtime::RuntimeConfig,
        layout: &Layout,
        seed: BlockHash,
    ) -> Self {
        let planner = &config.planner;
        PlannerSettings {
            tokens_per_block: layout.tokens_per_block as usize,
            groups: PlannerGroup::of_layout(layout),
            rewind_tokens: planner.rewind_tokens,
            window_fallback: planner.window_fallback,
            checkpoint_tokens: config.saver.window_checkpoint_tokens,
            probe_chunk_keys: planner.probe_chunk,
            seed,
            lookup_timeout: planner.lookup_timeout,
        }
    }
}

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

/// What one lookup produced.
#[derive(Debug)]
pub struct LookupResult {
    /// The plan, or `None` when the lookup failed.
    pub plan: Option<LookupPlan>,
    /// The prompt's chain hashes.
    pub hashes: Arc<[BlockHash]>,
    /// Keys probed.
    pub keys_probed: u64,
    /// Time spent probing.
    pub probe_time: std::time::Duration,
    /// The lookup offered nothing because the pool was unreachable or a deadline passed
    /// (R30).
    pub lost_to_outage: bool,
}

impl LookupResult {
    fn failed() -> Self {
        LookupResult {
            plan: None,
            hashes: Arc::from(Vec::new()),
            keys_probed: 0,
            probe_time: std::time::Duration::ZERO,
            lost_to_outage: false,
        }
    }
}

/// Hashes the prompt and runs the planner's probe rounds against the pool (blocking).
pub fn run_lookup(
    pool: &dyn Pool,
    keys: &KeySpace,
    settings: &PlannerSettings,
    prompt: &[i64],
    local_match_tokens: usize,
) -> LookupResult {
    let Ok(hashes) = hash_blocks(settings.seed, prompt, settings.tokens_per_block) else {
        return LookupResult::failed();
    };
    let shard_keys = keys
        .groups
        .iter()
        .map(crate::core::keys::GroupKeys::shard_count)
        .max()
        .unwrap_or(1)
        .max(1);
    let request = LookupRequest {
        tokens_per_block: settings.tokens_per_block,
        prompt_tokens: prompt.len(),
        local_match_tokens,
        groups: settings.groups.clone(),
        rewind_tokens: settings.rewind_tokens,
        window_fallback: settings.window_fallback,
        checkpoint_tokens: settings.checkpoint_tokens,
        // A chunk smaller than one item's shard keys still probes one item.
        probe_chunk_items: (settings.probe_chunk_keys.get() / shard_keys).max(1),
    };
    let hashes: Arc<[BlockHash]> = Arc::from(hashes);
    let Ok(mut lookup) = Lookup::new(request) else {
        return LookupResult {
            hashes,
            ..LookupResult::failed()
        };
    };
    let started = Instant::now();
    let mut keys_probed = 0;
    let ended = |keys_probed, lost_to_outage| LookupResult {
        hashes: Arc::clone(&hashes),
        keys_probed,
        probe_time: started.elapsed(),
        plan: None,
        lost_to_outage,
    };
    while let Some(round) = lookup.next_round() {
        if started.elapsed() >= settings.lookup_timeout {
            return ended(keys_probed, true);
        }
        let probed = probe_round(
            pool,
            keys,
            &hashes,
            round.items(),
            settings.probe_chunk_keys,
        );
        keys_probed += probed.keys;
        if probed.pool_gone {
            return ended(keys_probed, true);
        }
        if lookup.record(&round, &probed.present).is_err() {
            return ended(keys_probed, false);
        }
    }
    LookupResult {
        plan: Some(lookup.finish()),
        hashes,
        keys_probed,
        probe_time: started.elapsed(),
        lost_to_outage: false,
    }
}

/// What one probe round found.
struct Probed {
    /// Per item: every shard key present.
    present: Vec<bool>,
    /// Keys probed.
    keys: u64,
    /// Some probe call found the pool unreachable or late for every key (R30).
    pool_gone: bool,
}

/// Probes every shard key of every item, in concurrent chunks of `chunk_keys` keys (R10);
/// an item is present only if all its shard keys are (R3).
fn probe_round(
    pool: &dyn Pool,
    keys: &KeySpace,
    hashes: &[BlockHash],
    items: &[crate::core::planner::ProbeItem],
    chunk_keys: NonZeroUsize,
) -> Probed {
    let mut all_keys: Vec<String> = Vec::new();
    let mut owner: Vec<usize> = Vec::new();
    let mut present = vec![true; items.len()];
    for (index, item) in items.iter().enumerate() {
        let group = keys
            .index_of(item.group)
            .and_then(|position| keys.group(position));
        match (group, hashes.get(item.block)) {
            (Some(group), Some(hash)) => {
                for key in group.all_shard_keys(hash) {
                    all_keys.push(key);
                    owner.push(index);
                }
            }
            _ => present[index] = false,
        }
    }
    let refs: Vec<&str> = all_keys.iter().map(String::as_str).collect();
    let chunk_keys = chunk_keys.get();
    let (answers, pool_gone): (Vec<bool>, bool) = if refs.len() <= chunk_keys {
        present_flags(pool, &refs)
    } else {
        std::thread::scope(|scope| {
            let workers: Vec<_> = refs
                .chunks(chunk_keys)
                .map(|chunk| (chunk.len(), scope.spawn(move || present_flags(pool, chunk))))
                .collect();
            // A probe thread that panicked counts its keys as absent: a miss, never KV.
            let mut answers = Vec::with_capacity(refs.len());
            let mut pool_gone = false;
            for (len, worker) in workers {
                let (flags, gone) = worker.join().unwrap_or_else(|_| (vec![false; len], false));
                answers.extend(flags);
                pool_gone |= gone;
            }
            (answers, pool_gone)
        })
    };
    for (position, index) in owner.iter().enumerate() {
        if !answers.get(position).copied().unwrap_or(false) {
            present[*index] = false;
        }
    }
    Probed {
        present,
        keys: refs.len() as u64,
        pool_gone,
    }
}

/// One `exists` batch as exactly one flag per key (a short answer counts as absent), and
/// whether every key answered that the pool is unreachable or late (R30).
fn present_flags(pool: &dyn Pool, keys: &[&str]) -> (Vec<bool>, bool) {
    let answers = pool.exists(keys);
    let pool_gone = !answers.is_empty()
        && answers.iter().all(|answer| {
            answer
                .as_ref()
                .is_err_and(crate::pool::PoolError::is_outage)
        });
    let mut flags: Vec<bool> = answers
        .into_iter()
        .map(|answer| matches!(answer, Ok(true)))
        .collect();
    flags.resize(keys.len(), false);
    (flags, pool_gone)
}
