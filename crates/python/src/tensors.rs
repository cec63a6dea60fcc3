//! KV cache tensors: checking the engine's torch tensors against the layout and opening a
//! device on their memory (R31). Tensors are read only through their Python attributes
//! (`data_ptr()`, `is_cuda`, `device`, `is_contiguous()`, `element_size()`, `shape`,
//! `dtype`, `untyped_storage()`), so the package needs no torch headers or libraries.
//!
//! Rules, per layer group in layout order (module docs of the package repeat them):
//! - `python::tensors::T1`. One strided tensor per group, page-major: dim 0 is the page index,
//!   `tensor[i]` is exactly one page, so
//!   `numel(tensor[0]) * element_size == layout.page_bytes(group)`; any dtype whose pages come out
//!   at that size.
//! - `python::tensors::T2`. C-contiguous, at least one page, and its bytes lie inside its storage.
//! - `python::tensors::T3`. All tensors of a rank on one device: the CPU (host backend on borrowed
//!   memory) or one CUDA device (its primary context, the one torch uses).
//! - `python::tensors::T4`. The device keeps a reference to every tensor and to its storage until
//!   its last use (the device's owner box); the engine must not resize or re-point a registered
//!   tensor.
//! - `python::tensors::T5`. The references are dropped with the device's last clone; [`Released`]
//!   tells the connector's shutdown when that happened, so shutdown returns with the tensors free.
//!
//! Anything else is a `LayoutError` naming the group, the expected page bytes and what was
//! given.

use std::sync::Arc;
use std::time::Duration;

use kv_connector::{BorrowedPages, Device, GroupId, Layout};
use parking_lot::{Condvar, Mutex};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::convert::type_name;
use crate::errors::{self, LayoutError};

/// Where a rank's tensors live (`python::tensors::T3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// CPU tensors: the host backend.
    Host,
    /// CUDA tensors of this device ordinal.
    Cuda(u32),
}

impl Placement {
    /// As torch names it: `cpu` or `cuda:N`.
    pub fn torch_name(self) -> String {
        match self {
            Self::Host => "cpu".to_owned(),
            Self::Cuda(ordinal) => format!("cuda:{ordinal}"),
        }
    }
}

/// One checked tensor: its page region and placement.
struct CheckedTensor {
    region: BorrowedPages,
    placement: Placement,
}

/// What keeps a rank's borrowed memory alive (`python::tensors::T4`): the tensors and their
/// storages.
struct TensorRefs {
    /// Held only so that the memory outlives every copy; dropped after the device.
    held: Vec<Py<PyAny>>,
    /// Told when the references go (`python::tensors::T5`).
    released: Arc<Released>,
}

impl Drop for TensorRefs {
    fn drop(&mut self) {
        // The references go first (to pyo3's pool when the GIL is not held; a thread that
        // takes the GIL next applies them), then waiters are told.
        drop(std::mem::take(&mut self.held));
        let mut done = self.released.done.lock();
        *done = true;
        self.released.changed.notify_all();
    }
}

/// Whether a device's tensor references are gone (`python::tensors::T5`): the device's last clone
/// can drop on an actor thread shortly after the connector's shutdown returned, so shutdown waits
/// for this.
#[derive(Default)]
pub struct Released {
    done: Mutex<bool>,
    changed: Condvar,
}

impl Released {
    /// Waits until the references are gone or `limit` passes; `true` when gone.
    pub fn wait(&self, limit: Duration) -> bool {
        let mut done = self.done.lock();
        if !*done {
            self.changed.wait_for(&mut done, limit);
        }
        *done
    }
}

/// The per-rank tensor lists of `kv_caches`: a list of tensors (one rank) or a list of
/// per-rank lists. `first_rank`: the rank of the first list (the others follow); `None`
/// asks for every rank of the layout.
pub fn per_rank<'py>(
    kv_caches: &Bound<'py, PyAny>,
    layout: &Layout,
    first_rank: Option<u32>,
) -> PyResult<Vec<Vec<Bound<'py, PyAny>>>> {
    let outer: Vec<Bound<'py, PyAny>> = kv_caches.extract().map_err(|_| {
        refuse(
            "kv_caches",
            format!("must be a list of tensors, got {}", type_name(kv_caches)),
        )
    })?;
    let nested = outer
        .first()
        .is_some_and(|first| first.is_instance_of::<PyList>() || first.is_instance_of::<PyTuple>());
    let ranks: Vec<Vec<Bound<'py, PyAny>>> = if nested {
        outer
            .iter()
            .map(PyAnyMethods::extract)
            .collect::<PyResult<_>>()?
    } else {
        vec![outer]
    };
    let world = layout.world_size as usize;
    let fits = match first_rank {
        None => ranks.len() == world,
        Some(first) => !ranks.is_empty() && first as usize + ranks.len() <= world,
    };
    if !fits {
        let from = first_rank.map_or_else(String::new, |first| format!(" from rank {first}"));
        return Err(refuse(
            "kv_caches",
            format!(
                "holds tensors for {} ranks{from}, but layout {} has world size {}; give one \
                 list of per-group tensors per rank (or rank= the first list's rank)",
                ranks.len(),
                layout.name,
                layout.world_size
            ),
        ));
    }
    for (rank, tensors) in ranks.iter().enumerate() {
        if tensors.len() != layout.groups.len() {
            return Err(refuse(
                "kv_caches",
                format!(
                    "rank {rank} has {} tensors, but layout {} has {} groups; give one tensor \
                     per group, in layout order",
                    tensors.len(),
                    layout.name,
                    layout.groups.len()
                ),
            ));
        }
    }
    Ok(ranks)
}

/// A device on one rank's tensors, where they live, and the signal of their release
/// (`python::tensors::T5`).
pub struct RankDevice {
    /// The device on the tensors' memory.
    pub device: Device,
    /// Where the tensors live.
    pub placement: Placement,
    /// Told when the device drops its tensor references.
    pub released: Arc<Released>,
}

/// Checks one rank's tensors (`python::tensors::T1`-T3) and opens a device on their memory
/// (`python::tensors::T4`, `python::tensors::T5`).
pub fn open_device(
    layout: &Layout,
    rank: usize,
    tensors: &[Bound<'_, PyAny>],
) -> PyResult<RankDevice> {
    let mut checked = Vec::with_capacity(tensors.len());
    for (group, tensor) in layout.groups.iter().zip(tensors) {
        let page_bytes = layout
            .page_bytes(group)
            .map_err(|error| errors::layout(&error))?;
        checked.push(check(group.id, page_bytes, tensor)?);
    }
    let placement = checked
        .first()
        .map_or(Placement::Host, |first| first.placement);
    if let Some(other) = checked.iter().find(|tensor| tensor.placement != placement) {
        return Err(refuse(
            &format!("rank {rank}"),
            format!(
                "mixes devices: group {} is on {}, group {} on {}; put every cache of a rank \
                 on one device",
                checked[0].region.group,
                placement.torch_name(),
                other.region.group,
                other.placement.torch_name()
            ),
        ));
    }
    let regions: Vec<BorrowedPages> = checked.iter().map(|tensor| tensor.region).collect();
    let mut held = Vec::with_capacity(2 * tensors.len());
    for tensor in tensors {
        held.push(tensor.clone().unbind());
        held.push(tensor.call_method0("untyped_storage")?.unbind());
    }
    let released = Arc::new(Released::default());
    let owner = Box::new(TensorRefs {
        held,
        released: Arc::clone(&released),
    });
    #[expect(
        unsafe_code,
        reason = "the one place the package hands tensor memory to the device layer"
    )]
    // SAFETY: each region is the exact byte range of a C-contiguous tensor (its data_ptr
    // and numel * element_size, checked inside its storage, `python::tensors::T1`,
    // `python::tensors::T2`) on the CPU or on CUDA device `ordinal` (`python::tensors::T3`);
    // the owner box holds the tensor and its storage, and the device drops it only after its
    // last use, so the memory stays allocated (`python::tensors::T4`); the engine hands a page
    // to the connector only through the reservation protocol and leaves it alone until the
    // connector hands it back (package docs, "Threads and the GIL").
    let device = unsafe {
        match placement {
            Placement::Host => Device::borrow_host(&regions, owner),
            Placement::Cuda(ordinal) => Device::borrow_cuda(ordinal, &regions, owner),
        }
    }
    .map_err(|error| errors::device(&error))?;
    Ok(RankDevice {
        device,
        placement,
        released,
    })
}

/// Checks one group's tensor (`python::tensors::T1`, `python::tensors::T2`) and reads its region
/// and placement.
fn check(group: GroupId, page_bytes: u64, tensor: &Bound<'_, PyAny>) -> PyResult<CheckedTensor> {
    let what = format!("the kv cache of group {group}");
    let expect = |given: String| {
        refuse(
            &what,
            format!("needs pages of {page_bytes} bytes (tensor[0]), got {given}"),
        )
    };
    if !tensor.hasattr("data_ptr")? || !tensor.hasattr("untyped_storage")? {
        return Err(expect(format!(
            "a {} (not a torch tensor)",
            type_name(tensor)
        )));
    }
    let layout_kind = tensor.getattr("layout")?.str()?.to_string();
    if layout_kind != "torch.strided" {
        return Err(expect(format!(
            "a {layout_kind} tensor (only strided tensors have pages)"
        )));
    }
    let device = tensor.getattr("device")?;
    let device_type: String = device.getattr("type")?.extract()?;
    let placement = match device_type.as_str() {
        "cpu" => Placement::Host,
        "cuda" => Placement::Cuda(
            device
                .getattr("index")?
                .extract::<Option<u32>>()?
                .unwrap_or(0),
        ),
        other => {
            return Err(expect(format!(
                "a tensor on device {other:?} (only cpu and cuda tensors can be registered)"
            )))
        }
    };
    let shape: Vec<u64> = tensor.getattr("shape")?.extract()?;
    let dtype = tensor.getattr("dtype")?.str()?.to_string();
    let element_size: u64 = tensor.call_method0("element_size")?.extract()?;
    let describe = || format!("shape {shape:?} of {dtype} ({element_size} bytes each)");
    let Some((&num_pages, page_shape)) = shape.split_first() else {
        return Err(expect(format!("a 0-dimensional tensor of {dtype}")));
    };
    let given_page_bytes = page_shape.iter().product::<u64>() * element_size;
    if given_page_bytes != page_bytes {
        return Err(expect(format!(
            "{}, whose pages are {given_page_bytes} bytes; dim 0 must be the page index",
            describe()
        )));
    }
    let num_pages = u32::try_from(num_pages)
        .ok()
        .filter(|&pages| pages > 0)
        .ok_or_else(|| expect(format!("{} (1 to {} pages)", describe(), u32::MAX)))?;
    if !tensor.call_method0("is_contiguous")?.extract::<bool>()? {
        let strides: Vec<i64> = tensor.call_method0("stride")?.extract()?;
        return Err(expect(format!(
            "{} with strides {strides:?}, not C-contiguous; pass tensor.contiguous() \
             of the cache the engine uses, not a view",
            describe()
        )));
    }
    let base: u64 = tensor.call_method0("data_ptr")?.extract()?;
    check_in_storage(tensor, base, u64::from(num_pages) * page_bytes, &expect)?;
    Ok(CheckedTensor {
        region: BorrowedPages {
            group,
            base,
            page_bytes: usize::try_from(page_bytes).unwrap_or(usize::MAX),
            num_pages,
        },
        placement,
    })
}

/// `python::tensors::T2`: `base..base + bytes` lies inside the tensor's storage.
fn check_in_storage(
    tensor: &Bound<'_, PyAny>,
    base: u64,
    bytes: u64,
    expect: &dyn Fn(String) -> PyErr,
) -> PyResult<()> {
    let storage = tensor.call_method0("untyped_storage")?;
    let start: u64 = storage.call_method0("data_ptr")?.extract()?;
    let len: u64 = storage.call_method0("nbytes")?.extract()?;
    let inside = base >= start
        && base
            .checked_add(bytes)
            .is_some_and(|end| start.checked_add(len).is_some_and(|limit| end <= limit));
    if base == 0 || !inside {
        return Err(expect(format!(
            "a tensor whose {bytes} bytes at {base:#x} are not inside its storage \
             ({len} bytes at {start:#x})"
        )));
    }
    Ok(())
}

/// A `LayoutError` about `what`.
fn refuse(what: &str, detail: impl std::fmt::Display) -> PyErr {
    errors::raise::<LayoutError>("kv_cache", format!("{what} {detail}"))
}
