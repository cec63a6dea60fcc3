//! Actor tests in a real actix System on the test's own runtime, with tokio's paused
//! clock: the lookup planner answers through the engine inbox, and the stats reporter
//! collects every `stats.interval_s` (R27) without any real waiting.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kv_connector::actors::lookup_planner::{LookupPlanner, PlannerCapacity, PlannerSettings};
use kv_connector::actors::reservation_manager::ReservationManager;
use kv_connector::actors::stats_reporter::StatsReporter;
use kv_connector::config::Config;
use kv_connector::core::hash::{hash_blocks, scope_seed, Scope};
use kv_connector::core::ids::{LookupTicket, RequestId};
use kv_connector::core::keys::KeySpace;
use kv_connector::core::layout::{Attention, Layout};
use kv_connector::core::ledger::Ledger;
use kv_connector::core::planner::{LookupOutcome, PlannerGroup};
use kv_connector::messages::lookup_planner::{CollectLookupStats, LookupPrefix, LookupPrefixes};
use kv_connector::messages::stats_reporter::CollectNow;
use kv_connector::messages::EngineInbox;
use kv_connector::pool::{ActorFaults, GuardSettings, GuardedPool, ManualClock, MemoryPool, Pool};

mod common;

use common::TestPool;

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Rig {
    planner: Addr<LookupPlanner>,
    manager: Addr<ReservationManager>,
    pool: Arc<MemoryPool>,
    keys: Arc<KeySpace>,
    lookups: flume::Receiver<kv_connector::messages::LookupCompleted>,
    prompt: Arc<[i64]>,
}

fn memory_pool() -> Result<Arc<MemoryPool>, Box<dyn std::error::Error>> {
    let policy = kv_connector::core::eviction::EvictionPolicy::mooncake_defaults(1 << 20);
    Ok(Arc::new(MemoryPool::new(
        policy,
        Arc::new(ManualClock::new(0)),
    )?))
}

fn rig() -> Result<Rig, Box<dyn std::error::Error>> {
    let pool = memory_pool()?;
    let capacity = PlannerCapacity {
        mailbox: 8,
        max_concurrent_lookups: 2,
    };
    rig_on(&(Arc::clone(&pool) as Arc<dyn Pool>), pool, capacity)
}

/// A rig whose planner and manager use `pool_dyn` (which stores into `pool`).
fn rig_on(
    pool_dyn: &Arc<dyn Pool>,
    pool: Arc<MemoryPool>,
    capacity: PlannerCapacity,
) -> Result<Rig, Box<dyn std::error::Error>> {
    let layout = Layout::preset("tiny-full")?;
    let keys = Arc::new(KeySpace::new(&layout, "ns", "m", &[64])?);
    let (lookups_tx, lookups) = flume::bounded(16);
    let (loads_tx, _loads) = flume::bounded(16);
    let (saves_tx, _saves) = flume::bounded(16);
    let inbox = EngineInbox {
        lookups: lookups_tx,
        loads: loads_tx,
        saves: saves_tx,
    };
    let settings = PlannerSettings {
        tokens_per_block: 16,
        groups: vec![PlannerGroup {
            id: layout.groups[0].id,
            attention: Attention::FULL,
        }],
        rewind_tokens: 0,
        window_fallback: true,
        checkpoint_tokens: None,
        probe_chunk_keys: NonZeroUsize::new(4).ok_or("a chunk of 4 keys")?,
        seed: scope_seed(&Scope::default()),
        // Far above any healthy lookup: held probes must not end their lookups as outages.
        lookup_timeout: Duration::from_secs(3600),
    };
    let planner = LookupPlanner::new(
        Arc::clone(pool_dyn),
        Arc::clone(&keys),
        settings,
        inbox.clone(),
        capacity,
    )
    .start();
    let ledger = Ledger::new(16, [(layout.groups[0].id, 8)])?;
    let manager = ReservationManager::new(
        ledger,
        Arc::clone(&keys),
        inbox,
        8,
        ActorFaults::of(pool_dyn),
    )
    .start();
    let prompt: Arc<[i64]> = (0..=16 * 5).collect::<Vec<i64>>().into();
    Ok(Rig {
        planner,
        manager,
        pool,
        keys,
        lookups,
        prompt,
    })
}

impl Rig {
    /// Stores a placeholder object under every full block's key.
    fn store_prompt(&self) -> TestResult {
        let hashes = hash_blocks(scope_seed(&Scope::default()), &self.prompt, 16)?;
        let group = self.keys.group(0).ok_or("group 0")?;
        let keys: Vec<String> = hashes.iter().map(|hash| group.key(0, hash)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values: Vec<&[u8]> = refs.iter().map(|_| &b"x"[..]).collect();
        for result in self.pool.put(&refs, &values) {
            result?;
        }
        Ok(())
    }

    async fn lookup(&self, request: u64) -> Result<LookupOutcome, Box<dyn std::error::Error>> {
        let message = LookupPrefix {
            request: RequestId(request),
            ticket: LookupTicket(request + 100),
            prompt: Arc::clone(&self.prompt).into(),
            local_match_tokens: 0,
            scope: kv_connector::RequestScope::default(),
            enqueued_at: Instant::now(),
        };
        self.planner.send(message).await?;
        let completed = self.lookups.recv_async().await?;
        assert_eq!(completed.request, RequestId(request));
        assert_eq!(
            completed.ticket,
            LookupTicket(request + 100),
            "the ticket is echoed"
        );
        Ok(completed.plan.ok_or("lookup failed")?.outcome)
    }
}

/// R10, R11: the planner actor probes the pool and answers through the engine inbox; the
/// block holding the last prompt token is never offered.
#[actix::test]
async fn the_planner_answers_through_the_engine_inbox() -> TestResult {
    let rig = rig()?;
    assert_eq!(rig.lookup(1).await?, LookupOutcome::FullMiss);
    rig.store_prompt()?;
    assert_eq!(rig.lookup(2).await?, LookupOutcome::Full);
    let stats = rig.planner.send(CollectLookupStats).await?;
    assert_eq!(
        (stats.full_miss, stats.full, stats.tokens_offered),
        (1, 1, 5 * 16)
    );
    Ok(())
}

/// `prompt::P1`, `prompt::P2`: a prompt the planner reads itself is looked up like its
/// tokens; one that cannot be read is answered with nothing offered and nothing hashed.
#[actix::test]
async fn a_prompt_read_by_the_planner_is_looked_up_like_its_tokens() -> TestResult {
    let rig = rig()?;
    rig.store_prompt()?;
    let snapshot = Arc::clone(&rig.prompt);
    let readable = kv_connector::Prompt::read_later(move || Ok(snapshot));
    let unreadable = kv_connector::Prompt::read_later(|| Err("item 7 is not an int".into()));
    for (request, prompt) in [(1, readable), (2, unreadable)] {
        let message = LookupPrefix {
            request: RequestId(request),
            ticket: LookupTicket(request),
            prompt,
            local_match_tokens: 0,
            scope: kv_connector::RequestScope::default(),
            enqueued_at: Instant::now(),
        };
        rig.planner.send(message).await?;
    }
    let mut answers = Vec::new();
    for _ in 0..2 {
        let completed = rig.lookups.recv_async().await?;
        let outcome = completed.plan.map(|plan| plan.outcome);
        answers.push((completed.request.0, outcome, completed.hashes.chain().len()));
    }
    answers.sort_by_key(|answer| answer.0);
    assert_eq!(
        answers,
        vec![(1, Some(LookupOutcome::Full), 5), (2, None, 0)]
    );
    Ok(())
}

/// One `LookupPrefixes` (the lookups of one admission pass) is answered once per lookup,
/// each with its own request's result, and counted like single lookups.
#[actix::test]
async fn a_batch_of_lookups_is_answered_once_per_lookup() -> TestResult {
    let rig = rig()?;
    rig.store_prompt()?;
    let other: Arc<[i64]> = (1_000..=1_000 + 16 * 3).collect::<Vec<i64>>().into();
    let lookups = [(1, &rig.prompt), (2, &other), (3, &rig.prompt)]
        .into_iter()
        .map(|(request, prompt)| LookupPrefix {
            request: RequestId(request),
            ticket: LookupTicket(request * 7),
            prompt: Arc::clone(prompt).into(),
            local_match_tokens: 0,
            scope: kv_connector::RequestScope::default(),
            enqueued_at: Instant::now(),
        })
        .collect();
    rig.planner.send(LookupPrefixes { lookups }).await?;
    let mut answers = Vec::new();
    for _ in 0..3 {
        let completed = rig.lookups.recv_async().await?;
        assert_eq!(completed.ticket, LookupTicket(completed.request.0 * 7));
        let outcome = completed.plan.ok_or("lookup failed")?.outcome;
        answers.push((completed.request.0, outcome));
    }
    answers.sort_by_key(|(request, _)| *request);
    assert_eq!(
        answers,
        vec![
            (1, LookupOutcome::Full),
            (2, LookupOutcome::FullMiss),
            (3, LookupOutcome::Full)
        ]
    );
    assert!(rig.lookups.is_empty(), "one answer per lookup");
    let stats = rig.planner.send(CollectLookupStats).await?;
    assert_eq!((stats.full, stats.full_miss), (2, 1));
    Ok(())
}

/// The next lookup answer, failing the test if none comes within the harness's bound.
async fn answer(
    rig: &Rig,
) -> Result<kv_connector::messages::LookupCompleted, Box<dyn std::error::Error>> {
    let next = tokio::time::timeout(common::WAIT_LIMIT, rig.lookups.recv_async()).await;
    Ok(next.map_err(|_| "no lookup answered within the wait limit")??)
}

/// `lookup_planner::Q1`, `lookup_planner::Q2`: with two slots and a queue of three, six
/// lookups whose probes are held run two at once, queue three and shed one at once (offered
/// nothing, counted `shed`); once the probes go on, the five left are answered.
#[actix::test]
async fn the_planner_runs_a_bounded_number_of_lookups_and_sheds_past_its_queue() -> TestResult {
    let inner = memory_pool()?;
    let pool = Arc::new(TestPool::new(Arc::clone(&inner)));
    pool.hold_probes
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let capacity = PlannerCapacity {
        mailbox: 3,
        max_concurrent_lookups: 2,
    };
    let mut rig = rig_on(&(Arc::clone(&pool) as Arc<dyn Pool>), inner, capacity)?;
    // Three full blocks: one probe call (chunk of 4 keys) per round.
    rig.prompt = (0..=16 * 3).collect::<Vec<i64>>().into();
    rig.store_prompt()?;
    let lookups = (1..=6)
        .map(|request| LookupPrefix {
            request: RequestId(request),
            ticket: LookupTicket(request),
            prompt: Arc::clone(&rig.prompt).into(),
            local_match_tokens: 0,
            scope: kv_connector::RequestScope::default(),
            enqueued_at: Instant::now(),
        })
        .collect();
    rig.planner.send(LookupPrefixes { lookups }).await?;
    let shed = answer(&rig).await?;
    assert_eq!(
        shed.request,
        RequestId(6),
        "the lookup past the queue is shed"
    );
    assert!(shed.plan.is_none(), "a shed lookup offers nothing");
    assert_eq!(
        shed.hashes.chain().len(),
        3,
        "but hashes its prompt, so its pages are saved"
    );
    let started = || {
        pool.probes_started
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    common::wait_until("the two running lookups probe", || {
        (started() >= 2).then_some(())
    });
    assert_eq!(
        started(),
        2,
        "only two lookups run while their probes are held"
    );
    assert!(rig.lookups.is_empty(), "held lookups are not answered");
    let stats = rig.planner.send(CollectLookupStats).await?;
    assert_eq!((stats.shed, stats.full, stats.failed), (1, 0, 0));
    pool.hold_probes
        .store(false, std::sync::atomic::Ordering::SeqCst);
    pool.release_one_get();
    pool.release_one_get();
    let mut answered = Vec::new();
    for _ in 0..5 {
        let completed = answer(&rig).await?;
        assert_eq!(
            completed.plan.ok_or("lookup failed")?.outcome,
            LookupOutcome::Full
        );
        answered.push(completed.request.0);
    }
    answered.sort_unstable();
    assert_eq!(answered, vec![1, 2, 3, 4, 5]);
    let stats = rig.planner.send(CollectLookupStats).await?;
    assert_eq!((stats.shed, stats.full), (0, 5));
    Ok(())
}

/// R27: every interval the reporter takes each actor's counters; with paused time the
/// tick fires when the clock is advanced, not after real waiting.
#[actix::test]
async fn the_reporter_collects_every_interval_r27() -> TestResult {
    tokio::time::pause();
    let rig = rig()?;
    let calls = Config::default().validate()?.pool_calls;
    let guarded = GuardedPool::new(
        Arc::clone(&rig.pool) as Arc<dyn Pool>,
        GuardSettings::new(&calls, "0"),
    );
    let reporter = StatsReporter::new(
        rig.planner.clone(),
        rig.manager.clone(),
        Vec::new(),
        Duration::from_secs(30),
        ActorFaults::default(),
        String::new(),
        guarded.health(),
    )
    .start();
    rig.lookup(1).await?;
    // Before the interval ends the planner still holds its count.
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(rig.planner.send(CollectLookupStats).await?.full_miss, 1);
    rig.lookup(2).await?;
    tokio::time::advance(Duration::from_secs(2)).await;
    // Let the tick's collection run to completion.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        rig.planner.send(CollectLookupStats).await?.full_miss,
        0,
        "the tick took the interval's counts"
    );
    let totals = reporter.send(CollectNow).await?;
    assert_eq!(
        totals.lookups.full_miss, 1,
        "the tick's interval (lookup 2) is in the totals"
    );
    Ok(())
}
