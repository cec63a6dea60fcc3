//! Starting, stopping and saving against a real `mooncake_master` whose parts misbehave;
//! nothing is mocked.
//!
//! - Shutdown with the master frozen (SIGSTOP): every staging pool of the connector is
//!   unregistered at once, so the stop waits for one pool call rather than one per staging
//!   pool (`docs/RELIABILITY.md`, shutdown bound). A pool wrapper of this file counts the
//!   unregisters in flight; nothing is timed.
//! - A start whose master answers but whose HTTP metadata server accepts connections and
//!   never answers fails naming `mooncake.metadata_server`, not the master.
//! - Puts the pool refuses for want of room (a client with no segment of its own, while no
//!   other segment is mounted: what a restarted master answers until the clients' segments
//!   are mounted again) are counted `saves_no_space`, also in `saves_failed`, and make the
//!   pool `degraded` until a put stores again (R30).
//!
//! The tests need `.venv` from `scripts/setup-mooncake` (`common::mooncake`).
#![cfg(feature = "mooncake")]

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use common::mooncake::{install, silent_listener, start_master, venv_dir};
use common::{prompt, start};
use kv_connector::config::Config;
use kv_connector::connector::EngineConnector;
use kv_connector::core::ids::RequestId;
use kv_connector::core::layout::Layout;
use kv_connector::pool::mooncake::{MooncakeMaster, MooncakePool, MooncakeSettings};
use kv_connector::pool::{Pool, PoolCounters, PoolError};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MIB: u64 = 1 << 20;

/// A client of `master` contributing `segment_bytes` to the pool.
fn client_settings(master: &MooncakeMaster, segment_bytes: u64) -> MooncakeSettings {
    master.client_settings(MooncakeSettings {
        venv_dir: venv_dir(),
        global_segment_size_bytes: segment_bytes,
        local_buffer_size_bytes: 4 * MIB,
        fallback_staging_bytes: 1 << 20,
        ..MooncakeSettings::default()
    })
}

/// The default configuration with small staging pools: two loaders and a saver, so three
/// registered staging pools per rank.
fn small_staging() -> Config {
    let mut config = Config::default();
    config.loaders.staging_bytes_per_loader = 4 * MIB;
    config.saver.staging_bytes = 4 * MIB;
    config
}

/// Sends `signal` (a `kill` flag) to process `pid`.
fn signal(signal: &str, pid: u32) -> TestResult {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()?;
    assert!(status.success(), "kill {signal} {pid} failed");
    Ok(())
}

/// A pool that forwards every call and counts the staging unregisters: how many, and
/// the most in flight at once.
struct Watched {
    inner: Arc<dyn Pool>,
    registered: AtomicUsize,
    unregistered: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

impl Watched {
    fn new(inner: Arc<dyn Pool>) -> Self {
        Self {
            inner,
            registered: AtomicUsize::new(0),
            unregistered: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
        }
    }
}

impl Pool for Watched {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.inner.exists(keys)
    }

    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.inner.put(keys, values)
    }

    fn put_absent(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.inner.put_absent(keys, values)
    }

    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        self.inner.get_into(keys, buffers)
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.inner.touch(keys)
    }

    fn counters(&self) -> PoolCounters {
        self.inner.counters()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn register_staging(&self, staging: &[u8]) -> Result<(), PoolError> {
        self.registered.fetch_add(1, Ordering::SeqCst);
        self.inner.register_staging(staging)
    }

    fn unregister_staging(&self, start_addr: usize) -> Result<(), PoolError> {
        self.unregistered.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let answer = self.inner.unregister_staging(start_addr);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        answer
    }
}

/// Shutdown with the master frozen: each unregister waits out the frozen metadata server
/// (about 3 s each, they used to run one after another: 9 s for one rank). They are issued
/// together, so all three are in flight at once and the stop waits for one of them.
#[test]
fn shutdown_against_a_frozen_master_unregisters_every_staging_pool_at_once() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let master = start_master(&install, "health-frozen-shutdown")?;
    let client: Arc<dyn Pool> =
        Arc::new(MooncakePool::connect(client_settings(&master, 16 * MIB))?);
    let watched = Arc::new(Watched::new(Arc::clone(&client)));
    let layout = Layout::preset("tiny-full")?;
    let instance = start(
        Arc::clone(&watched) as Arc<dyn Pool>,
        &layout,
        small_staging(),
    );
    assert_eq!(watched.registered.load(Ordering::SeqCst), 3);
    let pid = master.pid().ok_or("no master")?;
    signal("-STOP", pid)?;
    let stopping = Instant::now();
    let stats = instance.handle.shutdown();
    // Printed for the record (the figure goes in the docs), never asserted.
    eprintln!(
        "shutdown against a frozen master took {:?}",
        stopping.elapsed()
    );
    signal("-CONT", pid)?;
    stats.check_accounting()?;
    assert_eq!(watched.unregistered.load(Ordering::SeqCst), 3);
    assert_eq!(
        watched.most_in_flight.load(Ordering::SeqCst),
        3,
        "the staging unregisters were issued one after another, each waiting on the frozen master"
    );
    drop(watched);
    drop(client);
    Ok(())
}

/// The master answers, its metadata server does not: the start fails naming
/// `mooncake.metadata_server` and the address given (it used to fail after 12 s blaming
/// `master_address`).
#[test]
fn a_start_whose_metadata_server_never_answers_names_the_metadata_server() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let master = start_master(&install, "health-silent-metadata")?;
    let (_metadata, address) = silent_listener()?;
    let metadata_server = format!("http://{address}/metadata");
    let settings = MooncakeSettings {
        metadata_server: metadata_server.clone(),
        ..client_settings(&master, 16 * MIB)
    };
    let starting = Instant::now();
    let err = MooncakePool::connect(settings).expect_err("the metadata server never answers");
    // Printed for the record, never asserted.
    eprintln!("the start failed after {:?}: {err}", starting.elapsed());
    let message = err.to_string();
    assert_eq!(err.kind(), "metadata_silent", "{message}");
    assert!(message.contains("mooncake.metadata_server"), "{message}");
    assert!(message.contains(&metadata_server), "{message}");
    assert!(!message.contains("master_address"), "{message}");
    Ok(())
}

/// Saves against a pool with no segment mounted anywhere: every put is refused for want of
/// room (`NO_AVAILABLE_HANDLE`, as after a master restart until the segments are mounted
/// again). Each page is saved again after a backoff (R35, counted `saves_retried`), then
/// counts `saves_no_space` (and `saves_failed`), and the pool reads
/// `degraded` while lookups still answer; once a segment is mounted the next save stores
/// and the pool is healthy again.
#[test]
fn puts_refused_for_want_of_room_count_no_space_and_degrade_the_pool() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let master = start_master(&install, "health-no-space")?;
    let client: Arc<dyn Pool> = Arc::new(MooncakePool::connect(client_settings(&master, 0))?);
    let layout = Layout::preset("tiny-full")?;
    let t = layout.tokens_per_block as usize;
    let mut instance = start(Arc::clone(&client), &layout, small_staging());
    let refused = prompt(0, 4 * t + 1);
    instance.save_prompt(RequestId(1), &refused, &layout, 0);
    instance.handle.request_finished(RequestId(1));
    instance.handle.settle_saves();
    let stats = instance.handle.stats();
    stats.check_accounting()?;
    assert_eq!(stats.saves.saves_done, 0, "no segment, nothing stored");
    assert_eq!(
        stats.saves.saves_no_space, 4,
        "four blocks refused for room"
    );
    assert_eq!(
        stats.saves.saves_failed, 4,
        "no-space pages are failed pages too"
    );
    assert_eq!(
        stats.saves.saves_retried, 4,
        "each refused page was saved again (R35), counted once"
    );
    assert_eq!(
        stats.pool.state, "degraded",
        "puts are refused: not healthy"
    );
    assert_eq!(stats.pool.outages, 0, "the pool answered: no outage");

    let segment = MooncakePool::connect(client_settings(&master, 16 * MIB))?;
    let stored = prompt(100_000, 4 * t + 1);
    instance.save_prompt(RequestId(2), &stored, &layout, 100);
    instance.handle.request_finished(RequestId(2));
    instance.handle.settle_saves();
    let stats = instance.handle.shutdown();
    stats.check_accounting()?;
    assert_eq!(
        stats.saves.saves_done, 4,
        "stored in the other client's segment"
    );
    assert_eq!(stats.saves.saves_no_space, 4, "unchanged");
    assert_eq!(stats.pool.state, "healthy", "a put stored again");
    segment.close()?;
    drop(client);
    Ok(())
}
