//! Conversions between Python values and the runtime's inputs: dictionaries to TOML trees
//! (configuration and layouts go through the same TOML loaders as files, so they are
//! validated the same way), JSON values to Python objects (layout groups, counters), and
//! integer sequences (tokens, page tables) from lists, numpy arrays or torch tensors.
//!
//! Invariants:
//! - C1. A dictionary converts to exactly the TOML its keys and values spell: `bool` stays
//!   a boolean (it is checked before `int`), paths become strings, `None` is refused
//!   (TOML has no null: leave the key out).
//! - C2. An integer sequence is one-dimensional; a 64-bit integer array is read from its
//!   bytes (C order) in one call, anything else element by element.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// A Python mapping as a TOML table (C1); `origin` names the argument in errors.
pub fn toml_table(value: &Bound<'_, PyAny>, origin: &str) -> PyResult<toml::Table> {
    match toml_value(value, origin)? {
        toml::Value::Table(table) => Ok(table),
        _ => Err(PyTypeError::new_err(format!(
            "{origin} must be a dict, got {}",
            type_name(value)
        ))),
    }
}

/// A Python value as a TOML value (C1); `path` names where it sits, for errors.
fn toml_value(value: &Bound<'_, PyAny>, path: &str) -> PyResult<toml::Value> {
    if value.is_instance_of::<PyBool>() {
        return Ok(toml::Value::Boolean(value.extract()?));
    }
    if value.is_instance_of::<PyInt>() {
        let number: i64 = value.extract().map_err(|_| {
            PyValueError::new_err(format!("{path}: {value} does not fit in a 64-bit integer"))
        })?;
        return Ok(toml::Value::Integer(number));
    }
    if value.is_instance_of::<PyFloat>() {
        return Ok(toml::Value::Float(value.extract()?));
    }
    if value.is_instance_of::<PyString>() {
        return Ok(toml::Value::String(value.extract()?));
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut table = toml::Table::new();
        for (key, item) in dict.iter() {
            let key: String = key.extract().map_err(|_| {
                PyTypeError::new_err(format!("{path}: keys must be strings, got {key:?}"))
            })?;
            let inner = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            table.insert(key, toml_value(&item, &inner)?);
        }
        return Ok(toml::Value::Table(table));
    }
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let items = value
            .try_iter()?
            .enumerate()
            .map(|(index, item)| toml_value(&item?, &format!("{path}[{index}]")))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(toml::Value::Array(items));
    }
    if value.is_none() {
        return Err(PyValueError::new_err(format!(
            "{path}: None has no TOML form; leave the key out for its default"
        )));
    }
    if let Ok(path_text) = fspath(value) {
        return Ok(toml::Value::String(path_text));
    }
    Err(PyTypeError::new_err(format!(
        "{path}: {} values cannot be configuration values",
        type_name(value)
    )))
}

/// `os.fspath(value)` as a string: a `str` or an `os.PathLike`.
pub fn fspath(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let os = value.py().import("os")?;
    os.call_method1("fspath", (value,))?.extract()
}

/// A JSON value as a Python object (dicts, lists, ints, floats, strings, bools, None).
pub fn json_to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        serde_json::Value::Null => py.None().into_bound(py),
        serde_json::Value::Bool(flag) => PyBool::new(py, *flag).to_owned().into_any(),
        serde_json::Value::Number(number) => {
            if let Some(integer) = number.as_u64() {
                integer.into_pyobject(py)?.into_any()
            } else if let Some(integer) = number.as_i64() {
                integer.into_pyobject(py)?.into_any()
            } else {
                number
                    .as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
            }
        }
        serde_json::Value::String(text) => PyString::new(py, text).into_any(),
        serde_json::Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        serde_json::Value::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(key, json_to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// Anything serializable as a Python object, through JSON.
pub fn to_py<'py, T: serde::Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    let json = serde_json::to_value(value)
        .map_err(|error| PyValueError::new_err(format!("cannot convert a value: {error}")))?;
    json_to_py(py, &json)
}

/// A one-dimensional integer sequence (C2): a list or tuple of ints, or a 1-D numpy array
/// or torch tensor of an integer dtype. `what` names the argument in errors.
pub fn int_sequence(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<i64>> {
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        return value.extract().map_err(|_| not_ints(value, what));
    }
    let Ok(ndim) = value.getattr("ndim").and_then(|ndim| ndim.extract::<i64>()) else {
        return Err(not_ints(value, what));
    };
    if ndim != 1 {
        return Err(PyValueError::new_err(format!(
            "{what} must be one-dimensional, got {ndim} dimensions"
        )));
    }
    let dtype = value.getattr("dtype")?.str()?.to_string();
    if dtype == "int64" || dtype == "torch.int64" {
        let array = if dtype == "torch.int64" {
            // `force`: also a CUDA tensor, or one that requires grad (copied to the CPU).
            let kwargs = PyDict::new(value.py());
            kwargs.set_item("force", true)?;
            value.call_method("numpy", (), Some(&kwargs))?
        } else {
            value.clone()
        };
        let bytes = array.call_method0("tobytes")?;
        let bytes = bytes.cast::<PyBytes>()?.as_bytes();
        return Ok(bytes
            .chunks_exact(8)
            .map(|word| {
                let mut le = [0u8; 8];
                le.copy_from_slice(word);
                i64::from_le_bytes(le)
            })
            .collect());
    }
    value
        .call_method0("tolist")?
        .extract()
        .map_err(|_| not_ints(value, what))
}

fn not_ints(value: &Bound<'_, PyAny>, what: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{what} must be a list of ints or a 1-D integer array or tensor, got {}",
        type_name(value)
    ))
}

/// The Python type name of `value`, for messages.
pub fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |name| name.to_string())
}
