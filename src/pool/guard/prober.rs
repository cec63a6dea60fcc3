//! The health state a [`GuardedPool`](super::GuardedPool) shares with its prober thread,
//! and the prober: while the pool is unreachable it probes it on the backoff schedule of
//! `core::pool_health` until a probe is answered.
//!
//! Logging is here, outside every lock: one WARN per outage, one INFO per recovery.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::runner::CallRunner;
use super::{outcome_of, probe_off_thread};
use crate::core::pool_health::{CallOutcome, Gate, HealthMachine, HealthPolicy, Transition};
use crate::pool::Pool;
use crate::stats::PoolHealthStats;

/// The key the background probe asks for: any key works, an answer of "absent" shows the
/// pool is reachable.
pub(super) const PROBE_KEY: &str = "kvc-health-probe";

/// The health machine and the counters of one guarded pool.
#[derive(Debug)]
pub(super) struct Shared {
    machine: Mutex<HealthMachine>,
    /// Wakes the prober: the pool became unreachable, or the guard is stopping.
    wake: Condvar,
    stopping: AtomicBool,
    outages: AtomicU64,
    calls_refused: AtomicU64,
    calls_timed_out: AtomicU64,
    /// Milliseconds of the outages that ended.
    down_ms: AtomicU64,
    pool: &'static str,
    instance: String,
}

impl Shared {
    pub(super) fn new(policy: HealthPolicy, pool: &'static str, instance: String) -> Self {
        Self {
            machine: Mutex::new(HealthMachine::new(policy)),
            wake: Condvar::new(),
            stopping: AtomicBool::new(false),
            outages: AtomicU64::new(0),
            calls_refused: AtomicU64::new(0),
            calls_timed_out: AtomicU64::new(0),
            down_ms: AtomicU64::new(0),
            pool,
            instance,
        }
    }

    pub(super) fn gate(&self, now: Instant) -> Gate {
        self.machine.lock().gate(now)
    }

    pub(super) fn count_refused(&self) {
        self.calls_refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn count_timed_out(&self) {
        self.calls_timed_out.fetch_add(1, Ordering::Relaxed);
    }

    /// Records an ordinary call's outcome; wakes the prober when the pool became
    /// unreachable.
    pub(super) fn record(&self, now: Instant, outcome: CallOutcome) {
        let transition = self.machine.lock().record(now, outcome);
        if matches!(transition, Some(Transition::BecameUnreachable { .. })) {
            self.wake.notify_all();
        }
        self.report(transition);
    }

    /// Logs and counts a transition (module docs).
    fn report(&self, transition: Option<Transition>) {
        let (pool, instance) = (self.pool, self.instance.as_str());
        match transition {
            None => {}
            Some(Transition::Degraded) => {
                tracing::debug!(instance, pool, "pool degraded: a call failed");
            }
            Some(Transition::Healthy) => {
                tracing::debug!(instance, pool, "pool healthy again");
            }
            Some(Transition::BecameUnreachable { failures, retry_in }) => {
                self.outages.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    instance,
                    pool,
                    failures,
                    retry_in_ms = millis(retry_in),
                    "pool unreachable: lookups offer nothing and saves are dropped until a background probe reaches it"
                );
            }
            Some(Transition::Recovered {
                down_for,
                failed_probes,
            }) => {
                self.down_ms.fetch_add(millis(down_for), Ordering::Relaxed);
                tracing::info!(
                    instance,
                    pool,
                    down_ms = millis(down_for),
                    failed_probes,
                    calls_refused = self.calls_refused.load(Ordering::Relaxed),
                    "pool reachable again"
                );
            }
        }
    }

    /// The health now, with the counters.
    pub(super) fn snapshot(&self) -> PoolHealthStats {
        let (state, down_now) = {
            let machine = self.machine.lock();
            (machine.state(), machine.down_for(Instant::now()))
        };
        PoolHealthStats {
            state: state.as_str(),
            outages: self.outages.load(Ordering::Relaxed),
            unreachable_ms: self.down_ms.load(Ordering::Relaxed) + millis(down_now),
            calls_refused: self.calls_refused.load(Ordering::Relaxed),
            calls_timed_out: self.calls_timed_out.load(Ordering::Relaxed),
        }
    }

    /// The current state.
    #[cfg(test)]
    pub(super) fn state(&self) -> crate::core::pool_health::PoolHealth {
        self.machine.lock().state()
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The prober thread of one guarded pool.
pub(super) struct Prober {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Prober {
    /// Starts the thread; it sleeps until the pool becomes unreachable. Without a thread
    /// (the system refused one) the pool still works, but an outage never ends: logged.
    pub(super) fn start(
        pool: Arc<dyn Pool>,
        shared: Arc<Shared>,
        runner: CallRunner,
        probe_timeout: Duration,
    ) -> Self {
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("kvc-pool-prober".into())
            .spawn(move || probe_while_unreachable(&pool, &for_thread, &runner, probe_timeout))
            .map_err(|err| tracing::error!(error = %err, "could not start the pool prober thread; an outage would not end"))
            .ok();
        Self { shared, thread }
    }

    /// Stops the thread and joins it: it ends at once, or after the probe it is running
    /// (at most `pool.probe_timeout_ms`).
    pub(super) fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        {
            // Taken so that the prober is either waiting (and woken) or will see the flag.
            let _machine = self.shared.machine.lock();
            self.shared.wake.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the pool prober thread panicked");
            }
        }
    }
}

/// The prober's loop: wait until a probe is due, probe, record; until stopped.
fn probe_while_unreachable(
    pool: &Arc<dyn Pool>,
    shared: &Shared,
    runner: &CallRunner,
    probe_timeout: Duration,
) {
    loop {
        {
            let mut machine = shared.machine.lock();
            loop {
                if shared.stopping.load(Ordering::SeqCst) {
                    return;
                }
                let now = Instant::now();
                match machine.probe_due(now) {
                    None => shared.wake.wait(&mut machine),
                    Some(wait) if !wait.is_zero() => {
                        let _ = shared.wake.wait_for(&mut machine, wait);
                    }
                    Some(_) => {
                        if machine.begin_probe(now) {
                            break;
                        }
                    }
                }
            }
        }
        let outcome = if pool.calls_may_block() {
            probe_off_thread(runner, pool, &[PROBE_KEY], probe_timeout, |pool, keys| {
                pool.exists(keys)
            })
            .ok()
            .and_then(|results| outcome_of(&results))
        } else {
            outcome_of(&pool.exists(&[PROBE_KEY]))
        };
        let outcome = outcome.unwrap_or(CallOutcome::Failed);
        let transition = shared.machine.lock().record_probe(Instant::now(), outcome);
        shared.report(transition);
    }
}
