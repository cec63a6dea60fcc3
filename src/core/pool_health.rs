//! The pool's health as one connector sees it (R30): healthy, degraded or unreachable,
//! and the schedule of the background probes that find it again after an outage. A pool
//! that answers but refuses to store puts is degraded too.
//!
//! # Workflow
//!
//! 1. Before a pool call, the caller asks [`HealthMachine::gate`]: while the pool is
//!    unreachable the call is not made at all and fails at once ([`Gate::Refuse`]).
//! 2. After a call it reports what came back with [`HealthMachine::record`]:
//!    [`CallOutcome::Answered`] when the pool answered anything (even "absent" or an
//!    error about one key), [`CallOutcome::Failed`] when it could not be reached or
//!    missed the call's deadline; for a put that was answered, [`CallOutcome::PutStored`]
//!    when it stored something and [`CallOutcome::PutRefused`] when it stored nothing it
//!    was asked to (no room: a full pool, or a restarted Mooncake master before the
//!    segments are mounted again; or another refusal).
//! 3. `unreachable_after` failed calls in a row (no answered call between them) mark the
//!    pool unreachable: [`Transition::BecameUnreachable`], which the adapter logs once at
//!    WARN. An answered call before that returns it to healthy, unless puts are refused.
//!    A refused put makes the pool degraded at once; only a put that stores makes it
//!    healthy again (answered probes in between do not: the pool is reachable, but it
//!    is not storing).
//! 4. While unreachable, one background probe at a time runs when
//!    [`HealthMachine::probe_due`] says it is due ([`HealthMachine::begin_probe`], then
//!    [`HealthMachine::record_probe`]). A failed probe doubles the wait before the next,
//!    from `retry_initial` up to `retry_max`; an answered probe ends the outage:
//!    [`Transition::Recovered`], logged once at INFO.
//!
//! Time is an argument (`now`), never read here, so the machine is deterministic for its
//! inputs.
//!
//! # Invariants
//!
//! - `pool_health::H1`. Calls are refused only while unreachable, and every call is
//!   refused then.
//! - `pool_health::H2`. The pool becomes unreachable only after `unreachable_after`
//!   failed calls in a row; an answered call outside an outage makes it healthy, unless
//!   the last put was refused (H6).
//! - `pool_health::H3`. Outages alternate: one [`Transition::BecameUnreachable`], then one
//!   [`Transition::Recovered`], and so on; only an answered probe recovers.
//! - `pool_health::H4`. At most one probe runs at a time, and only while unreachable.
//! - `pool_health::H5`. The waits between the probes of one outage start at
//!   `retry_initial`, double after each failed probe and never exceed `retry_max`.
//! - `pool_health::H6`. Outside an outage, a refused put makes the pool degraded, and it
//!   stays degraded (or becomes unreachable) until a put stores; after an outage the
//!   refusals before it are forgotten.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// What the connector knows about the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolHealth {
    /// The last call was answered.
    Healthy,
    /// Some calls in a row failed, fewer than `unreachable_after`, or the last put was
    /// refused; calls still go out.
    Degraded,
    /// `unreachable_after` calls in a row failed: calls are refused until a probe is
    /// answered.
    Unreachable,
}

impl PoolHealth {
    /// The state as a label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Unreachable => "unreachable",
        }
    }
}

/// When the pool counts as unreachable and how it is probed then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Failed calls in a row that make the pool unreachable.
    pub unreachable_after: NonZeroU32,
    /// Wait before the first probe of an outage.
    pub retry_initial: Duration,
    /// Longest wait between two probes; at least `retry_initial`.
    pub retry_max: Duration,
}

/// How one pool call ended, as far as the pool's health goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// The pool answered (any answer, including per-key errors).
    Answered,
    /// The pool could not be reached, or the call missed its deadline.
    Failed,
    /// A put the pool answered and that stored at least one object.
    PutStored,
    /// A put the pool answered without storing anything it was asked to store: every key
    /// it did not hold already was refused (no room, or another per-key error).
    PutRefused,
}

/// Whether a call may go to the pool now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Make the call.
    Call,
    /// Do not: the pool is unreachable. The next probe is due in `retry_in`.
    Refuse {
        /// Time until the next probe (zero when it is due).
        retry_in: Duration,
    },
}

/// A change of state worth telling the operator about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// A call failed after answered ones, or a put was refused: the pool is degraded.
    Degraded,
    /// A degraded pool answered again (and stored a put, if puts were refused) before it
    /// was marked unreachable.
    Healthy,
    /// The pool is now unreachable (WARN, once per outage).
    BecameUnreachable {
        /// Failed calls in a row that decided it.
        failures: u32,
        /// Wait before the first probe.
        retry_in: Duration,
    },
    /// A probe was answered: the outage is over (INFO, once per outage).
    Recovered {
        /// How long the pool was unreachable.
        down_for: Duration,
        /// Probes that failed during the outage.
        failed_probes: u32,
    },
}

/// The health of the pool and the probe schedule (module docs).
#[derive(Clone, Debug)]
pub struct HealthMachine {
    policy: HealthPolicy,
    state: PoolHealth,
    /// Failed calls in a row (outside an outage).
    failures: u32,
    /// The last put was refused (outside an outage; `pool_health::H6`).
    puts_refused: bool,
    /// During an outage: when it began.
    down_since: Option<Instant>,
    /// During an outage: when the next probe is due.
    next_probe: Option<Instant>,
    /// During an outage: the wait that was used for the last scheduled probe.
    backoff: Duration,
    /// During an outage: probes that failed.
    failed_probes: u32,
    /// A probe is running.
    probing: bool,
}

impl HealthMachine {
    /// A healthy pool under `policy` (`retry_max` below `retry_initial` is raised to it).
    pub fn new(policy: HealthPolicy) -> Self {
        let policy = HealthPolicy {
            retry_max: policy.retry_max.max(policy.retry_initial),
            ..policy
        };
        Self {
            policy,
            state: PoolHealth::Healthy,
            failures: 0,
            puts_refused: false,
            down_since: None,
            next_probe: None,
            backoff: policy.retry_initial,
            failed_probes: 0,
            probing: false,
        }
    }

    /// The current state.
    pub fn state(&self) -> PoolHealth {
        self.state
    }

    /// Whether a call may go out now (`pool_health::H1`).
    pub fn gate(&self, now: Instant) -> Gate {
        match (self.state, self.next_probe) {
            (PoolHealth::Unreachable, Some(due)) => Gate::Refuse {
                retry_in: due.saturating_duration_since(now),
            },
            (PoolHealth::Unreachable, None) => Gate::Refuse {
                retry_in: Duration::ZERO,
            },
            _ => Gate::Call,
        }
    }

    /// Records how an ordinary call ended. During an outage ordinary calls change
    /// nothing (a late answer of a call made before it does not end it; only a probe does,
    /// `pool_health::H3`).
    pub fn record(&mut self, now: Instant, outcome: CallOutcome) -> Option<Transition> {
        match (self.state, outcome) {
            (PoolHealth::Unreachable, _) => None,
            (_, CallOutcome::Failed) => {
                self.failures = self.failures.saturating_add(1);
                if self.failures >= self.policy.unreachable_after.get() {
                    Some(self.become_unreachable(now))
                } else {
                    self.degrade()
                }
            }
            (_, answered) => {
                self.failures = 0;
                match answered {
                    CallOutcome::PutRefused => self.puts_refused = true,
                    CallOutcome::PutStored => self.puts_refused = false,
                    CallOutcome::Answered | CallOutcome::Failed => {}
                }
                if self.puts_refused {
                    self.degrade()
                } else if self.state == PoolHealth::Degraded {
                    self.state = PoolHealth::Healthy;
                    Some(Transition::Healthy)
                } else {
                    None
                }
            }
        }
    }

    /// A healthy pool becomes degraded; otherwise nothing changes.
    fn degrade(&mut self) -> Option<Transition> {
        (self.state == PoolHealth::Healthy).then(|| {
            self.state = PoolHealth::Degraded;
            Transition::Degraded
        })
    }

    fn become_unreachable(&mut self, now: Instant) -> Transition {
        let failures = self.failures;
        self.state = PoolHealth::Unreachable;
        self.failures = 0;
        self.down_since = Some(now);
        self.failed_probes = 0;
        self.backoff = self.policy.retry_initial;
        self.next_probe = Some(now + self.backoff);
        Transition::BecameUnreachable {
            failures,
            retry_in: self.backoff,
        }
    }

    /// During an outage with no probe running: how long until the next probe is due
    /// (zero: now). `None` when there is nothing to probe.
    pub fn probe_due(&self, now: Instant) -> Option<Duration> {
        if self.state != PoolHealth::Unreachable || self.probing {
            return None;
        }
        Some(
            self.next_probe
                .map_or(Duration::ZERO, |due| due.saturating_duration_since(now)),
        )
    }

    /// Starts a probe if one is due now; `false` otherwise (`pool_health::H4`).
    pub fn begin_probe(&mut self, now: Instant) -> bool {
        if self.probe_due(now) != Some(Duration::ZERO) {
            return false;
        }
        self.probing = true;
        true
    }

    /// Records how the running probe ended: answered ends the outage, failed schedules
    /// the next probe after a doubled wait (`pool_health::H5`). Without a running probe it
    /// changes nothing.
    pub fn record_probe(&mut self, now: Instant, outcome: CallOutcome) -> Option<Transition> {
        if !self.probing {
            return None;
        }
        self.probing = false;
        match outcome {
            CallOutcome::Answered | CallOutcome::PutStored | CallOutcome::PutRefused => {
                let down_for = self
                    .down_since
                    .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
                let failed_probes = self.failed_probes;
                self.state = PoolHealth::Healthy;
                self.failures = 0;
                self.puts_refused = false;
                self.down_since = None;
                self.next_probe = None;
                Some(Transition::Recovered {
                    down_for,
                    failed_probes,
                })
            }
            CallOutcome::Failed => {
                self.failed_probes = self.failed_probes.saturating_add(1);
                self.backoff = self.backoff.saturating_mul(2).min(self.policy.retry_max);
                self.next_probe = Some(now + self.backoff);
                None
            }
        }
    }

    /// How long the current outage has lasted (zero outside an outage).
    pub fn down_for(&self, now: Instant) -> Duration {
        self.down_since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }
}

#[cfg(test)]
mod tests;
