//! Reading `validate --engine-args FILE`: a real engine configuration file (TensorRT-LLM's
//! `extra_llm_api_options` YAML, vLLM-style JSON or YAML, or TOML), of which the connector
//! checks the fields of `core::engine_args::CHECKED_FIELDS` (R8) and ignores the rest.
//!
//! The format follows the extension (`.yaml`/`.yml`, `.json`, `.toml`); the file is read
//! into one value tree, the checked fields are taken from it (a checked field of the wrong
//! type is an error naming the file), and every other leaf is listed as ignored so the user
//! sees what was not checked.

use std::io;
use std::path::{Path, PathBuf};

use crate::core::engine_args::{LlmArgs, CHECKED_FIELDS};

/// The engine arguments of a file and the fields the connector did not check.
#[derive(Debug)]
pub struct EngineArgsFile {
    /// The checked fields.
    pub args: LlmArgs,
    /// Dotted paths of the fields present but not checked, sorted.
    pub ignored: Vec<String>,
}

/// Why the engine arguments file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EngineArgsFileError {
    /// The file could not be read.
    #[error("cannot read engine arguments {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The extension names no format this reads.
    #[error(
        "engine arguments {}: unknown format; name the file .yaml, .yml, .json or .toml",
        path.display()
    )]
    Format {
        /// The file.
        path: PathBuf,
    },
    /// The file is not valid in its format.
    #[error("engine arguments {} are not valid {format}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// `yaml`, `json` or `toml`.
        format: &'static str,
        /// The parser's message.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A checked field has a value of the wrong type.
    #[error(
        "engine arguments {}: a checked field has the wrong type (checked: {})",
        path.display(),
        CHECKED_FIELDS.join(", ")
    )]
    Field {
        /// The file.
        path: PathBuf,
        /// What the deserializer said.
        #[source]
        source: serde_json::Error,
    },
}

/// Reads and parses `path` (module docs).
///
/// # Errors
///
/// Any [`EngineArgsFileError`].
pub fn read(path: &Path) -> Result<EngineArgsFile, EngineArgsFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| EngineArgsFileError::Io {
        path: path.to_owned(),
        source,
    })?;
    let extension = path
        .extension()
        .and_then(|ext| ext.to_str())
        .map(str::to_ascii_lowercase);
    let parse_error = |format: &'static str| {
        move |source: Box<dyn std::error::Error + Send + Sync>| EngineArgsFileError::Parse {
            path: path.to_owned(),
            format,
            source,
        }
    };
    let tree: serde_json::Value = match extension.as_deref() {
        Some("yaml" | "yml") => {
            serde_norway::from_str(&text).map_err(|e| parse_error("yaml")(e.into()))?
        }
        Some("json") => serde_json::from_str(&text).map_err(|e| parse_error("json")(e.into()))?,
        Some("toml") => toml::from_str(&text).map_err(|e| parse_error("toml")(e.into()))?,
        _ => {
            return Err(EngineArgsFileError::Format {
                path: path.to_owned(),
            })
        }
    };
    // An empty YAML document is null: no field set.
    let tree = if tree.is_null() {
        serde_json::Value::Object(serde_json::Map::new())
    } else {
        tree
    };
    let mut ignored = Vec::new();
    unchecked_leaves(&tree, "", &mut ignored);
    let args = serde_json::from_value(tree).map_err(|source| EngineArgsFileError::Field {
        path: path.to_owned(),
        source,
    })?;
    Ok(EngineArgsFile { args, ignored })
}

/// Appends the dotted path of every leaf under `value` (at `prefix`) that no checked field
/// names; a section holding checked fields is walked, any other value is one leaf.
fn unchecked_leaves(value: &serde_json::Value, prefix: &str, ignored: &mut Vec<String>) {
    let serde_json::Value::Object(fields) = value else {
        if !prefix.is_empty() && !CHECKED_FIELDS.contains(&prefix) {
            ignored.push(prefix.to_owned());
        }
        return;
    };
    for (name, field) in fields {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let section = format!("{path}.");
        if CHECKED_FIELDS
            .iter()
            .any(|checked| checked.starts_with(&section))
        {
            unchecked_leaves(field, &path, ignored);
        } else if !CHECKED_FIELDS.contains(&path.as_str()) {
            ignored.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn file(name: &str, text: &str) -> Result<PathBuf, io::Error> {
        let dir = std::env::temp_dir().join(format!("kvc-engine-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// A TensorRT-LLM `extra_llm_api_options` file: checked fields read, the rest listed.
    #[test]
    fn trtllm_yaml_is_read_and_unknown_fields_are_listed_r8() -> TestResult {
        let path = file(
            "extra.yaml",
            "max_batch_size: 64\nkv_cache_config:\n  free_gpu_memory_fraction: 0.9\n  \
             enable_swa_scratch_reuse: true\nspeculative_config:\n  decoding_type: Eagle\n  \
             max_draft_len: 3\n",
        )?;
        let parsed = read(&path)?;
        assert!(parsed.args.kv_cache_config.enable_swa_scratch_reuse);
        assert_eq!(
            parsed.args.speculative_config.map(|s| s.max_draft_len),
            Some(3)
        );
        assert_eq!(
            parsed.ignored,
            [
                "kv_cache_config.free_gpu_memory_fraction",
                "max_batch_size",
                "speculative_config.decoding_type"
            ]
        );
        // A misspelt checked field is not silently dropped: it is listed.
        let typo = file(
            "typo.yaml",
            "kv_cache_config:\n  enable_swa_scratch_reus: true\n",
        )?;
        assert_eq!(
            read(&typo)?.ignored,
            ["kv_cache_config.enable_swa_scratch_reus"]
        );
        Ok(())
    }

    /// vLLM's names are aliases of the checked fields.
    #[test]
    fn vllm_json_names_are_understood() -> TestResult {
        let path = file(
            "engine.json",
            r#"{"decode_context_parallel_size": 2, "gpu_memory_utilization": 0.9,
                "speculative_config": {"num_speculative_tokens": 4, "method": "eagle"}}"#,
        )?;
        let parsed = read(&path)?;
        assert_eq!(parsed.args.context_parallel_size, 2);
        assert_eq!(
            parsed.args.speculative_config.map(|s| s.max_draft_len),
            Some(4)
        );
        assert_eq!(
            parsed.ignored,
            ["gpu_memory_utilization", "speculative_config.method"]
        );
        Ok(())
    }

    #[test]
    fn wrong_types_and_formats_are_named() -> TestResult {
        let bad_type = file(
            "bad.yaml",
            "kv_cache_config:\n  enable_swa_scratch_reuse: maybe\n",
        )?;
        let err = read(&bad_type).err().ok_or("a string read as a bool")?;
        assert!(matches!(err, EngineArgsFileError::Field { .. }), "{err}");
        let bad_yaml = file("broken.yml", "a: [1, 2\n")?;
        assert!(matches!(
            read(&bad_yaml),
            Err(EngineArgsFileError::Parse { format: "yaml", .. })
        ));
        let unknown = file("engine.txt", "x = 1\n")?;
        let err = read(&unknown).err().ok_or("a .txt file was read")?;
        assert!(
            err.to_string().contains(".yaml, .yml, .json or .toml"),
            "{err}"
        );
        let empty = file("empty.yaml", "")?;
        assert_eq!(read(&empty)?.args, LlmArgs::default());
        Ok(())
    }
}
