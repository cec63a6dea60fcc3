//! A loader actor: owns one staging pool and one copy stream of one rank, and moves the
//! pages of a load pool -> staging -> device (R23-R25).
//!
//! Each loader runs on its own Arbiter, so the blocking pool get and the wait on the copy
//! happen on its own thread, never on a shared event loop. Mailbox:
//! `loaders.mailbox_capacity`; the reservation manager uses `try_send` and fails the load
//! when it is full.
//!
//! # Supervision: restart in place
//!
//! Each load runs under the loader's [`StagingSupervisor`]: a panic inside it (a pool
//! client or a copy that panics) is caught, the load is reported failed (`loader_gone`,
//! R25: the engine computes the prefix) and the loader goes on with the next load on a
//! rebuilt staging pool. A loader whose pinned (CUDA) staging pool was lost retires and
//! answers every later load failed at once, which degrades reuse but never stalls a
//! request.
//!
//! Invariants:
//! - `loader::L1`. Every `LoadBlocks` gets exactly one `RankLoadFinished`, also when the load
//!   panics.
//! - `loader::L2`. A load that did not finish every page is reported failed, never filled (R25).
//! - `loader::L3`. A page the engine took back (the load's grant no longer lends it) is never
//!   written after the release returned (R29, `transfer::LoadGrant`); the load is filled
//!   when every page still lent is.

use std::time::Instant;

use actix::prelude::*;

use crate::core::ledger::{LoadFailure, LoadResult};
use crate::gpu::CopyStream;
use crate::messages::loader::LoadBlocks;
use crate::messages::reservation_manager::RankLoadFinished;
use crate::pool::{actor_fault_fires, ActorFault, Pool};
use crate::transfer::load_pages;

use super::reservation_manager::ReservationManager;
use super::supervisor::{Batch, StagingSupervisor};

/// One loader of one rank.
pub struct Loader {
    pool: std::sync::Arc<dyn Pool>,
    stream: CopyStream,
    /// The staging pool, lent to each load (module docs).
    staging: StagingSupervisor,
    manager: Addr<ReservationManager>,
    mailbox_capacity: usize,
    /// `loaders.load_timeout_ms`: a load still running this long after it started fails.
    load_timeout: std::time::Duration,
}

impl Loader {
    /// Builds a loader owning `stream` and the staging pool `staging` supervises.
    pub fn new(
        pool: std::sync::Arc<dyn Pool>,
        stream: CopyStream,
        staging: StagingSupervisor,
        manager: Addr<ReservationManager>,
        mailbox_capacity: usize,
        load_timeout: std::time::Duration,
    ) -> Self {
        Loader {
            pool,
            stream,
            staging,
            manager,
            mailbox_capacity,
            load_timeout,
        }
    }

    /// Runs one load under the supervisor (`loader::L1`) and returns its result, pages and bytes.
    fn run_load(&mut self, message: &LoadBlocks) -> (LoadResult, u64, u64) {
        const GONE: (LoadResult, u64, u64) = (LoadResult::Failed(LoadFailure::LoaderGone), 0, 0);
        if self.staging.is_retired() {
            return GONE;
        }
        if actor_fault_fires(&*self.pool, ActorFault::StagingExhausted) {
            return (LoadResult::Failed(LoadFailure::DeviceCopy), 0, 0);
        }
        let deadline = Some(message.started_at + self.load_timeout);
        let (pool, stream) = (self.pool.as_ref(), &mut self.stream);
        let supervised = self
            .staging
            .run(|staging| load_pages(pool, stream, staging, message.order(), deadline));
        match supervised {
            Some(Batch::Done(Ok(moved))) => (LoadResult::Filled, moved.pages, moved.bytes),
            Some(Batch::Done(Err(failure))) => (LoadResult::Failed(failure), 0, 0),
            Some(Batch::Panicked) | None => GONE,
        }
    }
}

impl Actor for Loader {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
    }
}

/// Runs the load inline: this actor's Arbiter is its own thread, which may block.
impl Handler<LoadBlocks> for Loader {
    type Result = ();

    fn handle(&mut self, message: LoadBlocks, ctx: &mut Self::Context) {
        let (result, pages, bytes) = self.run_load(&message);
        let report = RankLoadFinished {
            ticket: message.ticket,
            result,
            pages,
            bytes,
            started_at: message.started_at,
        };
        let manager = self.manager.clone();
        ctx.spawn(
            async move {
                if manager.send(report).await.is_err() {
                    tracing::debug!("reservation manager gone; load report dropped");
                }
            }
            .into_actor(self),
        );
        tracing::trace!(
            elapsed_us = Instant::now()
                .duration_since(message.started_at)
                .as_micros(),
            "load done"
        );
    }
}
