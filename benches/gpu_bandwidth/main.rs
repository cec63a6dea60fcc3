//! Host <-> GPU bandwidth of the CUDA backend, raw and through the connector's transfer
//! procedures, measured in one run so the ratios compare like with like.
//!
//! Rows (each phase runs for a fixed time; GB/s are 10^9 bytes of page payload per second):
//! 1. raw H2D / raw D2H: 1 GiB of pinned staging in 64 MiB slots, scattered to / gathered
//!    from 64 MiB device pages in reverse order, so every copy is one 64 MiB
//!    `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` (16 per submission, one event after them).
//! 2. raw both: the two at once, on separate streams and threads.
//! 3. CPU parts of a copying pool path, no device copy: a page `memcpy` into pinned
//!    staging, a CPU object checksum of a page, `MemoryPool::get_into` into pinned staging
//!    plus the header and checksum check (`object::open`), and `object::seal` plus
//!    `MemoryPool::put`.
//! 4. load path: `transfer::load_pages` with N loaders, each with its own stream
//!    and staging, gpt-oss-120b pages (18 layers x 64 KiB = 1.125 MiB), calls of 1,024
//!    pages (batches of 256 lent objects, or of 64 staging slots), over the embedded pool with its objects in pinned memory
//!    (`MemoryPool::with_arena(.., device.host_arena())`): the pool lends its objects, the
//!    loader checks headers and scatters straight from them, the GPU checksums the landed
//!    pages (`scatter_checked`). Then the same through staging: a wrapper that hides
//!    `lend` makes the loader get into its pinned staging first (a copying transport).
//! 5. save path: `transfer::save_pages` with N savers, fresh keys, into a pool
//!    kept full so eviction recycles memory: probe, GPU checksum and gather into fresh
//!    pinned pool objects, seal headers, commit; then the same through staging + put.
//! 6. loads and saves overlapped: both at once (zero-copy).
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
use kv_connector::gpu::host_memory::{HostSlot, SharedSlot};
use kv_connector::gpu::{CopyDirection, Device, PageCopy, PagePoolSpec};
use kv_connector::pool::{MemoryPool, Pool, PoolCounters, PoolError, SystemClock};

mod workers;

use workers::{
    cpu_checksum, cpu_copy, fill_load_set, overlapped, run_getters, run_loaders, run_putters,
    run_savers,
};

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

const MIB: usize = 1 << 20;
const RAW_COPY: usize = 64 * MIB;
const RAW_COPIES: u32 = 16;
/// gpt-oss-120b page: 18 layers x K,V x 8 heads x 64 x bf16 x 32 tokens.
const PAGE: usize = 18 * 2 * 8 * 64 * 2 * 32;
/// Pages per staging pool, so per batch of a load or save, and per CPU-row round.
const REQUEST_PAGES: u32 = 64;
/// Pages per `load_pages` / `save_pages` call of the connector rows: 1,024 gpt-oss pages are
/// 32,768 tokens, a third of the 100k-token prefixes the connector loads; that is four
/// batches of lent objects (`LENT_BATCH_PAGES`), pipelined as in real calls, and 16 staging
/// batches on the copying path.
const CONNECTOR_REQUEST_PAGES: u32 = 1024;
const LOAD_SET: u32 = 1024;
const SOURCE_PAGES: u32 = 512;
const MAX_WORKERS: u32 = 16;

const RAW_H2D: GroupId = GroupId(0);
const RAW_D2H: GroupId = GroupId(1);
const LOAD_DST: GroupId = GroupId(2);
const SAVE_SRC: GroupId = GroupId(3);

fn main() -> BenchResult<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .init();
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
            spec(LOAD_DST, PAGE, MAX_WORKERS * CONNECTOR_REQUEST_PAGES),
            spec(SAVE_SRC, PAGE, SOURCE_PAGES),
        ],
    )?;
    let threads = thread::available_parallelism().map_or(0, usize::from);
    println!("# gpu_bandwidth: device {device:?}, {threads} cpus, phase {phase:?}");
    println!("# page {PAGE} B (gpt-oss-120b), connector calls of {CONNECTOR_REQUEST_PAGES} pages, {REQUEST_PAGES} staging slots, raw copies {RAW_COPIES} x {} MiB", RAW_COPY / MIB);
    println!();
    println!("| path | workers | GB/s | % of raw same direction |");
    println!("| --- | ---: | ---: | ---: |");
    let raw = raw_rows(&device, phase)?;

    for page in 0..SOURCE_PAGES {
        device.write_page(SAVE_SRC, page, &pattern(page))?;
    }
    let (load, save) = (
        Arc::new(pool(&device, 2 << 30)?),
        Arc::new(pool(&device, 4 << 30)?),
    );
    let pools = Pools {
        load_lending: Arc::clone(&load) as Arc<dyn Pool>,
        save_lending: Arc::clone(&save) as Arc<dyn Pool>,
        load_copying: Arc::new(Copying(Arc::clone(&load))),
        save_copying: Arc::new(Copying(Arc::clone(&save))),
        load,
        save,
        counter: Arc::new(AtomicU64::new(0)),
    };
    fill_load_set(&device, &pools.load)?;
    // Fill the save pool past capacity once with as many savers as any row uses, so
    // measured puts recycle evicted memory and the pinned arena already holds what the
    // savers keep in flight (growing it pins fresh chunks, which stalls the device).
    let fill = Duration::from_secs(if quick { 1 } else { 3 });
    run_savers(&device, &pools.save_lending, &pools.counter, 12, fill)?;

    cpu_rows(&device, &raw, phase)?;
    load_rows(&device, &pools, &raw, phase)?;
    save_rows(&device, &pools, &raw, phase)?;
    for (loaders, savers) in [(4, 4), (8, 8)] {
        let lending = (&pools.load_lending, &pools.save_lending);
        let (load, save) = overlapped(&device, lending, &pools.counter, loaders, savers, phase)?;
        row(
            "overlapped zero-copy: load path",
            loaders,
            load,
            raw.both[0],
        );
        row("overlapped zero-copy: save path", savers, save, raw.both[1]);
    }
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

/// The pools of the connector rows (pinned objects; each also behind the non-lending
/// wrapper) and the source of fresh save keys.
struct Pools {
    load: Arc<MemoryPool>,
    save: Arc<MemoryPool>,
    load_lending: Arc<dyn Pool>,
    save_lending: Arc<dyn Pool>,
    load_copying: Arc<dyn Pool>,
    save_copying: Arc<dyn Pool>,
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
    // The connector moves one page per copy: the same link in page-sized copies.
    let pages = RawShape {
        groups: [LOAD_DST, SAVE_SRC],
        len: PAGE,
        copies: 256,
    };
    for (direction, name, reference) in [
        (
            CopyDirection::HostToDevice,
            "raw H2D in page-sized copies (256 x 1.125 MiB)",
            h2d,
        ),
        (
            CopyDirection::DeviceToHost,
            "raw D2H in page-sized copies (256 x 1.125 MiB)",
            d2h,
        ),
    ] {
        let rate = raw_with(device, &[direction], pages, phase)?[0];
        row(name, 1, rate, reference);
    }
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
        row("cpu: object checksum of a page", workers, rate, raw.h2d);
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
    for workers in [1, 2, 4, 8, 12] {
        let rate = run_loaders(device, &pools.load_lending, workers, phase)?;
        row(
            "load path, zero-copy (lend -> scatter + GPU checksum)",
            workers,
            rate,
            raw.h2d,
        );
    }
    for workers in [1, 4, 8, 12] {
        let rate = run_loaders(device, &pools.load_copying, workers, phase)?;
        row(
            "load path via staging (get -> staging -> scatter + GPU checksum)",
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
    for workers in [1, 2, 4, 8, 12] {
        let rate = run_savers(device, &pools.save_lending, &pools.counter, workers, phase)?;
        row(
            "save path, zero-copy (GPU checksum + gather into pool objects -> commit)",
            workers,
            rate,
            raw.d2h,
        );
    }
    for workers in [1, 4, 8, 12] {
        let rate = run_savers(device, &pools.save_copying, &pools.counter, workers, phase)?;
        row(
            "save path via staging (GPU checksum + gather -> staging -> put)",
            workers,
            rate,
            raw.d2h,
        );
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

/// An embedded pool whose objects live in the device's pinned host arena.
fn pool(device: &Device, capacity_bytes: u64) -> BenchResult<MemoryPool> {
    Ok(MemoryPool::with_arena(
        EvictionPolicy::mooncake_defaults(capacity_bytes),
        Arc::new(SystemClock::new()),
        device.host_arena(),
    )?)
}

/// The same pool without `lend` / `alloc_objects`: loads get into staging and saves put
/// from it, as over a copying transport.
struct Copying(Arc<MemoryPool>);

impl Pool for Copying {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.0.exists(keys)
    }
    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.0.put(keys, values)
    }
    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        self.0.get_into(keys, buffers)
    }
    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.0.touch(keys)
    }
    fn counters(&self) -> PoolCounters {
        self.0.counters()
    }
    fn name(&self) -> &'static str {
        "memory-copying"
    }
    fn lend(&self, _keys: &[&str]) -> Option<Vec<Result<SharedSlot, PoolError>>> {
        None
    }
    fn alloc_objects(&self, _lens: &[usize]) -> Option<Vec<Result<HostSlot, PoolError>>> {
        None
    }
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
    let shape = RawShape {
        groups: [RAW_H2D, RAW_D2H],
        len: RAW_COPY,
        copies: RAW_COPIES,
    };
    raw_with(device, directions, shape, phase)
}

/// What one raw submission copies: `copies` copies of `len` bytes to or from the pages of
/// `groups[0]` (H2D) or `groups[1]` (D2H).
#[derive(Clone, Copy)]
struct RawShape {
    groups: [GroupId; 2],
    len: usize,
    copies: u32,
}

fn raw_with(
    device: &Device,
    directions: &[CopyDirection],
    shape: RawShape,
    phase: Duration,
) -> BenchResult<Vec<f64>> {
    let start = Arc::new(Barrier::new(directions.len()));
    let workers: Vec<_> = directions
        .iter()
        .map(|&direction| {
            let (device, start) = (device.clone(), Arc::clone(&start));
            thread::spawn(move || -> BenchResult<f64> {
                let mut stream = device.stream()?;
                let mut staging = device.staging_pool(shape.len, shape.copies)?;
                let group = if direction == CopyDirection::HostToDevice {
                    shape.groups[0]
                } else {
                    shape.groups[1]
                };
                // Slot s to page n - 1 - s: neighbours never coalesce, so each copy is
                // exactly `len` bytes.
                let copies: Vec<PageCopy> = (0..shape.copies)
                    .map(|s| PageCopy {
                        group,
                        page: shape.copies - 1 - s,
                        staging_slot: s,
                        staging_offset: 0,
                        len: shape.len,
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
                    bytes += u64::from(shape.copies) * shape.len as u64;
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
