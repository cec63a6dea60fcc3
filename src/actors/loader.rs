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
//! A panic inside a load (a pool client or a copy that panics) is caught around the load,
//! the load is reported failed (`loader_gone`, R25: the engine computes the prefix) and the
//! loader goes on with the next load. The staging pool was moved into the load and is lost
//! with the panic, so the loader rebuilds one of the same shape (host memory, registered
//! with the pool like the first one) before it answers again. A pinned (CUDA) staging pool
//! cannot be rebuilt without the device: that loader then retires and answers every later
//! load failed at once, which degrades reuse but never stalls a request. The copy stream is
//! borrowed by the load, not moved, so it survives.
//!
//! Invariants:
//! - `loader::L1`. Every `LoadBlocks` gets exactly one `RankLoadFinished`, also when the load
//!   panics.
//! - `loader::L2`. A load that did not finish every page is reported failed, never filled (R25).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use actix::prelude::*;

use crate::core::ledger::{LoadFailure, LoadResult};
use crate::gpu::{CopyStream, StagingGeometry, StagingPool};
use crate::messages::loader::LoadBlocks;
use crate::messages::reservation_manager::RankLoadFinished;
use crate::pool::{actor_fault_fires, ActorFault, Pool};
use crate::transfer::load_pages;

use super::reservation_manager::ReservationManager;

/// One loader of one rank.
pub struct Loader {
    pool: std::sync::Arc<dyn Pool>,
    stream: CopyStream,
    /// `None` while a load runs (it is moved into the copy and back), or for good once a
    /// pinned pool was lost to a panic (the loader retired).
    staging: Option<StagingPool>,
    /// The staging pool's shape and memory kind, to rebuild it after a panic.
    staging_shape: (StagingGeometry, bool),
    /// Start address of a staging pool this loader rebuilt and registered itself (the
    /// connector unregisters only the ones it made).
    rebuilt_registration: Option<usize>,
    manager: Addr<ReservationManager>,
    mailbox_capacity: usize,
    /// `loaders.load_timeout_ms`: a load still running this long after it started fails.
    load_timeout: std::time::Duration,
}

impl Loader {
    /// Builds a loader owning `stream` and `staging`.
    pub fn new(
        pool: std::sync::Arc<dyn Pool>,
        stream: CopyStream,
        staging: StagingPool,
        manager: Addr<ReservationManager>,
        mailbox_capacity: usize,
        load_timeout: std::time::Duration,
    ) -> Self {
        Loader {
            pool,
            stream,
            staging_shape: (staging.geometry(), staging.is_pinned()),
            staging: Some(staging),
            rebuilt_registration: None,
            manager,
            mailbox_capacity,
            load_timeout,
        }
    }

    /// Runs one load under the panic guard (`loader::L1`) and returns its result, pages and bytes.
    fn run_load(&mut self, message: &LoadBlocks) -> (LoadResult, u64, u64) {
        let Some(staging) = self.staging.take() else {
            return (LoadResult::Failed(LoadFailure::LoaderGone), 0, 0);
        };
        if actor_fault_fires(&*self.pool, ActorFault::StagingExhausted) {
            self.staging = Some(staging);
            return (LoadResult::Failed(LoadFailure::DeviceCopy), 0, 0);
        }
        let deadline = Some(message.started_at + self.load_timeout);
        let (pool, stream) = (self.pool.as_ref(), &mut self.stream);
        let guarded = catch_unwind(AssertUnwindSafe(|| {
            load_pages(pool, stream, staging, &message.items, deadline)
        }));
        let Ok((staging, outcome)) = guarded else {
            self.restart();
            return (LoadResult::Failed(LoadFailure::LoaderGone), 0, 0);
        };
        self.staging = Some(staging);
        match outcome {
            Ok(moved) => (LoadResult::Filled, moved.pages, moved.bytes),
            Err(failure) => (LoadResult::Failed(failure), 0, 0),
        }
    }

    /// After a panic: rebuild a host staging pool of the same shape, or retire (module docs).
    fn restart(&mut self) {
        let (geometry, pinned) = self.staging_shape;
        if pinned {
            tracing::error!(
                "loader panicked and its pinned staging pool is lost; loader retired, its loads fail"
            );
            return;
        }
        let staging = StagingPool::new_host(geometry);
        if let Err(err) = self.pool.register_staging(staging.bytes()) {
            tracing::error!(error = %err, kind = err.kind(), "loader panicked and its new staging pool was refused; loader retired");
            return;
        }
        self.release_rebuilt();
        self.rebuilt_registration = Some(staging.as_ptr().addr());
        self.staging = Some(staging);
        tracing::error!("loader panicked during a load; load failed, loader restarted");
    }

    /// Unregisters a staging pool this loader rebuilt (idempotent).
    fn release_rebuilt(&mut self) {
        if let Some(start) = self.rebuilt_registration.take() {
            if let Err(err) = self.pool.unregister_staging(start) {
                tracing::warn!(error = %err, kind = err.kind(), "could not unregister a rebuilt staging pool");
            }
        }
    }
}

impl Actor for Loader {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.release_rebuilt();
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
