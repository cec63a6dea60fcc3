//! Supervision of the actors without a staging pool (feature `faults`): each one is killed
//! by a panic injected at its fault point, and the test checks what the engine then sees
//! (`src/actors/mod.rs` lists each actor's decision). The loaders and savers, which
//! restart in place with a rebuilt staging pool, are covered in `tests/faults.rs`.
//!
//! What is checked, for each actor:
//! - lookup planner (restart in place): a lookup whose start panicked is answered with
//!   nothing offered (never left pending), and later lookups plan and load again;
//! - reservation manager (retires): the load it panicked on and every later one are
//!   reported failed, never filled, without a second panic; saves go on;
//! - stats reporter (restart in place): loads fill, saves settle, and `stats` and
//!   `shutdown` still return the complete report with the accounting closed.
//!
//! Every case ends in a bounded shutdown whose accounting closes.

#![cfg(feature = "faults")]

mod common;

use common::faults::{faulty, load_once, save_with, saved_pool, tiny, PROMPT_BLOCKS};
use common::{prompt, start};
use kv_connector::config::Config;
use kv_connector::core::ids::RequestId;
use kv_connector::pool::faults::{FaultPoint, FaultSpec};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A planner that panics on every lookup answers each with nothing: the engine is offered
/// 0 tokens (not `Pending` forever), nothing is loaded, and the lookup counts `failed`.
#[test]
fn a_planner_that_panics_answers_the_lookup_with_nothing_offered() -> TestResult {
    let layout = tiny()?;
    let (inner, tokens) = saved_pool(&layout);
    let (pool, injector) = faulty(
        &inner,
        FaultSpec::default().with(FaultPoint::PlannerPanic, 1.0),
    );
    let mut instance = start(pool, &layout, Config::default());
    for request in 2..5 {
        assert!(!load_once(&mut instance, &layout, &tokens, request)?);
    }
    assert_eq!(injector.fired(FaultPoint::PlannerPanic), 3);
    let stats = instance.handle.shutdown();
    stats.check_accounting()?;
    assert_eq!(stats.lookups.failed, 3, "every panicked lookup is counted");
    assert_eq!(stats.lookups.tokens_offered, 0);
    assert_eq!(stats.loads.loads_started, 0);
    Ok(())
}

/// The planner restarts in place: with panics on some lookups (deterministic for the
/// seed), a lookup after a panic still finds the saved prefix and its load fills.
#[test]
fn a_planner_that_panics_restarts_and_keeps_planning() -> TestResult {
    let layout = tiny()?;
    let (inner, tokens) = saved_pool(&layout);
    let mut spec = FaultSpec::default().with(FaultPoint::PlannerPanic, 0.5);
    spec.seed = 3;
    let (pool, injector) = faulty(&inner, spec);
    let mut instance = start(pool, &layout, Config::default());
    let mut filled_after_panic = false;
    let mut filled = 0;
    for request in 2..14 {
        let loaded = load_once(&mut instance, &layout, &tokens, request)?;
        filled += u64::from(loaded);
        filled_after_panic |= loaded && injector.fired(FaultPoint::PlannerPanic) > 0;
    }
    let panics = injector.fired(FaultPoint::PlannerPanic);
    assert!(panics > 0, "no panic injected");
    assert!(
        filled_after_panic,
        "the planner did not come back after a panic"
    );
    let stats = instance.handle.shutdown();
    stats.check_accounting()?;
    assert_eq!(stats.lookups.failed, panics);
    assert_eq!(filled + panics, 12, "every other lookup offered the prefix");
    assert_eq!(stats.loads.loads_done, filled);
    Ok(())
}

/// A reservation manager that panics retires: the load it panicked on is reported failed,
/// and so is the next one, without a second panic (the ledger is gone, nothing restarts);
/// saves, which do not go through it, still store and settle.
#[test]
fn a_reservation_manager_that_panics_retires_and_fails_every_load() -> TestResult {
    let layout = tiny()?;
    let (inner, tokens) = saved_pool(&layout);
    let (pool, injector) = faulty(
        &inner,
        FaultSpec::default().with(FaultPoint::ManagerPanic, 1.0),
    );
    let mut instance = start(pool, &layout, Config::default());
    assert!(!load_once(&mut instance, &layout, &tokens, 2)?, "R25");
    assert!(!load_once(&mut instance, &layout, &tokens, 3)?, "retired");
    assert_eq!(
        injector.fired(FaultPoint::ManagerPanic),
        1,
        "no restart, no second panic"
    );
    let other = prompt(10_000, PROMPT_BLOCKS * layout.tokens_per_block as usize + 1);
    instance.save_prompt(RequestId(9), &other, &layout, 300);
    let stats = instance.handle.shutdown();
    stats.check_accounting()?;
    assert_eq!(
        (stats.loads.loads_started, stats.loads.loads_failed),
        (2, 2)
    );
    assert_eq!(stats.saves.saves_done, PROMPT_BLOCKS as u64, "saves go on");
    Ok(())
}

/// A stats reporter that panics at every collection is restarted in place and serves the
/// collection: loads fill, saves settle, and the final report is complete and closed.
#[test]
fn a_stats_reporter_that_panics_still_returns_the_whole_report() -> TestResult {
    let spec = FaultSpec::default().with(FaultPoint::ReporterPanic, 1.0);
    let (stats, injector) = save_with(spec.clone(), Config::default())?;
    assert!(injector.fired(FaultPoint::ReporterPanic) > 0);
    assert_eq!(stats.saves.saves_done, PROMPT_BLOCKS as u64);
    let layout = tiny()?;
    let (inner, tokens) = saved_pool(&layout);
    let (pool, injector) = faulty(&inner, spec);
    let mut instance = start(pool, &layout, Config::default());
    assert!(load_once(&mut instance, &layout, &tokens, 2)?);
    let before = instance.handle.stats();
    assert_eq!(before.loads.loads_done, 1, "stats answered after a panic");
    let stats = instance.handle.shutdown();
    assert!(injector.fired(FaultPoint::ReporterPanic) >= 2);
    stats.check_accounting()?;
    assert_eq!((stats.loads.loads_started, stats.loads.loads_done), (1, 1));
    assert_eq!(stats.lookups.full, 1);
    Ok(())
}
