//! Host <-> GPU bandwidth of the CUDA backend, raw and through the connector's transfer
//! procedures, measured in one run so the ratios compare like with like.
//!
//! Rows (each phase runs for a fixed time; GB/s are 10^9 bytes of page payload per second):
//! 1. raw H2D / raw D2H: 1 GiB of pinned staging in 64 MiB slots, scattered to / gathered
//!    from 64 MiB device pages in reverse order, so every copy is one 64 MiB
//!    `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` (16 per submission, one event after them).
//! 2. raw both: the two at once, on separate streams and threads.
//! 3. pool get only: `MemoryPool::get_into` into pinned staging plus the header and
//!    checksum check (`object::open`), no device copy: the CPU ceiling of the load path.
//! 4. load path: `connector::transfer::load_pages` (pool get into staging, verify, scatter,
//!    wait) with N loaders, each with its own stream and staging, gpt-oss-120b pages
//!    (18 layers x 64 KiB = 1.125 MiB), requests of 64 pages.
//! 5. save path: `connector::transfer::save_pages` (probe, gather, wait, seal, pool put)
//!    with N savers, fresh keys, into a pool kept full so eviction recycles memory.
//! 6. loads and saves overlapped: both at once.
//!
//! Run: `cargo bench --features cuda --bench gpu_bandwidth` (or the built binary with
//! `--quick` for 0.3 s phases). Needs a CUDA driver and device 0.

use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use kv_connector::connector::transfer::{load_pages, save_pages, LoadItem, SaveItem, SaveResult};
use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::core::hash::BlockHash;
use kv_connector::core::keys::Shard;
use kv_connector::core::layout::{GroupId, LayoutFingerprint};
use kv_connector::core::object::{self, ObjectIdentity, HEADER_BYTES};
use kv_connector::gpu::{CopyDirection, Device, PageCopy, PagePoolSpec};
use kv_connector::pool::{MemoryPool, Pool, SystemClock};

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

const MIB: usize = 1 << 20;
const RAW_COPY: usize = 64 * MIB;
const RAW_COPIES: u32 = 16;
/// gpt-oss-120b page: 18 layers x K,V x 8 heads x 64 x bf16 x 32 tokens.
const PAGE: usize = 18 * 2 * 8 * 64 * 2 * 32;
const REQUEST_PAGES: u32 = 64;
const LOAD_SET: u32 = 1024;
const SOURCE_PAGES: u32 = 512;
const MAX_WORKERS: u32 = 12;

const RAW_H2D: GroupId = GroupId(0);
const RAW_D2H: GroupId = GroupId(1);
const LOAD_DST: GroupId = GroupId(2);
const SAVE_SRC: GroupId = GroupId(3);

fn main() -> BenchResult<()> {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let phase = Duration::from_millis(if quick { 300 } else { 1000 });
    let device = Device::open_cuda(
        0,
        &[
            PagePoolSpec {
                group: RAW_H2D,
                page_bytes: RAW_COPY,
                num_pages: RAW_COPIES,
            },
            PagePoolSpec {
                group: RAW_D2H,
                page_bytes: RAW_COPY,
                num_pages: RAW_COPIES,
            },
            PagePoolSpec {
                group: LOAD_DST,
                page_bytes: PAGE,
                num_pages: MAX_WORKERS * REQUEST_PAGES,
            },
            PagePoolSpec {
                group: SAVE_SRC,
                page_bytes: PAGE,
                num_pages: SOURCE_PAGES,
            },
        ],
    )?;
    let threads = thread::available_parallelism().map_or(0, usize::from);
    println!("# gpu_bandwidth: device {device:?}, {threads} cpus, phase {phase:?}");
    println!("# page {PAGE} B (gpt-oss-120b), request {REQUEST_PAGES} pages, raw copies {RAW_COPIES} x {} MiB", RAW_COPY / MIB);
    println!();
    println!("| path | workers | GB/s | % of raw same direction |");
    println!("| --- | ---: | ---: | ---: |");

    let raw_h2d = raw(&device, &[CopyDirection::HostToDevice], phase)?[0];
    row("raw H2D (64 MiB cuMemcpyHtoDAsync)", 1, raw_h2d, raw_h2d);
    let raw_d2h = raw(&device, &[CopyDirection::DeviceToHost], phase)?[0];
    row("raw D2H (64 MiB cuMemcpyDtoHAsync)", 1, raw_d2h, raw_d2h);
    let both = raw(
        &device,
        &[CopyDirection::HostToDevice, CopyDirection::DeviceToHost],
        phase,
    )?;
    row("raw both at once: H2D", 1, both[0], raw_h2d);
    row("raw both at once: D2H", 1, both[1], raw_d2h);

    for page in 0..SOURCE_PAGES {
        device.write_page(SAVE_SRC, page, &pattern(page))?;
    }
    let load_pool = Arc::new(pool(2 << 30)?);
    fill_load_set(&device, &load_pool)?;
    let save_pool = Arc::new(pool(4 << 30)?);
    // Fill the save pool past capacity once, so measured puts recycle evicted memory.
    let counter = Arc::new(AtomicU64::new(0));
    run_savers(
        &device,
        &save_pool,
        &counter,
        4,
        Duration::from_secs(if quick { 1 } else { 3 }),
    )?;

    for workers in [1, 2, 4, 8, 12] {
        let rate = run_getters(&device, &load_pool, workers, phase)?;
        row(
            "pool get + verify only (no device copy)",
            workers,
            rate,
            raw_h2d,
        );
    }
    for workers in [1, 2, 4, 8, 12] {
        let rate = run_loaders(&device, &load_pool, workers, phase)?;
        row(
            "load path (get -> staging -> scatter)",
            workers,
            rate,
            raw_h2d,
        );
    }
    for workers in [1, 2, 4, 8] {
        let rate = run_savers(&device, &save_pool, &counter, workers, phase)?;
        row("save path (gather -> seal -> put)", workers, rate, raw_d2h);
    }
    for (loaders, savers) in [(4, 2), (8, 4)] {
        let (load, save) = overlapped(
            &device, &load_pool, &save_pool, &counter, loaders, savers, phase,
        )?;
        row("overlapped: load path", loaders, load, both[0]);
        row("overlapped: save path", savers, save, both[1]);
    }
    println!();
    println!("# overlapped rows compare with the raw both-at-once rows");
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

/// Saves the load set (`LOAD_SET` objects from the source pages) into `pool`.
fn fill_load_set(device: &Device, pool: &MemoryPool) -> BenchResult<()> {
    let mut stream = device.stream()?;
    let mut staging = device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?;
    let items: Vec<SaveItem> = (0..LOAD_SET)
        .map(|block| SaveItem {
            key: format!("load/{block}"),
            identity: identity(LOAD_DST, u64::from(block)),
            page: block % SOURCE_PAGES,
            payload_len: PAGE,
        })
        .collect();
    let results;
    (staging, results) = save_pages(pool, &mut stream, staging, &items);
    drop(staging);
    if results.iter().any(|r| *r != SaveResult::Stored) {
        return Err("filling the load set failed".into());
    }
    Ok(())
}

fn load_request(worker: u32, round: u64) -> Vec<LoadItem> {
    let first = (u64::from(worker) * 131 + round * u64::from(REQUEST_PAGES)) % u64::from(LOAD_SET);
    (0..REQUEST_PAGES)
        .map(|i| {
            let block = (first + u64::from(i)) % u64::from(LOAD_SET);
            LoadItem {
                key: format!("load/{block}"),
                identity: identity(LOAD_DST, block),
                page: worker * REQUEST_PAGES + i,
                payload_len: PAGE,
            }
        })
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

fn run_getters(
    device: &Device,
    pool: &Arc<MemoryPool>,
    workers: u32,
    phase: Duration,
) -> BenchResult<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    timed(workers, phase, &stop, |worker| {
        let pool = Arc::clone(pool);
        let mut staging = device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?;
        Ok(Box::new(move |round| {
            let items = load_request(worker, round);
            let keys: Vec<&str> = items.iter().map(|item| item.key.as_str()).collect();
            let mut buffers: Vec<&mut [u8]> = staging.slots_mut().collect();
            for (result, (item, buffer)) in pool
                .get_into(&keys, &mut buffers)
                .into_iter()
                .zip(items.iter().zip(&buffers))
            {
                let read = result?;
                object::open(&item.identity, &buffer[..read], PAGE)?;
            }
            Ok(u64::from(REQUEST_PAGES) * PAGE as u64)
        }))
    })
}

fn run_loaders(
    device: &Device,
    pool: &Arc<MemoryPool>,
    workers: u32,
    phase: Duration,
) -> BenchResult<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    timed(workers, phase, &stop, |worker| loader(device, pool, worker))
}

fn loader(
    device: &Device,
    pool: &Arc<MemoryPool>,
    worker: u32,
) -> BenchResult<Box<dyn FnMut(u64) -> BenchResult<u64> + Send>> {
    let pool = Arc::clone(pool);
    let mut stream = device.stream()?;
    let mut staging = Some(device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?);
    Ok(Box::new(move |round| {
        let items = load_request(worker, round);
        let (returned, moved) = load_pages(
            pool.as_ref(),
            &mut stream,
            staging.take().ok_or("staging lost")?,
            &items,
        );
        staging = Some(returned);
        Ok(moved
            .map_err(|failure| format!("load failed: {}", failure.as_str()))?
            .bytes)
    }))
}

fn run_savers(
    device: &Device,
    pool: &Arc<MemoryPool>,
    counter: &Arc<AtomicU64>,
    workers: u32,
    phase: Duration,
) -> BenchResult<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    timed(workers, phase, &stop, |worker| {
        saver(device, pool, counter, worker)
    })
}

fn saver(
    device: &Device,
    pool: &Arc<MemoryPool>,
    counter: &Arc<AtomicU64>,
    worker: u32,
) -> BenchResult<Box<dyn FnMut(u64) -> BenchResult<u64> + Send>> {
    let (pool, counter) = (Arc::clone(pool), Arc::clone(counter));
    let mut stream = device.stream()?;
    let mut staging = Some(device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?);
    Ok(Box::new(move |_round| {
        let first = counter.fetch_add(u64::from(REQUEST_PAGES), Ordering::Relaxed);
        let items: Vec<SaveItem> = (0..u64::from(REQUEST_PAGES))
            .map(|i| {
                let block = first + i;
                let page =
                    u32::try_from((u64::from(worker) * 37 + block) % u64::from(SOURCE_PAGES))
                        .unwrap_or(0);
                SaveItem {
                    key: format!("save/{block}"),
                    identity: identity(SAVE_SRC, block),
                    page,
                    payload_len: PAGE,
                }
            })
            .collect();
        let (returned, results) = save_pages(
            pool.as_ref(),
            &mut stream,
            staging.take().ok_or("staging lost")?,
            &items,
        );
        staging = Some(returned);
        let stored = results.iter().filter(|r| **r == SaveResult::Stored).count();
        if stored != items.len() {
            return Err(format!(
                "{} of {} saves not stored",
                items.len() - stored,
                items.len()
            )
            .into());
        }
        Ok(stored as u64 * PAGE as u64)
    }))
}

fn overlapped(
    device: &Device,
    load_pool: &Arc<MemoryPool>,
    save_pool: &Arc<MemoryPool>,
    counter: &Arc<AtomicU64>,
    loaders: u32,
    savers: u32,
    phase: Duration,
) -> BenchResult<(f64, f64)> {
    let (load_stop, save_stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let save_side = {
        let (device, save_pool, counter, save_stop) = (
            device.clone(),
            Arc::clone(save_pool),
            Arc::clone(counter),
            Arc::clone(&save_stop),
        );
        thread::spawn(move || {
            timed(savers, phase, &save_stop, |worker| {
                saver(&device, &save_pool, &counter, worker)
            })
        })
    };
    let load = timed(loaders, phase, &load_stop, |worker| {
        loader(device, load_pool, worker)
    })?;
    let save = save_side.join().map_err(|_| "save side panicked")??;
    Ok((load, save))
}
