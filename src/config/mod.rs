//! The typed configuration tree (`docs/DESIGN.md` section 9).
//!
//! One [`Config`] holds every setting, in sections named after the part they steer
//! (`[pool]`, `[mooncake]`, `[planner]`, `[loaders]`, ...). It is loaded once, at start,
//! and then passed down; nothing else in the crate reads the environment.
//!
//! Workflow ([`Config::load`]):
//! 1. start from the built-in defaults (the explicit `impl Default`s in `sections.rs`);
//! 2. merge the TOML file, if one is given (`config/default.toml` documents every key);
//! 3. apply the environment: `KVC_<SECTION>_<KEY>` for every key, plus the six legacy
//!    `TRTLLM_MOONCAKE_STORE_*` names of `docs/DESIGN.md` section 9;
//! 4. apply command-line overrides `section.key=value`;
//! 5. deserialize into [`Config`] and [`Config::validate`] it.
//!
//! Validation also gives the actor sections in the types its checks proved
//! ([`RuntimeConfig`]: nonzero counts, times as `Duration`s): the runtime takes those and
//! never re-checks or clamps a configured value. An entry point handed a plain [`Config`]
//! (built or edited in code) validates it once itself (`ConnectorHandle::start`).
//!
//! Invariants:
//! 1. Unknown keys are errors in every layer (`deny_unknown_fields` for typed input, the
//!    key table for text input); an unknown `KVC_*` variable is an error too.
//! 2. A later layer wins over an earlier one, key by key; within the environment a
//!    `KVC_*` variable wins over its legacy alias, with a [`ConfigWarning`].
//! 3. [`ConfigSources::from_process_env`] is the only reader of the process environment;
//!    tests pass the environment as a map.
//! 4. `config/default.toml` equals [`Config::default()`] and lists every key (tested).
//!
//! Text values (environment, command line) follow the formats listed in the `keys`
//! module: booleans `true`/`false`/`1`/`0`, byte sizes with optional `KiB`/`MiB`/`GiB`/
//! `TiB` (or decimal `KB`/`MB`/`GB`/`TB`) suffixes, `off` for `saver.resave_min_tokens`.

mod actor_sections;
mod error;
mod host;
mod keys;
mod layers;
pub mod runtime;
mod sections;
mod validate;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use actor_sections::{
    HandoffConfig, LoadersConfig, PlannerConfig, ReservationsConfig, SaverConfig, StatsConfig,
};
pub use error::{bytes_text, ConfigError, ConfigWarning};
#[cfg(feature = "internals")]
pub use error::ValueOrigin;
#[cfg(any(feature = "cli", feature = "internals"))]
pub use host::HostMemoryExceeded;
#[cfg(feature = "internals")]
pub use keys::LeafKind;
pub use keys::{KeySpec, KEYS};
#[cfg(any(feature = "cli", feature = "internals"))]
pub use keys::parse_byte_size;
#[cfg(any(feature = "cli", feature = "internals"))]
pub use layers::parse_override;
pub use layers::ENV_PREFIX;
pub use runtime::RuntimeConfig;
pub use sections::{
    DeviceConfig, KeysConfig, ModelConfig, MooncakeConfig, NodeConfig, PoolBackend, PoolConfig,
    MIB,
};
#[cfg(feature = "internals")]
pub use sections::{GIB, MOONCAKE_PROTOCOLS};
#[cfg(any(feature = "cli", feature = "internals"))]
pub use sections::MOONCAKE_MIN_SEGMENT_BYTES;
#[cfg(feature = "mooncake")]
pub(crate) use sections::MOONCAKE_SHARED_MEMORY_SPARE_BYTES;
pub use validate::NodeMemory;

/// Prefix of the legacy environment names kept for existing deployments.
pub const LEGACY_ENV_PREFIX: &str = "TRTLLM_MOONCAKE_STORE_";

/// The whole configuration: one field per `[section]`. `Default` is derived because each
/// section spells out its own defaults in an explicit `impl Default`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Which KV layout is served.
    pub model: ModelConfig,
    /// Pool key prefix (namespace, model key).
    pub keys: KeysConfig,
    /// The pool backend and its eviction model.
    pub pool: PoolConfig,
    /// The Mooncake Store client (`pool.backend = "mooncake"`).
    pub mooncake: MooncakeConfig,
    /// The lookup planner.
    pub planner: PlannerConfig,
    /// The reservation manager.
    pub reservations: ReservationsConfig,
    /// The loader actors.
    pub loaders: LoadersConfig,
    /// The save queue.
    pub saver: SaverConfig,
    /// The engine thread's hand-off to the actors.
    pub handoff: HandoffConfig,
    /// The stats reporter.
    pub stats: StatsConfig,
    /// The device backend.
    pub device: DeviceConfig,
    /// Limits of this machine.
    pub node: NodeConfig,
}

/// The inputs of [`Config::load`], one per layer above the defaults.
#[derive(Clone, Debug, Default)]
pub struct ConfigSources {
    /// A TOML file to merge over the defaults; `None` for none.
    pub toml_path: Option<PathBuf>,
    /// Environment variables; only `KVC_*` and the legacy aliases are looked at.
    pub env: HashMap<String, String>,
    /// Command-line overrides `(section.key, value)`, applied in order.
    pub cli_overrides: Vec<(String, String)>,
}

impl ConfigSources {
    /// Sources holding the process environment's `KVC_*` and `TRTLLM_MOONCAKE_STORE_*`
    /// variables (others are left out, so the map can be logged); no file, no overrides.
    /// A value that is not valid UTF-8 is kept lossily, so it fails its parse with a
    /// readable message instead of vanishing.
    #[allow(
        clippy::disallowed_methods,
        reason = "the one place that reads the process environment; `allow`, not \
                  `expect`, because clippy.toml does not list `vars_os` yet"
    )]
    pub fn from_process_env() -> Self {
        let env = std::env::vars_os()
            .map(|(name, value)| {
                (
                    name.to_string_lossy().into_owned(),
                    value.to_string_lossy().into_owned(),
                )
            })
            .filter(|(name, _)| name.starts_with(ENV_PREFIX) || name.starts_with(LEGACY_ENV_PREFIX))
            .collect();
        Self {
            env,
            ..Self::default()
        }
    }
}

/// A loaded, validated configuration and what the caller should log about it.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedConfig {
    /// The effective configuration.
    pub config: Config,
    /// Its actor sections as validation typed them (describes `config` as loaded: a caller
    /// that edits `config` validates it again).
    pub runtime: RuntimeConfig,
    /// Things to log at WARN (a legacy alias overridden, ...).
    pub warnings: Vec<ConfigWarning>,
}

/// One row of the key listing: for generated docs and `--help` text.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyDoc {
    /// The key: path, env names, kind and unit.
    pub spec: &'static KeySpec,
    /// The built-in default, rendered as TOML.
    pub default: String,
}

impl Config {
    /// Loads the configuration: defaults < TOML file < environment < command line, then
    /// [`Config::validate`].
    ///
    /// # Errors
    /// [`ConfigError::Io`] / [`ConfigError::Toml`] for an unreadable or malformed file;
    /// [`ConfigError::UnknownKey`], [`ConfigError::NotATable`] or
    /// [`ConfigError::InvalidValue`] for a bad key or value in any layer, naming it and
    /// where it came from; whatever [`Config::validate`] refuses.
    pub fn load(sources: &ConfigSources) -> Result<LoadedConfig, ConfigError> {
        let text = match &sources.toml_path {
            Some(path) => {
                Some(
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                        path: path.clone(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let file = sources.toml_path.as_deref().zip(text.as_deref());
        load_layers(file, sources)
    }

    /// [`Config::load`] with the TOML layer given as text (`path` only names it in errors);
    /// `sources.toml_path` is ignored. For tools that hold the file already, and the fuzz
    /// target of the loader.
    ///
    /// # Errors
    /// As [`Config::load`], without [`ConfigError::Io`].
    pub fn load_toml_text(
        text: &str,
        path: &Path,
        sources: &ConfigSources,
    ) -> Result<LoadedConfig, ConfigError> {
        load_layers(Some((path, text)), sources)
    }

    /// The effective configuration as TOML, for a `validate` subcommand or a start log.
    ///
    /// # Errors
    /// [`ConfigError::Render`] if serialization fails (not expected: every field is a
    /// plain TOML type).
    pub fn to_toml_string(&self) -> Result<String, ConfigError> {
        toml::to_string_pretty(self).map_err(|source| ConfigError::Render { source })
    }

    /// Every key with its env names, kind, unit and default, in section order.
    ///
    /// # Errors
    /// [`ConfigError::Render`] if the defaults cannot be serialized (not expected).
    pub fn key_docs() -> Result<Vec<KeyDoc>, ConfigError> {
        let tree = default_tree()?;
        Ok(KEYS
            .iter()
            .map(|spec| KeyDoc {
                spec,
                default: tree
                    .get(spec.section())
                    .and_then(|section| section.get(spec.leaf()))
                    .map_or_else(String::new, ToString::to_string),
            })
            .collect())
    }
}

/// Workflow steps 1-5 of the module docs, with the TOML file (path, text) already read.
fn load_layers(
    file: Option<(&Path, &str)>,
    sources: &ConfigSources,
) -> Result<LoadedConfig, ConfigError> {
    let mut tree = default_tree()?;
    if let Some((path, text)) = file {
        let table: toml::Table = toml::from_str(text).map_err(|source| ConfigError::Toml {
            path: path.to_path_buf(),
            source,
        })?;
        layers::merge_file(&mut tree, table, path)?;
    }
    let warnings = layers::apply_env(&mut tree, &sources.env)?;
    layers::apply_cli(&mut tree, &sources.cli_overrides)?;
    let config: Config = tree
        .try_into()
        .map_err(|source| ConfigError::Typed { source })?;
    let runtime = config.validate()?;
    Ok(LoadedConfig {
        config,
        runtime,
        warnings,
    })
}

/// The defaults as a two-level table, `section -> key -> value`.
fn default_tree() -> Result<toml::Table, ConfigError> {
    toml::Table::try_from(Config::default()).map_err(|source| ConfigError::Render { source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::DeviceRequest;

    #[test]
    fn enum_names_match_serde_spellings() -> Result<(), toml::de::Error> {
        #[derive(Deserialize)]
        struct Probe<T> {
            value: T,
        }
        let backends: Vec<PoolBackend> = PoolBackend::NAMES
            .iter()
            .map(|name| toml::from_str::<Probe<PoolBackend>>(&format!("value = \"{name}\"")))
            .map(|probe| probe.map(|probe| probe.value))
            .collect::<Result<_, _>>()?;
        assert_eq!(backends, [PoolBackend::Memory, PoolBackend::Mooncake]);
        let kinds: Vec<DeviceRequest> = DeviceRequest::NAMES
            .iter()
            .map(|name| toml::from_str::<Probe<DeviceRequest>>(&format!("value = \"{name}\"")))
            .map(|probe| probe.map(|probe| probe.value))
            .collect::<Result<_, _>>()?;
        assert_eq!(
            kinds,
            [
                DeviceRequest::Auto,
                DeviceRequest::Cuda,
                DeviceRequest::Host
            ]
        );
        assert!(toml::from_str::<Probe<PoolBackend>>("value = \"redis\"").is_err());
        Ok(())
    }

    #[test]
    fn every_error_kind_is_distinct() {
        let errors = [
            ConfigError::UnknownKey {
                key: "x".into(),
                origin: ValueOrigin::Cli,
                suggestion: None,
            },
            ConfigError::MalformedOverride { arg: "x".into() },
            ConfigError::NotATable {
                key: "pool".into(),
                origin: ValueOrigin::Default,
            },
        ];
        let kinds: Vec<&str> = errors.iter().map(ConfigError::kind).collect();
        assert_eq!(kinds, ["unknown_key", "malformed_override", "not_a_table"]);
    }

    #[test]
    fn load_with_no_sources_is_the_defaults() -> Result<(), ConfigError> {
        let loaded = Config::load(&ConfigSources::default())?;
        assert_eq!(loaded.config, Config::default());
        assert!(loaded.warnings.is_empty());
        Ok(())
    }

    #[test]
    fn empty_metadata_server_derives_the_masters_http_metadata_url() {
        let mut mooncake = MooncakeConfig::default();
        assert_eq!(
            mooncake.effective_metadata_server(),
            "http://127.0.0.1:8080/metadata"
        );
        mooncake.master_address = "10.0.0.5:50051".to_owned();
        assert_eq!(
            mooncake.effective_metadata_server(),
            "http://10.0.0.5:8080/metadata"
        );
        mooncake.master_address = "[::1]:50051".to_owned();
        assert_eq!(
            mooncake.effective_metadata_server(),
            "http://[::1]:8080/metadata"
        );
        mooncake.metadata_server = "http://10.0.0.9:9000/metadata".to_owned();
        assert_eq!(
            mooncake.effective_metadata_server(),
            "http://10.0.0.9:9000/metadata"
        );
    }

    #[test]
    fn layout_file_empty_means_preset() {
        let mut model = ModelConfig::default();
        assert_eq!(model.layout_file(), None);
        model.layout_file = PathBuf::from("layouts/custom.json");
        assert_eq!(
            model.layout_file(),
            Some(std::path::Path::new("layouts/custom.json"))
        );
    }
}
