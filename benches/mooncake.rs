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
//! Then (under `cargo bench` only) `../shared/reference/mooncake_client_bench.py` runs with the venv's Python against
//! the same master and prints its JSON line (probe ms over 4096 keys, put/get GB/s), the
//! baseline for the transfer figures.
//!
//! Run: `scripts/setup-mooncake && PYO3_PYTHON=.venv/bin/python cargo bench --features
//! mooncake --bench mooncake -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use kv_connector::pool::mooncake::{
    MasterSettings, MooncakeError, MooncakeInstall, MooncakeMaster, MooncakePool, MooncakeSettings,
};
use kv_connector::pool::Pool;

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

/// Runs the Python reference bench against `master` and prints its JSON line.
fn run_python_baseline(install: &MooncakeInstall, master: &MooncakeMaster) {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/mooncake_client_bench.py");
    let output = Command::new(install.venv_dir.join("bin/python"))
        .arg(&script)
        .args([
            "--master",
            &master.master_address(),
            "--metadata",
            &master.metadata_server(),
        ])
        .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        .env("MC_LOG_LEVEL", "WARNING")
        .output();
    match output {
        Ok(output) if output.status.success() => {
            println!(
                "python baseline (mooncake_client_bench.py): {}",
                String::from_utf8_lossy(&output.stdout).trim()
            );
        }
        Ok(output) => println!("python baseline failed with {}", output.status),
        Err(err) => println!("python baseline could not start: {err}"),
    }
}

fn run(criterion: &mut Criterion, install: &MooncakeInstall) -> Result<(), MooncakeError> {
    let master = MooncakeMaster::start(MasterSettings::new(install))?;
    let settings = MooncakeSettings {
        venv_dir: install.venv_dir.clone(),
        global_segment_size_bytes: 2 << 30,
        ..MooncakeSettings::default()
    };
    let pool = MooncakePool::connect(master.client_settings(settings))?;
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
    bench_probes(criterion, &pool, "probe_present", &present_refs);
    let absent = prompt_keys("absent");
    let absent_refs: Vec<&str> = absent.iter().map(String::as_str).collect();
    bench_probes(criterion, &pool, "probe_absent", &absent_refs);
    bench_transfers(criterion, &pool)?;
    // The master places objects in any mounted segment: close this client first, so the
    // baseline's objects stay in its own segment as this client's did.
    pool.close()?;
    // `cargo test --all-targets` runs benches once as a smoke test, without `--bench`.
    if std::env::args().any(|arg| arg == "--bench") {
        run_python_baseline(install, &master);
    }
    Ok(())
}

/// What `criterion_group!` / `criterion_main!` expand to, written out so the master and
/// the client are started once for every group.
fn main() {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv");
    let install = match MooncakeInstall::discover(&venv) {
        Ok(install) => install,
        Err(err) => {
            println!("skipped: {err}");
            return;
        }
    };
    let mut criterion = Criterion::default().sample_size(10).configure_from_args();
    if let Err(err) = run(&mut criterion, &install) {
        println!("mooncake bench failed: {err}");
        std::process::exit(1);
    }
    criterion.final_summary();
}
