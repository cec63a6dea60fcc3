//! The actor sections after validation: what [`Config::validate`](super::Config::validate)
//! returns, each value in the type its check proved.
//!
//! - counts that must not be zero are `NonZeroUsize` (a mailbox, a queue, a chunk);
//! - sizes with a ceiling are `NonZeroU64` within it (staging pools);
//! - times are `Duration`s within their ceiling (one day), so no deadline overflows;
//! - token counts are `usize`, converted once with a check, and "off" is `None`.
//!
//! Invariant: the runtime takes these values as they are. Nothing downstream clamps,
//! saturates or checks them again; every entry point that takes a plain [`Config`]
//! (which anyone can build or edit) validates it once and passes these down
//! (`ConnectorHandle::start`, the replay, `kv-connector inspect`).
//!
//! Each section's check runs its keys in field order with the refusals of `validate.rs`
//! (key, env variable, value and a working value in every message).

use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::time::Duration;

use crate::core::pool_health::HealthPolicy;

use super::error::ConfigError;
use super::validate::{
    at_most, bounded, bounded_count, millis, nonzero, refusal, tokens, MAX_CALLS_IN_FLIGHT,
    MAX_LOAD_THREADS, MAX_PARK_AFTER_IDLE_MS, MAX_POLL_INTERVAL_US, MAX_STAGING_BYTES,
    MAX_TIMEOUT_MS, MAX_UNREACHABLE_AFTER_FAILURES,
};
use super::{
    Config, HandoffConfig, LoadersConfig, PlannerConfig, PoolConfig, ReservationsConfig,
    SaverConfig, StatsConfig,
};

/// The validated actor sections of one [`Config`], and the pool calls' deadlines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// The deadlines and health policy of pool calls (`[pool]`, R30).
    pub pool_calls: PoolCalls,
    /// `[planner]`.
    pub planner: Planner,
    /// `[reservations]`.
    pub reservations: Reservations,
    /// `[loaders]`.
    pub loaders: Loaders,
    /// `[saver]`.
    pub saver: Saver,
    /// `[handoff]`.
    pub handoff: Handoff,
    /// `[stats]`.
    pub stats: Stats,
}

/// `[planner]`, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planner {
    /// `probe_chunk`: keys per concurrent existence probe (R10).
    pub probe_chunk: NonZeroUsize,
    /// `window_fallback` (R13).
    pub window_fallback: bool,
    /// `swa_endpoint_rewind_tokens`: `R` (R12, R17).
    pub rewind_tokens: usize,
    /// `mailbox_capacity`; also the capacity of the planner's queue of waiting lookups.
    pub mailbox_capacity: NonZeroUsize,
    /// `max_concurrent_lookups`.
    pub max_concurrent_lookups: NonZeroUsize,
    /// `lookup_timeout_ms`: 1 ms to one day (R30).
    pub lookup_timeout: Duration,
}

/// The pool-call keys of `[pool]`, validated (R30).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolCalls {
    /// `probe_timeout_ms`: 1 ms to one day.
    pub probe_timeout: Duration,
    /// `calls_in_flight`: at most [`MAX_CALLS_IN_FLIGHT`].
    pub calls_in_flight: NonZeroUsize,
    /// `unreachable_after_failures`, `retry_initial_ms` and `retry_max_ms` (at least
    /// `retry_initial_ms`, at most one day).
    pub health: HealthPolicy,
}

/// `[reservations]`, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservations {
    /// `mailbox_capacity`.
    pub mailbox_capacity: NonZeroUsize,
    /// `prefix_aware_scheduling` (R7).
    pub prefix_aware_scheduling: bool,
}

/// `[loaders]`, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loaders {
    /// `load_threads`: loaders per rank, at most [`MAX_LOAD_THREADS`].
    pub load_threads: NonZeroUsize,
    /// `sync_load` (R23).
    pub sync_load: bool,
    /// `staging_bytes_per_loader`, at most [`MAX_STAGING_BYTES`].
    pub staging_bytes_per_loader: NonZeroU64,
    /// `mailbox_capacity`.
    pub mailbox_capacity: NonZeroUsize,
    /// `load_timeout_ms`: 1 ms to one day (R25).
    pub load_timeout: Duration,
}

/// `[saver]`, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Saver {
    /// `window_first` (R21).
    pub window_first: bool,
    /// `resave_min_tokens`: the re-save threshold, `None` when off (0, R20).
    pub resave_min_tokens: Option<NonZeroUsize>,
    /// `window_checkpoint_tokens`: the checkpoint interval, `None` when off (0, R28).
    pub window_checkpoint_tokens: Option<NonZeroUsize>,
    /// `queue_capacity_pages` (R22).
    pub queue_capacity_pages: NonZeroUsize,
    /// `staging_bytes`, at most [`MAX_STAGING_BYTES`].
    pub staging_bytes: NonZeroU64,
    /// `mailbox_capacity`.
    pub mailbox_capacity: NonZeroUsize,
    /// `shutdown_drain_timeout_ms`: zero to one day.
    pub shutdown_drain_timeout: Duration,
    /// `no_space_retries`: at most [`MAX_NO_SPACE_RETRIES`] (R35).
    pub no_space_retries: u32,
    /// `no_space_backoff_ms`: at most [`MAX_NO_SPACE_BACKOFF_MS`] (R35).
    pub no_space_backoff: Duration,
}

/// The most retries of a put refused for room: 16 doublings of the backoff already wait
/// minutes.
pub const MAX_NO_SPACE_RETRIES: u32 = 16;
/// The longest first backoff of such a retry (one second).
pub const MAX_NO_SPACE_BACKOFF_MS: u64 = 1000;

/// `[handoff]`, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handoff {
    /// `outbox_capacity`.
    pub outbox_capacity: NonZeroUsize,
    /// `poll_interval_us`: zero to [`MAX_POLL_INTERVAL_US`] µs.
    pub poll_interval: Duration,
    /// `park_after_idle_ms`: zero to [`MAX_PARK_AFTER_IDLE_MS`] ms.
    pub park_after_idle: Duration,
}

/// `[stats]`, validated (`metrics_addr` is checked, and parsed by the endpoint's owner).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// `interval_s`: one second to one day (R27).
    pub interval: Duration,
}

impl RuntimeConfig {
    /// Checks the actor sections of `config` in section order (the first refusal is
    /// returned).
    pub(super) fn check(config: &Config) -> Result<Self, ConfigError> {
        Ok(Self {
            pool_calls: PoolCalls::check(&config.pool)?,
            planner: Planner::check(&config.planner)?,
            reservations: Reservations::check(&config.reservations)?,
            loaders: Loaders::check(&config.loaders)?,
            saver: Saver::check(&config.saver)?,
            handoff: Handoff::check(&config.handoff)?,
            stats: Stats::check(&config.stats)?,
        })
    }
}

impl Planner {
    fn check(planner: &PlannerConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            probe_chunk: nonzero(planner.probe_chunk, "planner.probe_chunk", "4096")?,
            mailbox_capacity: nonzero(planner.mailbox_capacity, "planner.mailbox_capacity", "256")?,
            max_concurrent_lookups: nonzero(
                planner.max_concurrent_lookups,
                "planner.max_concurrent_lookups",
                "32",
            )?,
            rewind_tokens: tokens(
                planner.swa_endpoint_rewind_tokens,
                "planner.swa_endpoint_rewind_tokens",
                "2048",
            )?,
            window_fallback: planner.window_fallback,
            lookup_timeout: millis(bounded(
                planner.lookup_timeout_ms,
                "planner.lookup_timeout_ms",
                MAX_TIMEOUT_MS,
                "1000",
            )?),
        })
    }
}

impl PoolCalls {
    fn check(pool: &PoolConfig) -> Result<Self, ConfigError> {
        let retry_initial = bounded(
            pool.retry_initial_ms,
            "pool.retry_initial_ms",
            MAX_TIMEOUT_MS,
            "250",
        )?;
        let retry_max = bounded(
            pool.retry_max_ms,
            "pool.retry_max_ms",
            MAX_TIMEOUT_MS,
            "5000",
        )?;
        if retry_max < retry_initial {
            return Err(refusal(
                "pool.retry_max_ms",
                &retry_max,
                &format!(
                    "must be at least pool.retry_initial_ms ({retry_initial}), e.g. {}",
                    retry_initial.get().max(5000)
                ),
            ));
        }
        let unreachable_after = bounded(
            pool.unreachable_after_failures,
            "pool.unreachable_after_failures",
            MAX_UNREACHABLE_AFTER_FAILURES,
            "3",
        )?;
        // At most MAX_UNREACHABLE_AFTER_FAILURES, so it fits.
        let unreachable_after = NonZeroU32::try_from(unreachable_after).unwrap_or(NonZeroU32::MAX);
        Ok(Self {
            probe_timeout: millis(bounded(
                pool.probe_timeout_ms,
                "pool.probe_timeout_ms",
                MAX_TIMEOUT_MS,
                "250",
            )?),
            calls_in_flight: bounded_count(
                pool.calls_in_flight,
                "pool.calls_in_flight",
                MAX_CALLS_IN_FLIGHT,
                "16",
            )?,
            health: HealthPolicy {
                unreachable_after,
                retry_initial: millis(retry_initial),
                retry_max: millis(retry_max),
            },
        })
    }
}

impl Reservations {
    fn check(reservations: &ReservationsConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            mailbox_capacity: nonzero(
                reservations.mailbox_capacity,
                "reservations.mailbox_capacity",
                "1024",
            )?,
            prefix_aware_scheduling: reservations.prefix_aware_scheduling,
        })
    }
}

impl Loaders {
    fn check(loaders: &LoadersConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            load_threads: bounded_count(
                loaders.load_threads,
                "loaders.load_threads",
                MAX_LOAD_THREADS,
                "2",
            )?,
            staging_bytes_per_loader: bounded(
                loaders.staging_bytes_per_loader,
                "loaders.staging_bytes_per_loader",
                MAX_STAGING_BYTES,
                "268435456 (256MiB)",
            )?,
            mailbox_capacity: nonzero(loaders.mailbox_capacity, "loaders.mailbox_capacity", "64")?,
            load_timeout: millis(bounded(
                loaders.load_timeout_ms,
                "loaders.load_timeout_ms",
                MAX_TIMEOUT_MS,
                "30000",
            )?),
            sync_load: loaders.sync_load,
        })
    }
}

impl Saver {
    fn check(saver: &SaverConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            queue_capacity_pages: nonzero(
                saver.queue_capacity_pages,
                "saver.queue_capacity_pages",
                "65536",
            )?,
            staging_bytes: bounded(
                saver.staging_bytes,
                "saver.staging_bytes",
                MAX_STAGING_BYTES,
                "268435456 (256MiB)",
            )?,
            shutdown_drain_timeout: Duration::from_millis(at_most(
                saver.shutdown_drain_timeout_ms,
                "saver.shutdown_drain_timeout_ms",
                MAX_TIMEOUT_MS,
                &format!("must be at most {MAX_TIMEOUT_MS} (one day), e.g. 10000"),
            )?),
            mailbox_capacity: nonzero(saver.mailbox_capacity, "saver.mailbox_capacity", "1024")?,
            no_space_retries: u32::try_from(at_most(
                u64::from(saver.no_space_retries),
                "saver.no_space_retries",
                u64::from(MAX_NO_SPACE_RETRIES),
                &format!("must be at most {MAX_NO_SPACE_RETRIES}, e.g. 3"),
            )?)
            .unwrap_or(MAX_NO_SPACE_RETRIES),
            no_space_backoff: Duration::from_millis(at_most(
                saver.no_space_backoff_ms,
                "saver.no_space_backoff_ms",
                MAX_NO_SPACE_BACKOFF_MS,
                &format!("must be at most {MAX_NO_SPACE_BACKOFF_MS} (one second), e.g. 20"),
            )?),
            resave_min_tokens: NonZeroUsize::new(tokens(
                saver.resave_min_tokens,
                "saver.resave_min_tokens",
                "32768",
            )?),
            window_checkpoint_tokens: NonZeroUsize::new(tokens(
                saver.window_checkpoint_tokens,
                "saver.window_checkpoint_tokens",
                "8192",
            )?),
            window_first: saver.window_first,
        })
    }
}

impl Handoff {
    fn check(handoff: &HandoffConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            outbox_capacity: nonzero(handoff.outbox_capacity, "handoff.outbox_capacity", "1024")?,
            poll_interval: Duration::from_micros(at_most(
                handoff.poll_interval_us,
                "handoff.poll_interval_us",
                MAX_POLL_INTERVAL_US,
                &format!("must be at most {MAX_POLL_INTERVAL_US}, e.g. 100"),
            )?),
            park_after_idle: Duration::from_millis(at_most(
                handoff.park_after_idle_ms,
                "handoff.park_after_idle_ms",
                MAX_PARK_AFTER_IDLE_MS,
                &format!("must be at most {MAX_PARK_AFTER_IDLE_MS}, e.g. 200"),
            )?),
        })
    }
}

impl Stats {
    fn check(stats: &StatsConfig) -> Result<Self, ConfigError> {
        let seconds = bounded(
            stats.interval_s,
            "stats.interval_s",
            MAX_TIMEOUT_MS / 1000,
            "30",
        )?;
        Ok(Self {
            interval: Duration::from_secs(seconds.get()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults, typed: what `config/default.toml` documents.
    #[test]
    fn the_defaults_validate_to_their_typed_values() -> Result<(), ConfigError> {
        let runtime = Config::default().validate()?;
        assert_eq!(runtime.planner.probe_chunk.get(), 4096);
        assert_eq!(runtime.planner.rewind_tokens, 2048);
        assert_eq!(runtime.loaders.load_threads.get(), 2);
        assert_eq!(runtime.loaders.load_timeout, Duration::from_secs(30));
        assert_eq!(runtime.saver.resave_min_tokens, None, "0 is off");
        assert_eq!(
            runtime.saver.shutdown_drain_timeout,
            Duration::from_secs(10)
        );
        assert_eq!(runtime.handoff.poll_interval, Duration::from_micros(100));
        assert_eq!(runtime.handoff.park_after_idle, Duration::from_millis(200));
        assert_eq!(runtime.stats.interval, Duration::from_secs(30));
        Ok(())
    }

    /// A threshold is kept as given; zero durations are allowed where the key allows 0.
    #[test]
    fn set_values_keep_their_meaning() -> Result<(), ConfigError> {
        let mut config = Config::default();
        config.saver.resave_min_tokens = 64;
        config.saver.shutdown_drain_timeout_ms = 0;
        config.handoff.poll_interval_us = 0;
        let runtime = config.validate()?;
        assert_eq!(
            runtime.saver.resave_min_tokens.map(NonZeroUsize::get),
            Some(64)
        );
        assert_eq!(runtime.saver.shutdown_drain_timeout, Duration::ZERO);
        assert_eq!(runtime.handoff.poll_interval, Duration::ZERO);
        Ok(())
    }
}
