//! `kv_connector.StepRequest`: one request in one engine step, as `Connector.on_step` takes
//! it (the runtime's `ScheduledRequest`).

use kv_connector::{RequestId, ReservationId};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::convert::{arg, int_sequence};

/// One request in one engine step.
///
/// `page_tables` holds one page table per layer group, in layout order: the page index of
/// every block of the request in that group, `-1` where a window group holds no page.
///
/// Attributes may be set after construction, each checked as the constructor checks that
/// argument; `Connector.on_step` checks what concerns several (the counts' order, every
/// page index against its group's tensor) before anything of the step is done.
#[pyclass(name = "StepRequest", module = "kv_connector", get_all)]
pub struct PyStepRequest {
    /// The request id.
    pub request_id: u64,
    /// Prompt length in tokens.
    pub prompt_len: usize,
    /// Tokens computed before this step (loaded ones included).
    pub computed_before: usize,
    /// Tokens computed by the end of this step: the chunk end (R16).
    pub computed_after: usize,
    /// A reservation whose pages the engine allocated in this step: its load starts now.
    pub new_reservation: Option<u64>,
    /// Page table per group, layout order; `-1` for no page (set through
    /// [`PyStepRequest::set_page_tables`], which checks it).
    pub page_tables: Vec<Vec<i32>>,
}

#[pymethods]
impl PyStepRequest {
    /// A step record. Each page table may be a list of ints or a 1-D integer array or
    /// tensor.
    #[new]
    #[pyo3(signature = (request_id, prompt_len, computed_before, computed_after, new_reservation = None, page_tables = None))]
    fn new(
        #[pyo3(from_py_with = arg::request_id)] request_id: u64,
        #[pyo3(from_py_with = arg::prompt_len)] prompt_len: usize,
        #[pyo3(from_py_with = arg::computed_before)] computed_before: usize,
        #[pyo3(from_py_with = arg::computed_after)] computed_after: usize,
        #[pyo3(from_py_with = arg::new_reservation)] new_reservation: Option<u64>,
        page_tables: Option<Vec<Bound<'_, PyAny>>>,
    ) -> PyResult<Self> {
        check_counts(computed_before, computed_after)?;
        let page_tables = page_tables
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(group, table)| page_table(table, group))
            .collect::<PyResult<_>>()?;
        Ok(Self {
            request_id,
            prompt_len,
            computed_before,
            computed_after,
            new_reservation,
            page_tables,
        })
    }

    #[setter]
    fn set_request_id(&mut self, #[pyo3(from_py_with = arg::request_id)] value: u64) {
        self.request_id = value;
    }

    #[setter]
    fn set_prompt_len(&mut self, #[pyo3(from_py_with = arg::prompt_len)] value: usize) {
        self.prompt_len = value;
    }

    #[setter]
    fn set_computed_before(&mut self, #[pyo3(from_py_with = arg::computed_before)] value: usize) {
        self.computed_before = value;
    }

    #[setter]
    fn set_computed_after(&mut self, #[pyo3(from_py_with = arg::computed_after)] value: usize) {
        self.computed_after = value;
    }

    #[setter]
    fn set_new_reservation(
        &mut self,
        #[pyo3(from_py_with = arg::new_reservation)] value: Option<u64>,
    ) {
        self.new_reservation = value;
    }

    /// Replaces the page tables, checked as the constructor checks them.
    #[setter]
    fn set_page_tables(&mut self, page_tables: &Bound<'_, PyAny>) -> PyResult<()> {
        let tables: Vec<Bound<'_, PyAny>> = page_tables.extract()?;
        self.page_tables = tables
            .iter()
            .enumerate()
            .map(|(group, table)| page_table(table, group))
            .collect::<PyResult<_>>()?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "StepRequest(request_id={}, prompt_len={}, computed_before={}, computed_after={}, \
             new_reservation={}, page_tables=<{} groups>)",
            self.request_id,
            self.prompt_len,
            self.computed_before,
            self.computed_after,
            self.new_reservation
                .map_or_else(|| "None".to_owned(), |id| id.to_string()),
            self.page_tables.len()
        )
    }
}

/// The constructor's check of the counts, made again by `on_step` (attributes may have
/// been set since).
fn check_counts(computed_before: usize, computed_after: usize) -> PyResult<()> {
    if computed_after < computed_before {
        return Err(PyValueError::new_err(format!(
            "computed_after ({computed_after}) is below computed_before ({computed_before})"
        )));
    }
    Ok(())
}

/// One group's page table: page indices, `-1` for none.
fn page_table(table: &Bound<'_, PyAny>, group: usize) -> PyResult<Vec<i32>> {
    let what = format!("page_tables[{group}]");
    int_sequence(table, &what)?
        .into_iter()
        .map(|page| {
            i32::try_from(page)
                .ok()
                .filter(|&page| page >= -1)
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "{what}: {page} is not a page index (0 to {}, or -1 for none)",
                        i32::MAX
                    ))
                })
        })
        .collect()
}

/// One `StepRequest`, copied out of Python so the runtime can run without the GIL.
pub struct StepCopy {
    /// The request.
    pub request: RequestId,
    /// Prompt length in tokens.
    pub prompt_len: usize,
    /// Tokens computed before this step.
    pub computed_before: usize,
    /// Tokens computed by the end of this step.
    pub computed_after: usize,
    /// A reservation whose load starts now.
    pub new_reservation: Option<ReservationId>,
    /// Page table per group, layout order.
    pub page_tables: Vec<Vec<i32>>,
}

impl StepCopy {
    /// A copy of `request`, checked to hold one page table per layer group whose every
    /// page is below that group's `page_counts` entry (the pages of its tensor).
    pub fn of(request: &PyStepRequest, page_counts: &[u32]) -> PyResult<Self> {
        let groups = page_counts.len();
        if request.page_tables.len() != groups {
            return Err(PyValueError::new_err(format!(
                "request {}: {} page tables given, the layout has {groups} groups",
                request.request_id,
                request.page_tables.len()
            )));
        }
        check_counts(request.computed_before, request.computed_after)?;
        for (group, (table, &pages)) in request.page_tables.iter().zip(page_counts).enumerate() {
            let out_of_range =
                |page: i32| page < -1 || u32::try_from(page).is_ok_and(|page| page >= pages);
            if let Some(block) = table.iter().position(|&page| out_of_range(page)) {
                return Err(PyValueError::new_err(format!(
                    "request {}: page_tables[{group}][{block}] = {} is out of range: group \
                     {group}'s kv cache tensor has {pages} pages (0 to {}, or -1 for none)",
                    request.request_id,
                    table[block],
                    pages.saturating_sub(1)
                )));
            }
        }
        Ok(Self {
            request: RequestId(request.request_id),
            prompt_len: request.prompt_len,
            computed_before: request.computed_before,
            computed_after: request.computed_after,
            new_reservation: request.new_reservation.map(ReservationId),
            page_tables: request.page_tables.clone(),
        })
    }
}
