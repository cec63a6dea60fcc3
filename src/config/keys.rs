//! The key table: every leaf key with its environment names, kind and unit, and the
//! parsing of text values (environment, command line, quoted TOML) by kind.
//!
//! Invariants (checked by the tests at the bottom and in `tests/config.rs`):
//! 1. `KEYS` lists exactly the leaves of `Config::default()` serialized (grouped by
//!    section, in field order, for readable docs).
//! 2. Every `env` is `KVC_` + the dotted path upper-cased with `.` replaced by `_`.
//! 3. Every leaf appears in `config/default.toml`, with its env name in the comments.
//!
//! Text formats, the same for every layer that supplies text:
//! - booleans: `true`, `false`, `1`, `0` (case-insensitive);
//! - integers: decimal digits, non-negative, below 2^63 (TOML's integer range);
//! - byte sizes (`_bytes` keys): an integer, optionally followed by a unit: `B`, binary
//!   `KiB` `MiB` `GiB` `TiB` (powers of 1024) or decimal `KB` `MB` `GB` `TB` (powers of
//!   1000), case-insensitive, e.g. `8GiB`, `512 MiB`, `8589934592`;
//! - `saver.resave_min_tokens`, `saver.window_checkpoint_tokens`: an integer, or `off` (= 0);
//! - ratios: a decimal number such as `0.95`;
//! - choices: one of the listed names (case-insensitive).

use toml::Value;

use super::sections::{PoolBackend, MOONCAKE_PROTOCOLS};
use crate::gpu::DeviceRequest;
use LeafKind::{Bool, Bytes, Choice, Integer, Ratio, Text, TokensOrOff};

/// How a key's values are written and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafKind {
    /// `true`/`false`, also `1`/`0` in text.
    Bool,
    /// A non-negative integer.
    Integer,
    /// A non-negative byte count; text may carry a unit suffix (`8GiB`).
    Bytes,
    /// A non-negative token count where `off` means 0.
    TokensOrOff,
    /// A decimal number (range checked by `validate`).
    Ratio,
    /// Free text (names, paths).
    Text,
    /// One of a fixed list of lower-case names.
    Choice(&'static [&'static str]),
}

impl LeafKind {
    /// What a refused `raw` text should have been: "too large" for a well-formed number
    /// beyond what the tree holds (a signed 64-bit integer), else [`Self::expected`].
    pub fn expected_for(self, raw: &str) -> String {
        let too_large = match self {
            Self::Integer | Self::TokensOrOff => {
                let digits = raw.trim();
                !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
            }
            Self::Bytes => parse_byte_size_wide(raw.trim()).is_some(),
            _ => false,
        };
        if too_large {
            format!("at most {} (too large: {})", i64::MAX, self.expected())
        } else {
            self.expected()
        }
    }

    /// What this kind accepts, with an example; used in error messages.
    pub fn expected(self) -> String {
        match self {
            Self::Bool => "true, false, 1 or 0".to_owned(),
            Self::Integer => "a non-negative integer such as 1024".to_owned(),
            Self::Bytes => "a byte count such as 8589934592 or 8GiB".to_owned(),
            Self::TokensOrOff => "a token count such as 4096, or off".to_owned(),
            Self::Ratio => "a decimal number such as 0.95".to_owned(),
            Self::Text => "a string".to_owned(),
            Self::Choice(names) => format!("one of {}", names.join(", ")),
        }
    }

    /// Parses a text value into the TOML value the typed tree expects, or `None` when the
    /// text does not fit this kind.
    pub fn parse_text(self, raw: &str) -> Option<Value> {
        let trimmed = raw.trim();
        match self {
            Self::Bool => match trimmed.to_ascii_lowercase().as_str() {
                "true" | "1" => Some(Value::Boolean(true)),
                "false" | "0" => Some(Value::Boolean(false)),
                _ => None,
            },
            Self::TokensOrOff if trimmed.eq_ignore_ascii_case("off") => Some(Value::Integer(0)),
            Self::Integer | Self::TokensOrOff => integer_value(trimmed.parse::<u64>().ok()?),
            Self::Bytes => integer_value(parse_byte_size(trimmed)?),
            Self::Ratio => {
                let ratio = trimmed.parse::<f64>().ok()?;
                ratio.is_finite().then_some(Value::Float(ratio))
            }
            Self::Text => Some(Value::String(raw.to_owned())),
            Self::Choice(names) => {
                let lower = trimmed.to_ascii_lowercase();
                names
                    .contains(&lower.as_str())
                    .then_some(Value::String(lower))
            }
        }
    }

    /// Checks a value from a TOML file against this kind. Strings go through
    /// [`LeafKind::parse_text`] (so `capacity_bytes = "8GiB"` works); an integer is accepted
    /// for a ratio. Returns `None` when the value does not fit.
    pub fn coerce_toml(self, value: &Value) -> Option<Value> {
        match (self, value) {
            (_, Value::String(text)) => self.parse_text(text),
            (Self::Bool, Value::Boolean(_)) | (Self::Ratio, Value::Float(_)) => Some(value.clone()),
            (Self::Integer | Self::Bytes | Self::TokensOrOff, Value::Integer(int)) if *int >= 0 => {
                Some(value.clone())
            }
            (Self::Ratio, Value::Integer(int)) => {
                Some(Value::Float(f64::from(i32::try_from(*int).ok()?)))
            }
            _ => None,
        }
    }
}

fn integer_value(int: u64) -> Option<Value> {
    i64::try_from(int).ok().map(Value::Integer)
}

/// Parses `8589934592`, `8GiB`, `512 MiB`, `4KB` into bytes; `None` on bad syntax or
/// overflow.
pub fn parse_byte_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(multiplier)
}

/// Whether `text` is a well-formed byte size of any magnitude (digits and a known unit),
/// for telling "too large" from "not a byte count".
fn parse_byte_size_wide(text: &str) -> Option<()> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let known = ["", "b", "kib", "mib", "gib", "tib", "kb", "mb", "gb", "tb"];
    (!digits.is_empty() && known.contains(&unit.trim().to_ascii_lowercase().as_str())).then_some(())
}

/// One leaf key of the configuration tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySpec {
    /// Dotted path, `section.key`: the TOML location and the command-line name.
    pub path: &'static str,
    /// The generic environment variable, `KVC_<SECTION>_<KEY>`.
    pub env: &'static str,
    /// A legacy environment variable honoured for existing deployments (docs/DESIGN.md section 9).
    pub alias: Option<&'static str>,
    /// How values are written and checked.
    pub kind: LeafKind,
    /// The unit, for documentation (`bytes`, `ms`, `tokens`, ...; empty when unitless).
    pub unit: &'static str,
}

impl KeySpec {
    /// The section name (`pool` for `pool.capacity_bytes`).
    pub fn section(&self) -> &'static str {
        self.path
            .split_once('.')
            .map_or(self.path, |(section, _)| section)
    }

    /// The key within its section (`capacity_bytes` for `pool.capacity_bytes`).
    pub fn leaf(&self) -> &'static str {
        self.path
            .split_once('.')
            .map_or(self.path, |(_, leaf)| leaf)
    }
}

const fn key(path: &'static str, env: &'static str, kind: LeafKind, unit: &'static str) -> KeySpec {
    KeySpec {
        path,
        env,
        alias: None,
        kind,
        unit,
    }
}

const fn aliased(
    path: &'static str,
    env: &'static str,
    alias: &'static str,
    kind: LeafKind,
    unit: &'static str,
) -> KeySpec {
    KeySpec {
        path,
        env,
        alias: Some(alias),
        kind,
        unit,
    }
}

/// Every leaf key, grouped by section in `Config`'s field order (invariant 1).
pub static KEYS: &[KeySpec] = &[
    key("model.preset", "KVC_MODEL_PRESET", Text, ""),
    key("model.layout_file", "KVC_MODEL_LAYOUT_FILE", Text, "path"),
    key("keys.namespace", "KVC_KEYS_NAMESPACE", Text, ""),
    key("keys.model_key", "KVC_KEYS_MODEL_KEY", Text, ""),
    key(
        "pool.backend",
        "KVC_POOL_BACKEND",
        Choice(PoolBackend::NAMES),
        "",
    ),
    key(
        "pool.capacity_bytes",
        "KVC_POOL_CAPACITY_BYTES",
        Bytes,
        "bytes",
    ),
    key(
        "pool.eviction_high_watermark_ratio",
        "KVC_POOL_EVICTION_HIGH_WATERMARK_RATIO",
        Ratio,
        "ratio",
    ),
    key(
        "pool.eviction_ratio",
        "KVC_POOL_EVICTION_RATIO",
        Ratio,
        "ratio",
    ),
    key(
        "pool.kv_lease_ttl_ms",
        "KVC_POOL_KV_LEASE_TTL_MS",
        Integer,
        "ms",
    ),
    key(
        "pool.probe_timeout_ms",
        "KVC_POOL_PROBE_TIMEOUT_MS",
        Integer,
        "ms",
    ),
    key(
        "pool.calls_in_flight",
        "KVC_POOL_CALLS_IN_FLIGHT",
        Integer,
        "calls",
    ),
    key(
        "pool.unreachable_after_failures",
        "KVC_POOL_UNREACHABLE_AFTER_FAILURES",
        Integer,
        "calls",
    ),
    key(
        "pool.retry_initial_ms",
        "KVC_POOL_RETRY_INITIAL_MS",
        Integer,
        "ms",
    ),
    key("pool.retry_max_ms", "KVC_POOL_RETRY_MAX_MS", Integer, "ms"),
    key(
        "mooncake.local_hostname",
        "KVC_MOONCAKE_LOCAL_HOSTNAME",
        Text,
        "",
    ),
    key(
        "mooncake.metadata_server",
        "KVC_MOONCAKE_METADATA_SERVER",
        Text,
        "url",
    ),
    key(
        "mooncake.master_address",
        "KVC_MOONCAKE_MASTER_ADDRESS",
        Text,
        "host:port",
    ),
    key(
        "mooncake.real_client_address",
        "KVC_MOONCAKE_REAL_CLIENT_ADDRESS",
        Text,
        "host:port",
    ),
    key(
        "mooncake.shared_memory_bytes",
        "KVC_MOONCAKE_SHARED_MEMORY_BYTES",
        Bytes,
        "bytes",
    ),
    key(
        "mooncake.protocol",
        "KVC_MOONCAKE_PROTOCOL",
        Choice(MOONCAKE_PROTOCOLS),
        "",
    ),
    key("mooncake.device_name", "KVC_MOONCAKE_DEVICE_NAME", Text, ""),
    key(
        "mooncake.global_segment_size_bytes",
        "KVC_MOONCAKE_GLOBAL_SEGMENT_SIZE_BYTES",
        Bytes,
        "bytes",
    ),
    key(
        "mooncake.local_buffer_size_bytes",
        "KVC_MOONCAKE_LOCAL_BUFFER_SIZE_BYTES",
        Bytes,
        "bytes",
    ),
    key("mooncake.venv_dir", "KVC_MOONCAKE_VENV_DIR", Text, "path"),
    key(
        "mooncake.tcp_bind_address",
        "KVC_MOONCAKE_TCP_BIND_ADDRESS",
        Text,
        "",
    ),
    key("mooncake.log_level", "KVC_MOONCAKE_LOG_LEVEL", Text, ""),
    key(
        "mooncake.tcp_lanes_per_peer",
        "KVC_MOONCAKE_TCP_LANES_PER_PEER",
        Integer,
        "",
    ),
    key(
        "mooncake.tcp_slice_size_bytes",
        "KVC_MOONCAKE_TCP_SLICE_SIZE_BYTES",
        Bytes,
        "bytes",
    ),
    key(
        "mooncake.gil_switch_interval_us",
        "KVC_MOONCAKE_GIL_SWITCH_INTERVAL_US",
        Integer,
        "us",
    ),
    key(
        "mooncake.rpc_timeout_ms",
        "KVC_MOONCAKE_RPC_TIMEOUT_MS",
        Integer,
        "ms",
    ),
    key(
        "mooncake.connect_timeout_ms",
        "KVC_MOONCAKE_CONNECT_TIMEOUT_MS",
        Integer,
        "ms",
    ),
    key(
        "mooncake.close_timeout_ms",
        "KVC_MOONCAKE_CLOSE_TIMEOUT_MS",
        Integer,
        "ms",
    ),
    aliased(
        "planner.probe_chunk",
        "KVC_PLANNER_PROBE_CHUNK",
        "TRTLLM_MOONCAKE_STORE_PROBE_CHUNK",
        Integer,
        "keys",
    ),
    aliased(
        "planner.window_fallback",
        "KVC_PLANNER_WINDOW_FALLBACK",
        "TRTLLM_MOONCAKE_STORE_WINDOW_FALLBACK",
        Bool,
        "",
    ),
    key(
        "planner.swa_endpoint_rewind_tokens",
        "KVC_PLANNER_SWA_ENDPOINT_REWIND_TOKENS",
        Integer,
        "tokens",
    ),
    key(
        "planner.mailbox_capacity",
        "KVC_PLANNER_MAILBOX_CAPACITY",
        Integer,
        "messages",
    ),
    key(
        "planner.max_concurrent_lookups",
        "KVC_PLANNER_MAX_CONCURRENT_LOOKUPS",
        Integer,
        "lookups",
    ),
    key(
        "planner.lookup_timeout_ms",
        "KVC_PLANNER_LOOKUP_TIMEOUT_MS",
        Integer,
        "ms",
    ),
    key(
        "reservations.mailbox_capacity",
        "KVC_RESERVATIONS_MAILBOX_CAPACITY",
        Integer,
        "messages",
    ),
    key(
        "reservations.prefix_aware_scheduling",
        "KVC_RESERVATIONS_PREFIX_AWARE_SCHEDULING",
        Bool,
        "",
    ),
    aliased(
        "loaders.load_threads",
        "KVC_LOADERS_LOAD_THREADS",
        "TRTLLM_MOONCAKE_STORE_LOAD_THREADS",
        Integer,
        "loaders",
    ),
    aliased(
        "loaders.sync_load",
        "KVC_LOADERS_SYNC_LOAD",
        "TRTLLM_MOONCAKE_STORE_SYNC_LOAD",
        Bool,
        "",
    ),
    key(
        "loaders.staging_bytes_per_loader",
        "KVC_LOADERS_STAGING_BYTES_PER_LOADER",
        Bytes,
        "bytes",
    ),
    key(
        "loaders.mailbox_capacity",
        "KVC_LOADERS_MAILBOX_CAPACITY",
        Integer,
        "messages",
    ),
    key(
        "loaders.load_timeout_ms",
        "KVC_LOADERS_LOAD_TIMEOUT_MS",
        Integer,
        "ms",
    ),
    aliased(
        "saver.window_first",
        "KVC_SAVER_WINDOW_FIRST",
        "TRTLLM_MOONCAKE_STORE_WINDOW_FIRST",
        Bool,
        "",
    ),
    aliased(
        "saver.resave_min_tokens",
        "KVC_SAVER_RESAVE_MIN_TOKENS",
        "TRTLLM_MOONCAKE_STORE_RESAVE_MIN_TOKENS",
        TokensOrOff,
        "tokens",
    ),
    key(
        "saver.window_checkpoint_tokens",
        "KVC_SAVER_WINDOW_CHECKPOINT_TOKENS",
        TokensOrOff,
        "tokens",
    ),
    key(
        "saver.queue_capacity_pages",
        "KVC_SAVER_QUEUE_CAPACITY_PAGES",
        Integer,
        "pages",
    ),
    key(
        "saver.staging_bytes",
        "KVC_SAVER_STAGING_BYTES",
        Bytes,
        "bytes",
    ),
    key(
        "saver.mailbox_capacity",
        "KVC_SAVER_MAILBOX_CAPACITY",
        Integer,
        "messages",
    ),
    key(
        "saver.shutdown_drain_timeout_ms",
        "KVC_SAVER_SHUTDOWN_DRAIN_TIMEOUT_MS",
        Integer,
        "ms",
    ),
    key(
        "saver.no_space_retries",
        "KVC_SAVER_NO_SPACE_RETRIES",
        Integer,
        "retries",
    ),
    key(
        "saver.no_space_backoff_ms",
        "KVC_SAVER_NO_SPACE_BACKOFF_MS",
        Integer,
        "ms",
    ),
    key(
        "handoff.outbox_capacity",
        "KVC_HANDOFF_OUTBOX_CAPACITY",
        Integer,
        "messages",
    ),
    key(
        "handoff.poll_interval_us",
        "KVC_HANDOFF_POLL_INTERVAL_US",
        Integer,
        "us",
    ),
    key(
        "handoff.park_after_idle_ms",
        "KVC_HANDOFF_PARK_AFTER_IDLE_MS",
        Integer,
        "ms",
    ),
    key("stats.interval_s", "KVC_STATS_INTERVAL_S", Integer, "s"),
    key("stats.metrics_addr", "KVC_STATS_METRICS_ADDR", Text, ""),
    key("stats.instance", "KVC_STATS_INSTANCE", Text, ""),
    key(
        "device.kind",
        "KVC_DEVICE_KIND",
        Choice(DeviceRequest::NAMES),
        "",
    ),
    key(
        "node.memory_budget_bytes",
        "KVC_NODE_MEMORY_BUDGET_BYTES",
        Bytes,
        "bytes",
    ),
];

/// The key with dotted path `path`.
pub fn by_path(path: &str) -> Option<&'static KeySpec> {
    KEYS.iter().find(|spec| spec.path == path)
}

/// The generic environment variable of `path`, or `""` for a path not in [`KEYS`] (only
/// reachable through a typo in this crate, which the tests catch).
pub fn env_of(path: &str) -> &'static str {
    by_path(path).map_or("", |spec| spec.env)
}

/// The known name closest to `unknown` (edit distance at most a third of its length), for
/// "did you mean" hints.
pub fn closest<'a>(unknown: &str, known: impl Iterator<Item = &'a str>) -> Option<String> {
    let limit = unknown.len().div_ceil(3).max(1);
    known
        .map(|name| (edit_distance(unknown, name), name))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name.to_owned())
}

/// Levenshtein distance over bytes, case-insensitive.
fn edit_distance(left: &str, right: &str) -> usize {
    let left = left.to_ascii_lowercase().into_bytes();
    let right = right.to_ascii_lowercase().into_bytes();
    let mut previous: Vec<usize> = (0..=right.len()).collect();
    for (i, left_byte) in left.iter().enumerate() {
        let mut current = vec![i + 1; right.len() + 1];
        for (j, right_byte) in right.iter().enumerate() {
            let substitution = previous[j] + usize::from(left_byte != right_byte);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[right.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_env_name_is_kvc_plus_upper_path() {
        for spec in KEYS {
            let expected = format!("KVC_{}", spec.path.replace('.', "_").to_ascii_uppercase());
            assert_eq!(spec.env, expected, "env name of {}", spec.path);
        }
    }

    #[test]
    fn paths_and_env_names_are_unique() {
        for (i, spec) in KEYS.iter().enumerate() {
            for other in &KEYS[i + 1..] {
                assert_ne!(spec.path, other.path);
                assert_ne!(spec.env, other.env);
            }
        }
    }

    #[test]
    fn design_section_9_aliases_are_all_present() {
        let aliases: Vec<&str> = KEYS.iter().filter_map(|spec| spec.alias).collect();
        for name in [
            "LOAD_THREADS",
            "SYNC_LOAD",
            "WINDOW_FALLBACK",
            "RESAVE_MIN_TOKENS",
            "PROBE_CHUNK",
            "WINDOW_FIRST",
        ] {
            let alias = format!("TRTLLM_MOONCAKE_STORE_{name}");
            assert!(aliases.contains(&alias.as_str()), "{alias} missing");
        }
        assert_eq!(aliases.len(), 6);
    }

    #[test]
    fn byte_sizes_parse_with_and_without_units() {
        assert_eq!(parse_byte_size("8589934592"), Some(8 << 30));
        assert_eq!(parse_byte_size("8GiB"), Some(8 << 30));
        assert_eq!(parse_byte_size("512 mib"), Some(512 << 20));
        assert_eq!(parse_byte_size("4KB"), Some(4000));
        assert_eq!(parse_byte_size("1TB"), Some(1_000_000_000_000));
        assert_eq!(parse_byte_size("7B"), Some(7));
        assert_eq!(parse_byte_size("GiB"), None);
        assert_eq!(parse_byte_size("8 GiBs"), None);
        assert_eq!(parse_byte_size("-1"), None);
        assert_eq!(parse_byte_size("1.5GiB"), None);
        assert_eq!(
            parse_byte_size("99999999999TiB"),
            None,
            "overflow is refused"
        );
    }

    #[test]
    fn byte_values_above_toml_integer_range_are_refused() {
        assert_eq!(
            Bytes.parse_text("9223372036854775807"),
            Some(Value::Integer(i64::MAX))
        );
        assert_eq!(Bytes.parse_text("9223372036854775808"), None);
    }

    #[test]
    fn booleans_accept_words_and_digits() {
        for (text, expected) in [
            ("true", true),
            ("TRUE", true),
            ("1", true),
            ("false", false),
            ("0", false),
        ] {
            assert_eq!(
                Bool.parse_text(text),
                Some(Value::Boolean(expected)),
                "{text}"
            );
        }
        assert_eq!(Bool.parse_text("yes"), None);
        assert_eq!(Bool.parse_text("2"), None);
    }

    #[test]
    fn resave_threshold_accepts_off() {
        assert_eq!(TokensOrOff.parse_text("off"), Some(Value::Integer(0)));
        assert_eq!(TokensOrOff.parse_text("OFF"), Some(Value::Integer(0)));
        assert_eq!(TokensOrOff.parse_text("65536"), Some(Value::Integer(65536)));
        assert_eq!(TokensOrOff.parse_text("on"), None);
    }

    #[test]
    fn ratios_refuse_non_numbers() {
        assert_eq!(Ratio.parse_text("0.5"), Some(Value::Float(0.5)));
        assert_eq!(Ratio.parse_text("NaN"), None);
        assert_eq!(Ratio.parse_text("inf"), None);
        assert_eq!(Ratio.parse_text("half"), None);
    }

    #[test]
    fn choices_are_case_insensitive_and_closed() {
        let kind = Choice(PoolBackend::NAMES);
        assert_eq!(
            kind.parse_text("Mooncake"),
            Some(Value::String("mooncake".into()))
        );
        assert_eq!(kind.parse_text("redis"), None);
    }

    #[test]
    fn toml_values_coerce_by_kind() {
        assert_eq!(
            Ratio.coerce_toml(&Value::Integer(1)),
            Some(Value::Float(1.0))
        );
        assert_eq!(
            Bytes.coerce_toml(&Value::String("1KiB".into())),
            Some(Value::Integer(1024))
        );
        assert_eq!(Integer.coerce_toml(&Value::Integer(-1)), None);
        assert_eq!(Bool.coerce_toml(&Value::Integer(1)), None);
        assert_eq!(Text.coerce_toml(&Value::Integer(1)), None);
    }

    #[test]
    fn closest_suggests_near_misses_only() {
        let names = KEYS.iter().map(|spec| spec.path);
        assert_eq!(
            closest("pool.capcity_bytes", names.clone()).as_deref(),
            Some("pool.capacity_bytes")
        );
        assert_eq!(closest("zzzz", names), None);
    }
}
