//! `Config::validate`: refuses settings that parse but cannot work (R9).
//!
//! Every refusal names the key (dotted path and env variable), the refused value and a
//! value that works. Checks run in section order and the first failure is returned.

use std::fmt::Display;
use std::num::{NonZeroU64, NonZeroUsize};
use std::time::Duration;

use super::error::ConfigError;
use super::keys::env_of;
use super::runtime::RuntimeConfig;
use super::sections::{PoolBackend, MOONCAKE_MIN_SEGMENT_BYTES, MOONCAKE_SHARED_MEMORY_SPARE_BYTES};
use super::{Config, MooncakeConfig};

/// The refusal of `value` for `key`, with `hint` saying what works.
pub(super) fn refusal(key: &'static str, value: &dyn Display, hint: &str) -> ConfigError {
    ConfigError::OutOfRange {
        key,
        env: env_of(key),
        value: value.to_string(),
        hint: hint.to_owned(),
    }
}

/// Refuses `value` for `key` unless `ok`, with `hint` saying what works.
fn require(
    ok: bool,
    key: &'static str,
    value: &dyn Display,
    hint: &str,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(refusal(key, value, hint))
    }
}

/// Refuses a zero count or size.
fn positive(value: u64, key: &'static str, example: &str) -> Result<(), ConfigError> {
    require(
        value > 0,
        key,
        &value,
        &format!("must be at least 1, e.g. {example}"),
    )
}

/// Refuses a zero count; the count as the nonzero type the runtime takes.
pub(super) fn nonzero(
    value: usize,
    key: &'static str,
    example: &str,
) -> Result<NonZeroUsize, ConfigError> {
    NonZeroUsize::new(value)
        .ok_or_else(|| refusal(key, &value, &format!("must be at least 1, e.g. {example}")))
}

/// The hint of a value outside `1..=max`.
fn range_hint(max: &dyn Display, example: &str) -> String {
    format!("must be at least 1 and at most {max}, e.g. {example}")
}

/// Refuses a value outside `1..=max` (a size a process cannot use: a huge staging pool
/// aborts on allocation, a huge timeout overflows the deadline arithmetic).
pub(super) fn bounded(
    value: u64,
    key: &'static str,
    max: u64,
    example: &str,
) -> Result<NonZeroU64, ConfigError> {
    NonZeroU64::new(value)
        .filter(|value| value.get() <= max)
        .ok_or_else(|| refusal(key, &value, &range_hint(&max, example)))
}

/// [`bounded`] for a count.
pub(super) fn bounded_count(
    value: usize,
    key: &'static str,
    max: usize,
    example: &str,
) -> Result<NonZeroUsize, ConfigError> {
    NonZeroUsize::new(value)
        .filter(|value| value.get() <= max)
        .ok_or_else(|| refusal(key, &value, &range_hint(&max, example)))
}

/// Refuses a value above `max` (zero allowed), with `hint` saying what works.
pub(super) fn at_most(
    value: u64,
    key: &'static str,
    max: u64,
    hint: &str,
) -> Result<u64, ConfigError> {
    require(value <= max, key, &value, hint).map(|()| value)
}

/// A bounded millisecond count as a time.
pub(super) fn millis(value: NonZeroU64) -> Duration {
    Duration::from_millis(value.get())
}

/// A token count as the `usize` the runtime counts tokens in (refused only where `usize`
/// is narrower than 64 bits).
pub(super) fn tokens(value: u64, key: &'static str, example: &str) -> Result<usize, ConfigError> {
    usize::try_from(value).map_err(|_| {
        refusal(
            key,
            &value,
            &format!("must be at most {}, e.g. {example}", usize::MAX),
        )
    })
}

/// Most loader threads per rank: each owns a thread, a stream and a staging pool.
pub const MAX_LOAD_THREADS: usize = 64;
/// Largest staging pool (64 GiB): a batch never needs more, and an allocation the host
/// cannot make would abort the process instead of failing with an error.
pub const MAX_STAGING_BYTES: u64 = 64 << 30;
/// Longest timeout in milliseconds (one day): longer ones overflow deadline arithmetic.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// Most `handoff.poll_interval_us`: 10 ms; longer would add more to every lookup and
/// load than it saves.
pub const MAX_POLL_INTERVAL_US: u64 = 10_000;
/// Most `pool.calls_in_flight`: each may hold a thread while the backend answers.
pub const MAX_CALLS_IN_FLIGHT: usize = 1024;
/// Most `pool.unreachable_after_failures`.
pub const MAX_UNREACHABLE_AFTER_FAILURES: u64 = 1000;
/// Most `handoff.park_after_idle_ms`: one minute.
pub const MAX_PARK_AFTER_IDLE_MS: u64 = 60_000;

/// Refuses a ratio outside `(0, 1]` (NaN included).
fn ratio(value: f64, key: &'static str, example: &str) -> Result<(), ConfigError> {
    require(
        value > 0.0 && value <= 1.0,
        key,
        &value,
        &format!("must be in (0, 1], e.g. {example}"),
    )
}

/// Refuses a key segment that is empty (when `allow_empty` is false) or contains `/`.
fn key_segment(
    value: &str,
    key: &'static str,
    allow_empty: bool,
    example: &str,
) -> Result<(), ConfigError> {
    let ok = crate::core::keys::segment_chars_ok(value) && (allow_empty || !value.is_empty());
    let what = if allow_empty {
        "must not contain '/' or whitespace"
    } else {
        "must be non-empty and must not contain '/' or whitespace"
    };
    require(
        ok,
        key,
        &format_args!("{value:?}"),
        &format!("{what}, e.g. {example:?}"),
    )
}

/// Whether `address` is `HOST:PORT` with a non-empty host and a nonzero port.
fn is_host_port(address: &str) -> bool {
    address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
}

/// The `[mooncake]` section: addresses that parse, a segment the client can mount.
fn check_mooncake(mooncake: &MooncakeConfig) -> Result<(), ConfigError> {
    require(
        !mooncake.local_hostname.is_empty(),
        "mooncake.local_hostname",
        &"\"\"",
        "must name this node's address, e.g. \"127.0.0.1\"",
    )?;
    require(
        is_host_port(&mooncake.master_address),
        "mooncake.master_address",
        &format_args!("{:?}", mooncake.master_address),
        "must be HOST:PORT, e.g. \"127.0.0.1:50051\"",
    )?;
    require(
        !mooncake.is_dummy() || is_host_port(&mooncake.real_client_address),
        "mooncake.real_client_address",
        &format_args!("{:?}", mooncake.real_client_address),
        "must be empty (a client of this process's own) or HOST:PORT of the node's \
         mooncake_client, e.g. \"127.0.0.1:50052\"",
    )?;
    require(
        mooncake.shared_memory_bytes == 0 || mooncake.shared_memory_bytes >= MOONCAKE_SHARED_MEMORY_SPARE_BYTES,
        "mooncake.shared_memory_bytes",
        &mooncake.shared_memory_bytes,
        "must be 0 (sized from the staging settings) or at least 67108864 (64MiB), \
         e.g. 1073741824 (1GiB)",
    )?;
    let segment = mooncake.global_segment_size_bytes;
    require(
        segment == 0 || segment >= MOONCAKE_MIN_SEGMENT_BYTES,
        "mooncake.global_segment_size_bytes",
        &segment,
        &format!(
            "must be 0 (store nothing here) or at least {MOONCAKE_MIN_SEGMENT_BYTES} (16MiB), \
             the smallest segment Mooncake mounts, e.g. 1073741824 (1GiB)"
        ),
    )?;
    for (value, key, example) in [
        (mooncake.rpc_timeout_ms, "mooncake.rpc_timeout_ms", "2000"),
        (
            mooncake.connect_timeout_ms,
            "mooncake.connect_timeout_ms",
            "10000",
        ),
    ] {
        bounded(value, key, MAX_TIMEOUT_MS, example)?;
    }
    at_most(
        mooncake.close_timeout_ms,
        "mooncake.close_timeout_ms",
        MAX_TIMEOUT_MS,
        &format!("must be at most {MAX_TIMEOUT_MS} (one day), e.g. 5000"),
    )?;
    require(
        mooncake.tcp_lanes_per_peer <= MOONCAKE_MAX_TCP_LANES,
        "mooncake.tcp_lanes_per_peer",
        &mooncake.tcp_lanes_per_peer,
        &format!(
            "must be at most {MOONCAKE_MAX_TCP_LANES} (Mooncake's limit), or 0 to keep the \
             environment's MC_TCP_LANES_PER_PEER, e.g. 8"
        ),
    )?;
    let slice = mooncake.tcp_slice_size_bytes;
    require(
        slice == 0 || MOONCAKE_TCP_SLICE_BYTES.contains(&slice),
        "mooncake.tcp_slice_size_bytes",
        &slice,
        "must be 0 (keep the environment's MC_TCP_SLICE_SIZE) or 4096 to 67108864 (64MiB), \
         e.g. 1048576 (1MiB)",
    )?;
    let switch = mooncake.gil_switch_interval_us;
    require(
        switch == 0 || GIL_SWITCH_INTERVAL_US.contains(&switch),
        "mooncake.gil_switch_interval_us",
        &switch,
        "must be 0 (keep the interpreter's switch interval) or 100 to 5000 microseconds, \
         e.g. 500",
    )?;
    // The transfer engine knows these levels; anything else (FATAL included) silently
    // raises its logging to INFO.
    require(
        MOONCAKE_LOG_LEVELS.contains(&mooncake.log_level.as_str()),
        "mooncake.log_level",
        &format_args!("{:?}", mooncake.log_level),
        "must be one of INFO, WARNING, ERROR, or \"\" to keep MC_LOG_LEVEL from the environment, \
         e.g. \"WARNING\"",
    )
}

/// The most TCP lanes per peer the Mooncake transfer engine takes.
const MOONCAKE_MAX_TCP_LANES: u32 = 16;
/// GIL switch intervals the runtime may set, in microseconds: from a tenth of a
/// millisecond (shorter makes the interpreter switch threads for little gain) to `CPython`'s
/// own default.
const GIL_SWITCH_INTERVAL_US: std::ops::RangeInclusive<u32> = 100..=5000;

/// The TCP slice sizes accepted: a page up to 64 MiB.
const MOONCAKE_TCP_SLICE_BYTES: std::ops::RangeInclusive<u64> = 4096..=(64 << 20);

/// The levels the Mooncake transfer engine understands in `MC_LOG_LEVEL` (and `""`: keep
/// the environment's value).
const MOONCAKE_LOG_LEVELS: [&str; 4] = ["", "INFO", "WARNING", "ERROR"];

/// The host memory a configuration takes on a node (R9), by part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeMemory {
    /// The key that sizes the pool memory: `pool.capacity_bytes` or
    /// `mooncake.global_segment_size_bytes`.
    pub pool_key: &'static str,
    /// The pool memory this node contributes.
    pub pool_bytes: u64,
    /// `loaders.load_threads * loaders.staging_bytes_per_loader`.
    pub loader_staging_bytes: u64,
    /// `saver.staging_bytes`.
    pub saver_staging_bytes: u64,
}

impl NodeMemory {
    /// Everything together.
    pub fn total_bytes(&self) -> u64 {
        self.pool_bytes
            .saturating_add(self.loader_staging_bytes)
            .saturating_add(self.saver_staging_bytes)
    }
}

impl Config {
    /// Checks ranges and the node memory budget, and returns the actor sections in the
    /// types the checks proved ([`RuntimeConfig`]).
    ///
    /// # Errors
    /// [`ConfigError::OutOfRange`] naming the first key with a value that cannot work, or
    /// [`ConfigError::Budget`] when `node.memory_budget_bytes` is nonzero and too small for
    /// the pool segment plus staging pools (R9).
    pub fn validate(&self) -> Result<RuntimeConfig, ConfigError> {
        key_segment(&self.keys.namespace, "keys.namespace", false, "kvc")?;
        key_segment(&self.keys.model_key, "keys.model_key", true, "llama-3.1-8b")?;
        positive(
            self.pool.capacity_bytes,
            "pool.capacity_bytes",
            "8589934592 (8GiB)",
        )?;
        ratio(
            self.pool.eviction_high_watermark_ratio,
            "pool.eviction_high_watermark_ratio",
            "0.95",
        )?;
        ratio(self.pool.eviction_ratio, "pool.eviction_ratio", "0.05")?;
        positive(self.pool.kv_lease_ttl_ms, "pool.kv_lease_ttl_ms", "2000")?;
        check_mooncake(&self.mooncake)?;
        let runtime = RuntimeConfig::check(self)?;
        let metrics_addr = self.stats.metrics_addr.trim();
        require(
            metrics_addr.is_empty() || metrics_addr.parse::<std::net::SocketAddr>().is_ok(),
            "stats.metrics_addr",
            &format!("{metrics_addr:?}"),
            "must be HOST:PORT with an IP address, e.g. 127.0.0.1:9464, or empty for none",
        )?;
        self.check_budget(&runtime)?;
        Ok(runtime)
    }

    /// The host memory this configuration takes on a node (R9): the pool memory it
    /// contributes (the embedded pool's capacity, or this process's Mooncake segment) and
    /// every staging pool.
    pub fn node_memory(&self, runtime: &RuntimeConfig) -> NodeMemory {
        let (pool_key, pool_bytes) = match self.pool.backend {
            PoolBackend::Memory => ("pool.capacity_bytes", self.pool.capacity_bytes),
            PoolBackend::Mooncake => (
                "mooncake.global_segment_size_bytes",
                self.mooncake.global_segment_size_bytes,
            ),
        };
        // At most 64 loaders of 64 GiB each plus one saver of 64 GiB: no overflow.
        let loaders = &runtime.loaders;
        NodeMemory {
            pool_key,
            pool_bytes,
            loader_staging_bytes: loaders.load_threads.get() as u64
                * loaders.staging_bytes_per_loader.get(),
            saver_staging_bytes: runtime.saver.staging_bytes.get(),
        }
    }

    /// R9: the budget covers [`Config::node_memory`].
    fn check_budget(&self, runtime: &RuntimeConfig) -> Result<(), ConfigError> {
        let budget_bytes = self.node.memory_budget_bytes;
        if budget_bytes == 0 {
            return Ok(());
        }
        let smallest_segment = match self.pool.backend {
            PoolBackend::Memory => 1,
            PoolBackend::Mooncake => MOONCAKE_MIN_SEGMENT_BYTES,
        };
        let NodeMemory {
            pool_key,
            pool_bytes,
            loader_staging_bytes,
            saver_staging_bytes,
        } = self.node_memory(runtime);
        let staging_bytes = loader_staging_bytes + saver_staging_bytes;
        let required_bytes = pool_bytes.saturating_add(staging_bytes);
        if required_bytes <= budget_bytes {
            return Ok(());
        }
        let max_pool_bytes = budget_bytes
            .checked_sub(staging_bytes)
            .filter(|&left| left >= smallest_segment);
        Err(ConfigError::Budget {
            budget_bytes,
            pool_key,
            pool_bytes,
            loader_staging_bytes,
            saver_staging_bytes,
            required_bytes,
            max_pool_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GIB, MIB};

    /// Applies `change` to the defaults and returns the refusal.
    fn refusal(change: impl FnOnce(&mut Config)) -> ConfigError {
        let mut config = Config::default();
        change(&mut config);
        match config.validate() {
            Ok(_) => panic!("validate accepted {config:?}"),
            Err(err) => err,
        }
    }

    /// Asserts an `OutOfRange` for `key` whose message names the key, its env variable,
    /// the bad value and `hint_part` (the value that works).
    fn assert_out_of_range(err: &ConfigError, key: &str, value: &str, hint_part: &str) {
        let message = err.to_string();
        let ConfigError::OutOfRange {
            key: got_key,
            env,
            value: got_value,
            hint,
        } = err
        else {
            panic!("expected out_of_range, got {err:?}");
        };
        assert_eq!(*got_key, key);
        assert_eq!(got_value, value);
        assert!(!env.is_empty() && message.contains(env), "{message}");
        assert!(message.contains(key), "{message}");
        assert!(hint.contains(hint_part), "{message}");
    }

    #[test]
    fn defaults_pass() {
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn zero_counts_and_sizes_are_refused_each_naming_a_working_value() {
        type Change = fn(&mut Config);
        let cases: [(&str, Change, &str); 17] = [
            (
                "pool.capacity_bytes",
                |c| c.pool.capacity_bytes = 0,
                "8589934592",
            ),
            (
                "pool.kv_lease_ttl_ms",
                |c| c.pool.kv_lease_ttl_ms = 0,
                "2000",
            ),
            ("planner.probe_chunk", |c| c.planner.probe_chunk = 0, "4096"),
            (
                "planner.max_concurrent_lookups",
                |c| c.planner.max_concurrent_lookups = 0,
                "32",
            ),
            (
                "planner.mailbox_capacity",
                |c| c.planner.mailbox_capacity = 0,
                "256",
            ),
            (
                "reservations.mailbox_capacity",
                |c| c.reservations.mailbox_capacity = 0,
                "1024",
            ),
            ("loaders.load_threads", |c| c.loaders.load_threads = 0, "2"),
            (
                "loaders.staging_bytes_per_loader",
                |c| c.loaders.staging_bytes_per_loader = 0,
                "256MiB",
            ),
            (
                "loaders.mailbox_capacity",
                |c| c.loaders.mailbox_capacity = 0,
                "64",
            ),
            (
                "loaders.load_timeout_ms",
                |c| c.loaders.load_timeout_ms = 0,
                "30000",
            ),
            (
                "saver.queue_capacity_pages",
                |c| c.saver.queue_capacity_pages = 0,
                "65536",
            ),
            (
                "saver.staging_bytes",
                |c| c.saver.staging_bytes = 0,
                "256MiB",
            ),
            (
                "saver.mailbox_capacity",
                |c| c.saver.mailbox_capacity = 0,
                "1024",
            ),
            ("stats.interval_s", |c| c.stats.interval_s = 0, "30"),
            (
                "handoff.outbox_capacity",
                |c| c.handoff.outbox_capacity = 0,
                "1024",
            ),
            (
                "pool.eviction_ratio",
                |c| c.pool.eviction_ratio = 0.0,
                "0.05",
            ),
            (
                "pool.eviction_high_watermark_ratio",
                |c| c.pool.eviction_high_watermark_ratio = 0.0,
                "0.95",
            ),
        ];
        for (key, change, example) in cases {
            let err = refusal(change);
            assert_out_of_range(&err, key, "0", example);
            assert!(err.to_string().contains("at least 1") || err.to_string().contains("(0, 1]"));
        }
    }

    /// Bad input: sizes a host cannot allocate and timeouts that overflow a
    /// deadline are refused with the limit and a working value, not an abort later.
    #[test]
    fn oversized_counts_sizes_and_timeouts_are_refused() {
        type Case = (&'static str, fn(&mut Config), &'static str, &'static str);
        let cases: [Case; 10] = [
            (
                "loaders.load_threads",
                |c| c.loaders.load_threads = 100_000,
                "100000",
                "at most 64",
            ),
            (
                "loaders.staging_bytes_per_loader",
                |c| c.loaders.staging_bytes_per_loader = 1 << 40,
                "1099511627776",
                "268435456 (256MiB)",
            ),
            (
                "saver.staging_bytes",
                |c| c.saver.staging_bytes = 1 << 40,
                "1099511627776",
                "at most 68719476736",
            ),
            (
                "loaders.load_timeout_ms",
                |c| c.loaders.load_timeout_ms = u64::MAX,
                "18446744073709551615",
                "30000",
            ),
            (
                "saver.shutdown_drain_timeout_ms",
                |c| c.saver.shutdown_drain_timeout_ms = u64::MAX,
                "18446744073709551615",
                "10000",
            ),
            (
                "saver.no_space_retries",
                |c| c.saver.no_space_retries = 17,
                "17",
                "3",
            ),
            (
                "saver.no_space_backoff_ms",
                |c| c.saver.no_space_backoff_ms = 1001,
                "1001",
                "20",
            ),
            (
                "stats.interval_s",
                |c| c.stats.interval_s = u64::MAX,
                "18446744073709551615",
                "30",
            ),
            (
                "handoff.poll_interval_us",
                |c| c.handoff.poll_interval_us = 20_000,
                "20000",
                "at most 10000",
            ),
            (
                "handoff.park_after_idle_ms",
                |c| c.handoff.park_after_idle_ms = u64::MAX,
                "18446744073709551615",
                "200",
            ),
        ];
        for (key, change, value, hint) in cases {
            assert_out_of_range(&refusal(change), key, value, hint);
        }
        let mut config = Config::default();
        config.loaders.load_threads = 64;
        config.saver.staging_bytes = MAX_STAGING_BYTES;
        config.saver.shutdown_drain_timeout_ms = 0;
        config.handoff.poll_interval_us = 0;
        config.handoff.park_after_idle_ms = 0;
        assert!(
            config.validate().is_ok(),
            "the limits themselves and 0 ms work"
        );
    }

    /// The deadlines and health keys of pool calls (R30): zero and oversized values are
    /// refused naming the key and a working value, and the probe backoff cannot shrink.
    #[test]
    fn pool_call_deadlines_and_health_keys_are_checked() {
        type Case = (&'static str, fn(&mut Config), &'static str, &'static str);
        let cases: [Case; 11] = [
            (
                "pool.probe_timeout_ms",
                |c| c.pool.probe_timeout_ms = 0,
                "0",
                "250",
            ),
            (
                "pool.probe_timeout_ms",
                |c| c.pool.probe_timeout_ms = u64::MAX,
                "18446744073709551615",
                "at most 86400000",
            ),
            (
                "pool.calls_in_flight",
                |c| c.pool.calls_in_flight = 0,
                "0",
                "16",
            ),
            (
                "pool.calls_in_flight",
                |c| c.pool.calls_in_flight = 5000,
                "5000",
                "at most 1024",
            ),
            (
                "pool.unreachable_after_failures",
                |c| c.pool.unreachable_after_failures = 0,
                "0",
                "3",
            ),
            (
                "pool.retry_initial_ms",
                |c| c.pool.retry_initial_ms = 0,
                "0",
                "250",
            ),
            (
                "pool.retry_max_ms",
                |c| c.pool.retry_max_ms = 100,
                "100",
                "at least pool.retry_initial_ms (250)",
            ),
            (
                "planner.lookup_timeout_ms",
                |c| c.planner.lookup_timeout_ms = 0,
                "0",
                "1000",
            ),
            (
                "mooncake.rpc_timeout_ms",
                |c| c.mooncake.rpc_timeout_ms = 0,
                "0",
                "2000",
            ),
            (
                "mooncake.connect_timeout_ms",
                |c| c.mooncake.connect_timeout_ms = u64::MAX,
                "18446744073709551615",
                "10000",
            ),
            (
                "mooncake.close_timeout_ms",
                |c| c.mooncake.close_timeout_ms = u64::MAX,
                "18446744073709551615",
                "5000",
            ),
        ];
        for (key, change, value, hint) in cases {
            assert_out_of_range(&refusal(change), key, value, hint);
        }
        let mut config = Config::default();
        config.pool.retry_max_ms = config.pool.retry_initial_ms;
        config.mooncake.close_timeout_ms = 0;
        let runtime = config
            .validate()
            .expect("equal waits and no close wait are fine");
        assert_eq!(
            runtime.pool_calls.health.retry_max,
            runtime.pool_calls.health.retry_initial
        );
        assert_eq!(runtime.pool_calls.probe_timeout, Duration::from_millis(250));
        assert_eq!(runtime.planner.lookup_timeout, Duration::from_secs(1));
    }

    #[test]
    fn ratios_above_one_or_nan_are_refused() {
        let err = refusal(|c| c.pool.eviction_high_watermark_ratio = 1.5);
        assert_out_of_range(&err, "pool.eviction_high_watermark_ratio", "1.5", "(0, 1]");
        let err = refusal(|c| c.pool.eviction_ratio = f64::NAN);
        assert_out_of_range(&err, "pool.eviction_ratio", "NaN", "0.05");
        let mut config = Config::default();
        config.pool.eviction_ratio = 1.0;
        assert!(config.validate().is_ok(), "1.0 is inside (0, 1]");
    }

    #[test]
    fn tcp_lanes_and_slice_sizes_outside_mooncakes_range_are_refused() {
        let err = refusal(|c| c.mooncake.tcp_lanes_per_peer = 17);
        assert_out_of_range(&err, "mooncake.tcp_lanes_per_peer", "17", "e.g. 8");
        for bad in [1, 4095, (64 << 20) + 1] {
            let err = refusal(|c| c.mooncake.tcp_slice_size_bytes = bad);
            assert_out_of_range(
                &err,
                "mooncake.tcp_slice_size_bytes",
                &bad.to_string(),
                "1048576",
            );
        }
        let mut config = Config::default();
        config.mooncake.tcp_lanes_per_peer = 0;
        config.mooncake.tcp_slice_size_bytes = 0;
        assert!(config.validate().is_ok(), "0 keeps the environment's values");
        config.mooncake.tcp_lanes_per_peer = 16;
        config.mooncake.tcp_slice_size_bytes = 64 << 20;
        assert!(config.validate().is_ok(), "the limits themselves are accepted");
    }

    #[test]
    fn a_real_client_address_must_be_host_port_and_shared_memory_fit_a_buffer() {
        for bad in ["127.0.0.1", ":50052", "127.0.0.1:0", "localhost:x"] {
            let err = refusal(|c| c.mooncake.real_client_address = bad.to_owned());
            assert_out_of_range(
                &err,
                "mooncake.real_client_address",
                &format!("{bad:?}"),
                "\"127.0.0.1:50052\"",
            );
        }
        let err = refusal(|c| c.mooncake.shared_memory_bytes = MIB);
        assert_out_of_range(&err, "mooncake.shared_memory_bytes", "1048576", "1073741824");
        let mut config = Config::default();
        config.mooncake.real_client_address = "127.0.0.1:50052".to_owned();
        config.mooncake.shared_memory_bytes = 64 * MIB;
        assert!(config.validate().is_ok(), "HOST:PORT and the smallest size are accepted");
    }

    #[test]
    fn gil_switch_intervals_outside_the_range_are_refused() {
        for bad in [1, 99, 5001] {
            let err = refusal(|c| c.mooncake.gil_switch_interval_us = bad);
            assert_out_of_range(
                &err,
                "mooncake.gil_switch_interval_us",
                &bad.to_string(),
                "e.g. 500",
            );
        }
        for good in [0, 100, 5000] {
            let mut config = Config::default();
            config.mooncake.gil_switch_interval_us = good;
            assert!(config.validate().is_ok(), "{good} is accepted");
        }
    }

    #[test]
    fn only_the_log_levels_mooncake_knows_are_accepted() {
        for bad in ["bogus", "FATAL", "warning"] {
            let err = refusal(|c| c.mooncake.log_level = bad.to_owned());
            assert_out_of_range(
                &err,
                "mooncake.log_level",
                &format!("{bad:?}"),
                "INFO, WARNING, ERROR",
            );
        }
        for good in ["", "INFO", "WARNING", "ERROR"] {
            let mut config = Config::default();
            good.clone_into(&mut config.mooncake.log_level);
            assert!(config.validate().is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn key_segments_with_a_slash_are_refused() {
        let err = refusal(|c| c.keys.namespace = "a/b".to_owned());
        assert_out_of_range(&err, "keys.namespace", "\"a/b\"", "'/'");
        assert!(err.to_string().contains("KVC_KEYS_NAMESPACE"));
        let err = refusal(|c| c.keys.model_key = "llama/8b".to_owned());
        assert_out_of_range(&err, "keys.model_key", "\"llama/8b\"", "'/'");
    }

    #[test]
    fn empty_namespace_is_refused_but_empty_model_key_means_derived() {
        let err = refusal(|c| c.keys.namespace.clear());
        assert_out_of_range(&err, "keys.namespace", "\"\"", "\"kvc\"");
        let mut config = Config::default();
        config.keys.model_key.clear();
        assert!(config.validate().is_ok());
    }

    #[test]
    fn r9_budget_names_the_largest_affordable_pool_capacity() {
        let err = refusal(|c| c.node.memory_budget_bytes = 4 * GIB);
        let ConfigError::Budget {
            required_bytes,
            max_pool_bytes,
            pool_key,
            ..
        } = &err
        else {
            panic!("expected budget, got {err:?}");
        };
        assert_eq!(*pool_key, "pool.capacity_bytes");
        assert_eq!(*required_bytes, 8 * GIB + 768 * MIB);
        assert_eq!(*max_pool_bytes, Some(4 * GIB - 768 * MIB));
        let message = err.to_string();
        assert!(message.contains("at most 3489660928"), "{message}");
        assert!(
            message.contains(&format!("at least {}", 8 * GIB + 768 * MIB)),
            "{message}"
        );
        // The named capacity is indeed affordable.
        let mut config = Config::default();
        config.node.memory_budget_bytes = 4 * GIB;
        config.pool.capacity_bytes = 4 * GIB - 768 * MIB;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn r9_budget_smaller_than_staging_asks_for_less_staging() {
        let err = refusal(|c| c.node.memory_budget_bytes = 512 * MIB);
        assert!(matches!(
            err,
            ConfigError::Budget {
                max_pool_bytes: None,
                ..
            }
        ));
        assert!(
            err.to_string().contains("loaders.staging_bytes_per_loader"),
            "{err}"
        );
    }

    #[test]
    fn r9_mooncake_counts_its_segment_and_names_the_largest_affordable_one() {
        let mut config = Config::default();
        config.pool.backend = PoolBackend::Mooncake;
        config.pool.capacity_bytes = 64 * GIB; // not this node's memory on Mooncake
        config.node.memory_budget_bytes = GIB;
        let err = config.validate().err();
        let Some(
            err @ ConfigError::Budget {
                pool_key: "mooncake.global_segment_size_bytes",
                pool_bytes,
                required_bytes,
                max_pool_bytes: Some(max),
                ..
            },
        ) = &err
        else {
            panic!("expected a budget refusal naming the segment, got {err:?}");
        };
        assert_eq!(*pool_bytes, GIB, "the 1 GiB default segment counts");
        assert_eq!(*required_bytes, GIB + 768 * MIB);
        assert_eq!(*max, GIB - 768 * MIB, "budget minus 768 MiB of staging");
        let message = err.to_string();
        assert!(
            message.contains("set mooncake.global_segment_size_bytes to at most 268435456"),
            "{message}"
        );
        config.mooncake.global_segment_size_bytes = *max;
        assert!(config.validate().is_ok(), "the named segment fits");
    }

    #[test]
    fn r9_mooncake_budget_too_small_for_a_mountable_segment_asks_for_less_staging() {
        let mut config = Config::default();
        config.pool.backend = PoolBackend::Mooncake;
        config.node.memory_budget_bytes = 768 * MIB + 8 * MIB;
        let err = config.validate().err();
        assert!(
            matches!(
                err,
                Some(ConfigError::Budget {
                    max_pool_bytes: None,
                    ..
                })
            ),
            "8 MiB left is below the 16 MiB Mooncake mounts: {err:?}"
        );
        config.mooncake.global_segment_size_bytes = 0;
        assert!(config.validate().is_ok(), "a client without a segment fits");
    }

    #[test]
    fn mooncake_segment_below_what_mooncake_mounts_is_refused() {
        let err = refusal(|c| c.mooncake.global_segment_size_bytes = MIB);
        assert_out_of_range(
            &err,
            "mooncake.global_segment_size_bytes",
            "1048576",
            "at least 16777216",
        );
        let mut config = Config::default();
        config.mooncake.global_segment_size_bytes = MOONCAKE_MIN_SEGMENT_BYTES;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn mooncake_addresses_must_be_host_and_port() {
        for bad in ["127.0.0.1", ":50051", "host:0", "host:port", ""] {
            let err = refusal(|c| c.mooncake.master_address = bad.to_owned());
            assert_out_of_range(
                &err,
                "mooncake.master_address",
                &format!("{bad:?}"),
                "127.0.0.1:50051",
            );
        }
        let err = refusal(|c| c.mooncake.local_hostname.clear());
        assert_out_of_range(&err, "mooncake.local_hostname", "\"\"", "127.0.0.1");
        let mut config = Config::default();
        config.mooncake.master_address = "[::1]:50051".to_owned();
        assert!(config.validate().is_ok());
    }

    #[test]
    fn r9_zero_budget_skips_the_check() {
        let mut config = Config::default();
        config.pool.capacity_bytes = u64::MAX;
        // The largest staging pools the range checks accept, as many as allowed.
        config.loaders.load_threads = 64;
        config.loaders.staging_bytes_per_loader = MAX_STAGING_BYTES;
        config.saver.staging_bytes = MAX_STAGING_BYTES;
        assert!(config.validate().is_ok());
    }
}
