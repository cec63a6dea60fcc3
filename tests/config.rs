//! Integration tests of the configuration tree (`docs/DESIGN.md` section 9, R9).
//!
//! Files are written under cargo's per-target temporary directory; the environment is
//! always a map, never the process environment.

use std::collections::HashMap;
use std::path::PathBuf;

use kv_connector::config::{
    Config, ConfigError, ConfigSources, ConfigWarning, LoadedConfig, PoolBackend, ValueOrigin, GIB,
    KEYS, MIB,
};
use kv_connector::gpu::DeviceRequest;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const DEFAULT_TOML: &str = include_str!("../config/default.toml");

fn write_toml(name: &str, contents: &str) -> Result<PathBuf, std::io::Error> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("config-tests");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    std::fs::write(&path, contents)?;
    Ok(path)
}

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn cli(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn load_env(pairs: &[(&str, &str)]) -> Result<LoadedConfig, ConfigError> {
    Config::load(&ConfigSources {
        env: env(pairs),
        ..ConfigSources::default()
    })
}

fn load_cli(pairs: &[(&str, &str)]) -> Result<LoadedConfig, ConfigError> {
    Config::load(&ConfigSources {
        cli_overrides: cli(pairs),
        ..ConfigSources::default()
    })
}

fn expect_err(result: Result<LoadedConfig, ConfigError>) -> ConfigError {
    match result {
        Ok(loaded) => panic!("expected an error, loaded {:?}", loaded.config),
        Err(err) => err,
    }
}

// ---- default.toml cannot drift from Config::default() ----

#[test]
fn default_toml_equals_config_default() -> TestResult {
    let parsed: Config = toml::from_str(DEFAULT_TOML)?;
    assert_eq!(parsed, Config::default());
    Ok(())
}

fn leaf_paths(table: &toml::Table) -> Vec<String> {
    let mut paths = Vec::new();
    for (section, entries) in table {
        if let toml::Value::Table(entries) = entries {
            paths.extend(entries.keys().map(|leaf| format!("{section}.{leaf}")));
        } else {
            paths.push(section.clone());
        }
    }
    paths.sort();
    paths
}

#[test]
fn default_toml_lists_every_leaf_key_of_the_default_tree() -> TestResult {
    let from_struct = leaf_paths(&toml::Table::try_from(Config::default())?);
    let from_file = leaf_paths(&toml::from_str::<toml::Table>(DEFAULT_TOML)?);
    assert_eq!(from_file, from_struct);
    Ok(())
}

#[test]
fn key_table_lists_exactly_the_leaves_of_the_default_tree() -> TestResult {
    let from_struct = leaf_paths(&toml::Table::try_from(Config::default())?);
    let mut from_table: Vec<String> = KEYS.iter().map(|spec| spec.path.to_owned()).collect();
    from_table.sort();
    assert_eq!(from_table, from_struct);
    Ok(())
}

#[test]
fn default_toml_names_every_env_variable_and_alias() {
    for spec in KEYS {
        assert!(
            DEFAULT_TOML.contains(spec.env),
            "{} missing from default.toml",
            spec.env
        );
        if let Some(alias) = spec.alias {
            assert!(
                DEFAULT_TOML.contains(alias),
                "{alias} missing from default.toml"
            );
        }
    }
}

#[test]
fn loading_default_toml_as_a_file_gives_the_defaults() -> TestResult {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml"));
    let loaded = Config::load(&ConfigSources {
        toml_path: Some(path),
        ..ConfigSources::default()
    })?;
    assert_eq!(loaded.config, Config::default());
    assert!(loaded.warnings.is_empty());
    Ok(())
}

#[test]
fn defaults_are_the_documented_ones() -> TestResult {
    let config = Config::default();
    config.validate()?;
    assert_eq!(config.model.preset, "tiny-hybrid");
    assert_eq!(config.model.layout_file(), None);
    assert_eq!(config.keys.namespace, "kvc");
    assert_eq!(config.pool.backend, PoolBackend::Memory);
    assert_eq!(config.pool.capacity_bytes, 8 * GIB);
    assert!((config.pool.eviction_high_watermark_ratio - 0.95).abs() < f64::EPSILON);
    assert!((config.pool.eviction_ratio - 0.05).abs() < f64::EPSILON);
    assert_eq!(config.pool.kv_lease_ttl_ms, 2000);
    assert_eq!(config.planner.probe_chunk, 4096);
    assert!(config.planner.window_fallback);
    assert_eq!(config.loaders.load_threads, 2);
    assert!(!config.loaders.sync_load);
    assert_eq!(config.loaders.staging_bytes_per_loader, 256 * MIB);
    assert!(config.saver.window_first);
    assert_eq!(config.saver.resave_min_tokens, 0);
    assert_eq!(config.stats.interval_s, 30);
    assert_eq!(config.device.kind, DeviceRequest::Auto);
    assert_eq!(config.node.memory_budget_bytes, 0);
    assert_eq!(config.mooncake.master_address, "127.0.0.1:50051");
    assert_eq!(config.mooncake.metadata_server, "");
    assert_eq!(config.mooncake.protocol, "tcp");
    assert_eq!(config.mooncake.global_segment_size_bytes, GIB);
    assert_eq!(config.mooncake.local_buffer_size_bytes, 16 * MIB);
    assert_eq!(config.mooncake.tcp_bind_address, "127.0.0.1");
    Ok(())
}

// ---- precedence: defaults < toml < env < cli ----

#[test]
fn precedence_defaults_then_toml_then_env_then_cli() -> TestResult {
    let path = write_toml("precedence.toml", "[loaders]\nload_threads = 3\n")?;
    let mut sources = ConfigSources::default();
    assert_eq!(
        Config::load(&sources)?.config.loaders.load_threads,
        2,
        "default"
    );
    sources.toml_path = Some(path);
    assert_eq!(
        Config::load(&sources)?.config.loaders.load_threads,
        3,
        "toml over default"
    );
    sources.env = env(&[("KVC_LOADERS_LOAD_THREADS", "4")]);
    assert_eq!(
        Config::load(&sources)?.config.loaders.load_threads,
        4,
        "env over toml"
    );
    sources.cli_overrides = cli(&[("loaders.load_threads", "5")]);
    assert_eq!(
        Config::load(&sources)?.config.loaders.load_threads,
        5,
        "cli over env"
    );
    Ok(())
}

#[test]
fn layers_only_touch_the_keys_they_set() -> TestResult {
    let path = write_toml("partial.toml", "[pool]\nbackend = \"mooncake\"\n")?;
    let loaded = Config::load(&ConfigSources {
        toml_path: Some(path),
        env: env(&[("KVC_STATS_INTERVAL_S", "5")]),
        cli_overrides: cli(&[("device.kind", "host")]),
    })?;
    let mut expected = Config::default();
    expected.pool.backend = PoolBackend::Mooncake;
    expected.stats.interval_s = 5;
    expected.device.kind = DeviceRequest::Host;
    assert_eq!(loaded.config, expected);
    Ok(())
}

#[test]
fn later_cli_overrides_win() -> TestResult {
    let loaded = load_cli(&[("stats.interval_s", "7"), ("stats.interval_s", "9")])?;
    assert_eq!(loaded.config.stats.interval_s, 9);
    Ok(())
}

// ---- the legacy TRTLLM aliases of `docs/DESIGN.md` section 9 ----

#[test]
fn alias_load_threads() -> TestResult {
    let config = load_env(&[("TRTLLM_MOONCAKE_STORE_LOAD_THREADS", "6")])?.config;
    assert_eq!(config.loaders.load_threads, 6);
    Ok(())
}

#[test]
fn alias_sync_load() -> TestResult {
    assert!(
        load_env(&[("TRTLLM_MOONCAKE_STORE_SYNC_LOAD", "1")])?
            .config
            .loaders
            .sync_load
    );
    assert!(
        !load_env(&[("TRTLLM_MOONCAKE_STORE_SYNC_LOAD", "0")])?
            .config
            .loaders
            .sync_load
    );
    Ok(())
}

#[test]
fn alias_window_fallback() -> TestResult {
    let config = load_env(&[("TRTLLM_MOONCAKE_STORE_WINDOW_FALLBACK", "0")])?.config;
    assert!(!config.planner.window_fallback);
    Ok(())
}

#[test]
fn alias_resave_min_tokens_number_and_off() -> TestResult {
    let config = load_env(&[("TRTLLM_MOONCAKE_STORE_RESAVE_MIN_TOKENS", "32768")])?.config;
    assert_eq!(config.saver.resave_min_tokens, 32768);
    let config = load_env(&[("TRTLLM_MOONCAKE_STORE_RESAVE_MIN_TOKENS", "off")])?.config;
    assert_eq!(config.saver.resave_min_tokens, 0);
    Ok(())
}

#[test]
fn alias_probe_chunk() -> TestResult {
    let config = load_env(&[("TRTLLM_MOONCAKE_STORE_PROBE_CHUNK", "512")])?.config;
    assert_eq!(config.planner.probe_chunk, 512);
    Ok(())
}

#[test]
fn alias_window_first() -> TestResult {
    let config = load_env(&[("TRTLLM_MOONCAKE_STORE_WINDOW_FIRST", "0")])?.config;
    assert!(!config.saver.window_first);
    Ok(())
}

#[test]
fn generic_name_wins_over_a_conflicting_alias_with_a_warning() -> TestResult {
    let loaded = load_env(&[
        ("TRTLLM_MOONCAKE_STORE_LOAD_THREADS", "6"),
        ("KVC_LOADERS_LOAD_THREADS", "3"),
    ])?;
    assert_eq!(loaded.config.loaders.load_threads, 3);
    assert_eq!(
        loaded.warnings,
        vec![ConfigWarning::AliasOverridden {
            key: "loaders.load_threads",
            alias: "TRTLLM_MOONCAKE_STORE_LOAD_THREADS",
            alias_value: "6".to_owned(),
            generic: "KVC_LOADERS_LOAD_THREADS",
            generic_value: "3".to_owned(),
        }]
    );
    let message = loaded.warnings[0].to_string();
    assert!(
        message.contains("TRTLLM_MOONCAKE_STORE_LOAD_THREADS"),
        "{message}"
    );
    assert!(message.contains("KVC_LOADERS_LOAD_THREADS"), "{message}");
    Ok(())
}

#[test]
fn alias_and_generic_with_equal_values_do_not_warn() -> TestResult {
    let loaded = load_env(&[
        ("TRTLLM_MOONCAKE_STORE_SYNC_LOAD", "1"),
        ("KVC_LOADERS_SYNC_LOAD", "true"),
    ])?;
    assert!(loaded.config.loaders.sync_load);
    assert!(loaded.warnings.is_empty());
    Ok(())
}

#[test]
fn a_bad_alias_overridden_by_the_generic_name_only_warns() -> TestResult {
    let loaded = load_env(&[
        ("TRTLLM_MOONCAKE_STORE_WINDOW_FIRST", "maybe"),
        ("KVC_SAVER_WINDOW_FIRST", "0"),
    ])?;
    assert!(!loaded.config.saver.window_first);
    assert_eq!(loaded.warnings.len(), 1);
    Ok(())
}

#[test]
fn a_bad_alias_value_is_refused_naming_the_alias() {
    let err = expect_err(load_env(&[("TRTLLM_MOONCAKE_STORE_SYNC_LOAD", "yes")]));
    assert_eq!(err.kind(), "invalid_value");
    let message = err.to_string();
    assert!(
        message.contains("TRTLLM_MOONCAKE_STORE_SYNC_LOAD"),
        "{message}"
    );
    assert!(message.contains("true, false, 1 or 0"), "{message}");
}

// ---- text formats ----

#[test]
fn byte_sizes_accept_unit_suffixes_in_every_layer() -> TestResult {
    let path = write_toml("bytes.toml", "[saver]\nstaging_bytes = \"64MiB\"\n")?;
    let loaded = Config::load(&ConfigSources {
        toml_path: Some(path),
        env: env(&[("KVC_POOL_CAPACITY_BYTES", "4GiB")]),
        cli_overrides: cli(&[("loaders.staging_bytes_per_loader", "128 MiB")]),
    })?;
    assert_eq!(loaded.config.saver.staging_bytes, 64 * MIB);
    assert_eq!(loaded.config.pool.capacity_bytes, 4 * GIB);
    assert_eq!(loaded.config.loaders.staging_bytes_per_loader, 128 * MIB);
    Ok(())
}

/// A well-formed number beyond what the tree holds is "too large", not "not a byte count".
#[test]
fn numbers_too_large_say_so() {
    for (key, value) in [
        ("pool.capacity_bytes", "18446744073709551615"),
        ("pool.capacity_bytes", "99999999999TiB"),
        ("planner.probe_chunk", "99999999999999999999"),
    ] {
        let err = Config::load(&ConfigSources {
            cli_overrides: cli(&[(key, value)]),
            ..ConfigSources::default()
        })
        .expect_err("a value beyond i64 was accepted");
        let message = err.to_string();
        assert!(message.contains("too large"), "{key}={value}: {message}");
        assert!(message.contains("9223372036854775807"), "{message}");
    }
    let err = Config::load(&ConfigSources {
        cli_overrides: cli(&[("pool.capacity_bytes", "8XB")]),
        ..ConfigSources::default()
    })
    .expect_err("8XB is no byte count");
    assert!(!err.to_string().contains("too large"), "{err}");
}

#[test]
fn integer_ratio_in_toml_is_accepted() -> TestResult {
    let path = write_toml("ratio.toml", "[pool]\neviction_ratio = 1\n")?;
    let loaded = Config::load(&ConfigSources {
        toml_path: Some(path),
        ..ConfigSources::default()
    })?;
    assert!((loaded.config.pool.eviction_ratio - 1.0).abs() < f64::EPSILON);
    Ok(())
}

#[test]
fn unknown_choice_is_refused_listing_the_choices() {
    let err = expect_err(load_cli(&[("pool.backend", "redis")]));
    let message = err.to_string();
    assert!(message.contains("pool.backend"), "{message}");
    assert!(message.contains("memory, mooncake"), "{message}");
}

#[test]
fn wrong_toml_type_is_refused_naming_key_and_file() -> TestResult {
    let path = write_toml("wrong-type.toml", "[planner]\nwindow_fallback = 3\n")?;
    let err = expect_err(Config::load(&ConfigSources {
        toml_path: Some(path.clone()),
        ..ConfigSources::default()
    }));
    match &err {
        ConfigError::InvalidValue {
            key,
            env,
            value,
            origin,
            ..
        } => {
            assert_eq!(*key, "planner.window_fallback");
            assert_eq!(*env, "KVC_PLANNER_WINDOW_FALLBACK");
            assert_eq!(value, "3");
            assert_eq!(origin, &ValueOrigin::File(path.clone()));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains(&path.display().to_string()));
    Ok(())
}

#[test]
fn negative_integer_in_toml_is_refused() -> TestResult {
    let path = write_toml("negative.toml", "[stats]\ninterval_s = -1\n")?;
    let err = expect_err(Config::load(&ConfigSources {
        toml_path: Some(path),
        ..ConfigSources::default()
    }));
    assert_eq!(err.kind(), "invalid_value");
    assert!(err.to_string().contains("stats.interval_s"));
    Ok(())
}

// ---- unknown keys (typo protection) ----

#[test]
fn unknown_key_in_toml_is_refused_with_its_name_and_file() -> TestResult {
    let path = write_toml("unknown-key.toml", "[pool]\ncapcity_bytes = 1\n")?;
    let err = expect_err(Config::load(&ConfigSources {
        toml_path: Some(path.clone()),
        ..ConfigSources::default()
    }));
    match &err {
        ConfigError::UnknownKey {
            key,
            origin,
            suggestion,
        } => {
            assert_eq!(key, "pool.capcity_bytes");
            assert_eq!(origin, &ValueOrigin::File(path.clone()));
            assert_eq!(suggestion.as_deref(), Some("pool.capacity_bytes"));
        }
        other => panic!("unexpected {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("pool.capcity_bytes"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
    Ok(())
}

#[test]
fn unknown_section_in_toml_is_refused() -> TestResult {
    let path = write_toml("unknown-section.toml", "[loader]\nload_threads = 1\n")?;
    let err = expect_err(Config::load(&ConfigSources {
        toml_path: Some(path),
        ..ConfigSources::default()
    }));
    assert!(
        matches!(&err, ConfigError::UnknownKey { key, .. } if key == "loader"),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn section_written_as_a_value_is_refused() -> TestResult {
    let path = write_toml("not-a-table.toml", "pool = 3\n")?;
    let err = expect_err(Config::load(&ConfigSources {
        toml_path: Some(path),
        ..ConfigSources::default()
    }));
    assert_eq!(err.kind(), "not_a_table");
    assert!(err.to_string().contains("pool"));
    Ok(())
}

#[test]
fn unknown_kvc_env_variable_is_refused_with_its_name() {
    let err = expect_err(load_env(&[("KVC_POOL_CAPACITY", "1")]));
    match &err {
        ConfigError::UnknownKey {
            key,
            origin,
            suggestion,
        } => {
            assert_eq!(key, "KVC_POOL_CAPACITY");
            assert_eq!(origin, &ValueOrigin::Env("KVC_POOL_CAPACITY".to_owned()));
            assert_eq!(suggestion.as_deref(), Some("KVC_POOL_CAPACITY_BYTES"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("KVC_POOL_CAPACITY"));
}

#[test]
fn other_env_variables_are_ignored() -> TestResult {
    let loaded = load_env(&[
        ("PATH", "/usr/bin"),
        ("TRTLLM_MOONCAKE_STORE_SOMETHING_ELSE", "x"),
        ("KVCACHE_DIR", "/tmp"),
    ])?;
    assert_eq!(loaded.config, Config::default());
    Ok(())
}

#[test]
fn unknown_cli_key_is_refused_with_its_name() {
    let err = expect_err(load_cli(&[("planner.probe_chunks", "8")]));
    match &err {
        ConfigError::UnknownKey {
            key,
            origin,
            suggestion,
        } => {
            assert_eq!(key, "planner.probe_chunks");
            assert_eq!(origin, &ValueOrigin::Cli);
            assert_eq!(suggestion.as_deref(), Some("planner.probe_chunk"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("planner.probe_chunks"));
}

// ---- files ----

#[test]
fn malformed_toml_is_refused_naming_the_file() -> TestResult {
    let path = write_toml("malformed.toml", "[pool\ncapacity_bytes = 1\n")?;
    let err = expect_err(Config::load(&ConfigSources {
        toml_path: Some(path.clone()),
        ..ConfigSources::default()
    }));
    assert_eq!(err.kind(), "toml");
    assert!(matches!(&err, ConfigError::Toml { path: p, .. } if *p == path));
    assert!(err.to_string().contains(&path.display().to_string()));
    assert!(
        std::error::Error::source(&err).is_some(),
        "the parser error is kept as source"
    );
    Ok(())
}

#[test]
fn missing_file_is_an_io_error_naming_the_file() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("config-tests/does-not-exist.toml");
    let err = expect_err(Config::load(&ConfigSources {
        toml_path: Some(path.clone()),
        ..ConfigSources::default()
    }));
    assert_eq!(err.kind(), "io");
    assert!(err.to_string().contains("does-not-exist.toml"));
}

// ---- validation through load ----

#[test]
fn load_validates_the_merged_result() {
    let err = expect_err(load_env(&[("TRTLLM_MOONCAKE_STORE_LOAD_THREADS", "0")]));
    match &err {
        ConfigError::OutOfRange {
            key,
            env,
            value,
            hint,
        } => {
            assert_eq!(*key, "loaders.load_threads");
            assert_eq!(*env, "KVC_LOADERS_LOAD_THREADS");
            assert_eq!(value, "0");
            assert!(hint.contains("at least 1"), "{hint}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn budget_refusal_names_the_largest_affordable_pool_capacity() {
    // 4 GiB budget - 2 x 256 MiB - 256 MiB staging = 3328 MiB of pool at most (R9).
    let err = expect_err(load_env(&[("KVC_NODE_MEMORY_BUDGET_BYTES", "4GiB")]));
    let message = err.to_string();
    assert_eq!(err.kind(), "budget");
    assert!(
        message.contains("pool.capacity_bytes to at most 3489660928"),
        "{message}"
    );
    assert!(
        message.contains("KVC_NODE_MEMORY_BUDGET_BYTES"),
        "{message}"
    );
}

#[test]
fn mooncake_keys_load_from_every_layer() -> TestResult {
    let path = write_toml(
        "mooncake.toml",
        "[mooncake]\nmaster_address = \"10.0.0.5:50051\"\nprotocol = \"RDMA\"\n",
    )?;
    let loaded = Config::load(&ConfigSources {
        toml_path: Some(path),
        env: env(&[
            ("KVC_MOONCAKE_GLOBAL_SEGMENT_SIZE_BYTES", "4GiB"),
            ("KVC_MOONCAKE_DEVICE_NAME", "mlx5_0"),
        ]),
        cli_overrides: cli(&[("mooncake.venv_dir", "/opt/mooncake-venv")]),
    })?;
    let mooncake = &loaded.config.mooncake;
    assert_eq!(mooncake.master_address, "10.0.0.5:50051");
    assert_eq!(mooncake.protocol, "rdma", "choices are lower-cased");
    assert_eq!(mooncake.global_segment_size_bytes, 4 * GIB);
    assert_eq!(mooncake.device_name, "mlx5_0");
    assert_eq!(mooncake.venv_dir, PathBuf::from("/opt/mooncake-venv"));
    assert_eq!(
        mooncake.effective_metadata_server(),
        "http://10.0.0.5:8080/metadata"
    );
    let err = expect_err(load_cli(&[("mooncake.protocol", "udp")]));
    assert!(err.to_string().contains("tcp, rdma"), "{err}");
    Ok(())
}

#[test]
fn budget_refusal_for_mooncake_names_the_largest_affordable_segment() {
    // 2 GiB budget - 768 MiB staging = 1280 MiB of segment at most (R9); the 8 GiB
    // pool.capacity_bytes is not this node's memory on Mooncake.
    let err = expect_err(load_env(&[
        ("KVC_POOL_BACKEND", "mooncake"),
        ("KVC_NODE_MEMORY_BUDGET_BYTES", "2GiB"),
        ("KVC_MOONCAKE_GLOBAL_SEGMENT_SIZE_BYTES", "2GiB"),
    ]));
    let message = err.to_string();
    assert_eq!(err.kind(), "budget");
    assert!(
        message.contains("set mooncake.global_segment_size_bytes to at most 1342177280"),
        "{message}"
    );
}

#[test]
fn budget_holding_everything_passes() -> TestResult {
    let loaded = load_env(&[("KVC_NODE_MEMORY_BUDGET_BYTES", "9GiB")])?;
    assert_eq!(loaded.config.node.memory_budget_bytes, 9 * GIB);
    Ok(())
}

// ---- rendering and listing ----

#[test]
fn effective_config_renders_and_parses_back() -> TestResult {
    let config = load_cli(&[
        ("pool.backend", "mooncake"),
        ("saver.resave_min_tokens", "off"),
    ])?
    .config;
    let text = config.to_toml_string()?;
    let parsed: Config = toml::from_str(&text)?;
    assert_eq!(parsed, config);
    assert!(text.contains("backend = \"mooncake\""), "{text}");
    Ok(())
}

#[test]
fn key_docs_list_every_key_with_env_name_and_default() -> TestResult {
    let docs = Config::key_docs()?;
    assert_eq!(docs.len(), KEYS.len());
    let capacity = docs
        .iter()
        .find(|doc| doc.spec.path == "pool.capacity_bytes")
        .ok_or("pool.capacity_bytes missing")?;
    assert_eq!(capacity.spec.env, "KVC_POOL_CAPACITY_BYTES");
    assert_eq!(capacity.default, "8589934592");
    let threads = docs
        .iter()
        .find(|doc| doc.spec.path == "loaders.load_threads")
        .ok_or("loaders.load_threads missing")?;
    assert_eq!(
        threads.spec.alias,
        Some("TRTLLM_MOONCAKE_STORE_LOAD_THREADS")
    );
    assert!(
        docs.iter().all(|doc| !doc.default.is_empty()),
        "every key has a default"
    );
    Ok(())
}

#[test]
fn process_env_sources_hold_only_connector_variables() {
    let sources = ConfigSources::from_process_env();
    assert!(sources.toml_path.is_none());
    assert!(sources.cli_overrides.is_empty());
    for name in sources.env.keys() {
        assert!(
            name.starts_with("KVC_") || name.starts_with("TRTLLM_MOONCAKE_STORE_"),
            "{name} should have been left out"
        );
    }
}
