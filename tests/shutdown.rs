//! Shutdown follows the stop order of `kv_connector::actors`: the handle stops
//! admitting lookups, waits for in-flight loads, drains queued saves until
//! `saver.shutdown_drain_timeout_ms`, then reports. Whatever the deadline cuts off is
//! counted (dropped saves, failed loads), so the final report accounts for every page.
//!
//! The deadline tests use a timeout of 0 and a pool that holds every put or get, so what
//! the deadline cuts off does not depend on thread timing (no sleeps).

mod common;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{look_up, memory_pool, prompt, reserve, start, TestPool};
use kv_connector::config::{Config, ConfigSources};
use kv_connector::connector::{EngineConnector, ReserveAnswer};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Layout;
use kv_connector::pool::Pool;
use kv_connector::stats::ConnectorStats;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Saves: every enqueued page is done, skipped, dropped or failed.
fn assert_saves_accounted(stats: &ConnectorStats) {
    let saves = &stats.saves;
    assert_eq!(
        saves.saves_enqueued,
        saves.saves_done + saves.saves_skipped_present + saves.saves_dropped + saves.saves_failed,
        "save accounting: {saves:?}"
    );
}

/// Loads: every started load is done or failed.
fn assert_loads_accounted(stats: &ConnectorStats) {
    let loads = &stats.loads;
    assert_eq!(
        loads.loads_started,
        loads.loads_done + loads.loads_failed,
        "load accounting: {loads:?}"
    );
}

fn config_with_drain_timeout_ms(ms: u64) -> Config {
    let mut config = Config::default();
    config.saver.shutdown_drain_timeout_ms = ms;
    config
}

#[test]
fn shutdown_settles_queued_saves_before_the_final_report() -> TestResult {
    let layout = Layout::preset("tiny-hybrid")?;
    let pool = memory_pool(64 << 20);
    let mut instance = start(
        Arc::clone(&pool) as Arc<dyn Pool>,
        &layout,
        Config::default(),
    );
    for request in 0..4_u64 {
        let tokens = prompt(i64::try_from(request)? * 100_000, 20 * 16 + 5);
        look_up(&mut instance.handle, RequestId(request), &tokens);
        reserve(
            &mut instance.handle,
            RequestId(request),
            ReservationId(request),
        );
        instance.compute(
            RequestId(request),
            &tokens,
            &layout,
            i32::try_from(request)? * 32,
        );
    }
    let stats = instance.handle.shutdown();
    let saves = &stats.saves;
    assert!(saves.saves_enqueued > 0);
    assert_eq!(
        saves.saves_dropped, 0,
        "the default deadline drains everything"
    );
    assert_saves_accounted(&stats);
    assert_eq!(
        pool.counters().objects,
        saves.saves_done,
        "every stored page is in the pool"
    );
    assert_eq!(stats.lookups.full_miss, 4);
    Ok(())
}

/// A pool that hangs on puts cannot hold shutdown past its deadline: the queued pages are
/// dropped and counted, and nothing was stored when the report was taken.
#[test]
fn saves_still_queued_at_the_drain_deadline_are_dropped_and_counted() -> TestResult {
    let layout = Layout::preset("tiny-full")?;
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    test_pool.hold_puts.store(true, Ordering::SeqCst);
    let mut instance = start(
        Arc::clone(&test_pool) as Arc<dyn Pool>,
        &layout,
        config_with_drain_timeout_ms(0),
    );
    let tokens = prompt(7, 40 * 16 + 3);
    look_up(&mut instance.handle, RequestId(1), &tokens);
    reserve(&mut instance.handle, RequestId(1), ReservationId(1));
    instance.compute(RequestId(1), &tokens, &layout, 0);
    let stats = instance.handle.shutdown();
    let objects_at_report = test_pool.counters().objects;
    // Let the held batch go so the saver's blocking thread can end.
    release_held_calls(&test_pool);
    assert_eq!(objects_at_report, 0);
    assert_eq!(stats.saves.saves_done, 0);
    assert!(stats.saves.saves_enqueued > 0);
    assert_eq!(
        stats.saves.saves_dropped, stats.saves.saves_enqueued,
        "every page cut off by the deadline is a dropped save"
    );
    assert_saves_accounted(&stats);
    Ok(())
}

/// Lets calls the pool still holds go, so the actors' blocking threads can end (the gate
/// has room for 16 and at most one batch per saver or loader is in flight).
fn release_held_calls(pool: &TestPool) {
    for _ in 0..4 {
        pool.release_one_get();
    }
}

/// A load held by the pool at the deadline is reported failed in the final report.
#[test]
fn a_load_in_flight_at_the_drain_deadline_counts_as_failed() -> TestResult {
    let layout = Layout::preset("tiny-full")?;
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let mut instance = start(
        Arc::clone(&test_pool) as Arc<dyn Pool>,
        &layout,
        config_with_drain_timeout_ms(0),
    );
    let tokens = prompt(1, 4 * 16 + 1);
    instance.save_prompt(RequestId(1), &tokens, &layout, 0);
    look_up(&mut instance.handle, RequestId(2), &tokens);
    let offer = reserve(&mut instance.handle, RequestId(2), ReservationId(2));
    assert!(matches!(
        offer,
        ReserveAnswer::Offer {
            extra_tokens: 64,
            ..
        }
    ));
    test_pool.hold_gets.store(true, Ordering::SeqCst);
    instance.start_load(RequestId(2), ReservationId(2), tokens.len(), &layout, 100);
    let stats = instance.handle.shutdown();
    release_held_calls(&test_pool);
    assert_eq!(stats.loads.loads_done, 0, "a held load never completes");
    assert_loads_accounted(&stats);
    assert_saves_accounted(&stats);
    Ok(())
}

/// `close` on a borrowed handle stops it once; a second call returns the same report, and
/// a lookup after it is not admitted (nothing offered).
#[test]
fn close_is_idempotent_and_admits_nothing_afterwards() -> TestResult {
    let layout = Layout::preset("tiny-full")?;
    let pool = memory_pool(64 << 20);
    let mut instance = start(pool as Arc<dyn Pool>, &layout, Config::default());
    let tokens = prompt(3, 8 * 16 + 1);
    instance.save_prompt(RequestId(1), &tokens, &layout, 0);
    let first = instance.handle.close();
    let second = instance.handle.close();
    assert_eq!(first.saves.saves_done, 8);
    assert_eq!(second.saves.saves_done, first.saves.saves_done);
    assert_eq!(second.lookups.lookups(), first.lookups.lookups());
    look_up(&mut instance.handle, RequestId(2), &tokens);
    assert_eq!(
        instance
            .handle
            .reserve_prefix(RequestId(2), 0, ReservationId(2)),
        ReserveAnswer::Offer {
            extra_tokens: 0,
            is_async: false
        }
    );
    Ok(())
}

/// The key is layered like every other: defaults < TOML < environment < command line.
#[test]
fn shutdown_drain_timeout_is_layered_from_env_and_cli() -> TestResult {
    assert_eq!(Config::default().saver.shutdown_drain_timeout_ms, 10_000);
    let env = HashMap::from([(
        "KVC_SAVER_SHUTDOWN_DRAIN_TIMEOUT_MS".to_owned(),
        "250".to_owned(),
    )]);
    let from_env = Config::load(&ConfigSources {
        env: env.clone(),
        ..ConfigSources::default()
    })?;
    assert_eq!(from_env.config.saver.shutdown_drain_timeout_ms, 250);
    let from_cli = Config::load(&ConfigSources {
        env,
        cli_overrides: vec![("saver.shutdown_drain_timeout_ms".to_owned(), "0".to_owned())],
        ..ConfigSources::default()
    })?;
    assert_eq!(from_cli.config.saver.shutdown_drain_timeout_ms, 0);
    Ok(())
}
