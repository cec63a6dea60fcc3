//! `kv_connector.Layout`: the KV layout (R6) from a dict, a TOML file or a preset, validated
//! by the runtime's own loader (R7), so every source is refused for the same reasons.

use std::path::Path;

use kv_connector::{load_blocks, GroupId, LayerGroup, Layout};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::convert::{arg, fspath, to_py, toml_table};
use crate::errors;

/// A validated KV layout: tokens per block, world size and layer groups.
#[pyclass(name = "Layout", module = "kv_connector", frozen)]
pub struct PyLayout {
    /// The validated layout.
    pub inner: Layout,
}

impl PyLayout {
    /// The layout of `value`: a `Layout`, or a preset name.
    pub fn from_arg(value: &Bound<'_, PyAny>) -> PyResult<Layout> {
        if let Ok(layout) = value.cast::<PyLayout>() {
            return Ok(layout.get().inner.clone());
        }
        let name: String = value.extract().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(
                "layout must be a kv_connector.Layout or a preset name",
            )
        })?;
        Layout::preset(&name).map_err(|error| errors::layout(&error))
    }

    /// Page bytes of `group` on one rank.
    pub fn group_page_bytes(layout: &Layout, group: u32) -> PyResult<u64> {
        layout
            .page_bytes(Self::group(layout, group)?)
            .map_err(|error| errors::layout(&error))
    }

    /// The group of id `group`, or a `ValueError` naming the layout's groups.
    fn group(layout: &Layout, group: u32) -> PyResult<&LayerGroup> {
        layout
            .groups
            .iter()
            .find(|candidate| candidate.id == GroupId(group))
            .ok_or_else(|| {
                let known: Vec<String> = layout.groups.iter().map(|g| g.id.to_string()).collect();
                PyValueError::new_err(format!(
                    "layout {} has no group {group}; its groups are {}",
                    layout.name,
                    known.join(", ")
                ))
            })
    }
}

#[pymethods]
impl PyLayout {
    /// A layout from a dict with the keys of a layout TOML file (`name`,
    /// `tokens_per_block`, `world_size`, `groups`). Raises `LayoutError` when refused.
    #[staticmethod]
    fn from_dict(layout: &Bound<'_, PyAny>) -> PyResult<Self> {
        let table = toml_table(layout, "layout")?;
        let text = toml::to_string(&table)
            .map_err(|error| PyValueError::new_err(format!("layout: {error}")))?;
        Layout::from_toml_str(&text, "<dict>")
            .map(|inner| Self { inner })
            .map_err(|error| errors::layout(&error))
    }

    /// A layout from a TOML file. Raises `LayoutError` when it cannot be read or is refused.
    #[staticmethod]
    fn from_toml(path: &Bound<'_, PyAny>) -> PyResult<Self> {
        let path = fspath(path)?;
        Layout::from_file(Path::new(&path))
            .map(|inner| Self { inner })
            .map_err(|error| errors::layout(&error))
    }

    /// A compiled-in preset (`Layout.preset_names()` lists them).
    #[staticmethod]
    fn preset(name: &str) -> PyResult<Self> {
        Layout::preset(name)
            .map(|inner| Self { inner })
            .map_err(|error| errors::layout(&error))
    }

    /// The names of the compiled-in presets.
    #[staticmethod]
    fn preset_names() -> Vec<&'static str> {
        Layout::preset_names().collect()
    }

    /// Bytes of one page of `group_id` on one rank: all layers of the group, K and V, one
    /// block. A KV cache tensor's `tensor[0]` must hold exactly this many bytes.
    fn page_bytes(&self, #[pyo3(from_py_with = arg::group_id)] group_id: u32) -> PyResult<u64> {
        Self::group_page_bytes(&self.inner, group_id)
    }

    /// The blocks of group `group_id` that a load resuming at token `end` fills, from token
    /// `start` on (R15): every block of a full group, the sink blocks and the window of
    /// `end` for a window group; what the runtime's plans load, so an engine allocates
    /// pages for exactly these.
    fn load_blocks(
        &self,
        #[pyo3(from_py_with = arg::group_id)] group_id: u32,
        #[pyo3(from_py_with = arg::start)] start: usize,
        #[pyo3(from_py_with = arg::end)] end: usize,
    ) -> PyResult<Vec<usize>> {
        let group = Self::group(&self.inner, group_id)?;
        Ok(load_blocks(
            group.attention(),
            self.inner.tokens_per_block as usize,
            start,
            end,
        ))
    }

    /// The layout's name.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// Tokens per KV block.
    #[getter]
    fn tokens_per_block(&self) -> u32 {
        self.inner.tokens_per_block
    }

    /// Tensor-parallel world size.
    #[getter]
    fn world_size(&self) -> u32 {
        self.inner.world_size
    }

    /// The groups, in layout order, as dicts with every field filled in.
    #[getter]
    fn groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for group in &self.inner.groups {
            list.append(to_py(py, group)?)?;
        }
        Ok(list)
    }

    /// The 16-hex-digit layout fingerprint appended to the model key (R4).
    #[getter]
    fn fingerprint(&self) -> String {
        self.inner.fingerprint().to_string()
    }

    /// The layout as a dict that `Layout.from_dict` accepts.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner)
    }

    fn __repr__(&self) -> String {
        let groups: Vec<String> = self
            .inner
            .groups
            .iter()
            .map(|group| format!("{}:{:?}", group.id, group.kind).to_lowercase())
            .collect();
        format!(
            "Layout(name={:?}, tokens_per_block={}, world_size={}, groups=[{}])",
            self.inner.name,
            self.inner.tokens_per_block,
            self.inner.world_size,
            groups.join(", ")
        )
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyLayout>()
            .is_ok_and(|other| other.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        self.inner.fingerprint().0
    }
}
