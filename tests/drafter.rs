//! Speculative decoding, the chunk-end save cap and re-save under eviction (R16, R18,
//! R20).
//!
//! - Replays with the real connector and the simulated EAGLE-style drafter (extra KV tokens
//!   past every chunk end, drafts written into generation pages and rewound): every loaded
//!   page verifies, nothing is published past a chunk end, and reuse stays within one
//!   point of the same replay without a drafter (R16, R18);
//! - a layout with the drafter's own layer group (`llama-3.1-8b-eagle`): its pages are
//!   saved, loaded and checked like the target's, so a reused prefix resumes the drafter;
//! - re-save (R20): a scripted eviction of a chain's head block, while the engine's local
//!   prefix cache serves that head, is repaired by the next long prompt (the missing block
//!   rewritten, the present ones refreshed), and the following lookup gets the full hit;
//!   without re-save the chain stays unreachable;
//! - shedding (R22): a full save queue sheds the oldest request whole, its re-saves with its
//!   full-attention blocks, never blocks the engine, and counts every drop.
#![cfg(feature = "cli")]

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::{look_up, memory_pool, prompt, start};
use kv_connector::config::Config;
use kv_connector::connector::{EngineConnector, ReserveAnswer, ScheduledRequest, SchedulerOutput};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Layout;
use kv_connector::pool::{MemoryPool, Pool, PoolCounters, PoolError};
use kv_connector::replay::cost::CostModel;
use kv_connector::replay::engine::DrafterSetup;
use kv_connector::replay::workload::{generate_long_multiturn, LongMultiturnParams};
use kv_connector::replay::{
    kvc_connector, run_replay, DeploymentParams, KvBytesScale, KvPages, NoProgress, PoolMaster,
    ReplayParams, ReplayReport, Routing,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Replay parameters for `preset` on 2 instances, with or without a drafter.
fn replay_params(
    preset: &str,
    drafter: Option<DrafterSetup>,
    kv_bytes_scale: f64,
) -> Result<ReplayParams, Box<dyn std::error::Error>> {
    let layout = Layout::preset(preset)?;
    Ok(ReplayParams {
        config: Arc::new(Config::default()),
        cost: CostModel::for_layout(&layout.name, layout.world_size),
        layout: Arc::new(layout),
        deployment: DeploymentParams {
            instances: 2,
            kv_pages: KvPages::Fixed(4096),
            kv_bytes_scale: KvBytesScale::Fixed(kv_bytes_scale),
            // Room for both instances' connector staging pools (768 MiB each by default).
            host_memory_limit_bytes: 4 << 30,
            pool_master: PoolMaster::Start,
        },
        routing: Routing::RoundRobin,
        max_num_tokens: 2048,
        stall_timeout: Duration::from_secs(30),
        wait_timeout: Duration::from_millis(5),
        connector_name: "kvc".to_owned(),
        local_prefix_cache: false,
        drafter,
        release_during_loads: false,
        pace: None,
    })
}

/// Two conversations of 4 turns growing from 6k to 9k tokens; prompt ends fall anywhere in
/// a block, so drafts land in partial prompt blocks as well as in fresh ones.
fn replay(
    preset: &str,
    drafter: Option<DrafterSetup>,
    scale: f64,
) -> Result<ReplayReport, Box<dyn std::error::Error>> {
    replay_with(&replay_params(preset, drafter, scale)?)
}

/// The conversations of [`replay`] under `params`.
fn replay_with(params: &ReplayParams) -> Result<ReplayReport, Box<dyn std::error::Error>> {
    let workload = generate_long_multiturn(&LongMultiturnParams {
        sessions: 2,
        turns_per_session: 4,
        first_turn_tokens: 6_000,
        last_turn_tokens: 9_000,
        output_tokens: 32,
        system_prefix_tokens: 2_000,
        divergence_tokens_max: 0,
        seed: 5,
        ..LongMultiturnParams::default()
    })?;
    Ok(run_replay(
        params,
        &workload,
        &mut kvc_connector,
        &mut NoProgress,
    )?)
}

/// R28 with R16 and R18: window checkpoints every 1,024 tokens under a drafter save
/// checkpoint windows at the chunk boundaries they pass, publish nothing past a chunk
/// end (the connector's count and the pool's witness agree), and every loaded page
/// verifies.
#[test]
fn checkpoints_under_a_drafter_publish_nothing_past_the_chunk_end_r16_r18_r28() -> TestResult {
    let mut params = replay_params("tiny-hybrid", Some(DRAFTER), 1.0)?;
    let mut config = Config::default();
    config.saver.window_checkpoint_tokens = 1024;
    params.config = Arc::new(config);
    let report = replay_with(&params)?;
    assert!(
        report.checkpoint_pages_enqueued > 0,
        "checkpoints were saved"
    );
    assert_eq!(report.mismatched_pages, 0);
    assert_eq!(report.published_past_chunk_end, 0);
    assert_eq!(report.published_uncomputed_pages, 0);
    assert!(report.verified_pages > 0);
    assert_eq!(report.completed, 8);
    Ok(())
}

const DRAFTER: DrafterSetup = DrafterSetup {
    draft_tokens: 5,
    acceptance: 0.7,
};

/// R16, R18: with a drafter, 0 mismatches, 0 publications past the cap (counted by the
/// connector and by the pool's witness), and reuse within one point of the same replay
/// without it; the drafts were written and partly rewound.
#[test]
fn drafter_replay_publishes_nothing_past_the_chunk_end_and_keeps_reuse_r16_r18() -> TestResult {
    for preset in ["tiny-full", "tiny-hybrid"] {
        let plain = replay(preset, None, 1.0)?;
        let drafted = replay(preset, Some(DRAFTER), 1.0)?;
        for report in [&plain, &drafted] {
            assert_eq!(report.mismatched_pages, 0, "{preset}");
            assert_eq!(report.published_past_chunk_end, 0, "{preset}");
            // The pool's own witness agrees: nothing stale or drafted reached it.
            assert_eq!(report.published_uncomputed_pages, 0, "{preset}");
            assert!(report.pages_saved > 0, "{preset}");
            assert_eq!(report.completed, 8, "{preset}");
            assert!(report.verified_pages > 0, "{preset}");
        }
        let gap = (plain.reused_share_of_prompt - drafted.reused_share_of_prompt).abs();
        assert!(
            gap <= 0.01,
            "{preset}: reuse {} without vs {} with the drafter",
            plain.reused_share_of_prompt,
            drafted.reused_share_of_prompt
        );
        assert!(plain.drafter.is_none());
        let counts = drafted.drafter.as_ref().ok_or("no drafter report")?;
        assert_eq!(counts.tokens_proposed, 8 * 5, "{preset}");
        assert!(counts.tokens_accepted > 0 && counts.tokens_accepted < 8 * 5);
        assert!(counts.pages_written >= 8 && counts.pages_rewound > 0);
        // Decoding advances more than one token per step, so turns come sooner.
        assert!(drafted.sim.duration_s < plain.sim.duration_s, "{preset}");
    }
    Ok(())
}

/// R6: the drafter's own layer group is saved and loaded like the target's: every loaded
/// page of both groups is checked and verifies, and reuse matches the target-only layout.
#[test]
fn draft_layer_groups_are_saved_and_loaded_with_the_prefix() -> TestResult {
    let scale = 1.0 / 1024.0;
    let target = replay("llama-3.1-8b", Some(DRAFTER), scale)?;
    let eagle = replay("llama-3.1-8b-eagle", Some(DRAFTER), scale)?;
    assert_eq!(eagle.mismatched_pages, 0);
    assert_eq!(eagle.published_past_chunk_end, 0);
    assert_eq!(eagle.published_uncomputed_pages, 0);
    assert!(eagle.reused_tokens > 0);
    assert_eq!(eagle.setup.page_bytes.len(), 2);
    // Every loaded page (both groups) was checked; each block has one page per group.
    assert_eq!(eagle.verified_pages, eagle.pages_loaded);
    let blocks_loaded = eagle.reused_tokens / 32;
    assert_eq!(eagle.pages_loaded, 2 * blocks_loaded);
    assert_eq!(target.pages_loaded, target.reused_tokens / 32);
    let gap = (eagle.reused_share_of_prompt - target.reused_share_of_prompt).abs();
    assert!(gap <= 0.01, "{gap}");
    Ok(())
}

/// The drafter's report side by side: with the drafter's KV in the layout and the engines'
/// local prefix caches on, some requests resume from the pool and some from their own
/// cache; every verification is counted once under its prefix source, and every loaded or
/// shared page (draft pages named by their next token, R37) verifies.
#[test]
fn drafts_are_reported_by_prefix_source_r37() -> TestResult {
    let mut params = replay_params("llama-3.1-8b-eagle", Some(DRAFTER), 1.0 / 1024.0)?;
    params.local_prefix_cache = true;
    let report = replay_with(&params)?;
    assert_eq!(report.mismatched_pages, 0);
    assert_eq!(report.published_uncomputed_pages, 0);
    let drafter = report.drafter.as_ref().ok_or("no drafter report")?;
    assert!(drafter.draft_kv_in_layout);
    let by = &drafter.by_prefix;
    assert!(by.pool.requests > 0 && by.local.requests > 0, "{by:?}");
    let tallies = [by.pool, by.local, by.computed];
    assert_eq!(
        tallies.iter().map(|t| t.requests).sum::<u64>(),
        report.completed
    );
    for tally in tallies {
        assert_eq!(tally.tokens_proposed, tally.requests * 5, "{by:?}");
        assert!(tally.tokens_accepted <= tally.tokens_proposed);
    }
    assert_eq!(
        tallies.iter().map(|t| t.tokens_accepted).sum::<u64>(),
        drafter.tokens_accepted
    );
    Ok(())
}

/// A pool whose test can evict keys: an evicted key is absent for probes and gets until
/// a put writes it again (the put is counted as a rewrite).
struct EvictingPool {
    inner: Arc<MemoryPool>,
    evicted: parking_lot::Mutex<HashSet<String>>,
    rewritten: parking_lot::Mutex<Vec<String>>,
    puts: parking_lot::Mutex<Vec<String>>,
}

impl EvictingPool {
    fn new() -> Self {
        Self {
            inner: memory_pool(64 << 20),
            evicted: parking_lot::Mutex::new(HashSet::new()),
            rewritten: parking_lot::Mutex::new(Vec::new()),
            puts: parking_lot::Mutex::new(Vec::new()),
        }
    }
}

impl Pool for EvictingPool {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        let evicted = self.evicted.lock();
        self.inner
            .exists(keys)
            .into_iter()
            .zip(keys)
            .map(|(present, key)| present.map(|present| present && !evicted.contains(*key)))
            .collect()
    }

    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.puts
            .lock()
            .extend(keys.iter().map(|key| (*key).to_owned()));
        let mut evicted = self.evicted.lock();
        let results = self.inner.put(keys, values);
        results
            .into_iter()
            .zip(keys)
            .map(|(result, key)| {
                if evicted.remove(*key) {
                    // The same bytes as before (page content is deterministic): written again.
                    self.rewritten.lock().push((*key).to_owned());
                    return Ok(());
                }
                result
            })
            .collect()
    }

    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        let evicted = self.evicted.lock();
        if keys.iter().any(|key| evicted.contains(*key)) {
            return keys.iter().map(|_| Err(PoolError::NotFound)).collect();
        }
        drop(evicted);
        self.inner.get_into(keys, buffers)
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.exists(keys)
    }

    fn counters(&self) -> PoolCounters {
        self.inner.counters()
    }

    fn name(&self) -> &'static str {
        "evicting"
    }
}

/// Asks `reserve_prefix` until the lookup answers; returns the offered tokens.
fn offered(
    handle: &mut kv_connector::connector::ConnectorHandle,
    request: RequestId,
    local: usize,
) -> usize {
    common::wait_until("the lookup", || {
        match handle.reserve_prefix(request, local, ReservationId(request.0)) {
            ReserveAnswer::Pending => {
                handle.wait_for_progress(Duration::from_millis(50));
                None
            }
            ReserveAnswer::Offer { extra_tokens, .. } => Some(extra_tokens),
        }
    })
}

/// The head-block scenario with re-save on (`resave_min_tokens = 64`) or off: returns the
/// tokens the final lookup offers and the keys rewritten.
fn head_block_scenario(
    resave_min_tokens: u64,
) -> Result<(usize, Vec<String>), Box<dyn std::error::Error>> {
    let layout = Layout::preset("tiny-full")?;
    let mut config = Config::default();
    config.saver.resave_min_tokens = resave_min_tokens;
    let pool = Arc::new(EvictingPool::new());
    let mut instance = start(pool.clone(), &layout, config);
    // Turn 1: 10 blocks + 3 tokens, saved in one chunk.
    let first = prompt(100, 10 * 16 + 3);
    instance.save_prompt(RequestId(1), &first, &layout, 0);
    // The saver puts in FIFO order: the first key is block 0's.
    let head = pool.puts.lock().first().cloned().ok_or("nothing saved")?;
    // The pool evicts the chain's head block while the engine's local prefix cache still
    // serves the turn's first 160 tokens (a local hit refreshes nothing in the pool).
    pool.evicted.lock().insert(head.clone());
    // Turn 2: the same 160 tokens from the local cache plus 200 new ones: a long prompt
    // (200 computed tokens >= 64) whose last chunk lists every block again (R20).
    let second = prompt(100, 160 + 200);
    instance
        .handle
        .lookup_prefix(RequestId(2), Arc::clone(&second), 160)?;
    assert_eq!(offered(&mut instance.handle, RequestId(2), 160), 0);
    instance.write_pages(second.len(), &layout, 20);
    let table: Vec<i32> = (20..20 + 23).collect();
    let tables: [&[i32]; 1] = [&table];
    instance.handle.on_step(&SchedulerOutput {
        requests: vec![ScheduledRequest {
            request: RequestId(2),
            prompt_len: second.len(),
            computed_before: 160,
            computed_after: second.len(),
            new_reservation: None,
            page_tables: &tables,
        }],
    });
    instance.handle.settle_saves();
    // Turn 3 on an instance without the local cache: how much of turn 2 is offered?
    instance
        .handle
        .lookup_prefix(RequestId(3), Arc::clone(&second), 0)?;
    let hit = offered(&mut instance.handle, RequestId(3), 0);
    let stats = instance.handle.shutdown();
    if resave_min_tokens > 0 {
        // 10 blocks listed again: the head rewritten, 9 refreshed (present, R19).
        assert_eq!(stats.saves.saves_refreshed, 9);
    }
    let rewritten = pool.rewritten.lock().clone();
    Ok((hit, rewritten))
}

/// R20: re-save repairs an evicted head block; the next lookup gets the full hit again.
#[test]
fn resave_rewrites_an_evicted_head_block_and_restores_the_full_hit_r20() -> TestResult {
    let (hit, rewritten) = head_block_scenario(64)?;
    assert_eq!(rewritten.len(), 1);
    // 360 tokens: every full block before the one holding the last token (22 blocks).
    assert_eq!(hit, 22 * 16);
    Ok(())
}

/// Without re-save the head stays evicted and the whole stored chain is unreachable.
#[test]
fn without_resave_an_evicted_head_block_makes_the_chain_unreachable_r20() -> TestResult {
    let (hit, rewritten) = head_block_scenario(0)?;
    assert!(rewritten.is_empty());
    assert_eq!(hit, 0);
    Ok(())
}

/// R22: a full save queue sheds the oldest request whole, its re-saves with its new full
/// blocks (they serve one chain), keeps the newer request whole, never blocks the engine
/// (both requests' pages are released once their saves settle), and counts every drop.
#[test]
fn a_full_save_queue_sheds_the_oldest_request_with_its_resaves_and_counts_every_drop_r22(
) -> TestResult {
    let layout = Layout::preset("tiny-full")?;
    let mut config = Config::default();
    config.saver.resave_min_tokens = 64;
    config.saver.queue_capacity_pages = 24;
    let mut instance = start(memory_pool(64 << 20), &layout, config);
    // Request 1: 160 tokens from the local cache, 200 computed in one chunk: 10 re-saves
    // (blocks 0..10) and 12 new full blocks (10..22). Request 2: 3 new full blocks.
    let first = prompt(7, 160 + 200);
    let second = prompt(5_000_000, 3 * 16 + 1);
    instance
        .handle
        .lookup_prefix(RequestId(1), Arc::clone(&first), 160)
        .expect("the request is new");
    look_up(&mut instance.handle, RequestId(2), &second);
    assert_eq!(offered(&mut instance.handle, RequestId(1), 160), 0);
    assert_eq!(offered(&mut instance.handle, RequestId(2), 0), 0);
    instance.write_pages(first.len(), &layout, 0);
    instance.write_pages(second.len(), &layout, 40);
    let first_pages: Vec<i32> = (0..23).collect();
    let second_pages: Vec<i32> = (40..44).collect();
    let first_tables: Vec<&[i32]> = vec![&first_pages];
    let second_tables: Vec<&[i32]> = vec![&second_pages];
    // One step, so one message: 22 + 3 pages reach a queue of 24, request 1's first. The
    // 25th push finds the queue full and sheds request 1, the oldest, whole.
    instance.handle.on_step(&SchedulerOutput {
        requests: vec![
            ScheduledRequest {
                request: RequestId(1),
                prompt_len: first.len(),
                computed_before: 160,
                computed_after: first.len(),
                new_reservation: None,
                page_tables: &first_tables,
            },
            ScheduledRequest {
                request: RequestId(2),
                prompt_len: second.len(),
                computed_before: 0,
                computed_after: second.len(),
                new_reservation: None,
                page_tables: &second_tables,
            },
        ],
    });
    let mut kept: Vec<RequestId> = [RequestId(1), RequestId(2)]
        .into_iter()
        .filter(|&request| instance.handle.request_finished(request))
        .collect();
    instance.handle.settle_saves();
    let mut finished = instance.handle.get_finished_saves();
    kept.sort();
    finished.sort();
    assert_eq!(finished, kept, "every kept request's pages are released");
    let saves = instance.handle.shutdown().saves;
    assert_eq!(saves.saves_enqueued, 25);
    // Request 1 whole, re-saves and new blocks alike; request 2 is stored whole.
    assert_eq!(saves.saves_dropped, 22);
    assert_eq!(saves.saves_done, 3);
    assert_eq!(saves.saves_refreshed, 0);
    assert_eq!(
        saves.saves_enqueued,
        saves.saves_done + saves.saves_skipped_present + saves.saves_dropped + saves.saves_failed
    );
    Ok(())
}
