//! The pool contract (`docs/DESIGN.md` section 10), as checks that take `&dyn Pool`, run against
//! the embedded memory pool. A Mooncake backend reuses the same functions: each needs only
//! a pool, and the lease and eviction checks also a way to move the pool's clock.
//!
//! Covered: per-key results on mixed batches, immutability, too-small buffers, batch shape
//! mismatches, leases (R14) surviving eviction, least-recently-used order, `touch`
//! resetting age (R20), capacity never exceeded and counters consistent under random
//! sequences (proptest, fixed seed), and a concurrency smoke test (no timing).

use std::sync::Arc;

use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::pool::{ManualClock, MemoryPool, Pool, PoolError};
use proptest::prelude::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL_MS: u64 = 10_000;

/// A memory pool with Mooncake's ratios, the given capacity, and a manual clock at 0.
fn memory_pool(capacity_bytes: u64) -> Result<(Arc<dyn Pool>, Arc<ManualClock>), PoolError> {
    let clock = Arc::new(ManualClock::new(0));
    let policy = EvictionPolicy {
        lease_ttl_ms: TTL_MS,
        ..EvictionPolicy::mooncake_defaults(capacity_bytes)
    };
    let pool: Arc<dyn Pool> = Arc::new(MemoryPool::new(policy, clock.clone())?);
    Ok((pool, clock))
}

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

// ---- contract checks, each on any pool ----

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
    let results = pool.put(&["i/a"], &[&[0xff; 24]]);
    assert_eq!(results, vec![Err(PoolError::AlreadyExists)]);
    let mut buffer = vec![0u8; 64];
    assert_eq!(pool.get_into(&["i/a"], &mut [&mut buffer]), vec![Ok(16)]);
    assert_eq!(&buffer[..16], &payload("i/a", 16)[..]);
    let after = pool.counters();
    assert_eq!(after.used_bytes, before.used_bytes);
    assert_eq!(after.puts, before.puts);
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

/// Capacity 400 bytes, objects of 100: a fourth object crosses the 90% watermark.
/// A probe of a present key grants a lease, so presence is probed only where that is wanted.
fn check_leased_objects_survive_eviction(pool: &dyn Pool, clock: &ManualClock) -> TestResult {
    put_all(pool, &["l/a", "l/b", "l/c"], 100)?;
    assert_eq!(present(pool, &["l/a", "l/b"])?, [true, true]); // leased until TTL_MS
    clock.advance_ms(1);
    put_all(pool, &["l/d"], 100)?; // the pass takes c, the only unleased object
    assert_eq!(present(pool, &["l/c"])?, [false]);
    put_all(pool, &["l/e"], 100)?; // d goes: newest, but a put grants no lease
    assert_eq!(present(pool, &["l/d"])?, [false]);
    assert_eq!(present(pool, &["l/e"])?, [true]);
    put_all(pool, &["l/f"], 100)?; // fits; nothing unleased to evict at the watermark
    assert_eq!(present(pool, &["l/f"])?, [true]);
    let results = pool.put(&["l/g"], &[&payload("l/g", 100)[..]]);
    assert!(
        matches!(results[0], Err(PoolError::NoSpace { .. })),
        "{results:?}"
    );
    assert_eq!(
        present(pool, &["l/a", "l/b", "l/e", "l/f"])?,
        [true, true, true, true]
    );
    let counters = pool.counters();
    assert_eq!((counters.put_rejected, counters.evicted_objects), (1, 2));
    assert!(counters.used_bytes <= counters.capacity_bytes);
    // Once the leases lapse the least recently accessed goes first.
    clock.advance_ms(TTL_MS + 1);
    put_all(pool, &["l/g"], 100)?;
    assert_eq!(present(pool, &["l/a"])?, [false]);
    Ok(())
}

/// put a, b, c; read a; let the lease lapse; fill: b goes first, then c, then a.
/// Only absent keys are probed between puts (a probe of a present key changes its age).
fn check_lru_order(pool: &dyn Pool, clock: &ManualClock) -> TestResult {
    put_all(pool, &["o/a", "o/b", "o/c"], 100)?;
    let mut buffer = vec![0u8; 100];
    assert_eq!(pool.get_into(&["o/a"], &mut [&mut buffer]), vec![Ok(100)]);
    clock.advance_ms(TTL_MS + 1);
    put_all(pool, &["o/d"], 100)?;
    assert_eq!(present(pool, &["o/b"])?, [false]);
    put_all(pool, &["o/e"], 100)?;
    assert_eq!(present(pool, &["o/c"])?, [false]);
    put_all(pool, &["o/f"], 100)?;
    assert_eq!(present(pool, &["o/a"])?, [false]);
    assert_eq!(present(pool, &["o/d", "o/e", "o/f"])?, [true, true, true]);
    assert_eq!(pool.counters().evicted_objects, 3);
    Ok(())
}

/// A touch moves an old object to the young end: the next eviction takes another.
fn check_touch_resets_age(pool: &dyn Pool, clock: &ManualClock) -> TestResult {
    put_all(pool, &["t/a", "t/b", "t/c"], 100)?;
    clock.advance_ms(1);
    assert_eq!(pool.touch(&["t/a", "t/missing"]), vec![Ok(true), Ok(false)]);
    clock.advance_ms(TTL_MS + 1); // the touch's lease has lapsed, only its age counts
    put_all(pool, &["t/d"], 100)?;
    assert_eq!(
        present(pool, &["t/a", "t/b", "t/c", "t/d"])?,
        [true, false, true, true]
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
                    let results = pool.put(&[&name], &[&payload(&name, LEN)]);
                    assert_eq!(results, vec![Ok(())]);
                    // Read back a key another thread may be writing right now.
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
    let counters = pool.counters();
    assert_eq!(counters.puts, (THREADS * KEYS) as u64);
    assert_eq!(counters.evicted_objects, 0);
}

// ---- the memory pool runs every check ----

#[test]
fn memory_pool_per_key_results_on_mixed_batches() -> TestResult {
    let (pool, _) = memory_pool(1 << 20)?;
    check_per_key_results_on_mixed_batches(pool.as_ref())
}

#[test]
fn memory_pool_objects_are_immutable() -> TestResult {
    let (pool, _) = memory_pool(1 << 20)?;
    check_objects_are_immutable(pool.as_ref())
}

#[test]
fn memory_pool_get_into_too_small_buffer() -> TestResult {
    let (pool, _) = memory_pool(1 << 20)?;
    check_get_into_too_small_buffer(pool.as_ref())
}

#[test]
fn memory_pool_batch_shape_mismatch() -> TestResult {
    let (pool, _) = memory_pool(1 << 20)?;
    check_batch_shape_mismatch(pool.as_ref())
}

#[test]
fn memory_pool_leased_objects_survive_eviction_r14() -> TestResult {
    let (pool, clock) = memory_pool(400)?;
    check_leased_objects_survive_eviction(pool.as_ref(), &clock)
}

#[test]
fn memory_pool_lru_order() -> TestResult {
    let (pool, clock) = memory_pool(400)?;
    check_lru_order(pool.as_ref(), &clock)
}

#[test]
fn memory_pool_touch_resets_age_r20() -> TestResult {
    let (pool, clock) = memory_pool(400)?;
    check_touch_resets_age(pool.as_ref(), &clock)
}

#[test]
fn memory_pool_concurrent_puts_and_gets_keep_bytes_intact() -> TestResult {
    let (pool, _) = memory_pool(1 << 20)?;
    check_concurrent_puts_and_gets_keep_bytes_intact(pool.as_ref());
    Ok(())
}

// ---- random sequences: capacity and counters ----

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<(u8, usize)>),
    Get(Vec<u8>),
    Exists(Vec<u8>),
    Touch(Vec<u8>),
    Advance(u64),
}

fn arb_op() -> impl Strategy<Value = Op> {
    let keys = || prop::collection::vec(0u8..24, 1..5);
    prop_oneof![
        4 => prop::collection::vec((0u8..24, 1usize..300), 1..5).prop_map(Op::Put),
        2 => keys().prop_map(Op::Get),
        2 => keys().prop_map(Op::Exists),
        1 => keys().prop_map(Op::Touch),
        1 => (0u64..2 * TTL_MS).prop_map(Op::Advance),
    ]
}

/// What the checks below track from outside the pool.
#[derive(Default)]
struct Tally {
    lookups: u64,
    stored_bytes: u64,
    read_bytes: u64,
    ever_stored: std::collections::BTreeSet<String>,
}

fn apply(
    pool: &dyn Pool,
    clock: &ManualClock,
    op: &Op,
    tally: &mut Tally,
) -> Result<(), TestCaseError> {
    let name = |k: &u8| format!("p/{k}");
    match op {
        Op::Put(items) => {
            let keys: Vec<String> = items.iter().map(|(k, _)| name(k)).collect();
            let values: Vec<Vec<u8>> = keys
                .iter()
                .zip(items)
                .map(|(key, (_, len))| payload(key, *len))
                .collect();
            let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            let results = pool.put(&key_refs, &slices);
            prop_assert_eq!(results.len(), keys.len());
            for ((key, value), result) in keys.iter().zip(&values).zip(results) {
                match result {
                    Ok(()) => {
                        tally.stored_bytes += value.len() as u64;
                        tally.ever_stored.insert(key.clone());
                    }
                    Err(PoolError::AlreadyExists | PoolError::NoSpace { .. }) => {}
                    Err(other) => prop_assert!(false, "unexpected put error {other}"),
                }
            }
        }
        Op::Get(keys) => {
            let names: Vec<String> = keys.iter().map(name).collect();
            let key_refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut buffers: Vec<Vec<u8>> = names.iter().map(|_| vec![0u8; 300]).collect();
            let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
            let results = pool.get_into(&key_refs, &mut slices);
            prop_assert_eq!(results.len(), names.len());
            tally.lookups += names.len() as u64;
            for ((key, buffer), result) in names.iter().zip(&buffers).zip(results) {
                match result {
                    Ok(len) => {
                        prop_assert!(
                            tally.ever_stored.contains(key),
                            "found {} never stored",
                            key
                        );
                        // The key fixes the bytes; immutability means any length read is the
                        // length written, whose prefix matches this pattern.
                        prop_assert_eq!(&buffer[..len], &payload(key, len)[..]);
                        tally.read_bytes += len as u64;
                    }
                    Err(PoolError::NotFound) => {}
                    Err(other) => prop_assert!(false, "unexpected get error {other}"),
                }
            }
        }
        Op::Exists(keys) | Op::Touch(keys) => {
            let names: Vec<String> = keys.iter().map(name).collect();
            let key_refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let results = if matches!(op, Op::Exists(_)) {
                tally.lookups += names.len() as u64;
                pool.exists(&key_refs)
            } else {
                pool.touch(&key_refs)
            };
            prop_assert_eq!(results.len(), names.len());
            for (key, result) in names.iter().zip(results) {
                if result == Ok(true) {
                    prop_assert!(
                        tally.ever_stored.contains(key),
                        "found {} never stored",
                        key
                    );
                }
            }
        }
        Op::Advance(ms) => {
            clock.advance_ms(*ms);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x706f_6f6c),
        ..ProptestConfig::default()
    })]

    /// After every op: used <= capacity, and the counters agree with what was observed.
    #[test]
    fn memory_pool_never_exceeds_capacity_and_counts_consistently(
        ops in prop::collection::vec(arb_op(), 1..60),
        capacity in 300u64..3_000,
    ) {
        let (pool, clock) = memory_pool(capacity).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut tally = Tally::default();
        for op in &ops {
            apply(pool.as_ref(), &clock, op, &mut tally)?;
            let c = pool.counters();
            prop_assert!(c.used_bytes <= c.capacity_bytes, "{} > {}", c.used_bytes, c.capacity_bytes);
            prop_assert_eq!(c.capacity_bytes, capacity);
            prop_assert_eq!(c.bytes_written, tally.stored_bytes);
            prop_assert_eq!(c.bytes_read, tally.read_bytes);
            prop_assert_eq!(c.hits + c.misses, tally.lookups);
            prop_assert_eq!(c.objects, c.puts - c.evicted_objects);
            prop_assert_eq!(c.used_bytes, c.bytes_written - c.evicted_bytes);
        }
    }
}
