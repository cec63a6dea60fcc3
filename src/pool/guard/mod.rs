//! [`GuardedPool`]: every pool call of a connector with a deadline and the pool's health
//! (R30). The connector wraps its pool in one at start; the actors see only the wrapper.
//!
//! ```text
//!  planner / saver probes ──exists, touch──► gate ──► runner thread (deadline) ──► inner pool
//!  loaders / saver ──get, put, commit──────► gate ──► inner pool, on the caller's thread
//!                                             │
//!                          HealthMachine (core::pool_health) ◄── every call's outcome
//!                                             ▲
//!  prober thread: while unreachable, one `exists` probe at a time on the backoff schedule
//! ```
//!
//! # What each call gets
//!
//! - Every call first asks the health machine: while the pool is unreachable it is not
//!   made and every key answers [`PoolError::Unreachable`] at once (counted
//!   `calls_refused`).
//! - Probes (`exists`, `touch`) of a backend that may block ([`Pool::calls_may_block`])
//!   run on a thread of their own through a bounded [`runner`], and the caller waits until
//!   `pool.probe_timeout_ms`. Past it every key answers [`PoolError::Timeout`] and the call
//!   counts as failed; the call itself runs on until the backend returns (its own timeout,
//!   `mooncake.rpc_timeout_ms`, bounds it) and its answer is dropped. At most
//!   `pool.calls_in_flight` such calls run at once (`guard::runner::R1`).
//! - Gets, puts and commits move the caller's memory (staging slots, pool objects), which
//!   must not be written or read after the call has returned, so they run on the caller's
//!   thread: a loader's or the saver's, never the engine's. The backend's own timeout
//!   bounds them; once the pool is marked unreachable they are refused at once.
//! - A pool that answers from memory (`calls_may_block() == false`, the embedded pool) is
//!   called in place: it cannot miss a deadline.
//!
//! A call counts as failed for the pool's health when it missed its deadline, or when every
//! key answered an outage error ([`PoolError::is_outage`]); any other answer (present,
//! absent, a per-key error) shows that the pool is reachable. A put, put-absent or commit
//! that was answered and stored nothing it was asked to (every key not already present
//! refused, for want of room or otherwise), or an object allocation that refused every
//! length, counts as refused: the pool reads degraded until a put stores again
//! (`pool_health::H6`).
//!
//! # Logs
//!
//! One WARN when the pool becomes unreachable, one INFO when a probe finds it again
//! (`pool_health::H3`); the degraded state is logged at DEBUG.
//!
//! # Invariants
//!
//! - `guard::C1`. Every call answers one result per key, in key order (the [`Pool`]
//!   contract), whether it was made, refused or missed its deadline.
//! - `guard::C2`. A probe of a blocking backend answers within `pool.probe_timeout_ms`.
//! - `guard::C3`. No call is made while the pool is unreachable, except the prober's.

mod prober;
mod runner;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::pool_health::{CallOutcome, Gate, HealthPolicy};
use crate::gpu::host_memory::{HostSlot, SharedSlot};
use crate::stats::PoolHealthStats;

use super::{Pool, PoolCounters, PoolError};
use prober::{Prober, Shared};
pub(crate) use runner::{CallRunner, Missed};

/// A probe of the [`Pool`] trait (`exists` or `touch`) as a plain function, so it can run
/// on another thread with the pool and keys it is handed.
type ProbeCall = fn(&dyn Pool, &[&str]) -> Vec<Result<bool, PoolError>>;

/// How a [`GuardedPool`] treats its calls (`RuntimeConfig::pool_calls`).
#[derive(Clone, Debug)]
pub struct GuardSettings {
    /// `pool.probe_timeout_ms`.
    pub probe_timeout: Duration,
    /// `pool.calls_in_flight`.
    pub calls_in_flight: NonZeroUsize,
    /// `pool.unreachable_after_failures`, `pool.retry_initial_ms`, `pool.retry_max_ms`.
    pub health: HealthPolicy,
    /// The connector's name in log lines (`stats.instance`).
    pub instance: String,
}

impl GuardSettings {
    /// The settings of a validated configuration for the connector named `instance`.
    pub fn new(calls: &crate::config::runtime::PoolCalls, instance: &str) -> Self {
        Self {
            probe_timeout: calls.probe_timeout,
            calls_in_flight: calls.calls_in_flight,
            health: calls.health,
            instance: instance.to_owned(),
        }
    }
}

/// A pool whose calls have deadlines and whose health is tracked (module docs).
pub struct GuardedPool {
    inner: Arc<dyn Pool>,
    shared: Arc<Shared>,
    runner: CallRunner,
    probe_timeout: Duration,
    prober: Prober,
}

impl GuardedPool {
    /// Wraps `inner` and starts its prober thread (idle while the pool is reachable).
    pub fn new(inner: Arc<dyn Pool>, settings: GuardSettings) -> Self {
        let shared = Arc::new(Shared::new(
            settings.health,
            inner.name(),
            settings.instance,
        ));
        let runner = CallRunner::new(settings.calls_in_flight.get());
        let prober = Prober::start(
            Arc::clone(&inner),
            Arc::clone(&shared),
            runner.clone(),
            settings.probe_timeout,
        );
        Self {
            inner,
            shared,
            runner,
            probe_timeout: settings.probe_timeout,
            prober,
        }
    }

    /// The pool's health, readable after the pool is gone (the stats reporter's view).
    pub fn health(&self) -> HealthView {
        HealthView(Arc::clone(&self.shared))
    }

    /// Probe calls running now off their callers' threads, those past their deadline
    /// included (at most `pool.calls_in_flight`).
    #[cfg(feature = "internals")]
    pub fn calls_running(&self) -> usize {
        self.runner.running()
    }

    /// `Some(refusals)` when the pool is unreachable (`guard::C3`), counted.
    fn refuse<T>(&self, keys: usize) -> Option<Vec<Result<T, PoolError>>> {
        match self.shared.gate(Instant::now()) {
            Gate::Call => None,
            Gate::Refuse { retry_in } => {
                self.shared.count_refused();
                let retry_in_ms = u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX);
                Some(PoolError::Unreachable { retry_in_ms }.for_every_key(keys))
            }
        }
    }

    /// A call on the caller's thread: gated, and its outcome (as `outcome` reads it)
    /// recorded.
    fn in_place<T>(
        &self,
        keys: usize,
        outcome: fn(&[Result<T, PoolError>]) -> Option<CallOutcome>,
        call: impl FnOnce() -> Vec<Result<T, PoolError>>,
    ) -> Vec<Result<T, PoolError>> {
        if let Some(refused) = self.refuse(keys) {
            return refused;
        }
        let results = call();
        if let Some(outcome) = outcome(&results) {
            self.shared.record(Instant::now(), outcome);
        }
        results
    }

    /// A probe: gated, off the caller's thread with the probe deadline when the backend
    /// may block (`guard::C2`), its outcome recorded.
    fn probe(&self, keys: &[&str], call: ProbeCall) -> Vec<Result<bool, PoolError>> {
        if keys.is_empty() {
            return Vec::new();
        }
        if !self.inner.calls_may_block() {
            return self.in_place(keys.len(), outcome_of, || call(self.inner.as_ref(), keys));
        }
        if let Some(refused) = self.refuse(keys.len()) {
            return refused;
        }
        match probe_off_thread(&self.runner, &self.inner, keys, self.probe_timeout, call) {
            Ok(results) => {
                if let Some(outcome) = outcome_of(&results) {
                    self.shared.record(Instant::now(), outcome);
                }
                results
            }
            Err(timeout) => {
                self.shared.count_timed_out();
                self.shared.record(Instant::now(), CallOutcome::Failed);
                timeout.for_every_key(keys.len())
            }
        }
    }
}

/// Runs `call` on `keys` through `runner` with `timeout`; the [`PoolError::Timeout`] to
/// answer with when it misses the deadline.
fn probe_off_thread(
    runner: &CallRunner,
    inner: &Arc<dyn Pool>,
    keys: &[&str],
    timeout: Duration,
    call: ProbeCall,
) -> Result<Vec<Result<bool, PoolError>>, PoolError> {
    // `guard::runner::R3`: the call gets its own copy of the keys.
    let owned: Vec<String> = keys.iter().map(|key| (*key).to_owned()).collect();
    let pool = Arc::clone(inner);
    let answered = runner.run(timeout, move || {
        let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
        call(pool.as_ref(), &keys)
    });
    match answered {
        Ok(mut results) => {
            // `guard::C1` even for a backend that answered the wrong number of results.
            results.resize_with(keys.len(), || Err(PoolError::Unavailable));
            Ok(results)
        }
        Err(Missed::Deadline | Missed::NoSlot) => Err(PoolError::Timeout {
            after_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }),
    }
}

/// How a call that was made ended for the pool's health: failed when every key answered
/// an outage error, answered otherwise; `None` for an empty answer.
fn outcome_of<T>(results: &[Result<T, PoolError>]) -> Option<CallOutcome> {
    if results.is_empty() {
        return None;
    }
    let unreachable = results
        .iter()
        .all(|result| result.as_ref().is_err_and(PoolError::is_outage));
    Some(if unreachable {
        CallOutcome::Failed
    } else {
        CallOutcome::Answered
    })
}

/// How a put that was made ended for the pool's health: failed as any call
/// ([`outcome_of`]); else stored when some key was stored, refused when none was and some
/// key got a refusal (not an outage error, not `AlreadyExists`), answered otherwise.
fn put_outcome(results: &[Result<(), PoolError>]) -> Option<CallOutcome> {
    let refusal = |result: &Result<(), PoolError>| {
        result
            .as_ref()
            .is_err_and(|error| !error.is_outage() && *error != PoolError::AlreadyExists)
    };
    Some(match outcome_of(results)? {
        CallOutcome::Answered if results.iter().any(Result::is_ok) => CallOutcome::PutStored,
        CallOutcome::Answered if results.iter().any(refusal) => CallOutcome::PutRefused,
        outcome => outcome,
    })
}

impl Pool for GuardedPool {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.probe(keys, |pool, keys| pool.exists(keys))
    }

    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.in_place(keys.len(), put_outcome, || self.inner.put(keys, values))
    }

    fn put_absent(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.in_place(keys.len(), put_outcome, || {
            self.inner.put_absent(keys, values)
        })
    }

    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        self.in_place(keys.len(), outcome_of, || {
            self.inner.get_into(keys, buffers)
        })
    }

    /// While the pool is unreachable: `None`, so the caller turns to `get_into`, which is
    /// refused.
    fn lend(&self, keys: &[&str]) -> Option<Vec<Result<SharedSlot, PoolError>>> {
        if matches!(self.shared.gate(Instant::now()), Gate::Refuse { .. }) {
            return None;
        }
        let lent = self.inner.lend(keys)?;
        if let Some(outcome) = outcome_of(&lent) {
            self.shared.record(Instant::now(), outcome);
        }
        Some(lent)
    }

    /// While the pool is unreachable: `None`, so the caller turns to `put_absent`, which is
    /// refused. Every length refused (no room) is a refused put: nothing will be committed.
    fn alloc_objects(&self, lens: &[usize]) -> Option<Vec<Result<HostSlot, PoolError>>> {
        if matches!(self.shared.gate(Instant::now()), Gate::Refuse { .. }) {
            return None;
        }
        let allocated = self.inner.alloc_objects(lens)?;
        let refused = |result: &Result<HostSlot, PoolError>| {
            result.as_ref().is_err_and(|error| !error.is_outage())
        };
        if !allocated.is_empty() && allocated.iter().all(refused) {
            self.shared.record(Instant::now(), CallOutcome::PutRefused);
        }
        Some(allocated)
    }

    fn commit_objects(&self, keys: &[&str], objects: Vec<HostSlot>) -> Vec<Result<(), PoolError>> {
        self.in_place(keys.len(), put_outcome, || {
            self.inner.commit_objects(keys, objects)
        })
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.probe(keys, |pool, keys| pool.touch(keys))
    }

    fn calls_may_block(&self) -> bool {
        self.inner.calls_may_block()
    }

    fn counters(&self) -> PoolCounters {
        self.inner.counters()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn lend_staging(
        &self,
        bytes: usize,
    ) -> Option<Result<Box<dyn crate::gpu::LentHostMemory>, PoolError>> {
        self.inner.lend_staging(bytes)
    }

    fn register_staging(&self, staging: &[u8]) -> Result<(), PoolError> {
        self.inner.register_staging(staging)
    }

    /// Refused while the pool is unreachable: the registration is then left to the
    /// backend (Mooncake drops it when the client closes, and a later registration of the
    /// same memory replaces it).
    fn unregister_staging(&self, start_addr: usize) -> Result<(), PoolError> {
        if let Some(mut refused) = self.refuse::<()>(1) {
            return refused.pop().unwrap_or(Err(PoolError::Unavailable));
        }
        self.inner.unregister_staging(start_addr)
    }

    #[cfg(feature = "faults")]
    fn faults(&self) -> Option<&super::faults::FaultInjector> {
        self.inner.faults()
    }
}

impl Drop for GuardedPool {
    fn drop(&mut self) {
        self.prober.stop();
    }
}

impl std::fmt::Debug for GuardedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedPool")
            .field("inner", &self.inner.name())
            .field("health", &self.shared.snapshot().state)
            .finish_non_exhaustive()
    }
}

/// A read-only view of a [`GuardedPool`]'s health, for the stats reporter.
#[derive(Clone, Debug)]
pub struct HealthView(Arc<Shared>);

impl HealthView {
    /// The health and its counters now.
    pub fn snapshot(&self) -> PoolHealthStats {
        self.0.snapshot()
    }
}

#[cfg(test)]
mod tests;
