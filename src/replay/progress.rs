//! Progress of a running replay, for a progress bar: the driver tells a [`ProgressSink`]
//! how many requests have their first token; the CLI draws it, tests use [`NoProgress`].

/// Told about progress, for a progress bar.
pub trait ProgressSink {
    /// The replay starts with `total` requests.
    fn start(&mut self, total: u64) {
        let _ = total;
    }
    /// `completed` requests have their first token at simulated `sim_seconds`.
    fn advance(&mut self, completed: u64, sim_seconds: f64) {
        let _ = (completed, sim_seconds);
    }
    /// The replay ended.
    fn finish(&mut self) {}
    /// Whether the replay should stop admitting work and end early with a partial report
    /// (a signal arrived); asked once per turn of the driver's event loop.
    fn stop_requested(&mut self) -> bool {
        false
    }
}

/// A progress sink that shows nothing.
#[derive(Debug, Default)]
pub struct NoProgress;

impl ProgressSink for NoProgress {}
