//! The workers of the pool-path rows: CPU-only parts, loaders and savers over the memory
//! pool, and the two overlapped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use kv_connector::core::object::{self, HEADER_BYTES};
use kv_connector::gpu::Device;
use kv_connector::pool::{MemoryPool, Pool};
use kv_connector::transfer::{load_pages, save_pages, LoadGrant, LoadOrder, PageRef, SaveResult};

use super::{
    identity, pattern, timed, BenchResult, CONNECTOR_REQUEST_PAGES, LOAD_DST, LOAD_SET, PAGE,
    REQUEST_PAGES, SAVE_SRC, SOURCE_PAGES,
};

/// Saves the load set (`LOAD_SET` objects from the source pages) into `pool`.
pub(crate) fn fill_load_set(device: &Device, pool: &MemoryPool) -> BenchResult<()> {
    let mut stream = device.stream()?;
    let mut staging = device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?;
    let items: Vec<PageRef> = (0..LOAD_SET)
        .map(|block| PageRef {
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

pub(crate) fn load_request(worker: u32, round: u64) -> Vec<PageRef> {
    let first = (u64::from(worker) * 131 + round * u64::from(CONNECTOR_REQUEST_PAGES))
        % u64::from(LOAD_SET);
    (0..CONNECTOR_REQUEST_PAGES)
        .map(|i| {
            let block = (first + u64::from(i)) % u64::from(LOAD_SET);
            PageRef {
                key: format!("load/{block}"),
                identity: identity(LOAD_DST, block),
                page: worker * CONNECTOR_REQUEST_PAGES + i,
                payload_len: PAGE,
            }
        })
        .collect()
}

pub(crate) fn run_getters(
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
            let mut items = load_request(worker, round);
            items.truncate(REQUEST_PAGES as usize);
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

/// Each worker copies 64 distinct heap pages into its pinned staging slots, or into a
/// plain heap buffer of the same size (to see whether pinned memory is slower to write).
pub(crate) fn cpu_copy(
    device: &Device,
    workers: u32,
    pinned: bool,
    phase: Duration,
) -> BenchResult<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    timed(workers, phase, &stop, |worker| {
        let sources: Vec<Vec<u8>> = (0..REQUEST_PAGES)
            .map(|p| pattern(worker * 64 + p))
            .collect();
        let mut staging = device.staging_pool(PAGE, REQUEST_PAGES)?;
        let mut heap = vec![1_u8; PAGE * REQUEST_PAGES as usize];
        Ok(Box::new(move |_round| {
            if pinned {
                for (slot, source) in staging.slots_mut().zip(&sources) {
                    slot.copy_from_slice(source);
                }
            } else {
                for (slot, source) in heap.chunks_exact_mut(PAGE).zip(&sources) {
                    slot.copy_from_slice(source);
                }
            }
            std::hint::black_box(&mut heap);
            Ok(u64::from(REQUEST_PAGES) * PAGE as u64)
        }))
    })
}

/// Each worker checksums its 64 pinned staging slots.
pub(crate) fn cpu_checksum(device: &Device, workers: u32, phase: Duration) -> BenchResult<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    timed(workers, phase, &stop, |worker| {
        let mut staging = device.staging_pool(PAGE, REQUEST_PAGES)?;
        for (p, slot) in (0..).zip(staging.slots_mut()) {
            slot.copy_from_slice(&pattern(worker * 64 + p));
        }
        let mut sink = 0_u64;
        Ok(Box::new(move |_round| {
            for slot in 0..REQUEST_PAGES {
                sink ^= object::checksum(staging.slot(slot)?);
            }
            std::hint::black_box(sink);
            Ok(u64::from(REQUEST_PAGES) * PAGE as u64)
        }))
    })
}

/// Each worker seals its staging slots under fresh keys and puts them: the save path
/// without the gather.
pub(crate) fn run_putters(
    device: &Device,
    pool: &Arc<MemoryPool>,
    counter: &Arc<AtomicU64>,
    workers: u32,
    phase: Duration,
) -> BenchResult<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    timed(workers, phase, &stop, |worker| {
        let (pool, counter) = (Arc::clone(pool), Arc::clone(counter));
        let mut staging = device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?;
        for (p, slot) in (0..).zip(staging.slots_mut()) {
            slot[HEADER_BYTES..].copy_from_slice(&pattern(worker * 64 + p));
        }
        Ok(Box::new(move |_round| {
            let first = counter.fetch_add(u64::from(REQUEST_PAGES), Ordering::Relaxed);
            let keys: Vec<String> = (first..first + u64::from(REQUEST_PAGES))
                .map(|b| format!("save/{b}"))
                .collect();
            let mut values: Vec<&[u8]> = Vec::with_capacity(keys.len());
            for (block, slot) in (first..).zip(staging.slots_mut()) {
                let len = object::seal(&identity(SAVE_SRC, block), slot, PAGE)?;
                values.push(&slot[..len]);
            }
            let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            for result in pool.put(&key_refs, &values) {
                result?;
            }
            Ok(u64::from(REQUEST_PAGES) * PAGE as u64)
        }))
    })
}

pub(crate) fn run_loaders(
    device: &Device,
    pool: &Arc<dyn Pool>,
    workers: u32,
    phase: Duration,
) -> BenchResult<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    timed(workers, phase, &stop, |worker| loader(device, pool, worker))
}

fn loader(
    device: &Device,
    pool: &Arc<dyn Pool>,
    worker: u32,
) -> BenchResult<Box<dyn FnMut(u64) -> BenchResult<u64> + Send>> {
    let pool = Arc::clone(pool);
    let mut stream = device.stream()?;
    let mut staging = Some(device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?);
    Ok(Box::new(move |round| {
        let items = load_request(worker, round);
        // Every page lent for the whole load (item `i` holds block `i`).
        let blocks: Vec<u64> = (0..items.len() as u64).collect();
        let grant = LoadGrant::new(0..items.len() as u64, 1);
        let order = LoadOrder {
            items: &items,
            blocks: &blocks,
            grant: &grant,
        };
        let (returned, moved) = load_pages(
            pool.as_ref(),
            &mut stream,
            staging.take().ok_or("staging lost")?,
            order,
            None,
        );
        staging = Some(returned);
        Ok(moved
            .map_err(|failure| format!("load failed: {}", failure.as_str()))?
            .bytes)
    }))
}

pub(crate) fn run_savers(
    device: &Device,
    pool: &Arc<dyn Pool>,
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
    pool: &Arc<dyn Pool>,
    counter: &Arc<AtomicU64>,
    worker: u32,
) -> BenchResult<Box<dyn FnMut(u64) -> BenchResult<u64> + Send>> {
    let (pool, counter) = (Arc::clone(pool), Arc::clone(counter));
    let mut stream = device.stream()?;
    let mut staging = Some(device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?);
    Ok(Box::new(move |_round| {
        let first = counter.fetch_add(u64::from(CONNECTOR_REQUEST_PAGES), Ordering::Relaxed);
        let items: Vec<PageRef> = (0..u64::from(CONNECTOR_REQUEST_PAGES))
            .map(|i| {
                let block = first + i;
                let page =
                    u32::try_from((u64::from(worker) * 37 + block) % u64::from(SOURCE_PAGES))
                        .unwrap_or(0);
                PageRef {
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

pub(crate) fn overlapped(
    device: &Device,
    (load_pool, save_pool): (&Arc<dyn Pool>, &Arc<dyn Pool>),
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
