//! Supervision in one place: every actor runs its handlers' work through [`catch`], and
//! the actors that own a staging pool (loaders, savers) run their batches through a
//! [`StagingSupervisor`], which rebuilds the staging pool a panic lost or retires its
//! owner.
//!
//! # Why not actix's `Supervisor`
//!
//! actix restarts a `Supervised` actor whose context *stops*. A panic inside a handler does
//! not stop the context: it unwinds out of the actor's task, which the runtime drops. The
//! Arbiter's thread and the other actors on it live on, the actor's mailbox closes, and a
//! `Supervisor` around it goes with the task without restarting anything (actix 0.13,
//! pinned by `a_panicking_handler_ends_only_its_own_actor`). A context restart would also
//! drop the futures the actor spawned (lookups and load reports in flight), leaving the
//! engine waiting for answers that never come. So each actor catches panics inside its
//! handlers and decides, per actor, what becomes of the work that panicked and of its own
//! state (`src/actors/mod.rs` lists the decisions):
//!
//! - restart in place: the work that panicked is answered failed, the state it could not
//!   have corrupted is kept, what it lost is rebuilt, and the actor serves the next message;
//! - retire: state a panic may have left half-updated is dropped, and the actor answers
//!   every later message failed at once (never silently: each failure is counted).
//!
//! # Staging pools
//!
//! A load or save batch takes its owner's staging pool by value (it is moved into the copy
//! and handed back). A panic loses it. [`StagingSupervisor`] owns the pool between batches,
//! lends it to one batch at a time ([`StagingSupervisor::lend`], [`Lent::run`]; the batch
//! may run on another thread), and when the batch panicked builds one of the same shape
//! (host memory, registered with the pool like the first one). A pinned (CUDA) staging pool
//! cannot be rebuilt without the device, nor one in memory the pool lent (Mooncake's dummy
//! client) without the pool's memory, so its owner retires. The copy stream is borrowed
//! by a batch, not moved, and survives a panic.
//!
//! Invariants:
//! - `supervisor::P1`. Every batch run through a [`StagingSupervisor`] ends in exactly one
//!   [`Batch`]: `Done` with the batch's own answer, or `Panicked`, which its owner
//!   reports as failed work (`loader::L1`, `saver_queue::A1`).
//! - `supervisor::P2`. The staging pool is held by the supervisor, lent to exactly one batch, or
//!   gone with a retired owner; a retired supervisor never lends again.
//! - `supervisor::P3`. A staging pool the supervisor rebuilt is registered with the pool while it
//!   lives and unregistered when it is replaced or the supervisor is dropped.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::gpu::{StagingGeometry, StagingPool};
use crate::pool::Pool;

/// A panic [`catch`] caught.
#[derive(Debug)]
pub struct Panicked {
    message: String,
}

impl Panicked {
    /// The panic's message (`"<not a string>"` for a payload that is not one), for the log.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Runs `work` and catches a panic in it.
///
/// The caller is the judge of unwind safety: whatever `work` borrowed mutably may be
/// half-updated after a panic, so each actor documents which of its state it keeps (restart
/// in place) and which it drops (retire).
///
/// # Errors
///
/// [`Panicked`] when `work` panicked.
pub fn catch<T>(work: impl FnOnce() -> T) -> Result<T, Panicked> {
    catch_unwind(AssertUnwindSafe(work)).map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|message| (*message).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "<not a string>".to_owned());
        Panicked { message }
    })
}

/// What a supervised batch came to (`supervisor::P1`).
#[derive(Debug, PartialEq, Eq)]
pub enum Batch<T> {
    /// The batch returned this answer.
    Done(T),
    /// The batch panicked: its work failed; the staging pool was rebuilt, or the owner
    /// retired.
    Panicked,
}

/// The staging pool lent to one batch (`supervisor::P2`); [`Lent::run`] runs the batch.
pub struct Lent(StagingPool);

/// A lent batch's end: the staging pool and the answer, or the panic that lost them. Give it
/// back with [`StagingSupervisor::settle`].
pub struct LentOutcome<T>(Result<(StagingPool, T), Panicked>);

impl Lent {
    /// Runs `work` with the staging pool, catching a panic (on whatever thread this runs).
    pub fn run<T>(self, work: impl FnOnce(StagingPool) -> (StagingPool, T)) -> LentOutcome<T> {
        let Lent(staging) = self;
        LentOutcome(catch(|| work(staging)))
    }
}

/// Which actor a supervisor serves, for its log lines.
#[derive(Clone, Copy, Debug)]
pub struct Supervisee {
    /// `"loader"` or `"saver"`.
    pub actor: &'static str,
    /// The rank it serves.
    pub rank: u32,
}

/// Owns one actor's staging pool between batches and supervises the batches (module docs).
pub struct StagingSupervisor {
    supervisee: Supervisee,
    pool: Arc<dyn Pool>,
    /// `None` while lent to a batch, and for good once retired.
    staging: Option<StagingPool>,
    /// The staging pool's shape, to rebuild it after a panic.
    geometry: StagingGeometry,
    /// Pinned (CUDA) or lent memory: cannot be rebuilt, a panic retires the owner.
    pinned: bool,
    retired: bool,
    /// Start address of the staging pool this supervisor rebuilt and registered itself
    /// (the connector unregisters only the ones it made), `supervisor::P3`.
    rebuilt_registration: Option<usize>,
    /// Panics survived by rebuilding, for the log.
    restarts: u64,
}

impl StagingSupervisor {
    /// Supervises the batches of `supervisee`, which owns `staging` (already registered with
    /// `pool` by the connector).
    pub fn new(supervisee: Supervisee, pool: Arc<dyn Pool>, staging: StagingPool) -> Self {
        Self {
            supervisee,
            pool,
            geometry: staging.geometry(),
            pinned: staging.is_pinned() || staging.is_lent(),
            staging: Some(staging),
            retired: false,
            rebuilt_registration: None,
            restarts: 0,
        }
    }

    /// Whether a panic retired the owner: it answers every later batch failed at once.
    pub fn is_retired(&self) -> bool {
        self.retired
    }

    /// The staging pool's slots: the most pages one pass of a batch stages.
    pub fn slots(&self) -> u32 {
        self.geometry.slots()
    }

    /// Lends the staging pool to one batch; `None` once retired or while it is lent
    /// (`supervisor::P2`).
    pub fn lend(&mut self) -> Option<Lent> {
        self.staging.take().map(Lent)
    }

    /// Takes a lent batch's end back: the staging pool returns, or after a panic one of
    /// the same shape is built, or the owner retires.
    pub fn settle<T>(&mut self, outcome: LentOutcome<T>) -> Batch<T> {
        match outcome.0 {
            Ok((staging, answer)) => {
                self.staging = Some(staging);
                Batch::Done(answer)
            }
            Err(panicked) => {
                self.restart(&panicked);
                Batch::Panicked
            }
        }
    }

    /// Runs one batch on this thread: [`lend`](Self::lend), [`Lent::run`],
    /// [`settle`](Self::settle). `None` when retired (or lent).
    pub fn run<T>(
        &mut self,
        work: impl FnOnce(StagingPool) -> (StagingPool, T),
    ) -> Option<Batch<T>> {
        let lent = self.lend()?;
        Some(self.settle(lent.run(work)))
    }

    /// Retires the owner for good: a lent staging pool went with a task that never ran.
    pub fn retire(&mut self) {
        self.retired = true;
        self.staging = None;
    }

    /// After a panic: a host staging pool of the same shape, registered with the pool; or
    /// retirement when the lost one was pinned or the new one is refused.
    fn restart(&mut self, panicked: &Panicked) {
        let Supervisee { actor, rank } = self.supervisee;
        let panic = panicked.message();
        if self.pinned {
            tracing::error!(
                actor,
                rank,
                panic,
                "panicked and its pinned staging pool is lost; retired, its later work fails"
            );
            return self.retire();
        }
        let staging = match StagingPool::new_host(self.geometry) {
            Ok(staging) => staging,
            Err(err) => {
                tracing::error!(actor, rank, panic, error = %err, kind = err.kind(), "panicked and no memory was left for a new staging pool; retired, its later work fails");
                return self.retire();
            }
        };
        if let Err(err) = self.pool.register_staging(staging.bytes()) {
            tracing::error!(actor, rank, panic, error = %err, kind = err.kind(), "panicked and its new staging pool was refused; retired, its later work fails");
            return self.retire();
        }
        self.release_rebuilt();
        self.rebuilt_registration = Some(staging.as_ptr().addr());
        self.staging = Some(staging);
        self.restarts += 1;
        tracing::error!(
            actor,
            rank,
            panic,
            restarts = self.restarts,
            "panicked; its work failed, restarted with a new staging pool"
        );
    }

    /// Unregisters the staging pool this supervisor rebuilt (idempotent, `supervisor::P3`).
    fn release_rebuilt(&mut self) {
        if let Some(start) = self.rebuilt_registration.take() {
            if let Err(err) = self.pool.unregister_staging(start) {
                tracing::warn!(error = %err, kind = err.kind(), "could not unregister a rebuilt staging pool");
            }
        }
    }
}

impl Drop for StagingSupervisor {
    /// `supervisor::P3`: the rebuilt pool is unregistered before its memory is freed.
    fn drop(&mut self) {
        self.release_rebuilt();
    }
}

#[cfg(test)]
mod tests {
    use actix::{Actor, Context, Handler, MailboxError, Message};

    use super::*;
    use crate::core::eviction::EvictionPolicy;
    use crate::pool::{ManualClock, MemoryPool};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn supervisor(staging: StagingPool) -> Result<StagingSupervisor, Box<dyn std::error::Error>> {
        let policy = EvictionPolicy::mooncake_defaults(1 << 20);
        let pool: Arc<dyn Pool> = Arc::new(MemoryPool::new(policy, Arc::new(ManualClock::new(0)))?);
        let supervisee = Supervisee {
            actor: "loader",
            rank: 0,
        };
        Ok(StagingSupervisor::new(supervisee, pool, staging))
    }

    #[test]
    fn catch_returns_the_answer_or_the_panic_message() {
        assert_eq!(catch(|| 7).ok(), Some(7));
        let panicked = catch(|| -> u32 { panic!("boom {}", 3) }).err();
        assert_eq!(panicked.as_ref().map(Panicked::message), Some("boom 3"));
    }

    /// `supervisor::P1`, `supervisor::P2`: a batch that panics is answered `Panicked`, the host
    /// staging pool is rebuilt with the same shape, and the next batch runs on it.
    #[test]
    fn a_panicking_batch_rebuilds_a_host_staging_pool() -> TestResult {
        let geometry = StagingGeometry::new(64, 3)?;
        let mut supervisor = supervisor(StagingPool::new_host(geometry)?)?;
        let panicked: Option<Batch<()>> = supervisor.run(|_| panic!("injected"));
        assert_eq!(panicked, Some(Batch::Panicked));
        assert!(!supervisor.is_retired());
        let slots = supervisor.run(|staging| {
            let slots = staging.slots();
            (staging, slots)
        });
        assert_eq!(slots, Some(Batch::Done(3)), "rebuilt with the same shape");
        Ok(())
    }

    /// `supervisor::P2`: a lent staging pool is lent once; after `retire` it is never lent again.
    #[test]
    fn a_lent_or_retired_supervisor_lends_nothing() -> TestResult {
        let mut supervisor = supervisor(StagingPool::new_host(StagingGeometry::new(64, 1)?)?)?;
        let lent = supervisor.lend().ok_or("nothing lent")?;
        assert!(supervisor.lend().is_none(), "lent to one batch at a time");
        let answer = supervisor.settle(lent.run(|staging| (staging, 1)));
        assert_eq!(answer, Batch::Done(1));
        supervisor.retire();
        assert!(supervisor.is_retired());
        assert!(supervisor.run(|staging| (staging, ())).is_none());
        Ok(())
    }

    struct Echo;

    impl Actor for Echo {
        type Context = Context<Self>;
    }

    #[derive(Message)]
    #[rtype(result = "u32")]
    struct Ask {
        panic: bool,
    }

    impl Handler<Ask> for Echo {
        type Result = u32;

        fn handle(&mut self, ask: Ask, _ctx: &mut Self::Context) -> u32 {
            assert!(!ask.panic, "injected");
            1
        }
    }

    /// The premise of the module docs: a panic in a handler ends that actor only (its
    /// mailbox closes); another actor on the same Arbiter keeps answering.
    #[actix::test]
    async fn a_panicking_handler_ends_only_its_own_actor() -> TestResult {
        let (victim, witness) = (Echo.start(), Echo.start());
        assert!(victim.send(Ask { panic: true }).await.is_err());
        let later = victim.send(Ask { panic: false }).await;
        assert!(matches!(later, Err(MailboxError::Closed)), "{later:?}");
        assert_eq!(witness.send(Ask { panic: false }).await?, 1);
        Ok(())
    }
}
