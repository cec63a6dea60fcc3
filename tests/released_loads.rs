//! Pages the engine takes back while their load runs (R26, R29): the connector never
//! writes them after the release returned, never reports a load the engine took back
//! whole, and never waits for one at shutdown.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{
    finished_loads, look_up, memory_pool, page_content, prompt, reserve, start, wait_until,
    Instance, TestPool,
};
use kv_connector::config::Config;
use kv_connector::connector::{EngineConnector, ReserveAnswer};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Layout;
use kv_connector::core::object::HEADER_BYTES;
use kv_connector::pool::Pool;

/// Request 1 saves a prompt of four blocks (tokens from `first`) through `config`'s
/// connector on a [`TestPool`]; request 2, the same prompt, has looked it up. Returns
/// the instance, the pool and the prompt.
fn second_request_looked_up(
    layout: &Layout,
    config: Config,
    first: i64,
) -> (Instance, Arc<TestPool>, Arc<[i64]>) {
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let pool: Arc<dyn Pool> = Arc::clone(&test_pool) as Arc<dyn Pool>;
    let mut instance = start(pool, layout, config);
    let tokens = prompt(first, 4 * 16 + 1);
    instance.save_prompt(RequestId(1), &tokens, layout, 0);
    look_up(&mut instance.handle, RequestId(2), &tokens);
    (instance, test_pool, tokens)
}

/// R26: a load whose reservation the engine released before it finished is ignored.
#[test]
fn a_completion_for_a_released_reservation_is_ignored_r26() {
    let layout = Layout::preset("tiny-full").unwrap();
    let (mut instance, test_pool, tokens) = second_request_looked_up(&layout, Config::default(), 3);
    reserve(&mut instance.handle, RequestId(2), ReservationId(2));
    test_pool.hold_gets.store(true, Ordering::SeqCst);
    instance.start_load(RequestId(2), ReservationId(2), tokens.len(), &layout, 100);
    instance
        .handle
        .release_prefix_reservation(RequestId(2), ReservationId(2), 0, 64);
    // The manager handles messages in order: once stats come back, the release is in.
    assert_eq!(instance.handle.stats().loads.loads_started, 1);
    test_pool.release_one_get();
    let loads = wait_until("the loader's answer", || {
        let loads = instance.handle.stats().loads;
        (loads.loads_done + loads.loads_failed + loads.stale_completions == 1).then_some(loads)
    });
    assert_eq!(
        (loads.stale_completions, loads.loads_done),
        (1, 0),
        "the completion is stale"
    );
    assert!(
        instance.handle.get_finished_prefix_loads().is_empty(),
        "a stale completion never reaches the engine"
    );
    instance.handle.shutdown();
}

/// R29: the engine releases part of a reservation while its load runs (one batch already
/// copied, the next held at the pool) and hands those pages to another request, which
/// writes them. Once the release returned, the loader writes none of them: the other
/// request's bytes survive; the pages still reserved are filled and the load is reported
/// filled.
#[test]
fn pages_released_during_a_load_are_never_written_after_the_release_r29() {
    let layout = Layout::preset("tiny-full").unwrap();
    let group = layout.groups[0].id;
    let page_bytes = usize::try_from(layout.page_bytes(&layout.groups[0]).unwrap()).unwrap();
    let mut config = Config::default();
    // Two staging slots: the four blocks come in two gets, one after the other.
    config.loaders.staging_bytes_per_loader = 2 * (HEADER_BYTES + page_bytes) as u64;
    let (mut instance, test_pool, tokens) = second_request_looked_up(&layout, config, 5);
    assert!(matches!(
        reserve(&mut instance.handle, RequestId(2), ReservationId(2)),
        ReserveAnswer::Offer {
            extra_tokens: 64,
            ..
        }
    ));
    test_pool.hold_gets.store(true, Ordering::SeqCst);
    let gets_before = test_pool.gets_started.load(Ordering::SeqCst);
    instance.start_load(RequestId(2), ReservationId(2), tokens.len(), &layout, 100);
    // Blocks 0 and 1 go through; the loader copies them and waits at the pool for 2 and 3.
    test_pool.release_one_get();
    wait_until("the loader's second get", || {
        (test_pool.gets_started.load(Ordering::SeqCst) >= gets_before + 2).then_some(())
    });
    instance
        .handle
        .release_prefix_reservation(RequestId(2), ReservationId(2), 16, 64);
    // The engine gives pages 101-103 to request 3 at once, which writes them.
    let other = |page: u32| page_content(group, 0, 50 + page as usize, page_bytes);
    for page in 101..104 {
        instance.devices[0]
            .write_page(group, page, &other(page))
            .unwrap();
    }
    test_pool.release_one_get();
    let finished = finished_loads(&mut instance.handle);
    assert_eq!(finished.len(), 1);
    assert!(finished[0].filled, "the pages still reserved are filled");
    assert_eq!(
        instance.devices[0].read_page_to_vec(group, 100).unwrap(),
        page_content(group, 0, 0, page_bytes),
        "block 0, still reserved, holds its KV"
    );
    for page in 101..104 {
        assert_eq!(
            instance.devices[0].read_page_to_vec(group, page).unwrap(),
            other(page),
            "page {page} was taken back and belongs to another request"
        );
    }
    let loads = instance.handle.shutdown().loads;
    assert_eq!(
        (loads.loads_done, loads.pages_loaded),
        (1, 2),
        "blocks 0 and 1 were copied, 2 and 3 skipped"
    );
}

/// R26, R29: the engine takes a load's pages back whole while its loader waits at the pool,
/// and the loader answers before the release reaches the reservation manager (the courier
/// holds it). The load is stale all the same: the engine never hears of it, and shutdown
/// does not wait for it.
#[cfg(feature = "faults")]
#[test]
fn a_load_taken_back_whole_is_stale_before_its_release_arrives_r26_r29() {
    let layout = Layout::preset("tiny-full").unwrap();
    let mut config = Config::default();
    // A shutdown that waited for the stale load would wait a day: the bounded wait for
    // the shutdown below fails long before.
    config.saver.shutdown_drain_timeout_ms = 86_400_000;
    let (mut instance, test_pool, tokens) = second_request_looked_up(&layout, config, 7);
    reserve(&mut instance.handle, RequestId(2), ReservationId(2));
    test_pool.hold_gets.store(true, Ordering::SeqCst);
    let gets_before = test_pool.gets_started.load(Ordering::SeqCst);
    instance.start_load(RequestId(2), ReservationId(2), tokens.len(), &layout, 100);
    wait_until("the loader at the pool", || {
        (test_pool.gets_started.load(Ordering::SeqCst) > gets_before).then_some(())
    });
    let held = instance.handle.hold_courier();
    instance
        .handle
        .release_prefix_reservation(RequestId(2), ReservationId(2), 0, 64);
    test_pool.release_one_get();
    // The stats reporter is asked directly (the courier, which `stats()` waits for, is held).
    let source = instance.handle.stats_source();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let loads = wait_until("the loader's answer", || {
        let loads = source.collect(&runtime, common::WAIT_LIMIT)?.loads;
        (loads.loads_done + loads.loads_failed + loads.stale_completions == 1).then_some(loads)
    });
    assert_eq!(
        (loads.stale_completions, loads.loads_done),
        (1, 0),
        "a load taken back whole is never filled"
    );
    drop(held);
    assert!(
        instance.handle.get_finished_prefix_loads().is_empty(),
        "the engine never hears of a load it took back"
    );
    let handle = instance.handle;
    let (done, stopped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(handle.shutdown().loads.stale_completions);
    });
    let stale = stopped
        .recv_timeout(common::WAIT_LIMIT)
        .expect("shutdown waits for no load the engine took back");
    assert_eq!(stale, 1);
}
