//! `kv-connector bench`: the connector's own micro-benchmarks, for a quick look at a
//! machine without building the criterion benches (`cargo bench` gives the careful
//! figures: `benches/hash_chain.rs`).
//!
//! ## Workflow
//!
//! 1. Build the inputs once: a prompt of `--prompt-tokens` pseudo-random token ids, the
//!    layout of `--model` (its `T` and groups), and `--objects` pages of `--page-bytes`.
//! 2. Run each benchmark repeatedly for at least `--min-time-ms` (and at least 3 times),
//!    timing every iteration with `Instant`:
//!    - `hash_chain`: [`hash_blocks`] over the whole prompt (R1);
//!    - `keys`: one [`KeyColumn`] of the prompt's hashes per group (R3);
//!    - `planner`: a [`Lookup`] of the whole prompt against a pool answer where the first
//!      90 % of the blocks are present (R10-R13), every round answered;
//!    - `pool_put` / `pool_get`: batched `put` and `get_into` of every page on the
//!      embedded memory pool (a fresh pool per `put` iteration, created outside the
//!      timing).
//! 3. Print a table (median and fastest iteration, throughput) or with `--json` one JSON
//!    array of the same rows.
//!
//! The figures are wall-clock times on whatever else the machine runs; compare them on one
//! machine only.

use std::fmt::Write as _;
use std::hint::black_box;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::core::eviction::EvictionPolicy;
use crate::core::hash::{hash_blocks, scope_seed, BlockHash, HashError, Scope};
use crate::core::keys::{KeyColumn, KeyPrefix, KeySpec, Shard};
use crate::core::layout::{Layout, LayoutError};
use crate::core::planner::{Lookup, LookupRequest, PlanError, PlannerGroup};
use crate::pool::{ManualClock, MemoryPool, Pool, PoolError};

/// Arguments of `kv-connector bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Tokens of the benchmark prompt.
    #[arg(long, value_name = "TOKENS", default_value_t = 131_072)]
    pub prompt_tokens: usize,
    /// Layout preset whose T and groups the hash, key and planner benchmarks use.
    #[arg(long, value_name = "PRESET", default_value = "gpt-oss-120b")]
    pub model: String,
    /// Bytes of one page in the pool benchmarks.
    #[arg(long, value_name = "BYTES", default_value_t = 65_536)]
    pub page_bytes: usize,
    /// Pages per pool put/get batch.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub objects: usize,
    /// Least time each benchmark runs, milliseconds (at least 3 iterations).
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub min_time_ms: u64,
    /// Print one JSON array instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Why `kv-connector bench` failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A size flag is zero.
    #[error("{flag} must be at least 1 (e.g. {example}), got 0")]
    Zero {
        /// The flag.
        flag: &'static str,
        /// A value that works.
        example: &'static str,
    },
    /// The layout preset was refused.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Hashing failed.
    #[error(transparent)]
    Hash(#[from] HashError),
    /// The planner refused its input.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The embedded pool failed.
    #[error("the embedded pool failed during {operation}")]
    Pool {
        /// `create`, `put` or `get`.
        operation: &'static str,
        /// The first key's error.
        #[source]
        source: PoolError,
    },
    /// Writing the output failed.
    #[error("cannot write the output")]
    Write(#[source] io::Error),
    /// Encoding the JSON output failed.
    #[error("cannot encode the results as json")]
    Json(#[source] serde_json::Error),
}

impl BenchError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Zero { .. } => "zero",
            Self::Layout(err) => err.kind(),
            Self::Hash(err) => err.kind(),
            Self::Plan(err) => err.kind(),
            Self::Pool { .. } => "pool",
            Self::Write(_) => "write",
            Self::Json(_) => "json",
        }
    }
}

/// One benchmark's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchRow {
    /// The benchmark.
    pub name: &'static str,
    /// What one iteration does.
    pub work: String,
    /// Iterations run.
    pub iterations: usize,
    /// Median iteration, microseconds.
    pub median_us: f64,
    /// Fastest iteration, microseconds.
    pub min_us: f64,
    /// Units per second at the median.
    pub throughput: f64,
    /// The unit of `throughput`.
    pub unit: &'static str,
}

/// Times `iteration` until `min_time` has passed (at least 3 times); `units` is what one
/// iteration processes.
fn measure<E>(
    min_time: Duration,
    mut iteration: impl FnMut() -> Result<Duration, E>,
) -> Result<(usize, Duration, Duration), E> {
    let started = Instant::now();
    let mut times = Vec::new();
    while times.len() < 3 || started.elapsed() < min_time {
        times.push(iteration()?);
    }
    times.sort_unstable();
    Ok((times.len(), times[times.len() / 2], times[0]))
}

/// Builds a row from a measurement.
fn row(
    name: &'static str,
    work: String,
    (iterations, median, min): (usize, Duration, Duration),
    units: f64,
    unit: &'static str,
) -> BenchRow {
    let median_s = median.as_secs_f64().max(1e-12);
    BenchRow {
        name,
        work,
        iterations,
        median_us: median.as_secs_f64() * 1e6,
        min_us: min.as_secs_f64() * 1e6,
        throughput: units / median_s,
        unit,
    }
}

/// Pseudo-random token ids (a fixed LCG), deterministic across runs.
fn prompt(tokens: usize) -> Vec<i64> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..tokens)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            i64::try_from((state >> 33) % 200_000).unwrap_or(0)
        })
        .collect()
}

/// Runs `kv-connector bench` (module workflow).
///
/// # Errors
///
/// [`BenchError::Zero`] for a zero size, a layout, hash, planner or pool error, or a write
/// error.
#[expect(clippy::cast_precision_loss, reason = "throughput figures")]
pub fn run(args: &BenchArgs, out: &mut dyn Write) -> Result<(), BenchError> {
    for (flag, value, example) in [
        ("--prompt-tokens", args.prompt_tokens, "131072"),
        ("--page-bytes", args.page_bytes, "65536"),
        ("--objects", args.objects, "512"),
    ] {
        if value == 0 {
            return Err(BenchError::Zero { flag, example });
        }
    }
    let min_time = Duration::from_millis(args.min_time_ms);
    let layout = Layout::preset(&args.model)?;
    let tokens_per_block = usize::try_from(layout.tokens_per_block).unwrap_or(usize::MAX);
    let tokens = prompt(args.prompt_tokens);
    let seed = scope_seed(&Scope::default());
    let hashes = hash_blocks(seed, &tokens, tokens_per_block)?;
    let blocks = hashes.len() as f64;
    let mut rows = Vec::new();
    let hashing = measure(min_time, || -> Result<Duration, HashError> {
        let started = Instant::now();
        black_box(hash_blocks(seed, black_box(&tokens), tokens_per_block)?);
        Ok(started.elapsed())
    })?;
    rows.push(row(
        "hash_chain",
        format!("{} tokens, T = {tokens_per_block}", tokens.len()),
        hashing,
        tokens.len() as f64,
        "tokens/s",
    ));
    let keys = measure(min_time, || -> Result<Duration, BenchError> {
        Ok(build_keys(&layout, &hashes))
    })?;
    let groups = layout.groups.len();
    rows.push(row(
        "keys",
        format!("{} blocks x {groups} group(s)", hashes.len()),
        keys,
        blocks * groups as f64,
        "keys/s",
    ));
    let planner = measure(min_time, || plan_once(&layout, tokens.len()))?;
    rows.push(row(
        "planner",
        format!("lookup of {} blocks, 90 % present", hashes.len()),
        planner,
        1.0,
        "lookups/s",
    ));
    rows.extend(pool_rows(args, min_time)?);
    write_rows(args, &rows, out)
}

/// One key column per group of the layout (the `keys` benchmark).
fn build_keys(layout: &Layout, hashes: &[BlockHash]) -> Duration {
    let started = Instant::now();
    for group in &layout.groups {
        let spec = KeySpec {
            namespace: "kvc",
            model_key: "bench",
            shard: Shard::Rank { world: 1, rank: 0 },
            group: group.id,
            tokens_per_block: usize::try_from(layout.tokens_per_block).unwrap_or(1),
            bytes_per_page: layout.page_bytes(group).unwrap_or(0),
        };
        black_box(KeyColumn::with_hashes(KeyPrefix::new(&spec), hashes));
    }
    started.elapsed()
}

/// One lookup of the whole prompt, every round answered from a "first 90 % present" pool.
fn plan_once(layout: &Layout, prompt_tokens: usize) -> Result<Duration, BenchError> {
    let tokens_per_block = usize::try_from(layout.tokens_per_block).unwrap_or(1);
    let present_blocks = prompt_tokens / tokens_per_block * 9 / 10;
    let request = LookupRequest {
        tokens_per_block,
        prompt_tokens,
        local_match_tokens: 0,
        groups: PlannerGroup::of_layout(layout),
        rewind_tokens: 2048,
        window_fallback: true,
        checkpoint_tokens: std::num::NonZeroUsize::new(8192),
        probe_chunk_items: 4096,
    };
    let started = Instant::now();
    let mut lookup = Lookup::new(request)?;
    while let Some(round) = lookup.next_round() {
        let present: Vec<bool> = round
            .items()
            .iter()
            .map(|item| item.block < present_blocks)
            .collect();
        lookup.record(&round, &present)?;
    }
    black_box(lookup.finish());
    Ok(started.elapsed())
}

/// The first error of a batch, if any.
fn first_error<T>(
    results: Vec<Result<T, PoolError>>,
    operation: &'static str,
) -> Result<(), BenchError> {
    match results.into_iter().find_map(Result::err) {
        Some(source) => Err(BenchError::Pool { operation, source }),
        None => Ok(()),
    }
}

/// `pool_put` and `pool_get` on the embedded pool.
#[expect(clippy::cast_precision_loss, reason = "throughput figures")]
fn pool_rows(args: &BenchArgs, min_time: Duration) -> Result<Vec<BenchRow>, BenchError> {
    let keys: Vec<String> = (0..args.objects)
        .map(|i| format!("kvc/bench/w1r0/lg0/t32b{}/{i:032x}", args.page_bytes))
        .collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let page = vec![0x5a_u8; args.page_bytes];
    let values: Vec<&[u8]> = (0..args.objects).map(|_| page.as_slice()).collect();
    let capacity = u64::try_from(
        args.page_bytes
            .saturating_mul(args.objects)
            .saturating_mul(4),
    )
    .unwrap_or(u64::MAX);
    let fresh_pool = || {
        MemoryPool::new(
            EvictionPolicy::mooncake_defaults(capacity),
            Arc::new(ManualClock::new(0)),
        )
        .map_err(|source| BenchError::Pool {
            operation: "create",
            source,
        })
    };
    let put = measure(min_time, || -> Result<Duration, BenchError> {
        let pool = fresh_pool()?;
        let started = Instant::now();
        let results = pool.put(&key_refs, &values);
        let elapsed = started.elapsed();
        first_error(results, "put")?;
        Ok(elapsed)
    })?;
    let pool = fresh_pool()?;
    first_error(pool.put(&key_refs, &values), "put")?;
    let mut buffers: Vec<Vec<u8>> = vec![vec![0_u8; args.page_bytes]; args.objects];
    let get = measure(min_time, || -> Result<Duration, BenchError> {
        let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
        let started = Instant::now();
        let results = pool.get_into(&key_refs, &mut slices);
        let elapsed = started.elapsed();
        first_error(results, "get")?;
        Ok(elapsed)
    })?;
    let bytes = (args.page_bytes * args.objects) as f64 / f64::from(1 << 30);
    let work = format!("{} pages of {} bytes", args.objects, args.page_bytes);
    Ok(vec![
        row("pool_put", work.clone(), put, bytes, "GiB/s"),
        row("pool_get", work, get, bytes, "GiB/s"),
    ])
}

/// Workflow step 3.
fn write_rows(args: &BenchArgs, rows: &[BenchRow], out: &mut dyn Write) -> Result<(), BenchError> {
    if args.json {
        serde_json::to_writer_pretty(&mut *out, rows).map_err(BenchError::Json)?;
        writeln!(out).map_err(BenchError::Write)?;
        return out.flush().map_err(BenchError::Write);
    }
    let mut text = format!(
        "{:<11} {:>6} {:>12} {:>12} {:>16}  {}\n",
        "benchmark", "iters", "median us", "min us", "throughput", "one iteration"
    );
    for row in rows {
        let _ = writeln!(
            text,
            "{:<11} {:>6} {:>12.1} {:>12.1} {:>16}  {}",
            row.name,
            row.iterations,
            row.median_us,
            row.min_us,
            format!("{} {}", human(row.throughput), row.unit),
            row.work
        );
    }
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(BenchError::Write)
}

/// A number with an SI suffix (`1.23 M`).
fn human(value: f64) -> String {
    match value {
        v if v >= 1e9 => format!("{:.2} G", v / 1e9),
        v if v >= 1e6 => format!("{:.2} M", v / 1e6),
        v if v >= 1e3 => format!("{:.2} k", v / 1e3),
        v => format!("{v:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn bench(flags: &[&str]) -> Result<Result<String, BenchError>, Box<dyn std::error::Error>> {
        let cli = Cli::try_parse_from(["kv-connector", "bench"].iter().chain(flags))?;
        let Command::Bench(args) = cli.command else {
            return Err("not the bench subcommand".into());
        };
        let mut out = Vec::new();
        Ok(run(&args, &mut out).map(|()| String::from_utf8_lossy(&out).into_owned()))
    }

    #[test]
    fn every_benchmark_reports_a_row() -> Result<(), Box<dyn std::error::Error>> {
        let small = [
            "--prompt-tokens",
            "4096",
            "--objects",
            "8",
            "--page-bytes",
            "4096",
            "--min-time-ms",
            "1",
        ];
        let json = bench(&[&small[..], &["--json"]].concat())??;
        let rows: serde_json::Value = serde_json::from_str(&json)?;
        let names: Vec<&str> = rows
            .as_array()
            .ok_or("not an array")?
            .iter()
            .filter_map(|row| row["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["hash_chain", "keys", "planner", "pool_put", "pool_get"]
        );
        for row in rows.as_array().ok_or("not an array")? {
            assert!(row["iterations"].as_u64().is_some_and(|n| n >= 3), "{row}");
            assert!(row["throughput"].as_f64().is_some_and(|t| t > 0.0), "{row}");
        }
        let table = bench(&small)??;
        assert!(table.starts_with("benchmark"), "{table}");
        assert_eq!(table.lines().count(), 6, "{table}");
        Ok(())
    }

    #[test]
    fn zero_sizes_are_refused_with_a_working_value() -> Result<(), Box<dyn std::error::Error>> {
        let err = bench(&["--objects", "0"])?.expect_err("zero objects");
        assert_eq!(err.kind(), "zero");
        assert!(err
            .to_string()
            .contains("--objects must be at least 1 (e.g. 512)"));
        Ok(())
    }

    #[test]
    fn human_numbers_use_si_suffixes() {
        assert_eq!(human(1_500_000.0), "1.50 M");
        assert_eq!(human(12.0), "12.00");
        assert_eq!(human(2.5e9), "2.50 G");
    }
}
