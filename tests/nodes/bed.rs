//! The scenarios' shared set-up: the workload, the pace, the test bed of one scenario
//! ([`Bed`]: its network and master), and the one-host reference replay.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::common;
use super::net::TestNet;
use super::procs::{out_dir, start_master, start_node, Finished, MasterArgs, Node, NodeArgs, Proc};
use super::report::NodeResult;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Nodes of every scenario.
pub const NODES: usize = 3;

/// The workload every node builds, and the one-host reference replay: 60 conversations
/// of three turns (180 requests of 5k-6k tokens) about four shared documents after a
/// shared system prompt; conversation `s` is on node `s % 3` and has document `s % 4`, so
/// documents and the system prompt cross nodes. Pages are 832 bytes (1/5000 of
/// llama-3.1-8b's) in a pool that evicts nothing. About 150 simulated seconds.
pub const WORKLOAD: &[&str] = &[
    "--generate",
    "shared-documents",
    "--sessions",
    "60",
    "--turns",
    "3",
    "--first-turn-tokens",
    "5000",
    "--last-turn-tokens",
    "6000",
    "--system-prefix-tokens",
    "2000",
    "--document-tokens",
    "2000",
    "--session-spacing-ms",
    "2000",
    "--think-time-ms",
    "10000",
    "--model",
    "llama-3.1-8b",
    "--kv-bytes-scale",
    "0.0002",
    "--pool-capacity",
    "256GiB",
    "--set",
    "loaders.staging_bytes_per_loader=8MiB",
    "--set",
    "saver.staging_bytes=8MiB",
];

/// Simulated seconds per real second: a node's run takes about 15 s.
pub const PACE: f64 = 10.0;

/// Longest a node may run (`nodes::procs::P2`).
const NODE_LIMIT: Duration = Duration::from_secs(60);

/// One scenario at a time: each runs four processes on a two-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the machine for one scenario ([`SERIAL`]); a scenario that panicked before
/// leaves it usable.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The venv when the test bed can run here; `None` (skip, said once on stderr) without
/// root or the Mooncake install, unless they are required (`common::mooncake::required`).
pub fn test_bed() -> Option<PathBuf> {
    common::mooncake::install()?;
    let root = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|status| status.lines().any(|line| line.starts_with("Uid:\t0\t")));
    if !root {
        assert!(
            !common::mooncake::required(),
            "the nodes test bed needs root (network namespaces) and Mooncake is required"
        );
        eprintln!("skipping the nodes test bed: it needs root for network namespaces");
        return None;
    }
    Some(common::mooncake::venv_dir())
}

/// The network and the master of one scenario; the master drops before the network
/// (`nodes::procs::P1`).
pub struct Bed {
    master: Proc,
    pub net: TestNet,
    venv: PathBuf,
    pub dir: PathBuf,
    client_ttl_s: u64,
}

impl Bed {
    /// Nodes `0..labels.len()`, node `i` labelled `labels[i]`, all on `start`'s
    /// simulated time 0.
    pub fn start_nodes(
        &self,
        start: &SharedStart,
        labels: &[&str],
    ) -> Result<Vec<Node>, Box<dyn std::error::Error>> {
        labels
            .iter()
            .enumerate()
            .map(|(i, label)| self.node(i, label, &start.node_args(self, label)))
            .collect()
    }

    pub fn up(
        venv: PathBuf,
        scenario: &str,
        client_ttl_s: u64,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let dir = out_dir(scenario)?;
        let net = TestNet::create(NODES)?;
        let master = start_master(
            &net,
            &venv,
            &MasterArgs {
                client_ttl_s,
                log: &dir.join("master.log"),
            },
        )?;
        Ok(Self {
            master,
            net,
            venv,
            dir,
            client_ttl_s,
        })
    }

    /// Starts node `index` (of [`NODES`]), with `extra` flags.
    pub fn node(
        &self,
        index: usize,
        label: &str,
        extra: &[String],
    ) -> Result<Node, Box<dyn std::error::Error>> {
        start_node(
            &self.net,
            &self.venv,
            &NodeArgs {
                index,
                count: NODES,
                workload: WORKLOAD,
                pace: PACE,
                dir: &self.dir,
                label,
                extra,
            },
        )
    }

    /// `--report-dir` of node `label`, for its timeline.
    pub fn report_dir(&self, label: &str) -> Vec<String> {
        vec![
            "--report-dir".to_owned(),
            self.dir.join(label).display().to_string(),
        ]
    }

    pub fn restart_master(&mut self) -> TestResult {
        self.master.kill();
        let log = self.dir.join("master.log");
        self.master = start_master(
            &self.net,
            &self.venv,
            &MasterArgs {
                client_ttl_s: self.client_ttl_s,
                log: &log,
            },
        )?;
        Ok(())
    }
}

/// Sleeps until `at` after `start` (which may still be to come).
pub fn sleep_until(start: Instant, at: Duration) {
    let due = start + at;
    std::thread::sleep(due.saturating_duration_since(Instant::now()));
}

/// Simulated seconds a paced node on the shared timeline has covered `wall` after its
/// simulated time 0.
pub fn sim_at(wall: Duration) -> f64 {
    wall.as_secs_f64() * PACE
}

/// How long after the nodes are spawned their shared simulated time 0 comes: enough for
/// each to start its Mooncake client first (about a second on two busy cores).
const START_DELAY: Duration = Duration::from_secs(3);

/// Simulated time 0 shared by the nodes of a scenario (`replay --start-at`), so that their
/// start-ups do not skew their clocks.
pub struct SharedStart {
    /// `--start-at`.
    unix_ms: u64,
    /// The same instant on this process's clock.
    pub instant: Instant,
}

impl SharedStart {
    /// [`START_DELAY`] from now.
    pub fn soon() -> Result<Self, Box<dyn std::error::Error>> {
        let at = SystemTime::now() + START_DELAY;
        let unix_ms = u64::try_from(at.duration_since(UNIX_EPOCH)?.as_millis())?;
        Ok(Self {
            unix_ms,
            instant: Instant::now() + START_DELAY,
        })
    }

    /// The flags of a node on this timeline, with `--report-dir` for `label`'s timeline.
    pub fn node_args(&self, bed: &Bed, label: &str) -> Vec<String> {
        let mut args = vec!["--start-at".to_owned(), self.unix_ms.to_string()];
        args.extend(bed.report_dir(label));
        args
    }
}

pub fn finish(
    node: Node,
    label: &str,
    dir: &Path,
) -> Result<NodeResult, Box<dyn std::error::Error>> {
    NodeResult::read(label, &node.finish(NODE_LIMIT)?, dir)
}

/// A single-host replay of the same workload: three instances in one process on node 0's
/// host, with their own master on its loopback.
pub fn single_host(bed: &Bed) -> Result<NodeResult, Box<dyn std::error::Error>> {
    let binary = Path::new(env!("CARGO_BIN_EXE_kv-connector"));
    let report = bed.dir.join("single-host.json");
    let output = TestNet::command(bed.net.node_namespace(0), binary)
        .args([
            "replay",
            "--pool",
            "mooncake",
            "--instances",
            "3",
            "--routing",
            "session",
        ])
        .args(["--json", "--quiet", "--set"])
        .arg(format!("mooncake.venv_dir={}", bed.venv.display()))
        .args(WORKLOAD)
        .output()?;
    std::fs::write(&report, &output.stdout)?;
    let report = serde_json::from_slice(&output.stdout).map_err(|err| {
        format!(
            "single host: {err}: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    let code = output.status.code().unwrap_or(-1);
    NodeResult::read("single-host", &Finished { code, report }, &bed.dir)
}
