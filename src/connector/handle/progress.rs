//! Waiting for the actors without holding the handle: [`ProgressWaiter`] holds its own
//! ends of the engine inbox and the courier's return channel, so an engine that shares the
//! handle behind a lock can wait with the lock released (its other threads' hooks go on),
//! then give what it woke up for to [`ConnectorHandle::accept_progress`].
//!
//! Invariant: whatever a waiter takes from a channel is handed to the handle (`Progress`
//! is the only way out of `wait`), so no result or refusal is lost; one that another hook
//! drained first only lets the wait run on.

use std::time::Instant;

use super::handoff::Event;
use super::ConnectorHandle;
use crate::messages::courier::Refused;
use crate::messages::{LoadAnswer, LookupCompleted, SavesSettled};

/// A wait for the next lookup result, load answer, save settlement or refusal, detached
/// from the handle (module docs).
#[derive(Clone, Debug)]
pub struct ProgressWaiter {
    lookups: flume::Receiver<LookupCompleted>,
    loads: flume::Receiver<LoadAnswer>,
    saves: flume::Receiver<SavesSettled>,
    returns: Option<flume::Receiver<Refused>>,
}

/// What a [`ProgressWaiter`] woke up for: give it to [`ConnectorHandle::accept_progress`].
#[must_use = "a result taken from the actors is lost unless the handle accepts it"]
pub struct Progress(pub(super) Event);

impl ProgressWaiter {
    /// Waits for the next result or refusal until `deadline`; `None` when the deadline
    /// passed first. A handle whose actors are gone answers at once.
    pub fn wait(&self, deadline: Instant) -> Option<Progress> {
        self.wait_or(None, Some(deadline)).map(Progress)
    }

    /// Waits for the next result, refusal or `answer` until `deadline` (`None`: no
    /// deadline); `None` when the deadline passed first.
    pub(super) fn wait_or(
        &self,
        answer: Option<&flume::Receiver<()>>,
        deadline: Option<Instant>,
    ) -> Option<Event> {
        let mut selector = flume::Selector::new()
            .recv(&self.lookups, |message| {
                message.map_or(Event::Closed, Event::Lookup)
            })
            .recv(&self.loads, |message| {
                message.map_or(Event::Closed, Event::Load)
            })
            .recv(&self.saves, |message| {
                message.map_or(Event::Closed, Event::Save)
            });
        if let Some(returns) = &self.returns {
            selector = selector.recv(returns, |message| {
                message.map_or(Event::Closed, Event::Returned)
            });
        }
        if let Some(answer) = answer {
            selector = selector.recv(answer, |_| Event::Answered);
        }
        match deadline {
            Some(deadline) => selector.wait_deadline(deadline).ok(),
            None => Some(selector.wait()),
        }
    }
}

impl ConnectorHandle {
    /// A waiter for the handle's next result (module docs). Sends the queued lookups
    /// first, as `wait_for_progress` does.
    pub fn progress_waiter(&mut self) -> ProgressWaiter {
        self.flush_queued_lookups();
        // About to block: what the outbox holds need not wait for the courier's next poll.
        self.courier.nudge();
        self.waiter()
    }

    /// Records what a [`ProgressWaiter`] woke up for.
    pub fn accept_progress(&mut self, progress: Progress) {
        self.accept_event(progress.0);
    }

    /// The handle's channels, as a waiter holds them.
    pub(super) fn waiter(&self) -> ProgressWaiter {
        ProgressWaiter {
            lookups: self.lookups.clone(),
            loads: self.loads.clone(),
            saves: self.saves.clone(),
            returns: self.courier.returns().cloned(),
        }
    }
}
