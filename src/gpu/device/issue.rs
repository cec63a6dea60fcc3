//! Plain submissions reaching a backend: [`Device::issue`] resolves planned runs to pool
//! indices and hands them, with the staging bytes, to the host backend (copied now) or to
//! CUDA (queued, an event recorded), and wraps the outcome in an [`InFlight`].

#[cfg(feature = "cuda")]
use crate::gpu::backend::cuda::PendingCopy;
use crate::gpu::event::InFlight;
use crate::gpu::staging::StagingPool;
use crate::gpu::stream::StreamBackend;
use crate::gpu::vocab::{CopyDirection, CopyRun, GpuError, StreamId};

use super::{Backend, Device};

impl Device {
    /// Issues planned runs of one submission on `stream` (which this device made). The
    /// host backend copies now, one page lock at a time (`host::H2`); CUDA queues one async copy
    /// per run and records an event after them (`cuda::K2`). The runs come from `plan_copies`
    /// against this device (`copy::C1`).
    ///
    /// # Errors
    /// The staging pool and the error when the submission could not be issued; no issued
    /// copy still touches the pool then (`cuda::K2`). [`GpuError::UnknownGroup`] only if a run
    /// names a group of another device; on CUDA `GpuError::Driver` (a sticky one poisons).
    pub(crate) fn issue(
        &self,
        stream: &StreamBackend,
        id: StreamId,
        direction: CopyDirection,
        runs: &[CopyRun],
        mut staging: StagingPool,
    ) -> Result<InFlight, (StagingPool, GpuError)> {
        let bytes = runs.iter().map(|run| run.len).sum();
        // Resolve every pool first, so an error cannot leave a copy half done.
        let resolved = match self.resolve_runs(runs) {
            Ok(resolved) => resolved,
            Err(error) => return Err((staging, error)),
        };
        match (&self.shared.backend, stream) {
            (Backend::Host(host), StreamBackend::Host) => {
                let bytes_mut = staging.bytes_mut();
                for (pool, run) in &resolved {
                    host.copy_run(direction, *pool, run, bytes_mut);
                }
                Ok(InFlight::completed(staging, id, direction, bytes, Ok(())))
            }
            #[cfg(feature = "cuda")]
            (Backend::Cuda(cuda), StreamBackend::Cuda(cuda_stream)) => {
                let queued = cuda.issue(cuda_stream, direction, &resolved, staging.bytes_mut());
                match self.poison_if_sticky(queued) {
                    Ok(event) => {
                        let pending = PendingCopy::new(event, id, direction, bytes);
                        let device = self.clone();
                        Ok(InFlight::pending(
                            staging, id, direction, bytes, pending, device,
                        ))
                    }
                    Err(error) => Err((staging, error)),
                }
            }
            #[cfg(feature = "cuda")]
            _ => Err((staging, GpuError::BackendMismatch { stream: id })),
        }
    }

    /// Resolves each run's group to its pool index (`cuda::K1`), so no copy starts unless all can.
    fn resolve_runs(&self, runs: &[CopyRun]) -> Result<Vec<(usize, CopyRun)>, GpuError> {
        runs.iter()
            .map(|run| Ok((self.shared.geometry.index_of(run.group)?, *run)))
            .collect()
    }
}
