//! The replay fails when the KV is wrong (`replay::checks`): a replay that ran to its end
//! with a mismatched page, a page published past its chunk end, or accounting that does
//! not close writes its whole report (stdout, `--json`, `--report-dir`) and then fails
//! with every failed check on one line, exit status 3.
//!
//! Publications past the chunk end have a witness of their own at the pool
//! (`replay::witness`): a scripted connector that publishes the page its chunk ends inside
//! (stale bytes, R16) while counting nothing itself is caught there.
#![cfg(feature = "cli")]

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::scripted::{Computed, WindowLoader, WindowMistake};
use kv_connector::cli::replay::{run_with_connector, ReplayCliError};
use kv_connector::cli::signals::StopSignal;
use kv_connector::cli::CliError;
use kv_connector::config::Config;
use kv_connector::connector::{
    EngineConnector, FinishedLoad, HookError, ReserveAnswer, SchedulerOutput,
};
use kv_connector::core::hash::{hash_blocks, scope_seed, BlockHash, Scope};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::keys::KeySpace;
use kv_connector::core::layout::Layout;
use kv_connector::core::object::{object_len, seal, HEADER_BYTES};
use kv_connector::gpu::Device;
use kv_connector::pool::Pool;
use kv_connector::replay::checks::{check, FailedCheck};
use kv_connector::replay::cost::CostModel;
use kv_connector::replay::workload::{generate_long_multiturn, LongMultiturnParams};
use kv_connector::replay::{
    no_connector, run_replay, DeploymentParams, InstanceContext, KvBytesScale, KvPages, NoProgress,
    PoolMaster, ReplayConnector, ReplayError, ReplayParams, ReplayReport, Routing,
};
use kv_connector::stats::ConnectorStats;
use parking_lot::Mutex;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A fresh directory under the system's temporary directory, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("kvc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What `kv-connector replay` returned, and its stdout.
struct CliRun {
    result: Result<(), ReplayCliError>,
    out: String,
}

/// Runs `kv-connector replay` (a three-turn conversation on tiny-hybrid, `flags`) with a
/// [`WindowLoader`] making `mistake` as every instance's connector.
fn replay_cli(
    mistake: WindowMistake,
    flags: &[&str],
) -> Result<CliRun, Box<dyn std::error::Error>> {
    let args = common::small_replay_args(flags)?;
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
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let result = run_with_connector(
        &args,
        HashMap::<String, String>::new(),
        &StopSignal::never(),
        Some(&mut factory),
        &mut out,
        &mut err,
    );
    Ok(CliRun {
        result,
        out: String::from_utf8(out)?,
    })
}

#[test]
fn a_wrong_connector_s_replay_writes_its_report_then_exits_3() -> TestResult {
    let dir = ScratchDir::new("checks-report-dir");
    let dir_text = dir.0.display().to_string();
    let CliRun { result, out } = replay_cli(
        WindowMistake::WrongBytes,
        &["--json", "--report-dir", &dir_text],
    )?;
    let report: serde_json::Value = serde_json::from_str(&out)?;
    let mismatched = report["mismatched_pages"]
        .as_u64()
        .ok_or("no mismatched_pages")?;
    assert!(mismatched > 0, "{report}");
    assert_eq!(report["verified_pages"], 0);
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("report.json"))?)?;
    assert_eq!(written["mismatched_pages"], mismatched);
    assert!(dir.0.join("timeline.json").is_file());
    let err = result.err().ok_or("the replay passed its checks")?;
    assert_eq!(err.kind(), "checks_failed");
    let line = err.to_string();
    assert!(
        line.contains(&format!("{mismatched} mismatched pages")),
        "{line}"
    );
    assert!(!line.contains('\n'), "one line: {line}");
    assert_eq!(CliError::from(err).exit_code(), 3);
    Ok(())
}

#[test]
fn the_table_is_written_before_the_checks_fail_and_a_right_connector_passes() -> TestResult {
    let CliRun { result, out } = replay_cli(WindowMistake::OneWindowBlockShort, &[])?;
    assert!(out.contains("page check"), "the table is on stdout: {out}");
    let err = result.err().ok_or("the replay passed its checks")?;
    assert!(
        matches!(&err, ReplayCliError::ChecksFailed(failed)
            if matches!(failed.0.as_slice(), [FailedCheck::MismatchedPages { pages }] if *pages > 0)),
        "{err}"
    );
    let CliRun { result, out } = replay_cli(WindowMistake::None, &[])?;
    assert!(out.contains("0 mismatched"), "{out}");
    assert!(result.is_ok(), "{result:?}");
    Ok(())
}

fn tiny_full_params(max_num_tokens: usize) -> Result<ReplayParams, Box<dyn std::error::Error>> {
    let layout = Layout::preset("tiny-full")?;
    Ok(ReplayParams {
        config: Arc::new(Config::default()),
        cost: CostModel::for_layout(&layout.name, layout.world_size),
        layout: Arc::new(layout),
        deployment: DeploymentParams {
            instances: 1,
            kv_pages: KvPages::Fixed(2048),
            kv_bytes_scale: KvBytesScale::Fixed(1.0),
            host_memory_limit_bytes: 4 << 30,
            pool_master: PoolMaster::Start,
        },
        routing: Routing::RoundRobin,
        max_num_tokens,
        stall_timeout: Duration::from_secs(10),
        wait_timeout: Duration::from_millis(1),
        connector_name: "scripted".to_owned(),
        local_prefix_cache: false,
        drafter: None,
        release_during_loads: false,
        pace: None,
    })
}

fn workload() -> Result<Vec<kv_connector::replay::workload::WorkloadRequest>, ReplayError> {
    Ok(generate_long_multiturn(&LongMultiturnParams {
        sessions: 1,
        turns_per_session: 2,
        first_turn_tokens: 2_000,
        last_turn_tokens: 2_500,
        output_tokens: 16,
        think_time_ms: 30_000,
        session_spacing_ms: 10_000,
        seed: 3,
        system_prefix_tokens: 1_000,
        documents: 0,
        document_tokens: 0,
        divergence_tokens_max: 0,
    })?)
}

#[test]
fn every_failed_check_is_named_in_order() -> TestResult {
    let mut report: ReplayReport = run_replay(
        &tiny_full_params(512)?,
        &workload()?,
        &mut no_connector,
        &mut NoProgress,
    )?;
    assert_eq!(check(&report), Ok(()));
    report.mismatched_pages = 2;
    report.published_uncomputed_pages = 5;
    report.saves_enqueued = 7;
    report.saves_done = 3;
    let failed = check(&report).err().ok_or("the checks passed")?;
    assert_eq!(
        failed.0,
        [
            FailedCheck::MismatchedPages { pages: 2 },
            FailedCheck::PublishedPastChunkEnd {
                counted: 0,
                witnessed: 5
            },
            FailedCheck::AccountingOpen {
                saves_enqueued: 7,
                saves_settled: 3,
                loads_started: 0,
                loads_settled: 0
            },
        ]
    );
    let line = failed.to_string();
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.contains("5 uncomputed pages seen at the pool"),
        "{line}"
    );
    report.mismatched_pages = 0;
    report.published_uncomputed_pages = 0;
    report.published_past_chunk_end = 1;
    report.saves_done = 7;
    let failed = check(&report).err().ok_or("the checks passed")?;
    assert_eq!(
        failed.0,
        [FailedCheck::PublishedPastChunkEnd {
            counted: 1,
            witnessed: 0
        }]
    );
    Ok(())
}

/// Publishes every full block a step computed into the replay's pool, as the runtime
/// would (R3 keys, R5 objects, page bytes read from the device), and with
/// `past_chunk_end` also the block the chunk ends inside, whose page is still stale (an
/// R16 bug); counts nothing in `published_past_chunk_end` either way.
struct Publisher {
    past_chunk_end: bool,
    devices: Vec<Device>,
    pool: Arc<dyn Pool>,
    keys: KeySpace,
    tokens_per_block: usize,
    hashes: HashMap<RequestId, (Vec<BlockHash>, usize)>,
    report: ConnectorStats,
}

impl Publisher {
    fn new(context: &InstanceContext, past_chunk_end: bool) -> Result<Self, ReplayError> {
        let payload_lens: Vec<usize> = context
            .stored_page_bytes
            .iter()
            .map(|&(_, bytes)| bytes)
            .collect();
        let keys = KeySpace::new(&context.layout, "ns", "witness", &payload_lens)
            .map_err(|_| ReplayError::NoRequests)?;
        Ok(Self {
            past_chunk_end,
            devices: context.devices.clone(),
            pool: Arc::clone(&context.pool),
            keys,
            tokens_per_block: context.layout.tokens_per_block as usize,
            hashes: HashMap::new(),
            report: ConnectorStats::default(),
        })
    }

    fn publish(&mut self, request: RequestId, table: &[i32], block: usize) {
        let Some(hash) = self
            .hashes
            .get(&request)
            .and_then(|(hashes, _)| hashes.get(block))
        else {
            return;
        };
        let Some(group) = self.keys.group(0) else {
            return;
        };
        let Some(Ok(page)) = table.get(block).map(|&page| u32::try_from(page)) else {
            return;
        };
        for (rank, device) in (0_u32..).zip(&self.devices) {
            let mut object = vec![0; object_len(group.payload_len)];
            let read = device.read_page(group.group, page, &mut object[HEADER_BYTES..]);
            let identity = self.keys.identity(group, rank, *hash);
            let sealed = seal(&identity, &mut object, group.payload_len);
            assert!(read.is_ok() && sealed.is_ok(), "{read:?} {sealed:?}");
            let key = group.key(rank, hash);
            let stored = self.pool.put(&[key.as_str()], &[&object]);
            self.report.saves.saves_enqueued += 1;
            if stored.iter().all(Result::is_ok) {
                self.report.saves.saves_done += 1;
                self.report.saves.bytes_saved += object.len() as u64;
            } else {
                self.report.saves.saves_skipped_present += 1;
            }
        }
    }
}

impl EngineConnector for Publisher {
    fn lookup_prefix(
        &mut self,
        request: RequestId,
        prompt: Arc<[i64]>,
        _local: usize,
    ) -> Result<(), HookError> {
        let hashes = hash_blocks(
            scope_seed(&Scope::default()),
            &prompt,
            self.tokens_per_block,
        )
        .unwrap_or_default();
        self.hashes.insert(request, (hashes, 0));
        Ok(())
    }

    fn reserve_prefix(&mut self, _: RequestId, _: usize, _: ReservationId) -> ReserveAnswer {
        self.report.lookups.full_miss += 1;
        ReserveAnswer::Offer {
            extra_tokens: 0,
            is_async: true,
        }
    }

    fn release_prefix_reservation(&mut self, _: RequestId, _: ReservationId, _: usize, _: usize) {}

    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
        Vec::new()
    }

    fn on_step(&mut self, output: &SchedulerOutput<'_>) {
        let t = self.tokens_per_block;
        for scheduled in &output.requests {
            let Some(&(ref hashes, published)) = self.hashes.get(&scheduled.request) else {
                continue;
            };
            let mut limit = scheduled.computed_after / t;
            if self.past_chunk_end && scheduled.computed_after % t != 0 {
                limit += 1;
            }
            let limit = limit.min(hashes.len());
            for block in published..limit {
                self.publish(scheduled.request, scheduled.page_tables[0], block);
            }
            if let Some(state) = self.hashes.get_mut(&scheduled.request) {
                state.1 = state.1.max(limit);
            }
        }
    }

    fn request_finished(&mut self, request: RequestId) -> bool {
        self.hashes.remove(&request);
        false
    }

    fn get_finished_saves(&mut self) -> Vec<RequestId> {
        Vec::new()
    }

    fn wait_for_progress(&mut self, _timeout: Duration) {}

    fn settle_saves(&mut self) {}
}

impl ReplayConnector for Publisher {
    fn report(&mut self) -> ConnectorStats {
        self.report.clone()
    }
}

fn publish_replay(past_chunk_end: bool) -> Result<ReplayReport, Box<dyn std::error::Error>> {
    // 500-token chunks end inside 16-token blocks.
    let mut factory = |context: &InstanceContext| -> Result<Box<dyn ReplayConnector>, ReplayError> {
        Ok(Box::new(Publisher::new(context, past_chunk_end)?))
    };
    Ok(run_replay(
        &tiny_full_params(500)?,
        &workload()?,
        &mut factory,
        &mut NoProgress,
    )?)
}

#[test]
fn the_pool_s_witness_sees_stale_pages_published_past_the_chunk_end_r16() -> TestResult {
    let good = publish_replay(false)?;
    assert!(good.pages_saved > 100, "{}", good.pages_saved);
    assert_eq!(good.published_uncomputed_pages, 0);
    assert_eq!(check(&good), Ok(()));
    let bad = publish_replay(true)?;
    assert_eq!(
        bad.published_past_chunk_end, 0,
        "the connector counts nothing"
    );
    assert!(bad.published_uncomputed_pages > 0, "{bad:?}");
    let failed = check(&bad).err().ok_or("the checks passed")?;
    assert_eq!(
        failed.0,
        [FailedCheck::PublishedPastChunkEnd {
            counted: 0,
            witnessed: bad.published_uncomputed_pages
        }]
    );
    Ok(())
}
