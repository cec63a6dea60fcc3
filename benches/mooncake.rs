//! Mooncake pool benchmarks on a real `mooncake_master` (loopback TCP, feature `mooncake`).
//!
//! Probes: the keys of a 170k-token prompt (T = 32, 2 layer groups: 10,624 keys), all
//! present, then all absent:
//!
//! - `probe_present/one_batch`: one `batch_is_exist` of every key;
//! - `probe_present/chunked_4096` and `chunked_1024`: chunks of that many keys run
//!   concurrently ([`MooncakePool::probe`], R10);
//! - `probe_absent/...`: the same over keys never stored.
//!
//! Transfers: 256 objects of 256 KiB (64 MiB) per iteration, as the Python reference bench:
//!
//! - `transfer/put_registered`: `Pool::put` (probe + `batch_put_from`) of fresh keys from
//!   a registered buffer (the keys are removed after each timed iteration);
//! - `transfer/put_absent_registered`: `Pool::put_absent` (`batch_put_from` alone, the
//!   saver's call after its skip-present probe: the same calls as the Python bench);
//! - `transfer/get_registered`: `Pool::get_into` into a registered buffer;
//! - `transfer/get_staged`: the same into an unregistered buffer (one extra copy).
//!
//! Conversions (`pyo3_conversion`, no master): the 10,624 probe keys as a Python list of
//! `str` against one of `bytes`, and 10,624 answers read by the generic `Vec<i64>`
//! extraction against a walk of the list (the client's choices, `client.rs`).
//!
//! Then, under `cargo bench` only, two side-by-side comparisons that alternate their arms,
//! so that load from other processes falls on both alike (the figures to quote):
//!
//! - probes: rounds of one batch then chunks of 4096, the median of each, and the CPU
//!   time per probe of this process and of the master (`/proc/<pid>/stat`): what bounds
//!   the chunked time on a small machine;
//! - transfers: rounds of a fresh [`MooncakePool`] doing what
//!   `../shared/reference/mooncake_client_bench.py` does (fresh keys, `put_absent` then
//!   `get_into` of 256 x 256 KiB from registered buffers, the bytes checked, median of 10
//!   iterations, GB/s = 1e9 bytes/s), then that script with the venv's Python against the
//!   same master, after this client closed (the master places objects in any mounted
//!   segment, so both clients find their objects in their own segment).
//!
//! Run: `scripts/setup-mooncake && PYO3_PYTHON=.venv/bin/python cargo bench --features
//! mooncake --bench mooncake -- --warm-up-time 1 --measurement-time 3`.
//!
//! Environment: `KVC_MOONCAKE_VENV_DIR`, the venv with the wheel (default: the
//! repository's `.venv`); `KVC_BENCH_REFERENCE_DIR`, the folder of
//! `mooncake_client_bench.py` (default `../shared/reference`); `KVC_BENCH_STORED_OBJECTS`,
//! objects stored besides the probe keys before the probes run (default 0), to see what a
//! full store does to a probe.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
#[path = "mooncake/side_by_side.rs"]
mod side_by_side;
use kv_connector::config::ConfigSources;
use kv_connector::pool::mooncake::{
    MasterSettings, MooncakeError, MooncakeInstall, MooncakeMaster, MooncakePool, MooncakeSettings,
};
use kv_connector::pool::Pool;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// Blocks of a 170k-token prompt at T = 32.
const BLOCKS: usize = 170_000 / 32;
/// Layer groups keyed per block.
const GROUPS: usize = 2;
/// Objects per transfer iteration.
const OBJECTS: usize = 256;
/// Bytes per object.
const OBJECT_BYTES: usize = 256 << 10;

/// `BLOCKS * GROUPS` pool keys shaped like R3 keys, under `tag`.
fn prompt_keys(tag: &str) -> Vec<String> {
    (0..GROUPS)
        .flat_map(|group| {
            (0..BLOCKS).map(move |block| {
                format!("kvc/bench-{tag}/w1r0/lg{group}/t32b{OBJECT_BYTES}/{block:032x}")
            })
        })
        .collect()
}

/// Iterations per side-by-side transfer round, for both clients (the median is kept).
const TRANSFER_ITERS: usize = 10;

/// Page size; staging memory of loaders and savers is page aligned (pinned host memory).
const PAGE: usize = 4096;

/// `len` bytes plus room to start on a page.
fn page_aligned(len: usize) -> Vec<u8> {
    vec![0u8; len + PAGE]
}

/// The page-aligned `len` bytes of `memory` (from [`page_aligned`]).
fn aligned_mut(memory: &mut [u8], len: usize) -> &mut [u8] {
    let start = memory.as_ptr().align_offset(PAGE).min(PAGE);
    &mut memory[start..start + len]
}

fn bench_probes(criterion: &mut Criterion, pool: &MooncakePool, name: &str, keys: &[&str]) {
    let mut group = criterion.benchmark_group(name);
    group.throughput(Throughput::Elements(keys.len() as u64));
    group.bench_function("one_batch", |bench| {
        bench.iter(|| black_box(pool.probe(keys, keys.len())));
    });
    for chunk in [4096, 1024] {
        group.bench_function(format!("chunked_{chunk}"), |bench| {
            bench.iter(|| black_box(pool.probe(keys, chunk)));
        });
    }
    group.finish();
}

fn bench_transfers(criterion: &mut Criterion, pool: &MooncakePool) -> Result<(), MooncakeError> {
    let mut source_memory = page_aligned(OBJECTS * OBJECT_BYTES);
    let source = aligned_mut(&mut source_memory, OBJECTS * OBJECT_BYTES);
    for (i, byte) in source.iter_mut().enumerate() {
        *byte = (i % 251).to_le_bytes()[0];
    }
    let source: &[u8] = source;
    let mut registered_memory = page_aligned(OBJECTS * OBJECT_BYTES);
    let registered = aligned_mut(&mut registered_memory, OBJECTS * OBJECT_BYTES);
    let mut unregistered_memory = page_aligned(OBJECTS * OBJECT_BYTES);
    let unregistered = aligned_mut(&mut unregistered_memory, OBJECTS * OBJECT_BYTES);
    pool.register_slice(source)?;
    pool.register_slice(registered)?;
    let values: Vec<&[u8]> = source.chunks(OBJECT_BYTES).collect();
    let mut group = criterion.benchmark_group("transfer");
    group.throughput(Throughput::Bytes((OBJECTS * OBJECT_BYTES) as u64));
    let mut round = 0usize;
    for (name, absent) in [("put_registered", false), ("put_absent_registered", true)] {
        group.bench_function(name, |bench| {
            bench.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    round += 1;
                    let keys: Vec<String> =
                        (0..OBJECTS).map(|i| format!("put/{round}/{i}")).collect();
                    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    let started = Instant::now();
                    let results = if absent {
                        pool.put_absent(&key_refs, &values)
                    } else {
                        pool.put(&key_refs, &values)
                    };
                    spent += started.elapsed();
                    assert!(
                        results.iter().all(Result::is_ok),
                        "put failed: {:?}",
                        &results[..2]
                    );
                    pool.remove(&key_refs);
                }
                spent
            });
        });
    }
    let keys: Vec<String> = (0..OBJECTS).map(|i| format!("get/{i}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert!(pool.put(&key_refs, &values).iter().all(Result::is_ok));
    for (name, buffer) in [("get_registered", registered), ("get_staged", unregistered)] {
        group.bench_function(name, |bench| {
            bench.iter(|| {
                let mut slots: Vec<&mut [u8]> = buffer.chunks_mut(OBJECT_BYTES).collect();
                black_box(pool.get_into(&key_refs, &mut slots))
            });
        });
        assert!(
            &*buffer == source,
            "{name}: read bytes differ from the written ones"
        );
    }
    group.finish();
    Ok(())
}

/// The criterion group `pyo3_conversion` (module docs).
fn bench_conversions(criterion: &mut Criterion, keys: &[&str]) {
    let mut group = criterion.benchmark_group("pyo3_conversion");
    group.throughput(Throughput::Elements(keys.len() as u64));
    kv_connector::pool::mooncake::ensure_interpreter();
    Python::attach(|py| {
        group.bench_function("keys_as_str", |bench| {
            bench.iter(|| black_box(PyList::new(py, keys).map(|list| list.len())));
        });
        group.bench_function("keys_as_bytes", |bench| {
            bench.iter(|| {
                let items = keys.iter().map(|key| PyBytes::new(py, key.as_bytes()));
                black_box(PyList::new(py, items).map(|list| list.len()))
            });
        });
        let codes: Vec<i64> = (0..keys.len()).map(|i| i64::from(i % 2 == 0)).collect();
        if let Ok(list) = PyList::new(py, &codes) {
            group.bench_function("answers_extract_vec", |bench| {
                bench.iter(|| black_box(list.extract::<Vec<i64>>()));
            });
            group.bench_function("answers_walk_list", |bench| {
                bench.iter(|| {
                    black_box(
                        list.iter()
                            .map(|code| code.extract::<i64>())
                            .collect::<PyResult<Vec<i64>>>(),
                    )
                });
            });
        }
    });
    group.finish();
}

fn run(
    criterion: &mut Criterion,
    install: &MooncakeInstall,
    env: &BenchEnv,
    reference: &Path,
) -> Result<(), MooncakeError> {
    let master = MooncakeMaster::start(MasterSettings::new(install))?;
    let settings = master.client_settings(MooncakeSettings {
        venv_dir: install.venv_dir.clone(),
        global_segment_size_bytes: 2 << 30,
        ..MooncakeSettings::default()
    });
    let pool = MooncakePool::connect(settings.clone())?;
    let present = prompt_keys("present");
    let present_refs: Vec<&str> = present.iter().map(String::as_str).collect();
    let tiny = vec![0u8; 64];
    pool.register_slice(&tiny)?;
    let values = vec![tiny.as_slice(); present_refs.len()];
    let stored = pool
        .put(&present_refs, &values)
        .iter()
        .filter(|r| r.is_ok())
        .count();
    assert_eq!(stored, present_refs.len(), "seeding the probe keys failed");
    let filler = env.stored_objects();
    if filler > 0 {
        let keys: Vec<String> = (0..filler)
            .map(|i| format!("kvc/bench-filler/{i:032x}"))
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = vec![tiny.as_slice(); refs.len()];
        let stored = pool
            .put(&refs, &values)
            .iter()
            .filter(|r| r.is_ok())
            .count();
        assert_eq!(stored, filler, "storing the filler objects failed");
        println!("the store holds {filler} objects besides the probe keys");
    }
    bench_probes(criterion, &pool, "probe_present", &present_refs);
    let absent = prompt_keys("absent");
    let absent_refs: Vec<&str> = absent.iter().map(String::as_str).collect();
    bench_probes(criterion, &pool, "probe_absent", &absent_refs);
    bench_conversions(criterion, &present_refs);
    bench_transfers(criterion, &pool)?;
    // `cargo test --all-targets` runs benches once as a smoke test, without `--bench`.
    let full_run = std::env::args().any(|arg| arg == "--bench");
    if full_run {
        side_by_side::probes(&pool, &master, "probe_present", &present_refs);
        side_by_side::probes(&pool, &master, "probe_absent", &absent_refs);
    }
    pool.close()?;
    if full_run {
        side_by_side::transfers(install, &master, &settings, reference)?;
    }
    Ok(())
}

/// What `criterion_group!` / `criterion_main!` expand to, written out so the master and
/// the client are started once for every group.
/// The bench's environment variables (module docs), read through the one reader of the
/// process environment.
struct BenchEnv(HashMap<String, String>);

impl BenchEnv {
    fn read() -> Self {
        Self(ConfigSources::from_process_env().env)
    }

    /// A folder from `name`, else `default`.
    fn folder(&self, name: &str, default: PathBuf) -> PathBuf {
        self.0.get(name).map_or(default, PathBuf::from)
    }

    /// `KVC_BENCH_STORED_OBJECTS`, 0 when unset.
    fn stored_objects(&self) -> usize {
        self.0
            .get("KVC_BENCH_STORED_OBJECTS")
            .and_then(|count| count.parse().ok())
            .unwrap_or(0)
    }
}

fn main() {
    let env = BenchEnv::read();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = env.folder("KVC_MOONCAKE_VENV_DIR", manifest.join(".venv"));
    let reference = env.folder(
        "KVC_BENCH_REFERENCE_DIR",
        manifest.join("../shared/reference"),
    );
    let install = match MooncakeInstall::discover(&venv) {
        Ok(install) => install,
        Err(err) => {
            println!("skipped: {err}");
            return;
        }
    };
    let mut criterion = Criterion::default().sample_size(10).configure_from_args();
    if let Err(err) = run(&mut criterion, &install, &env, &reference) {
        println!("mooncake bench failed: {err}");
        std::process::exit(1);
    }
    criterion.final_summary();
}
