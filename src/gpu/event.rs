//! In-flight copies: the completion handle a loader's own thread waits on.
//!
//! Workflow:
//! 1. `CopyStream::scatter` / `gather` returns an [`InFlight`] that owns the staging pool.
//! 2. The loader moves it to its completion thread (it is `Send`), which calls
//!    [`InFlight::wait`]. On CUDA that sleeps in `cuEventSynchronize` on an event recorded
//!    with `CU_EVENT_BLOCKING_SYNC` after the copies; on the host backend the copy is
//!    already done and `wait` returns at once.
//! 3. `wait` gives back the staging pool and the outcome; the loader replies with a message.
//!
//! Invariant `gpu::I3`: the staging pool is reachable only through the `InFlight`
//! until the copy is complete. Fields drop in declaration order, and `event` is declared
//! before `staging`: the CUDA completion's `Drop` synchronizes its event (`cuda::queue::Q1`), so
//! dropping an `InFlight` without waiting still never frees staging memory under a
//! running copy. On CUDA the event holds the `Device` after the pending copy, so the page
//! memory outlives the copy too, and `wait` poisons that device when the copy failed with a
//! sticky error (`cuda::queue::Q3`, `gpu::I7`): the backend's pending copy knows no device.

#[cfg(feature = "cuda")]
use super::backend::cuda::PendingCopy;
#[cfg(feature = "cuda")]
use super::device::Device;
use super::staging::StagingPool;
use super::vocab::{CopyDirection, GpuError, StreamId};

/// How completion is signalled, per backend.
#[derive(Debug)]
enum CopyEvent {
    /// Host backend, or a submission that failed while being issued: the outcome is known.
    Done(Result<(), GpuError>),
    /// CUDA: copies queued on a stream, an event recorded after them.
    #[cfg(feature = "cuda")]
    Cuda {
        /// The event after the copies; declared first so it drops (and synchronizes) first
        /// (`cuda::queue::Q1`).
        pending: PendingCopy,
        /// Keeps the page memory alive while the copy runs; poisoned on a sticky error
        /// (`cuda::queue::Q3`).
        device: Device,
    },
}

impl CopyEvent {
    /// Waits for the copy (CUDA) and returns its outcome.
    fn finish(self) -> Result<(), GpuError> {
        match self {
            Self::Done(outcome) => outcome,
            #[cfg(feature = "cuda")]
            Self::Cuda { pending, device } => device.poison_if_sticky(pending.wait()),
        }
    }
}

/// A submitted copy that owns its staging pool until [`wait`](Self::wait) returns it.
#[must_use = "an in-flight copy holds the staging pool; call wait() to get it back"]
#[derive(Debug)]
pub struct InFlight {
    /// Declared first so it drops before `staging` (`gpu::I3`).
    event: CopyEvent,
    staging: StagingPool,
    stream: StreamId,
    direction: CopyDirection,
    bytes: usize,
}

impl InFlight {
    /// A copy that already finished with `outcome` (host backend, or a submission that
    /// failed while being issued).
    pub(crate) fn completed(
        staging: StagingPool,
        stream: StreamId,
        direction: CopyDirection,
        bytes: usize,
        outcome: Result<(), GpuError>,
    ) -> Self {
        Self {
            event: CopyEvent::Done(outcome),
            staging,
            stream,
            direction,
            bytes,
        }
    }

    /// A copy queued on a CUDA stream; `pending` holds the recorded event, `device` the page
    /// memory the copy reads or writes.
    #[cfg(feature = "cuda")]
    pub(crate) fn pending(
        staging: StagingPool,
        stream: StreamId,
        direction: CopyDirection,
        bytes: usize,
        pending: PendingCopy,
        device: Device,
    ) -> Self {
        Self {
            event: CopyEvent::Cuda { pending, device },
            staging,
            stream,
            direction,
            bytes,
        }
    }

    /// Whether the copy has finished (successfully or not); never blocks.
    pub fn is_complete(&self) -> bool {
        match &self.event {
            CopyEvent::Done(_) => true,
            #[cfg(feature = "cuda")]
            CopyEvent::Cuda { pending, .. } => pending.is_complete(),
        }
    }

    /// Blocks until the copy finishes, then returns the staging pool and the outcome.
    ///
    /// Call it on the loader's own completion thread or in `spawn_blocking`, never on a
    /// shared actix arbiter (a wait there would stall other actors). On failure the destination bytes must be treated as
    /// not written (`gpu::I6`): the host backend leaves them unchanged; on CUDA they may be partly
    /// written.
    pub fn wait(self) -> (StagingPool, Result<(), GpuError>) {
        // Blocks until the copy is done (or failed); only then is staging released (`gpu::I3`).
        let outcome = self.event.finish();
        (self.staging, outcome)
    }

    /// The stream the copy was issued on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Which way the copy moves bytes.
    pub fn direction(&self) -> CopyDirection {
        self.direction
    }

    /// Bytes the copy moves (after coalescing, the same total as the page copies named).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::vocab::StagingGeometry;

    #[test]
    fn wait_returns_the_same_staging_pool_and_outcome() -> Result<(), GpuError> {
        let mut staging = StagingPool::new_host(StagingGeometry::new(4, 2)?)?;
        staging.slot_mut(1)?.copy_from_slice(&[1, 2, 3, 4]);
        let failed = GpuError::CopyFailed {
            stream: StreamId(1),
            direction: CopyDirection::DeviceToHost,
            bytes: 8,
        };
        let in_flight = InFlight::completed(
            staging,
            StreamId(1),
            CopyDirection::DeviceToHost,
            8,
            Err(failed),
        );
        assert!(in_flight.is_complete());
        assert_eq!((in_flight.stream(), in_flight.bytes()), (StreamId(1), 8));
        assert_eq!(in_flight.direction(), CopyDirection::DeviceToHost);
        let (staging, outcome) = in_flight.wait();
        assert_eq!(staging.slot(1)?, &[1, 2, 3, 4]);
        assert_eq!(outcome.map_err(|e| e.kind()), Err("copy_failed"));
        Ok(())
    }

    #[test]
    fn in_flight_and_its_parts_can_move_to_a_completion_thread() {
        fn assert_send<T: Send>() {}
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send::<InFlight>();
        assert_send::<StagingPool>();
        assert_send::<crate::gpu::CopyStream>();
        assert_send_sync::<crate::gpu::Device>();
        assert_send_sync::<GpuError>();
    }
}
