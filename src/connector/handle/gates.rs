//! The handle's test gates (feature `faults`, `crate::connector::gate`): hold the courier
//! or pause the actor system's thread, so a test fills an outbox or a mailbox on purpose.
//! Both open again when the hold is dropped, and at the latest when the connector stops.

use std::time::Duration;

use super::ConnectorHandle;
use crate::connector::gate::GateHold;

/// How long [`ConnectorHandle::pause_actors`] waits for the actor thread to reach the gate.
const PAUSE_LIMIT: Duration = Duration::from_secs(60);

impl ConnectorHandle {
    /// Holds the courier: from now on it takes at most one message out of the outbox and
    /// waits before delivering it, so further hand-offs fill the outbox and then are
    /// refused, as with a slow courier (R22: the saves are counted dropped). Delivery
    /// resumes when the hold is dropped.
    pub fn hold_courier(&self) -> GateHold {
        self.courier.gates().delivery.hold()
    }

    /// Pauses the actor system's thread (the lookup planner, the reservation manager and
    /// the stats reporter; loaders and savers run on their own): returns once that thread
    /// waits at the gate, so their mailboxes fill and refuse further messages. The thread
    /// resumes when the hold is dropped (or the connector stops).
    ///
    /// # Panics
    ///
    /// When the actor thread is gone, or does not reach the gate within a minute.
    pub fn pause_actors(&self) -> GateHold {
        let gate = std::sync::Arc::clone(&self.courier.gates().actors);
        let hold = gate.hold();
        let (paused_tx, paused) = flume::bounded(1);
        let spawned = self.system.arbiter().spawn_fn(move || {
            let _ = paused_tx.send(());
            gate.pass();
        });
        assert!(spawned, "the actor system is gone");
        assert!(
            paused.recv_timeout(PAUSE_LIMIT).is_ok(),
            "the actor thread did not reach the gate within {PAUSE_LIMIT:?}"
        );
        hold
    }
}
