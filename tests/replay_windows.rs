//! Window loads through the replay (R12, R15): the engine simulator's page check reports
//! a connector that loads a window wrongly. Scripted connectors (`common::scripted`) that
//! load one window block short, skip the sink blocks, or load the window of the wrong
//! resume point are each reported as mismatched pages, exactly the pages they left
//! unfilled, and the replay fails its checks; one that loads what R15 names verifies every
//! page. Geometries: `W` a multiple of `T` (tiny-hybrid), `W` not a multiple of `T` with
//! the sinks in block 0, sinks over two blocks, and two ranks.
#![cfg(feature = "cli")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::scripted::{blocks_to_fill, Computed, WindowLoader, WindowMistake};
use kv_connector::config::Config;
use kv_connector::core::layout::{Attention, Layout};
use kv_connector::replay::checks::{check, FailedCheck};
use kv_connector::replay::cost::CostModel;
use kv_connector::replay::workload::{generate_long_multiturn, LongMultiturnParams};
use kv_connector::replay::{
    run_replay, DeploymentParams, InstanceContext, KvBytesScale, KvPages, NoProgress, PoolMaster,
    ReplayConnector, ReplayError, ReplayParams, ReplayReport, Routing,
};
use parking_lot::Mutex;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `(T, W, S, world)` of each geometry after tiny-hybrid's `(16, 64, 4, 1)`.
const GEOMETRIES: [(u32, u32, u32, u32); 3] = [(16, 40, 4, 1), (16, 72, 20, 1), (32, 100, 1, 2)];

/// A full group and a window group of `W` tokens with `S` sinks, at `T` and `world` ranks.
fn layout(t: u32, w: u32, s: u32, world: u32) -> Result<Layout, Box<dyn std::error::Error>> {
    let text = format!(
        "name = \"window-t{t}-w{w}-s{s}\"\ntokens_per_block = {t}\nworld_size = {world}\n\
         [[groups]]\nid = 0\nkind = \"full\"\nlayers = [1, 3]\nkv_heads = 2\nhead_dim = 16\n\
         dtype_bytes = 2\n\
         [[groups]]\nid = 1\nkind = \"window\"\nwindow_tokens = {w}\nsink_tokens = {s}\n\
         layers = [0, 2]\nkv_heads = 2\nhead_dim = 16\ndtype_bytes = 2\n"
    );
    Ok(Layout::from_toml_str(&text, "test layout")?)
}

fn layouts() -> Result<Vec<Layout>, Box<dyn std::error::Error>> {
    let mut layouts = vec![Layout::preset("tiny-hybrid")?];
    for (t, w, s, world) in GEOMETRIES {
        layouts.push(layout(t, w, s, world)?);
    }
    Ok(layouts)
}

fn params(layout: &Layout) -> ReplayParams {
    ReplayParams {
        config: Arc::new(Config::default()),
        cost: CostModel::for_layout("tiny-hybrid", layout.world_size),
        layout: Arc::new(layout.clone()),
        deployment: DeploymentParams {
            instances: 2,
            kv_pages: KvPages::Fixed(2048),
            kv_bytes_scale: KvBytesScale::Fixed(1.0),
            host_memory_limit_bytes: 4 << 30,
            pool_master: PoolMaster::Start,
        },
        routing: Routing::RoundRobin,
        max_num_tokens: 512,
        stall_timeout: Duration::from_secs(10),
        wait_timeout: Duration::from_millis(1),
        connector_name: "scripted".to_owned(),
        local_prefix_cache: false,
        drafter: None,
        release_during_loads: false,
        pace: None,
    }
}

/// Replays two conversations of three turns (2000 to 3000 tokens, a 1600-token shared
/// prefix) with a [`WindowLoader`] making `mistake` on every instance; returns the report
/// and the pages the loaders left unfilled.
fn replay(layout: &Layout, mistake: WindowMistake) -> Result<(ReplayReport, u64), ReplayError> {
    let workload = generate_long_multiturn(&LongMultiturnParams {
        sessions: 2,
        turns_per_session: 3,
        first_turn_tokens: 2_000,
        last_turn_tokens: 3_000,
        output_tokens: 16,
        think_time_ms: 30_000,
        session_spacing_ms: 10_000,
        seed: 7,
        system_prefix_tokens: 1_600,
        documents: 0,
        document_tokens: 0,
        divergence_tokens_max: 0,
    })?;
    let computed = Computed::default();
    let unfilled = Arc::new(Mutex::new(0));
    let mut factory = |context: &InstanceContext| -> Result<Box<dyn ReplayConnector>, ReplayError> {
        Ok(Box::new(WindowLoader::new(
            context,
            mistake,
            Arc::clone(&computed),
            Arc::clone(&unfilled),
        )))
    };
    let report = run_replay(&params(layout), &workload, &mut factory, &mut NoProgress)?;
    let unfilled = *unfilled.lock();
    Ok((report, unfilled))
}

#[test]
fn the_scripted_windows_are_r12_s_blocks() {
    let window = Attention::window(40, 20);
    let fill = |resume, mistake| -> Vec<usize> {
        blocks_to_fill(window, 16, resume, mistake)
            .into_iter()
            .collect()
    };
    // e = 160: sinks [0, 2); the window [120, 160) overlaps blocks 7..10.
    assert_eq!(fill(160, WindowMistake::None), [0, 1, 7, 8, 9]);
    assert_eq!(fill(160, WindowMistake::OneWindowBlockShort), [0, 1, 8, 9]);
    assert_eq!(fill(160, WindowMistake::SkipSinks), [7, 8, 9]);
    assert_eq!(fill(160, WindowMistake::WrongResumePoint), [0, 1, 6, 7, 8]);
    // A window reaching into the sinks: e = 48 overlaps blocks 0..3.
    assert_eq!(fill(48, WindowMistake::None), [0, 1, 2]);
    assert_eq!(fill(48, WindowMistake::OneWindowBlockShort), [0, 1]);
    assert_eq!(
        blocks_to_fill(Attention::FULL, 16, 64, WindowMistake::SkipSinks)
            .into_iter()
            .collect::<Vec<_>>(),
        [0, 1, 2, 3],
        "full groups load every block"
    );
}

#[test]
fn loading_what_r15_names_verifies_every_page_in_every_geometry() -> TestResult {
    for layout in layouts()? {
        let (report, unfilled) = replay(&layout, WindowMistake::None)?;
        let name = &layout.name;
        assert_eq!(unfilled, 0, "{name}");
        assert_eq!(report.completed, 6, "{name}");
        assert!(report.loads_filled >= 4, "{name}: {}", report.loads_filled);
        assert!(report.window_bytes_per_load.loads > 0, "{name}");
        assert!(report.reused_tokens > 0, "{name}");
        assert_eq!(report.mismatched_pages, 0, "{name}");
        assert_eq!(report.verified_pages, report.pages_loaded, "{name}");
        assert_eq!(check(&report), Ok(()), "{name}");
    }
    Ok(())
}

/// Each mistake leaves pages unfilled that the engine lists, and the page check reports
/// exactly those, in every geometry; the replay then fails its checks.
fn assert_caught(mistake: WindowMistake) -> TestResult {
    for layout in layouts()? {
        let (report, unfilled) = replay(&layout, mistake)?;
        let name = &layout.name;
        assert!(report.loads_filled >= 4, "{name}: {mistake:?}");
        assert!(unfilled >= report.loads_filled, "{name}: {mistake:?}");
        assert_eq!(report.mismatched_pages, unfilled, "{name}: {mistake:?}");
        let failed = check(&report).err().ok_or("the checks passed")?;
        assert_eq!(
            failed.0,
            [FailedCheck::MismatchedPages { pages: unfilled }],
            "{name}: {mistake:?}"
        );
    }
    Ok(())
}

#[test]
fn a_load_one_window_block_short_is_reported_as_mismatched_pages() -> TestResult {
    assert_caught(WindowMistake::OneWindowBlockShort)
}

#[test]
fn a_load_without_the_sink_blocks_is_reported_as_mismatched_pages() -> TestResult {
    assert_caught(WindowMistake::SkipSinks)
}

#[test]
fn a_load_of_the_wrong_resume_point_s_window_is_reported_as_mismatched_pages() -> TestResult {
    assert_caught(WindowMistake::WrongResumePoint)
}
