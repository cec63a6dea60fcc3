//! `kv-connector inspect`: where one prompt's blocks are in a pool, and what a lookup of it
//! would return.
//!
//! ## Workflow
//!
//! 1. Configuration and layout as `validate` loads them (`--config`, `KVC_*`, `--set`,
//!    `--model` / `--layout`, `--world`); `--pool` and `--master` set `pool.backend` and
//!    `mooncake.master_address`.
//! 2. The prompt: token ids from `--tokens FILE` (a JSON array or whitespace-separated
//!    integers, as `keys` reads them), or request `--line N` (from 1) of a Mooncake
//!    `--trace FILE`.
//! 3. The pool:
//!    - `memory`: an embedded pool seeded by replaying the first `--seed-requests` requests
//!      of `--seed-trace` (default: the `--trace` given, up to the request before
//!      `--line`) through the real connector, with a progress bar on a terminal; keys use
//!      the replay's stored page sizes. Unless the configuration sets `pool.capacity_bytes`,
//!      the pool holds every seeded prompt (nothing is evicted), and the instance has KV
//!      pages for the largest one. Without a trace the pool is empty;
//!    - `mooncake`: a client of the running master at `--master` (it contributes no
//!      segment); keys use the layout's page bytes times `--kv-bytes-scale` (default 1, as
//!      a serving engine stores them).
//! 4. Hashes (R1, default scope) and keys (R3, R4, with the layout fingerprint in the model
//!    key) of every full block.
//! 5. The lookup: [`run_lookup`], the lookup planner actor's own code, with the
//!    configuration's rewind, fallback and probe chunk, from `--local-match` tokens.
//! 6. Presence: one `exists` probe per key, after the lookup (probes grant leases, R14, so
//!    this runs second and does not change what the lookup saw); per group and shard, the
//!    runs of present blocks (for window groups, the saved window tails).
//! 7. Print a text summary, or with `--json` one JSON object.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::PathBuf;

use serde::Serialize;

use super::validate::ConfigArgs;
use crate::config::{Config, ConfigError, LoadedConfig, PoolBackend};
use crate::core::hash::{scope_seed, HashError, Scope};
use crate::core::keys::KeyError;
use crate::core::keys::KeySpace;
use crate::core::request_scope::RequestScope;
use crate::core::layout::{Layout, LayoutError};
use crate::replay::workload::{read_mooncake_trace, TraceError};
use crate::replay::ReplayError;
use crate::transfer::lookup::{run_lookup, PlannerSettings};

mod pool;
mod present;

use pool::{open_pool, PoolUnderTest};
use present::{presence, GroupPresence};

/// Arguments of `kv-connector inspect`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:\n  \
kv-connector inspect --trace trace.jsonl --line 40           # memory pool seeded by lines 1-39\n  \
kv-connector inspect --pool mooncake --master 10.0.0.5:50051 --model llama-3.1-8b --tokens prompt.json\n\
Every configuration key also has an environment variable KVC_<SECTION>_<KEY>.")]
pub struct InspectArgs {
    /// Configuration and layout.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The prompt's token ids: a JSON array or whitespace-separated integers.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["trace", "line"], required_unless_present = "trace")]
    pub tokens: Option<PathBuf>,
    /// A Mooncake trace (JSON lines with `timestamp`, `input_length`, `output_length` and
    /// `hash_ids` of 512-token blocks); the prompt is request --line of it.
    #[arg(long, value_name = "FILE", requires = "line")]
    pub trace: Option<PathBuf>,
    /// Which request of --trace to inspect: its N-th non-blank line, from 1.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub line: Option<u64>,
    /// Tokens the engine already holds locally (`num_computed`, block aligned).
    #[arg(long, value_name = "TOKENS", default_value_t = 0)]
    pub local_match: usize,
    /// The pool: memory (embedded, seeded by a replay) or mooncake (a running master).
    /// Default: the configuration's `pool.backend` (env `KVC_POOL_BACKEND`).
    #[arg(long, value_enum)]
    pub pool: Option<PoolBackend>,
    /// With --pool mooncake: the master's RPC address HOST:PORT (`mooncake.master_address`,
    /// env `KVC_MOONCAKE_MASTER_ADDRESS`; its metadata server is `mooncake.metadata_server`).
    #[arg(long, value_name = "HOST:PORT")]
    pub master: Option<String>,
    /// With --pool memory: the trace replayed to seed the pool (default: --trace).
    #[arg(long, value_name = "FILE")]
    pub seed_trace: Option<PathBuf>,
    /// With --pool memory: how many requests of the seed trace to replay (default: those
    /// before --line; 0 leaves the pool empty).
    #[arg(long, value_name = "N")]
    pub seed_requests: Option<usize>,
    /// Stored page size scale of the pool's objects (the `b{bytes}` key segment): with
    /// --pool mooncake, the `--kv-bytes-scale` the writers used (default 1, a serving
    /// engine); with --pool memory, the seeding replay's (default: as `replay` picks it,
    /// the largest power of two whose pages fit 4 GiB of host memory).
    #[arg(long, value_name = "F")]
    pub kv_bytes_scale: Option<f64>,
    /// Print every block's hash and keys, not only the summary.
    #[arg(long)]
    pub keys: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Why `kv-connector inspect` failed.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The layout was refused.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// `--line` is past the end of the trace.
    #[error("--line {line} is past the end of {} ({requests} requests); use 1 to {requests}", path.display())]
    LineOutOfRange {
        /// The trace.
        path: PathBuf,
        /// The line asked for.
        line: u64,
        /// Requests in the trace.
        requests: usize,
    },
    /// Reading or parsing `--tokens` failed.
    #[error(transparent)]
    Tokens(#[from] super::keys::KeysError),
    /// Hashing the prompt failed.
    #[error(transparent)]
    Hash(#[from] HashError),
    /// A key segment was refused.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// Seeding the memory pool failed.
    #[error("seeding the memory pool by replay failed")]
    Seed(#[source] Box<ReplayError>),
    /// `--kv-bytes-scale` outside (0, 1].
    #[error("--kv-bytes-scale {scale} is refused: it must be in (0, 1], e.g. 1")]
    BadScale {
        /// The value given.
        scale: f64,
    },
    /// `--pool mooncake` in a build without the feature.
    #[error("--pool mooncake needs a build with `--features mooncake` (scripts/setup-mooncake)")]
    MooncakeNotBuilt,
    /// Connecting to Mooncake failed.
    #[cfg(feature = "mooncake")]
    #[error("cannot connect to the mooncake master")]
    Mooncake(#[source] crate::pool::mooncake::MooncakeError),
    /// Writing the output failed.
    #[error("cannot write the output")]
    Write(#[source] io::Error),
    /// Encoding the JSON output failed.
    #[error("cannot encode the inspection as json")]
    Json(#[source] serde_json::Error),
}

impl InspectError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config(err) => err.kind(),
            Self::Layout(err) => err.kind(),
            Self::Trace(_) => "trace",
            Self::LineOutOfRange { .. } => "line_out_of_range",
            Self::Tokens(err) => err.kind(),
            Self::Hash(err) => err.kind(),
            Self::Key(_) => "key",
            Self::Seed(err) => err.kind(),
            Self::BadScale { .. } => "bad_scale",
            Self::MooncakeNotBuilt => "mooncake_not_built",
            #[cfg(feature = "mooncake")]
            Self::Mooncake(err) => err.kind(),
            Self::Write(_) => "write",
            Self::Json(_) => "json",
        }
    }
}

/// The lookup as it would return, for the output.
#[derive(Debug, Serialize)]
pub struct LookupSummary {
    /// `full`, `rewound`, `recovered`, `window_miss`, `full_miss`, `outage` (the pool did not
    /// answer in time, R30) or `failed`.
    pub outcome: &'static str,
    /// `e`: the first token the engine would compute.
    pub resume_tokens: usize,
    /// `H*T`: how far every full group hit.
    pub full_hit_tokens: usize,
    /// `e - L`.
    pub offered_tokens: usize,
    /// Blocks to load per group: `(group, [blocks])`.
    pub loads: Vec<(u32, Vec<usize>)>,
    /// Probe rounds the planner issued.
    pub rounds: usize,
    /// Keys probed.
    pub keys_probed: u64,
}

/// Everything `inspect` found.
#[derive(Debug, Serialize)]
pub struct Inspection {
    /// The pool and how it was set up.
    pub pool: String,
    /// The layout's name and fingerprint.
    pub layout: String,
    /// `T`.
    pub tokens_per_block: usize,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// `L`.
    pub local_match_tokens: usize,
    /// Chain hashes of the full blocks, hex.
    pub hashes: Vec<String>,
    /// Per group and shard: key prefix, present runs and (with `--keys`) every key.
    pub groups: Vec<GroupPresence>,
    /// What a lookup returns.
    pub lookup: LookupSummary,
}

/// Runs `kv-connector inspect` (module workflow).
///
/// # Errors
///
/// A configuration, layout, trace or token error naming what to fix; a seeding or
/// connection failure; a write error.
pub fn run<S: std::hash::BuildHasher>(
    args: &InspectArgs,
    env: HashMap<String, String, S>,
    out: &mut dyn Write,
) -> Result<(), InspectError> {
    if let Some(scale) = args.kv_bytes_scale.filter(|f| !(*f > 0.0 && *f <= 1.0)) {
        return Err(InspectError::BadScale { scale });
    }
    let loaded = load_config(args, env)?;
    let config = &loaded.config;
    let layout = args.config.layout(config)?;
    let prompt = read_prompt(args)?;
    let under_test = open_pool(args, config, &layout)?;
    let inspection = inspect(args, &loaded, &layout, &prompt, &under_test)?;
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &inspection).map_err(InspectError::Json)?;
        writeln!(out).map_err(InspectError::Write)?;
    } else {
        write_text(out, &inspection, args.keys).map_err(InspectError::Write)?;
    }
    out.flush().map_err(InspectError::Write)
}

/// Workflow step 1.
fn load_config<S: std::hash::BuildHasher>(
    args: &InspectArgs,
    env: HashMap<String, String, S>,
) -> Result<LoadedConfig, ConfigError> {
    let mut sources = args.config.sources(env.into_iter().collect())?;
    if let Some(pool) = args.pool {
        sources
            .cli_overrides
            .push(("pool.backend".to_owned(), pool.as_str().to_owned()));
    }
    if let Some(master) = &args.master {
        sources
            .cli_overrides
            .push(("mooncake.master_address".to_owned(), master.clone()));
    }
    Config::load(&sources)
}

/// Workflow step 2.
fn read_prompt(args: &InspectArgs) -> Result<Vec<i64>, InspectError> {
    if let (Some(trace), Some(line)) = (&args.trace, args.line) {
        let limit = usize::try_from(line).unwrap_or(usize::MAX);
        let requests = read_mooncake_trace(trace, Some(limit))?;
        let request = requests
            .get(limit - 1)
            .ok_or_else(|| InspectError::LineOutOfRange {
                path: trace.clone(),
                line,
                requests: requests.len(),
            })?;
        let mut tokens = Vec::new();
        request.write_prompt_tokens(&mut tokens);
        return Ok(tokens);
    }
    let path = args.tokens.clone();
    Ok(super::keys::read_token_file(
        path.as_deref(),
        io::stdin().lock(),
    )?)
}

/// Workflow steps 4-6.
fn inspect(
    args: &InspectArgs,
    loaded: &LoadedConfig,
    layout: &Layout,
    prompt: &[i64],
    under_test: &PoolUnderTest,
) -> Result<Inspection, InspectError> {
    let config = &loaded.config;
    let model_key = if config.keys.model_key.is_empty() {
        layout.name.clone()
    } else {
        config.keys.model_key.clone()
    };
    let keys = KeySpace::new(
        layout,
        &config.keys.namespace,
        &model_key,
        &under_test.payload_lens,
    )?;
    let tokens_per_block = usize::try_from(layout.tokens_per_block).unwrap_or(usize::MAX);
    let seed = scope_seed(&Scope::default());
    let settings = PlannerSettings::new(&loaded.runtime, layout, seed);
    let hashes = settings.prompt_hashes(&keys, prompt, &RequestScope::default())?;
    let result = run_lookup(
        under_test.pool.as_ref(),
        &keys,
        &settings,
        prompt,
        args.local_match,
        &RequestScope::default(),
    );
    let lookup = match &result.plan {
        Some(plan) => LookupSummary {
            outcome: plan.outcome.as_str(),
            resume_tokens: plan.resume_tokens,
            full_hit_tokens: plan.full_hit_tokens,
            offered_tokens: plan.offered_tokens,
            loads: plan
                .loads
                .iter()
                .map(|load| (load.group.0, load.blocks.clone()))
                .collect(),
            rounds: plan.rounds,
            keys_probed: result.keys_probed,
        },
        None => LookupSummary {
            outcome: if result.lost_to_outage {
                "outage"
            } else {
                "failed"
            },
            resume_tokens: args.local_match,
            full_hit_tokens: 0,
            offered_tokens: 0,
            loads: Vec::new(),
            rounds: 0,
            keys_probed: result.keys_probed,
        },
    };
    let groups = presence(under_test.pool.as_ref(), layout, &keys, &hashes, args.keys);
    Ok(Inspection {
        pool: under_test.description.clone(),
        layout: format!("{} (fingerprint {})", layout.name, keys.fingerprint),
        tokens_per_block,
        prompt_tokens: prompt.len(),
        local_match_tokens: args.local_match,
        hashes: hashes.chain().iter().map(ToString::to_string).collect(),
        groups,
        lookup,
    })
}

/// Workflow step 7, text.
fn write_text(out: &mut dyn Write, inspection: &Inspection, all_keys: bool) -> io::Result<()> {
    writeln!(out, "pool    {}", inspection.pool)?;
    writeln!(
        out,
        "layout  {}, T = {}",
        inspection.layout, inspection.tokens_per_block
    )?;
    writeln!(
        out,
        "prompt  {} tokens, {} full blocks, local match {} tokens",
        inspection.prompt_tokens,
        inspection.hashes.len(),
        inspection.local_match_tokens
    )?;
    if let (Some(first), Some(last)) = (inspection.hashes.first(), inspection.hashes.last()) {
        writeln!(
            out,
            "hashes  block 0 {first} ... block {} {last}",
            inspection.hashes.len() - 1
        )?;
    }
    for group in &inspection.groups {
        present::write_group(out, group, inspection.hashes.len(), all_keys)?;
    }
    let lookup = &inspection.lookup;
    writeln!(
        out,
        "lookup  outcome {}: resume at token {} (full groups hit to {}), {} tokens offered; \
         {} round(s), {} keys probed",
        lookup.outcome,
        lookup.resume_tokens,
        lookup.full_hit_tokens,
        lookup.offered_tokens,
        lookup.rounds,
        lookup.keys_probed
    )?;
    for (group, blocks) in &lookup.loads {
        writeln!(
            out,
            "  load group {group}: {} block(s) {}",
            blocks.len(),
            present::runs_text(&present::runs(blocks.iter().copied()))
        )?;
    }
    Ok(())
}
