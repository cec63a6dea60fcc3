//! A loader actor: owns one staging pool and one copy stream of one rank, and moves the
//! pages of a load pool -> staging -> device (R23-R25).
//!
//! Each loader runs on its own Arbiter, so the blocking pool get and the wait on the copy
//! happen on its own thread, never on a shared event loop (STYLE G9). Mailbox:
//! `loaders.mailbox_capacity`; the reservation manager uses `try_send` and fails the load
//! when it is full.

use std::time::Instant;

use actix::prelude::*;

use crate::connector::transfer::load_pages;
use crate::core::ledger::{LoadFailure, LoadResult};
use crate::gpu::{CopyStream, StagingPool};
use crate::messages::loader::LoadBlocks;
use crate::messages::reservation_manager::RankLoadFinished;
use crate::pool::Pool;

use super::reservation_manager::ReservationManager;

/// One loader of one rank.
pub struct Loader {
    pool: std::sync::Arc<dyn Pool>,
    stream: CopyStream,
    /// `None` only while a load runs (it is moved into the copy and back).
    staging: Option<StagingPool>,
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
            staging: Some(staging),
            manager,
            mailbox_capacity,
            load_timeout,
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
        let (result, pages, bytes) = match self.staging.take() {
            Some(staging) => {
                let (staging, outcome) = load_pages(
                    self.pool.as_ref(),
                    &mut self.stream,
                    staging,
                    &message.items,
                    Some(message.started_at + self.load_timeout),
                );
                self.staging = Some(staging);
                match outcome {
                    Ok(moved) => (LoadResult::Filled, moved.pages, moved.bytes),
                    Err(failure) => (LoadResult::Failed(failure), 0, 0),
                }
            }
            None => (LoadResult::Failed(LoadFailure::LoaderGone), 0, 0),
        };
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
