//! Pool outages (R30), with a fault-injecting pool whose calls hang or fail on command
//! (`pool::faults::Outage`): the guarded pool keeps every probe within its deadline, marks
//! the pool unreachable after failed calls in a row, then refuses calls at once while at
//! most `pool.calls_in_flight` hung calls hold a thread, and a background probe finds the
//! pool again. On the connector, lookups during an outage answer "nothing" and count as
//! `outage` (never `full_miss`), saves are dropped and counted `saves_outage`, the
//! accounting stays closed, and reuse comes back after the outage.
//!
//! The hung pool answers only when the test ends the outage (its own timeout is ten
//! minutes): every answer the test gets before that was given without waiting on it.

#![cfg(feature = "faults")]

mod common;

use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::faults::{faulty, load_once, saved_pool, tiny};
use common::{look_up, memory_pool, prompt, reserve, start};
use kv_connector::config::Config;
use kv_connector::connector::{EngineConnector, ReserveAnswer};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::pool_health::HealthPolicy;
use kv_connector::pool::faults::{FaultInjector, FaultSpec, Outage};
use kv_connector::pool::{GuardSettings, GuardedPool, Pool, PoolError};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A hang that outlasts every test: only `end_outage` lets a hung call go on.
const HANG: Outage = Outage::Hang {
    backend_timeout: Duration::from_secs(600),
};

/// The guard of the pool-level tests: 250 ms probes (plenty for a pool in memory on a
/// loaded machine), 3 failures, background probes every 5-40 ms.
fn guard_settings(calls_in_flight: usize) -> GuardSettings {
    GuardSettings {
        probe_timeout: Duration::from_millis(250),
        calls_in_flight: NonZeroUsize::new(calls_in_flight).unwrap_or(NonZeroUsize::MIN),
        health: HealthPolicy {
            unreachable_after: NonZeroU32::new(3).unwrap_or(NonZeroU32::MIN),
            retry_initial: Duration::from_millis(5),
            retry_max: Duration::from_millis(40),
        },
        instance: "outage-test".to_owned(),
    }
}

/// Polls `done` (bounded, so a broken build fails instead of hanging) until it holds.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let limit = Instant::now() + Duration::from_secs(60);
    while !done() {
        if Instant::now() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// A pool whose master froze: probes miss their deadline (never waiting for the hung
/// calls), three of them mark the pool unreachable, every later call is refused at once,
/// no more than `calls_in_flight` hung calls hold a thread, and once the pool answers again
/// the prober finds it and calls go out.
#[test]
fn a_hung_pool_is_marked_unreachable_refuses_calls_at_once_and_is_found_again() {
    let (pool, injector) = faulty(&memory_pool(1 << 20), FaultSpec::default());
    let guard = GuardedPool::new(pool, guard_settings(4));
    let health = guard.health();
    assert_eq!(guard.exists(&["absent"]), vec![Ok(false)]);
    injector.begin_outage(HANG);
    for _ in 0..3 {
        let answers = guard.exists(&["a", "b"]);
        assert!(
            answers
                .iter()
                .all(|answer| matches!(answer, Err(PoolError::Timeout { .. }))),
            "{answers:?}"
        );
        assert!(guard.calls_running() <= 4);
    }
    let down = health.snapshot();
    assert_eq!((down.state, down.outages), ("unreachable", 1));
    assert_eq!(down.calls_timed_out, 3);
    // `Unreachable` is the guard's own answer: none of these calls reached the pool.
    let mut buffer = [0u8; 64];
    for _ in 0..100 {
        let probes = guard.exists(&["a"]);
        assert!(matches!(probes[..], [Err(PoolError::Unreachable { .. })]));
        let gets = guard.get_into(&["a"], &mut [&mut buffer[..]]);
        assert!(matches!(gets[..], [Err(PoolError::Unreachable { .. })]));
        let puts = guard.put(&["b"], &[&[1u8; 8][..]]);
        assert!(matches!(puts[..], [Err(PoolError::Unreachable { .. })]));
        assert!(
            guard.calls_running() <= 4,
            "{} calls running",
            guard.calls_running()
        );
    }
    assert_eq!(health.snapshot().calls_refused, 300);
    injector.end_outage();
    assert!(
        eventually(|| health.snapshot().state == "healthy"),
        "the prober never found the pool again"
    );
    assert_eq!(guard.exists(&["absent"]), vec![Ok(false)]);
    let up = health.snapshot();
    assert_eq!(up.outages, 1);
    assert!(up.unreachable_ms > 0);
    assert!(
        eventually(|| guard.calls_running() == 0),
        "hung calls never returned their threads"
    );
}

/// A pool whose master is gone answers "unavailable" at once: the same three failures make
/// it unreachable, and gets and puts are refused without reaching it.
#[test]
fn a_pool_that_is_gone_is_marked_unreachable_after_three_failed_calls() {
    let (pool, injector) = faulty(&memory_pool(1 << 20), FaultSpec::default());
    let guard = GuardedPool::new(pool, guard_settings(4));
    injector.begin_outage(Outage::Down);
    let mut buffer = [0u8; 64];
    assert_eq!(guard.exists(&["a"]), vec![Err(PoolError::Unavailable)]);
    assert_eq!(
        guard.get_into(&["a"], &mut [&mut buffer[..]]),
        vec![Err(PoolError::Unavailable)]
    );
    assert_eq!(guard.health().snapshot().state, "degraded");
    assert_eq!(
        guard.put(&["a"], &[&[1u8; 8][..]]),
        vec![Err(PoolError::Unavailable)]
    );
    assert_eq!(guard.health().snapshot().state, "unreachable");
    assert_eq!(injector.outage_calls(), 3);
    for _ in 0..10 {
        let refused = guard.put(&["a"], &[&[1u8; 8][..]]);
        assert!(matches!(refused[..], [Err(PoolError::Unreachable { .. })]));
    }
    assert_eq!(guard.health().snapshot().calls_refused, 10);
    injector.end_outage();
    assert!(eventually(|| guard.health().snapshot().state == "healthy"));
}

/// The tokens one lookup of `tokens` as request `request` offers (the request then ends
/// without a load).
fn offered(instance: &mut common::Instance, request: u64, tokens: &Arc<[i64]>) -> usize {
    let (request, reservation) = (RequestId(request), ReservationId(request));
    look_up(&mut instance.handle, request, tokens);
    let offered = match reserve(&mut instance.handle, request, reservation) {
        ReserveAnswer::Offer { extra_tokens, .. } => extra_tokens,
        ReserveAnswer::Pending => usize::MAX,
    };
    instance.handle.request_finished(request);
    offered
}

/// The connector on a pool that hangs: lookups answer at once with nothing and count as
/// `outage`, never `full_miss`; saves made during the outage are dropped and counted
/// `saves_outage`, their pages handed back; accounting closes; after the outage the saved
/// prompt is found and loaded again.
#[test]
fn the_connector_keeps_answering_during_an_outage_and_counts_what_it_lost() -> TestResult {
    let layout = tiny()?;
    let (inner, tokens) = saved_pool(&layout);
    let (pool, injector): (Arc<dyn Pool>, Arc<FaultInjector>) =
        faulty(&inner, FaultSpec::default());
    let mut config = Config::default();
    config.pool.probe_timeout_ms = 250;
    config.pool.retry_initial_ms = 5;
    config.pool.retry_max_ms = 40;
    let mut instance = start(pool, &layout, config);
    assert!(
        load_once(&mut instance, &layout, &tokens, 2)?,
        "reuse before the outage"
    );
    injector.begin_outage(HANG);
    for request in 3..13 {
        assert_eq!(offered(&mut instance, request, &tokens), 0);
    }
    let stats = instance.handle.stats();
    assert_eq!(
        stats.lookups.outage, 10,
        "every lookup in the outage was lost to it"
    );
    assert_eq!(stats.lookups.full_miss, 0, "never counted as an empty pool");
    assert_eq!(stats.pool.state, "unreachable");
    assert_eq!(stats.pool.outages, 1);
    let t = layout.tokens_per_block as usize;
    let fresh = prompt(10_000, 4 * t + 1);
    instance.save_prompt(RequestId(20), &fresh, &layout, 200);
    let keep = instance.handle.request_finished(RequestId(20));
    instance.handle.settle_saves();
    assert!(
        !keep || instance.handle.get_finished_saves() == vec![RequestId(20)],
        "the pages of a save lost to the outage go back to the engine (R22)"
    );
    let during = instance.handle.stats();
    assert_eq!(
        during.saves.saves_outage, 4,
        "four blocks lost to the outage"
    );
    assert!(during.saves.saves_dropped >= during.saves.saves_outage);
    during.check_accounting()?;
    injector.end_outage();
    let mut request = 30;
    assert!(
        eventually(|| {
            request += 1;
            load_once(&mut instance, &layout, &tokens, request).unwrap_or(false)
        }),
        "reuse never came back after the outage"
    );
    let stats = instance.handle.shutdown();
    stats.check_accounting()?;
    assert_eq!(stats.pool.state, "healthy");
    assert_eq!(stats.lookups.full_miss, 0);
    Ok(())
}
