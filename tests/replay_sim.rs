//! The replay engine simulator and driver (`docs/DESIGN.md` section 11) against the baseline
//! `NoConnector` and small scripted connectors that implement the engine hooks themselves:
//! they offer prefixes they remember, fill reserved pages (with the right bytes, wrong
//! bytes, or not at all), copy pages like a tiny pool, and hold pages for saves.
//!
//! What is checked: every request completes; reuse is counted only for filled loads and
//! every loaded page is checked (R24, R25); a wrong or stale page is caught (R16 made
//! checkable); failed loads are computed (R25); pending lookups and held pages are
//! honoured (R22); session turns wait for the previous turn; the JSON report has every
//! field; identical runs give identical reports.
//!
//! The local prefix cache (`--local-prefix-cache`) is checked here too, without a
//! connector, with the scripted ones and with the real connector (`kvc_connector`): a
//! repeated prefix on one instance is served locally, the pool's share shrinks by what the
//! cache served, shared pages pass the page check, and the connector neither loads nor
//! saves the locally matched blocks (R19).
#![cfg(feature = "cli")]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kv_connector::cli::{replay as replay_cli, Cli, Command};
use kv_connector::config::Config;
use kv_connector::connector::{
    EngineConnector, FinishedLoad, HookError, ReserveAnswer, SchedulerOutput,
};
use kv_connector::core::hash::{hash_blocks, scope_seed, BlockHash, Scope};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Layout;
use kv_connector::gpu::Device;
use kv_connector::replay::content::{ContentGroup, PageChecker};
use kv_connector::replay::cost::CostModel;
use kv_connector::replay::workload::{
    generate_long_multiturn, LongMultiturnParams, WorkloadRequest,
};
use kv_connector::replay::{
    kvc_connector, no_connector, run_replay, DeploymentParams, InstanceContext, KvBytesScale,
    KvPages, NoProgress, PoolMaster, ReplayConnector, ReplayError, ReplayParams, ReplayReport,
    Routing,
};
use kv_connector::stats::ConnectorStats;
use kv_connector::stats::LatencySummary;
use parking_lot::Mutex;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// How a scripted connector fills the pages of a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    /// The content generator's bytes for each block: what computing it gives.
    Generate,
    /// The content of another block: a wrong page.
    Wrong,
    /// Nothing; the load is reported failed.
    Fail,
    /// Bytes copied from device pages at save time, like a pool; `past_chunk_end` also
    /// saves the block the chunk ends inside (an R16 bug).
    Copy { past_chunk_end: bool },
}

/// How a scripted connector handles the pages of finished requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Saves {
    /// `request_finished` returns `false`: pages are freed at once.
    Free,
    /// `request_finished` returns `true`; saves are reported after this many polls.
    HoldFor(u32),
    /// `request_finished` returns `true`; saves are never reported.
    HoldForever,
}

/// What a scripted connector does.
#[derive(Clone, Copy, Debug)]
struct Script {
    fill: Fill,
    /// `reserve_prefix` answers `Pending` this many times per request first.
    pending_polls: u32,
    /// What `request_finished` answers and when saves are reported.
    saves: Saves,
    /// Offer the whole prompt (more than the engine may take), whatever is stored.
    over_offer: bool,
    /// Loads run in the background (`is_async`).
    is_async: bool,
    /// Fill a load's pages only when it is reported, ignoring releases meanwhile: a
    /// connector that breaks R29.
    fill_at_report: bool,
}

impl Script {
    fn new(fill: Fill) -> Self {
        Self {
            fill,
            pending_polls: 0,
            saves: Saves::Free,
            over_offer: false,
            is_async: true,
            fill_at_report: false,
        }
    }
}

/// What every instance's connector saved: the hashes, and page bytes in copy mode.
#[derive(Default)]
struct Store {
    saved: HashSet<BlockHash>,
    pages: HashMap<(usize, u32, BlockHash), Vec<u8>>,
}

/// One logged hook call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Lookup(RequestId),
    /// The first `on_step` that names the request.
    Scheduled(RequestId),
    Finished(RequestId),
    SavesReported(RequestId),
}

/// What the test reads back from the connectors.
#[derive(Default)]
struct Log {
    /// `lookup_prefix` and `request_finished` calls, in order.
    events: Vec<Event>,
    releases: Vec<(RequestId, ReservationId, usize, usize)>,
    reserve_calls: u64,
}

struct RequestState {
    hashes: Vec<BlockHash>,
    prompt_len: usize,
    pending_left: u32,
    offer_blocks: usize,
    saved_blocks: usize,
}

struct Scripted {
    script: Script,
    devices: Vec<Device>,
    groups: Vec<ContentGroup>,
    tokens_per_block: usize,
    store: Arc<Mutex<Store>>,
    log: Arc<Mutex<Log>>,
    requests: HashMap<RequestId, RequestState>,
    scheduled: HashSet<RequestId>,
    finished_loads: Vec<FinishedLoad>,
    /// Fills left for the report (`Script::fill_at_report`): request, tables, blocks.
    late_fills: Vec<(RequestId, Vec<Vec<i32>>, std::ops::Range<usize>)>,
    pending_saves: Vec<(RequestId, u32)>,
    checker: PageChecker,
    report: ConnectorStats,
}

impl Scripted {
    fn new(
        context: &InstanceContext,
        script: Script,
        store: Arc<Mutex<Store>>,
        log: Arc<Mutex<Log>>,
    ) -> Self {
        Self {
            script,
            devices: context.devices.clone(),
            groups: context.layout.groups.iter().map(ContentGroup::of).collect(),
            tokens_per_block: context.layout.tokens_per_block as usize,
            store,
            log,
            requests: HashMap::new(),
            scheduled: HashSet::new(),
            finished_loads: Vec::new(),
            late_fills: Vec::new(),
            pending_saves: Vec::new(),
            checker: PageChecker::new(context.layout.world_size),
            report: ConnectorStats::default(),
        }
    }

    /// Fills the pages of `[start, end)` blocks of a new reservation.
    fn fill(&mut self, request: RequestId, tables: &[&[i32]], blocks: std::ops::Range<usize>) {
        let Some(state) = self.requests.get(&request) else {
            return;
        };
        let store = self.store.lock();
        for (group_index, group) in self.groups.iter().enumerate() {
            for block in blocks.clone() {
                let Ok(page) = u32::try_from(tables[group_index][block]) else {
                    continue;
                };
                let hash = state.hashes[block];
                match self.script.fill {
                    Fill::Generate => {
                        let _ = self
                            .checker
                            .write_computed(&self.devices, group, page, &hash);
                    }
                    Fill::Wrong => {
                        let wrong = BlockHash([0xEE; 16]);
                        let _ = self
                            .checker
                            .write_computed(&self.devices, group, page, &wrong);
                    }
                    Fill::Fail => {}
                    Fill::Copy { .. } => {
                        for (rank, device) in (0_u32..).zip(&self.devices) {
                            if let Some(bytes) = store.pages.get(&(group_index, rank, hash)) {
                                let _ = device.write_page(group.id, page, bytes);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Saves the blocks `[saved_blocks, limit)` of a request.
    fn save(&mut self, request: RequestId, tables: &[&[i32]], computed_after: usize) {
        let t = self.tokens_per_block;
        let Some(state) = self.requests.get_mut(&request) else {
            return;
        };
        let mut limit = computed_after / t;
        if self.script.fill
            == (Fill::Copy {
                past_chunk_end: true,
            })
            && computed_after % t != 0
        {
            limit += 1;
        }
        let limit = limit.min(state.hashes.len());
        let mut store = self.store.lock();
        let blocks = state.hashes.iter().enumerate().take(limit);
        for (block, &hash) in blocks.skip(state.saved_blocks) {
            if !store.saved.insert(hash) {
                self.report.saves.saves_skipped_present += 1;
                continue;
            }
            for (group_index, group) in self.groups.iter().enumerate() {
                let Ok(page) = u32::try_from(tables[group_index][block]) else {
                    continue;
                };
                for (rank, device) in (0_u32..).zip(&self.devices) {
                    if let Ok(bytes) = device.read_page_to_vec(group.id, page) {
                        self.report.saves.saves_done += 1;
                        self.report.saves.bytes_saved += bytes.len() as u64;
                        store.pages.insert((group_index, rank, hash), bytes);
                    }
                }
            }
        }
        state.saved_blocks = state.saved_blocks.max(limit);
    }
}

impl EngineConnector for Scripted {
    fn lookup_prefix(
        &mut self,
        request: RequestId,
        prompt: Arc<[i64]>,
        _local_match_tokens: usize,
    ) -> Result<(), HookError> {
        self.log.lock().events.push(Event::Lookup(request));
        let hashes = hash_blocks(
            scope_seed(&Scope::default()),
            &prompt,
            self.tokens_per_block,
        )
        .unwrap_or_default();
        self.requests.insert(
            request,
            RequestState {
                hashes,
                prompt_len: prompt.len(),
                pending_left: self.script.pending_polls,
                offer_blocks: 0,
                saved_blocks: 0,
            },
        );
        Ok(())
    }

    fn reserve_prefix(
        &mut self,
        request: RequestId,
        num_computed: usize,
        _reservation: ReservationId,
    ) -> ReserveAnswer {
        self.log.lock().reserve_calls += 1;
        let Some(state) = self.requests.get_mut(&request) else {
            return ReserveAnswer::Offer {
                extra_tokens: 0,
                is_async: true,
            };
        };
        if state.pending_left > 0 {
            state.pending_left -= 1;
            return ReserveAnswer::Pending;
        }
        let t = self.tokens_per_block;
        if self.script.over_offer {
            state.offer_blocks = state.hashes.len();
            return ReserveAnswer::Offer {
                extra_tokens: state.prompt_len,
                is_async: self.script.is_async,
            };
        }
        let cap = state.prompt_len.saturating_sub(1) / t;
        let store = self.store.lock();
        let blocks = state
            .hashes
            .iter()
            .take(cap)
            .take_while(|hash| store.saved.contains(hash))
            .count();
        state.offer_blocks = blocks;
        if blocks == 0 {
            self.report.lookups.full_miss += 1;
        } else {
            self.report.lookups.full += 1;
        }
        ReserveAnswer::Offer {
            extra_tokens: blocks * t - num_computed.min(blocks * t),
            is_async: self.script.is_async,
        }
    }

    fn release_prefix_reservation(
        &mut self,
        request: RequestId,
        reservation: ReservationId,
        start: usize,
        end: usize,
    ) {
        self.log
            .lock()
            .releases
            .push((request, reservation, start, end));
        if let Some(state) = self.requests.get_mut(&request) {
            state.offer_blocks = state.offer_blocks.min(start / self.tokens_per_block);
        }
    }

    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
        for (request, tables, blocks) in std::mem::take(&mut self.late_fills) {
            let tables: Vec<&[i32]> = tables.iter().map(Vec::as_slice).collect();
            self.fill(request, &tables, blocks);
        }
        std::mem::take(&mut self.finished_loads)
    }

    fn on_step(&mut self, output: &SchedulerOutput<'_>) {
        for scheduled in &output.requests {
            if self.scheduled.insert(scheduled.request) {
                self.log
                    .lock()
                    .events
                    .push(Event::Scheduled(scheduled.request));
            }
            if let Some(reservation) = scheduled.new_reservation {
                let start = scheduled.computed_before / self.tokens_per_block;
                let end = self
                    .requests
                    .get(&scheduled.request)
                    .map_or(start, |state| state.offer_blocks);
                if self.script.fill_at_report {
                    let tables = scheduled.page_tables.iter().map(|t| t.to_vec()).collect();
                    self.late_fills
                        .push((scheduled.request, tables, start..end));
                } else {
                    self.fill(scheduled.request, scheduled.page_tables, start..end);
                }
                let filled = self.script.fill != Fill::Fail;
                // Each load counted once, as the real connector does (stats::A2).
                self.report.loads.loads_started += 1;
                if filled {
                    self.report.loads.loads_done += 1;
                } else {
                    self.report.loads.loads_failed += 1;
                }
                if filled {
                    if let Some(state) = self.requests.get_mut(&scheduled.request) {
                        state.saved_blocks = end;
                    }
                }
                self.finished_loads.push(FinishedLoad {
                    reservation,
                    request: scheduled.request,
                    filled,
                });
            } else {
                self.save(
                    scheduled.request,
                    scheduled.page_tables,
                    scheduled.computed_after,
                );
            }
        }
    }

    fn request_finished(&mut self, request: RequestId) -> bool {
        self.log.lock().events.push(Event::Finished(request));
        self.requests.remove(&request);
        match self.script.saves {
            Saves::Free => false,
            Saves::HoldFor(polls) => {
                self.pending_saves.push((request, polls));
                true
            }
            Saves::HoldForever => true,
        }
    }

    fn get_finished_saves(&mut self) -> Vec<RequestId> {
        let mut done = Vec::new();
        self.pending_saves.retain_mut(|(request, polls)| {
            if *polls == 0 {
                done.push(*request);
                false
            } else {
                *polls -= 1;
                true
            }
        });
        self.log
            .lock()
            .events
            .extend(done.iter().map(|&request| Event::SavesReported(request)));
        done
    }

    fn wait_for_progress(&mut self, _timeout: Duration) {}

    fn settle_saves(&mut self) {}
}

impl ReplayConnector for Scripted {
    fn report(&mut self) -> ConnectorStats {
        self.report.clone()
    }
}

/// Two conversations of three turns, 2000 to 3000 tokens, sharing a 1600-token prefix.
fn small_workload() -> Result<Vec<WorkloadRequest>, Box<dyn std::error::Error>> {
    workload_with_think_time(30_000)
}

/// [`small_workload`] with another think time between turns.
fn workload_with_think_time(
    think_time_ms: u64,
) -> Result<Vec<WorkloadRequest>, Box<dyn std::error::Error>> {
    Ok(generate_long_multiturn(&LongMultiturnParams {
        sessions: 2,
        turns_per_session: 3,
        first_turn_tokens: 2_000,
        last_turn_tokens: 3_000,
        output_tokens: 16,
        think_time_ms,
        session_spacing_ms: 10_000,
        seed: 7,
        system_prefix_tokens: 1_600,
        documents: 0,
        document_tokens: 0,
        divergence_tokens_max: 0,
    })?)
}

fn params(
    preset: &str,
    instances: usize,
    max_num_tokens: usize,
) -> Result<ReplayParams, Box<dyn std::error::Error>> {
    let layout = Layout::preset(preset)?;
    Ok(ReplayParams {
        config: Arc::new(Config::default()),
        cost: CostModel::for_layout(&layout.name, layout.world_size),
        layout: Arc::new(layout),
        deployment: DeploymentParams {
            instances,
            kv_pages: KvPages::Fixed(2048),
            kv_bytes_scale: KvBytesScale::Fixed(1.0),
            host_memory_limit_bytes: 1 << 30,
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

/// Runs the small workload with a scripted connector per instance.
fn run_scripted(
    params: &ReplayParams,
    script: Script,
) -> Result<(ReplayReport, Arc<Mutex<Log>>), ReplayError> {
    let workload = small_workload().map_err(|_| ReplayError::NoRequests)?;
    run_scripted_on(params, script, &workload)
}

/// Runs `workload` with a scripted connector per instance.
fn run_scripted_on(
    params: &ReplayParams,
    script: Script,
    workload: &[WorkloadRequest],
) -> Result<(ReplayReport, Arc<Mutex<Log>>), ReplayError> {
    let store = Arc::new(Mutex::new(Store::default()));
    let log = Arc::new(Mutex::new(Log::default()));
    let mut factory = |context: &InstanceContext| -> Result<Box<dyn ReplayConnector>, ReplayError> {
        Ok(Box::new(Scripted::new(
            context,
            script,
            store.clone(),
            log.clone(),
        )))
    };
    let report = run_replay(params, workload, &mut factory, &mut NoProgress)?;
    Ok((report, log))
}

#[test]
fn no_connector_completes_every_request_without_reuse() -> TestResult {
    let params = params("tiny-hybrid", 2, 512)?;
    let workload = small_workload()?;
    let report = run_replay(&params, &workload, &mut no_connector, &mut NoProgress)?;
    assert_eq!(report.requests, 6);
    assert_eq!(report.completed, 6);
    assert_eq!(report.prompt_tokens, 15_000);
    assert_eq!(report.computed_tokens, report.prompt_tokens);
    assert_eq!(report.reused_tokens, 0);
    assert_eq!((report.verified_pages, report.mismatched_pages), (0, 0));
    assert_eq!(report.lookups.with_outage(), 0);
    assert_eq!(report.loads_failed + report.loads_filled, 0);
    assert_eq!(report.held_at_end, 0);
    // Every turn after a session's first shares its previous turn's full blocks.
    assert!(
        report.oracle_reusable_tokens > 10_000,
        "{}",
        report.oracle_reusable_tokens
    );
    assert!(
        report.sim.duration_s > 60.0,
        "two think times of 30 s: {}",
        report.sim.duration_s
    );
    assert!(report.sim.ttft_p50_s > 0.0);
    Ok(())
}

/// R29 at scale (`--release-during-loads`): every load of two blocks or more gives back its
/// second half while it runs, and another request writes those pages at once. Pages a
/// connector wrote before the release are fine; one that writes the released pages
/// afterwards (fills at the report, ignoring the release) is caught by the page check.
#[test]
fn releases_during_loads_catch_a_connector_that_writes_released_pages_r29() -> TestResult {
    let mut params = params("tiny-full", 1, 512)?;
    params.release_during_loads = true;
    let (report, log) = run_scripted(&params, Script::new(Fill::Generate))?;
    assert_eq!(report.completed, 6);
    assert!(report.loads_released_in_flight > 0, "{report:?}");
    assert!(report.pages_released_in_flight > 0, "{report:?}");
    assert_eq!(report.mismatched_pages, 0);
    assert!(log
        .lock()
        .releases
        .iter()
        .all(|&(_, _, start, end)| start % 16 == 0 && end > start));
    assert_eq!(
        report.computed_tokens + report.reused_tokens,
        report.prompt_tokens
    );
    let mut late = Script::new(Fill::Generate);
    late.fill_at_report = true;
    let (careless, _) = run_scripted(&params, late)?;
    assert!(
        careless.mismatched_pages >= careless.pages_released_in_flight
            && careless.pages_released_in_flight > 0,
        "every page written after its release is a mismatch: {careless:?}"
    );
    Ok(())
}

#[test]
fn correct_fills_are_verified_and_counted_as_reuse_r24() -> TestResult {
    let params = params("tiny-full", 1, 512)?;
    let (report, _) = run_scripted(&params, Script::new(Fill::Generate))?;
    assert_eq!(report.completed, 6);
    assert_eq!(report.mismatched_pages, 0);
    assert!(report.verified_pages > 0);
    assert_eq!(report.verified_pages, report.pages_loaded);
    // The connector remembers every computed block: it reuses what an unbounded pool would.
    assert_eq!(report.reused_tokens, report.oracle_reusable_tokens);
    assert_eq!(
        report.computed_tokens + report.reused_tokens,
        report.prompt_tokens
    );
    assert_eq!(report.lookups.full + report.lookups.full_miss, 6);
    assert_eq!(
        report.lookups.full_miss, 1,
        "only the very first prompt misses"
    );
    Ok(())
}

#[test]
fn wrong_fills_are_caught_by_the_page_check() -> TestResult {
    let params = params("tiny-full", 1, 512)?;
    let (report, _) = run_scripted(&params, Script::new(Fill::Wrong))?;
    assert_eq!(report.completed, 6);
    assert!(report.mismatched_pages > 0);
    assert_eq!(report.verified_pages, 0);
    Ok(())
}

#[test]
fn failed_loads_are_released_and_computed_r25() -> TestResult {
    let params = params("tiny-full", 1, 512)?;
    let (report, log) = run_scripted(&params, Script::new(Fill::Fail))?;
    assert_eq!(report.completed, 6);
    assert_eq!(report.reused_tokens, 0);
    assert_eq!(report.verified_pages + report.mismatched_pages, 0);
    assert_eq!(report.computed_tokens, report.prompt_tokens);
    assert_eq!(report.loads_failed, 5);
    let log = log.lock();
    assert_eq!(log.releases.len(), 5);
    assert!(log
        .releases
        .iter()
        .all(|&(_, _, start, end)| start == 0 && end > 0 && end % 16 == 0));
    Ok(())
}

#[test]
fn copied_pages_verify_across_instances() -> TestResult {
    let params = params("tiny-hybrid", 2, 512)?;
    let (report, _) = run_scripted(
        &params,
        Script::new(Fill::Copy {
            past_chunk_end: false,
        }),
    )?;
    assert_eq!(report.completed, 6);
    assert!(report.verified_pages > 0);
    assert_eq!(report.mismatched_pages, 0);
    assert_eq!(report.reused_tokens, report.oracle_reusable_tokens);
    assert!(report.pages_saved > 0);
    Ok(())
}

#[test]
fn saving_past_the_chunk_end_is_caught_on_reuse_r16() -> TestResult {
    // 500-token chunks end inside 16-token blocks; the buggy connector saves the stale page.
    let params = params("tiny-full", 1, 500)?;
    let (bad, _) = run_scripted(
        &params,
        Script::new(Fill::Copy {
            past_chunk_end: true,
        }),
    )?;
    assert!(bad.mismatched_pages > 0, "{bad:?}");
    let (good, _) = run_scripted(
        &params,
        Script::new(Fill::Copy {
            past_chunk_end: false,
        }),
    )?;
    assert_eq!(good.mismatched_pages, 0);
    assert!(good.verified_pages > 0);
    Ok(())
}

#[test]
fn window_groups_load_sinks_and_window_only_r15() -> TestResult {
    let params = params("tiny-hybrid", 1, 512)?;
    let (report, _) = run_scripted(&params, Script::new(Fill::Generate))?;
    let full_params = params_for_full_only()?;
    let (full, _) = run_scripted(&full_params, Script::new(Fill::Generate))?;
    assert_eq!(report.mismatched_pages, 0);
    assert_eq!(report.reused_tokens, full.reused_tokens);
    // A window group adds only its sinks and window per load, far fewer than the full group.
    assert!(report.pages_loaded > full.pages_loaded);
    assert!(report.pages_loaded < 2 * full.pages_loaded);
    Ok(())
}

fn params_for_full_only() -> Result<ReplayParams, Box<dyn std::error::Error>> {
    params("tiny-full", 1, 512)
}

#[test]
fn pending_lookups_keep_requests_waiting() -> TestResult {
    let params = params("tiny-full", 1, 512)?;
    let script = Script {
        pending_polls: 3,
        ..Script::new(Fill::Generate)
    };
    let (report, log) = run_scripted(&params, script)?;
    assert_eq!(report.completed, 6);
    assert_eq!(report.mismatched_pages, 0);
    assert!(log.lock().reserve_calls >= 6 * 4);
    Ok(())
}

#[test]
fn held_pages_are_freed_when_saves_finish_r22() -> TestResult {
    // 200 pages hold one prompt at a time: the next is admitted only after saves free pages.
    let mut params = params("tiny-full", 1, 512)?;
    params.deployment.kv_pages = KvPages::Fixed(200);
    let script = Script {
        saves: Saves::HoldFor(2),
        ..Script::new(Fill::Generate)
    };
    let (report, log) = run_scripted(&params, script)?;
    assert_eq!(report.completed, 6);
    assert_eq!(report.held_at_end, 0);
    assert_eq!(report.unexpected_save_reports, 0);
    // `engine::E3`: a request's pages stay until its saves are reported, so the next request is
    // scheduled only after that; at most one request holds pages at any time.
    let mut holding = 0_i32;
    for event in &log.lock().events {
        match event {
            Event::Scheduled(_) => holding += 1,
            Event::SavesReported(_) => holding -= 1,
            Event::Lookup(_) | Event::Finished(_) => {}
        }
        assert!(holding <= 1, "two requests held pages at once");
    }
    assert_eq!(holding, 0);
    Ok(())
}

#[test]
fn pages_never_released_are_reported_held_at_end() -> TestResult {
    let mut params = params("tiny-full", 1, 512)?;
    params.stall_timeout = Duration::ZERO;
    let script = Script {
        saves: Saves::HoldForever,
        ..Script::new(Fill::Generate)
    };
    let (report, _) = run_scripted(&params, script)?;
    assert_eq!(report.completed, 6);
    assert_eq!(report.held_at_end, 6);
    Ok(())
}

#[test]
fn a_connector_that_never_frees_pages_stalls_with_a_clear_error() -> TestResult {
    let mut params = params("tiny-full", 1, 512)?;
    params.deployment.kv_pages = KvPages::Fixed(200);
    params.stall_timeout = Duration::ZERO;
    let script = Script {
        saves: Saves::HoldForever,
        ..Script::new(Fill::Generate)
    };
    match run_scripted(&params, script) {
        Err(ReplayError::Stalled { held, .. }) => assert!(held > 0),
        other => panic!(
            "expected a stall, got {:?}",
            other.map(|(report, _)| report)
        ),
    }
    Ok(())
}

#[test]
fn over_offers_are_trimmed_before_the_last_token() -> TestResult {
    let params = params("tiny-full", 1, 512)?;
    let script = Script {
        over_offer: true,
        ..Script::new(Fill::Generate)
    };
    let (report, log) = run_scripted(&params, script)?;
    assert_eq!(report.offers_trimmed, 6);
    assert_eq!(report.mismatched_pages, 0);
    for &(_, _, start, end) in &log.lock().releases {
        assert_eq!(start % 16, 0);
        assert!(end > start);
    }
    // Every prompt computes its last block: (P - 1) / T * T loaded, the rest computed.
    assert_eq!(
        report.computed_tokens + report.reused_tokens,
        report.prompt_tokens
    );
    assert!(report.computed_tokens >= 6);
    Ok(())
}

#[test]
fn sync_loads_verify_and_lengthen_the_step() -> TestResult {
    let params = params("llama-3.1-8b", 1, 512)?;
    let mut params = params;
    params.deployment.kv_bytes_scale = KvBytesScale::Fixed(1.0 / 4096.0);
    let (sync, _) = run_scripted(
        &params,
        Script {
            is_async: false,
            ..Script::new(Fill::Generate)
        },
    )?;
    let (background, _) = run_scripted(&params, Script::new(Fill::Generate))?;
    assert_eq!(sync.mismatched_pages, 0);
    assert!(sync.verified_pages > 0);
    assert_eq!(sync.reused_tokens, background.reused_tokens);
    // Stored pages are scaled, modeled bytes are not.
    assert_eq!(sync.modeled_bytes_loaded, sync.bytes_loaded * 4096);
    assert!(sync.sim.ttft_p50_s >= background.sim.ttft_p50_s);
    Ok(())
}

#[test]
fn session_turns_wait_for_the_previous_turn() -> TestResult {
    // A 1 ms think time: by nominal arrival, each turn would arrive while the previous one
    // still prefills or decodes; gating delivers it only after the previous turn's answer.
    let params = params("tiny-full", 2, 512)?;
    let workload = workload_with_think_time(1)?;
    let (report, log) = run_scripted_on(&params, Script::new(Fill::Generate), &workload)?;
    assert_eq!(report.completed, 6);
    let events = &log.lock().events;
    for session in 0..2 {
        let turns: Vec<u64> = workload
            .iter()
            .filter(|request| request.session == Some(session))
            .map(|request| request.id)
            .collect();
        for pair in turns.windows(2) {
            let finished = events
                .iter()
                .position(|&event| event == Event::Finished(RequestId(pair[0])))
                .ok_or("missing finish")?;
            let lookup = events
                .iter()
                .position(|&event| event == Event::Lookup(RequestId(pair[1])))
                .ok_or("missing lookup")?;
            assert!(
                finished < lookup,
                "turn {} looked up before turn {} finished",
                pair[1],
                pair[0]
            );
        }
    }
    // Each gap is the previous turn's prefill plus 15 decode tokens at 1000 tokens/s.
    assert!(
        report.sim.duration_s > 5.0 * 0.015,
        "{}",
        report.sim.duration_s
    );
    Ok(())
}

#[test]
fn identical_runs_give_identical_reports() -> TestResult {
    let params = params("tiny-hybrid", 2, 500)?;
    let script = Script {
        pending_polls: 1,
        saves: Saves::HoldFor(1),
        ..Script::new(Fill::Copy {
            past_chunk_end: false,
        })
    };
    let (mut first, _) = run_scripted(&params, script)?;
    let (mut second, _) = run_scripted(&params, script)?;
    for report in [&mut first, &mut second] {
        report.wall_seconds = 0.0;
        report.wall_waits = kv_connector::replay::report::WallWaits::default();
        report.connector_step_us = LatencySummary::default();
        report.connector_step_cpu_us = LatencySummary::default();
    }
    assert_eq!(first, second);
    Ok(())
}

#[test]
fn cli_json_has_every_field() -> TestResult {
    let cli = Cli::try_parse_from([
        "kv-connector",
        "replay",
        "--connector",
        "none",
        "--json",
        "--quiet",
        "--sessions",
        "1",
        "--turns",
        "2",
        "--first-turn-tokens",
        "1000",
        "--last-turn-tokens",
        "1500",
        "--system-prefix-tokens",
        "800",
        "--output-tokens",
        "8",
    ])?;
    let Command::Replay(args) = cli.command else {
        return Err("not the replay subcommand".into());
    };
    let mut out = Vec::new();
    let mut err = Vec::new();
    replay_cli::run(&args, HashMap::<String, String>::new(), &mut out, &mut err)?;
    assert!(err.is_empty(), "--quiet writes nothing on stderr");
    let text = String::from_utf8(out)?;
    assert_eq!(text.lines().count(), 1, "one JSON object on one line");
    let json: serde_json::Value = serde_json::from_str(&text)?;
    for field in [
        "requests",
        "completed",
        "prompt_tokens",
        "reused_tokens",
        "local_hit_tokens",
        "local_match_shrunk",
        "oracle_reusable_tokens",
        "oracle_window_reusable_tokens",
        "oracle_window_checkpoint_reusable_tokens",
        "reused_share_of_window_checkpoint_oracle",
        "checkpoint_pages_enqueued",
        "verified_pages",
        "mismatched_pages",
        "lookups",
        "pages_loaded",
        "bytes_loaded",
        "pages_saved",
        "bytes_saved",
        "saves_skipped_present",
        "saves_dropped",
        "loads_failed",
        "sim",
        "connector_step_us",
        "connector_step_cpu_us",
        "wall_seconds",
        "wall_waits",
    ] {
        assert!(json.get(field).is_some(), "missing {field}");
    }
    // What the replay waited on is a part of its wall time, never more.
    let waits: Vec<f64> = ["saves_settling_s", "lookups_s", "stalled_s", "start_stop_s"]
        .iter()
        .map(|field| json["wall_waits"][field].as_f64().unwrap_or(-1.0))
        .collect();
    assert!(waits.iter().all(|&wait| wait >= 0.0), "{waits:?}");
    let wall = json["wall_seconds"].as_f64().unwrap_or(0.0);
    assert!(waits.iter().sum::<f64>() <= wall, "{waits:?} of {wall} s");
    for field in ["full", "rewound", "recovered", "window_miss", "full_miss"] {
        assert!(
            json["lookups"].get(field).is_some(),
            "missing lookups.{field}"
        );
    }
    for field in ["duration_s", "throughput_rps", "ttft_p50_s", "ttft_p99_s"] {
        assert!(json["sim"].get(field).is_some(), "missing sim.{field}");
    }
    for field in ["p50", "p99", "max"] {
        assert!(
            json["connector_step_us"].get(field).is_some(),
            "missing connector_step_us.{field}"
        );
    }
    assert_eq!(json["setup"]["local_prefix_cache"], false);
    assert_eq!(json["local_hit_tokens"], 0);
    assert_eq!(json["requests"], 2);
    assert_eq!(json["completed"], 2);
    assert_eq!(json["prompt_tokens"], 2_500);
    Ok(())
}

#[test]
fn cli_kvc_replays_with_the_real_connector_and_zero_mismatches() -> TestResult {
    let cli = Cli::try_parse_from([
        "kv-connector",
        "replay",
        "--quiet",
        "--json",
        "--turns",
        "3",
    ])?;
    let Command::Replay(args) = cli.command else {
        return Err("not the replay subcommand".into());
    };
    let mut out = Vec::new();
    replay_cli::run(
        &args,
        HashMap::<String, String>::new(),
        &mut out,
        &mut Vec::new(),
    )?;
    let report: serde_json::Value = serde_json::from_slice(&out)?;
    assert_eq!(report["setup"]["connector"], "kvc");
    assert_eq!(report["mismatched_pages"], 0);
    assert_eq!(report["completed"], report["requests"]);
    let reused = report["reused_tokens"].as_u64().ok_or("reused_tokens")?;
    let oracle = report["oracle_reusable_tokens"].as_u64().ok_or("oracle")?;
    assert!(
        oracle > 0 && reused * 100 >= oracle * 97,
        "reused {reused} of oracle {oracle}"
    );
    assert!(report["verified_pages"].as_u64().ok_or("verified_pages")? > 0);
    Ok(())
}

#[test]
fn old_pending_answers_do_not_stall_an_engine_waiting_on_a_load() -> TestResult {
    // Three conversations start at once and each lookup answers `Pending` once. Only one
    // prompt fits in 200 pages: the third request waits behind the second, which loads
    // the shared prefix. The engine must then advance to the load's modeled end, not wait
    // on the connector because of the third request's `Pending` from the first round.
    let mut params = params("tiny-full", 1, 512)?;
    params.deployment.kv_pages = KvPages::Fixed(200);
    params.stall_timeout = Duration::from_secs(2);
    let workload = generate_long_multiturn(&LongMultiturnParams {
        sessions: 3,
        turns_per_session: 1,
        first_turn_tokens: 2_000,
        last_turn_tokens: 2_000,
        output_tokens: 16,
        think_time_ms: 30_000,
        session_spacing_ms: 0,
        seed: 7,
        system_prefix_tokens: 1_600,
        documents: 0,
        document_tokens: 0,
        divergence_tokens_max: 0,
    })?;
    let script = Script {
        pending_polls: 1,
        ..Script::new(Fill::Generate)
    };
    let (report, _) = run_scripted_on(&params, script, &workload)?;
    assert_eq!(report.completed, 3);
    assert_eq!(report.loads_filled, 2);
    assert_eq!(report.mismatched_pages, 0);
    Ok(())
}

/// One conversation of three turns, 2000 to 3000 tokens (each turn extends the last).
fn one_conversation() -> Result<Vec<WorkloadRequest>, Box<dyn std::error::Error>> {
    Ok(generate_long_multiturn(&LongMultiturnParams {
        sessions: 1,
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
    })?)
}

/// `params` with the local prefix cache on.
fn with_local_cache(mut params: ReplayParams) -> ReplayParams {
    params.local_prefix_cache = true;
    params
}

#[test]
fn the_local_cache_serves_repeated_prefixes_without_a_connector() -> TestResult {
    for preset in ["tiny-full", "tiny-hybrid"] {
        let params = with_local_cache(params(preset, 1, 512)?);
        let workload = small_workload()?;
        let report = run_replay(&params, &workload, &mut no_connector, &mut NoProgress)?;
        assert!(report.setup.local_prefix_cache);
        assert_eq!(report.completed, 6);
        assert_eq!(report.reused_tokens, 0, "{preset}: nothing from a pool");
        // One instance serves every turn: whatever an unbounded pool would give, the
        // local cache gives (on the hybrid layout too: each turn resumes at the previous
        // turn's end, whose window the finished turn kept).
        assert_eq!(
            report.local_hit_tokens, report.oracle_reusable_tokens,
            "{preset}"
        );
        assert_eq!(
            report.computed_tokens + report.local_hit_tokens,
            report.prompt_tokens
        );
        assert_eq!(report.mismatched_pages, 0, "{preset}");
        assert!(
            report.verified_pages > 0,
            "{preset}: shared pages are checked"
        );
        assert_eq!(report.local_match_shrunk, 0);
        assert_eq!(report.held_at_end, 0);
    }
    Ok(())
}

#[test]
fn the_local_cache_takes_its_share_from_the_pool_on_one_instance() -> TestResult {
    let params = params("tiny-full", 1, 512)?;
    let (off, _) = run_scripted(&params, Script::new(Fill::Generate))?;
    let (on, _) = run_scripted(&with_local_cache(params), Script::new(Fill::Generate))?;
    assert_eq!(off.local_hit_tokens, 0);
    assert_eq!(off.reused_tokens, off.oracle_reusable_tokens);
    // Every repeated prefix is on the same instance: the pool is asked only past it.
    assert!(on.local_hit_tokens > 0);
    assert!(on.reused_tokens < off.reused_tokens);
    assert_eq!(on.reused_tokens + on.local_hit_tokens, off.reused_tokens);
    assert_eq!(on.computed_tokens, off.computed_tokens);
    assert_eq!(on.mismatched_pages, 0);
    Ok(())
}

#[test]
fn local_hits_and_pool_loads_combine_across_instances() -> TestResult {
    // Two instances round robin: each also sees prefixes only the other computed, which
    // come from the pool past its local match (window groups included).
    let params = with_local_cache(params("tiny-hybrid", 2, 512)?);
    let (report, log) = run_scripted(
        &params,
        Script::new(Fill::Copy {
            past_chunk_end: false,
        }),
    )?;
    assert_eq!(report.completed, 6);
    assert_eq!(report.mismatched_pages, 0);
    assert!(
        report.local_hit_tokens > 0 && report.reused_tokens > 0,
        "{report:?}"
    );
    assert_eq!(
        report.computed_tokens + report.reused_tokens + report.local_hit_tokens,
        report.prompt_tokens
    );
    assert!(
        log.lock().releases.is_empty(),
        "no offer was cut or given back"
    );
    Ok(())
}

/// Runs `workload` through the real connector on the embedded pool.
fn run_kvc(
    params: &ReplayParams,
    workload: &[WorkloadRequest],
) -> Result<ReplayReport, ReplayError> {
    let mut params = params.clone();
    "kvc".clone_into(&mut params.connector_name);
    // Room for every instance's connector staging pools (768 MiB each by default).
    params.deployment.host_memory_limit_bytes = 4 << 30;
    run_replay(&params, workload, &mut kvc_connector, &mut NoProgress)
}

#[test]
fn the_real_connector_is_asked_only_past_the_local_match_r19() -> TestResult {
    let params = params("tiny-full", 1, 512)?;
    let workload = one_conversation()?;
    let off = run_kvc(&params, &workload)?;
    let on = run_kvc(&with_local_cache(params), &workload)?;
    for report in [&off, &on] {
        assert_eq!(report.completed, 3);
        assert_eq!(report.mismatched_pages, 0);
        assert!(report.verified_pages > 0);
    }
    // Without the cache turns 2 and 3 load the previous turn from the pool; with it the
    // same tokens are local, and the pool has nothing past them.
    assert!(off.reused_tokens > 0);
    assert_eq!(off.local_hit_tokens, 0);
    assert_eq!(on.local_hit_tokens, off.reused_tokens);
    assert_eq!(on.reused_tokens, 0);
    assert_eq!((on.loads_filled, on.lookups.full_miss), (0, 3));
    // R19: every full block of the conversation is saved once; locally matched blocks are
    // not listed again (the saver would count them as skipped).
    let last = workload.last().ok_or("no requests")?.prompt_len();
    assert_eq!(on.pages_saved, u64::try_from(last / 16)?);
    assert_eq!(on.pages_saved, off.pages_saved);
    assert_eq!(on.saves_skipped_present, 0);
    assert_eq!(on.saves_skipped_present, off.saves_skipped_present);
    Ok(())
}

#[test]
fn the_real_connector_loads_past_a_hybrid_local_match() -> TestResult {
    // Turns 1 and 3 run on instance 0, turn 2 on instance 1: turn 3 starts from its local
    // match (turn 1) and loads turn 2's blocks and window from the pool past it.
    let params = params("tiny-hybrid", 2, 512)?;
    let workload = one_conversation()?;
    let off = run_kvc(&params, &workload)?;
    let on = run_kvc(&with_local_cache(params), &workload)?;
    for report in [&off, &on] {
        assert_eq!(report.completed, 3);
        assert_eq!(report.mismatched_pages, 0);
        assert_eq!(report.loads_failed, 0);
    }
    assert_eq!(off.loads_filled, 2);
    assert_eq!(
        on.loads_filled, 2,
        "turn 3 still loads past its local match"
    );
    let turn_1 = workload[0].prompt_len() / 16 * 16;
    assert_eq!(on.local_hit_tokens, u64::try_from(turn_1)?);
    assert_eq!(on.reused_tokens + on.local_hit_tokens, off.reused_tokens);
    assert!(on.reused_tokens < off.reused_tokens);
    assert_eq!(on.saves_skipped_present, 0, "R19");
    Ok(())
}

#[test]
fn cli_local_prefix_cache_flag_turns_the_cache_on() -> TestResult {
    let cli = Cli::try_parse_from([
        "kv-connector",
        "replay",
        "--connector",
        "none",
        "--local-prefix-cache",
        "--json",
        "--quiet",
        "--sessions",
        "1",
        "--turns",
        "2",
        "--first-turn-tokens",
        "1000",
        "--last-turn-tokens",
        "1500",
        "--system-prefix-tokens",
        "800",
        "--output-tokens",
        "8",
    ])?;
    let Command::Replay(args) = cli.command else {
        return Err("not the replay subcommand".into());
    };
    let mut out = Vec::new();
    replay_cli::run(
        &args,
        HashMap::<String, String>::new(),
        &mut out,
        &mut Vec::new(),
    )?;
    let json: serde_json::Value = serde_json::from_slice(&out)?;
    assert_eq!(json["setup"]["local_prefix_cache"], true);
    // Turn 2 resumes at turn 1's last full block.
    assert_eq!(json["local_hit_tokens"], 1_000 / 16 * 16);
    assert_eq!(json["reused_tokens"], 0);
    assert_eq!(json["mismatched_pages"], 0);
    Ok(())
}
