//! Layering: built-in defaults < TOML file < environment < command line.
//!
//! Workflow:
//! 1. the defaults are serialized into a two-level TOML table (`section -> key -> value`);
//! 2. the file's table is merged over it, key by key; an unknown section or key is refused
//!    with its name and the file, a value of the wrong type with its key;
//! 3. environment values (`KVC_*`, then the legacy `TRTLLM_MOONCAKE_STORE_*` aliases where
//!    no `KVC_*` variable is set) are parsed by the kind of the key they name;
//! 4. command-line overrides (`section.key=value`, in order, later ones win) likewise.
//!
//! The caller deserializes the result into `Config` and validates it.
//!
//! Invariants:
//! 1. Every value written into the tree has passed its key's kind check, so the final
//!    typed deserialize cannot fail on a value a user supplied.
//! 2. An unknown `KVC_*` variable is an error; other variables are ignored.
//! 3. When a legacy alias and its `KVC_*` variable disagree, the `KVC_*` value is used and
//!    a [`ConfigWarning::AliasOverridden`] is returned, never printed.

use std::collections::HashMap;
use std::path::Path;

use toml::{Table, Value};

use super::error::{ConfigError, ConfigWarning, ValueOrigin};
use super::keys::{self, KeySpec, KEYS};

/// Prefix of the generic environment variables; unknown names under it are errors.
pub const ENV_PREFIX: &str = "KVC_";

/// Writes `value` at `spec`'s place in the tree, creating the section if needed.
fn set_leaf(tree: &mut Table, spec: &KeySpec, value: Value) {
    let section = tree
        .entry(spec.section())
        .or_insert_with(|| Value::Table(Table::new()));
    if let Value::Table(section) = section {
        section.insert(spec.leaf().to_owned(), value);
    }
}

fn unknown_key(key: String, origin: ValueOrigin) -> ConfigError {
    let suggestion = match origin {
        ValueOrigin::Env(_) => keys::closest(&key, KEYS.iter().map(|spec| spec.env)),
        _ => keys::closest(&key, KEYS.iter().map(|spec| spec.path)),
    };
    ConfigError::UnknownKey {
        key,
        origin,
        suggestion,
    }
}

fn invalid_value(spec: &KeySpec, value: String, origin: ValueOrigin) -> ConfigError {
    ConfigError::InvalidValue {
        key: spec.path,
        env: spec.env,
        expected: spec.kind.expected_for(&value),
        value,
        origin,
    }
}

/// Parses a text value for `spec`, naming the key and `origin` when it does not fit.
fn parse_for(spec: &KeySpec, raw: &str, origin: &ValueOrigin) -> Result<Value, ConfigError> {
    spec.kind
        .parse_text(raw)
        .ok_or_else(|| invalid_value(spec, raw.to_owned(), origin.clone()))
}

/// Merges a parsed TOML file over `tree` (workflow step 2).
///
/// # Errors
/// [`ConfigError::UnknownKey`] for a section or key `Config` lacks,
/// [`ConfigError::NotATable`] for a section written as a plain value,
/// [`ConfigError::InvalidValue`] for a value of the wrong type; each names `path`.
pub fn merge_file(tree: &mut Table, file: Table, path: &Path) -> Result<(), ConfigError> {
    let origin = || ValueOrigin::File(path.to_owned());
    for (section, entries) in file {
        if !KEYS.iter().any(|spec| spec.section() == section) {
            return Err(unknown_key(section, origin()));
        }
        let Value::Table(entries) = entries else {
            return Err(ConfigError::NotATable {
                key: section,
                origin: origin(),
            });
        };
        for (leaf, value) in entries {
            let dotted = format!("{section}.{leaf}");
            let spec = keys::by_path(&dotted).ok_or_else(|| unknown_key(dotted, origin()))?;
            let coerced = spec
                .kind
                .coerce_toml(&value)
                .ok_or_else(|| invalid_value(spec, value.to_string(), origin()))?;
            set_leaf(tree, spec, coerced);
        }
    }
    Ok(())
}

/// Applies environment variables over `tree` (workflow step 3), returning the warnings.
///
/// # Errors
/// [`ConfigError::UnknownKey`] for a `KVC_*` variable that names no key (the first in
/// name order), [`ConfigError::InvalidValue`] for a value that does not parse.
pub fn apply_env(
    tree: &mut Table,
    env: &HashMap<String, String>,
) -> Result<Vec<ConfigWarning>, ConfigError> {
    let mut unknown: Vec<&String> = env
        .keys()
        .filter(|name| name.starts_with(ENV_PREFIX) && !KEYS.iter().any(|spec| spec.env == *name))
        .collect();
    unknown.sort();
    if let Some(name) = unknown.first() {
        return Err(unknown_key(
            (*name).clone(),
            ValueOrigin::Env((*name).clone()),
        ));
    }
    let mut warnings = Vec::new();
    for spec in KEYS {
        let generic = env.get(spec.env).map(|raw| {
            (
                raw,
                parse_for(spec, raw, &ValueOrigin::Env(spec.env.to_owned())),
            )
        });
        let alias = spec.alias.and_then(|alias| {
            env.get(alias).map(|raw| {
                (
                    alias,
                    raw,
                    parse_for(spec, raw, &ValueOrigin::Env(alias.to_owned())),
                )
            })
        });
        match (generic, alias) {
            (Some((_, parsed)), None) | (None, Some((_, _, parsed))) => {
                set_leaf(tree, spec, parsed?);
            }
            (Some((generic_raw, generic_parsed)), Some((alias, alias_raw, alias_parsed))) => {
                let generic_value = generic_parsed?;
                if alias_parsed.ok().as_ref() != Some(&generic_value) {
                    warnings.push(ConfigWarning::AliasOverridden {
                        key: spec.path,
                        alias,
                        alias_value: alias_raw.clone(),
                        generic: spec.env,
                        generic_value: generic_raw.clone(),
                    });
                }
                set_leaf(tree, spec, generic_value);
            }
            (None, None) => {}
        }
    }
    Ok(warnings)
}

/// Applies command-line overrides over `tree` in order (workflow step 4).
///
/// # Errors
/// [`ConfigError::UnknownKey`] for a dotted key that names no leaf,
/// [`ConfigError::InvalidValue`] for a value that does not parse.
pub fn apply_cli(tree: &mut Table, overrides: &[(String, String)]) -> Result<(), ConfigError> {
    for (dotted, raw) in overrides {
        let spec = keys::by_path(dotted.trim())
            .ok_or_else(|| unknown_key(dotted.clone(), ValueOrigin::Cli))?;
        let value = parse_for(spec, raw, &ValueOrigin::Cli)?;
        set_leaf(tree, spec, value);
    }
    Ok(())
}

/// Splits a command-line argument `section.key=value` at the first `=`.
///
/// # Errors
/// [`ConfigError::MalformedOverride`] when there is no `=` or the key is empty.
#[cfg(any(feature = "cli", feature = "internals"))]
pub fn parse_override(arg: &str) -> Result<(String, String), ConfigError> {
    match arg.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.to_owned()))
        }
        _ => Err(ConfigError::MalformedOverride {
            arg: arg.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_split_at_the_first_equals_sign() -> Result<(), ConfigError> {
        assert_eq!(
            parse_override("model.layout_file=/a=b.json")?,
            ("model.layout_file".to_owned(), "/a=b.json".to_owned())
        );
        assert_eq!(
            parse_override(" stats.interval_s =5")?,
            ("stats.interval_s".to_owned(), "5".to_owned())
        );
        assert_eq!(
            parse_override("keys.model_key=")?,
            ("keys.model_key".to_owned(), String::new())
        );
        Ok(())
    }

    #[test]
    fn overrides_without_a_key_are_malformed() {
        for arg in ["stats.interval_s", "=5", ""] {
            let err = parse_override(arg).err();
            assert!(
                matches!(err, Some(ConfigError::MalformedOverride { .. })),
                "{arg:?}: {err:?}"
            );
        }
    }

    #[test]
    fn set_leaf_replaces_only_its_key() {
        let mut tree = Table::new();
        let spec = keys::by_path("stats.interval_s");
        assert!(spec.is_some());
        if let Some(spec) = spec {
            set_leaf(&mut tree, spec, Value::Integer(7));
            set_leaf(&mut tree, spec, Value::Integer(8));
        }
        assert_eq!(tree.to_string().trim(), "[stats]\ninterval_s = 8");
    }

    #[test]
    fn first_unknown_env_name_in_sorted_order_is_reported() {
        let env: HashMap<String, String> = [("KVC_ZZZ", "1"), ("KVC_AAA", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let err = apply_env(&mut Table::new(), &env).err();
        assert!(
            matches!(err, Some(ConfigError::UnknownKey { ref key, .. }) if key == "KVC_AAA"),
            "{err:?}"
        );
    }
}
