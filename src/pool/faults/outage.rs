//! Pool outages on command (feature `faults`): while one lasts, every call of a
//! [`FaultyPool`](super::FaultyPool) finds the pool gone, as a stopped or frozen master
//! leaves Mooncake's client.
//!
//! - [`Outage::Down`]: every key answers [`PoolError::Unavailable`] at once (a master
//!   that is gone; Mooncake's `RPC_FAIL`).
//! - [`Outage::Hang`]: every call blocks until the outage ends or `backend_timeout`
//!   passes, and then answers [`PoolError::Timeout`] (a master that accepts and never
//!   answers; Mooncake's `RPC_TIMEOUT` after `mooncake.rpc_timeout_ms`). A call whose wait
//!   the end of the outage cut short goes on to the pool.
//!
//! Tests start and end outages with [`FaultInjector::begin_outage`] and
//! [`FaultInjector::end_outage`](super::FaultInjector::end_outage); an outage is not a
//! rate-based fault point and is not in [`FaultInjector::counts`].
//!
//! [`FaultInjector::begin_outage`]: super::FaultInjector::begin_outage
//! [`FaultInjector::counts`]: super::FaultInjector::counts

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
#[cfg(any(feature = "replay", feature = "internals"))]
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

#[cfg(any(feature = "replay", feature = "internals"))]
use crate::pool::PoolError;

/// How the pool is gone (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// Every call fails at once as unavailable.
    Down,
    /// Every call hangs until the outage ends or `backend_timeout` passes.
    Hang {
        /// The backend's own timeout: a hung call answers a timeout after this long.
        backend_timeout: Duration,
    },
}

/// The outage switch of one injector.
#[derive(Debug, Default)]
pub(super) struct PoolOutage {
    current: Mutex<Option<Outage>>,
    changed: Condvar,
    /// Calls that met an outage.
    calls: AtomicU64,
}

impl PoolOutage {
    pub(super) fn begin(&self, outage: Outage) {
        *self.current.lock() = Some(outage);
        self.changed.notify_all();
    }

    pub(super) fn end(&self) {
        *self.current.lock() = None;
        self.changed.notify_all();
    }

    pub(super) fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// The answer of a call of `keys` keys during an outage, or `None` when there is
    /// none (then the call goes on).
    #[cfg(any(feature = "replay", feature = "internals"))]
    pub(super) fn answer<T>(&self, keys: usize) -> Option<Vec<Result<T, PoolError>>> {
        let mut current = self.current.lock();
        let outage = (*current)?;
        self.calls.fetch_add(1, Ordering::SeqCst);
        match outage {
            Outage::Down => Some(PoolError::Unavailable.for_every_key(keys)),
            Outage::Hang { backend_timeout } => {
                let deadline = Instant::now() + backend_timeout;
                while matches!(*current, Some(Outage::Hang { .. })) {
                    if self.changed.wait_until(&mut current, deadline).timed_out() {
                        let after_ms =
                            u64::try_from(backend_timeout.as_millis()).unwrap_or(u64::MAX);
                        return Some(PoolError::Timeout { after_ms }.for_every_key(keys));
                    }
                }
                match *current {
                    Some(Outage::Down) => Some(PoolError::Unavailable.for_every_key(keys)),
                    _ => None,
                }
            }
        }
    }
}
