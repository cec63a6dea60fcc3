//! Errors and warnings of configuration loading and validation.
//!
//! Every variant names the offending key (dotted path and, where one exists, its
//! environment variable) and the bad value, and its message says what would work, so a
//! user can fix the setting from the message alone.

use std::fmt;
use std::path::PathBuf;

/// Where a configuration value came from; named in errors and warnings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueOrigin {
    /// The built-in defaults.
    Default,
    /// A TOML file.
    File(PathBuf),
    /// An environment variable (its name).
    Env(String),
    /// A command-line override `section.key=value`.
    Cli,
}

impl fmt::Display for ValueOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("the built-in defaults"),
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Env(name) => write!(f, "environment variable {name}"),
            Self::Cli => f.write_str("the command line"),
        }
    }
}

/// Why a configuration could not be loaded or was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A key no section defines (typo protection). The field is `origin`, not `source`,
    /// because thiserror treats a field named `source` as the underlying error.
    #[error("unknown configuration key `{key}` from {origin}{}", suggestion_text(.suggestion.as_deref()))]
    UnknownKey {
        /// The key as the user spelled it (dotted path, or the variable name for env).
        key: String,
        /// Where it was found.
        origin: ValueOrigin,
        /// The closest known key, when one is close.
        suggestion: Option<String>,
    },
    /// A value that does not parse as the key's type.
    #[error("invalid value {value:?} for {key} (env {env}) from {origin}: expected {expected}")]
    InvalidValue {
        /// Dotted path of the key.
        key: &'static str,
        /// Generic environment variable of the key.
        env: &'static str,
        /// The value as given.
        value: String,
        /// What the key accepts, with an example.
        expected: String,
        /// Where the value came from.
        origin: ValueOrigin,
    },
    /// A TOML entry that must be a `[section]` table but is not.
    #[error("`{key}` in {origin} must be a table `[{key}]`")]
    NotATable {
        /// The section name.
        key: String,
        /// Where it was found.
        origin: ValueOrigin,
    },
    /// A value of the right type that `validate` refuses.
    #[error("{key} (env {env}) = {value} is refused: {hint}")]
    OutOfRange {
        /// Dotted path of the key.
        key: &'static str,
        /// Generic environment variable of the key.
        env: &'static str,
        /// The refused value, rendered.
        value: String,
        /// What is allowed, naming a value that works.
        hint: String,
    },
    /// The node memory budget cannot hold the pool segment and the staging pools (R9).
    #[error(
        "node.memory_budget_bytes (env KVC_NODE_MEMORY_BUDGET_BYTES) = {} does not cover \
         pool segment {} ({pool_key}) + loader staging {} + saver staging {} = {}; {}",
        bytes_text(*.budget_bytes), bytes_text(*.pool_bytes), bytes_text(*.loader_staging_bytes),
        bytes_text(*.saver_staging_bytes), bytes_text(*.required_bytes),
        budget_remedy(.pool_key, *.max_pool_bytes, *.required_bytes)
    )]
    Budget {
        /// `node.memory_budget_bytes`.
        budget_bytes: u64,
        /// The key that sizes the pool memory this node contributes:
        /// `pool.capacity_bytes` (memory pool) or `mooncake.global_segment_size_bytes`.
        pool_key: &'static str,
        /// Pool bytes this node contributes (the value of `pool_key`).
        pool_bytes: u64,
        /// `loaders.load_threads * loaders.staging_bytes_per_loader`.
        loader_staging_bytes: u64,
        /// `saver.staging_bytes`.
        saver_staging_bytes: u64,
        /// The sum of the three, saturating.
        required_bytes: u64,
        /// The largest value of `pool_key` that fits, when shrinking the pool segment is
        /// enough (and, for Mooncake, leaves a segment it can mount).
        max_pool_bytes: Option<u64>,
    },
    /// The configuration file could not be read.
    #[error("cannot read configuration file {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The configuration file is not valid TOML.
    #[error("configuration file {} is not valid toml", path.display())]
    Toml {
        /// The file.
        path: PathBuf,
        /// The parser's error, with line and column.
        source: toml::de::Error,
    },
    /// The merged tree did not deserialize into [`crate::config::Config`]; the per-key checks
    /// make this unreachable unless a key's kind in the key table is wrong.
    #[error("the merged configuration does not fit the typed tree")]
    Typed {
        /// The deserializer's error.
        source: toml::de::Error,
    },
    /// The configuration could not be rendered as TOML.
    #[error("cannot render the configuration as toml")]
    Render {
        /// The serializer's error.
        source: toml::ser::Error,
    },
    /// A command-line override without `=`.
    #[error("command-line override {arg:?} is not of the form section.key=value (e.g. pool.capacity_bytes=8GiB)")]
    MalformedOverride {
        /// The argument as given.
        arg: String,
    },
}

impl ConfigError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnknownKey { .. } => "unknown_key",
            Self::InvalidValue { .. } => "invalid_value",
            Self::NotATable { .. } => "not_a_table",
            Self::OutOfRange { .. } => "out_of_range",
            Self::Budget { .. } => "budget",
            Self::Io { .. } => "io",
            Self::Toml { .. } => "toml",
            Self::Typed { .. } => "typed",
            Self::Render { .. } => "render",
            Self::MalformedOverride { .. } => "malformed_override",
        }
    }
}

/// Something the caller should log: the configuration loaded, but not exactly as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigWarning {
    /// A legacy alias and the generic variable were both set, to different values; the
    /// generic one won.
    #[error("{alias}={alias_value:?} ignored: {generic}={generic_value:?} sets {key} and takes precedence")]
    AliasOverridden {
        /// Dotted path of the key.
        key: &'static str,
        /// The legacy variable (`TRTLLM_MOONCAKE_STORE_*`).
        alias: &'static str,
        /// Its value.
        alias_value: String,
        /// The generic variable (`KVC_*`).
        generic: &'static str,
        /// Its value, the one used.
        generic_value: String,
    },
}

impl ConfigWarning {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::AliasOverridden { .. } => "alias_overridden",
        }
    }
}

fn suggestion_text(suggestion: Option<&str>) -> String {
    suggestion.map_or_else(String::new, |known| format!("; did you mean `{known}`?"))
}

fn budget_remedy(pool_key: &str, max_pool_bytes: Option<u64>, required_bytes: u64) -> String {
    let raise = format!("raise node.memory_budget_bytes to at least {required_bytes}");
    match max_pool_bytes {
        Some(max) => format!("set {pool_key} to at most {} or {raise}", bytes_text(max)),
        None => format!(
            "lower loaders.load_threads, loaders.staging_bytes_per_loader or saver.staging_bytes, or {raise}"
        ),
    }
}

/// Renders a byte count exactly, plus the largest binary unit that divides it evenly
/// (`268435456 (256 MiB)`).
pub fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut whole = bytes;
    while unit + 1 < UNITS.len() && whole >= 1024 && whole % 1024 == 0 {
        whole /= 1024;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{bytes} ({whole} {})", UNITS[unit])
    }
}
