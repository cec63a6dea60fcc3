//! Pool outages on a real Mooncake master (R30); nothing is mocked.
//!
//! - A master killed (SIGKILL) mid-replay, then restarted on the same ports, and a master
//!   frozen (SIGSTOP) mid-replay, then thawed (SIGCONT) once the pool was marked unreachable
//!   and the replay went on without it: the replay completes every request with 0
//!   mismatched pages and closed accounting, the report names the outage (lookups and
//!   saves lost to it, under names of their own), one WARN per outage and at most one INFO
//!   per recovery are logged, and the thawed master is found again (a restarted one, which
//!   Mooncake's client takes seconds to reconnect to, by a guarded client on its own).
//! - A master that accepts connections and never answers: a client start fails within
//!   `mooncake.connect_timeout_ms` naming the key, and SIGINT stops a replay stuck in it.
//!
//! Each replay runs as a child process reading its own progress lines (no sleeps: the
//! test acts on what the replay logged), with the test's master given by `--master`.
//! The tests need `.venv` from `scripts/setup-mooncake`; as in every real-master test, a
//! missing install fails them under `scripts/test` and skips them otherwise, said on one
//! line (`common::mooncake`).
#![cfg(all(feature = "mooncake", feature = "cli"))]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::mooncake::{install, silent_listener, start_master, venv_dir};
use kv_connector::config::Config;
use kv_connector::pool::{GuardSettings, GuardedPool, Pool, PoolError};

use kv_connector::pool::mooncake::{MooncakeMaster, MooncakePool, MooncakeSettings};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/mooncake_synthetic_trace.jsonl"
);

/// Sends `signal` (a `kill` flag) to process `pid`.
fn signal(signal: &str, pid: u32) -> TestResult {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()?;
    assert!(status.success(), "kill {signal} {pid} failed");
    Ok(())
}

/// The 600-request slice of the shared trace on two instances, against `master`, with the
/// progress, outage and recovery lines on stderr.
fn spawn_replay(master: &MooncakeMaster) -> Result<Child, Box<dyn std::error::Error>> {
    let venv = format!("mooncake.venv_dir={}", venv_dir().display());
    let metadata = format!("mooncake.metadata_server={}", master.metadata_server());
    Ok(Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args([
            "replay",
            "--trace",
            TRACE,
            "--limit",
            "600",
            "--model",
            "llama-3.1-8b",
            "--instances",
            "2",
            "--pool-capacity",
            "4TiB",
            "--kv-bytes-scale",
            "0.0009765625",
            "--pool",
            "mooncake",
            "--master",
            &master.master_address(),
            "--set",
            &metadata,
            "--set",
            &venv,
            // Find the master again quickly once it answers.
            "--set",
            "pool.retry_max_ms=500",
            "--json",
            "--quiet",
        ])
        .env(
            "RUST_LOG",
            "warn,kv_connector::cli::replay=debug,kv_connector::pool::guard=info",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?)
}

/// Reads the replay's stderr into `seen` until a line contains `wanted`.
fn read_until(stderr: &mut BufReader<ChildStderr>, seen: &mut String, wanted: &str) -> TestResult {
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line)? == 0 {
            return Err(format!("the replay ended before logging {wanted:?}:\n{seen}").into());
        }
        seen.push_str(&line);
        if line.contains(wanted) {
            return Ok(());
        }
    }
}

/// The last `completed=N` progress count in `seen` (0 before the first).
fn last_completed(seen: &str) -> u64 {
    seen.rsplit("completed=")
        .next()
        .and_then(|rest| rest.split(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

/// Runs the replay, calls `fault` after 100 completions and `heal` 30 completions after
/// the pool was marked unreachable (so most of the replay is left to find it again);
/// returns the JSON report and everything the replay logged.
fn replay_through_an_outage(
    master: &mut MooncakeMaster,
    fault: &dyn Fn(&mut MooncakeMaster) -> TestResult,
    heal: &dyn Fn(&mut MooncakeMaster) -> TestResult,
) -> Result<(serde_json::Value, String), Box<dyn std::error::Error>> {
    let mut child = spawn_replay(master)?;
    let mut stderr = BufReader::new(child.stderr.take().ok_or("no stderr pipe")?);
    let mut seen = String::new();
    read_until(&mut stderr, &mut seen, "completed=100 ")?;
    fault(master)?;
    read_until(&mut stderr, &mut seen, "pool unreachable")?;
    let heal_at = format!("completed={} ", last_completed(&seen) + 30);
    read_until(&mut stderr, &mut seen, &heal_at)?;
    heal(master)?;
    stderr.read_to_string(&mut seen)?;
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .ok_or("no stdout pipe")?
        .read_to_string(&mut stdout)?;
    let status = child.wait()?;
    assert!(status.success(), "the replay failed ({status}):\n{seen}");
    Ok((serde_json::from_str(&stdout)?, seen))
}

fn field(report: &serde_json::Value, path: &[&str]) -> Result<u64, String> {
    let mut value = report;
    for name in path {
        value = &value[name];
    }
    value
        .as_u64()
        .ok_or_else(|| format!("no {} in the report", path.join(".")))
}

/// What every outage replay must show: all requests completed, no wrong page, closed
/// accounting, the outage named with what it cost, one WARN per outage and at most one
/// INFO per recovery.
fn assert_outage_survived(report: &serde_json::Value, stderr: &str) -> TestResult {
    assert_eq!(
        field(report, &["completed"])?,
        field(report, &["requests"])?
    );
    assert_eq!(
        field(report, &["mismatched_pages"])?,
        0,
        "a wrong page reached the engine"
    );
    let settled = field(report, &["saves_done"])?
        + field(report, &["saves_skipped_present"])?
        + field(report, &["saves_dropped"])?
        + field(report, &["saves_failed"])?;
    assert_eq!(field(report, &["saves_enqueued"])?, settled, "stats::A1");
    assert_eq!(
        field(report, &["loads_started"])?,
        field(report, &["loads_done"])? + field(report, &["loads_failed"])?,
        "stats::A2"
    );
    assert!(
        field(report, &["pool_health", "outages"])? >= 1,
        "the outage is named"
    );
    assert!(
        field(report, &["lookups", "outage"])? > 0,
        "lookups lost to it are counted"
    );
    assert!(
        field(report, &["saves_outage"])? > 0,
        "saves lost to it are counted"
    );
    assert!(field(report, &["saves_dropped"])? >= field(report, &["saves_outage"])?);
    let warns = stderr.matches("pool unreachable").count();
    let infos = stderr.matches("pool reachable again").count();
    let outages = usize::try_from(field(report, &["pool_health", "outages"])?)?;
    assert_eq!(warns, outages, "one WARN per outage:\n{stderr}");
    assert!(infos <= outages, "one INFO per recovery:\n{stderr}");
    Ok(())
}

/// SIGKILL mid-replay, then a new master on the same ports: the replay goes on without the
/// pool at its pace. (Mooncake's client takes seconds to reconnect to the new master, so the
/// replay may end first; `a_guarded_client_finds_a_restarted_master` shows the recovery.)
#[test]
fn a_master_killed_mid_replay_and_restarted() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let mut master = start_master(&install, "outage-killed")?;
    let (report, stderr) = replay_through_an_outage(
        &mut master,
        &|master| {
            signal("-KILL", master.pid().ok_or("no master")?)?;
            Ok(())
        },
        &|master| Ok(master.restart()?),
    )?;
    assert_outage_survived(&report, &stderr)?;
    master.stop()?;
    Ok(())
}

/// SIGSTOP mid-replay (a master that accepts and never answers), then SIGCONT: probes miss
/// their deadline instead of waiting out Mooncake's, and the thawed master is used again.
#[test]
fn a_master_frozen_mid_replay_and_thawed() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let mut master = start_master(&install, "outage-frozen")?;
    let (report, stderr) = replay_through_an_outage(
        &mut master,
        &|master| signal("-STOP", master.pid().ok_or("no master")?),
        &|master| signal("-CONT", master.pid().ok_or("no master")?),
    )?;
    assert_outage_survived(&report, &stderr)?;
    assert!(stderr.contains("pool reachable again"), "{stderr}");
    assert_eq!(report["pool_health"]["state"], "healthy", "{report}");
    master.stop()?;
    Ok(())
}

/// Polls `done` every 50 ms, for at most a minute (so a broken build fails rather than
/// hangs), until it holds.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let limit = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        if std::time::Instant::now() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// The guard over a real client: a killed master makes the pool unreachable after three
/// failed calls, calls are then refused at once, and once a master runs again on the same
/// ports the background probes find it and calls answer again.
#[test]
fn a_guarded_client_finds_a_restarted_master() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let mut master = start_master(&install, "outage-guarded")?;
    let settings = MooncakeSettings {
        venv_dir: venv_dir(),
        global_segment_size_bytes: 16 << 20,
        local_buffer_size_bytes: 4 << 20,
        fallback_staging_bytes: 1 << 20,
        ..master.client_settings(MooncakeSettings::default())
    };
    let client: Arc<dyn Pool> = Arc::new(MooncakePool::connect(settings)?);
    let calls = Config::default().validate()?.pool_calls;
    let guard = GuardedPool::new(Arc::clone(&client), GuardSettings::new(&calls, "restart"));
    assert_eq!(guard.exists(&["k"]), vec![Ok(false)]);
    master.stop()?;
    assert!(
        eventually(|| {
            guard.exists(&["k"]);
            guard.health().snapshot().state == "unreachable"
        }),
        "a dead master was never marked unreachable"
    );
    let refused = guard.exists(&["k"]);
    assert!(matches!(refused[..], [Err(PoolError::Unreachable { .. })]));
    master.restart()?;
    assert!(
        eventually(|| guard.health().snapshot().state == "healthy"),
        "the restarted master was never found"
    );
    assert_eq!(guard.exists(&["k"]), vec![Ok(false)]);
    assert_eq!(guard.health().snapshot().outages, 1);
    drop(guard);
    drop(client);
    master.stop()?;
    Ok(())
}

/// A client start against addresses that accept and never answer fails within
/// `mooncake.connect_timeout_ms`, naming the key, instead of Mooncake's minutes of retries.
#[test]
fn a_start_against_a_master_that_never_answers_fails_at_its_deadline() -> TestResult {
    if install().is_none() {
        return Ok(());
    }
    let (_master, master_address) = silent_listener()?;
    let (_metadata, metadata) = silent_listener()?;
    let settings = MooncakeSettings {
        venv_dir: venv_dir(),
        master_address,
        metadata_server: format!("http://{metadata}/metadata"),
        global_segment_size_bytes: 16 << 20,
        connect_timeout_ms: 1000,
        ..MooncakeSettings::default()
    };
    let err = MooncakePool::connect(settings).expect_err("nothing answers there");
    assert_eq!(err.kind(), "connect_timeout", "{err}");
    assert!(
        err.to_string().contains("mooncake.connect_timeout_ms"),
        "{err}"
    );
    Ok(())
}

/// SIGINT while the replay's clients start against a master that never answers: the
/// start is abandoned and the replay exits with 130 (it used to sit out Mooncake's retries,
/// about seven minutes, ignoring the signal). The metadata server is a real master's, since
/// the start checks that it answers first.
#[test]
fn sigint_stops_a_replay_whose_pool_never_answers_at_start() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let (silent, master_address) = silent_listener()?;
    let answering = start_master(&install, "outage-sigint-metadata")?;
    let venv = format!("mooncake.venv_dir={}", venv_dir().display());
    let metadata = format!("mooncake.metadata_server={}", answering.metadata_server());
    let mut child = Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args([
            "replay",
            "--model",
            "tiny-full",
            "--pool",
            "mooncake",
            "--master",
            &master_address,
            "--set",
            &metadata,
            "--set",
            &venv,
            "--set",
            "mooncake.connect_timeout_ms=3600000",
            "--quiet",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    // The reachability check connects and leaves; the client's own connection is the
    // second: from then on the start waits on the silent master.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(silent.accept()?);
    }
    signal("-INT", child.id())?;
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .ok_or("no stderr pipe")?
        .read_to_string(&mut stderr)?;
    let status = child.wait()?;
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("replay stopped by sigint while its pool was starting"),
        "{stderr}"
    );
    drop(held);
    Ok(())
}
