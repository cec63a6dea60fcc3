//! The courier: one thread per connector that takes the engine thread's messages out of a
//! bounded outbox and delivers them to the actors' mailboxes
//! (`crate::messages::courier`).
//!
//! Why: a message to a parked actor wakes its thread, a system call plus an
//! inter-processor interrupt. Paid on the engine thread, three or four of those per step
//! were most of the connector's time inside the engine's step (docs/PERFORMANCE.md,
//! "Courier"). The courier pays them instead, and the engine thread only pushes onto a
//! queue nobody is blocked on.
//!
//! How it waits:
//! - while messages keep coming, the courier polls: it drains the outbox, then sleeps
//!   `handoff.poll_interval_us`. A hand-off then costs the engine thread no wake-up, and a
//!   message waits at most one interval before delivery;
//! - after `handoff.park_after_idle_ms` without a message it parks on the outbox, so an
//!   idle connector costs no CPU; the next hand-off wakes it (one wake-up, then polling
//!   again). A poll interval of 0 parks whenever the outbox is empty: every hand-off to a
//!   parked courier then wakes it;
//! - a handle about to block anyway (waiting for a lookup, a sync load, a settlement)
//!   [`Courier::nudge`]s it: the wake-up then costs the engine nothing it was not going
//!   to spend waiting, and the message does not wait for the next poll.
//!
//! Invariants:
//! 1. Messages are delivered in outbox order; each is delivered once or handed back once
//!    (on the return channel, as [`Refused`]).
//! 2. The courier exits once the outbox is closed and empty. It blocks only on the return
//!    channel, which the handle drains at every hook and while it waits; a handle that is
//!    gone closes it, and the courier then drops what it would hand back.

use std::num::NonZeroUsize;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::dev::ToEnvelope;
use actix::prelude::SendError;
use actix::{Actor, Addr, Handler, Message};

use crate::actors::lookup_planner::LookupPlanner;
use crate::actors::reservation_manager::ReservationManager;
use crate::actors::saver_queue::SaverQueue;
use crate::config::runtime::Handoff;
use crate::messages::courier::{Outgoing, Refused};

/// How the courier waits between messages (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CourierTiming {
    /// Sleep between polls while active; zero: park whenever the outbox is empty.
    pub poll_interval: Duration,
    /// Park after this long without a message.
    pub park_after_idle: Duration,
}

impl CourierTiming {
    /// The timing of the validated `[handoff]` section.
    pub fn of(handoff: &Handoff) -> Self {
        CourierTiming {
            poll_interval: handoff.poll_interval,
            park_after_idle: handoff.park_after_idle,
        }
    }
}

/// Where the courier delivers: the actors in production, a recorder in tests.
pub trait Deliver {
    /// Delivers one message, or gives it back when its receiver refused it.
    ///
    /// # Errors
    /// [`Refused`] with the message when the receiver's mailbox is full or it is gone.
    fn deliver(&mut self, item: Outgoing) -> Result<(), Refused>;
}

/// The actors of one connector, as the courier reaches them.
pub struct ActorRecipients {
    /// The lookup planner.
    pub planner: Addr<LookupPlanner>,
    /// The reservation manager.
    pub manager: Addr<ReservationManager>,
    /// One saver per rank.
    pub savers: Vec<Addr<SaverQueue>>,
}

impl Deliver for ActorRecipients {
    fn deliver(&mut self, item: Outgoing) -> Result<(), Refused> {
        match item {
            Outgoing::Lookups(message) => send(Some(&self.planner), message, Outgoing::Lookups),
            Outgoing::StartLoads(message) => {
                send(Some(&self.manager), message, Outgoing::StartLoads)
            }
            Outgoing::Release(message) => send(Some(&self.manager), message, Outgoing::Release),
            Outgoing::Save { rank, batch } => send(self.savers.get(rank), batch, |batch| {
                Outgoing::Save { rank, batch }
            }),
            Outgoing::Settle { rank, message } => send(self.savers.get(rank), message, |message| {
                Outgoing::Settle { rank, message }
            }),
            // Dropped here, off the engine thread (the message's purpose).
            Outgoing::Discard(answers) => {
                drop(answers);
                Ok(())
            }
            Outgoing::Barrier { passed } => {
                // Everything before it left the outbox; nobody waiting is fine too.
                let _ = passed.send(());
                Ok(())
            }
        }
    }
}

/// `try_send` to `to` (`None`: a rank without a saver, refused as gone); a refusal gives
/// the message back wrapped as the [`Outgoing`] it came in.
fn send<A, M>(
    to: Option<&Addr<A>>,
    message: M,
    wrap: impl FnOnce(M) -> Outgoing,
) -> Result<(), Refused>
where
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    let Some(to) = to else {
        return Err(Refused {
            item: wrap(message),
            closed: true,
        });
    };
    to.try_send(message).map_err(|error| match error {
        SendError::Full(message) => Refused {
            item: wrap(message),
            closed: false,
        },
        SendError::Closed(message) => Refused {
            item: wrap(message),
            closed: true,
        },
    })
}

/// The handle's side of a running courier: the outbox, the return channel and the thread.
pub struct Courier {
    outbox: Option<flume::Sender<Outgoing>>,
    returns: Option<flume::Receiver<Refused>>,
    thread: Option<JoinHandle<()>>,
    /// The test gates of this connector, opened when the courier stops.
    #[cfg(feature = "faults")]
    gates: TestGates,
}

/// The test gates of one connector (feature `faults`, `super::gate`).
#[cfg(feature = "faults")]
#[derive(Clone, Debug, Default)]
pub struct TestGates {
    /// Passed by the courier before it delivers each message.
    pub delivery: std::sync::Arc<super::gate::Gate>,
    /// Passed by the actor system's thread when `ConnectorHandle::pause_actors` asks it to.
    pub actors: std::sync::Arc<super::gate::Gate>,
}

/// A [`Deliver`] that passes the delivery gate before every message (feature `faults`).
#[cfg(feature = "faults")]
struct Gated<D> {
    inner: D,
    gate: std::sync::Arc<super::gate::Gate>,
}

#[cfg(feature = "faults")]
impl<D: Deliver> Deliver for Gated<D> {
    fn deliver(&mut self, item: Outgoing) -> Result<(), Refused> {
        self.gate.pass();
        self.inner.deliver(item)
    }
}

impl Courier {
    /// Starts the courier thread; `capacity` bounds the outbox and the return channel.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start(
        recipients: impl Deliver + Send + 'static,
        capacity: NonZeroUsize,
        timing: CourierTiming,
    ) -> std::io::Result<Self> {
        let (outbox, outbox_rx) = flume::bounded(capacity.get());
        let (returns_tx, returns) = flume::bounded(capacity.get());
        #[cfg(feature = "faults")]
        let gates = TestGates::default();
        #[cfg(feature = "faults")]
        let recipients = Gated {
            inner: recipients,
            gate: std::sync::Arc::clone(&gates.delivery),
        };
        let thread = std::thread::Builder::new()
            .name("kvc-courier".into())
            .spawn(move || run(&outbox_rx, &returns_tx, recipients, timing))?;
        Ok(Courier {
            outbox: Some(outbox),
            returns: Some(returns),
            thread: Some(thread),
            #[cfg(feature = "faults")]
            gates,
        })
    }

    /// This connector's test gates (feature `faults`).
    #[cfg(feature = "faults")]
    pub fn gates(&self) -> &TestGates {
        &self.gates
    }

    /// Puts a message into the outbox without waking a polling courier.
    ///
    /// # Errors
    /// [`Refused`] with the message when the outbox is full (`closed: false`) or the
    /// courier stopped (`closed: true`).
    pub fn hand_off(&self, item: Outgoing) -> Result<(), Refused> {
        let Some(outbox) = &self.outbox else {
            return Err(Refused { item, closed: true });
        };
        outbox.try_send(item).map_err(|error| match error {
            flume::TrySendError::Full(item) => Refused {
                item,
                closed: false,
            },
            flume::TrySendError::Disconnected(item) => Refused { item, closed: true },
        })
    }

    /// Makes a polling courier look at its outbox now rather than at its next poll, if
    /// the outbox holds anything. A system call: for a handle that is about to wait.
    pub fn nudge(&self) {
        let waiting = self
            .outbox
            .as_ref()
            .is_some_and(|outbox| !outbox.is_empty());
        if let (true, Some(thread)) = (waiting, &self.thread) {
            thread.thread().unpark();
        }
    }

    /// The return channel: messages the actors refused. Disconnected once stopped.
    pub fn returns(&self) -> Option<&flume::Receiver<Refused>> {
        self.returns.as_ref()
    }

    /// Closes the outbox, lets the courier deliver what it holds, and joins it
    /// (idempotent). What it would hand back from then on is dropped.
    pub fn stop(&mut self) {
        self.outbox = None;
        self.returns = None;
        #[cfg(feature = "faults")]
        {
            self.gates.delivery.open();
            self.gates.actors.open();
        }
        if let Some(thread) = self.thread.take() {
            // A courier between polls sees the closed outbox now, not a poll later.
            thread.thread().unpark();
            if thread.join().is_err() {
                tracing::error!("the courier thread panicked");
            }
        }
    }
}

impl Drop for Courier {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The courier's loop (module docs: how it waits).
fn run(
    outbox: &flume::Receiver<Outgoing>,
    returns: &flume::Sender<Refused>,
    mut recipients: impl Deliver,
    timing: CourierTiming,
) {
    let mut last_message = Instant::now();
    loop {
        let mut delivered = false;
        loop {
            match outbox.try_recv() {
                Ok(item) => {
                    deliver(&mut recipients, item, returns);
                    delivered = true;
                }
                Err(flume::TryRecvError::Empty) => break,
                Err(flume::TryRecvError::Disconnected) => return,
            }
        }
        let now = Instant::now();
        if delivered {
            last_message = now;
        }
        let idle = now.saturating_duration_since(last_message);
        if timing.poll_interval.is_zero() || idle >= timing.park_after_idle {
            // Park: a hand-off to an outbox with a blocked receiver wakes it.
            match outbox.recv() {
                Ok(item) => {
                    deliver(&mut recipients, item, returns);
                    last_message = Instant::now();
                }
                Err(flume::RecvError::Disconnected) => return,
            }
        } else {
            // A nudge (`unpark`) ends the wait early; a spurious wake-up only polls again.
            std::thread::park_timeout(timing.poll_interval);
        }
    }
}

/// Delivers one message, handing it back when refused (dropped if the handle is gone).
fn deliver(recipients: &mut impl Deliver, item: Outgoing, returns: &flume::Sender<Refused>) {
    if let Err(refused) = recipients.deliver(item) {
        if returns.send(refused).is_err() {
            tracing::debug!("connector handle gone; a refused message is dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ids::ReservationId;
    use crate::messages::reservation_manager::ReleaseReservation;

    /// Records delivered releases by reservation id; refuses the ids in `refuse`.
    struct Recorder {
        delivered: flume::Sender<u64>,
        refuse: Vec<u64>,
    }

    impl Deliver for Recorder {
        fn deliver(&mut self, item: Outgoing) -> Result<(), Refused> {
            let Outgoing::Release(release) = &item else {
                return Err(Refused { item, closed: true });
            };
            let id = release.reservation.0;
            if self.refuse.contains(&id) {
                return Err(Refused {
                    item,
                    closed: false,
                });
            }
            self.delivered.send(id).unwrap();
            Ok(())
        }
    }

    fn release(id: u64) -> Outgoing {
        Outgoing::Release(ReleaseReservation {
            reservation: ReservationId(id),
            start: 0,
            end: 16,
        })
    }

    fn capacity(messages: usize) -> NonZeroUsize {
        NonZeroUsize::new(messages).unwrap()
    }

    fn timings() -> [CourierTiming; 3] {
        [
            // Parks whenever empty: every hand-off wakes it.
            CourierTiming {
                poll_interval: Duration::ZERO,
                park_after_idle: Duration::ZERO,
            },
            // Polls and never parks within a test.
            CourierTiming {
                poll_interval: Duration::from_micros(20),
                park_after_idle: Duration::from_secs(3600),
            },
            // Polls, and parks after the first empty poll.
            CourierTiming {
                poll_interval: Duration::from_micros(20),
                park_after_idle: Duration::ZERO,
            },
        ]
    }

    #[test]
    fn delivers_in_outbox_order_and_hands_back_what_is_refused() {
        for timing in timings() {
            let (delivered, seen) = flume::bounded(64);
            let recorder = Recorder {
                delivered,
                refuse: vec![3, 7],
            };
            let mut courier = Courier::start(recorder, capacity(64), timing).unwrap();
            for id in 0..10 {
                courier.hand_off(release(id)).unwrap();
            }
            let delivered: Vec<u64> = (0..8).map(|_| seen.recv().unwrap()).collect();
            assert_eq!(delivered, vec![0, 1, 2, 4, 5, 6, 8, 9], "{timing:?}");
            let returns = courier.returns().unwrap().clone();
            let handed_back: Vec<(u64, bool)> = (0..2)
                .map(|_| match returns.recv().unwrap() {
                    Refused {
                        item: Outgoing::Release(release),
                        closed,
                    } => (release.reservation.0, closed),
                    other => panic!("unexpected {other:?}"),
                })
                .collect();
            assert_eq!(handed_back, vec![(3, false), (7, false)]);
            courier.stop();
            assert!(seen.try_recv().is_err(), "nothing delivered twice");
        }
    }

    #[test]
    fn a_full_outbox_refuses_at_once_and_a_stopped_courier_refuses_as_closed() {
        // A courier whose recipient blocks: its outbox fills and refuses.
        struct Stuck(flume::Receiver<()>);
        impl Deliver for Stuck {
            fn deliver(&mut self, _item: Outgoing) -> Result<(), Refused> {
                let _ = self.0.recv();
                Ok(())
            }
        }
        let (unblock, blocked) = flume::bounded(1);
        let mut courier = Courier::start(Stuck(blocked), capacity(2), timings()[0]).unwrap();
        let mut refused = None;
        for id in 0..16 {
            if let Err(error) = courier.hand_off(release(id)) {
                refused = Some(error);
                break;
            }
        }
        let refused = refused.expect("an outbox of two refuses within sixteen hand-offs");
        assert!(!refused.closed, "full, not closed");
        drop(unblock);
        courier.stop();
        let after = courier.hand_off(release(99)).unwrap_err();
        assert!(after.closed);
        assert!(courier.returns().is_none());
    }

    #[test]
    fn stop_delivers_what_the_outbox_holds_before_joining() {
        for timing in timings() {
            let (delivered, seen) = flume::bounded(256);
            let recorder = Recorder {
                delivered,
                refuse: Vec::new(),
            };
            let mut courier = Courier::start(recorder, capacity(256), timing).unwrap();
            for id in 0..200 {
                courier.hand_off(release(id)).unwrap();
            }
            courier.stop();
            let delivered: Vec<u64> = seen.try_iter().collect();
            assert_eq!(delivered, (0..200).collect::<Vec<_>>(), "{timing:?}");
        }
    }
}
