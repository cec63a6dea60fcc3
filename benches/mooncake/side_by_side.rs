//! The side-by-side comparisons of `benches/mooncake.rs` (its module docs): arms that
//! alternate, so that load from other processes falls on both alike.

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kv_connector::pool::mooncake::{
    MooncakeError, MooncakeInstall, MooncakeMaster, MooncakePool, MooncakeSettings,
};
use kv_connector::pool::Pool;

use super::{aligned_mut, page_aligned, OBJECTS, OBJECT_BYTES, TRANSFER_ITERS};

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

/// Alternates one batch and chunks of 4096 and 1024 over `keys` and prints their medians,
/// the ratios, and the CPU time per probe of this process and of the master (module docs).
pub(crate) fn probes(pool: &MooncakePool, master: &MooncakeMaster, name: &str, keys: &[&str]) {
    const ROUNDS: u32 = 30;
    const CHUNKS: [usize; 2] = [4096, 1024];
    let master_pid = master.pid().unwrap_or(0);
    let arms = [keys.len(), CHUNKS[0], CHUNKS[1]];
    let mut walls = [Vec::new(), Vec::new(), Vec::new()];
    let mut own_cpu = [Duration::ZERO; 3];
    let mut master_cpu = [Duration::ZERO; 3];
    for _ in 0..ROUNDS {
        for (arm, chunk) in arms.into_iter().enumerate() {
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
    let medians = walls.map(median);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "{name} side by side ({} keys, {ROUNDS} rounds, {cores} cores): one batch {:.1} ms \
         (cpu per probe: this process {:.1} ms, master {:.1} ms)",
        keys.len(),
        medians[0],
        ms(own_cpu[0] / ROUNDS),
        ms(master_cpu[0] / ROUNDS),
    );
    for arm in 1..arms.len() {
        // With this process and the master on the same cores, a chunked probe cannot take
        // less than their CPU time spread over all cores.
        let cpu_floor = ms((own_cpu[arm] + master_cpu[arm]) / ROUNDS)
            / f64::from(u32::try_from(cores).unwrap_or(1));
        println!(
            "  chunks of {} {:.1} ms (this process {:.1} ms, master {:.1} ms, so at least \
             {cpu_floor:.1} ms here); one batch / chunked = {:.2}x (at most {:.2}x here)",
            arms[arm],
            medians[arm],
            ms(own_cpu[arm] / ROUNDS),
            ms(master_cpu[arm] / ROUNDS),
            medians[0] / medians[arm],
            medians[0] / cpu_floor,
        );
    }
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
    let mut target_memory = page_aligned(OBJECTS * OBJECT_BYTES);
    let target = aligned_mut(&mut target_memory, OBJECTS * OBJECT_BYTES);
    let pool = MooncakePool::connect(settings.clone())?;
    pool.register_slice(source)?;
    pool.register_slice(target)?;
    let values: Vec<&[u8]> = source.chunks(OBJECT_BYTES).collect();
    let (mut puts, mut gets) = (Vec::new(), Vec::new());
    for iteration in 0..TRANSFER_ITERS {
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
    reference: &Path,
) -> Option<(f64, f64)> {
    let script = reference.join("mooncake_client_bench.py");
    let output = Command::new(install.venv_dir.join("bin/python"))
        .arg(&script)
        .args(["--master", &master.master_address()])
        .args(["--metadata", &master.metadata_server()])
        .args(["--iters", &TRANSFER_ITERS.to_string()])
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
pub(crate) fn transfers(
    install: &MooncakeInstall,
    master: &MooncakeMaster,
    settings: &MooncakeSettings,
    reference: &Path,
) -> Result<(), MooncakeError> {
    const ROUNDS: usize = 5;
    let mut source_memory = page_aligned(OBJECTS * OBJECT_BYTES);
    let source = aligned_mut(&mut source_memory, OBJECTS * OBJECT_BYTES);
    for (i, byte) in source.iter_mut().enumerate() {
        *byte = (i % 253).to_le_bytes()[0];
    }
    // Per round: our put and get GB/s over the Python client's of the round.
    let (mut put_ratios, mut get_ratios) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (put, get) = pool_reference_round(settings, round, source)?;
        println!("MooncakePool, same calls: put_absent {put:.2} GB/s, get_into {get:.2} GB/s");
        if let Some((python_put, python_get)) = python_reference_round(install, master, reference) {
            put_ratios.push(put / python_put);
            get_ratios.push(get / python_get);
        }
    }
    let range = |ratios: &[f64]| {
        let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let high = ratios.iter().copied().fold(0.0, f64::max);
        format!("{:.0}-{:.0} %", 100.0 * low, 100.0 * high)
    };
    println!(
        "transfers side by side ({} paired rounds, MooncakePool over the Python client): put \
         median {:.0} % (rounds {}), get median {:.0} % (rounds {})",
        put_ratios.len(),
        100.0 * median(put_ratios.clone()),
        range(&put_ratios),
        100.0 * median(get_ratios.clone()),
        range(&get_ratios),
    );
    Ok(())
}
