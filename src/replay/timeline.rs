//! Time series of a replay, per simulated time bucket, for `replay --report-dir`.
//!
//! The driver asks for a timeline with
//! [`run_replay_with_timeline`](super::driver::run_replay_with_timeline); without it nothing
//! here runs and the replay is unchanged.
//!
//! ## Workflow
//!
//! 1. Each instance's connector is wrapped in a [`ConnectorProbe`] that forwards every hook
//!    unchanged and tallies what the engine side sees of loads: reservations filled or
//!    failed, and the tokens they covered (the offer minus what the engine released).
//! 2. After every engine step the driver moves that tally into the bucket of the current
//!    simulated time ([`TimelineRecorder::loads`]); every first token adds the request's
//!    prompt, pool reuse, local hits, oracle share and TTFT to the bucket of its first token
//!    ([`TimelineRecorder::prompt_done`]).
//! 3. When the simulated clock leaves a bucket, the driver samples each connector's
//!    cumulative [`ConnectorStats`] and books the difference since the previous sample
//!    (lookup outcomes, pages and bytes saved, saves dropped) to the bucket just left
//!    ([`TimelineRecorder::connector_sample`]); once more at the end.
//! 4. [`TimelineRecorder::finish`] gives the [`Timeline`]: buckets with their start time,
//!    and the sorted TTFTs.
//!
//! Buckets start 100 ms wide; when a time falls past `max_buckets`, neighbours are merged
//! pairwise and the width doubles, so the cost stays bounded (at most `max_buckets`
//! buckets, and one connector sample per instance per bucket) whatever the run's length.
//!
//! Invariants:
//! - TL1. Every counter booked goes into exactly one bucket, so bucket sums equal the run's
//!   totals (the report's `reused_tokens`, `lookups`, `pages_saved`, ... for a connector
//!   whose report counts the same things).
//! - TL2. Bucket `i` covers simulated time `[i * bucket_s, (i + 1) * bucket_s)`.
//!
//! Sampling calls [`ReplayConnector::report`] mid-run: for the real connector that is
//! "settle saves, then read the counters", which changes nothing a later lookup sees
//! (every lookup settles saves first anyway, see the driver's docs).

use serde::Serialize;

use super::connectors::ReplayConnector;
use super::cost::{micros_to_seconds, SimMicros};
use super::engine::PromptDone;
use crate::stats::{ConnectorStats, LookupStats};

mod probe;

pub use probe::{ConnectorProbe, LoadTally, ProbeHandle};

/// Width of a bucket before any merge: 100 ms of simulated time.
const FIRST_BUCKET_US: SimMicros = 100_000;

/// What happened in one bucket of simulated time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TimelineBucket {
    /// Simulated second the bucket starts at.
    pub start_s: f64,
    /// Requests whose first token came out in this bucket.
    pub prompts_done: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Their prompt tokens loaded from the pool.
    pub reused_tokens: u64,
    /// Their prompt tokens served by the local prefix cache.
    pub local_hit_tokens: u64,
    /// What an unbounded prefix pool would have reused of their prompts.
    pub oracle_reusable_tokens: u64,
    /// Lookup outcomes counted by the connectors in this bucket.
    pub lookups: LookupStats,
    /// Pages the connectors stored in this bucket.
    pub pages_saved: u64,
    /// Bytes they stored (as stored, `--kv-bytes-scale` applied).
    pub bytes_saved: u64,
    /// Saves the connectors shed in this bucket (R22).
    pub saves_dropped: u64,
    /// Reservations reported filled in this bucket.
    pub loads_filled: u64,
    /// Reservations reported failed in this bucket (R25).
    pub loads_failed: u64,
    /// Prompt tokens the filled reservations covered.
    pub loaded_tokens: u64,
}

impl TimelineBucket {
    /// Adds another bucket's counters (not its start).
    fn add(&mut self, other: &TimelineBucket) {
        self.prompts_done += other.prompts_done;
        self.prompt_tokens += other.prompt_tokens;
        self.reused_tokens += other.reused_tokens;
        self.local_hit_tokens += other.local_hit_tokens;
        self.oracle_reusable_tokens += other.oracle_reusable_tokens;
        self.lookups.merge(&other.lookups);
        self.pages_saved += other.pages_saved;
        self.bytes_saved += other.bytes_saved;
        self.saves_dropped += other.saves_dropped;
        self.loads_filled += other.loads_filled;
        self.loads_failed += other.loads_failed;
        self.loaded_tokens += other.loaded_tokens;
    }
}

/// The time series of one replay (module docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// Width of every bucket, simulated seconds.
    pub bucket_s: f64,
    /// Buckets from simulated time 0 to the last event, in order (TL2).
    pub buckets: Vec<TimelineBucket>,
    /// Time to first token of every completed request, simulated seconds, ascending.
    pub ttft_s: Vec<f64>,
}

impl Timeline {
    /// The sum of every bucket (TL1).
    #[cfg(feature = "internals")]
    pub fn totals(&self) -> TimelineBucket {
        let mut sum = TimelineBucket::default();
        for bucket in &self.buckets {
            sum.add(bucket);
        }
        sum
    }
}

/// One first token, as the recorder books it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptSample {
    /// Simulated time of the first token.
    pub first_token_us: SimMicros,
    /// Time to first token.
    pub ttft_us: SimMicros,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens loaded from the pool.
    pub reused_tokens: u64,
    /// Tokens served by the local prefix cache.
    pub local_hit_tokens: u64,
    /// What the oracle could have reused.
    pub oracle_reusable_tokens: u64,
}

/// Collects the buckets during a run (workflow steps 2-4).
#[derive(Debug)]
pub struct TimelineRecorder {
    bucket_us: SimMicros,
    max_buckets: usize,
    buckets: Vec<TimelineBucket>,
    ttft_us: Vec<SimMicros>,
    /// The last cumulative report of each instance's connector.
    sampled: Vec<ConnectorStats>,
}

impl TimelineRecorder {
    /// A recorder for `instances` connectors keeping at most `max_buckets` buckets (at
    /// least 2).
    pub fn new(instances: usize, max_buckets: usize) -> Self {
        Self {
            bucket_us: FIRST_BUCKET_US,
            max_buckets: max_buckets.max(2),
            buckets: Vec::new(),
            ttft_us: Vec::new(),
            sampled: vec![ConnectorStats::default(); instances],
        }
    }

    /// Whether `from` and `to` fall in different buckets at the current width.
    pub fn crosses_bucket(&self, from: SimMicros, to: SimMicros) -> bool {
        from / self.bucket_us != to / self.bucket_us
    }

    /// The bucket holding `at_us`, merging buckets until it fits.
    fn bucket(&mut self, at_us: SimMicros) -> &mut TimelineBucket {
        let mut index = at_us / self.bucket_us;
        while index >= u64::try_from(self.max_buckets).unwrap_or(u64::MAX) {
            self.coarsen();
            index = at_us / self.bucket_us;
        }
        let index = usize::try_from(index).unwrap_or(usize::MAX);
        if self.buckets.len() <= index {
            self.buckets.resize_with(index + 1, TimelineBucket::default);
        }
        &mut self.buckets[index]
    }

    /// Merges neighbours pairwise and doubles the width.
    fn coarsen(&mut self) {
        let merged = self
            .buckets
            .chunks(2)
            .map(|pair| {
                let mut sum = TimelineBucket::default();
                for bucket in pair {
                    sum.add(bucket);
                }
                sum
            })
            .collect();
        self.buckets = merged;
        self.bucket_us = self.bucket_us.saturating_mul(2);
    }

    /// Books a first token (workflow step 2).
    pub fn prompt_done(&mut self, sample: PromptSample) {
        self.ttft_us.push(sample.ttft_us);
        let bucket = self.bucket(sample.first_token_us);
        bucket.prompts_done += 1;
        bucket.prompt_tokens += sample.prompt_tokens;
        bucket.reused_tokens += sample.reused_tokens;
        bucket.local_hit_tokens += sample.local_hit_tokens;
        bucket.oracle_reusable_tokens += sample.oracle_reusable_tokens;
    }

    /// Books a load tally at `at_us` (workflow step 2).
    pub fn loads(&mut self, at_us: SimMicros, tally: LoadTally) {
        if tally == LoadTally::default() {
            return;
        }
        let bucket = self.bucket(at_us);
        bucket.loads_filled += tally.filled;
        bucket.loads_failed += tally.failed;
        bucket.loaded_tokens += tally.tokens;
    }

    /// Books what `instance`'s connector counted since its previous sample to the bucket
    /// of `at_us` (workflow step 3).
    pub fn connector_sample(
        &mut self,
        at_us: SimMicros,
        instance: usize,
        cumulative: ConnectorStats,
    ) {
        let Some(previous) = self.sampled.get_mut(instance) else {
            return;
        };
        let since = cumulative.since(previous);
        *previous = cumulative;
        let bucket = self.bucket(at_us);
        bucket.lookups.merge(&since.lookups);
        bucket.pages_saved += since.saves.saves_done;
        bucket.bytes_saved += since.saves.bytes_saved;
        bucket.saves_dropped += since.saves.saves_dropped;
    }

    /// The finished timeline (workflow step 4).
    pub fn finish(mut self) -> Timeline {
        let bucket_s = micros_to_seconds(self.bucket_us);
        for (index, bucket) in self.buckets.iter_mut().enumerate() {
            bucket.start_s = micros_to_seconds(
                self.bucket_us
                    .saturating_mul(u64::try_from(index).unwrap_or(u64::MAX)),
            );
        }
        self.ttft_us.sort_unstable();
        Timeline {
            bucket_s,
            buckets: self.buckets,
            ttft_s: self.ttft_us.into_iter().map(micros_to_seconds).collect(),
        }
    }
}

/// The driver's timeline hooks: the recorder, a probe per instance and what each delivered
/// request's prompt and oracle share were (module workflow).
pub(super) struct TimelineHooks {
    recorder: TimelineRecorder,
    probes: Vec<ProbeHandle>,
    /// Per workload index: prompt tokens and oracle-reusable tokens, set on delivery.
    prompts: Vec<(u64, u64)>,
}

impl TimelineHooks {
    /// Hooks for `instances` instances and a workload of `requests` requests.
    pub(super) fn new(instances: usize, requests: usize) -> Self {
        Self {
            recorder: TimelineRecorder::new(instances, MAX_BUCKETS),
            probes: Vec::with_capacity(instances),
            prompts: vec![(0, 0); requests],
        }
    }

    /// Wraps the next instance's connector (step 1).
    pub(super) fn wrap(&mut self, connector: Box<dyn ReplayConnector>) -> Box<dyn ReplayConnector> {
        let (probe, handle) = ConnectorProbe::wrap(connector);
        self.probes.push(handle);
        probe
    }

    /// A request was delivered with `prompt_len` tokens, `oracle` of them reusable.
    pub(super) fn delivered(&mut self, index: usize, prompt_len: usize, oracle: usize) {
        if let Some(slot) = self.prompts.get_mut(index) {
            *slot = (to_u64(prompt_len), to_u64(oracle));
        }
    }

    /// After `instance` stepped at `now`: book its load tally (step 2).
    pub(super) fn after_step(&mut self, instance: usize, now: SimMicros) {
        if let Some(probe) = self.probes.get(instance) {
            let tally = probe.take_loads();
            self.recorder.loads(now, tally);
        }
    }

    /// A first token (step 2).
    pub(super) fn prompt_done(&mut self, done: &PromptDone) {
        let (prompt_tokens, oracle) = self
            .prompts
            .get(done.workload_index)
            .copied()
            .unwrap_or_default();
        self.recorder.prompt_done(PromptSample {
            first_token_us: done.first_token_us,
            ttft_us: done.first_token_us.saturating_sub(done.arrival_us),
            prompt_tokens,
            reused_tokens: to_u64(done.reused_tokens),
            local_hit_tokens: to_u64(done.local_hit_tokens),
            oracle_reusable_tokens: oracle,
        });
    }

    /// The clock moves from `now` to `next`: sample the connectors when it leaves a
    /// bucket (step 3).
    pub(super) fn clock_moves(&mut self, now: SimMicros, next: SimMicros) {
        if self.recorder.crosses_bucket(now, next) {
            self.sample(now);
        }
    }

    /// Samples every connector, booking to the bucket of `now`.
    fn sample(&mut self, now: SimMicros) {
        for (instance, probe) in self.probes.iter().enumerate() {
            let report = probe.sample();
            self.recorder.connector_sample(now, instance, report);
        }
    }

    /// The last sample at `now`, then the timeline; the probes' handles are dropped here,
    /// so finishing an engine drops its connector as without a timeline (step 4).
    pub(super) fn finish(mut self, now: SimMicros) -> Timeline {
        self.sample(now);
        for probe in &self.probes {
            let tally = probe.take_loads();
            self.recorder.loads(now, tally);
        }
        self.probes.clear();
        self.recorder.finish()
    }
}

/// Most buckets a replay's timeline keeps.
const MAX_BUCKETS: usize = 120;

fn to_u64(value: usize) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(at_s: u64, reused: u64) -> PromptSample {
        PromptSample {
            first_token_us: at_s * 1_000_000,
            ttft_us: 500_000,
            prompt_tokens: 100,
            reused_tokens: reused,
            ..PromptSample::default()
        }
    }

    #[test]
    fn buckets_merge_pairwise_and_keep_every_count_tl1() {
        let mut recorder = TimelineRecorder::new(1, 8);
        recorder.prompt_done(done(0, 10));
        recorder.prompt_done(done(100, 20));
        recorder.loads(
            5_000_000,
            LoadTally {
                filled: 2,
                failed: 1,
                tokens: 64,
            },
        );
        let timeline = recorder.finish();
        assert!(timeline.buckets.len() <= 8);
        assert!(timeline.bucket_s >= 100.0 / 8.0, "{}", timeline.bucket_s);
        let totals = timeline.totals();
        assert_eq!(totals.prompts_done, 2);
        assert_eq!(totals.reused_tokens, 30);
        assert_eq!(totals.loads_filled, 2);
        assert_eq!(totals.loaded_tokens, 64);
        assert_eq!(timeline.buckets[0].reused_tokens, 10);
        let last = timeline.buckets.last().map(|b| b.reused_tokens);
        assert_eq!(last, Some(20));
        assert_eq!(timeline.ttft_s, vec![0.5, 0.5]);
    }

    #[test]
    fn bucket_starts_follow_the_width_tl2() {
        let mut recorder = TimelineRecorder::new(1, 4);
        recorder.prompt_done(done(1, 0));
        let timeline = recorder.finish();
        for (index, bucket) in timeline.buckets.iter().enumerate() {
            let expected = timeline.bucket_s * f64::from(u32::try_from(index).unwrap_or(0));
            assert!((bucket.start_s - expected).abs() < 1e-9);
        }
        assert!(timeline.buckets.last().is_some_and(|b| b.prompts_done == 1));
    }

    #[test]
    fn connector_samples_book_differences() {
        let mut recorder = TimelineRecorder::new(2, 16);
        let mut report = ConnectorStats::default();
        report.lookups.full = 3;
        report.saves.saves_done = 10;
        recorder.connector_sample(0, 1, report.clone());
        report.lookups.full = 5;
        report.lookups.full_miss = 1;
        report.saves.saves_done = 12;
        recorder.connector_sample(1_000_000, 1, report.clone());
        recorder.connector_sample(1_000_000, 7, report);
        let timeline = recorder.finish();
        assert_eq!(timeline.buckets[0].lookups.full, 3);
        let late = timeline
            .buckets
            .last()
            .map(|b| (b.lookups.full, b.pages_saved));
        assert_eq!(late, Some((2, 2)));
        assert_eq!(timeline.totals().lookups.with_outage(), 6);
    }

    #[test]
    fn crossing_a_bucket_is_seen_at_the_current_width() {
        let recorder = TimelineRecorder::new(1, 4);
        assert!(!recorder.crosses_bucket(0, FIRST_BUCKET_US - 1));
        assert!(recorder.crosses_bucket(0, FIRST_BUCKET_US));
    }
}
