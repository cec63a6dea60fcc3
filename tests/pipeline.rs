//! The whole connector on the embedded pool and the host device, two instances sharing
//! one pool (R3, R10, R11, R16, R19, R23-R26).

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{
    finished_loads, look_up, memory_pool, page_content, prompt, reserve, start, TestPool,
};
use kv_connector::config::Config;
use kv_connector::connector::{EngineConnector, ReserveAnswer, ScheduledRequest, SchedulerOutput};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::{GroupId, Layout};
use kv_connector::pool::Pool;

/// R16, R24: a prompt saved by one instance is loaded byte-identical by another; the
/// partial last block and a block cut by a chunk end are never published early.
#[test]
fn a_saved_prompt_is_loaded_byte_identical_by_another_instance() {
    let layout = Layout::preset("tiny-full").unwrap();
    let t = layout.tokens_per_block as usize;
    let pool: Arc<dyn Pool> = memory_pool(64 << 20);
    let mut first = start(Arc::clone(&pool), &layout, Config::default());
    let mut second = start(Arc::clone(&pool), &layout, Config::default());
    let page_bytes = first.devices[0].page_pool(GroupId(0)).unwrap().page_bytes;
    let tokens = prompt(0, 10 * t + 3);

    look_up(&mut first.handle, RequestId(1), &tokens);
    assert_eq!(
        reserve(&mut first.handle, RequestId(1), ReservationId(1)),
        ReserveAnswer::Offer {
            extra_tokens: 0,
            is_async: false
        }
    );
    let table: Vec<i32> = (0..11).collect();
    for block in 0..10 {
        let page = u32::try_from(block).unwrap();
        first.devices[0]
            .write_page(
                GroupId(0),
                page,
                &page_content(GroupId(0), 0, block, page_bytes),
            )
            .unwrap();
    }
    // Two chunks; the first ends in the middle of block 4 (R16).
    for (before, after) in [(0, 4 * t + 5), (4 * t + 5, tokens.len())] {
        let tables: [&[i32]; 1] = [&table];
        let step = ScheduledRequest {
            request: RequestId(1),
            prompt_len: tokens.len(),
            computed_before: before,
            computed_after: after,
            new_reservation: None,
            page_tables: &tables,
        };
        first.handle.on_step(&SchedulerOutput {
            requests: vec![step],
        });
        if after < tokens.len() {
            first.handle.settle_saves();
            assert_eq!(
                first.handle.stats().saves.saves_done,
                4,
                "blocks 0-3 only: block 4 is not complete (R16)"
            );
        }
    }
    let keep = first.handle.request_finished(RequestId(1));
    first.handle.settle_saves();
    let freed = first.handle.get_finished_saves();
    assert_eq!(
        freed,
        if keep { vec![RequestId(1)] } else { vec![] },
        "pages are freed exactly once"
    );
    assert_eq!(
        first.handle.stats().saves.saves_done,
        10,
        "ten full blocks, never the partial one"
    );

    look_up(&mut second.handle, RequestId(7), &tokens);
    let answer = reserve(&mut second.handle, RequestId(7), ReservationId(70));
    assert_eq!(
        answer,
        ReserveAnswer::Offer {
            extra_tokens: 10 * t,
            is_async: true
        }
    );
    second.start_load(RequestId(7), ReservationId(70), tokens.len(), &layout, 100);
    let finished = finished_loads(&mut second.handle);
    assert_eq!(finished.len(), 1);
    assert!(finished[0].filled, "{finished:?}");
    for block in 0..10 {
        let page = 100 + u32::try_from(block).unwrap();
        let expected = page_content(GroupId(0), 0, block, page_bytes);
        assert_eq!(
            second.devices[0]
                .read_page_to_vec(GroupId(0), page)
                .unwrap(),
            expected,
            "block {block}"
        );
    }
    let stats = second.handle.shutdown();
    assert_eq!(
        (
            stats.lookups.full,
            stats.loads.loads_done,
            stats.loads.pages_loaded
        ),
        (1, 1, 10)
    );
    assert_eq!(first.handle.shutdown().lookups.full_miss, 1);
}

/// R19: a block already in the pool is skipped, not written again.
#[test]
fn saving_a_present_prompt_again_skips_every_block_r19() {
    let layout = Layout::preset("tiny-full").unwrap();
    let mut instance = start(memory_pool(64 << 20), &layout, Config::default());
    let tokens = prompt(5, 8 * 16);
    for request in [RequestId(1), RequestId(2)] {
        look_up(&mut instance.handle, request, &tokens);
        reserve(&mut instance.handle, request, ReservationId(request.0));
        instance.compute(request, &tokens, &layout, 0);
        instance.handle.settle_saves();
    }
    let saves = instance.handle.shutdown().saves;
    assert_eq!((saves.saves_done, saves.saves_skipped_present), (8, 8));
}

/// R3: with world size 2, a block counts only when both ranks' pages are in the pool.
#[test]
fn a_prefix_counts_only_when_every_shard_saved_r3() {
    let layout = Layout::preset("tiny-full")
        .unwrap()
        .with_world_size(2)
        .unwrap();
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let pool: Arc<dyn Pool> = Arc::clone(&test_pool) as Arc<dyn Pool>;
    let tokens = prompt(9, 6 * 16 + 1);
    // Rank 1's saves fail: only rank 0's pages reach the pool.
    *test_pool.refuse_puts_containing.lock() = Some("/w2r1/".into());
    let mut writer = start(Arc::clone(&pool), &layout, Config::default());
    writer.save_prompt(RequestId(1), &tokens, &layout, 0);
    let mut reader = start(Arc::clone(&pool), &layout, Config::default());
    look_up(&mut reader.handle, RequestId(2), &tokens);
    assert_eq!(
        reserve(&mut reader.handle, RequestId(2), ReservationId(2)),
        ReserveAnswer::Offer {
            extra_tokens: 0,
            is_async: false
        }
    );
    // Now both ranks save: the prefix is offered, and each rank gets its own pages.
    *test_pool.refuse_puts_containing.lock() = None;
    writer.save_prompt(RequestId(3), &tokens, &layout, 0);
    look_up(&mut reader.handle, RequestId(4), &tokens);
    assert_eq!(
        reserve(&mut reader.handle, RequestId(4), ReservationId(4)),
        ReserveAnswer::Offer {
            extra_tokens: 6 * 16,
            is_async: true
        }
    );
    reader.start_load(RequestId(4), ReservationId(4), tokens.len(), &layout, 200);
    assert!(finished_loads(&mut reader.handle)[0].filled);
    for (rank, device) in reader.devices.iter().enumerate() {
        let len = device.page_pool(GroupId(0)).unwrap().page_bytes;
        for block in 0..6 {
            let page = 200 + u32::try_from(block).unwrap();
            assert_eq!(
                device.read_page_to_vec(GroupId(0), page).unwrap(),
                page_content(GroupId(0), rank, block, len)
            );
        }
    }
    let stats = reader.handle.shutdown();
    assert_eq!(
        (
            stats.lookups.full_miss,
            stats.lookups.full,
            stats.loads.pages_loaded
        ),
        (1, 1, 12)
    );
    writer.handle.shutdown();
}

/// R25: an object evicted between the probe and the load fails the load cleanly.
#[test]
fn an_object_evicted_after_the_probe_fails_the_load_r25() {
    let layout = Layout::preset("tiny-full").unwrap();
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let pool: Arc<dyn Pool> = Arc::clone(&test_pool) as Arc<dyn Pool>;
    let mut instance = start(pool, &layout, Config::default());
    let tokens = prompt(1, 4 * 16 + 1);
    instance.save_prompt(RequestId(1), &tokens, &layout, 0);
    look_up(&mut instance.handle, RequestId(2), &tokens);
    assert!(matches!(
        reserve(&mut instance.handle, RequestId(2), ReservationId(2)),
        ReserveAnswer::Offer {
            extra_tokens: 64,
            ..
        }
    ));
    test_pool.gets_evicted.store(true, Ordering::SeqCst);
    instance.start_load(RequestId(2), ReservationId(2), tokens.len(), &layout, 100);
    let finished = finished_loads(&mut instance.handle);
    assert_eq!(finished.len(), 1);
    assert!(
        !finished[0].filled,
        "an unverifiable page is a miss, never KV"
    );
    let loads = instance.handle.shutdown().loads;
    assert_eq!(
        (loads.loads_failed, loads.failed_evicted, loads.loads_done),
        (1, 1, 0)
    );
}

/// R22: a finished request keeps its pages while its saves are in flight, and gets them
/// back once they settle.
#[test]
fn pages_stay_with_the_request_until_its_saves_settle_r22() {
    let layout = Layout::preset("tiny-full").unwrap();
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let pool: Arc<dyn Pool> = Arc::clone(&test_pool) as Arc<dyn Pool>;
    let mut instance = start(pool, &layout, Config::default());
    let tokens = prompt(11, 3 * 16 + 1);
    look_up(&mut instance.handle, RequestId(1), &tokens);
    reserve(&mut instance.handle, RequestId(1), ReservationId(1));
    test_pool.hold_puts.store(true, Ordering::SeqCst);
    instance.compute(RequestId(1), &tokens, &layout, 0);
    assert!(
        instance.handle.request_finished(RequestId(1)),
        "the saver holds the pages"
    );
    assert!(instance.handle.get_finished_saves().is_empty());
    test_pool.hold_puts.store(false, Ordering::SeqCst);
    test_pool.release_one_get();
    instance.handle.settle_saves();
    assert_eq!(instance.handle.get_finished_saves(), vec![RequestId(1)]);
    assert_eq!(instance.handle.shutdown().saves.saves_done, 3);
}

/// R7: a window layout is refused when prefix-aware scheduling is off.
#[test]
fn a_window_layout_without_prefix_aware_scheduling_is_refused_r7() {
    let layout = Layout::preset("tiny-hybrid").unwrap();
    let mut config = Config::default();
    config.reservations.prefix_aware_scheduling = false;
    let device = kv_connector::gpu::Device::open_host(&[
        kv_connector::gpu::PagePoolSpec {
            group: GroupId(0),
            page_bytes: 4096,
            num_pages: 4,
        },
        kv_connector::gpu::PagePoolSpec {
            group: GroupId(1),
            page_bytes: 4096,
            num_pages: 4,
        },
    ])
    .unwrap();
    let params = kv_connector::connector::ConnectorParams {
        config,
        layout,
        pool: memory_pool(1 << 20),
        devices: vec![device],
        share: kv_connector::RankShare::default(),
        seed: kv_connector::core::hash::scope_seed(&kv_connector::core::hash::Scope::default()),
        model_key: "test".into(),
    };
    let error = kv_connector::connector::ConnectorHandle::start(params)
        .err()
        .unwrap();
    assert!(
        error
            .to_string()
            .contains("reservations.prefix_aware_scheduling = true"),
        "{error}"
    );
}

/// A configuration built in code is validated by `start` (once: the actors run on the
/// typed values): one it could not run is refused naming the key, never clamped.
#[test]
fn a_configuration_the_connector_cannot_run_is_refused_at_start() {
    let layout = Layout::preset("tiny-full").unwrap();
    for (key, change) in [
        (
            "loaders.load_threads",
            (|c: &mut Config| c.loaders.load_threads = 0) as fn(&mut Config),
        ),
        ("saver.queue_capacity_pages", |c| {
            c.saver.queue_capacity_pages = 0;
        }),
        ("stats.interval_s", |c| c.stats.interval_s = 0),
    ] {
        let mut config = Config::default();
        change(&mut config);
        let device = kv_connector::gpu::Device::open_host(&[kv_connector::gpu::PagePoolSpec {
            group: GroupId(0),
            page_bytes: usize::try_from(layout.page_bytes(&layout.groups[0]).unwrap()).unwrap(),
            num_pages: 4,
        }])
        .unwrap();
        let params = kv_connector::connector::ConnectorParams {
            config,
            layout: layout.clone(),
            pool: memory_pool(1 << 20),
            devices: vec![device],
            share: kv_connector::RankShare::default(),
            seed: kv_connector::core::hash::scope_seed(&kv_connector::core::hash::Scope::default()),
            model_key: "test".into(),
        };
        let error = kv_connector::connector::ConnectorHandle::start(params)
            .err()
            .unwrap();
        let message = error.to_string();
        assert!(
            message.contains(key) && message.contains("must be at least 1"),
            "{message}"
        );
    }
}

/// R28: a window checkpoint interval off the layout's block boundaries is refused at
/// start, naming the setting and an interval that works; a full-attention layout, which
/// saves no checkpoints, takes it.
#[test]
fn a_checkpoint_interval_off_block_boundaries_is_refused_at_start_r28() {
    let start_with = |preset: &str| {
        let layout = Layout::preset(preset).unwrap();
        let specs: Vec<kv_connector::gpu::PagePoolSpec> = layout
            .groups
            .iter()
            .map(|group| kv_connector::gpu::PagePoolSpec {
                group: group.id,
                page_bytes: usize::try_from(layout.page_bytes(group).unwrap()).unwrap(),
                num_pages: 4,
            })
            .collect();
        let mut config = Config::default();
        config.saver.window_checkpoint_tokens = 8192 + 1;
        let params = kv_connector::connector::ConnectorParams {
            config,
            devices: vec![kv_connector::gpu::Device::open_host(&specs).unwrap()],
            share: kv_connector::RankShare::default(),
            layout,
            pool: memory_pool(1 << 20),
            seed: kv_connector::core::hash::scope_seed(&kv_connector::core::hash::Scope::default()),
            model_key: "test".into(),
        };
        kv_connector::connector::ConnectorHandle::start(params)
    };
    let message = start_with("tiny-hybrid").err().unwrap().to_string();
    assert!(
        message.contains("saver.window_checkpoint_tokens = 8193") && message.contains("use 8192"),
        "{message}"
    );
    start_with("tiny-full").unwrap().shutdown();
}

/// R20: with re-save on, the last chunk lists the prompt's earlier blocks again; present
/// ones are refreshed, not rewritten.
#[test]
fn resave_refreshes_the_blocks_of_earlier_chunks_r20() {
    let layout = Layout::preset("tiny-full").unwrap();
    let mut config = Config::default();
    config.saver.resave_min_tokens = 64;
    let mut instance = start(memory_pool(64 << 20), &layout, config);
    let tokens = prompt(21, 10 * 16 + 3);
    look_up(&mut instance.handle, RequestId(1), &tokens);
    reserve(&mut instance.handle, RequestId(1), ReservationId(1));
    let table: Vec<i32> = (0..11).collect();
    let tables: [&[i32]; 1] = [&table];
    for (before, after) in [(0, 4 * 16), (4 * 16, tokens.len())] {
        let step = ScheduledRequest {
            request: RequestId(1),
            prompt_len: tokens.len(),
            computed_before: before,
            computed_after: after,
            new_reservation: None,
            page_tables: &tables,
        };
        instance.handle.on_step(&SchedulerOutput {
            requests: vec![step],
        });
        instance.handle.settle_saves();
    }
    let saves = instance.handle.shutdown().saves;
    assert_eq!(
        (
            saves.saves_done,
            saves.saves_refreshed,
            saves.saves_enqueued
        ),
        (10, 4, 14)
    );
}

/// R23 with `sync_load`: the loads of one step are still started together, but `on_step`
/// returns only once each is reported, so both are filled before the next poll.
#[test]
fn sync_load_waits_for_every_load_of_the_step_r23() {
    let layout = Layout::preset("tiny-full").unwrap();
    let pool: Arc<dyn Pool> = memory_pool(64 << 20);
    let mut first = start(Arc::clone(&pool), &layout, Config::default());
    let mut config = Config::default();
    config.loaders.sync_load = true;
    let mut second = start(Arc::clone(&pool), &layout, config);
    let prompts = [prompt(0, 4 * 16 + 1), prompt(1_000_000, 4 * 16 + 1)];
    for (index, tokens) in (1_u64..).zip(&prompts) {
        first.save_prompt(RequestId(index), tokens, &layout, 0);
        look_up(&mut second.handle, RequestId(index), tokens);
    }
    for index in 1..=2 {
        assert_eq!(
            reserve(&mut second.handle, RequestId(index), ReservationId(index)),
            ReserveAnswer::Offer {
                extra_tokens: 4 * 16,
                is_async: false
            }
        );
    }
    let tables: [Vec<i32>; 2] = [(100..105).collect(), (200..205).collect()];
    let page_tables: Vec<[&[i32]; 1]> = tables.iter().map(|table| [table.as_slice()]).collect();
    let requests = (1_u64..)
        .zip(&page_tables)
        .map(|(index, page_tables)| ScheduledRequest {
            request: RequestId(index),
            prompt_len: 4 * 16 + 1,
            computed_before: 0,
            computed_after: 0,
            new_reservation: Some(ReservationId(index)),
            page_tables,
        })
        .collect();
    second.handle.on_step(&SchedulerOutput { requests });
    let finished = second.handle.get_finished_prefix_loads();
    let reported: Vec<(u64, bool)> = finished
        .iter()
        .map(|load| (load.reservation.0, load.filled))
        .collect();
    assert_eq!(reported, vec![(1, true), (2, true)]);
    let page_bytes = second.devices[0].page_pool(GroupId(0)).unwrap().page_bytes;
    for (table, block) in tables
        .iter()
        .flat_map(|table| (0..4).map(move |b| (table, b)))
    {
        let page = u32::try_from(table[block]).unwrap();
        assert_eq!(
            second.devices[0]
                .read_page_to_vec(GroupId(0), page)
                .unwrap(),
            page_content(GroupId(0), 0, block, page_bytes)
        );
    }
    let loads = second.handle.shutdown().loads;
    assert_eq!((loads.loads_started, loads.loads_done), (2, 2));
}
