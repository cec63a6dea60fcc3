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
//!   `get_into` of 256 x 256 KiB from registered buffers, the bytes checked, median of 5
//!   iterations, GB/s = 1e9 bytes/s), then that script with the venv's Python against the
//!   same master, after this client closed (the master places objects in any mounted
//!   segment, so both clients find their objects in their own segment).
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

/// The median of `values` (0 for none).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Milliseconds of `duration`.
fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// CPU time of process `pid` so far, from `/proc/<pid>/stat` (utime + stime, in the
/// kernel's fixed 100 Hz user ticks); `None` off Linux or once it exited.
fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Alternates one batch and chunks of 4096 over `keys` and prints their medians, the
/// ratio, and the CPU time per probe of this process and of the master (module docs).
fn probe_side_by_side(pool: &MooncakePool, master: &MooncakeMaster, name: &str, keys: &[&str]) {
    const ROUNDS: u32 = 30;
    let master_pid = master.pid().unwrap_or(0);
    let mut walls = [Vec::new(), Vec::new()];
    let mut own_cpu = [Duration::ZERO; 2];
    let mut master_cpu = [Duration::ZERO; 2];
    for _ in 0..ROUNDS {
        for (arm, chunk) in [keys.len(), 4096].into_iter().enumerate() {
            let (own, other) = (cpu_time::ProcessTime::now(), process_cpu(master_pid));
            let started = Instant::now();
            black_box(pool.probe(keys, chunk));
            walls[arm].push(ms(started.elapsed()));
            own_cpu[arm] += own.elapsed();
            master_cpu[arm] += process_cpu(master_pid)
                .zip(other)
                .map_or(Duration::ZERO, |(after, before)| {
                    after.saturating_sub(before)
                });
        }
    }
    let [one, chunked] = walls.map(median);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "{name} side by side ({} keys, {ROUNDS} rounds, {cores} cores): one batch {one:.1} ms \
         (cpu per probe: this process {:.1} ms, master {:.1} ms); chunks of 4096 {chunked:.1} ms \
         (this process {:.1} ms, master {:.1} ms); one batch / chunked = {:.2}x",
        keys.len(),
        ms(own_cpu[0] / ROUNDS),
        ms(master_cpu[0] / ROUNDS),
        ms(own_cpu[1] / ROUNDS),
        ms(master_cpu[1] / ROUNDS),
        one / chunked,
    );
}

/// GB/s (1e9 bytes per second) of moving the transfer batch in `elapsed`.
fn gbps(elapsed: Duration) -> f64 {
    let bytes = u32::try_from(OBJECTS * OBJECT_BYTES).map_or(f64::MAX, f64::from);
    bytes / elapsed.as_secs_f64() / 1e9
}

/// What the Python reference does, through a fresh pool and into fresh memory (as the
/// script's: its pages are first touched by the first get): median put and get GB/s.
fn pool_reference_round(
    settings: &MooncakeSettings,
    round: usize,
    source: &[u8],
) -> Result<(f64, f64), MooncakeError> {
    const ITERS: usize = 5;
    let mut target_memory = page_aligned(OBJECTS * OBJECT_BYTES);
    let target = aligned_mut(&mut target_memory, OBJECTS * OBJECT_BYTES);
    let pool = MooncakePool::connect(settings.clone())?;
    pool.register_slice(source)?;
    pool.register_slice(target)?;
    let values: Vec<&[u8]> = source.chunks(OBJECT_BYTES).collect();
    let (mut puts, mut gets) = (Vec::new(), Vec::new());
    for iteration in 0..ITERS {
        let keys: Vec<String> = (0..OBJECTS)
            .map(|i| format!("side/{round}/{iteration}/{i}"))
            .collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        if iteration > 0 {
            target.fill(0); // so that every get is checked, not only the first
        }
        let started = Instant::now();
        let stored = pool.put_absent(&key_refs, &values);
        puts.push(gbps(started.elapsed()));
        assert!(
            stored.iter().all(Result::is_ok),
            "put failed: {:?}",
            &stored[..2]
        );
        let mut slots: Vec<&mut [u8]> = target.chunks_mut(OBJECT_BYTES).collect();
        let started = Instant::now();
        let read = pool.get_into(&key_refs, &mut slots);
        gets.push(gbps(started.elapsed()));
        assert!(read.iter().all(|r| *r == Ok(OBJECT_BYTES)), "get failed");
        assert!(
            &*target == source,
            "read bytes differ from the written ones"
        );
        pool.remove(&key_refs);
    }
    pool.close()?;
    Ok((median(puts), median(gets)))
}

/// Runs the Python reference bench against `master`: its put and get GB/s.
fn python_reference_round(
    install: &MooncakeInstall,
    master: &MooncakeMaster,
) -> Option<(f64, f64)> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/mooncake_client_bench.py");
    let output = Command::new(install.venv_dir.join("bin/python"))
        .arg(&script)
        .args(["--master", &master.master_address()])
        .args(["--metadata", &master.metadata_server()])
        .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        .env("MC_LOG_LEVEL", "WARNING")
        .output();
    let output = match output {
        Ok(output) if output.status.success() => output.stdout,
        Ok(output) => {
            println!("python reference failed with {}", output.status);
            return None;
        }
        Err(err) => {
            println!("python reference could not start: {err}");
            return None;
        }
    };
    let line = String::from_utf8_lossy(&output);
    println!(
        "python reference (mooncake_client_bench.py): {}",
        line.trim()
    );
    let json: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    Some((json["put_gbps"].as_f64()?, json["get_gbps"].as_f64()?))
}

/// Alternates [`pool_reference_round`] and [`python_reference_round`] and prints both.
fn transfer_side_by_side(
    install: &MooncakeInstall,
    master: &MooncakeMaster,
    settings: &MooncakeSettings,
) -> Result<(), MooncakeError> {
    const ROUNDS: usize = 3;
    let mut source_memory = page_aligned(OBJECTS * OBJECT_BYTES);
    let source = aligned_mut(&mut source_memory, OBJECTS * OBJECT_BYTES);
    for (i, byte) in source.iter_mut().enumerate() {
        *byte = (i % 253).to_le_bytes()[0];
    }
    let (mut ours, mut python) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for round in 0..ROUNDS {
        let (put, get) = pool_reference_round(settings, round, source)?;
        println!("MooncakePool, same calls: put_absent {put:.2} GB/s, get_into {get:.2} GB/s");
        ours[0].push(put);
        ours[1].push(get);
        if let Some((put, get)) = python_reference_round(install, master) {
            python[0].push(put);
            python[1].push(get);
        }
    }
    let [our_put, our_get] = ours.map(median);
    let [python_put, python_get] = python.map(median);
    println!(
        "transfers side by side ({ROUNDS} alternating rounds, medians): put {our_put:.2} against \
         python {python_put:.2} GB/s ({:.0} %), get {our_get:.2} against {python_get:.2} GB/s ({:.0} %)",
        100.0 * our_put / python_put,
        100.0 * our_get / python_get,
    );
    Ok(())
}

fn run(criterion: &mut Criterion, install: &MooncakeInstall) -> Result<(), MooncakeError> {
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
    bench_probes(criterion, &pool, "probe_present", &present_refs);
    let absent = prompt_keys("absent");
    let absent_refs: Vec<&str> = absent.iter().map(String::as_str).collect();
    bench_probes(criterion, &pool, "probe_absent", &absent_refs);
    bench_conversions(criterion, &present_refs);
    bench_transfers(criterion, &pool)?;
    // `cargo test --all-targets` runs benches once as a smoke test, without `--bench`.
    let full_run = std::env::args().any(|arg| arg == "--bench");
    if full_run {
        probe_side_by_side(&pool, &master, "probe_present", &present_refs);
        probe_side_by_side(&pool, &master, "probe_absent", &absent_refs);
    }
    pool.close()?;
    if full_run {
        transfer_side_by_side(install, &master, &settings)?;
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
