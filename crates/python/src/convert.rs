//! Conversions between Python values and the runtime's inputs: dictionaries to TOML trees
//! (configuration and layouts go through the same TOML loaders as files, so they are
//! validated the same way), JSON values to Python objects (layout groups, counters), and
//! integer sequences (tokens, page tables) from lists, numpy arrays or torch tensors.
//!
//! Invariants:
//! - `python::convert::C1`. A dictionary converts to exactly the TOML its keys and values spell:
//!   `bool` stays a boolean (it is checked before `int`), paths become strings, `None` is refused
//!   (TOML has no null: leave the key out).
//! - `python::convert::C2`. An integer sequence is one-dimensional; a numpy array or torch tensor
//!   of an integer dtype (8 to 64 bits, signed or not) is read from its bytes (C order) in one
//!   call, anything else element by element. A value outside `i64` is a `ValueError` naming its
//!   index and value, a non-integer a `TypeError` naming its index.
//! - `python::convert::C3`. An id or count argument (`request_id`, `num_computed`,
//!   `capacity_bytes`, ...) is a non-negative integer: a negative or too large one is a
//!   `ValueError` naming the argument and the range ([`arg`]), never pyo3's bare `OverflowError`.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// A Python mapping as a TOML table (`python::convert::C1`); `origin` names the argument in errors.
pub fn toml_table(value: &Bound<'_, PyAny>, origin: &str) -> PyResult<toml::Table> {
    match toml_value(value, origin)? {
        toml::Value::Table(table) => Ok(table),
        _ => Err(PyTypeError::new_err(format!(
            "{origin} must be a dict, got {}",
            type_name(value)
        ))),
    }
}

/// A Python value as a TOML value (`python::convert::C1`); `path` names where it sits, for errors.
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

/// A one-dimensional integer sequence (`python::convert::C2`): a list or tuple of ints, or a 1-D
/// numpy array or torch tensor of an integer dtype. `what` names the argument in errors.
pub fn int_sequence(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<i64>> {
    // A list is read item by item in place (no sequence protocol per item): a vLLM prompt
    // of 128k tokens arrives as one, on the scheduler's thread.
    if let Ok(list) = value.cast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for item in list.iter() {
            out.push(
                item.extract::<i64>()
                    .map_err(|_| first_bad_element(value, what))?,
            );
        }
        return Ok(out);
    }
    if value.is_instance_of::<PyTuple>() {
        return value.extract().map_err(|_| first_bad_element(value, what));
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
    let torch = dtype.starts_with("torch.");
    if let Some(int_dtype) = IntDtype::of(dtype.trim_start_matches("torch.")) {
        let array = if torch {
            // `force`: also a CUDA tensor, or one that requires grad (copied to the CPU).
            let kwargs = PyDict::new(value.py());
            kwargs.set_item("force", true)?;
            value.call_method("numpy", (), Some(&kwargs))?
        } else {
            value.clone()
        };
        let bytes = array.call_method0("tobytes")?;
        return int_dtype.decode(bytes.cast::<PyBytes>()?.as_bytes(), what);
    }
    let list = value.call_method0("tolist")?;
    list.extract().map_err(|_| first_bad_element(&list, what))
}

/// The first `len` items of `list`, read on a runtime thread
/// (`Connector.lookup(read_later=True)`) a slice at a time: the GIL is taken for each slice
/// and let go between them, so the engine's threads wait for at most one slice. `list` is
/// the lookup's private snapshot, or the caller's own list that only grows
/// (`append_only=True`): a list found shorter than `len` is not read.
pub fn read_list_later(list: Py<PyList>, len: usize) -> Result<Arc<[i64]>, String> {
    /// Tokens read per hold of the GIL (about 0.1-0.3 ms).
    const SLICE: usize = 16_384;
    let mut tokens = Vec::with_capacity(len);
    while tokens.len() < len {
        Python::attach(|py| {
            let list = list.bind(py);
            if list.len() < len {
                return Err(format!(
                    "the list of {len} tokens shrank to {} before it was read",
                    list.len()
                ));
            }
            let start = tokens.len();
            for index in start..len.min(start + SLICE) {
                let item = list.get_item(index).map_err(|error| error.to_string())?;
                let token = item.extract::<i64>().map_err(|_| {
                    format!("tokens[{index}] is not an int (got {})", type_name(&item))
                })?;
                tokens.push(token);
            }
            Ok::<(), String>(())
        })?;
        if tokens.len() < len {
            std::thread::yield_now();
        }
    }
    Python::attach(|_| drop(list));
    Ok(tokens.into())
}

/// The integer dtypes read from their bytes (`python::convert::C2`), in native (little-endian)
/// order.
#[derive(Clone, Copy)]
enum IntDtype {
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
}

impl IntDtype {
    /// The dtype of a numpy dtype name or a torch one without `torch.` (`int32`, `uint8`).
    fn of(dtype: &str) -> Option<Self> {
        Some(match dtype {
            "int8" => Self::I8,
            "int16" => Self::I16,
            "int32" => Self::I32,
            "int64" => Self::I64,
            "uint8" => Self::U8,
            "uint16" => Self::U16,
            "uint32" => Self::U32,
            "uint64" => Self::U64,
            _ => return None,
        })
    }

    /// The elements of `raw`; a `uint64` element above `i64::MAX` is refused
    /// (`python::convert::C2`).
    fn decode(self, raw: &[u8], what: &str) -> PyResult<Vec<i64>> {
        Ok(match self {
            Self::I8 => words(raw).map(i8::from_le_bytes).map(i64::from).collect(),
            Self::I16 => words(raw).map(i16::from_le_bytes).map(i64::from).collect(),
            Self::I32 => words(raw).map(i32::from_le_bytes).map(i64::from).collect(),
            Self::I64 => words(raw).map(i64::from_le_bytes).collect(),
            Self::U8 => words(raw).map(u8::from_le_bytes).map(i64::from).collect(),
            Self::U16 => words(raw).map(u16::from_le_bytes).map(i64::from).collect(),
            Self::U32 => words(raw).map(u32::from_le_bytes).map(i64::from).collect(),
            Self::U64 => words(raw)
                .map(u64::from_le_bytes)
                .enumerate()
                .map(|(index, value)| {
                    i64::try_from(value).map_err(|_| out_of_range(what, index, &value))
                })
                .collect::<PyResult<_>>()?,
        })
    }
}

/// The `N`-byte words of `raw` (a trailing partial word is left out).
fn words<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    raw.chunks_exact(N).map(|word| {
        let mut bytes = [0u8; N];
        bytes.copy_from_slice(word);
        bytes
    })
}

/// Why a list did not convert: its first element that is not an int (`TypeError`) or does
/// not fit `i64` (`ValueError`), by index (`python::convert::C2`).
fn first_bad_element(value: &Bound<'_, PyAny>, what: &str) -> PyErr {
    let Ok(items) = value.try_iter() else {
        return not_ints(value, what);
    };
    for (index, item) in items.enumerate() {
        let Ok(item) = item else {
            break;
        };
        if item.extract::<i64>().is_ok() {
            continue;
        }
        return match as_integer(&item) {
            Some(number) => out_of_range(what, index, &number),
            None => PyTypeError::new_err(format!(
                "{what}[{index}] must be an int, got {}",
                type_name(&item)
            )),
        };
    }
    not_ints(value, what)
}

fn out_of_range(what: &str, index: usize, value: &dyn std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!(
        "{what}[{index}] = {value} is out of range: values are signed 64-bit integers \
         (-2**63 to 2**63 - 1)"
    ))
}

fn not_ints(value: &Bound<'_, PyAny>, what: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{what} must be a list of ints or a 1-D integer array or tensor, got {}",
        type_name(value)
    ))
}

/// `value` as a Python integer (`operator.index`), for messages; `None` if it is none.
fn as_integer<'py>(value: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let operator = value.py().import("operator").ok()?;
    operator.call_method1("index", (value,)).ok()
}

/// A non-negative integer argument called `name` (`python::convert::C3`): a `ValueError` naming it
/// and the range when negative or too large, a `TypeError` naming it when not an integer.
pub fn unsigned<T: TryFrom<u64> + Bounded>(value: &Bound<'_, PyAny>, name: &str) -> PyResult<T> {
    if let Some(number) = value
        .extract::<u64>()
        .ok()
        .and_then(|number| T::try_from(number).ok())
    {
        return Ok(number);
    }
    match as_integer(value) {
        Some(number) => Err(PyValueError::new_err(format!(
            "{name} must be an integer from 0 to {}, got {number}",
            T::MAX_TEXT
        ))),
        None => Err(PyTypeError::new_err(format!(
            "{name} must be an int, got {}",
            type_name(value)
        ))),
    }
}

/// The largest value of an unsigned argument type, for messages.
pub trait Bounded {
    /// `MAX`, written out.
    const MAX_TEXT: &'static str;
}

impl Bounded for u64 {
    const MAX_TEXT: &'static str = "2**64 - 1";
}

impl Bounded for u32 {
    const MAX_TEXT: &'static str = "2**32 - 1";
}

impl Bounded for usize {
    const MAX_TEXT: &'static str = if usize::BITS == 64 {
        "2**64 - 1"
    } else {
        "2**32 - 1"
    };
}

/// The extractors of the id and count arguments (`python::convert::C3`), for
/// `#[pyo3(from_py_with = ...)]`: each converts one argument and names it in its errors.
pub mod arg {
    use pyo3::prelude::*;

    use super::unsigned;

    macro_rules! unsigned_args {
        ($($name:ident: $ty:ty),* $(,)?) => {
            $(
                #[doc = concat!("The `", stringify!($name), "` argument (`python::convert::C3`).")]
                pub fn $name(value: &Bound<'_, PyAny>) -> PyResult<$ty> {
                    unsigned(value, stringify!($name))
                }
            )*
        };
    }

    unsigned_args!(
        request_id: u64,
        reservation_id: u64,
        capacity_bytes: u64,
        kv_lease_ttl_ms: u64,
        num_computed: usize,
        local_match_tokens: usize,
        start: usize,
        end: usize,
        prompt_len: usize,
        computed_before: usize,
        computed_after: usize,
        group_id: u32,
    );

    /// The `new_reservation` argument: `None` or a reservation id (`python::convert::C3`).
    pub fn new_reservation(value: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        if value.is_none() {
            return Ok(None);
        }
        unsigned(value, "new_reservation").map(Some)
    }
}

/// The Python type name of `value`, for messages.
pub fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |name| name.to_string())
}
