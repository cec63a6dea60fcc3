//! Starting and closing a [`MooncakePool`] within deadlines (R30): Mooncake's `setup` and
//! `close` cannot be interrupted, so each runs on a thread of its own and the caller waits
//! for it until its deadline (`mooncake.connect_timeout_ms`, `mooncake.close_timeout_ms`) or
//! a stop. What is abandoned goes on in the background: a start until Mooncake gives up
//! (`MC_STORE_CLIENT_SETUP_RETRIES` attempts of `mooncake.rpc_timeout_ms` deadlines, after
//! which a client that started anyway is closed there), a close until its unmount attempts
//! end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::StoreClient;
use super::{MooncakeError, MooncakePool, MooncakeSettings};

/// How often a waiting start looks at its stop flag.
const WAIT_POLL: Duration = Duration::from_millis(50);

impl MooncakePool {
    /// Starts a client with `settings` (embedding Python on first use) and connects it to
    /// the master, within `settings.connect_timeout_ms`
    /// ([`connect_until`](Self::connect_until) without a stop).
    ///
    /// # Errors
    ///
    /// As [`connect_until`](Self::connect_until), never [`MooncakeError::Interrupted`].
    pub fn connect(settings: MooncakeSettings) -> Result<Self, MooncakeError> {
        Self::connect_until(settings, &mut || false)
    }

    /// [`connect`](Self::connect), abandoned when `stopped()` says so (asked every 50 ms) or
    /// when `settings.connect_timeout_ms` passes (module docs).
    ///
    /// # Errors
    ///
    /// [`MooncakeError::VenvMissing`] without the wheel, [`MooncakeError::Unreachable`] when
    /// nothing listens at the master or the metadata server, [`MooncakeError::MetadataSilent`]
    /// when the metadata server accepts and gives no HTTP answer, [`MooncakeError::Setup`]
    /// when the master or metadata server refuses, [`MooncakeError::Python`] when a step raises,
    /// [`MooncakeError::ConnectTimeout`] past the deadline, [`MooncakeError::Interrupted`]
    /// when stopped.
    pub fn connect_until(
        settings: MooncakeSettings,
        stopped: &mut dyn FnMut() -> bool,
    ) -> Result<Self, MooncakeError> {
        let started_at = Instant::now();
        let deadline = started_at + Duration::from_millis(settings.connect_timeout_ms);
        let (sender, started) = flume::bounded(1);
        let for_start = settings.clone();
        let spawned = std::thread::Builder::new()
            .name("kvc-mooncake-start".into())
            .spawn(move || {
                // Nobody waits any more: close the client that started too late.
                if let Err(flume::SendError(Ok(client))) =
                    sender.send(StoreClient::connect(&for_start))
                {
                    if let Err(err) = client.close() {
                        tracing::debug!(error = %err, "closing an abandoned mooncake client failed");
                    }
                }
            });
        let client = if spawned.is_err() {
            // No thread to spare: start in place, bounded only by Mooncake's retries.
            StoreClient::connect(&settings)?
        } else {
            loop {
                if stopped() {
                    return Err(MooncakeError::Interrupted);
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(MooncakeError::ConnectTimeout {
                        waited_ms: millis(now - started_at),
                        master_address: settings.master_address.clone(),
                    });
                }
                match started.recv_timeout(WAIT_POLL.min(deadline - now)) {
                    Ok(client) => break client?,
                    Err(flume::RecvTimeoutError::Timeout) => {}
                    Err(flume::RecvTimeoutError::Disconnected) => {
                        return Err(MooncakeError::Interrupted);
                    }
                }
            }
        };
        Ok(Self::from_client(settings, client))
    }

    /// [`close`](Self::close) on a thread of its own, waited for at most `timeout`: a close
    /// that has not returned by then (unmounting against a dead master, which Mooncake
    /// retries for about 15 s) goes on in the background and later calls find the client
    /// closed.
    ///
    /// # Errors
    ///
    /// As [`close`](Self::close), or [`MooncakeError::CloseTimeout`] when `timeout` passed.
    pub fn close_within(self: &Arc<Self>, timeout: Duration) -> Result<(), MooncakeError> {
        let (sender, closed) = flume::bounded(1);
        let pool = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("kvc-mooncake-close".into())
            .spawn(move || {
                let _ = sender.send(pool.close());
            });
        if spawned.is_err() {
            return self.close();
        }
        closed
            .recv_timeout(timeout)
            .unwrap_or(Err(MooncakeError::CloseTimeout {
                waited_ms: millis(timeout),
            }))
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
