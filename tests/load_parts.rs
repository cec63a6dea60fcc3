//! A large load shared among a rank's loaders (R23, R24, R25; `core::load_parts`): each
//! loader gets a part, the load is filled only when every part is, and one part's failure
//! fails the whole load, answered once.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{
    finished_loads, look_up, memory_pool, page_content, prompt, reserve, start, TestPool,
};
use kv_connector::config::Config;
use kv_connector::connector::ReserveAnswer;
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::{GroupId, Layout};
use kv_connector::core::load_parts::LOAD_PART_MIN_PAGES;
use kv_connector::pool::Pool;

/// Blocks of the prompt: enough for two parts of at least the minimum.
const BLOCKS: usize = 2 * LOAD_PART_MIN_PAGES + 5;
/// The first device page a load writes (the save used pages from 0).
const LOAD_PAGE: i32 = 200;

/// Saves a `BLOCKS`-block prompt through one instance and offers it to another; returns the
/// loading instance and the test pool both use.
fn saved_and_offered(
    layout: &Layout,
    loaders: usize,
) -> (common::Instance, Arc<TestPool>, Arc<[i64]>) {
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let pool: Arc<dyn Pool> = Arc::clone(&test_pool) as Arc<dyn Pool>;
    let t = layout.tokens_per_block as usize;
    let tokens = prompt(3, BLOCKS * t + 1);
    let mut saver = start(Arc::clone(&pool), layout, Config::default());
    saver.save_prompt(RequestId(1), &tokens, layout, 0);
    saver.handle.shutdown();
    let mut config = Config::default();
    config.loaders.load_threads = loaders;
    let mut loading = start(pool, layout, config);
    look_up(&mut loading.handle, RequestId(2), &tokens);
    assert_eq!(
        reserve(&mut loading.handle, RequestId(2), ReservationId(2)),
        ReserveAnswer::Offer {
            extra_tokens: BLOCKS * t,
            is_async: true
        }
    );
    (loading, test_pool, tokens)
}

/// Two loaders each get one part, disjoint and together every page; the pages land byte
/// for byte. One loader gets the whole load in one part.
#[test]
fn a_large_load_is_shared_by_the_loaders_and_filled_r23_r24() {
    let layout = Layout::preset("tiny-full").unwrap();
    for (loaders, parts) in [(2, 2), (1, 1)] {
        let (mut instance, test_pool, tokens) = saved_and_offered(&layout, loaders);
        test_pool.get_log.lock().clear();
        instance.start_load(
            RequestId(2),
            ReservationId(2),
            tokens.len(),
            &layout,
            LOAD_PAGE,
        );
        let finished = finished_loads(&mut instance.handle);
        assert_eq!(finished.len(), 1);
        assert!(finished[0].filled, "{finished:?}");

        let gets = test_pool.get_log.lock().clone();
        assert_eq!(gets.len(), parts, "one get per part: {loaders} loaders");
        assert!(gets.iter().all(|keys| keys.len() >= LOAD_PART_MIN_PAGES));
        let keys: HashSet<&String> = gets.iter().flatten().collect();
        assert_eq!(
            keys.len(),
            BLOCKS,
            "the parts are disjoint and cover the load"
        );

        let page_bytes = instance.devices[0]
            .page_pool(GroupId(0))
            .unwrap()
            .page_bytes;
        for block in 0..BLOCKS {
            let page = u32::try_from(LOAD_PAGE).unwrap() + u32::try_from(block).unwrap();
            assert_eq!(
                instance.devices[0]
                    .read_page_to_vec(GroupId(0), page)
                    .unwrap(),
                page_content(GroupId(0), 0, block, page_bytes),
                "block {block}"
            );
        }
        let loads = instance.handle.shutdown().loads;
        assert_eq!((loads.loads_done, loads.pages_loaded), (1, BLOCKS as u64));
    }
}

/// R25: a page evicted from one loader's part fails the whole load, reported once, after
/// both parts answered.
#[test]
fn one_part_failing_fails_the_whole_load_once_r25() {
    let layout = Layout::preset("tiny-full").unwrap();
    let (mut instance, test_pool, tokens) = saved_and_offered(&layout, 2);
    // A key of the prompt (the saver put each once); it lies in one of the two parts.
    let evicted = test_pool.put_log.lock().last().cloned().unwrap();
    *test_pool.evicted_key.lock() = Some(evicted.clone());
    test_pool.get_log.lock().clear();
    instance.start_load(
        RequestId(2),
        ReservationId(2),
        tokens.len(),
        &layout,
        LOAD_PAGE,
    );
    let finished = finished_loads(&mut instance.handle);
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert!(!finished[0].filled, "an evicted page is a miss, never KV");

    let gets = test_pool.get_log.lock().clone();
    assert_eq!(gets.len(), 2, "both parts ran");
    assert!(
        gets.iter().filter(|keys| keys.contains(&evicted)).count() == 1,
        "the evicted page was in exactly one part"
    );
    let loads = instance.handle.shutdown().loads;
    assert_eq!(
        (loads.loads_failed, loads.failed_evicted, loads.loads_done),
        (1, 1, 0)
    );
}
