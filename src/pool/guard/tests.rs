//! Unit tests of the guard over a scripted pool that answers, fails or hangs on command.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};

use super::*;
use crate::core::pool_health::PoolHealth;

/// What the scripted pool does with each call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Every key absent.
    Up,
    /// Every key `Unavailable` at once.
    Down,
    /// Blocks until the mode changes, then answers as the new mode.
    Hang,
}

struct Scripted {
    mode: Mutex<Mode>,
    changed: Condvar,
    /// Calls made, the prober's excepted.
    calls: AtomicU64,
}

impl Scripted {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            mode: Mutex::new(Mode::Up),
            changed: Condvar::new(),
            calls: AtomicU64::new(0),
        })
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock() = mode;
        self.changed.notify_all();
    }

    /// Answers `keys` as the mode says; counts the call unless it is the prober's.
    fn answer<T>(&self, keys: &[&str], up: impl Fn() -> T) -> Vec<Result<T, PoolError>> {
        if keys.first() != Some(&prober::PROBE_KEY) {
            self.calls.fetch_add(1, Ordering::SeqCst);
        }
        let keys = keys.len();
        let mut mode = self.mode.lock();
        while *mode == Mode::Hang {
            self.changed.wait(&mut mode);
        }
        match *mode {
            Mode::Down => PoolError::Unavailable.for_every_key(keys),
            _ => (0..keys).map(|_| Ok(up())).collect(),
        }
    }
}

impl Pool for Scripted {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.answer(keys, || false)
    }
    fn put(&self, keys: &[&str], _values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.answer(keys, || ())
    }
    fn get_into(&self, keys: &[&str], _buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        self.answer(keys, || 0)
    }
    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.answer(keys, || false)
    }
    fn counters(&self) -> PoolCounters {
        PoolCounters::default()
    }
    fn name(&self) -> &'static str {
        "scripted"
    }
}

fn guarded(inner: &Arc<Scripted>, calls_in_flight: usize) -> GuardedPool {
    GuardedPool::new(
        Arc::clone(inner) as Arc<dyn Pool>,
        GuardSettings {
            probe_timeout: Duration::from_millis(30),
            calls_in_flight: NonZeroUsize::new(calls_in_flight).unwrap_or(NonZeroUsize::MIN),
            health: HealthPolicy {
                unreachable_after: NonZeroU32::new(3).unwrap_or(NonZeroU32::MIN),
                retry_initial: Duration::from_millis(5),
                retry_max: Duration::from_millis(20),
            },
            instance: "test".to_owned(),
        },
    )
}

/// Waits (bounded) until the guard's state is `state`.
fn wait_for(guard: &GuardedPool, state: PoolHealth) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while guard.shared.state() != state {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

#[test]
fn a_hung_probe_answers_timeout_per_key_while_the_pool_still_hangs_c2() {
    let inner = Scripted::new();
    let guard = guarded(&inner, 4);
    inner.set(Mode::Hang);
    // The scripted pool answers only after `Up` is set below.
    let answers = guard.exists(&["a", "b"]);
    assert_eq!(answers.len(), 2);
    assert!(answers
        .iter()
        .all(|answer| matches!(answer, Err(PoolError::Timeout { .. }))));
    assert_eq!(guard.health().snapshot().calls_timed_out, 1);
    assert_eq!(guard.shared.state(), PoolHealth::Degraded);
    inner.set(Mode::Up);
    assert_eq!(guard.exists(&["a"]), vec![Ok(false)]);
    assert_eq!(guard.shared.state(), PoolHealth::Healthy);
}

#[test]
fn three_failed_calls_make_it_unreachable_then_calls_are_refused_without_reaching_the_pool_c3() {
    let inner = Scripted::new();
    let guard = guarded(&inner, 4);
    inner.set(Mode::Down);
    for _ in 0..3 {
        assert_eq!(guard.exists(&["k"]), vec![Err(PoolError::Unavailable)]);
    }
    assert_eq!(guard.shared.state(), PoolHealth::Unreachable);
    // Hanging now: a call that reached the pool would not come back.
    inner.set(Mode::Hang);
    let made = inner.calls.load(Ordering::SeqCst);
    let mut buffer = [0u8; 4];
    let gets = guard.get_into(&["k"], &mut [&mut buffer[..]]);
    let puts = guard.put(&["k"], &[&[1u8][..]]);
    let probes = guard.exists(&["k", "l"]);
    assert!(matches!(gets[..], [Err(PoolError::Unreachable { .. })]));
    assert!(matches!(puts[..], [Err(PoolError::Unreachable { .. })]));
    assert_eq!(probes.len(), 2);
    assert!(probes
        .iter()
        .all(|answer| matches!(answer, Err(PoolError::Unreachable { .. }))));
    assert!(guard.lend(&["k"]).is_none());
    assert!(guard.unregister_staging(0).is_err());
    let snapshot = guard.health().snapshot();
    assert_eq!(snapshot.state, "unreachable");
    assert_eq!(snapshot.outages, 1);
    assert_eq!(snapshot.calls_refused, 4);
    assert_eq!(
        inner.calls.load(Ordering::SeqCst),
        made,
        "a refused call reached the pool"
    );
    inner.set(Mode::Up);
}

#[test]
fn the_prober_finds_the_pool_again_and_calls_go_out_once_more() {
    let inner = Scripted::new();
    let guard = guarded(&inner, 4);
    inner.set(Mode::Down);
    for _ in 0..3 {
        guard.touch(&["k"]);
    }
    assert_eq!(guard.shared.state(), PoolHealth::Unreachable);
    inner.set(Mode::Up);
    assert!(wait_for(&guard, PoolHealth::Healthy), "never recovered");
    assert_eq!(guard.exists(&["k"]), vec![Ok(false)]);
    let snapshot = guard.health().snapshot();
    assert_eq!((snapshot.state, snapshot.outages), ("healthy", 1));
}

#[test]
fn per_key_errors_and_absent_answers_keep_the_pool_healthy() {
    assert_eq!(outcome_of::<bool>(&[]), None);
    assert_eq!(
        outcome_of(&[Ok(false), Err(PoolError::Unavailable)]),
        Some(CallOutcome::Answered)
    );
    assert_eq!(
        outcome_of::<bool>(&[Err(PoolError::NotFound), Err(PoolError::Unavailable)]),
        Some(CallOutcome::Answered)
    );
    assert_eq!(
        outcome_of::<bool>(&[
            Err(PoolError::Timeout { after_ms: 1 }),
            Err(PoolError::Unavailable)
        ]),
        Some(CallOutcome::Failed)
    );
}

#[test]
fn hung_probes_hold_at_most_calls_in_flight_threads() {
    let inner = Scripted::new();
    let guard = guarded(&inner, 2);
    inner.set(Mode::Hang);
    // Two failures: degraded, not yet unreachable, so every call is tried.
    for _ in 0..2 {
        guard.exists(&["k"]);
        assert!(guard.calls_running() <= 2);
    }
    assert_eq!(guard.calls_running(), 2);
    assert_eq!(guard.shared.state(), PoolHealth::Degraded);
    // No slot left: the third probe fails at its deadline without a thread.
    let made = inner.calls.load(Ordering::SeqCst);
    guard.exists(&["k"]);
    assert_eq!(
        inner.calls.load(Ordering::SeqCst),
        made,
        "a third thread started"
    );
    assert_eq!(guard.shared.state(), PoolHealth::Unreachable);
    inner.set(Mode::Up);
}

#[test]
fn put_outcomes_tell_stored_from_refused_and_keep_outages_failed() {
    let full = || Err(PoolError::Backend { code: -200 });
    assert_eq!(put_outcome(&[Ok(()), full()]), Some(CallOutcome::PutStored));
    assert_eq!(
        put_outcome(&[Err(PoolError::AlreadyExists), full()]),
        Some(CallOutcome::PutRefused)
    );
    assert_eq!(
        put_outcome(&[Err(PoolError::AlreadyExists)]),
        Some(CallOutcome::Answered),
        "every key present: nothing was refused"
    );
    assert_eq!(
        put_outcome(&[Err(PoolError::Unavailable)]),
        Some(CallOutcome::Failed)
    );
    assert_eq!(put_outcome(&[]), None);
}

/// `pool_health::H6` through the guard: an embedded pool too small for an object refuses
/// its put and its allocation; the pool reads degraded, an answered probe leaves it so, a
/// put that stores makes it healthy.
#[test]
fn refused_puts_and_allocations_degrade_the_pool_until_a_put_stores() -> Result<(), PoolError> {
    let clock = Arc::new(crate::pool::ManualClock::new(0));
    let memory = crate::pool::MemoryPool::new(
        crate::core::eviction::EvictionPolicy::mooncake_defaults(1024),
        clock,
    )?;
    let inner: Arc<dyn Pool> = Arc::new(memory);
    let guard = GuardedPool::new(
        inner,
        GuardSettings {
            probe_timeout: Duration::from_millis(30),
            calls_in_flight: NonZeroUsize::MIN,
            health: HealthPolicy {
                unreachable_after: NonZeroU32::MIN,
                retry_initial: Duration::from_millis(5),
                retry_max: Duration::from_millis(20),
            },
            instance: "test".to_owned(),
        },
    );
    let big = vec![0u8; 4096];
    assert!(matches!(
        guard.put(&["big"], &[&big])[..],
        [Err(PoolError::NoSpace { .. })]
    ));
    assert_eq!(guard.shared.state(), PoolHealth::Degraded);
    assert_eq!(guard.exists(&["big"]), vec![Ok(false)]);
    assert_eq!(
        guard.shared.state(),
        PoolHealth::Degraded,
        "an answered probe does not make a pool that refuses puts healthy"
    );
    assert_eq!(guard.put(&["small"], &[&[1u8; 16]]), vec![Ok(())]);
    assert_eq!(guard.shared.state(), PoolHealth::Healthy);
    if let Some(allocated) = guard.alloc_objects(&[4096]) {
        assert!(allocated[0].is_err());
        assert_eq!(guard.shared.state(), PoolHealth::Degraded);
    }
    Ok(())
}
