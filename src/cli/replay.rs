//! `kv-connector replay`: runs a workload through simulated serving instances sharing one
//! pool and reports what the connector achieved (`docs/DESIGN.md` section 11).
//!
//! ## Workflow
//!
//! 1. Load the configuration: defaults < `--config` < environment < `--set` < the
//!    dedicated flags (`--model`, `--layout`, `--pool`, `--pool-capacity`, `--master`,
//!    `--device`, `--swa-rewind-tokens`, `--window-fallback`, `--pool-high-watermark`,
//!    `--pool-eviction-ratio`, `--metrics-addr`).
//! 2. Load the layout (the preset or layout file of the configuration), at `--world` ranks.
//! 3. Build the workload: `--trace FILE`, `--generate long-multiturn` or `--generate
//!    shared-documents` (the generator's presets, which its flags override), or with neither
//!    the built-in demo (a scaled-down long multi-turn workload of 12 requests of 10k-17k
//!    tokens); `--limit` keeps the first requests; `--node I/N` then keeps this node's
//!    share ([`crate::replay::nodes`]).
//! 4. Run the replay with the connector of `--connector` (`kvc`, the real one, or `none`,
//!    the baseline) and a progress bar on stderr (hidden when stderr is not a terminal or
//!    with `--quiet`).
//! 5. Print the summary table on stdout, or with `--json` one JSON object on stdout (and
//!    the table on stderr unless `--quiet`).
//! 6. With `--report-dir DIR`, the replay also collects time series per simulated time
//!    bucket, and `DIR` gets the JSON report, the timeline and PNG plots
//!    ([`crate::replay::plots`]). `DIR` is checked (created, and a probe file written)
//!    before the replay starts.
//! 7. Check the report ([`crate::replay::checks`]): a mismatched page, a page published
//!    past the chunk end or accounting that does not close fails the run
//!    ([`ReplayCliError::ChecksFailed`], exit status 3) after everything above was written.
//!
//! A stop signal (SIGINT, SIGTERM) ends the replay early with a partial report: the table
//! on stderr, the JSON on stdout with `--json` (its `stopped_by` names the signal), and
//! `DIR` written with `--report-dir`; then the error names the signal.
//!
//! `--local-prefix-cache` gives every simulated instance a local prefix cache (vLLM's
//! automatic prefix caching, TensorRT-LLM's KV cache reuse): pages of finished prompts
//! stay in the instance's KV cache and later prompts on that instance start from them,
//! asking the connector only for what lies beyond. It is a replay flag, not a
//! configuration key: the configuration tree configures the connector runtime, which a
//! real engine embeds next to its own prefix cache; the replay flag says which engine is
//! simulated. Off by default, so the pool's share is measured alone.
//!
//! `--drafter` (with `--draft-tokens`, `--draft-acceptance`) runs a simulated EAGLE-style
//! drafter on every instance, a replay flag for the same reason: extra KV tokens past each
//! chunk end, drafts written and rewound (`replay::engine`'s docs); the report's
//! `published_past_chunk_end` must stay 0 (R16, R18).

use std::collections::HashMap;
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::signals::{Signal, StopSignal};
use crate::config::{parse_byte_size, parse_override, Config, ConfigSources, PoolBackend};
use crate::core::layout::Layout;
use crate::metrics::{parse_metrics_addr, MetricsError, MetricsServer, MetricsSources};
use crate::replay::baseline::BaselineComparison;
use crate::replay::checks::{check, FailedChecks};
use crate::replay::cost::CostModel;
use crate::replay::engine::DrafterSetup;
use crate::replay::kvc::kvc_handle;
use crate::replay::nodes::{NodeShare, NodeShareError, Pace};
use crate::replay::plots::{check_report_dir, write_report_dir, PlotError};
use crate::replay::workload::{
    generate_long_multiturn, read_mooncake_trace, LongMultiturnParams, WorkloadRequest,
};
use crate::replay::{
    no_connector, run_replay, run_replay_with_timeline, ConnectorFactory, DeploymentParams,
    InstanceContext, KvBytesScale, KvPages, NoProgress, PoolMaster, ProgressSink, ReplayConnector,
    ReplayError, ReplayParams, ReplayReport, Routing,
};

/// Which workload generator `--generate` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GenerateKind {
    /// Long multi-turn conversations growing from about 100k to 170k tokens.
    LongMultiturn,
    /// Many two-turn conversations about a few shared 30k-token documents after a shared
    /// 20k-token system prefix: later conversations share prefixes that end where no prompt
    /// ends (the case window checkpoints serve).
    SharedDocuments,
}

/// Which connector each instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConnectorKind {
    /// The kv-connector runtime.
    Kvc,
    /// No connector: the baseline without a shared pool.
    None,
}

/// Overrides of the conversation generator's parameters (defaults: long-multiturn;
/// shared-documents where it differs).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GeneratorArgs {
    /// Conversations (default 2; the demo 2; shared-documents 32).
    #[arg(long, value_name = "N")]
    pub sessions: Option<u32>,
    /// Turns per conversation (default 24; the demo 6; shared-documents 2).
    #[arg(long, value_name = "N")]
    pub turns: Option<u32>,
    /// Prompt tokens of a conversation's first turn (default 100000; the demo 10000;
    /// shared-documents 54000).
    #[arg(long, value_name = "TOKENS")]
    pub first_turn_tokens: Option<u32>,
    /// Prompt tokens of a conversation's last turn (default 170000; the demo 17000;
    /// shared-documents 56000).
    #[arg(long, value_name = "TOKENS")]
    pub last_turn_tokens: Option<u32>,
    /// Leading tokens shared by every conversation (default 96000; the demo 9600;
    /// shared-documents 20000).
    #[arg(long, value_name = "TOKENS")]
    pub system_prefix_tokens: Option<u32>,
    /// Shared documents after the system prefix: conversation `s` has document `s % N`
    /// (default 0, none; shared-documents 4).
    #[arg(long, value_name = "N")]
    pub documents: Option<u32>,
    /// Tokens of each shared document; 0 exactly when --documents is 0 (default 0;
    /// shared-documents 30000).
    #[arg(long, value_name = "TOKENS")]
    pub document_tokens: Option<u32>,
    /// Answer tokens of every turn (default 512; the demo 64; shared-documents 256).
    #[arg(long, value_name = "TOKENS")]
    pub output_tokens: Option<u32>,
    /// Simulated milliseconds between two turns of a conversation (default 30000).
    #[arg(long, value_name = "MS")]
    pub think_time_ms: Option<u64>,
    /// Simulated milliseconds between the starts of two conversations (default 10000).
    #[arg(long, value_name = "MS")]
    pub session_spacing_ms: Option<u64>,
    /// Most tokens at the end of a turn the next turn re-renders differently (default 0).
    #[arg(long, value_name = "TOKENS")]
    pub divergence_tokens_max: Option<u32>,
    /// Seed of every generated token stream.
    #[arg(long, value_name = "SEED")]
    pub seed: Option<u64>,
}

/// The end of `replay --help`: a Mooncake replay from a fresh clone, and the configuration
/// layers.
const REPLAY_AFTER_HELP: &str = "\
A replay on Mooncake Store, from a fresh clone:
  scripts/setup-mooncake                    # .venv: the client wheel and mooncake_master
  export PYO3_PYTHON=$PWD/.venv/bin/python
  cargo build --release --features mooncake
  # the replay starts a mooncake_master on free loopback ports for the run:
  target/release/kv-connector replay --pool mooncake --instances 2 \\
    --trace ../shared/traces/mooncake_synthetic_trace.jsonl --limit 150 \\
    --model llama-3.1-8b --kv-bytes-scale 0.0002 --pool-capacity 512GiB
  # or against a master you run (RPC port; its HTTP metadata server is
  # mooncake.metadata_server, default http://HOST:8080/metadata):
  target/release/kv-connector replay --pool mooncake --master 127.0.0.1:50051

Configuration: defaults < --config FILE < environment < --set < the flags above. Every key
has an environment variable KVC_<SECTION>_<KEY> (config/default.toml lists them all);
`kv-connector validate` prints the effective configuration and every refusal.
Logs: RUST_LOG (default warn) on stderr.

Exit status:
  0    the replay ran to its end and passed its checks
  3    the replay ran to its end but failed a check: a mismatched page, a page published
       past its chunk end, or accounting that does not close; the report is written as
       usual and stderr names every failed check on one line
  1    any other error (configuration, workload, pool, a stalled connector)
  2    a command-line usage error
  130  stopped by SIGINT, 143 stopped by SIGTERM (the partial report is on stderr)";

/// Arguments of `kv-connector replay`.
#[derive(Debug, Clone, clap::Args)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent on/off command-line flags, each its own clap switch"
)]
#[command(after_help = REPLAY_AFTER_HELP)]
pub struct ReplayArgs {
    /// A Mooncake trace file: JSON lines with a timestamp, input and output lengths and the
    /// hash ids of 512-token blocks.
    #[arg(long, value_name = "FILE", conflicts_with = "generate")]
    pub trace: Option<PathBuf>,
    /// Generate the workload instead of reading a trace. Without --trace and --generate a
    /// small built-in demo workload runs.
    #[arg(long, value_enum, value_name = "KIND")]
    pub generate: Option<GenerateKind>,
    /// Generator parameters (for --generate and the demo).
    #[command(flatten)]
    pub generator: GeneratorArgs,
    /// Model preset whose KV layout is served: llama-3.1-8b, llama-3.1-8b-eagle (with the
    /// drafter's layer group), gpt-oss-120b, gemma-3-27b, tiny-hybrid, tiny-full (default:
    /// the configuration's `model.preset`, env `KVC_MODEL_PRESET`).
    #[arg(long, value_name = "PRESET", conflicts_with = "layout")]
    pub model: Option<String>,
    /// A layout TOML file instead of a preset (`model.layout_file`, env
    /// `KVC_MODEL_LAYOUT_FILE`).
    #[arg(long, value_name = "FILE")]
    pub layout: Option<PathBuf>,
    /// A configuration TOML file merged over the built-in defaults (`config/default.toml`
    /// lists every key with its env name).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A configuration override `section.key=value` (e.g. `pool.capacity_bytes=8GiB`),
    /// applied over the file and the environment; repeat for several.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Context instances sharing the pool.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub instances: usize,
    /// How requests are spread over instances.
    #[arg(long, value_enum, default_value_t = Routing::RoundRobin)]
    pub routing: Routing,
    /// The pool backend: memory (embedded) or mooncake (Mooncake Store, one client per
    /// instance; needs a build with --features mooncake). Default: the configuration's
    /// `pool.backend` (env `KVC_POOL_BACKEND`).
    #[arg(long, value_enum)]
    pub pool: Option<PoolBackend>,
    /// With --pool mooncake: use the running `mooncake_master` at HOST:PORT (its RPC port;
    /// the metadata server is `mooncake.metadata_server`, by default
    /// `http://HOST:8080/metadata`) instead of starting one on free loopback ports for the
    /// run (`mooncake.master_address`, env `KVC_MOONCAKE_MASTER_ADDRESS`).
    #[arg(long, value_name = "HOST:PORT")]
    pub master: Option<String>,
    /// With --pool mooncake: Mooncake's one-node layout. The replay also starts a
    /// node-local `mooncake_client` (the "real client") holding the whole pool capacity,
    /// and every instance attaches to it as a dummy client over shared memory
    /// (`mooncake.real_client_address`; against a running master, set that key instead).
    #[arg(long, conflicts_with = "master")]
    pub real_client: bool,
    /// Modeled pool capacity at full page size (e.g. 64GiB); the pool holds
    /// --kv-bytes-scale times it (for Mooncake, split evenly into one segment per
    /// instance). Default: the configuration's `pool.capacity_bytes` (env
    /// `KVC_POOL_CAPACITY_BYTES`).
    #[arg(long, value_name = "BYTES")]
    pub pool_capacity: Option<String>,
    /// Where pages live: `cuda` (GPU memory through cudarc; needs a build with
    /// `--features cuda` and a driver), `host` (host memory), or `auto` (the GPU when one
    /// is present). Default: the configuration's `device.kind` (`auto`); env `KVC_DEVICE_KIND`.
    #[arg(long, value_name = "KIND", value_parser = ["auto", "cuda", "host"])]
    pub device: Option<String>,
    /// `R`: how far before a prompt end a later request may resume and still find window
    /// KV (`planner.swa_endpoint_rewind_tokens`, R12, R17); window groups keep and save
    /// `W + R` tokens at each prompt end (default: the configuration's, 2048; env
    /// `KVC_PLANNER_SWA_ENDPOINT_REWIND_TOKENS`).
    #[arg(long, value_name = "TOKENS")]
    pub swa_rewind_tokens: Option<u64>,
    /// Probe further back for an earlier prompt end with a complete window when none is
    /// complete within the rewind (`planner.window_fallback`, R13; default: the
    /// configuration's, true; env `KVC_PLANNER_WINDOW_FALLBACK`).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub window_fallback: Option<bool>,
    /// Queue window pages ahead of full-attention blocks (`saver.window_first`, R21; false
    /// saves first in, first out; default: the configuration's, true).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub window_first: Option<bool>,
    /// Most pages each rank's save queue holds before it sheds (`saver.queue_capacity_pages`,
    /// R22; default: the configuration's, 65536).
    #[arg(long, value_name = "PAGES")]
    pub save_queue_pages: Option<usize>,
    /// Replay only the first N requests.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Run node I of N (I from 0): replay only this node's share of the workload, every
    /// turn of conversation `s` on node `s % N` (requests without a conversation, as in
    /// traces, go in turn), with the other nodes' processes running the other shares
    /// against the same pool (--pool mooncake --master HOST:PORT). Usually with --pace, so
    /// that the nodes advance together; docs/RELIABILITY.md, "Several nodes".
    #[arg(long, value_name = "I/N", value_parser = parse_node)]
    pub node: Option<NodeShare>,
    /// Simulated seconds per real second, at most: the simulated clock reaches `t` no
    /// earlier than `t / F` real seconds after the engines start, once the pool and the
    /// connectors are up (F > 0). Keeps the processes of --node on one timeline and bounds
    /// a run's wall time to about the workload's simulated span divided by F. Default: as
    /// fast as the machine goes.
    #[arg(long, value_name = "F", value_parser = parse_pace)]
    pub pace: Option<f64>,
    /// With --pace: simulated time 0 is this wall-clock instant, in Unix milliseconds
    /// (`date +%s%3N`), instead of when the engines start. Node processes given the same
    /// one share a timeline whatever their start-up took; one whose engines start after it
    /// runs at full speed until it catches up.
    #[arg(long, value_name = "UNIX_MS", requires = "pace")]
    pub start_at: Option<u64>,
    /// Store and move F times each page's bytes (0 < F <= 1, rounded to a multiple of 64
    /// bytes, at least 64); the cost model still uses full sizes. Default: the largest
    /// power of two that fits --host-memory-limit.
    #[arg(long, value_name = "F")]
    pub kv_bytes_scale: Option<f64>,
    /// KV pages per layer group of each instance (default: from --kv-memory).
    #[arg(long, value_name = "N", conflicts_with = "kv_memory")]
    pub kv_pages: Option<u32>,
    /// KV cache memory of one rank at full page size, which sets the pages per group
    /// (default: the model's estimate for an H200-class GPU).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub kv_memory: Option<u64>,
    /// Most host memory the replay may take for its instances, checked before it starts:
    /// every rank's simulated KV pages (with their per-page overhead) and connector staging
    /// pools, and every instance's page tables. The embedded pool is bounded by its own
    /// capacity (--pool-capacity times the page scale).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value = "4GiB")]
    pub host_memory_limit: u64,
    /// Tensor-parallel ranks per instance (default: the layout's world size); at most
    /// 64, dividing or a multiple of every group's KV heads.
    #[arg(long, value_name = "N")]
    pub world: Option<u32>,
    /// Prompt tokens one engine step computes, over all its requests.
    #[arg(long, value_name = "TOKENS", default_value_t = 8192)]
    pub max_num_tokens: usize,
    /// The connector each instance runs: kvc (the runtime) or none (the baseline).
    #[arg(long, value_enum, default_value_t = ConnectorKind::Kvc)]
    pub connector: ConnectorKind,
    /// Run a speculative drafter (EAGLE-style) on every instance: the KV cache allocates
    /// --draft-tokens extra KV tokens past each chunk end, drafts are written into the
    /// generation pages after the prompt and rejected ones rewound; decoding advances
    /// the expected accepted run plus one token per step.
    #[arg(long)]
    pub drafter: bool,
    /// Draft tokens per step with --drafter (the extra KV tokens), at least 1.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "drafter")]
    pub draft_tokens: usize,
    /// Probability that one draft token is accepted with --drafter, given that the ones
    /// before it were (0 to 1).
    #[arg(long, value_name = "F", default_value_t = 0.7, requires = "drafter")]
    pub draft_acceptance: f64,
    /// The embedded pool starts evicting above this share of its capacity
    /// (`pool.eviction_high_watermark_ratio`; default: the configuration's, 0.95).
    #[arg(long, value_name = "F")]
    pub pool_high_watermark: Option<f64>,
    /// Share of the embedded pool's capacity one eviction pass frees
    /// (`pool.eviction_ratio`; default: the configuration's, 0.05).
    #[arg(long, value_name = "F")]
    pub pool_eviction_ratio: Option<f64>,
    /// Give each instance a local prefix cache: pages of finished prompts are kept
    /// (evicted least recently used) and shared with later prompts on the same instance;
    /// the connector is asked only for what lies beyond the local match.
    #[arg(long)]
    pub local_prefix_cache: bool,
    /// Test R29 at scale: every instance takes back the second half of each load while it
    /// runs and hands those pages to another request that writes them at once; the page
    /// check counts any page a loader wrote after its release (`mismatched_pages`). A filled
    /// load resumes at its kept half (layouts with window groups compute it instead).
    #[arg(long)]
    pub release_during_loads: bool,
    /// Also replay the same workload with no connector and report both side by side
    /// (simulated TTFT, throughput, prefill tokens, with the ratios). On for the built-in
    /// demo; off with --connector none.
    #[arg(long)]
    pub compare_baseline: bool,
    /// Real seconds an idle instance may wait on its connector without progress before
    /// the replay fails.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub stall_timeout_s: u64,
    /// Inject faults (needs a build with `--features faults`): `default` turns every fault
    /// point on at a modest rate, or `point=rate,...` with `seed=N` and `slow_ms=N`, e.g.
    /// `get=0.01,corrupt_payload=0.005,seed=7` (docs/RELIABILITY.md lists the points).
    #[arg(long, value_name = "SPEC")]
    pub faults: Option<String>,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// No progress bar, and no table on stderr with --json.
    #[arg(long)]
    pub quiet: bool,
    /// Serve Prometheus metrics of every instance's connector (label `connector`) at
    /// http://HOST:PORT/metrics while the replay runs, e.g. 127.0.0.1:9464 (port 0 picks a
    /// free one, logged at INFO). Sets `stats.metrics_addr` (env `KVC_STATS_METRICS_ADDR`).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Also write DIR/report.json (the --json object), DIR/timeline.json (per simulated
    /// time bucket: reuse, lookup outcomes, saves, loads; every TTFT) and four PNG plots:
    /// reuse.png, lookups.png, ttft.png, throughput.png. Needs a TrueType font such as
    /// `DejaVu Sans` (Debian: `fonts-dejavu-core`).
    #[arg(long, value_name = "DIR")]
    pub report_dir: Option<PathBuf>,
}

/// Why `kv-connector replay` failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayCliError {
    /// The replay failed (boxed: the replay error is large and this one is returned
    /// through every layer of the binary).
    #[error(transparent)]
    Replay(Box<ReplayError>),
    /// Writing the report failed.
    #[error("writing the replay report failed")]
    Write(#[source] io::Error),
    /// Encoding the JSON report failed.
    #[error("encoding the replay report as json failed")]
    Json(#[source] serde_json::Error),
    /// `--faults` in a build without the `faults` cargo feature.
    #[error(
        "--faults needs a build with the `faults` cargo feature: cargo build --features faults"
    )]
    FaultsNotBuilt,
    /// The `--faults` spec is invalid.
    #[cfg(feature = "faults")]
    #[error("invalid --faults spec")]
    FaultSpec(#[source] crate::pool::faults::FaultSpecError),
    /// A signal stopped the replay; the partial report was written (the table on stderr).
    #[error(
        "replay stopped by {} after {completed} of {requests} requests; the partial report is on stderr",
        signal.as_str()
    )]
    Interrupted {
        /// The signal.
        signal: Signal,
        /// Requests that had their first token.
        completed: u64,
        /// Requests in the workload.
        requests: u64,
    },
    /// A signal arrived while the pool was starting (a Mooncake master that does not
    /// answer): the start was abandoned and nothing was replayed.
    #[error("replay stopped by {} while its pool was starting; nothing was replayed", signal.as_str())]
    StoppedWhileStarting {
        /// The signal.
        signal: Signal,
    },
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// Writing `--report-dir` failed.
    #[error(transparent)]
    ReportDir(#[from] PlotError),
    /// The replay ran to its end, its report was written, and it failed a check
    /// ([`crate::replay::checks`]).
    #[error(transparent)]
    ChecksFailed(#[from] FailedChecks),
}

impl From<ReplayError> for ReplayCliError {
    fn from(err: ReplayError) -> Self {
        Self::Replay(Box::new(err))
    }
}

impl ReplayCliError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Replay(err) => err.kind(),
            Self::Write(_) => "write",
            Self::Json(_) => "json",
            Self::FaultsNotBuilt => "faults_not_built",
            #[cfg(feature = "faults")]
            Self::FaultSpec(_) => "fault_spec",
            Self::Interrupted { .. } => "interrupted",
            Self::StoppedWhileStarting { .. } => "stopped_while_starting",
            Self::Metrics(err) => err.kind(),
            Self::ReportDir(err) => err.kind(),
            Self::ChecksFailed(_) => "checks_failed",
        }
    }
}

/// A byte size with an optional unit (`4GiB`, `512MiB`, `1000`).
fn parse_bytes(text: &str) -> Result<u64, String> {
    parse_byte_size(text).ok_or_else(|| format!("{text:?} is not a byte size; 4GiB works"))
}

/// `--node I/N`.
fn parse_node(text: &str) -> Result<NodeShare, String> {
    text.parse().map_err(|err: NodeShareError| err.to_string())
}

/// `--pace F`: finite and above 0.
fn parse_pace(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .and_then(Pace::new)
        .map(|pace| pace.sim_seconds_per_second)
        .ok_or_else(|| format!("{text:?} is not a pace above 0 (simulated seconds per second); 60 works"))
}

/// The demo workload: the long multi-turn shape at a tenth of its size.
pub fn demo_params() -> LongMultiturnParams {
    LongMultiturnParams {
        sessions: 2,
        turns_per_session: 6,
        first_turn_tokens: 10_000,
        last_turn_tokens: 17_000,
        output_tokens: 64,
        system_prefix_tokens: 9_600,
        ..LongMultiturnParams::default()
    }
}

/// Runs `kv-connector replay`; `env` is the process environment's configuration variables.
///
/// # Errors
///
/// As [`run_until_stopped`], which it calls with a stop that never fires.
#[cfg(feature = "internals")]
pub fn run<S: std::hash::BuildHasher>(
    args: &ReplayArgs,
    env: HashMap<String, String, S>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ReplayCliError> {
    run_until_stopped(args, env, &StopSignal::never(), out, err)
}

/// Runs `kv-connector replay` until it ends or `stop` fires (SIGINT / SIGTERM): then the
/// driver stops admitting requests, the connectors shut down, and the partial report is
/// written as a full one would be (module docs), with its table on `err`.
///
/// # Errors
///
/// [`ReplayCliError::Replay`] for any setup or replay failure, [`ReplayCliError::Write`] or
/// [`ReplayCliError::Json`] when the report cannot be written;
/// [`ReplayCliError::Interrupted`] after the partial report when `stop` fired;
/// [`ReplayCliError::ChecksFailed`] after the whole report when the replay failed a check.
pub fn run_until_stopped<S: std::hash::BuildHasher>(
    args: &ReplayArgs,
    env: HashMap<String, String, S>,
    stop: &StopSignal,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ReplayCliError> {
    run_with_connector(args, env, stop, None, out, err)
}

/// [`run_until_stopped`] with `connector`, when given, building every instance's connector
/// in place of the one `--connector` names: replays another implementation of the engine
/// hooks through the whole command (report, `--report-dir`, checks, exit status).
///
/// # Errors
///
/// As [`run_until_stopped`].
pub fn run_with_connector<S: std::hash::BuildHasher>(
    args: &ReplayArgs,
    env: HashMap<String, String, S>,
    stop: &StopSignal,
    connector: Option<&mut ConnectorFactory<'_>>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ReplayCliError> {
    let faults = fault_wiring::injector(args)?;
    let config = load_config(args, env)?;
    let sources = MetricsSources::new();
    if let (Some(master), PoolBackend::Memory) = (&args.master, config.pool.backend) {
        return Err(ReplayError::MasterWithoutMooncake {
            master: master.clone(),
            backend: "memory",
        }
        .into());
    }
    if args.real_client && config.pool.backend == PoolBackend::Memory {
        return Err(ReplayError::RealClientWithoutMooncake { backend: "memory" }.into());
    }
    let params = replay_params(args, config)?;
    let workload = build_workload(args)?;
    if let Some(dir) = &args.report_dir {
        check_report_dir(dir)?;
    }
    let metrics = match parse_metrics_addr(&params.config.stats.metrics_addr)? {
        Some(addr) => Some(MetricsServer::start(addr, Arc::clone(&sources))?),
        None => None,
    };
    // The real connector, seeing its pool through the fault injector with `--faults` and
    // registered with the metrics endpoint with `--metrics-addr`.
    let mut kvc = |context: &InstanceContext| {
        let context = fault_wiring::context(&faults, context);
        let handle = kvc_handle(&context)?;
        if metrics.is_some() {
            sources.add(context.instance.to_string(), handle.stats_source());
        }
        Ok::<Box<dyn ReplayConnector>, ReplayError>(Box::new(handle))
    };
    let mut progress = BarProgress::new(args.quiet, stop.clone());
    let factory: &mut ConnectorFactory<'_> = match (connector, args.connector) {
        (Some(connector), _) => connector,
        (None, ConnectorKind::Kvc) => &mut kvc,
        (None, ConnectorKind::None) => &mut no_connector,
    };
    let stopped = |err| stopped_or(err, stop);
    let (mut report, timeline) = match &args.report_dir {
        Some(_) => {
            let (report, timeline) =
                run_replay_with_timeline(&params, &workload, factory, &mut progress)
                    .map_err(stopped)?;
            (report, Some(timeline))
        }
        None => (
            run_replay(&params, &workload, factory, &mut progress).map_err(stopped)?,
            None,
        ),
    };
    fault_wiring::record(&faults, &mut report);
    let stopped = stop.received();
    if compares_baseline(args) && stopped.is_none() {
        // No connector, so no pool: never start a Mooncake master or clients for it.
        let mut config = (*params.config).clone();
        config.pool.backend = PoolBackend::Memory;
        let mut baseline_params = params.clone();
        baseline_params.config = Arc::new(config);
        "none".clone_into(&mut baseline_params.connector_name);
        let without = run_replay(
            &baseline_params,
            &workload,
            &mut no_connector,
            &mut NoProgress,
        )?;
        report.baseline = Some(BaselineComparison::new(&report, &without));
    }
    report.stopped_by = stopped.map(|signal| signal.as_str().to_owned());
    report.node = args.node;
    write_report(args, &report, out, err)?;
    if let (Some(dir), Some(timeline)) = (&args.report_dir, timeline) {
        let written = write_report_dir(dir, &report, &timeline)?;
        if !args.quiet {
            let names: Vec<String> = written
                .iter()
                .map(|path| path.display().to_string())
                .collect();
            writeln!(err, "report written: {}", names.join(", ")).map_err(ReplayCliError::Write)?;
        }
    }
    match stopped {
        Some(signal) => Err(ReplayCliError::Interrupted {
            signal,
            completed: report.completed,
            requests: report.requests,
        }),
        None => Ok(check(&report)?),
    }
}

/// A replay error after a stop signal: a pool start the signal cut short is a stop, not a
/// failure.
fn stopped_or(err: ReplayError, stop: &StopSignal) -> ReplayCliError {
    match stop.received() {
        Some(signal) if err.kind() == "interrupted" => {
            ReplayCliError::StoppedWhileStarting { signal }
        }
        _ => err.into(),
    }
}

/// Whether the run also replays the workload without a connector: asked for, or the
/// built-in demo (no `--trace`, no `--generate`), whose point is to show what the connector
/// buys; never when the run itself has no connector.
fn compares_baseline(args: &ReplayArgs) -> bool {
    let demo = args.trace.is_none() && args.generate.is_none();
    args.connector == ConnectorKind::Kvc && (args.compare_baseline || demo)
}

/// The replay's parameters from the flags and the loaded configuration (workflow step 2).
fn replay_params(args: &ReplayArgs, config: Config) -> Result<ReplayParams, ReplayCliError> {
    let mut layout = match config.model.layout_file() {
        Some(path) => Layout::from_file(path).map_err(ReplayError::from)?,
        None => Layout::preset(&config.model.preset).map_err(ReplayError::from)?,
    };
    if let Some(world) = args.world {
        layout = layout.with_world_size(world).map_err(ReplayError::from)?;
    }
    let cost = CostModel::for_layout(&layout.name, layout.world_size);
    let kv_pages = match (args.kv_pages, args.kv_memory) {
        (Some(pages), _) => KvPages::Fixed(pages),
        (None, Some(bytes)) => KvPages::Memory(bytes),
        (None, None) => KvPages::Memory(cost.kv_memory_bytes),
    };
    Ok(ReplayParams {
        config: Arc::new(config),
        layout: Arc::new(layout),
        deployment: DeploymentParams {
            instances: args.instances,
            kv_pages,
            kv_bytes_scale: args
                .kv_bytes_scale
                .map_or(KvBytesScale::Auto, KvBytesScale::Fixed),
            host_memory_limit_bytes: args.host_memory_limit,
            pool_master: match (&args.master, args.real_client) {
                (Some(_), _) => PoolMaster::Configured,
                (None, true) => PoolMaster::StartWithRealClient,
                (None, false) => PoolMaster::Start,
            },
        },
        routing: args.routing,
        max_num_tokens: args.max_num_tokens,
        cost,
        stall_timeout: Duration::from_secs(args.stall_timeout_s),
        wait_timeout: Duration::from_millis(20),
        connector_name: match args.connector {
            ConnectorKind::Kvc => "kvc",
            ConnectorKind::None => "none",
        }
        .to_owned(),
        local_prefix_cache: args.local_prefix_cache,
        drafter: drafter_setup(args)?,
        release_during_loads: args.release_during_loads,
        pace: args.pace.and_then(Pace::new).map(|pace| Pace {
            start_at_unix_ms: args.start_at,
            ..pace
        }),
    })
}

/// The drafter of `--drafter`, with its flags checked.
fn drafter_setup(args: &ReplayArgs) -> Result<Option<DrafterSetup>, ReplayError> {
    if !args.drafter {
        return Ok(None);
    }
    if args.draft_tokens == 0 {
        return Err(ReplayError::InvalidSetting {
            setting: "--draft-tokens",
            value: "0".to_owned(),
            working: "3",
        });
    }
    if !(0.0..=1.0).contains(&args.draft_acceptance) {
        return Err(ReplayError::InvalidSetting {
            setting: "--draft-acceptance",
            value: args.draft_acceptance.to_string(),
            working: "0.7",
        });
    }
    Ok(Some(DrafterSetup {
        draft_tokens: args.draft_tokens,
        acceptance: args.draft_acceptance,
    }))
}

/// Configuration layers (workflow step 1).
fn load_config<S: std::hash::BuildHasher>(
    args: &ReplayArgs,
    env: HashMap<String, String, S>,
) -> Result<Config, ReplayError> {
    let mut cli_overrides = args
        .overrides
        .iter()
        .map(|text| parse_override(text))
        .collect::<Result<Vec<_>, _>>()?;
    let path = |path: &PathBuf| path.display().to_string();
    let dedicated = [
        args.model.clone().map(|name| ("model.preset", name)),
        args.layout
            .as_ref()
            .map(|file| ("model.layout_file", path(file))),
        args.pool
            .map(|kind| ("pool.backend", kind.as_str().to_owned())),
        args.master
            .clone()
            .map(|address| ("mooncake.master_address", address)),
        args.pool_capacity
            .clone()
            .map(|bytes| ("pool.capacity_bytes", bytes)),
        args.device.clone().map(|kind| ("device.kind", kind)),
        args.swa_rewind_tokens
            .map(|tokens| ("planner.swa_endpoint_rewind_tokens", tokens.to_string())),
        args.window_fallback
            .map(|on| ("planner.window_fallback", on.to_string())),
        args.pool_high_watermark
            .map(|ratio| ("pool.eviction_high_watermark_ratio", ratio.to_string())),
        args.pool_eviction_ratio
            .map(|ratio| ("pool.eviction_ratio", ratio.to_string())),
        args.window_first
            .map(|on| ("saver.window_first", on.to_string())),
        args.save_queue_pages
            .map(|pages| ("saver.queue_capacity_pages", pages.to_string())),
        args.metrics_addr
            .clone()
            .map(|addr| ("stats.metrics_addr", addr)),
    ];
    cli_overrides.extend(
        dedicated
            .into_iter()
            .flatten()
            .map(|(key, value)| (key.to_owned(), value)),
    );
    let sources = ConfigSources {
        toml_path: args.config.clone(),
        env: env.into_iter().collect(),
        cli_overrides,
    };
    let loaded = Config::load(&sources)?;
    for warning in &loaded.warnings {
        tracing::warn!(%warning, "configuration");
    }
    Ok(loaded.config)
}

/// The workload (workflow step 3).
fn build_workload(args: &ReplayArgs) -> Result<Vec<WorkloadRequest>, ReplayError> {
    let mut requests = if let Some(trace) = &args.trace {
        read_mooncake_trace(trace, args.limit)?
    } else {
        let base = match args.generate {
            Some(GenerateKind::LongMultiturn) => LongMultiturnParams::default(),
            Some(GenerateKind::SharedDocuments) => LongMultiturnParams::shared_documents(),
            None => demo_params(),
        };
        generate_long_multiturn(&args.generator.apply(base))?
    };
    if let Some(limit) = args.limit {
        requests.truncate(limit);
    }
    if let Some(node) = args.node {
        requests = node.split(requests);
    }
    Ok(requests)
}

impl GeneratorArgs {
    /// `base` with every given flag applied.
    fn apply(&self, base: LongMultiturnParams) -> LongMultiturnParams {
        LongMultiturnParams {
            sessions: self.sessions.unwrap_or(base.sessions),
            turns_per_session: self.turns.unwrap_or(base.turns_per_session),
            first_turn_tokens: self.first_turn_tokens.unwrap_or(base.first_turn_tokens),
            last_turn_tokens: self.last_turn_tokens.unwrap_or(base.last_turn_tokens),
            output_tokens: self.output_tokens.unwrap_or(base.output_tokens),
            think_time_ms: self.think_time_ms.unwrap_or(base.think_time_ms),
            session_spacing_ms: self.session_spacing_ms.unwrap_or(base.session_spacing_ms),
            seed: self.seed.unwrap_or(base.seed),
            system_prefix_tokens: self
                .system_prefix_tokens
                .unwrap_or(base.system_prefix_tokens),
            documents: self.documents.unwrap_or(base.documents),
            document_tokens: self.document_tokens.unwrap_or(base.document_tokens),
            divergence_tokens_max: self
                .divergence_tokens_max
                .unwrap_or(base.divergence_tokens_max),
        }
    }
}

/// Prints the report (workflow step 5). A partial report (a signal stopped the replay)
/// puts its table on `err` in every case, and its JSON on `out` with `--json`.
fn write_report(
    args: &ReplayArgs,
    report: &ReplayReport,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ReplayCliError> {
    let partial = report.stopped_by.is_some();
    if args.json {
        serde_json::to_writer(&mut *out, report).map_err(ReplayCliError::Json)?;
        writeln!(out).map_err(ReplayCliError::Write)?;
    }
    if partial || (args.json && !args.quiet) {
        report.write_table(err).map_err(ReplayCliError::Write)?;
        err.flush().map_err(ReplayCliError::Write)?;
    } else if !args.json {
        report.write_table(out).map_err(ReplayCliError::Write)?;
    }
    out.flush().map_err(ReplayCliError::Write)
}

/// `--faults`: each instance's connector sees its pool through a
/// `pool::faults::FaultyPool`, all sharing one injector, whose counts go in the report.
#[cfg(feature = "faults")]
mod fault_wiring {
    use std::sync::Arc;

    use super::{ReplayArgs, ReplayCliError};
    use crate::pool::faults::{FaultInjector, FaultSpec, FaultyPool};
    use crate::replay::{InstanceContext, ReplayReport};

    pub(super) type Injector = Option<Arc<FaultInjector>>;

    pub(super) fn injector(args: &ReplayArgs) -> Result<Injector, ReplayCliError> {
        let Some(text) = &args.faults else {
            return Ok(None);
        };
        let spec = FaultSpec::parse(text).map_err(ReplayCliError::FaultSpec)?;
        Ok(Some(Arc::new(FaultInjector::new(spec))))
    }

    /// The instance's context, its pool wrapped in the injector when `--faults` is on.
    pub(super) fn context(faults: &Injector, context: &InstanceContext) -> InstanceContext {
        let mut context = context.clone();
        if let Some(faults) = faults {
            context.pool = Arc::new(FaultyPool::new(context.pool, Arc::clone(faults)));
        }
        context
    }

    pub(super) fn record(faults: &Injector, report: &mut ReplayReport) {
        if let Some(faults) = faults {
            let counts = faults.counts().into_iter();
            report.faults_injected = Some(counts.map(|(name, n)| (name.to_owned(), n)).collect());
        }
    }
}

/// Without the `faults` feature, `--faults` is refused with the feature named.
#[cfg(not(feature = "faults"))]
mod fault_wiring {
    use super::{ReplayArgs, ReplayCliError};
    use crate::replay::{InstanceContext, ReplayReport};

    /// No injector in this build.
    pub(super) struct Injector;

    pub(super) fn injector(args: &ReplayArgs) -> Result<Injector, ReplayCliError> {
        match args.faults {
            Some(_) => Err(ReplayCliError::FaultsNotBuilt),
            None => Ok(Injector),
        }
    }

    pub(super) fn context(_faults: &Injector, context: &InstanceContext) -> InstanceContext {
        context.clone()
    }

    pub(super) fn record(_faults: &Injector, _report: &mut ReplayReport) {}
}

/// A progress bar on stderr, hidden when stderr is not a terminal or with `--quiet`; also
/// logs each completion at INFO and relays a stop signal to the driver.
struct BarProgress {
    bar: ProgressBar,
    total: u64,
    stop: StopSignal,
}

impl BarProgress {
    fn new(quiet: bool, stop: StopSignal) -> Self {
        let target = if quiet || !io::stderr().is_terminal() {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(None, target);
        if let Ok(style) =
            ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} requests {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        Self {
            bar,
            total: 0,
            stop,
        }
    }
}

impl ProgressSink for BarProgress {
    fn start(&mut self, total: u64) {
        self.total = total;
        self.bar.set_length(total);
    }

    fn advance(&mut self, completed: u64, sim_seconds: f64) {
        tracing::debug!(
            completed,
            total = self.total,
            sim_seconds,
            "replay progress"
        );
        self.bar.set_position(completed);
        self.bar
            .set_message(format!("(simulated {sim_seconds:.1} s)"));
    }

    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }

    fn stop_requested(&mut self) -> bool {
        self.stop.received().is_some()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn args(flags: &[&str]) -> Result<ReplayArgs, clap::Error> {
        let mut line = vec!["kv-connector", "replay"];
        line.extend_from_slice(flags);
        match Cli::try_parse_from(line)?.command {
            Command::Replay(args) => Ok(*args),
            _ => Err(clap::Error::new(clap::error::ErrorKind::InvalidSubcommand)),
        }
    }

    #[test]
    fn drafter_flags_build_the_drafter_and_refuse_bad_values(
    ) -> Result<(), Box<dyn std::error::Error>> {
        assert_eq!(drafter_setup(&args(&[])?)?, None);
        let on = drafter_setup(&args(&["--drafter", "--draft-tokens", "4"])?)?;
        assert_eq!(
            on,
            Some(DrafterSetup {
                draft_tokens: 4,
                acceptance: 0.7
            })
        );
        // The draft flags need --drafter.
        assert!(args(&["--draft-tokens", "4"]).is_err());
        for flags in [
            ["--drafter", "--draft-tokens", "0"],
            ["--drafter", "--draft-acceptance", "1.5"],
        ] {
            let refused = drafter_setup(&args(&flags)?);
            assert!(matches!(refused, Err(ReplayError::InvalidSetting { .. })));
        }
        Ok(())
    }

    #[test]
    fn pool_eviction_flags_set_the_config_keys() -> Result<(), Box<dyn std::error::Error>> {
        let args = args(&[
            "--pool-high-watermark",
            "0.97",
            "--pool-eviction-ratio",
            "0.01",
        ])?;
        let config = load_config(&args, HashMap::<String, String>::new())?;
        assert!((config.pool.eviction_high_watermark_ratio - 0.97).abs() < 1e-12);
        assert!((config.pool.eviction_ratio - 0.01).abs() < 1e-12);
        Ok(())
    }

    #[test]
    fn pool_kinds_are_the_config_backends() {
        use clap::ValueEnum;
        let flags: Vec<String> = PoolBackend::value_variants()
            .iter()
            .filter_map(ValueEnum::to_possible_value)
            .map(|value| value.get_name().to_owned())
            .collect();
        assert_eq!(flags, PoolBackend::NAMES);
        let names: Vec<&str> = PoolBackend::value_variants()
            .iter()
            .map(|backend| backend.as_str())
            .collect();
        assert_eq!(names, PoolBackend::NAMES);
    }

    #[test]
    fn pool_and_master_flags_set_the_config_keys() -> Result<(), Box<dyn std::error::Error>> {
        let args = args(&["--pool", "mooncake", "--master", "10.0.0.5:50051"])?;
        let config = load_config(&args, HashMap::<String, String>::new())?;
        assert_eq!(config.pool.backend, PoolBackend::Mooncake);
        assert_eq!(config.mooncake.master_address, "10.0.0.5:50051");
        assert_eq!(
            config.mooncake.effective_metadata_server(),
            "http://10.0.0.5:8080/metadata"
        );
        Ok(())
    }

    #[test]
    fn master_without_the_mooncake_pool_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let args = args(&["--pool", "memory", "--master", "127.0.0.1:50051"])?;
        let err = run(
            &args,
            HashMap::<String, String>::new(),
            &mut Vec::new(),
            &mut Vec::new(),
        )
        .expect_err("--master needs the mooncake pool");
        assert_eq!(err.kind(), "master_without_mooncake");
        assert!(err.to_string().contains("--pool mooncake"), "{err}");
        Ok(())
    }

    type TestResult<T> = Result<T, Box<dyn std::error::Error>>;

    /// Without the `faults` feature, `--faults` is refused before anything runs, with the
    /// feature named.
    #[cfg(not(feature = "faults"))]
    #[test]
    fn faults_without_the_feature_name_the_feature() -> TestResult<()> {
        let args = args(&["--faults", "default"])?;
        let err = run(
            &args,
            HashMap::<String, String>::new(),
            &mut Vec::new(),
            &mut Vec::new(),
        )
        .expect_err("--faults needs the feature");
        assert_eq!(err.kind(), "faults_not_built");
        assert!(err.to_string().contains("--features faults"), "{err}");
        Ok(())
    }

    fn replay_args(flags: &[&str]) -> TestResult<ReplayArgs> {
        let cli = Cli::try_parse_from(["kv-connector", "replay"].iter().chain(flags))?;
        let Command::Replay(args) = cli.command else {
            return Err("not the replay subcommand".into());
        };
        Ok(*args)
    }

    /// The dedicated planner flags override the environment and `--set` (step 1).
    #[test]
    fn rewind_and_fallback_flags_set_the_planner_keys() -> TestResult<()> {
        let defaults = load_config(&replay_args(&[])?, HashMap::<String, String>::new())?;
        assert_eq!(defaults.planner, Config::default().planner);
        let args = replay_args(&[
            "--swa-rewind-tokens",
            "512",
            "--window-fallback",
            "false",
            "--set",
            "planner.swa_endpoint_rewind_tokens=64",
        ])?;
        let env = HashMap::from([("KVC_PLANNER_WINDOW_FALLBACK".to_owned(), "1".to_owned())]);
        let config = load_config(&args, env)?;
        assert_eq!(config.planner.swa_endpoint_rewind_tokens, 512);
        assert!(!config.planner.window_fallback);
        let on = load_config(
            &replay_args(&["--window-fallback", "true"])?,
            HashMap::<String, String>::new(),
        )?;
        assert!(on.planner.window_fallback);
        assert!(replay_args(&["--window-fallback", "maybe"]).is_err());
        assert!(replay_args(&["--swa-rewind-tokens", "-1"]).is_err());
        Ok(())
    }

    /// `--window-first` and `--save-queue-pages` set the saver keys over `--set` (R21, R22).
    #[test]
    fn save_order_flags_set_the_saver_keys() -> TestResult<()> {
        let defaults = load_config(&replay_args(&[])?, HashMap::<String, String>::new())?;
        assert_eq!(defaults.saver, Config::default().saver);
        let args = replay_args(&[
            "--window-first",
            "false",
            "--save-queue-pages",
            "256",
            "--set",
            "saver.queue_capacity_pages=64",
        ])?;
        let config = load_config(&args, HashMap::<String, String>::new())?;
        assert!(!config.saver.window_first);
        assert_eq!(config.saver.queue_capacity_pages, 256);
        assert!(replay_args(&["--window-first", "maybe"]).is_err());
        Ok(())
    }
}
