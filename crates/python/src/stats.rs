//! The connector's statistics (R27) as Python values.
//!
//! `Connector.stats()` is the runtime's serialized [`ConnectorStats`]: `lookups`, `loads`,
//! `saves` and `pool` (the pool's health, R30), each keyed by the runtime's counter names,
//! latencies in microseconds as `<name>_us: {count, p50, p99, max}`. `COUNTERS` and
//! `METRIC_FAMILIES` are the runtime's counter declarations and metric families, so the
//! vLLM package builds its metrics from them instead of a table of its own.

use kv_connector::{ConnectorStats, Family, FAMILIES};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use serde_json::{json, Value};

use crate::convert::json_to_py;

/// `stats` as a dict (module docs).
pub fn to_dict<'py>(py: Python<'py>, stats: &ConnectorStats) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(stats)
        .map_err(|error| PyRuntimeError::new_err(format!("stats: {error}")))?;
    json_to_py(py, &value)
}

/// Every counter the runtime declares: `section`, `name`, `kind` (`sum`, `max`, `derived`),
/// `help`, and the metric it is exposed as (`family`, `metric`, `type`, `label`,
/// `label_value`; `None` where it is not exposed).
pub fn counters(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let counters: Vec<Value> = ConnectorStats::declarations()
        .map(|(section, counter)| {
            let family = counter.metric_family();
            json!({
                "section": section,
                "name": counter.name,
                "kind": counter.kind.as_str(),
                "help": counter.help_line(),
                "family": counter.family,
                "metric": family.map(Family::exposed_name),
                "type": family.map(|family| family.kind.as_str()),
                "label": family.and_then(|family| family.label),
                "label_value": counter.label_value,
            })
        })
        .collect();
    json_to_py(py, &Value::from(counters))
}

/// Every metric family: `name`, `metric` (as a scraper sees it), `help`, `unit`, `label`
/// and `type`.
pub fn metric_families(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let families: Vec<Value> = FAMILIES
        .iter()
        .map(|family| {
            json!({
                "name": family.name,
                "metric": family.exposed_name(),
                "help": family.help,
                "unit": family.unit,
                "label": family.label,
                "type": family.kind.as_str(),
            })
        })
        .collect();
    json_to_py(py, &Value::from(families))
}
