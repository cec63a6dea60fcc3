//! `docs/CONFIGURATION.md` is tested against the configuration tree: every key of
//! `config/default.toml` has a row with the same default and environment variable, and
//! the page lists no key the tree does not have.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use kv_connector::config::KEYS;

/// `section.key` -> the default as written in `config/default.toml`.
fn default_toml_leaves() -> anyhow::Result<BTreeMap<String, String>> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml"))?;
    let table: toml::Table = text.parse()?;
    let mut leaves = BTreeMap::new();
    for (section, keys) in &table {
        let Some(keys) = keys.as_table() else {
            bail!("[{section}] is not a table");
        };
        for (key, value) in keys {
            leaves.insert(format!("{section}.{key}"), value.to_string());
        }
    }
    Ok(leaves)
}

/// One documented key: its default cell and its environment cell.
struct Row {
    default: String,
    environment: String,
}

/// The key rows of `docs/CONFIGURATION.md`: table lines whose first cell is a dotted key.
fn documented_rows() -> anyhow::Result<BTreeMap<String, Row>> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/CONFIGURATION.md"
    ))?;
    let mut rows = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split(" | ").collect();
        let Some(key) = cells
            .first()
            .and_then(|cell| cell.strip_prefix("| `"))
            .and_then(|cell| cell.strip_suffix('`'))
        else {
            continue;
        };
        if !key.contains('.') || cells.len() < 4 {
            continue;
        }
        let default = cells[1]
            .strip_prefix('`')
            .and_then(|cell| cell.strip_suffix('`'))
            .with_context(|| format!("{key}: default cell {:?} is not code", cells[1]))?;
        let row = Row {
            default: default.to_owned(),
            environment: cells[2].to_owned(),
        };
        if rows.insert(key.to_owned(), row).is_some() {
            bail!("{key} is documented twice");
        }
    }
    Ok(rows)
}

#[test]
fn every_default_toml_key_is_documented_and_nothing_else() -> anyhow::Result<()> {
    let leaves = default_toml_leaves()?;
    let rows = documented_rows()?;
    let undocumented: Vec<&String> = leaves
        .keys()
        .filter(|key| !rows.contains_key(*key))
        .collect();
    let unknown: Vec<&String> = rows
        .keys()
        .filter(|key| !leaves.contains_key(*key))
        .collect();
    assert!(
        undocumented.is_empty(),
        "keys missing from docs/CONFIGURATION.md: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "docs/CONFIGURATION.md lists unknown keys: {unknown:?}"
    );
    Ok(())
}

#[test]
fn documented_defaults_are_the_default_toml_values() -> anyhow::Result<()> {
    let leaves = default_toml_leaves()?;
    for (key, row) in documented_rows()? {
        let Some(value) = leaves.get(&key) else {
            continue;
        };
        assert_eq!(
            &row.default, value,
            "default of {key} in docs/CONFIGURATION.md"
        );
    }
    Ok(())
}

#[test]
fn documented_environment_names_are_the_key_tables() -> anyhow::Result<()> {
    let rows = documented_rows()?;
    for spec in KEYS {
        let row = rows
            .get(spec.path)
            .with_context(|| format!("{} missing from docs/CONFIGURATION.md", spec.path))?;
        assert!(
            row.environment.starts_with(&format!("`{}`", spec.env)),
            "{}: environment cell {:?} should name {}",
            spec.path,
            row.environment,
            spec.env
        );
        if let Some(alias) = spec.alias {
            assert!(
                row.environment.contains(&format!("`{alias}`")),
                "{}: environment cell {:?} should name the legacy {alias}",
                spec.path,
                row.environment
            );
        }
    }
    Ok(())
}
