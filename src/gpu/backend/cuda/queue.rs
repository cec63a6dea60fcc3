//! Streams and completion on CUDA: [`CudaStream`] (one non-blocking driver stream per
//! `CopyStream`), [`CudaEvent`] (blocking-sync, no timing) and [`PendingCopy`], the CUDA
//! side of an `InFlight`.
//!
//! Workflow of one submission:
//! 1. `CudaDevice::issue` queues one `cuMemcpy*Async` per planned run on the owner's
//!    stream and records a fresh event after them.
//! 2. The `InFlight` holds a [`PendingCopy`] (and, beside it, the `Device` that keeps the page
//!    memory alive); `wait` sleeps in `cuEventSynchronize` on the caller's thread (a loader's
//!    own thread), then reports success or the driver error.
//!
//! Only the vocabulary is spoken here: a [`PendingCopy`] knows its stream id, direction and
//! byte count, never the device it runs on.
//!
//! Invariants:
//! - `cuda::queue::Q1`. A [`PendingCopy`] that is dropped without `wait` still synchronizes its
//!   event first, so the staging memory it guards is never freed under a running copy (`gpu::I3`).
//!   Its owner declares it before the device handle and the memory, so it drops first.
//! - `cuda::queue::Q2`. A [`CudaStream`] synchronizes before it is destroyed, so no copy it queued
//!   runs after its owner is gone.
//! - `cuda::queue::Q3`. A failure seen while waiting comes back as
//!   `GpuError::CudaCopyFailed` with the driver's error as its source, so whoever waits can tell
//!   a sticky one (`GpuError::is_sticky`) and poison the device (`gpu::I7`): the front's
//!   `InFlight` and `CheckedInFlight` do, through `Device::poison_if_sticky`.

use std::fmt;
use std::sync::Arc;

use super::context::Context;
use super::driver::{self, RawEvent, RawStream};
use crate::gpu::vocab::{CopyDirection, GpuError, StreamId};

/// One non-blocking driver stream, owned by one `CopyStream` (`cuda::queue::Q2`).
pub(crate) struct CudaStream {
    context: Arc<Context>,
    raw: RawStream,
}

// SAFETY: stream handles may be used from any thread (the driver API is thread-safe); the
// owner moves the stream between threads, never shares it unsynchronized.
unsafe impl Send for CudaStream {}
// SAFETY: the driver serializes work queued on one stream from several threads; `&self`
// methods only queue work or wait.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// Creates a stream in `context` (`CU_STREAM_NON_BLOCKING`).
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuCtxSetCurrent` or `cuStreamCreate`.
    pub(crate) fn create(context: Arc<Context>) -> Result<Self, GpuError> {
        context.make_current()?;
        // SAFETY: the context is current on this thread (line above).
        let raw = unsafe { driver::stream_create() }.map_err(GpuError::driver("cuStreamCreate"))?;
        Ok(Self { context, raw })
    }

    /// The raw handle, for queueing copies on it. Valid while `self` lives.
    pub(crate) fn raw(&self) -> RawStream {
        self.raw
    }

    /// Blocks until everything queued so far is done. The context must be current.
    ///
    /// # Errors
    /// [`GpuError::Driver`] with the error of failed work, if any.
    pub(crate) fn synchronize(&self) -> Result<(), GpuError> {
        // SAFETY: the stream is live while `self` lives.
        unsafe { driver::stream_synchronize(self.raw) }
            .map_err(GpuError::driver("cuStreamSynchronize"))
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if self.context.make_current().is_err() {
            return;
        }
        // `cuda::queue::Q2`: nothing this stream queued may outlive it; errors were reported by
        // waits.
        let _ = self.synchronize();
        // SAFETY: destroyed once, here, after its work finished.
        if let Err(error) = unsafe { driver::stream_destroy(self.raw) } {
            tracing::warn!(%error, "destroying a cuda stream failed");
        }
    }
}

impl fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaStream").finish_non_exhaustive()
    }
}

/// One event with `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING`.
pub(crate) struct CudaEvent {
    context: Arc<Context>,
    raw: RawEvent,
}

// SAFETY: event handles may be used from any thread; the event is owned by one value.
unsafe impl Send for CudaEvent {}
// SAFETY: `&self` methods only query or wait, which the driver allows from any thread.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// Creates an event. The context must be current on this thread.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuEventCreate`.
    pub(crate) fn create(context: Arc<Context>) -> Result<Self, GpuError> {
        // SAFETY: the caller made the context current.
        let raw = unsafe { driver::event_create() }.map_err(GpuError::driver("cuEventCreate"))?;
        Ok(Self { context, raw })
    }

    /// Records the event after everything queued on `stream` so far.
    ///
    /// # Errors
    /// [`GpuError::Driver`] from `cuEventRecord`.
    pub(crate) fn record(&self, stream: &CudaStream) -> Result<(), GpuError> {
        // SAFETY: both handles are live while their owners live; same context.
        unsafe { driver::event_record(self.raw, stream.raw()) }
            .map_err(GpuError::driver("cuEventRecord"))
    }

    /// Blocks (sleeping) until the event completes, on the calling thread.
    fn synchronize(&self) -> Result<(), GpuError> {
        self.context.make_current()?;
        // SAFETY: the event is live while `self` lives.
        unsafe { driver::event_synchronize(self.raw) }
            .map_err(GpuError::driver("cuEventSynchronize"))
    }

    /// Whether the event completed (`true` also when the work before it failed).
    fn is_complete(&self) -> bool {
        if self.context.make_current().is_err() {
            return true;
        }
        // SAFETY: the event is live while `self` lives.
        match unsafe { driver::event_query(self.raw) } {
            Ok(()) => true,
            Err(error) => !driver::is_not_ready(error),
        }
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.context.make_current().is_err() {
            return;
        }
        // SAFETY: destroyed once, here; the driver releases a pending event on completion.
        if let Err(error) = unsafe { driver::event_destroy(self.raw) } {
            tracing::warn!(%error, "destroying a cuda event failed");
        }
    }
}

impl fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaEvent").finish_non_exhaustive()
    }
}

/// A submission queued on a CUDA stream, waiting for its event (`cuda::queue::Q1`,
/// `cuda::queue::Q3`).
#[derive(Debug)]
pub(crate) struct PendingCopy {
    event: CudaEvent,
    stream: StreamId,
    direction: CopyDirection,
    bytes: usize,
    /// Set once the event was synchronized, so `Drop` need not wait again.
    finished: bool,
}

impl PendingCopy {
    /// Wraps a recorded event.
    pub(crate) fn new(
        event: CudaEvent,
        stream: StreamId,
        direction: CopyDirection,
        bytes: usize,
    ) -> Self {
        Self {
            event,
            stream,
            direction,
            bytes,
            finished: false,
        }
    }

    /// Whether the copy finished; never blocks.
    pub(crate) fn is_complete(&self) -> bool {
        self.finished || self.event.is_complete()
    }

    /// Blocks on the event, then reports the outcome (`cuda::queue::Q3`: the caller poisons
    /// the device when the error is sticky).
    ///
    /// # Errors
    /// [`GpuError::CudaCopyFailed`] with the driver's error.
    pub(crate) fn wait(mut self) -> Result<(), GpuError> {
        let outcome = self.event.synchronize();
        self.finished = true;
        outcome.map_err(|error| match error {
            GpuError::Driver { source, .. } => GpuError::CudaCopyFailed {
                stream: self.stream,
                direction: self.direction,
                bytes: self.bytes,
                source,
            },
            other => other,
        })
    }
}

impl Drop for PendingCopy {
    fn drop(&mut self) {
        if !self.finished {
            // `cuda::queue::Q1`: dropped without `wait`; the staging pool drops right after this.
            if let Err(error) = self.event.synchronize() {
                tracing::warn!(stream = %self.stream, %error, "an abandoned cuda copy failed");
            }
        }
    }
}
