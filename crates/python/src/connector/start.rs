//! Starting a connector: the layout, the configuration (a `MemoryPool` given counts as
//! its `pool.capacity_bytes`, and must fit the host with the rest before any pool memory is
//! taken), one device per rank on the engine's tensors, the pool, then the runtime's
//! `ConnectorHandle` (with the GIL released, `python::connector::G1`).

use std::sync::Arc;

use kv_connector::{
    object_len, scope_seed, ConnectorHandle, ConnectorParams, Device, DeviceRequest, Layout, Pool,
    RankShare, Scope,
};
use pyo3::prelude::*;

use super::lifecycle::{self, State};
use super::PyConnector;
use crate::config;
use crate::errors::{self, ConfigError};
use crate::layout::PyLayout;
use crate::pool::{self, PyMemoryPool};
use crate::tensors::{self, Placement};

/// The arguments of `Connector(...)`.
pub(super) struct StartArgs<'a, 'py> {
    pub layout: &'a Bound<'py, PyAny>,
    /// `None`: a lookup-only connector (no rank, no loads or saves).
    pub kv_caches: Option<&'a Bound<'py, PyAny>>,
    pub pool: Option<&'a Bound<'py, PyMemoryPool>>,
    pub config: Option<&'a Bound<'py, PyAny>>,
    pub model_key: Option<String>,
    pub namespace: Option<String>,
    pub salt: Option<&'a str>,
    /// The rank of `kv_caches`' first list; `None`: every rank of the layout, from 0.
    pub rank: Option<u32>,
    /// The pipeline stages' layouts whose union `layout` is (a lookup-only connector's).
    pub stages: Option<Vec<Bound<'py, PyAny>>>,
}

/// Starts a connector (module docs).
pub(super) fn start(args: StartArgs<'_, '_>) -> PyResult<PyConnector> {
    let StartArgs {
        layout,
        kv_caches,
        pool,
        config,
        model_key,
        namespace,
        salt,
        rank,
        stages,
    } = args;
    let py = layout.py();
    let layout = PyLayout::from_arg(layout)?;
    let share = RankShare {
        first_rank: rank.unwrap_or(0),
        stages: stages
            .unwrap_or_default()
            .iter()
            .map(PyLayout::from_arg)
            .collect::<PyResult<_>>()?,
    };
    let given = pool.map(Bound::get);
    let capacity = given.map(PyMemoryPool::capacity_bytes);
    let mut config = config::load_for_pool(py, config, capacity)?;
    if given.is_some() {
        pool::check_given_pool(&config)?;
    }
    pool::check_host_memory(&config, given)?;
    if let Some(namespace) = namespace {
        config.keys.namespace = namespace;
    }
    if kv_caches.is_none() {
        // A lookup-only client stores nothing: it lends the pool no memory that would
        // vanish with it.
        config.mooncake.global_segment_size_bytes = 0;
    }
    let model_key = model_key
        .or_else(|| Some(config.keys.model_key.clone()).filter(|key| !key.is_empty()))
        .unwrap_or_else(|| layout.name.clone());
    let mut devices = Vec::new();
    let mut placements = Vec::new();
    let mut released = Vec::new();
    let ranks = match kv_caches {
        Some(kv_caches) => tensors::per_rank(kv_caches, &layout, rank)?,
        None => Vec::new(),
    };
    for (rank, tensors) in (share.first_rank as usize..).zip(&ranks) {
        let opened = tensors::open_device(&layout, rank, tensors)?;
        check_device_kind(config.device.kind, opened.placement)?;
        devices.push(opened.device);
        placements.push(opened.placement);
        released.push(opened.released);
    }
    let (object_lens, page_counts) = page_pools(&layout, &devices)?;
    let pool: Arc<dyn Pool> = match pool {
        Some(shared) => {
            let shared = shared.get();
            py.detach(|| shared.for_device(devices.first(), &object_lens))?
        }
        None => pool::from_config(py, &config, devices.first(), &object_lens)?,
    };
    let seed = scope_seed(&Scope {
        salt: salt.map(str::to_owned),
        ..Scope::default()
    });
    let namespace = config.keys.namespace.clone();
    let params = ConnectorParams {
        config,
        layout: layout.clone(),
        pool: Arc::clone(&pool),
        devices,
        share,
        seed,
        model_key: model_key.clone(),
    };
    let handle = py
        .detach(|| ConnectorHandle::start(params))
        .map_err(|error| errors::start(&error))?;
    let state = lifecycle::register(State::new(handle, released));
    Ok(PyConnector {
        state,
        layout,
        seed,
        placements,
        page_counts,
        pool_name: pool.name(),
        model_key,
        namespace,
    })
}

/// Refuses tensors on a device that `device.kind` excludes (`auto` takes the tensors').
fn check_device_kind(kind: DeviceRequest, placement: Placement) -> PyResult<()> {
    let refused = match (kind, placement) {
        (DeviceRequest::Cuda, Placement::Host) => {
            "device.kind = \"cuda\" but the kv caches are cpu tensors"
        }
        (DeviceRequest::Host, Placement::Cuda(_)) => {
            "device.kind = \"host\" but the kv caches are cuda tensors"
        }
        _ => return Ok(()),
    };
    Err(errors::raise::<ConfigError>(
        "device_kind",
        format!("{refused}; set device.kind = \"auto\" (the tensors decide)"),
    ))
}

/// What the connector's page pools imply, read once from every rank's device:
/// - the size of every object the connector stores, one per layer group and rank (what a
///   memory pool made for it reserves its capacity for);
/// - per layer group, the pages of its tensor on every rank (the fewest, should ranks
///   differ): what `on_step` checks page tables against.
fn page_pools(layout: &Layout, devices: &[Device]) -> PyResult<(Vec<usize>, Vec<u32>)> {
    let mut object_lens = Vec::new();
    let mut page_counts = vec![u32::MAX; layout.groups.len()];
    for device in devices {
        for (count, group) in page_counts.iter_mut().zip(&layout.groups) {
            let spec = device
                .page_pool(group.id)
                .map_err(|error| errors::device(&error))?;
            object_lens.push(object_len(spec.page_bytes));
            *count = (*count).min(spec.num_pages);
        }
    }
    Ok((object_lens, page_counts))
}
