//! The replay driver: instances sharing one pool, routing, the simulated clock and the
//! event loop (`docs/DESIGN.md` section 11, "Deployment").
//!
//! Workflow ([`run_replay`]):
//! 1. size the deployment and build the pool ([`Deployment`]); per instance open one
//!    device per rank, build its connector through the factory and its [`Engine`];
//! 2. loop, at simulated time `now`:
//!    a. deliver every request that has arrived: hash the prompt (R1, default scope), feed
//!    the oracle, route it to an instance's waiting queue;
//!    b. step every idle instance; while any changed state, repeat at the same `now`; when
//!    a step will start a lookup (admission considers a request for the first time, as an
//!    engine looks up at scheduling time), `settle_saves` on every connector first;
//!    c. an idle instance that only its connector can unblock (a pending lookup, a load
//!    past its modeled end, pages held for saves) gets `wait_for_progress` in real time,
//!    and the clock stays where it is;
//!    d. otherwise the clock jumps to the next event: an arrival, the end of a step, a
//!    load's modeled end, a resumed request, with a pace (`replay --pace`) no earlier than
//!    the wall clock allows ([`super::nodes::Pace`]);
//! 3. when every request has its first token (or the progress sink asks for a stop, the
//!    CLI's SIGINT / SIGTERM; the report is then partial): settle and drain saves, ask every connector
//!    for its report, and sum it all into a [`ReplayReport`].
//!
//! Why `settle_saves` before each lookup: simulated time between two turns of a
//! conversation is seconds, but the replay covers it in microseconds of real time, so
//! without it a lookup would race the saves that simulated time says finished long ago,
//! and reuse would depend on thread timing. Settling makes every save enqueued so far
//! visible to the next lookup, deterministically.
//!
//! Generation stage: context instances only prefill; answers decode on a separate
//! generation stage of unbounded capacity, modeled by time alone (the cost model's decode
//! rate, divided by the tokens per step of a drafter). A request ends on its context
//! instance (`request_finished`) at its first token.
//! Turn `k + 1` of a session arrives its nominal gap after turn `k`'s last answer token.
//!
//! With [`run_replay_with_timeline`] the driver also books time series per simulated
//! time bucket ([`super::timeline`]): each connector is wrapped in a probe, every step's
//! load reports, every first token and, at bucket boundaries, each connector's counters
//! go into the bucket of the simulated time they happened at.
//!
//! Invariants:
//! - `replay::driver::D1`. The simulated clock never moves backwards, and never jumps while an idle
//!   instance waits on its connector.
//! - `replay::driver::D2`. For a deterministic connector, the same workload and parameters give the
//!   same report (but `wall_seconds`, `wall_waits` and `connector_step_us`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::core::hash::{scope_seed, BlockHash, Scope};
use crate::core::ids::RequestId;
use crate::core::layout::{LayerGroup, Layout};
use crate::core::page_names::PromptHashes;

use super::connectors::{ConnectorFactory, InstanceContext};
use super::cost::{CostModel, SimMicros};
use super::engine::{ArrivedRequest, DrafterSetup, Engine, EngineSetup, PromptDone};
use super::error::ReplayError;
use super::nodes::Pace;
use super::pool_fit::prompt_stored_bytes;
use super::progress::ProgressSink;
use super::report::ReplayReport;
use super::setup::{Deployment, DeploymentParams};
use super::summary::{summarize, RunTotals};
use super::timeline::{Timeline, TimelineHooks};
use super::workload::{Oracle, WorkloadRequest};

/// How arriving requests are spread over instances (`replay --routing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Routing {
    /// In turn.
    RoundRobin,
    /// Every turn of a session on the same instance (`session % instances`); requests
    /// without a session in turn.
    Session,
}

impl Routing {
    /// The name the CLI and the report use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::Session => "session",
        }
    }
}

/// Everything a replay runs with.
#[derive(Clone, Debug)]
pub struct ReplayParams {
    /// The effective configuration; the connectors get it.
    pub config: Arc<Config>,
    /// The layout with the replay's world size.
    pub layout: Arc<Layout>,
    /// Instances, pages, scale, memory limit.
    pub deployment: DeploymentParams,
    /// Routing policy.
    pub routing: Routing,
    /// Prompt tokens one engine step computes.
    pub max_num_tokens: usize,
    /// Simulated time.
    pub cost: CostModel,
    /// Real time an idle instance may wait on its connector without any progress.
    pub stall_timeout: Duration,
    /// Real time of one `wait_for_progress` call.
    pub wait_timeout: Duration,
    /// The connector's name, for the report.
    pub connector_name: String,
    /// Each instance keeps a local prefix cache (off by default; `engine`'s docs):
    /// prompt tokens it serves are `local_hit_tokens`, and the connector is asked only
    /// for what lies beyond them.
    pub local_prefix_cache: bool,
    /// A speculative drafter on every instance (off by default; `engine`'s docs): extra KV
    /// tokens past each chunk end, drafts written and rewound, and decoding that advances
    /// `DrafterSetup::tokens_per_step` tokens per step.
    pub drafter: Option<DrafterSetup>,
    /// Every engine takes back half of each load while it runs and hands those pages to
    /// another request (off by default; `engine`'s docs, R29).
    pub release_during_loads: bool,
    /// Ties the simulated clock to the wall clock (`replay --pace`, `super::nodes`): the
    /// clock reaches `t` no earlier than `t / F` real seconds after the event loop starts.
    /// `None` runs as fast as the machine goes.
    pub pace: Option<Pace>,
}

/// The event loop's state.
struct Driver<'w> {
    workload: &'w [WorkloadRequest],
    params: &'w ReplayParams,
    engines: Vec<Engine>,
    deployment: Deployment,
    /// Arrivals not delivered yet: (simulated time, workload index).
    arrivals: BinaryHeap<Reverse<(SimMicros, usize)>>,
    /// The next turn of each request's session and its nominal gap.
    next_turn: Vec<Option<(usize, SimMicros)>>,
    next_round_robin: usize,
    oracle: Oracle,
    seed: BlockHash,
    tokens: Vec<i64>,
    now: SimMicros,
    totals: RunTotals,
    /// Time series hooks, only with [`run_replay_with_timeline`].
    timeline: Option<TimelineHooks>,
    /// Simulated time 0 of a paced replay: when the event loop started, or `--start-at`.
    started: Instant,
}

/// Runs a replay of `workload` (module workflow).
///
/// # Errors
///
/// A setup error ([`ReplayError::InvalidSetting`], [`ReplayError::DeviceMemoryTooLarge`],
/// [`ReplayError::NoRequests`], ...), the factory's error, a request too large for an
/// instance, a device error, or [`ReplayError::Stalled`] when a connector stops making
/// progress.
pub fn run_replay(
    params: &ReplayParams,
    workload: &[WorkloadRequest],
    factory: &mut ConnectorFactory<'_>,
    progress: &mut dyn ProgressSink,
) -> Result<ReplayReport, ReplayError> {
    run(params, workload, factory, progress, None).map(|(report, _)| report)
}

/// [`run_replay`], also collecting the time series of [`super::timeline`] (for
/// `replay --report-dir`).
///
/// # Errors
///
/// As [`run_replay`].
pub fn run_replay_with_timeline(
    params: &ReplayParams,
    workload: &[WorkloadRequest],
    factory: &mut ConnectorFactory<'_>,
    progress: &mut dyn ProgressSink,
) -> Result<(ReplayReport, Timeline), ReplayError> {
    let hooks = TimelineHooks::new(params.deployment.instances, workload.len());
    let (report, timeline) = run(params, workload, factory, progress, Some(hooks))?;
    Ok((report, timeline.unwrap_or_default()))
}

/// Warns (it is not an error: the replay still measures something) when the pool cannot
/// hold the stored pages of the workload's largest prompt (`pool_fit`, at the stored page
/// sizes): nearly everything is evicted before the next turn can reuse it, which otherwise
/// only shows as a reuse of about 0.
fn warn_if_pool_below_one_prompt(
    params: &ReplayParams,
    deployment: &Deployment,
    workload: &[WorkloadRequest],
) {
    let largest_prompt = workload
        .iter()
        .map(|request| request.prompt.prompt_len())
        .max()
        .unwrap_or(0);
    let pages: Vec<u64> = deployment
        .stored_page_bytes
        .iter()
        .map(|&(_, bytes)| u64::try_from(bytes).unwrap_or(u64::MAX))
        .collect();
    let needed = prompt_stored_bytes(
        &params.layout,
        &pages,
        params.config.planner.swa_endpoint_rewind_tokens,
        u64::try_from(largest_prompt).unwrap_or(u64::MAX),
    );
    let capacity = deployment.pool_stored_capacity_bytes;
    if capacity < needed {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a suggested capacity in GiB for a log line"
        )]
        let suggested_gib =
            ((needed as f64 * 4.0 / deployment.kv_bytes_scale) / f64::from(1 << 30)).ceil() as u64;
        tracing::warn!(
            pool_stored_capacity_bytes = capacity,
            largest_prompt_tokens = largest_prompt,
            largest_prompt_stored_bytes = needed,
            kv_bytes_scale = deployment.kv_bytes_scale,
            "the pool cannot hold even the largest prompt's stored pages: expect evictions \
             and little reuse; pool.capacity_bytes = {suggested_gib}GiB holds four such prompts \
             (replay --pool-capacity, or --set pool.capacity_bytes=...)"
        );
    }
}

/// The replay, with or without timeline hooks.
fn run(
    params: &ReplayParams,
    workload: &[WorkloadRequest],
    factory: &mut ConnectorFactory<'_>,
    progress: &mut dyn ProgressSink,
    mut timeline: Option<TimelineHooks>,
) -> Result<(ReplayReport, Option<Timeline>), ReplayError> {
    let started = Instant::now();
    if workload.is_empty() {
        return Err(ReplayError::NoRequests);
    }
    for (setting, value) in [
        ("--instances", params.deployment.instances),
        ("--max-num-tokens", params.max_num_tokens),
    ] {
        if value == 0 {
            return Err(ReplayError::InvalidSetting {
                setting,
                value: "0".to_owned(),
                working: "1",
            });
        }
    }
    // The replay's own use of the configuration (`R`, how long admission waits for a
    // lookup); each connector validates its copy.
    let runtime = params.config.validate()?;
    let rewind_tokens = runtime.planner.rewind_tokens;
    let checkpoint_tokens = runtime
        .saver
        .window_checkpoint_tokens
        .map_or(0, std::num::NonZeroUsize::get);
    let lookup_wait = super::engine::lookup_wait(&runtime);
    // The real connector allocates staging pools on every rank (`setup::S2` counts them).
    let with_connector = params.connector_name == "kvc";
    let deployment = Deployment::build_until(
        &params.layout,
        &params.config,
        &params.deployment,
        with_connector,
        &mut || progress.stop_requested(),
    )?;
    warn_if_pool_below_one_prompt(params, &deployment, workload);
    let engines = build_engines(
        params,
        (rewind_tokens, checkpoint_tokens, lookup_wait),
        &deployment,
        factory,
        timeline.as_mut(),
    )?;
    // Refuse up front, naming the page count that fits the whole workload, rather than
    // when the first request that does not fit arrives.
    let largest = workload
        .iter()
        .max_by_key(|request| request.prompt.prompt_len());
    if let (Some(engine), Some(largest)) = (engines.first(), largest) {
        engine.check_fits(largest.id, largest.prompt.prompt_len())?;
    }
    let oracle = oracle_for(
        params,
        rewind_tokens,
        runtime.saver.window_checkpoint_tokens,
    );
    let starting = started.elapsed();
    let mut driver = Driver::new(params, workload, deployment, engines, oracle);
    driver.timeline = timeline;
    progress.start(u64::try_from(workload.len()).unwrap_or(u64::MAX));
    driver.run(progress)?;
    driver.drain_saves();
    progress.finish();
    let timeline = driver.timeline.take().map(|hooks| hooks.finish(driver.now));
    let Driver {
        engines,
        deployment,
        oracle,
        now,
        mut totals,
        ..
    } = driver;
    // Finishing an engine stops its connector, so the pool closes after the last one.
    let stopping = Instant::now();
    let summaries: Vec<_> = engines.into_iter().map(Engine::finish).collect();
    totals.start_stop = starting + stopping.elapsed();
    let report = summarize(
        params,
        &deployment,
        totals,
        &oracle,
        &summaries,
        now,
        started.elapsed(),
    );
    deployment.close(!report.pool_health.is_unreachable());
    Ok((report, timeline))
}

/// The oracle for the layout in use: with a window group, window groups count only at
/// prompt ends within the rewind and, with window checkpoints on, at checkpoints
/// (`workload::Oracle`'s window oracles).
fn oracle_for(
    params: &ReplayParams,
    rewind_tokens: usize,
    checkpoint_tokens: Option<NonZeroUsize>,
) -> Oracle {
    let windowed = params.layout.groups.iter().any(LayerGroup::is_window);
    if windowed {
        Oracle::with_window(rewind_tokens, checkpoint_tokens)
    } else {
        Oracle::new()
    }
}

/// One engine per instance, each with its devices and connector; `rewind_tokens` and
/// `lookup_wait` come from the validated configuration.
fn build_engines(
    params: &ReplayParams,
    (rewind_tokens, checkpoint_tokens, lookup_wait): (usize, usize, std::time::Duration),
    deployment: &Deployment,
    factory: &mut ConnectorFactory<'_>,
    mut timeline: Option<&mut TimelineHooks>,
) -> Result<Vec<Engine>, ReplayError> {
    let instances = params.deployment.instances;
    let mut engines = Vec::with_capacity(instances);
    for instance in 0..instances {
        let devices =
            deployment.open_devices(params.layout.world_size, params.config.device.kind)?;
        let context = InstanceContext {
            instance,
            instances,
            config: params.config.clone(),
            layout: params.layout.clone(),
            devices: devices.clone(),
            pool: Arc::clone(&deployment.pools[instance]),
            pool_clock: deployment.pool_clock.clone(),
            stored_page_bytes: deployment.stored_page_bytes.clone(),
            kv_bytes_scale: deployment.kv_bytes_scale,
        };
        let mut connector = factory(&context)?;
        if let Some(hooks) = timeline.as_deref_mut() {
            connector = hooks.wrap(connector);
        }
        let setup = EngineSetup {
            instance,
            layout: params.layout.clone(),
            devices,
            kv_pages: deployment.kv_pages,
            max_num_tokens: params.max_num_tokens,
            rewind_tokens,
            checkpoint_tokens,
            cost: params.cost.clone(),
            local_prefix_cache: params.local_prefix_cache,
            drafter: params.drafter,
            lookup_wait,
            release_during_loads: params.release_during_loads,
        };
        engines.push(Engine::new(setup, connector)?);
    }
    Ok(engines)
}

impl<'w> Driver<'w> {
    fn new(
        params: &'w ReplayParams,
        workload: &'w [WorkloadRequest],
        deployment: Deployment,
        engines: Vec<Engine>,
        oracle: Oracle,
    ) -> Self {
        let mut next_turn = vec![None; workload.len()];
        let mut arrivals = BinaryHeap::new();
        let mut last_turn: HashMap<u64, usize> = HashMap::new();
        for (index, request) in workload.iter().enumerate() {
            let previous = request
                .session
                .and_then(|session| last_turn.insert(session, index));
            match previous {
                Some(previous) => {
                    let gap_ms = request
                        .arrival_ms
                        .saturating_sub(workload[previous].arrival_ms);
                    next_turn[previous] = Some((index, gap_ms.saturating_mul(1000)));
                }
                None => arrivals.push(Reverse((request.arrival_ms.saturating_mul(1000), index))),
            }
        }
        Self {
            workload,
            params,
            engines,
            deployment,
            arrivals,
            next_turn,
            next_round_robin: 0,
            oracle,
            seed: scope_seed(&Scope::default()),
            tokens: Vec::new(),
            now: 0,
            totals: RunTotals {
                requests: u64::try_from(workload.len()).unwrap_or(u64::MAX),
                ..RunTotals::default()
            },
            timeline: None,
            started: Instant::now(),
        }
    }

    /// The event loop (module workflow step 2).
    fn run(&mut self, progress: &mut dyn ProgressSink) -> Result<(), ReplayError> {
        let mut stalled_since: Option<Instant> = None;
        self.started = match self.params.pace {
            Some(pace) => pace.origin(Instant::now()),
            None => Instant::now(),
        };
        // Simulated time 0 may be to come (`--start-at`).
        if !self.keep_pace(0, progress) {
            return Ok(());
        }
        loop {
            if progress.stop_requested() {
                tracing::warn!(completed = self.totals.completed, "replay stopped early");
                return Ok(());
            }
            self.deliver_arrivals()?;
            if self.step_idle_engines(progress)? {
                stalled_since = None;
                continue;
            }
            if self.arrivals.is_empty() && self.engines.iter().all(|e| !e.has_requests()) {
                return Ok(());
            }
            let now = self.now;
            let blocked: Vec<usize> = (0..self.engines.len())
                .filter(|&i| {
                    self.engines[i].is_idle(now) && self.engines[i].waits_on_connector(now)
                })
                .collect();
            let next = self.next_event();
            if blocked.is_empty() {
                if let Some(next) = next {
                    if !self.keep_pace(next, progress) {
                        continue;
                    }
                    if let Some(hooks) = &mut self.timeline {
                        hooks.clock_moves(self.now, next);
                    }
                    self.now = next;
                    self.deployment.pool_clock.set_ms(next / 1000);
                    stalled_since = None;
                    continue;
                }
            }
            // Only connectors can move things on (`replay::driver::D1`): wait in real time.
            let since = *stalled_since.get_or_insert_with(Instant::now);
            let waiting_on = if blocked.is_empty() {
                (0..self.engines.len()).collect()
            } else {
                blocked
            };
            if since.elapsed() > self.params.stall_timeout {
                return Err(self.stalled(waiting_on[0], since.elapsed()));
            }
            let waited = Instant::now();
            for index in waiting_on {
                self.engines[index].wait_for_progress(self.params.wait_timeout);
            }
            self.totals.stalled += waited.elapsed();
        }
    }

    /// With a pace, waits until simulated time `next` is due (`replay::nodes::N3`); `false`
    /// when a stop arrived meanwhile (the loop then stops at its top).
    fn keep_pace(&self, next: SimMicros, progress: &mut dyn ProgressSink) -> bool {
        match self.params.pace {
            Some(pace) => pace.wait_until(
                self.started,
                super::cost::micros_to_seconds(next),
                &mut || progress.stop_requested(),
            ),
            None => true,
        }
    }

    /// The earliest arrival or engine event after `now`.
    fn next_event(&self) -> Option<SimMicros> {
        let arrival = self.arrivals.peek().map(|Reverse((at, _))| *at);
        self.engines
            .iter()
            .filter_map(|engine| engine.next_event_us(self.now))
            .chain(arrival)
            .filter(|&at| at > self.now)
            .min()
    }

    /// Delivers every request that has arrived by `now` (step 2a).
    fn deliver_arrivals(&mut self) -> Result<(), ReplayError> {
        while let Some(&Reverse((at, index))) = self.arrivals.peek() {
            if at > self.now {
                break;
            }
            self.arrivals.pop();
            self.deliver(index, at)?;
        }
        Ok(())
    }

    /// Hashes, feeds the oracle, routes and enqueues one request.
    fn deliver(&mut self, index: usize, arrival_us: SimMicros) -> Result<(), ReplayError> {
        let request = &self.workload[index];
        request.write_prompt_tokens(&mut self.tokens);
        let tokens_per_block = usize::try_from(self.params.layout.tokens_per_block).unwrap_or(1);
        let hashes = PromptHashes::of_prompt(
            self.seed,
            &self.tokens,
            tokens_per_block,
            self.params.layout.has_draft_groups(),
        )?;
        let prompt_len = self.tokens.len();
        let reusable = self.oracle.admit(hashes.chain(), prompt_len, tokens_per_block);
        if let Some(hooks) = &mut self.timeline {
            hooks.delivered(index, prompt_len, reusable);
        }
        self.totals.prompt_tokens += u64::try_from(prompt_len).unwrap_or(u64::MAX);
        let instance = self.route(request);
        let arrived = ArrivedRequest {
            workload_index: index,
            id: RequestId(request.id),
            prompt_len,
            arrival_us,
            hashes,
        };
        self.engines[instance].enqueue(arrived, Arc::from(self.tokens.as_slice()))
    }

    /// The instance a request goes to.
    fn route(&mut self, request: &WorkloadRequest) -> usize {
        let instances = self.engines.len();
        if let (Routing::Session, Some(session)) = (self.params.routing, request.session) {
            return usize::try_from(session % u64::try_from(instances).unwrap_or(1)).unwrap_or(0);
        }
        let instance = self.next_round_robin % instances;
        self.next_round_robin = self.next_round_robin.wrapping_add(1);
        instance
    }

    /// Steps every idle engine once (step 2b); returns whether any changed state.
    fn step_idle_engines(&mut self, progress: &mut dyn ProgressSink) -> Result<bool, ReplayError> {
        let mut changed = false;
        let lookups_due = self
            .engines
            .iter()
            .any(|engine| engine.is_idle(self.now) && engine.wants_lookup());
        if lookups_due {
            let started = Instant::now();
            for engine in &mut self.engines {
                engine.settle_saves();
            }
            self.totals.settling += started.elapsed();
        }
        for index in 0..self.engines.len() {
            if !self.engines[index].is_idle(self.now) {
                continue;
            }
            let result = self.engines[index].step(self.now)?;
            if let Some(hooks) = &mut self.timeline {
                hooks.after_step(index, self.now);
            }
            changed |= result.changed;
            for done in result.done {
                self.prompt_done(done);
                progress.advance(
                    self.totals.completed,
                    super::cost::micros_to_seconds(self.now),
                );
            }
        }
        Ok(changed)
    }

    /// Records a first token; schedules the session's next turn.
    fn prompt_done(&mut self, done: PromptDone) {
        if let Some(hooks) = &mut self.timeline {
            hooks.prompt_done(&done);
        }
        let request = &self.workload[done.workload_index];
        let finish = done.first_token_us + self.decode_micros(request.output_tokens);
        self.totals.completed += 1;
        self.totals
            .ttft_us
            .push(done.first_token_us - done.arrival_us);
        self.totals.last_finish_us = self.totals.last_finish_us.max(finish);
        if let Some((next, gap_us)) = self.next_turn[done.workload_index] {
            self.arrivals.push(Reverse((finish + gap_us, next)));
        }
    }

    /// Simulated decode time of an answer; a drafter divides it by the tokens one decode
    /// step advances.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a positive duration in microseconds, far below 2^53"
    )]
    fn decode_micros(&self, output_tokens: u32) -> SimMicros {
        let plain = self.params.cost.decode_micros(output_tokens);
        match self.params.drafter {
            Some(drafter) => {
                (plain as f64 / drafter.tokens_per_step().max(1.0)).ceil() as SimMicros
            }
            None => plain,
        }
    }

    /// Settles and drains saves so held pages are released (workflow step 3); what is
    /// still held after the stall timeout is reported as `held_at_end`.
    fn drain_saves(&mut self) {
        let settling = Instant::now();
        for engine in &mut self.engines {
            engine.settle_saves();
        }
        let started = Instant::now();
        loop {
            let mut held = false;
            for engine in &mut self.engines {
                engine.poll_held();
                held |= engine.held_requests() > 0;
            }
            if !held || started.elapsed() > self.params.stall_timeout {
                self.totals.settling += settling.elapsed();
                return;
            }
            for engine in &mut self.engines {
                if engine.held_requests() > 0 {
                    engine.wait_for_progress(self.params.wait_timeout);
                }
            }
        }
    }

    /// The stall error for `instance`.
    fn stalled(&self, instance: usize, waited: Duration) -> ReplayError {
        let (waiting, loading, held) = self.engines[instance].queue_sizes();
        ReplayError::Stalled {
            instance: self.engines[instance].instance(),
            waited_s: waited.as_secs(),
            waiting,
            loading,
            held,
        }
    }
}
