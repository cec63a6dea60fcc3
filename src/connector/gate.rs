//! Test gates (feature `faults`): a test holds the courier before it delivers, or the
//! actor system's thread, until it lets go, so that a full outbox or a full mailbox
//! happens when the test says, not when one thread happens to outrun another.
//!
//! A [`Gate`] is open until [`Gate::hold`]; whoever calls [`Gate::pass`] then waits until
//! the [`GateHold`] is dropped, or the gate is [`Gate::open`]ed (the courier opens its
//! gates when it stops, so a connector shuts down even with a hold left).
//! `ConnectorHandle::hold_courier` and `ConnectorHandle::pause_actors` hand them out.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// A gate threads pass while it is open and wait at while it is held.
#[derive(Debug, Default)]
pub struct Gate {
    held: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    /// Holds the gate until the returned guard is dropped.
    pub fn hold(self: &Arc<Self>) -> GateHold {
        *self.held.lock() = true;
        GateHold(Arc::clone(self))
    }

    /// Opens the gate, whoever holds it.
    pub fn open(&self) {
        *self.held.lock() = false;
        self.opened.notify_all();
    }

    /// Returns at once while the gate is open; waits while it is held.
    pub fn pass(&self) {
        let mut held = self.held.lock();
        while *held {
            self.opened.wait(&mut held);
        }
    }
}

/// A held [`Gate`]; dropping it opens the gate.
#[derive(Debug)]
#[must_use = "the gate opens again when this is dropped"]
pub struct GateHold(Arc<Gate>);

impl Drop for GateHold {
    fn drop(&mut self) {
        self.0.open();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_held_gate_keeps_a_thread_until_the_hold_is_dropped() {
        let gate = Arc::new(Gate::default());
        gate.pass();
        let hold = gate.hold();
        let (passed_tx, passed) = flume::bounded(1);
        let waiter = Arc::clone(&gate);
        let thread = std::thread::spawn(move || {
            waiter.pass();
            let _ = passed_tx.send(());
        });
        assert!(
            passed.recv_timeout(Duration::from_millis(50)).is_err(),
            "the thread waits at the held gate"
        );
        drop(hold);
        assert!(passed.recv_timeout(Duration::from_secs(60)).is_ok());
        assert!(thread.join().is_ok());
    }
}
