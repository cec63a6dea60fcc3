//! Harness for the connector's integration tests: an embedded pool, host devices, a
//! connector per instance, and a pool wrapper that can hold or fail gets and logs the keys
//! it is asked to put, in order.
//!
//! Every wait of the harness is bounded ([`wait_until`], [`WAIT_LIMIT`]): a connector that
//! stops making progress fails the test with what it was waiting for, instead of hanging
//! it. The bound is generous, far above any healthy wait: it catches hangs, it times
//! nothing.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the harness"
)]
#![expect(
    clippy::unwrap_used,
    reason = "test set-up: a failure is the test failing"
)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kv_connector::config::Config;
use kv_connector::connector::{
    ConnectorHandle, ConnectorParams, EngineConnector, FinishedLoad, ReserveAnswer,
    ScheduledRequest, SchedulerOutput,
};
use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::core::hash::{scope_seed, Scope};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::{GroupId, Layout};
use kv_connector::gpu::{Device, PagePoolSpec};
use kv_connector::pool::{MemoryPool, Pool, PoolCounters, PoolError, SystemClock};

#[cfg(feature = "faults")]
pub mod faults;
#[cfg(feature = "mooncake")]
pub mod mooncake;
#[cfg(feature = "cli")]
pub mod scripted;

/// Pages per group on each test device.
pub const PAGES: u32 = 512;

/// A fresh embedded pool of `capacity_bytes`.
pub fn memory_pool(capacity_bytes: u64) -> Arc<MemoryPool> {
    Arc::new(
        MemoryPool::new(
            EvictionPolicy::mooncake_defaults(capacity_bytes),
            Arc::new(SystemClock::new()),
        )
        .unwrap(),
    )
}

/// One instance: its connector and one device per rank.
pub struct Instance {
    pub handle: ConnectorHandle,
    pub devices: Vec<Device>,
}

/// Starts a connector for `layout` on `pool` with `config`.
pub fn start(pool: Arc<dyn Pool>, layout: &Layout, config: Config) -> Instance {
    let devices: Vec<Device> = (0..layout.world_size)
        .map(|_| {
            let specs: Vec<PagePoolSpec> = layout
                .groups
                .iter()
                .map(|group| PagePoolSpec {
                    group: group.id,
                    page_bytes: usize::try_from(layout.page_bytes(group).unwrap()).unwrap(),
                    num_pages: PAGES,
                })
                .collect();
            Device::open_host(&specs).unwrap()
        })
        .collect();
    let params = ConnectorParams {
        config,
        layout: layout.clone(),
        pool,
        devices: devices.clone(),
        share: kv_connector::RankShare::default(),
        seed: scope_seed(&Scope::default()),
        model_key: "test".into(),
    };
    Instance {
        handle: ConnectorHandle::start(params).unwrap(),
        devices,
    }
}

/// Deterministic page bytes for (group, rank, block).
pub fn page_content(group: GroupId, rank: usize, block: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            u8::try_from((i * 7 + block * 13 + rank * 29 + group.0 as usize * 31) % 251).unwrap()
        })
        .collect()
}

/// A prompt of `len` tokens starting at `start`.
pub fn prompt(start: i64, len: usize) -> Arc<[i64]> {
    (start..start + i64::try_from(len).unwrap())
        .collect::<Vec<_>>()
        .into()
}

/// The longest any wait of the harness lasts before it fails the test (module docs).
pub const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Calls `ready` until it answers `Some` (it may itself wait a little, as
/// `wait_for_progress` does); fails the test naming `what` once `limit` has passed.
///
/// # Panics
///
/// After `limit` without an answer.
pub fn wait_until_within<T>(
    limit: Duration,
    what: &str,
    mut ready: impl FnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(
            started.elapsed() < limit,
            "gave up waiting for {what} after {limit:?}: no progress (a hang)"
        );
    }
}

/// [`wait_until_within`] [`WAIT_LIMIT`].
pub fn wait_until<T>(what: &str, ready: impl FnMut() -> Option<T>) -> T {
    wait_until_within(WAIT_LIMIT, what, ready)
}

/// Starts the lookup of a new request (the test fails if the id is live).
pub fn look_up(handle: &mut ConnectorHandle, request: RequestId, tokens: &Arc<[i64]>) {
    handle
        .lookup_prefix(request, Arc::clone(tokens), 0)
        .unwrap();
}

/// Waits (for real) until the lookup answers, then returns the offer.
pub fn reserve(
    handle: &mut ConnectorHandle,
    request: RequestId,
    reservation: ReservationId,
) -> ReserveAnswer {
    reserve_within(handle, request, reservation, WAIT_LIMIT)
}

/// [`reserve`], failing the test after `limit`.
pub fn reserve_within(
    handle: &mut ConnectorHandle,
    request: RequestId,
    reservation: ReservationId,
    limit: Duration,
) -> ReserveAnswer {
    let what = format!("the lookup of request {}", request.0);
    wait_until_within(limit, &what, || {
        match handle.reserve_prefix(request, 0, reservation) {
            ReserveAnswer::Pending => {
                handle.wait_for_progress(Duration::from_millis(100));
                None
            }
            answer @ ReserveAnswer::Offer { .. } => Some(answer),
        }
    })
}

/// Waits until at least one load is reported.
pub fn finished_loads(handle: &mut ConnectorHandle) -> Vec<FinishedLoad> {
    wait_until("a finished load", || {
        let finished = handle.get_finished_prefix_loads();
        if finished.is_empty() {
            handle.wait_for_progress(Duration::from_millis(100));
            None
        } else {
            Some(finished)
        }
    })
}

impl Instance {
    /// The whole life of a prompt that finds nothing to load: lookup, admission, one
    /// chunk computing every block with pages `first_page..`, and its saves settled.
    pub fn save_prompt(
        &mut self,
        request: RequestId,
        prompt: &Arc<[i64]>,
        layout: &Layout,
        first_page: i32,
    ) {
        self.handle
            .lookup_prefix(request, Arc::clone(prompt), 0)
            .unwrap();
        reserve(&mut self.handle, request, ReservationId(request.0));
        self.compute(request, prompt, layout, first_page);
        self.handle.settle_saves();
    }

    /// Computes a whole prompt with pages `first_page..` in one chunk: writes every full
    /// block's pages on every rank and reports the step (the connector saves them).
    pub fn compute(
        &mut self,
        request: RequestId,
        prompt: &Arc<[i64]>,
        layout: &Layout,
        first_page: i32,
    ) {
        self.write_pages(prompt.len(), layout, first_page);
        self.chunk(request, prompt.len(), layout, first_page, 0..prompt.len());
    }

    /// Writes the content of every full block of a `prompt_len`-token prompt into pages
    /// `first_page..` of every group on every rank.
    pub fn write_pages(&mut self, prompt_len: usize, layout: &Layout, first_page: i32) {
        let t = layout.tokens_per_block as usize;
        for (rank, device) in self.devices.iter().enumerate() {
            for group in &layout.groups {
                let len = device.page_pool(group.id).unwrap().page_bytes;
                for block in 0..prompt_len / t {
                    let page = u32::try_from(first_page).unwrap() + u32::try_from(block).unwrap();
                    device
                        .write_page(group.id, page, &page_content(group.id, rank, block, len))
                        .unwrap();
                }
            }
        }
    }

    /// Reports one chunk `tokens` of a `prompt_len`-token prompt whose pages are
    /// `first_page..` in every group (the connector plans its saves, R16-R21).
    pub fn chunk(
        &mut self,
        request: RequestId,
        prompt_len: usize,
        layout: &Layout,
        first_page: i32,
        tokens: std::ops::Range<usize>,
    ) {
        let t = layout.tokens_per_block as usize;
        let blocks = prompt_len.div_ceil(t);
        let table: Vec<i32> = (first_page..first_page + i32::try_from(blocks).unwrap()).collect();
        let tables: Vec<&[i32]> = layout.groups.iter().map(|_| table.as_slice()).collect();
        let step = ScheduledRequest {
            request,
            prompt_len,
            computed_before: tokens.start,
            computed_after: tokens.end,
            new_reservation: None,
            page_tables: &tables,
        };
        self.handle.on_step(&SchedulerOutput {
            requests: vec![step],
        });
    }

    /// Reports a new reservation's pages `first_page..` for every group.
    pub fn start_load(
        &mut self,
        request: RequestId,
        reservation: ReservationId,
        prompt_len: usize,
        layout: &Layout,
        first_page: i32,
    ) {
        let t = layout.tokens_per_block as usize;
        let table: Vec<i32> =
            (first_page..first_page + i32::try_from(prompt_len.div_ceil(t)).unwrap()).collect();
        let tables: Vec<&[i32]> = layout.groups.iter().map(|_| table.as_slice()).collect();
        let step = ScheduledRequest {
            request,
            prompt_len,
            computed_before: 0,
            computed_after: 0,
            new_reservation: Some(reservation),
            page_tables: &tables,
        };
        self.handle.on_step(&SchedulerOutput {
            requests: vec![step],
        });
    }
}

/// A pool wrapper for fault tests: gets can be held until released, or fail as evicted.
pub struct TestPool {
    pub inner: Arc<MemoryPool>,
    /// Probes (`exists`) begun while set wait for `release_one_get`.
    pub hold_probes: AtomicBool,
    /// Probes begun so far (counted before a held probe waits).
    pub probes_started: AtomicUsize,
    pub hold_gets: AtomicBool,
    /// Gets begun so far (counted before a held get waits).
    pub gets_started: AtomicUsize,
    pub hold_puts: AtomicBool,
    pub gets_evicted: AtomicBool,
    /// Puts of keys containing this text fail (a shard that never saved).
    pub refuse_puts_containing: parking_lot::Mutex<Option<String>>,
    /// Every key given to `put`, in call order (the saver's put order).
    pub put_log: parking_lot::Mutex<Vec<String>>,
    gate: (flume::Sender<()>, flume::Receiver<()>),
}

impl TestPool {
    /// Wraps `inner`.
    pub fn new(inner: Arc<MemoryPool>) -> Self {
        TestPool {
            inner,
            hold_probes: AtomicBool::new(false),
            probes_started: AtomicUsize::new(0),
            hold_gets: AtomicBool::new(false),
            gets_started: AtomicUsize::new(0),
            hold_puts: AtomicBool::new(false),
            gets_evicted: AtomicBool::new(false),
            refuse_puts_containing: parking_lot::Mutex::new(None),
            put_log: parking_lot::Mutex::new(Vec::new()),
            gate: flume::bounded(16),
        }
    }

    /// Lets one held probe, get or put proceed.
    pub fn release_one_get(&self) {
        self.gate.0.send(()).unwrap();
    }

    /// Waits for [`release_one_get`](Self::release_one_get), at most [`WAIT_LIMIT`].
    fn wait_for_release(&self, what: &str) {
        assert!(
            self.gate.1.recv_timeout(WAIT_LIMIT).is_ok(),
            "{what} was never released within {WAIT_LIMIT:?}"
        );
    }
}

impl Pool for TestPool {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        let held = self.hold_probes.load(Ordering::SeqCst);
        self.probes_started.fetch_add(1, Ordering::SeqCst);
        if held {
            self.wait_for_release("a held probe");
        }
        self.inner.exists(keys)
    }

    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.put_log
            .lock()
            .extend(keys.iter().map(|key| (*key).to_owned()));
        if self.hold_puts.load(Ordering::SeqCst) {
            self.wait_for_release("a held put");
        }
        let refused = self.refuse_puts_containing.lock().clone();
        let Some(refused) = refused else {
            return self.inner.put(keys, values);
        };
        let kept: Vec<usize> = (0..keys.len())
            .filter(|&i| !keys[i].contains(refused.as_str()))
            .collect();
        let kept_keys: Vec<&str> = kept.iter().map(|&i| keys[i]).collect();
        let kept_values: Vec<&[u8]> = kept.iter().map(|&i| values[i]).collect();
        let mut stored = self.inner.put(&kept_keys, &kept_values).into_iter();
        (0..keys.len())
            .map(|i| {
                if kept.contains(&i) {
                    stored.next().unwrap()
                } else {
                    Err(PoolError::Unavailable)
                }
            })
            .collect()
    }

    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        self.gets_started.fetch_add(1, Ordering::SeqCst);
        if self.hold_gets.load(Ordering::SeqCst) {
            self.wait_for_release("a held get");
        }
        if self.gets_evicted.load(Ordering::SeqCst) {
            return keys.iter().map(|_| Err(PoolError::NotFound)).collect();
        }
        self.inner.get_into(keys, buffers)
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.inner.touch(keys)
    }

    fn counters(&self) -> PoolCounters {
        self.inner.counters()
    }

    fn name(&self) -> &'static str {
        "test"
    }
}

/// Runs `kv-connector replay --json --quiet` with `flags` in-process (no environment) and
/// returns its JSON report.
#[cfg(feature = "cli")]
pub fn replay_json(flags: &[&str]) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    use clap::Parser;
    use kv_connector::cli::{replay, Cli, Command};
    let mut line = vec!["kv-connector", "replay", "--json", "--quiet"];
    line.extend_from_slice(flags);
    let Command::Replay(args) = Cli::try_parse_from(line)?.command else {
        return Err("not the replay subcommand".into());
    };
    let mut out = Vec::new();
    replay::run(
        &args,
        std::collections::HashMap::<String, String>::new(),
        &mut out,
        &mut Vec::new(),
    )?;
    Ok(serde_json::from_slice(&out)?)
}

/// A counter of a replay's JSON report.
#[cfg(feature = "cli")]
pub fn report_field(
    report: &serde_json::Value,
    name: &str,
) -> Result<u64, Box<dyn std::error::Error>> {
    report[name]
        .as_u64()
        .ok_or_else(|| format!("report has no {name}").into())
}

/// The `replay` command line of the CLI tests, parsed: one three-turn conversation on
/// tiny-hybrid (2000 to 3000 tokens after a 1000-token shared prefix), quiet, with `flags`
/// added.
#[cfg(feature = "cli")]
pub fn small_replay_args(
    flags: &[&str],
) -> Result<Box<kv_connector::cli::replay::ReplayArgs>, Box<dyn std::error::Error>> {
    use clap::Parser;
    use kv_connector::cli::{Cli, Command};
    let mut line = vec![
        "kv-connector",
        "replay",
        "--model",
        "tiny-hybrid",
        "--sessions",
        "1",
        "--turns",
        "3",
        "--first-turn-tokens",
        "2000",
        "--last-turn-tokens",
        "3000",
        "--system-prefix-tokens",
        "1000",
        "--quiet",
    ];
    line.extend_from_slice(flags);
    match Cli::try_parse_from(line)?.command {
        Command::Replay(args) => Ok(args),
        _ => Err("not the replay subcommand".into()),
    }
}
