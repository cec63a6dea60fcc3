//! Injectable milliseconds clocks for pool leases (`docs/DESIGN.md` section 10).
//!
//! A pool grants a lease of `kv_lease_ttl` on every probe and get, and an object under a
//! lease is never evicted. Lease expiry compares against a clock the pool is given, so
//! that tests and the replay simulator can drive time themselves:
//!
//! - [`SystemClock`]: real, monotonic time in milliseconds since the clock was created.
//! - [`ManualClock`]: time that only moves when told to (`advance_ms`, `set_ms`); safe to
//!   share between threads (one atomic), so a test or the replay driver can hold an
//!   `Arc<ManualClock>` while the pool holds the same clock as `Arc<dyn PoolClock>`.
//!
//! Invariants:
//! - `clock::I1`. [`SystemClock::now_ms`] never decreases.
//! - `clock::I2`. [`ManualClock::now_ms`] returns exactly the last value set or advanced to.

#[cfg(any(feature = "replay", feature = "internals"))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A source of the current time in milliseconds, for lease expiry.
///
/// Only differences between readings matter; the origin is up to the clock.
pub trait PoolClock: Send + Sync {
    /// The current time in milliseconds.
    fn now_ms(&self) -> u64;
}

/// Monotonic wall time in milliseconds since this clock was created.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    /// The origin; `Instant` is monotonic, which gives `clock::I1`.
    started: Instant,
}

impl SystemClock {
    /// A clock reading 0 now.
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl PoolClock for SystemClock {
    fn now_ms(&self) -> u64 {
        // Saturates after ~584 million years, which is fine.
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to: for tests and for simulated time in replay.
#[cfg(any(feature = "replay", feature = "internals"))]
#[derive(Debug, Default)]
pub struct ManualClock {
    /// Current time in ms. Relaxed ordering is enough: readers need the value, not an
    /// ordering with other memory (the pool's own lock orders its state).
    now_ms: AtomicU64,
}

#[cfg(any(feature = "replay", feature = "internals"))]
impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now_ms: AtomicU64::new(start_ms),
        }
    }

    /// Moves the clock forward by `delta_ms` (saturating) and returns the new time.
    #[cfg(feature = "internals")]
    pub fn advance_ms(&self, delta_ms: u64) -> u64 {
        let mut current = self.now_ms.load(Ordering::Relaxed);
        loop {
            let next = current.saturating_add(delta_ms);
            match self.now_ms.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(seen) => current = seen,
            }
        }
    }

    /// Sets the clock to `now_ms`. Moving it backwards is allowed (a simulator may reset);
    /// leases then last longer in wall terms, never shorter.
    pub fn set_ms(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::Relaxed);
    }
}

#[cfg(any(feature = "replay", feature = "internals"))]
impl PoolClock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn manual_clock_reads_what_was_set_and_advanced_i2() {
        let clock = ManualClock::new(5);
        assert_eq!(clock.now_ms(), 5);
        assert_eq!(clock.advance_ms(10), 15);
        assert_eq!(clock.now_ms(), 15);
        clock.set_ms(3);
        assert_eq!(clock.now_ms(), 3);
        clock.set_ms(u64::MAX - 1);
        assert_eq!(clock.advance_ms(10), u64::MAX);
    }

    #[test]
    fn manual_clock_is_shared_through_dyn_pool_clock() {
        let manual = Arc::new(ManualClock::new(0));
        let shared: Arc<dyn PoolClock> = manual.clone();
        manual.advance_ms(42);
        assert_eq!(shared.now_ms(), 42);
    }

    #[test]
    fn manual_clock_advances_from_several_threads_without_losing_steps() {
        let clock = ManualClock::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        clock.advance_ms(1);
                    }
                });
            }
        });
        assert_eq!(clock.now_ms(), 4000);
    }

    #[test]
    fn system_clock_never_goes_backwards_i1() {
        let clock = SystemClock::new();
        let mut last = clock.now_ms();
        for _ in 0..1000 {
            let now = clock.now_ms();
            assert!(now >= last, "clock went from {last} to {now}");
            last = now;
        }
    }
}
