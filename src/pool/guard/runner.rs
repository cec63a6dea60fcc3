//! Running a pool call off the caller's thread with a deadline, with a bounded number of
//! calls running at once.
//!
//! A call inside a backend's client (Mooncake's, through Python) cannot be cancelled, so a
//! deadline can only be kept by not waiting for it: each call runs on a thread of its own,
//! and the caller waits for its answer until the deadline. A call that outlives its
//! deadline keeps running to its end (the backend's own timeout bounds it); its answer is
//! then dropped and its thread ends.
//!
//! # Invariants
//!
//! - `guard::runner::R1`. At most `limit` calls run at once, counting those past their
//!   deadline: a call takes a slot before its thread starts and gives it back when the
//!   call returns. A caller that finds no slot waits for one until its deadline, so a
//!   hung pool cannot pile up threads.
//! - `guard::runner::R2`. The caller gets an answer or [`Missed`] by its deadline, never
//!   later (up to thread scheduling).
//! - `guard::runner::R3`. Only owned data crosses to the call's thread: a call that outlives
//!   its caller touches nothing the caller owns.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Why a call gave no answer by its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Missed {
    /// The call ran and had not answered by the deadline.
    Deadline,
    /// Every slot was taken until the deadline (calls past their deadlines still running).
    NoSlot,
}

/// The slots of running calls.
#[derive(Debug)]
struct Slots {
    running: Mutex<usize>,
    freed: Condvar,
    limit: usize,
}

impl Slots {
    /// Takes a slot, waiting until `deadline` for one (`guard::runner::R1`).
    fn take(self: &Arc<Self>, deadline: Instant) -> Option<Slot> {
        let mut running = self.running.lock();
        while *running >= self.limit {
            if self.freed.wait_until(&mut running, deadline).timed_out() && *running >= self.limit {
                return None;
            }
        }
        *running += 1;
        Some(Slot(Arc::clone(self)))
    }
}

/// A taken slot, given back when dropped (on the call's thread, when the call returns).
struct Slot(Arc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        let mut running = self.0.running.lock();
        *running = running.saturating_sub(1);
        self.0.freed.notify_one();
    }
}

/// Runs calls on threads of their own, at most `limit` at once (module docs).
#[derive(Clone, Debug)]
pub(crate) struct CallRunner {
    slots: Arc<Slots>,
}

impl CallRunner {
    /// A runner of at most `limit` calls at once (at least one).
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            slots: Arc::new(Slots {
                running: Mutex::new(0),
                freed: Condvar::new(),
                limit: limit.max(1),
            }),
        }
    }

    /// Calls running now, those past their deadline included.
    #[cfg(feature = "internals")]
    pub(crate) fn running(&self) -> usize {
        *self.slots.running.lock()
    }

    /// Runs `call` on a thread of its own and waits for its answer until `timeout` from
    /// now (`guard::runner::R2`). A panic inside the call is resumed on the caller's thread
    /// if it comes before the deadline.
    pub(crate) fn run<T, F>(&self, timeout: Duration, call: F) -> Result<T, Missed>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let deadline = Instant::now() + timeout;
        let Some(slot) = self.slots.take(deadline) else {
            return Err(Missed::NoSlot);
        };
        let (answer, answered) = flume::bounded(1);
        let spawned = std::thread::Builder::new()
            .name("kvc-pool-call".into())
            .spawn(move || {
                let _slot = slot;
                // The caller may be gone (deadline passed): the answer is then dropped.
                let _ = answer.send(catch_unwind(AssertUnwindSafe(call)));
            });
        if spawned.is_err() {
            // The closure, and the slot in it, were dropped with the error.
            return Err(Missed::NoSlot);
        }
        match answered.recv_deadline(deadline) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(panic)) => resume_unwind(panic),
            Err(_) => Err(Missed::Deadline),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_in_time_come_back_and_late_ones_miss_without_waiting_for_them() {
        let runner = CallRunner::new(2);
        assert_eq!(runner.run(Duration::from_secs(5), || 7), Ok(7));
        let (release, released) = flume::bounded::<()>(0);
        // The call only returns once `release` is dropped, below: the caller's answer
        // came without waiting for it.
        let late = runner.run(Duration::from_millis(20), move || {
            let _ = released.recv();
        });
        assert_eq!(late, Err(Missed::Deadline));
        assert_eq!(runner.running(), 1, "the late call still holds its slot");
        drop(release);
        let deadline = Instant::now() + Duration::from_secs(5);
        while runner.running() > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(
            runner.running(),
            0,
            "the slot came back when the call returned"
        );
    }

    #[test]
    fn hung_calls_never_hold_more_than_the_limit_of_threads_r1() {
        let runner = CallRunner::new(3);
        let (release, released) = flume::bounded::<()>(0);
        for _ in 0..10 {
            let released = released.clone();
            let missed = runner.run(Duration::from_millis(5), move || {
                let _ = released.recv();
            });
            assert!(missed.is_err());
            assert!(runner.running() <= 3, "{} calls running", runner.running());
        }
        assert_eq!(runner.running(), 3);
        assert_eq!(
            runner.run(Duration::from_millis(5), || ()),
            Err(Missed::NoSlot),
            "every slot is held by a hung call"
        );
        drop(release);
        drop(released);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut answered = runner.run(Duration::from_millis(5), || 1);
        while answered.is_err() && Instant::now() < deadline {
            answered = runner.run(Duration::from_millis(50), || 1);
        }
        assert_eq!(answered, Ok(1), "slots came back once the calls returned");
    }

    #[test]
    fn a_panicking_call_panics_its_caller() {
        let runner = CallRunner::new(1);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            runner.run(Duration::from_secs(5), || -> u8 {
                resume_unwind(Box::new("pool client panicked"))
            })
        }));
        assert!(caught.is_err());
        let deadline = Instant::now() + Duration::from_secs(5);
        while runner.running() > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(runner.running(), 0);
    }
}
