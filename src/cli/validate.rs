//! `kv-connector validate`: loads the configuration, the layout and optional engine
//! arguments the way the runtime does at start, prints the effective configuration as TOML
//! and every refusal, and fails when anything is refused.
//!
//! ## Workflow
//!
//! 1. Configuration ([`ConfigArgs::sources`]): defaults < `--config FILE` < `KVC_*`
//!    environment < `--set` < the dedicated flags (`--model`, `--layout`). A range refusal
//!    (`Config::validate`) is recorded, the refused key is put back to its default and the
//!    load is retried, so every refused key is listed, not only the first; a node memory
//!    budget refusal (R9) is recorded and the budget check is lifted for the retry. Any
//!    other error (unknown key, bad value, unreadable file) ends this step.
//! 2. Layout: the configuration's preset or layout file (with `--world`), validated (R7),
//!    and registered against `reservations.prefix_aware_scheduling` (window groups need it).
//! 3. Engine arguments (`--engine-args FILE`: YAML, JSON or TOML, see
//!    [`engine_args_file`]): every R8 refusal, and the fields not checked listed as ignored.
//! 4. The build: `pool.backend = "mooncake"` needs the `mooncake` cargo feature.
//!    The host: the memory the configuration takes on a node (R9: the pool memory it
//!    contributes and every staging pool) must fit the host's memory (`MemTotal`); the
//!    refusal names the largest part and a value that fits.
//! 5. Print: the effective configuration as TOML (refused keys at their defaults, said in
//!    a comment), the layout's groups and page sizes as comments, then on `err` one
//!    `refused [...]` line per refusal with its causes; fail with
//!    [`ValidateError::Refused`] when there is any.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::PathBuf;

use super::engine_args_file;
use crate::config::{
    parse_override, Config, ConfigError, ConfigSources, HostMemoryExceeded, PoolBackend, KEYS,
};
use crate::core::engine_args::validate_llm_args;
use crate::core::layout::{Layout, LayoutError};
use crate::gpu::host_memory::host_memory;

/// The configuration and layout flags `validate` and `inspect` share.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// A configuration TOML file merged over the built-in defaults
    /// (`config/default.toml` lists every key with its env name).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A configuration override `section.key=value` (e.g. `pool.capacity_bytes=8GiB`),
    /// applied after the file and the KVC_* environment; repeat for several.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Layout preset (`model.preset`, env `KVC_MODEL_PRESET`): llama-3.1-8b, gpt-oss-120b,
    /// gemma-3-27b, tiny-hybrid, tiny-full.
    #[arg(long, value_name = "PRESET", conflicts_with = "layout")]
    pub model: Option<String>,
    /// A layout TOML file instead of a preset (`model.layout_file`, env
    /// `KVC_MODEL_LAYOUT_FILE`).
    #[arg(long, value_name = "FILE")]
    pub layout: Option<PathBuf>,
    /// Tensor-parallel ranks (default: the layout's `world_size`); at most
    /// 64, dividing or a multiple of every group's KV heads.
    #[arg(long, value_name = "N")]
    pub world: Option<u32>,
}

impl ConfigArgs {
    /// The configuration sources: `env` plus the file, `--set` and the dedicated flags.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MalformedOverride`] for a `--set` without `=`.
    pub fn sources(&self, env: HashMap<String, String>) -> Result<ConfigSources, ConfigError> {
        let mut cli_overrides = self
            .overrides
            .iter()
            .map(|text| parse_override(text))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(model) = &self.model {
            cli_overrides.push(("model.preset".to_owned(), model.clone()));
        }
        if let Some(layout) = &self.layout {
            let path = layout.display().to_string();
            cli_overrides.push(("model.layout_file".to_owned(), path));
        }
        Ok(ConfigSources {
            toml_path: self.config.clone(),
            env,
            cli_overrides,
        })
    }

    /// The layout `config` names, at `--world` ranks when given.
    ///
    /// # Errors
    ///
    /// The layout's refusal (unknown preset, unreadable or invalid file, uneven split).
    pub fn layout(&self, config: &Config) -> Result<Layout, LayoutError> {
        let layout = match config.model.layout_file() {
            Some(path) => Layout::from_file(path)?,
            None => Layout::preset(&config.model.preset)?,
        };
        match self.world {
            Some(world) => layout.with_world_size(world),
            None => Ok(layout),
        }
    }
}

/// Arguments of `kv-connector validate`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Every configuration key also has an environment variable \
KVC_<SECTION>_<KEY> (e.g. KVC_POOL_CAPACITY_BYTES); six keys honour a legacy \
TRTLLM_MOONCAKE_STORE_* name. Exit status: 0 when nothing is refused, 1 otherwise."
)]
pub struct ValidateArgs {
    /// Configuration and layout.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The engine's configuration file to check (R8): TensorRT-LLM
    /// `extra_llm_api_options` or vLLM-style arguments, as `.yaml`/`.yml`, `.json` or
    /// `.toml`. Checked: `kv_cache_config.enable_swa_scratch_reuse`,
    /// `speculative_config.{max_draft_len, context_recompute_tail}`,
    /// `context_parallel_size`, `pipeline_parallel_size`; other fields are listed as ignored.
    #[arg(long, value_name = "FILE")]
    pub engine_args: Option<PathBuf>,
}

/// Why `kv-connector validate` failed.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// At least one setting was refused (each printed on stderr).
    #[error("{count} setting(s) refused; see the `refused` lines above")]
    Refused {
        /// How many refusals were printed.
        count: usize,
    },
    /// Rendering the configuration failed.
    #[error(transparent)]
    Render(ConfigError),
    /// Writing the output failed.
    #[error("cannot write the output")]
    Write(#[source] io::Error),
}

impl ValidateError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Refused { .. } => "refused",
            Self::Render(_) => "render",
            Self::Write(_) => "write",
        }
    }
}

/// A refusal that the build itself makes.
#[derive(Debug, thiserror::Error)]
#[error("pool.backend = \"mooncake\" needs a build with `--features mooncake` (scripts/setup-mooncake); use pool.backend = \"memory\" or rebuild")]
pub struct MooncakeNotBuilt;

/// Step 4: the configuration's node memory against the host's `host_total` bytes
/// ([`Config::check_host_memory`]).
fn check_host_memory(config: &Config, host_total: u64) -> Option<HostMemoryExceeded> {
    let runtime = config.validate().ok()?;
    config
        .check_host_memory(&runtime, host_total, "MemTotal")
        .err()
}

/// One refusal: the step it came from and the error.
struct Refusal {
    step: &'static str,
    error: Box<dyn StdError + Send + Sync>,
}

/// The error and its causes on one line.
fn error_chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

/// Runs `kv-connector validate` (module workflow); `env` is the process environment's
/// configuration variables.
///
/// # Errors
///
/// [`ValidateError::Refused`] when anything was refused, [`ValidateError::Write`] or
/// [`ValidateError::Render`] when the output cannot be produced.
pub fn run<S: std::hash::BuildHasher>(
    args: &ValidateArgs,
    env: HashMap<String, String, S>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ValidateError> {
    let mut refusals = Vec::new();
    let (config, reset_keys) =
        load_config_collecting(&args.config, env.into_iter().collect(), &mut refusals);
    let write = ValidateError::Write;
    if let Some(config) = &config {
        writeln!(
            out,
            "# effective configuration: defaults < --config < KVC_* environment < --set and flags"
        )
        .map_err(write)?;
        if !reset_keys.is_empty() {
            writeln!(
                out,
                "# refused keys shown at their defaults: {}",
                reset_keys.join(", ")
            )
            .map_err(write)?;
        }
        let text = config.to_toml_string().map_err(ValidateError::Render)?;
        write!(out, "{text}").map_err(write)?;
        check_layout(&args.config, config, out, &mut refusals).map_err(write)?;
        if config.pool.backend == PoolBackend::Mooncake && !cfg!(feature = "mooncake") {
            refusals.push(Refusal {
                step: "build",
                error: Box::new(MooncakeNotBuilt),
            });
        }
        if let Some(host_total) = host_memory().map(|host| host.total_bytes) {
            if let Some(refused) = check_host_memory(config, host_total) {
                refusals.push(Refusal {
                    step: "host",
                    error: Box::new(refused),
                });
            }
        }
    }
    check_engine_args(args, out, &mut refusals).map_err(write)?;
    for refusal in &refusals {
        writeln!(
            err,
            "refused [{}]: {}",
            refusal.step,
            error_chain(&*refusal.error)
        )
        .map_err(write)?;
    }
    out.flush().map_err(write)?;
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(ValidateError::Refused {
            count: refusals.len(),
        })
    }
}

/// Step 1: the configuration, retried past range refusals; returns it (if it loaded) and
/// the keys put back to their defaults.
fn load_config_collecting(
    args: &ConfigArgs,
    env: HashMap<String, String>,
    refusals: &mut Vec<Refusal>,
) -> (Option<Config>, Vec<String>) {
    let mut sources = match args.sources(env) {
        Ok(sources) => sources,
        Err(error) => {
            refusals.push(config_refusal(error));
            return (None, Vec::new());
        }
    };
    let mut reset = Vec::new();
    for _ in 0..=KEYS.len() {
        let error = match Config::load(&sources) {
            Ok(loaded) => {
                for warning in &loaded.warnings {
                    tracing::warn!(%warning, "configuration");
                }
                return (Some(loaded.config), reset);
            }
            Err(error) => error,
        };
        let retry = match &error {
            ConfigError::OutOfRange { key, .. } => default_text(key).map(|text| (*key, text)),
            ConfigError::Budget { .. } => Some(("node.memory_budget_bytes", "0".to_owned())),
            _ => None,
        };
        refusals.push(config_refusal(error));
        let Some((key, text)) = retry else {
            return (None, reset);
        };
        if reset.iter().any(|done| done == key) {
            return (None, reset);
        }
        reset.push(key.to_owned());
        sources.cli_overrides.push((key.to_owned(), text));
    }
    (None, reset)
}

fn config_refusal(error: ConfigError) -> Refusal {
    Refusal {
        step: "config",
        error: Box::new(error),
    }
}

/// A key's default as override text (strings unquoted).
fn default_text(path: &str) -> Option<String> {
    let spec = KEYS.iter().find(|spec| spec.path == path)?;
    let tree = toml::Table::try_from(Config::default()).ok()?;
    let value = tree.get(spec.section())?.get(spec.leaf())?;
    Some(match value {
        toml::Value::String(text) => text.clone(),
        other => other.to_string(),
    })
}

/// Step 2: load and register the layout; print its groups as comments.
fn check_layout(
    args: &ConfigArgs,
    config: &Config,
    out: &mut dyn Write,
    refusals: &mut Vec<Refusal>,
) -> io::Result<()> {
    let layout = match args.layout(config) {
        Ok(layout) => layout,
        Err(error) => {
            refusals.push(Refusal {
                step: "layout",
                error: Box::new(error),
            });
            return Ok(());
        }
    };
    writeln!(
        out,
        "\n# layout {:?}: T = {}, world size {}, fingerprint {}",
        layout.name,
        layout.tokens_per_block,
        layout.world_size,
        layout.fingerprint()
    )?;
    for group in &layout.groups {
        let attention = match (group.window_tokens, group.is_window()) {
            (Some(window), true) => format!("window W = {window}, S = {}", group.sink_tokens),
            _ => "full".to_owned(),
        };
        writeln!(
            out,
            "#   group {}: {attention}, {} layer(s), {:?}{}, page {} bytes per rank",
            group.id,
            group.layers.len(),
            group.role,
            if group.replicated { ", replicated" } else { "" },
            layout.page_bytes(group).unwrap_or(0)
        )?;
    }
    if let Err(error) = layout.register(config.reservations.prefix_aware_scheduling) {
        refusals.push(Refusal {
            step: "layout",
            error: Box::new(error),
        });
    }
    Ok(())
}

/// Step 3: the engine arguments, when given.
fn check_engine_args(
    args: &ValidateArgs,
    out: &mut dyn Write,
    refusals: &mut Vec<Refusal>,
) -> io::Result<()> {
    let Some(path) = &args.engine_args else {
        return writeln!(
            out,
            "\n# engine arguments: not given (--engine-args FILE checks R8)"
        );
    };
    let file = match engine_args_file::read(path) {
        Ok(file) => file,
        Err(error) => {
            refusals.push(Refusal {
                step: "engine_args",
                error: Box::new(error),
            });
            return Ok(());
        }
    };
    let found = validate_llm_args(&file.args);
    writeln!(
        out,
        "\n# engine arguments {}: {} refusal(s)",
        path.display(),
        found.len()
    )?;
    if !file.ignored.is_empty() {
        writeln!(
            out,
            "# ignored (the connector does not check them): {}",
            file.ignored.join(", ")
        )?;
    }
    refusals.extend(found.into_iter().map(|error| Refusal {
        step: "engine_args",
        error: Box::new(error),
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// The result of one `validate` run, its stdout and its stderr.
    type Outcome = (Result<(), ValidateError>, String, String);

    fn validate(
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Outcome, Box<dyn std::error::Error>> {
        let cli = Cli::try_parse_from(["kv-connector", "validate"].iter().chain(flags))?;
        let Command::Validate(args) = cli.command else {
            return Err("not the validate subcommand".into());
        };
        let env: HashMap<String, String> = env
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let result = run(&args, env, &mut out, &mut err);
        Ok((result, String::from_utf8(out)?, String::from_utf8(err)?))
    }

    #[test]
    fn defaults_validate_and_print_toml_that_loads_back() -> TestResult {
        let (result, out, err) = validate(&[], &[])?;
        assert!(result.is_ok(), "{err}");
        assert!(err.is_empty(), "{err}");
        let parsed: Config = toml::from_str(&out)?;
        assert_eq!(parsed, Config::default());
        assert!(out.contains("# layout \"tiny-hybrid\""), "{out}");
        assert!(out.contains("window W = 64, S = 4"), "{out}");
        Ok(())
    }

    #[test]
    fn every_range_refusal_is_listed_and_fails() -> TestResult {
        let (result, out, err) = validate(
            &[
                "--set",
                "pool.capacity_bytes=0",
                "--set",
                "planner.probe_chunk=0",
            ],
            &[("KVC_POOL_EVICTION_RATIO", "2")],
        )?;
        assert!(
            matches!(result, Err(ValidateError::Refused { count: 3 })),
            "{err}"
        );
        for key in [
            "pool.capacity_bytes",
            "planner.probe_chunk",
            "pool.eviction_ratio",
        ] {
            assert!(err.contains(key), "{key} missing from {err}");
            assert!(out.contains(key), "{key} not named as reset in {out}");
        }
        assert!(err.contains("KVC_POOL_CAPACITY_BYTES"), "{err}");
        Ok(())
    }

    #[test]
    fn window_layout_without_prefix_aware_scheduling_is_refused_r7() -> TestResult {
        let (result, _, err) = validate(
            &["--set", "reservations.prefix_aware_scheduling=false"],
            &[],
        )?;
        assert!(result.is_err());
        assert!(err.contains("refused [layout]"), "{err}");
        assert!(err.contains("prefix_aware_scheduling = true"), "{err}");
        let (full, _, err) = validate(
            &[
                "--model",
                "tiny-full",
                "--set",
                "reservations.prefix_aware_scheduling=false",
            ],
            &[],
        )?;
        assert!(full.is_ok(), "{err}");
        Ok(())
    }

    #[test]
    fn engine_args_refusals_are_all_listed_r8() -> TestResult {
        let dir = std::env::temp_dir().join(format!("kvc-validate-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let toml_file = dir.join("engine.toml");
        std::fs::write(
            &toml_file,
            "pipeline_parallel_size = 2\n[kv_cache_config]\nenable_swa_scratch_reuse = true\n",
        )?;
        let json_file = dir.join("engine.json");
        std::fs::write(
            &json_file,
            r#"{"speculative_config": {"context_recompute_tail": 4}}"#,
        )?;
        let toml_path = toml_file.display().to_string();
        let (result, _, err) = validate(&["--engine-args", &toml_path], &[])?;
        assert!(
            matches!(result, Err(ValidateError::Refused { count: 2 })),
            "{err}"
        );
        assert!(
            err.contains("set it to false") && err.contains("set it to 1"),
            "{err}"
        );
        let json_path = json_file.display().to_string();
        let (result, _, err) = validate(&["--engine-args", &json_path], &[])?;
        assert!(
            matches!(result, Err(ValidateError::Refused { count: 1 })),
            "{err}"
        );
        assert!(err.contains("context_recompute_tail = 4"), "{err}");
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    /// A real engine configuration passes: fields the connector does not check are listed
    /// as ignored, not refused.
    #[test]
    fn a_real_engine_yaml_passes_with_its_unchecked_fields_listed() -> TestResult {
        let dir = std::env::temp_dir().join(format!("kvc-validate-yaml-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("extra_llm_api_options.yaml");
        std::fs::write(
            &file,
            "max_batch_size: 128\nkv_cache_config:\n  free_gpu_memory_fraction: 0.85\n",
        )?;
        let path = file.display().to_string();
        let (result, out, err) = validate(&["--engine-args", &path], &[])?;
        assert!(result.is_ok(), "{err}");
        assert!(
            out.contains("ignored (the connector does not check them): kv_cache_config.free_gpu_memory_fraction, max_batch_size"),
            "{out}"
        );
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn an_unknown_key_ends_the_config_step_with_its_suggestion() -> TestResult {
        let (result, out, err) = validate(&["--set", "pool.capacity_byte=1GiB"], &[])?;
        assert!(matches!(result, Err(ValidateError::Refused { count: 1 })));
        assert!(err.contains("pool.capacity_bytes"), "{err}");
        assert!(
            !out.contains("[pool]"),
            "no effective config without a loaded one: {out}"
        );
        Ok(())
    }

    /// Step 4: a configuration that takes more memory than the host has is refused,
    /// naming its largest part and a value of it that fits; that value passes.
    #[test]
    fn a_configuration_larger_than_the_host_is_refused_naming_a_value_that_fits() -> TestResult {
        use crate::config::{GIB, MIB};
        let host = 23 * GIB;
        assert!(check_host_memory(&Config::default(), host).is_none());
        let mut config = Config::default();
        config.saver.staging_bytes = 64 * GIB;
        let refused = check_host_memory(&config, host).ok_or("64 GiB of staging was accepted")?;
        assert_eq!(refused.fits_key, "saver.staging_bytes");
        let text = refused.to_string();
        assert!(text.contains("MemTotal"), "{text}");
        assert!(
            text.contains(&format!(
                "saver.staging_bytes={}MiB",
                refused.fits_bytes / MIB
            )),
            "{text}"
        );
        config.saver.staging_bytes = refused.fits_bytes;
        assert!(
            check_host_memory(&config, host).is_none(),
            "the advice fits"
        );
        Ok(())
    }

    /// The same through the command on this host, where 64 GiB of staging does not fit.
    #[test]
    fn validate_refuses_staging_the_host_cannot_hold() -> TestResult {
        let Some(host) = host_memory() else {
            println!("skipped: no /proc/meminfo");
            return Ok(());
        };
        if host.total_bytes >= 72 * crate::config::GIB {
            println!("skipped: this host holds 64 GiB of staging");
            return Ok(());
        }
        let (result, _, err) = validate(&["--set", "saver.staging_bytes=64GiB"], &[])?;
        assert!(
            matches!(result, Err(ValidateError::Refused { count: 1 })),
            "{err}"
        );
        assert!(err.contains("refused [host]"), "{err}");
        assert!(err.contains("e.g. saver.staging_bytes="), "{err}");
        Ok(())
    }
}
