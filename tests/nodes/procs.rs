//! The test bed's processes: a `mooncake_master` in the master's namespace and one
//! `kv-connector replay --node I/N` per node, each in its namespace.
//!
//! Invariants:
//! - `nodes::procs::P1`. Every process is killed (SIGKILL) and reaped by its guard's drop
//!   if still running, by its PID, never by name; declare guards after the [`TestNet`] so
//!   they drop first and no process outlives its namespace.
//! - `nodes::procs::P2`. Every wait is bounded: a node that does not finish within its
//!   limit is killed and the test fails naming it (no hang).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::net::TestNet;

/// The master's ports inside its namespace (nothing else listens there).
pub const RPC_PORT: u16 = 50051;
const METADATA_PORT: u16 = 8080;
const METRICS_PORT: u16 = 9003;

type TestError = Box<dyn std::error::Error>;

/// Where the test bed's logs and reports go.
pub fn out_dir(scenario: &str) -> Result<PathBuf, TestError> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("nodes-{scenario}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A child process, killed and reaped on drop (`nodes::procs::P1`).
pub struct Proc {
    /// For messages.
    pub name: String,
    child: Child,
}

impl Proc {
    fn spawn(name: String, command: &mut Command) -> Result<Self, TestError> {
        let child = command
            .spawn()
            .map_err(|err| format!("starting {name}: {err}"))?;
        Ok(Self { name, child })
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits at most `limit` for the exit code (`nodes::procs::P2`).
    ///
    /// # Errors
    ///
    /// When the process is still running at `limit` (it is killed) or died by a signal.
    pub fn wait(&mut self, limit: Duration) -> Result<i32, TestError> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return status
                    .code()
                    .ok_or_else(|| format!("{} died by a signal: {status}", self.name).into());
            }
            if started.elapsed() > limit {
                self.kill();
                return Err(format!("{} still running after {limit:?}: killed", self.name).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// How the master runs.
pub struct MasterArgs<'a> {
    /// `--client_ttl` seconds: how long the master keeps a silent client's segment.
    pub client_ttl_s: u64,
    /// Its log file.
    pub log: &'a Path,
}

/// Starts `mooncake_master` in the master's namespace with its HTTP metadata server, and
/// waits until its RPC port answers.
///
/// # Errors
///
/// When it does not start or its port does not answer within 10 s.
pub fn start_master(net: &TestNet, venv: &Path, args: &MasterArgs<'_>) -> Result<Proc, TestError> {
    let host = TestNet::master_address();
    let log = File::options().create(true).append(true).open(args.log)?;
    let mut command = TestNet::command(net.master_namespace(), &venv.join("bin/mooncake_master"));
    command
        .args([
            "--enable_http_metadata_server=true".to_owned(),
            format!("--http_metadata_server_host={host}"),
            format!("--http_metadata_server_port={METADATA_PORT}"),
            format!("--rpc_address={host}"),
            format!("--rpc_port={RPC_PORT}"),
            format!("--metrics_host={host}"),
            format!("--metrics_port={METRICS_PORT}"),
            format!("--client_ttl={}", args.client_ttl_s),
            "--default_kv_lease_ttl=200".to_owned(),
            "--enable_metric_reporting=false".to_owned(),
            "--logtostderr=true".to_owned(),
        ])
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log));
    let master = Proc::spawn("mooncake_master".to_owned(), &mut command)?;
    wait_listening(
        net.master_namespace(),
        &host,
        RPC_PORT,
        Duration::from_secs(10),
    )?;
    wait_listening(
        net.master_namespace(),
        &host,
        METADATA_PORT,
        Duration::from_secs(10),
    )?;
    Ok(master)
}

/// Waits until `host:port` accepts a connection, tried from inside `namespace`.
fn wait_listening(
    namespace: &str,
    host: &str,
    port: u16,
    limit: Duration,
) -> Result<(), TestError> {
    let started = Instant::now();
    let probe = format!("exec 3<>/dev/tcp/{host}/{port}");
    while started.elapsed() < limit {
        let status = Command::new("ip")
            .args(["netns", "exec", namespace, "bash", "-c", &probe])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if status.success() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("nothing listens at {host}:{port} after {limit:?}").into())
}

/// One node's replay process and where its report goes.
pub struct Node {
    /// The process.
    pub proc: Proc,
    /// Its `--json` report (stdout).
    pub report: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
}

/// How a node's replay runs.
pub struct NodeArgs<'a> {
    /// This node, `0 <= index < count`.
    pub index: usize,
    /// Nodes sharing the workload.
    pub count: usize,
    /// The workload and model flags every node shares.
    pub workload: &'a [&'a str],
    /// `--pace`.
    pub pace: f64,
    /// Where its report and log go.
    pub dir: &'a Path,
    /// A label for file names (`node2`, `node2-late`).
    pub label: &'a str,
    /// More replay flags (`--report-dir`).
    pub extra: &'a [String],
}

/// Starts node `args.index`'s replay in its namespace against the master, with its own
/// Mooncake client and segment at its own address.
///
/// # Errors
///
/// When it cannot be spawned.
pub fn start_node(net: &TestNet, venv: &Path, args: &NodeArgs<'_>) -> Result<Node, TestError> {
    let address = TestNet::node_address(args.index);
    let master = TestNet::master_address();
    let report = args.dir.join(format!("{}.json", args.label));
    let log = args.dir.join(format!("{}.log", args.label));
    let binary = Path::new(env!("CARGO_BIN_EXE_kv-connector"));
    let mut command = TestNet::command(net.node_namespace(args.index), binary);
    let sets = [
        format!("mooncake.metadata_server=http://{master}:{METADATA_PORT}/metadata"),
        format!("mooncake.local_hostname={address}"),
        format!("mooncake.tcp_bind_address={address}"),
        format!("mooncake.venv_dir={}", venv.display()),
    ];
    command
        .args(["replay", "--pool", "mooncake", "--json", "--quiet"])
        .args(["--master", &format!("{master}:{RPC_PORT}")])
        .args(["--node", &format!("{}/{}", args.index, args.count)])
        .args(["--pace", &args.pace.to_string()])
        .args(args.workload)
        .args(args.extra)
        .args(sets.iter().flat_map(|set| ["--set", set.as_str()]))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::from(File::create(&report)?))
        .stderr(Stdio::from(File::create(&log)?));
    let proc = Proc::spawn(format!("{} ({address})", args.label), &mut command)?;
    Ok(Node { proc, report, log })
}

/// What a finished node reported.
pub struct Finished {
    /// Its exit code (0: ran to its end and passed its checks).
    pub code: i32,
    /// Its JSON report.
    pub report: serde_json::Value,
}

impl Node {
    /// Waits at most `limit` for the node to end and reads its report.
    ///
    /// # Errors
    ///
    /// When it does not end in time, or its report is not JSON (its log is quoted).
    pub fn finish(mut self, limit: Duration) -> Result<Finished, TestError> {
        let code = self.proc.wait(limit)?;
        let text = std::fs::read_to_string(&self.report)?;
        let report = serde_json::from_str(text.trim()).map_err(|err| {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            format!(
                "{}: exit {code}, no JSON report ({err}); stderr:\n{log}",
                self.proc.name
            )
        })?;
        Ok(Finished { code, report })
    }
}
