//! Fuzzes the configuration loader: the input is a TOML file, optionally followed by a
//! line `%%` and `section.key=value` overrides, one a line. Any input loads or gives one
//! typed error, never a panic; a configuration that loads is valid and renders back to
//! TOML that loads to the same configuration.
#![no_main]

use std::path::Path;

use kv_connector::config::{parse_override, Config, ConfigSources};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (toml_text, overrides) = text.split_once("\n%%\n").unwrap_or((text, ""));
    let cli_overrides: Vec<(String, String)> = overrides
        .lines()
        .filter_map(|line| parse_override(line).ok())
        .collect();
    let sources = ConfigSources {
        cli_overrides,
        ..ConfigSources::default()
    };
    match Config::load_toml_text(toml_text, Path::new("fuzz.toml"), &sources) {
        Ok(loaded) => {
            assert!(loaded.config.validate().is_ok());
            let rendered = loaded.config.to_toml_string().expect("a valid config renders");
            let again = Config::load_toml_text(
                &rendered,
                Path::new("rendered.toml"),
                &ConfigSources::default(),
            )
            .expect("a rendered config loads");
            assert_eq!(again.config, loaded.config);
        }
        Err(err) => {
            let _ = (err.to_string(), err.kind());
        }
    }
});
