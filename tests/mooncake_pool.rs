//! The Mooncake pool backend against a real `mooncake_master` (`docs/DESIGN.md` section 10):
//! nothing is mocked. Each test starts its own master on free loopback ports and stops it by PID
//! (the rig's `Drop`); clients bind the transfer engine to 127.0.0.1.
//!
//! Covered: the pool contract checks that make sense on a remote store (per-key results on
//! mixed batches, immutability / `AlreadyExists`, too-small buffers, batch shape, concurrent
//! puts and gets; copied from `tests/pool_contract.rs`), a page saved by one client loaded
//! byte-identical by another client of the same process, batches above the transport's
//! 1024-key per-peer queue, a master stopped mid-run (per-key errors, bounded) and restarted
//! (the same client recovers, a new client works at once), eviction under pressure with
//! `--eviction_high_watermark_ratio 0.97 --eviction_ratio 0.01`, and `touch` keeping a
//! present object from eviction (R20).
//!
//! The tests need `.venv` from `scripts/setup-mooncake`. `scripts/test` runs it first and
//! builds the tests with `KV_CONNECTOR_REQUIRE_MOONCAKE=1`, so a missing install fails
//! them; without that variable they skip, and the binary says so on one line
//! (`common::mooncake`).
#![cfg(feature = "mooncake")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mooncake::{discover, install};
use kv_connector::pool::mooncake::{
    MasterSettings, MooncakeError, MooncakeInstall, MooncakeMaster, MooncakePool, MooncakeSettings,
};
use kv_connector::pool::{Pool, PoolError};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MIB: usize = 1 << 20;
/// Mooncake's `NO_AVAILABLE_HANDLE`: no room until the master's next eviction pass.
const NO_AVAILABLE_HANDLE: i32 = -200;
/// The longest any single call may take with the master gone before the test fails.
const CALL_BOUND: Duration = Duration::from_secs(60);

// ---- rig ----

fn master_settings(install: &MooncakeInstall, test: &str) -> MasterSettings {
    MasterSettings {
        log_file: Some(
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("mooncake-master-{test}.log")),
        ),
        ..MasterSettings::new(install)
    }
}

fn client(
    install: &MooncakeInstall,
    master: &MooncakeMaster,
    segment_bytes: usize,
) -> Result<MooncakePool, MooncakeError> {
    let settings = MooncakeSettings {
        venv_dir: install.venv_dir.clone(),
        global_segment_size_bytes: segment_bytes as u64,
        local_buffer_size_bytes: 4 * MIB as u64,
        fallback_staging_bytes: MIB,
        ..MooncakeSettings::default()
    };
    MooncakePool::connect(master.client_settings(settings))
}

/// A master and one client; the client closes before the master stops (field order).
struct Rig {
    pool: MooncakePool,
    master: MooncakeMaster,
    install: MooncakeInstall,
}

fn rig(
    test: &str,
    segment_bytes: usize,
    tune: impl FnOnce(&mut MasterSettings),
) -> Result<Option<Rig>, MooncakeError> {
    let Some(install) = install() else {
        return Ok(None);
    };
    let mut settings = master_settings(&install, test);
    tune(&mut settings);
    let master = MooncakeMaster::start(settings)?;
    let pool = client(&install, &master, segment_bytes)?;
    Ok(Some(Rig {
        pool,
        master,
        install,
    }))
}

/// Polls an external process's state until `ready` answers `Some`, or `limit` passes.
/// Bounded; not a timing assertion (the master evicts and re-mounts on its own clock).
fn poll_until<T>(limit: Duration, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    let started = Instant::now();
    loop {
        if let Some(value) = ready() {
            return Some(value);
        }
        if started.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `call` on its own thread and fails the test if it does not return within `bound`.
fn bounded<T: Send + 'static>(bound: Duration, call: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, result) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let _ = done.send(call());
    });
    result
        .recv_timeout(bound)
        .unwrap_or_else(|_| panic!("call did not return within {bound:?}"))
}

// ---- contract checks (from tests/pool_contract.rs), each on any pool ----

/// Bytes that depend on the key, so a read of the wrong object shows.
fn payload(key: &str, len: usize) -> Vec<u8> {
    let seed = key
        .bytes()
        .fold(17u8, |acc, b| acc.wrapping_mul(31).wrapping_add(b));
    (0..len)
        .map(|i| seed.wrapping_add((i % 251).to_le_bytes()[0]))
        .collect()
}

fn put_all(pool: &dyn Pool, keys: &[&str], len: usize) -> Result<(), PoolError> {
    let values: Vec<Vec<u8>> = keys.iter().map(|key| payload(key, len)).collect();
    let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    pool.put(keys, &slices).into_iter().collect()
}

fn present(pool: &dyn Pool, keys: &[&str]) -> Result<Vec<bool>, PoolError> {
    pool.exists(keys).into_iter().collect()
}

fn check_per_key_results_on_mixed_batches(pool: &dyn Pool) -> TestResult {
    put_all(pool, &["m/a", "m/c"], 32)?;
    assert_eq!(
        present(pool, &["m/a", "m/b", "m/c", "m/d"])?,
        [true, false, true, false]
    );
    let mut a = vec![0u8; 32];
    let mut b = vec![0u8; 32];
    let mut c = vec![0u8; 64];
    let results = pool.get_into(&["m/a", "m/b", "m/c"], &mut [&mut a, &mut b, &mut c]);
    assert_eq!(results, vec![Ok(32), Err(PoolError::NotFound), Ok(32)]);
    assert_eq!(a, payload("m/a", 32));
    assert_eq!(b, vec![0u8; 32], "a miss writes nothing");
    assert_eq!(&c[..32], &payload("m/c", 32)[..]);
    assert_eq!(
        &c[32..],
        &[0u8; 32][..],
        "bytes past the object stay untouched"
    );
    let puts = pool.put(
        &["m/a", "m/e"],
        &[&payload("m/a", 8)[..], &payload("m/e", 8)[..]],
    );
    assert_eq!(puts, vec![Err(PoolError::AlreadyExists), Ok(())]);
    assert_eq!(pool.touch(&["m/e", "m/zz"]), vec![Ok(true), Ok(false)]);
    Ok(())
}

fn check_objects_are_immutable(pool: &dyn Pool) -> TestResult {
    put_all(pool, &["i/a"], 16)?;
    let before = pool.counters();
    let results = pool.put(&["i/a", "i/b", "i/b"], &[&[0xff; 24], &[1; 8], &[2; 8]]);
    assert_eq!(
        results,
        vec![
            Err(PoolError::AlreadyExists),
            Ok(()),
            Err(PoolError::AlreadyExists)
        ]
    );
    let mut buffer = vec![0u8; 64];
    assert_eq!(pool.get_into(&["i/a"], &mut [&mut buffer]), vec![Ok(16)]);
    assert_eq!(&buffer[..16], &payload("i/a", 16)[..]);
    assert_eq!(pool.get_into(&["i/b"], &mut [&mut buffer]), vec![Ok(8)]);
    assert_eq!(
        &buffer[..8],
        &[1; 8],
        "the first of a repeated key is stored"
    );
    let after = pool.counters();
    assert_eq!(after.puts, before.puts + 1);
    assert_eq!(after.put_existing, before.put_existing + 2);
    Ok(())
}

fn check_get_into_too_small_buffer(pool: &dyn Pool) -> TestResult {
    put_all(pool, &["s/a"], 100)?;
    let mut small = vec![9u8; 99];
    let results = pool.get_into(&["s/a"], &mut [&mut small]);
    assert_eq!(
        results,
        vec![Err(PoolError::BufferTooSmall {
            needed: 100,
            capacity: 99
        })]
    );
    assert!(
        small.iter().all(|&b| b == 9),
        "a too-small buffer is left unwritten"
    );
    Ok(())
}

fn check_batch_shape_mismatch(pool: &dyn Pool) -> TestResult {
    let shape = |keys, items| PoolError::BatchShape { keys, items };
    assert_eq!(
        pool.put(&["b/a", "b/b"], &[&[1u8; 4]]),
        vec![Err(shape(2, 1)), Err(shape(2, 1))]
    );
    let mut one = vec![0u8; 4];
    let results = pool.get_into(&["b/a", "b/b", "b/c"], &mut [&mut one]);
    assert_eq!(
        results,
        vec![Err(shape(3, 1)), Err(shape(3, 1)), Err(shape(3, 1))]
    );
    assert_eq!(pool.put(&[], &[&[1u8; 4]]), vec![]);
    assert_eq!(
        present(pool, &["b/a", "b/b"])?,
        [false, false],
        "a bad batch stores nothing"
    );
    Ok(())
}

fn check_concurrent_puts_and_gets_keep_bytes_intact(pool: &dyn Pool) {
    const THREADS: usize = 4;
    const KEYS: usize = 32;
    const LEN: usize = 4096;
    let key = |thread: usize, i: usize| format!("c/{thread}/{i}");
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            scope.spawn(move || {
                for i in 0..KEYS {
                    let name = key(thread, i);
                    assert_eq!(pool.put(&[&name], &[&payload(&name, LEN)]), vec![Ok(())]);
                    let other = key((thread + 1) % THREADS, i);
                    let mut buffer = vec![0u8; LEN];
                    match pool.get_into(&[&other], &mut [&mut buffer]).remove(0) {
                        Ok(len) => assert_eq!(buffer[..len], payload(&other, LEN)[..]),
                        Err(err) => assert_eq!(err, PoolError::NotFound),
                    }
                }
            });
        }
    });
    for thread in 0..THREADS {
        for i in 0..KEYS {
            let name = key(thread, i);
            let mut buffer = vec![0u8; LEN];
            assert_eq!(pool.get_into(&[&name], &mut [&mut buffer]), vec![Ok(LEN)]);
            assert_eq!(buffer, payload(&name, LEN), "{name}");
        }
    }
    assert_eq!(pool.counters().puts, (THREADS * KEYS) as u64);
}

// ---- the contract on a real master ----

#[test]
fn mooncake_per_key_results_on_mixed_batches() -> TestResult {
    let Some(rig) = rig("mixed", 16 * MIB, |_| {})? else {
        return Ok(());
    };
    check_per_key_results_on_mixed_batches(&rig.pool)
}

#[test]
fn mooncake_objects_are_immutable() -> TestResult {
    let Some(rig) = rig("immutable", 16 * MIB, |_| {})? else {
        return Ok(());
    };
    check_objects_are_immutable(&rig.pool)
}

/// `put_absent` skips the probe: a present key is answered `Ok` and keeps its object, a
/// key repeated in the batch is still refused, absent keys are stored.
#[test]
fn mooncake_put_absent_keeps_present_objects_and_stores_absent_ones() -> TestResult {
    let Some(rig) = rig("put-absent", 16 * MIB, |_| {})? else {
        return Ok(());
    };
    let pool: &dyn Pool = &rig.pool;
    put_all(pool, &["pa/a"], 16)?;
    let results = pool.put_absent(&["pa/a", "pa/b", "pa/b"], &[&[0xff; 24], &[1; 8], &[2; 8]]);
    assert_eq!(results, vec![Ok(()), Ok(()), Err(PoolError::AlreadyExists)]);
    let mut buffer = vec![0u8; 64];
    assert_eq!(pool.get_into(&["pa/a"], &mut [&mut buffer]), vec![Ok(16)]);
    assert_eq!(
        &buffer[..16],
        &payload("pa/a", 16)[..],
        "present object unchanged"
    );
    assert_eq!(pool.get_into(&["pa/b"], &mut [&mut buffer]), vec![Ok(8)]);
    assert_eq!(&buffer[..8], &[1; 8]);
    Ok(())
}

#[test]
fn mooncake_get_into_too_small_buffer() -> TestResult {
    let Some(rig) = rig("too-small", 16 * MIB, |_| {})? else {
        return Ok(());
    };
    check_get_into_too_small_buffer(&rig.pool)
}

#[test]
fn mooncake_batch_shape_mismatch() -> TestResult {
    let Some(rig) = rig("shape", 16 * MIB, |_| {})? else {
        return Ok(());
    };
    check_batch_shape_mismatch(&rig.pool)
}

#[test]
fn mooncake_concurrent_puts_and_gets_keep_bytes_intact() -> TestResult {
    let Some(rig) = rig("concurrent", 16 * MIB, |_| {})? else {
        return Ok(());
    };
    check_concurrent_puts_and_gets_keep_bytes_intact(&rig.pool);
    Ok(())
}

// ---- beyond the shared contract ----

/// Client A saves pages from registered staging; client B (same process, same master)
/// loads them byte-identical into its own registered staging. A closed client answers
/// `Unavailable` per key.
#[test]
fn page_saved_by_one_client_loads_byte_identical_in_another() -> TestResult {
    const PAGES: usize = 64;
    const PAGE: usize = 64 << 10;
    let Some(rig) = rig("two-clients", 32 * MIB, |_| {})? else {
        return Ok(());
    };
    let loader = client(&rig.install, &rig.master, 16 * MIB)?;
    let keys: Vec<String> = (0..PAGES)
        .map(|i| format!("kvc/m/w1r0/lg0/t32b{PAGE}/{i:032x}"))
        .collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let saver_staging: Vec<u8> = keys.iter().flat_map(|key| payload(key, PAGE)).collect();
    rig.pool.register_slice(&saver_staging)?;
    let values: Vec<&[u8]> = saver_staging.chunks(PAGE).collect();
    assert!(rig.pool.put(&key_refs, &values).iter().all(Result::is_ok));

    let mut loader_staging = vec![0u8; PAGES * PAGE];
    loader.register_slice(&loader_staging)?;
    let mut slots: Vec<&mut [u8]> = loader_staging.chunks_mut(PAGE).collect();
    let results = loader.get_into(&key_refs, &mut slots);
    assert!(
        results.iter().all(|result| *result == Ok(PAGE)),
        "{:?}",
        &results[..4]
    );
    assert!(
        loader_staging == saver_staging,
        "loaded pages differ from saved pages"
    );
    assert_eq!(loader.counters().bytes_read, (PAGES * PAGE) as u64);

    rig.pool.close()?;
    assert_eq!(
        rig.pool.exists(&key_refs[..2]),
        vec![Err(PoolError::Unavailable); 2]
    );
    loader.close()?;
    Ok(())
}

/// 2500 keys in one call: the pool splits at 1024 keys per call (the TCP transport's
/// per-peer queue), and every key answers on its own.
#[test]
fn batches_above_1024_keys_answer_every_key() -> TestResult {
    const KEYS: usize = 2500;
    const LEN: usize = 256;
    let Some(rig) = rig("big-batch", 32 * MIB, |_| {})? else {
        return Ok(());
    };
    let keys: Vec<String> = (0..KEYS).map(|i| format!("big/{i}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    put_all(&rig.pool, &key_refs, LEN)?;
    assert!(present(&rig.pool, &key_refs)?.into_iter().all(|p| p));
    let mut buffers: Vec<Vec<u8>> = vec![vec![0u8; LEN]; KEYS];
    let mut slots: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
    let results = rig.pool.get_into(&key_refs, &mut slots);
    assert!(results.iter().all(|result| *result == Ok(LEN)));
    for (key, buffer) in keys.iter().zip(&buffers) {
        assert_eq!(*buffer, payload(key, LEN), "{key}");
    }
    let again = rig.pool.put(&key_refs, &vec![&[0u8; 8][..]; KEYS]);
    assert!(again
        .iter()
        .all(|result| *result == Err(PoolError::AlreadyExists)));
    Ok(())
}

/// With the master gone every call answers per-key errors within a bound (no panic, no
/// hang); after a restart on the same ports the same client recovers by itself once its
/// heartbeat re-mounts its segment, and a new client works at once. Objects stored before
/// the stop are gone.
#[test]
fn master_stopped_mid_run_gives_per_key_errors_and_a_restarted_master_is_used() -> TestResult {
    let Some(Rig {
        pool,
        mut master,
        install,
    }) = rig("restart", 16 * MIB, |_| {})?
    else {
        return Ok(());
    };
    let pool = Arc::new(pool);
    put_all(pool.as_ref(), &["r/a", "r/b"], 64)?;
    master.stop()?;
    let down = Arc::clone(&pool);
    let (exists, puts, gets) = bounded(CALL_BOUND, move || {
        let mut buffer = vec![0u8; 64];
        (
            down.exists(&["r/a", "r/b", "r/c"]),
            down.put(&["r/d", "r/e"], &[&[1u8; 8], &[2u8; 8]]),
            down.get_into(&["r/a"], &mut [&mut buffer]),
        )
    });
    assert_eq!(exists, vec![Err(PoolError::Unavailable); 3]);
    assert_eq!(puts.len(), 2);
    assert!(puts.iter().all(Result::is_err), "{puts:?}");
    assert_eq!(gets.len(), 1);
    assert!(gets[0].is_err(), "{gets:?}");

    master.restart()?;
    let fresh = client(&install, &master, 16 * MIB)?;
    put_all(&fresh, &["r/fresh"], 64)?;
    assert_eq!(
        present(&fresh, &["r/fresh", "r/a"])?,
        [true, false],
        "state is lost on restart"
    );
    let recovered = poll_until(Duration::from_secs(30), || {
        pool.put(&["r/again"], &[&[3u8; 8]]).remove(0).ok()
    });
    assert!(recovered.is_some(), "the old client never recovered");
    assert_eq!(present(&fresh, &["r/again"])?, [true]);
    fresh.close()?;
    pool.close()?;
    drop(pool);
    master.stop()?;
    Ok(())
}

/// Puts `keys` (payload of `len`), re-putting the ones the master had no room for until
/// they land; the master evicts on its own thread every few milliseconds.
fn put_through_eviction(pool: &dyn Pool, keys: &[&str], len: usize) -> Result<(), PoolError> {
    let mut waiting: Vec<&str> = keys.to_vec();
    let landed = poll_until(Duration::from_secs(30), || {
        let values: Vec<Vec<u8>> = waiting.iter().map(|key| payload(key, len)).collect();
        let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let results = pool.put(&waiting, &slices);
        let mut still = Vec::new();
        for (key, result) in waiting.iter().zip(results) {
            match result {
                Ok(()) => {}
                Err(PoolError::Backend {
                    code: NO_AVAILABLE_HANDLE,
                }) => still.push(*key),
                Err(other) => return Some(Err(other)),
            }
        }
        waiting = still;
        waiting.is_empty().then_some(Ok(()))
    });
    landed.unwrap_or(Err(PoolError::Backend {
        code: NO_AVAILABLE_HANDLE,
    }))
}

/// Eviction under pressure with the high watermark at 0.97 and 1% evicted per pass. The
/// master evicts the least recently accessed unleased objects (a put or a probe sets an
/// object's age). Three quarters of the segment, a touch of the first object, then half a
/// segment more: the oldest untouched object goes, the touched one stays (R20). Then five
/// segments' worth in all: every put lands once the master's eviction catches up, the pool
/// never holds more than its segment, and the newest objects read back intact.
#[test]
fn eviction_under_pressure_keeps_working_and_touch_protects_r20() -> TestResult {
    const SEGMENT: usize = 16 * MIB;
    const LEN: usize = 256 << 10;
    const CAPACITY: usize = SEGMENT / LEN;
    const BATCH: usize = 16;
    let Some(rig) = rig("eviction", SEGMENT, |settings| {
        settings.eviction_high_watermark_ratio = 0.97;
        settings.eviction_ratio = 0.01;
    })?
    else {
        return Ok(());
    };
    let keys: Vec<String> = (0..5 * CAPACITY).map(|i| format!("ev/{i}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (first, rest) = key_refs.split_at(CAPACITY * 3 / 4);
    let (second, rest) = rest.split_at(CAPACITY / 2);
    for batch in first.chunks(BATCH) {
        put_through_eviction(&rig.pool, batch, LEN)?;
    }
    assert_eq!(rig.pool.touch(&first[..1]), vec![Ok(true)]);
    for batch in second.chunks(BATCH) {
        put_through_eviction(&rig.pool, batch, LEN)?;
    }
    assert_eq!(
        present(&rig.pool, &first[..2])?,
        [true, false],
        "touched kept, oldest evicted"
    );
    for batch in rest.chunks(BATCH) {
        put_through_eviction(&rig.pool, batch, LEN)?;
    }
    let held = present(&rig.pool, &key_refs)?
        .into_iter()
        .filter(|p| *p)
        .count();
    assert!(
        held > 0 && held <= CAPACITY,
        "{held} objects in a segment for {CAPACITY}"
    );
    let newest = &key_refs[key_refs.len() - BATCH..];
    let mut buffers = vec![vec![0u8; LEN]; BATCH];
    let mut slots: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
    assert!(rig
        .pool
        .get_into(newest, &mut slots)
        .iter()
        .all(|r| *r == Ok(LEN)));
    for (key, buffer) in newest.iter().zip(&buffers) {
        assert_eq!(*buffer, payload(key, LEN), "{key}");
    }
    assert_eq!(rig.pool.counters().puts, key_refs.len() as u64);
    Ok(())
}

// ---- the install itself ----

/// Built to require Mooncake (as `scripts/test` builds the tests), a missing install fails
/// the test with the reason, rather than skipping it.
#[test]
#[should_panic(expected = "the Mooncake install is required (KV_CONNECTOR_REQUIRE_MOONCAKE=1")]
fn a_missing_install_fails_when_mooncake_is_required() {
    let _ = discover(Path::new("/nonexistent/kvc-test-venv"), true);
}

/// Built without it, a missing install is an error the tests skip on, and an installed
/// one is found.
#[test]
fn a_missing_install_skips_only_when_mooncake_is_not_required() {
    assert!(discover(Path::new("/nonexistent/kvc-test-venv"), false).is_err());
    if common::mooncake::required() {
        assert!(install().is_some(), "required and found");
    }
}
