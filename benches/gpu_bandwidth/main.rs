//! Host <-> GPU bandwidth of the CUDA backend, raw and through the connector's transfer
//! procedures, measured in one run so the ratios compare like with like.
//!
//! Rows (each phase runs for a fixed time; GB/s are 10^9 bytes of page payload per second):
//! 1. raw H2D / raw D2H: 1 GiB of pinned staging in 64 MiB slots, scattered to / gathered
//!    from 64 MiB device pages in reverse order, so every copy is one 64 MiB
//!    `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` (16 per submission, one event after them).
//! 2. raw both: the two at once, on separate streams and threads.
//! 3. CPU parts of the pool path, no device copy: a page `memcpy` into pinned staging, an
//!    xxh3-64 checksum of a page, `MemoryPool::get_into` into pinned staging plus the
//!    header and checksum check (`object::open`: the CPU ceiling of the load path), and
//!    `object::seal` plus `MemoryPool::put` (the CPU ceiling of the save path).
//! 4. load path: `connector::transfer::load_pages` (pool get into staging, verify, scatter,
//!    wait) with N loaders, each with its own stream and staging, gpt-oss-120b pages
//!    (18 layers x 64 KiB = 1.125 MiB), requests of 64 pages.
//! 5. save path: `connector::transfer::save_pages` (probe, gather, wait, seal, pool put)
//!    with N savers, fresh keys, into a pool kept full so eviction recycles memory.
//! 6. loads and saves overlapped: both at once.
//! 7. zero-copy transport: the same `load_pages` / `save_pages` over a stand-in pool that
//!    moves no bytes with the CPU, as a transport whose NIC reads and writes registered
//!    staging would (Mooncake's RDMA transfer engine). What is left is the connector's own
//!    work: verify + scatter for loads, gather + seal for saves.
//!
//! Run: `cargo bench --features cuda --bench gpu_bandwidth` (or the built binary with
//! `--quick` for 0.3 s phases). Needs a CUDA driver and device 0.

use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::core::hash::BlockHash;
use kv_connector::core::keys::Shard;
use kv_connector::core::layout::{GroupId, LayoutFingerprint};
use kv_connector::core::object::ObjectIdentity;
use kv_connector::gpu::{CopyDirection, Device, PageCopy, PagePoolSpec};
use kv_connector::pool::{MemoryPool, SystemClock};

mod workers;
mod zero_copy;

use workers::{
    cpu_checksum, cpu_copy, fill_load_set, overlapped, run_getters, run_loaders, run_putters,
    run_savers,
};
use zero_copy::zero_copy_rows;

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

const MIB: usize = 1 << 20;
const RAW_COPY: usize = 64 * MIB;
const RAW_COPIES: u32 = 16;
/// gpt-oss-120b page: 18 layers x K,V x 8 heads x 64 x bf16 x 32 tokens.
const PAGE: usize = 18 * 2 * 8 * 64 * 2 * 32;
const REQUEST_PAGES: u32 = 64;
const LOAD_SET: u32 = 1024;
const SOURCE_PAGES: u32 = 512;
const MAX_WORKERS: u32 = 16;

const RAW_H2D: GroupId = GroupId(0);
const RAW_D2H: GroupId = GroupId(1);
const LOAD_DST: GroupId = GroupId(2);
const SAVE_SRC: GroupId = GroupId(3);

fn main() -> BenchResult<()> {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let phase = Duration::from_millis(if quick { 300 } else { 1000 });
    let spec = |group, page_bytes, num_pages| PagePoolSpec {
        group,
        page_bytes,
        num_pages,
    };
    let device = Device::open_cuda(
        0,
        &[
            spec(RAW_H2D, RAW_COPY, RAW_COPIES),
            spec(RAW_D2H, RAW_COPY, RAW_COPIES),
            spec(LOAD_DST, PAGE, MAX_WORKERS * REQUEST_PAGES),
            spec(SAVE_SRC, PAGE, SOURCE_PAGES),
        ],
    )?;
    let threads = thread::available_parallelism().map_or(0, usize::from);
    println!("# gpu_bandwidth: device {device:?}, {threads} cpus, phase {phase:?}");
    println!("# page {PAGE} B (gpt-oss-120b), request {REQUEST_PAGES} pages, raw copies {RAW_COPIES} x {} MiB", RAW_COPY / MIB);
    println!();
    println!("| path | workers | GB/s | % of raw same direction |");
    println!("| --- | ---: | ---: | ---: |");
    let raw = raw_rows(&device, phase)?;

    for page in 0..SOURCE_PAGES {
        device.write_page(SAVE_SRC, page, &pattern(page))?;
    }
    let pools = Pools {
        load: Arc::new(pool(2 << 30)?),
        save: Arc::new(pool(4 << 30)?),
        counter: Arc::new(AtomicU64::new(0)),
    };
    fill_load_set(&device, &pools.load)?;
    // Fill the save pool past capacity once, so measured puts recycle evicted memory.
    let fill = Duration::from_secs(if quick { 1 } else { 3 });
    run_savers(&device, &pools.save, &pools.counter, 4, fill)?;

    cpu_rows(&device, &raw, phase)?;
    load_rows(&device, &pools, &raw, phase)?;
    save_rows(&device, &pools, &raw, phase)?;
    for (loaders, savers) in [(8, 4), (8, 8)] {
        let (load, save) = overlapped(&device, &pools, loaders, savers, phase)?;
        row("overlapped: load path", loaders, load, raw.both[0]);
        row("overlapped: save path", savers, save, raw.both[1]);
    }
    zero_copy_rows(&device, &raw, phase)?;
    println!();
    println!("# overlapped rows compare with the raw both-at-once rows");
    Ok(())
}

/// Raw copy rates in bytes/s: each direction alone, then both at once.
struct Raw {
    h2d: f64,
    d2h: f64,
    both: Vec<f64>,
}

/// The pools of the connector rows and the source of fresh save keys.
struct Pools {
    load: Arc<MemoryPool>,
    save: Arc<MemoryPool>,
    counter: Arc<AtomicU64>,
}

fn raw_rows(device: &Device, phase: Duration) -> BenchResult<Raw> {
    let h2d = raw(device, &[CopyDirection::HostToDevice], phase)?[0];
    row("raw H2D (64 MiB cuMemcpyHtoDAsync)", 1, h2d, h2d);
    let d2h = raw(device, &[CopyDirection::DeviceToHost], phase)?[0];
    row("raw D2H (64 MiB cuMemcpyDtoHAsync)", 1, d2h, d2h);
    let directions = [CopyDirection::HostToDevice, CopyDirection::DeviceToHost];
    let both = raw(device, &directions, phase)?;
    row("raw both at once: H2D", 1, both[0], h2d);
    row("raw both at once: D2H", 1, both[1], d2h);
    Ok(Raw { h2d, d2h, both })
}

fn cpu_rows(device: &Device, raw: &Raw, phase: Duration) -> BenchResult<()> {
    for workers in [1, 12] {
        let rate = cpu_copy(device, workers, true, phase)?;
        row("cpu: memcpy page -> pinned staging", workers, rate, raw.h2d);
        let rate = cpu_copy(device, workers, false, phase)?;
        row("cpu: memcpy page -> heap buffer", workers, rate, raw.h2d);
    }
    for workers in [1, 12] {
        let rate = cpu_checksum(device, workers, phase)?;
        row("cpu: xxh3-64 checksum of a page", workers, rate, raw.h2d);
    }
    Ok(())
}

fn load_rows(device: &Device, pools: &Pools, raw: &Raw, phase: Duration) -> BenchResult<()> {
    for workers in [1, 4, 8, 12] {
        let rate = run_getters(device, &pools.load, workers, phase)?;
        row(
            "pool get + verify only (no device copy)",
            workers,
            rate,
            raw.h2d,
        );
    }
    for workers in [1, 4, 8, 12, 16] {
        let rate = run_loaders(device, &pools.load, workers, phase)?;
        row(
            "load path (get -> staging -> scatter)",
            workers,
            rate,
            raw.h2d,
        );
    }
    Ok(())
}

fn save_rows(device: &Device, pools: &Pools, raw: &Raw, phase: Duration) -> BenchResult<()> {
    for workers in [1, 4, 8, 12] {
        let rate = run_putters(device, &pools.save, &pools.counter, workers, phase)?;
        row(
            "seal + pool put only (no device copy)",
            workers,
            rate,
            raw.d2h,
        );
    }
    for workers in [1, 4, 8, 12] {
        let rate = run_savers(device, &pools.save, &pools.counter, workers, phase)?;
        row("save path (gather -> seal -> put)", workers, rate, raw.d2h);
    }
    Ok(())
}

fn row(path: &str, workers: u32, rate: f64, reference: f64) {
    println!(
        "| {path} | {workers} | {:.1} | {:.0} % |",
        rate / 1e9,
        100.0 * rate / reference
    );
}

#[expect(
    clippy::cast_precision_loss,
    reason = "byte counts stay far below 2^52"
)]
fn per_second(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64()
}

fn pool(capacity_bytes: u64) -> BenchResult<MemoryPool> {
    Ok(MemoryPool::new(
        EvictionPolicy::mooncake_defaults(capacity_bytes),
        Arc::new(SystemClock::new()),
    )?)
}

fn pattern(page: u32) -> Vec<u8> {
    (0..PAGE as u64)
        .map(|i| {
            ((i ^ (u64::from(page) * 0x9e37_79b9)).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

fn identity(group: GroupId, block: u64) -> ObjectIdentity {
    let mut hash = [0; 16];
    hash[..8].copy_from_slice(&block.to_le_bytes());
    ObjectIdentity {
        layout_fingerprint: LayoutFingerprint(120),
        chain_hash: BlockHash(hash),
        group,
        shard: Shard::Rank { world: 1, rank: 0 },
    }
}

/// Raw copies in each of `directions` at once, one thread and stream each; bytes/s each.
fn raw(device: &Device, directions: &[CopyDirection], phase: Duration) -> BenchResult<Vec<f64>> {
    let start = Arc::new(Barrier::new(directions.len()));
    let workers: Vec<_> = directions
        .iter()
        .map(|&direction| {
            let (device, start) = (device.clone(), Arc::clone(&start));
            thread::spawn(move || -> BenchResult<f64> {
                let mut stream = device.stream()?;
                let mut staging = device.staging_pool(RAW_COPY, RAW_COPIES)?;
                let group = if direction == CopyDirection::HostToDevice {
                    RAW_H2D
                } else {
                    RAW_D2H
                };
                // Slot s to page 15 - s: neighbours never coalesce, so each copy is 64 MiB.
                let copies: Vec<PageCopy> = (0..RAW_COPIES)
                    .map(|s| PageCopy {
                        group,
                        page: RAW_COPIES - 1 - s,
                        staging_slot: s,
                        staging_offset: 0,
                        len: RAW_COPY,
                    })
                    .collect();
                let submit =
                    |stream: &mut kv_connector::gpu::CopyStream, staging| -> BenchResult<_> {
                        let in_flight = match direction {
                            CopyDirection::HostToDevice => stream.scatter(staging, &copies),
                            CopyDirection::DeviceToHost => stream.gather(staging, &copies),
                        }
                        .map_err(|refused| refused.error)?;
                        let (staging, outcome) = in_flight.wait();
                        outcome?;
                        Ok(staging)
                    };
                let warmed = submit(&mut stream, staging); // warm-up
                start.wait(); // reached even on failure, so no other thread hangs
                staging = warmed?;
                let (began, mut bytes) = (Instant::now(), 0_u64);
                while began.elapsed() < phase {
                    staging = submit(&mut stream, staging)?;
                    bytes += u64::from(RAW_COPIES) * RAW_COPY as u64;
                }
                Ok(per_second(bytes, began.elapsed()))
            })
        })
        .collect();
    workers
        .into_iter()
        .map(|w| w.join().map_err(|_| "raw worker panicked")?)
        .collect()
}

/// Runs `work(worker, round)` on `workers` threads until `stop`; returns payload bytes/s.
fn timed<F>(workers: u32, phase: Duration, stop: &Arc<AtomicBool>, make: F) -> BenchResult<f64>
where
    F: Fn(u32) -> BenchResult<Box<dyn FnMut(u64) -> BenchResult<u64> + Send>>,
{
    let start = Arc::new(Barrier::new(workers as usize + 1));
    let handles: Vec<_> = (0..workers)
        .map(|worker| {
            let mut work = make(worker)?;
            let (start, stop) = (Arc::clone(&start), Arc::clone(stop));
            Ok(thread::spawn(move || -> BenchResult<u64> {
                let warmed = work(0); // warm-up, not counted
                start.wait(); // reached even on failure, so the other threads go on
                warmed?;
                let mut bytes = 0;
                let mut round = 1;
                while !stop.load(Ordering::Relaxed) {
                    bytes += work(round)?;
                    round += 1;
                }
                Ok(bytes)
            }))
        })
        .collect::<BenchResult<_>>()?;
    start.wait();
    let began = Instant::now();
    thread::sleep(phase);
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for handle in handles {
        total += handle.join().map_err(|_| "worker panicked")??;
    }
    Ok(per_second(total, began.elapsed()))
}
