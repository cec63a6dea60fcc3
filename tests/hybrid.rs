//! Hybrid sliding-window + full-attention layouts end to end (R12, R13, R15, R17,
//! R21).
//!
//! Replays with the real connector (`kvc_connector`) on scripted prompts whose sharing is
//! known exactly, so every lookup outcome is predictable, and on generated conversations:
//! - every loaded page verifies (0 mismatched pages);
//! - a prompt that diverges from the previous one before its end resumes `rewound` when an
//!   earlier prompt end lies within `R`, `recovered` (fallback on) or `window_miss`
//!   (fallback off) when it lies further back (R12, R13);
//! - a larger rewind `R` reuses more (R17 saves `W + R` tokens of window at a prompt end).
//!
//! And the connector driven directly (the harness of `tests/pipeline.rs`):
//! - a load fills only the sinks and the window of the resume point in a window group
//!   (R15);
//! - the saver puts window pages ahead of full-attention blocks queued before them, and in
//!   FIFO order with `window_first` off (R21), seen through the pool's put order.
#![cfg(feature = "cli")]

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{
    finished_loads, look_up, memory_pool, page_content, prompt, reserve, start, TestPool,
};
use kv_connector::config::Config;
use kv_connector::connector::{EngineConnector, ReserveAnswer, ScheduledRequest, SchedulerOutput};
use kv_connector::core::hash::{hash_blocks, scope_seed, Scope};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::{GroupId, Layout};
use kv_connector::pool::Pool;
use kv_connector::replay::cost::CostModel;
use kv_connector::replay::workload::{
    generate_long_multiturn, read_mooncake_trace, LongMultiturnParams, Oracle, PromptSource,
    TokenSegment, WorkloadRequest,
};
use kv_connector::replay::{
    kvc_connector, run_replay, DeploymentParams, KvBytesScale, KvPages, NoProgress, PoolMaster,
    ReplayParams, ReplayReport, Routing,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SHARED_TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/mooncake_synthetic_trace.jsonl"
);

/// Replay parameters for `preset` on 2 instances with `config`.
fn replay_params(
    preset: &str,
    config: Config,
    kv_bytes_scale: f64,
) -> Result<ReplayParams, Box<dyn std::error::Error>> {
    let layout = Layout::preset(preset)?;
    Ok(ReplayParams {
        config: Arc::new(config),
        cost: CostModel::for_layout(&layout.name, layout.world_size),
        layout: Arc::new(layout),
        deployment: DeploymentParams {
            instances: 2,
            kv_pages: KvPages::Fixed(8192),
            kv_bytes_scale: KvBytesScale::Fixed(kv_bytes_scale),
            // Room for both instances' connector staging pools (768 MiB each by default).
            host_memory_limit_bytes: 4 << 30,
            pool_master: PoolMaster::Start,
        },
        routing: Routing::RoundRobin,
        max_num_tokens: 8192,
        stall_timeout: Duration::from_secs(30),
        wait_timeout: Duration::from_millis(5),
        connector_name: "kvc".to_owned(),
        local_prefix_cache: false,
        drafter: None,
        release_during_loads: false,
        pace: None,
    })
}

/// The default configuration with rewind `R` and the fallback switch.
fn config(rewind_tokens: u64, window_fallback: bool) -> Config {
    let mut config = Config::default();
    config.planner.swa_endpoint_rewind_tokens = rewind_tokens;
    config.planner.window_fallback = window_fallback;
    config
}

/// A request made of token segments `(stream seed, tokens)`, arriving at `arrival_ms`.
fn scripted(id: u64, arrival_ms: u64, segments: &[(u64, u32)]) -> WorkloadRequest {
    WorkloadRequest {
        id,
        arrival_ms,
        session: None,
        prompt: PromptSource::Segments(
            segments
                .iter()
                .map(|&(seed, len)| TokenSegment { seed, len })
                .collect(),
        ),
        output_tokens: 4,
    }
}

/// Five prompts on tiny-hybrid (`T = 16`, `W = 64`, `S = 4`), 10 s apart so each is saved
/// before the next is looked up. Stream 1 is a 2000-token history (125 blocks).
///
/// | prompt | tokens | shares the pool's prefix through | note |
/// | --- | --- | --- | --- |
/// | A | 2000 | nothing | ends at 2000 |
/// | B | A + 600 | 2000 (A) | ends at 2600 |
/// | C | A + 200 of B + 300 new | 2200 (B), `H*T = 2192` | 192 past A's end |
/// | D | A + 300 of B + 200 new | 2300 (B), `H*T = 2288` | 288 past A's end |
/// | F | A + 560 of B + 100 new | 2560 (B), `H*T = 2560` | 40 before B's end |
fn diverging_prompts() -> Vec<WorkloadRequest> {
    let history = (1, 2000);
    vec![
        scripted(0, 0, &[history]),
        scripted(1, 10_000, &[history, (2, 600)]),
        scripted(2, 20_000, &[history, (2, 200), (3, 300)]),
        scripted(3, 30_000, &[history, (2, 300), (4, 200)]),
        scripted(4, 40_000, &[history, (2, 560), (5, 100)]),
    ]
}

/// Replays [`diverging_prompts`] on tiny-hybrid with `config`.
fn replay_diverging(config: Config) -> Result<ReplayReport, Box<dyn std::error::Error>> {
    let params = replay_params("tiny-hybrid", config, 1.0)?;
    let workload = diverging_prompts();
    Ok(run_replay(
        &params,
        &workload,
        &mut kvc_connector,
        &mut NoProgress,
    )?)
}

/// The outcomes as `[full, rewound, recovered, window_miss, full_miss]`.
fn outcomes(report: &ReplayReport) -> [u64; 5] {
    let lookups = &report.lookups;
    [
        lookups.full,
        lookups.rewound,
        lookups.recovered,
        lookups.window_miss,
        lookups.full_miss,
    ]
}

/// R12, R13: with `R = 256`, B resumes at A's end (full); C's window at 2192 was never saved
/// (B saved `[2280, 2600)`), but A's end at 2000 is within 256 tokens (rewound); D's
/// nearest complete window, A's end, is 288 tokens back (recovered by the fallback); F
/// resumes at 2560 inside B's saved tail (full).
#[test]
fn diverging_prompts_resume_rewound_and_recovered_r12_r13() -> TestResult {
    let report = replay_diverging(config(256, true))?;
    assert_eq!(report.mismatched_pages, 0);
    assert!(report.verified_pages > 0);
    assert_eq!(report.completed, 5);
    // [full, rewound, recovered, window_miss, full_miss]
    assert_eq!(outcomes(&report), [2, 1, 1, 0, 1]);
    assert_eq!(report.reused_tokens, 2000 + 2000 + 2000 + 2560);
    assert_eq!(report.loads_failed, 0);
    Ok(())
}

/// R13: with the fallback off, D (recovered above) gets nothing: `window_miss`.
#[test]
fn without_fallback_the_recovered_prompt_is_a_window_miss_r13() -> TestResult {
    let report = replay_diverging(config(256, false))?;
    assert_eq!(report.mismatched_pages, 0);
    assert_eq!(outcomes(&report), [2, 1, 0, 1, 1]);
    assert_eq!(report.reused_tokens, 2000 + 2000 + 2560);
    Ok(())
}

/// R17: the rewind decides how far back a prompt end's window is saved. With `R = 0` only
/// `[P - W, P)` is saved, so C, D and F all fall back to A's end (2000 each); the default
/// `R` (2048) saves B's whole tail back to token 488, so C, D and F resume where they
/// diverge.
#[test]
fn a_larger_rewind_reuses_more_r17() -> TestResult {
    let none = replay_diverging(config(0, true))?;
    let some = replay_diverging(config(256, true))?;
    let default = replay_diverging(Config::default())?;
    for report in [&none, &some, &default] {
        assert_eq!(report.mismatched_pages, 0);
    }
    assert_eq!(outcomes(&none), [1, 0, 3, 0, 1]);
    assert_eq!(none.reused_tokens, 4 * 2000);
    assert_eq!(outcomes(&default), [4, 0, 0, 0, 1]);
    assert_eq!(default.reused_tokens, 2000 + 2192 + 2288 + 2560);
    assert!(none.reused_tokens < some.reused_tokens);
    assert!(some.reused_tokens < default.reused_tokens);
    // The window oracle counts a resume point only within R of an earlier prompt end:
    // C and D fall back to A's end below R = 2048, F needs R >= 40. The replay reaches it.
    for (report, window_oracle) in [(&none, 8000), (&some, 8560), (&default, 9040)] {
        assert_eq!(report.oracle_window_reusable_tokens, window_oracle);
        assert_eq!(report.reused_tokens, window_oracle);
        assert_eq!(report.oracle_reusable_tokens, 9040);
    }
    assert_eq!(none.setup.swa_rewind_tokens, 0);
    assert_eq!(default.setup.swa_rewind_tokens, 2048);
    // Each prompt end saves `(W + R) / T` window pages at most: more R, more pages.
    assert!(none.pages_saved < some.pages_saved);
    assert!(some.pages_saved < default.pages_saved);
    Ok(())
}

/// Generated conversations on gpt-oss-120b (`T = 32`, `W = 128`) whose turns re-render up
/// to 256 tokens of the previous prompt: every load verifies, and `R = 0` (windows saved
/// only at exact prompt ends, which the next turn no longer shares) reuses far less than
/// the default rewind.
#[test]
fn conversations_with_rerendered_tails_need_the_rewind() -> TestResult {
    let workload = generate_long_multiturn(&LongMultiturnParams {
        sessions: 2,
        turns_per_session: 4,
        first_turn_tokens: 6_000,
        last_turn_tokens: 9_000,
        output_tokens: 32,
        system_prefix_tokens: 2_000,
        divergence_tokens_max: 256,
        seed: 11,
        ..LongMultiturnParams::default()
    })?;
    let mut reports = Vec::new();
    for config in [config(0, true), Config::default()] {
        let params = replay_params("gpt-oss-120b", config, 1.0 / 1024.0)?;
        reports.push(run_replay(
            &params,
            &workload,
            &mut kvc_connector,
            &mut NoProgress,
        )?);
    }
    let (none, default) = (&reports[0], &reports[1]);
    for report in &reports {
        assert_eq!(report.mismatched_pages, 0);
        assert_eq!(report.completed, 8);
    }
    assert!(
        none.reused_tokens < default.reused_tokens,
        "R = 0 reused {}, the default {}",
        none.reused_tokens,
        default.reused_tokens
    );
    assert!(
        none.lookups.recovered + none.lookups.window_miss > 0,
        "{:?}",
        none.lookups
    );
    // The default rewind covers every re-rendered tail: each later turn resumes where it
    // diverges; only the second conversation's first turn (the shared system prefix, where
    // no prompt ended) finds no window.
    assert_eq!(default.lookups.full, 6, "{:?}", default.lookups);
    assert_eq!(default.lookups.window_miss, 1, "{:?}", default.lookups);
    Ok(())
}

/// R15 in the report: on tiny-hybrid (`T = 16`, `W = 64`, `S = 4`) a load moves at most
/// one sink block, the four window blocks and one block of misalignment per rank.
#[test]
fn window_bytes_per_load_stay_within_sinks_window_and_one_block_r15() -> TestResult {
    let report = replay_diverging(Config::default())?;
    let layout = Layout::preset("tiny-hybrid")?;
    let window_page = layout
        .groups
        .iter()
        .find(|group| group.id == GroupId(1))
        .ok_or("no window group")?;
    let page_bytes = layout.page_bytes(window_page)?;
    let window = &report.window_bytes_per_load;
    assert_eq!(window.bound, (1 + 4 + 1) * page_bytes);
    assert_eq!(window.loads, report.loads_filled);
    assert!(window.loads > 0);
    assert!(window.max <= window.bound, "{window:?}");
    // Every resume point here lies past the sinks and a whole window: 1 + 4 pages each.
    assert_eq!(window.max, 5 * page_bytes);
    #[expect(clippy::cast_precision_loss, reason = "a small exact integer")]
    let expected_mean = (5 * page_bytes) as f64;
    assert!((window.mean - expected_mean).abs() < 1e-6);
    // A full-attention layout has no window bytes and no bound.
    let params = replay_params("tiny-full", Config::default(), 1.0)?;
    let full = run_replay(
        &params,
        &diverging_prompts(),
        &mut kvc_connector,
        &mut NoProgress,
    )?;
    assert_eq!(
        (
            full.window_bytes_per_load.loads,
            full.window_bytes_per_load.bound
        ),
        (0, 0)
    );
    assert_eq!(
        full.oracle_window_reusable_tokens,
        full.oracle_reusable_tokens
    );
    Ok(())
}

/// The Rust window oracle against `scripts/window-oracle`'s "window tokens" column on the
/// shared trace at `T = 32` (`scripts/window-oracle 512 1024 2048`).
#[test]
fn window_oracle_agrees_with_the_script_on_the_shared_trace() -> TestResult {
    let workload = read_mooncake_trace(Path::new(SHARED_TRACE), None)?;
    let seed = scope_seed(&Scope::default());
    let mut tokens = Vec::new();
    let mut prompts = Vec::with_capacity(workload.len());
    for request in &workload {
        request.write_prompt_tokens(&mut tokens);
        prompts.push((hash_blocks(seed, &tokens, 32)?, tokens.len()));
    }
    for (rewind, script) in [(512, 31_182_560), (1024, 36_883_680), (2048, 39_635_168)] {
        let mut oracle = Oracle::with_window_rewind(rewind);
        for (hashes, prompt_len) in &prompts {
            oracle.admit(hashes, *prompt_len, 32);
        }
        let totals = oracle.totals();
        assert_eq!(totals.reusable_tokens, 39_849_184);
        assert_eq!(totals.window_reusable_tokens, script, "R = {rewind}");
    }
    Ok(())
}

/// R3 with a window group: at world size 2, a prompt end whose window pages reached the
/// pool for rank 0 only has no complete window; nothing is offered until both ranks'
/// window pages are stored.
#[test]
fn a_window_counts_only_when_every_shard_is_stored_r3() -> TestResult {
    let layout = Layout::preset("tiny-hybrid")?.with_world_size(2)?;
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let pool: Arc<dyn Pool> = Arc::clone(&test_pool) as Arc<dyn Pool>;
    let tokens = prompt(21, 12 * 16 + 1);
    *test_pool.refuse_puts_containing.lock() = Some("/w2r1/lg1/".into());
    let mut writer = start(Arc::clone(&pool), &layout, Config::default());
    writer.save_prompt(RequestId(1), &tokens, &layout, 0);
    let mut reader = start(Arc::clone(&pool), &layout, Config::default());
    look_up(&mut reader.handle, RequestId(2), &tokens);
    let nothing = ReserveAnswer::Offer {
        extra_tokens: 0,
        is_async: false,
    };
    assert_eq!(
        reserve(&mut reader.handle, RequestId(2), ReservationId(2)),
        nothing
    );
    *test_pool.refuse_puts_containing.lock() = None;
    writer.save_prompt(RequestId(3), &tokens, &layout, 0);
    look_up(&mut reader.handle, RequestId(4), &tokens);
    assert_eq!(
        reserve(&mut reader.handle, RequestId(4), ReservationId(4)),
        ReserveAnswer::Offer {
            extra_tokens: 12 * 16,
            is_async: true
        }
    );
    let lookups = reader.handle.shutdown().lookups;
    assert_eq!((lookups.window_miss, lookups.full), (1, 1), "{lookups:?}");
    Ok(())
}

/// R15: a window group loads only its sinks and the window of the resume point, although
/// the pool holds the whole prompt's window pages; the other pages are never touched.
#[test]
fn loads_cover_only_sinks_and_the_window_of_the_resume_point_r15() -> TestResult {
    let layout = Layout::preset("tiny-hybrid")?;
    let (full, window) = (GroupId(0), GroupId(1));
    let pool: Arc<dyn Pool> = memory_pool(64 << 20);
    let mut writer = start(Arc::clone(&pool), &layout, Config::default());
    let mut reader = start(Arc::clone(&pool), &layout, Config::default());
    // 20 full blocks and 3 tokens: the default R saves the window group's every block.
    let tokens = prompt(40, 20 * 16 + 3);
    look_up(&mut writer.handle, RequestId(1), &tokens);
    reserve(&mut writer.handle, RequestId(1), ReservationId(1));
    writer.compute(RequestId(1), &tokens, &layout, 0);
    writer.handle.settle_saves();
    assert_eq!(writer.handle.stats().saves.saves_done, 40);

    let marker = vec![0xEE_u8; reader.devices[0].page_pool(window)?.page_bytes];
    for page in 100..121 {
        reader.devices[0].write_page(window, page, &marker)?;
    }
    look_up(&mut reader.handle, RequestId(2), &tokens);
    assert_eq!(
        reserve(&mut reader.handle, RequestId(2), ReservationId(2)),
        ReserveAnswer::Offer {
            extra_tokens: 320,
            is_async: true
        }
    );
    reader.start_load(RequestId(2), ReservationId(2), tokens.len(), &layout, 100);
    let finished = finished_loads(&mut reader.handle);
    assert!(finished.len() == 1 && finished[0].filled, "{finished:?}");
    let device = &reader.devices[0];
    let len = device.page_pool(full)?.page_bytes;
    for block in 0..20 {
        let page = 100 + u32::try_from(block)?;
        assert_eq!(
            device.read_page_to_vec(full, page)?,
            page_content(full, 0, block, len),
            "full block {block}"
        );
        // Resume at 320: the sink block 0 and the blocks overlapping [256, 320).
        let loaded = block == 0 || block >= 16;
        let expected = if loaded {
            page_content(window, 0, block, marker.len())
        } else {
            marker.clone()
        };
        assert_eq!(
            device.read_page_to_vec(window, page)?,
            expected,
            "window block {block}"
        );
    }
    let stats = reader.handle.shutdown();
    assert_eq!(stats.lookups.full, 1);
    assert_eq!(stats.loads.pages_loaded, 20 + 5);
    writer.handle.shutdown();
    Ok(())
}

/// Runs a 10-block prompt on tiny-hybrid in two chunks while the pool holds the first put,
/// so that the second chunk's saves (full blocks 4-9 and the window pages) queue behind
/// full blocks 1-3 of the first; returns `(group, block)` of every put, in order.
fn put_order(window_first: bool) -> Result<Vec<(u32, usize)>, Box<dyn std::error::Error>> {
    let layout = Layout::preset("tiny-hybrid")?;
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let pool: Arc<dyn Pool> = Arc::clone(&test_pool) as Arc<dyn Pool>;
    let mut config = Config::default();
    config.saver.window_first = window_first;
    // One page per batch: one put per page, so the put order is the queue order.
    config.saver.staging_bytes = 1;
    let mut instance = start(pool, &layout, config);
    let tokens = prompt(7, 10 * 16 + 3);
    look_up(&mut instance.handle, RequestId(1), &tokens);
    reserve(&mut instance.handle, RequestId(1), ReservationId(1));
    instance.write_pages(tokens.len(), &layout, 0);
    test_pool.hold_puts.store(true, Ordering::SeqCst);
    instance.chunk(RequestId(1), tokens.len(), &layout, 0, 0..64);
    instance.chunk(RequestId(1), tokens.len(), &layout, 0, 64..tokens.len());
    // 4 + 6 full blocks, 10 window pages; once the saver counted them all, they are queued.
    common::wait_until("the saver to count 20 enqueued pages", || {
        std::thread::yield_now();
        (instance.handle.stats().saves.saves_enqueued >= 20).then_some(())
    });
    test_pool.hold_puts.store(false, Ordering::SeqCst);
    test_pool.release_one_get();
    instance.handle.settle_saves();
    assert_eq!(instance.handle.shutdown().saves.saves_done, 20);
    logged_puts(&test_pool, &tokens)
}

/// The pool's put log as `(group, block)` of `tokens`' blocks (tiny-hybrid, `T = 16`).
fn logged_puts(
    test_pool: &TestPool,
    tokens: &[i64],
) -> Result<Vec<(u32, usize)>, Box<dyn std::error::Error>> {
    let hashes = hash_blocks(scope_seed(&Scope::default()), tokens, 16)?;
    let blocks: HashMap<String, usize> = hashes
        .iter()
        .enumerate()
        .map(|(block, hash)| (hash.to_hex(), block))
        .collect();
    let log = test_pool.put_log.lock().clone();
    log.iter()
        .map(|key| {
            let group = key
                .split('/')
                .find_map(|segment| segment.strip_prefix("lg"))
                .and_then(|id| id.parse::<u32>().ok());
            let block = key.rsplit('/').next().and_then(|hex| blocks.get(hex));
            match (group, block) {
                (Some(group), Some(&block)) => Ok((group, block)),
                _ => Err(format!("unexpected key {key}").into()),
            }
        })
        .collect()
}

/// R17 save set through the connector: nothing of the window group at an earlier chunk;
/// at the last chunk exactly the sink block and the tail blocks overlapping
/// `[P - W - R, P)` that the request still holds (a page index of `-1` is skipped).
#[test]
fn window_saves_are_the_sinks_and_the_held_tail_at_the_last_chunk_r17() -> TestResult {
    let layout = Layout::preset("tiny-hybrid")?;
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let pool: Arc<dyn Pool> = Arc::clone(&test_pool) as Arc<dyn Pool>;
    let mut instance = start(pool, &layout, config(0, true));
    // P = 163, W = 64, R = 0: the tail [99, 163) overlaps blocks 6..=9; sinks: block 0.
    let tokens = prompt(31, 10 * 16 + 3);
    look_up(&mut instance.handle, RequestId(1), &tokens);
    reserve(&mut instance.handle, RequestId(1), ReservationId(1));
    instance.write_pages(tokens.len(), &layout, 0);
    instance.chunk(RequestId(1), tokens.len(), &layout, 0, 0..64);
    instance.handle.settle_saves();
    let early = logged_puts(&test_pool, &tokens)?;
    assert_eq!(early, (0..4).map(|block| (0, block)).collect::<Vec<_>>());
    // The last chunk, with the window group no longer holding block 8.
    let full_table: Vec<i32> = (0..11).collect();
    let mut window_table = full_table.clone();
    window_table[8] = -1;
    let tables: Vec<&[i32]> = vec![&full_table, &window_table];
    instance.handle.on_step(&SchedulerOutput {
        requests: vec![ScheduledRequest {
            request: RequestId(1),
            prompt_len: tokens.len(),
            computed_before: 64,
            computed_after: tokens.len(),
            new_reservation: None,
            page_tables: &tables,
        }],
    });
    instance.handle.settle_saves();
    let mut window: Vec<usize> = logged_puts(&test_pool, &tokens)?
        .into_iter()
        .filter(|&(group, _)| group == 1)
        .map(|(_, block)| block)
        .collect();
    window.sort_unstable();
    assert_eq!(window, vec![0, 6, 7, 9]);
    let full = logged_puts(&test_pool, &tokens)?
        .iter()
        .filter(|&&(group, _)| group == 0)
        .count();
    assert_eq!(full, 10);
    Ok(())
}

/// R21: window pages are put ahead of full-attention blocks queued before them; full
/// blocks keep FIFO order among themselves.
#[test]
fn window_pages_are_saved_ahead_of_queued_full_blocks_r21() -> TestResult {
    let order = put_order(true)?;
    let expected: Vec<(u32, usize)> = std::iter::once((0, 0))
        .chain((0..10).map(|block| (1, block)))
        .chain((1..10).map(|block| (0, block)))
        .collect();
    assert_eq!(
        order, expected,
        "the first put was in flight before the rest"
    );
    Ok(())
}

/// R21 off: the same saves go out first in, first out.
#[test]
fn without_window_first_saves_go_out_in_fifo_order_r21() -> TestResult {
    let order = put_order(false)?;
    let expected: Vec<(u32, usize)> = (0..10)
        .map(|block| (0, block))
        .chain((0..10).map(|block| (1, block)))
        .collect();
    assert_eq!(order, expected);
    Ok(())
}
