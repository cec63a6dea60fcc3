//! The zero-copy rows: the connector's procedures over a stand-in transport that moves no
//! bytes with the CPU.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use kv_connector::connector::transfer::{load_pages, save_pages, SaveItem, SaveResult};
use kv_connector::core::object::{self, HEADER_BYTES};
use kv_connector::gpu::Device;
use kv_connector::pool::{Pool, PoolCounters, PoolError};

use super::workers::load_request;
use super::{
    identity, pattern, row, timed, BenchResult, Raw, PAGE, REQUEST_PAGES, SAVE_SRC, SOURCE_PAGES,
};

/// A stand-in transport that moves no bytes with the CPU: `get_into` reports the object as
/// already in the buffer (the loader pre-sealed it there, as a NIC writing registered
/// staging would leave it), `put` accepts without copying (as a NIC reading registered
/// staging would), `exists` reports absent so every save is gathered and sealed.
struct ZeroCopyTransport;

impl Pool for ZeroCopyTransport {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        keys.iter().map(|_| Ok(false)).collect()
    }

    fn put(&self, keys: &[&str], _values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        keys.iter().map(|_| Ok(())).collect()
    }

    fn get_into(&self, keys: &[&str], _buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        keys.iter().map(|_| Ok(object::object_len(PAGE))).collect()
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        keys.iter().map(|_| Ok(true)).collect()
    }

    fn counters(&self) -> PoolCounters {
        PoolCounters::default()
    }

    fn name(&self) -> &'static str {
        "zero-copy-stand-in"
    }
}

pub(crate) fn zero_copy_rows(device: &Device, raw: &Raw, phase: Duration) -> BenchResult<()> {
    for workers in [1, 4, 8, 12] {
        let stop = Arc::new(AtomicBool::new(false));
        let rate = timed(workers, phase, &stop, |worker| {
            zero_copy_loader(device, worker)
        })?;
        row(
            "zero-copy transport: load (verify -> scatter)",
            workers,
            rate,
            raw.h2d,
        );
    }
    for workers in [1, 4, 8, 12] {
        let stop = Arc::new(AtomicBool::new(false));
        let rate = timed(workers, phase, &stop, |worker| {
            zero_copy_saver(device, worker)
        })?;
        row(
            "zero-copy transport: save (gather -> seal)",
            workers,
            rate,
            raw.d2h,
        );
    }
    let (load_stop, save_stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let save_side = {
        let (device, save_stop) = (device.clone(), Arc::clone(&save_stop));
        thread::spawn(move || {
            timed(8, phase, &save_stop, |worker| {
                zero_copy_saver(&device, worker)
            })
        })
    };
    let load = timed(8, phase, &load_stop, |worker| {
        zero_copy_loader(device, worker)
    })?;
    let save = save_side.join().map_err(|_| "save side panicked")??;
    row("zero-copy transport overlapped: load", 8, load, raw.both[0]);
    row("zero-copy transport overlapped: save", 8, save, raw.both[1]);
    Ok(())
}

/// A loader over [`ZeroCopyTransport`]: its staging holds its fixed request's objects,
/// sealed once, and every round verifies and scatters them.
fn zero_copy_loader(
    device: &Device,
    worker: u32,
) -> BenchResult<Box<dyn FnMut(u64) -> BenchResult<u64> + Send>> {
    let mut stream = device.stream()?;
    let mut staging = device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?;
    let items = load_request(worker, 0);
    for (item, slot) in items.iter().zip(staging.slots_mut()) {
        slot[HEADER_BYTES..HEADER_BYTES + PAGE].copy_from_slice(&pattern(item.page));
        object::seal(&item.identity, slot, PAGE)?;
    }
    let mut staging = Some(staging);
    Ok(Box::new(move |_round| {
        let (returned, moved) = load_pages(
            &ZeroCopyTransport,
            &mut stream,
            staging.take().ok_or("staging lost")?,
            &items,
            None,
        );
        staging = Some(returned);
        Ok(moved
            .map_err(|failure| format!("load failed: {}", failure.as_str()))?
            .bytes)
    }))
}

/// A saver over [`ZeroCopyTransport`]: gather, seal, and a put that copies nothing.
fn zero_copy_saver(
    device: &Device,
    worker: u32,
) -> BenchResult<Box<dyn FnMut(u64) -> BenchResult<u64> + Send>> {
    let mut stream = device.stream()?;
    let mut staging = Some(device.staging_pool(HEADER_BYTES + PAGE, REQUEST_PAGES)?);
    let items: Vec<SaveItem> = (0..REQUEST_PAGES)
        .map(|i| {
            let block = u64::from(worker * REQUEST_PAGES + i);
            let page = (worker * 37 + i) % SOURCE_PAGES;
            SaveItem {
                key: format!("zc/{block}"),
                identity: identity(SAVE_SRC, block),
                page,
                payload_len: PAGE,
            }
        })
        .collect();
    Ok(Box::new(move |_round| {
        let (returned, results) = save_pages(
            &ZeroCopyTransport,
            &mut stream,
            staging.take().ok_or("staging lost")?,
            &items,
        );
        staging = Some(returned);
        if results.iter().any(|r| *r != SaveResult::Stored) {
            return Err("zero-copy save not stored".into());
        }
        Ok(u64::from(REQUEST_PAGES) * PAGE as u64)
    }))
}
