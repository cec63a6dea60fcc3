//! The pool `inspect` asks (workflow step 3 of `inspect`): the embedded pool seeded by a
//! replay of a trace prefix through the real connector, or a client of a running Mooncake
//! master that contributes no segment.

use std::sync::Arc;
use std::time::Duration;

use super::{InspectArgs, InspectError};
use crate::config::{Config, PoolBackend};
use crate::core::layout::{Layout, LayoutError};
use crate::pool::Pool;
use crate::replay::cost::CostModel;
use crate::replay::setup::stored_page_bytes;
use crate::replay::workload::read_mooncake_trace;
use crate::replay::{
    kvc_connector, run_replay, DeploymentParams, InstanceContext, KvBytesScale, KvPages,
    NoProgress, PoolMaster, ReplayConnector, ReplayError, ReplayParams, Routing,
};

/// The pool to ask, with the stored page bytes its objects have (layout order).
pub(super) struct PoolUnderTest {
    /// The pool.
    pub pool: Arc<dyn Pool>,
    /// How it was set up, for the output.
    pub description: String,
    /// Stored page bytes per group, layout order (the `b{bytes}` key segment).
    pub payload_lens: Vec<usize>,
}

/// Workflow step 3.
pub(super) fn open_pool(
    args: &InspectArgs,
    config: &Config,
    layout: &Layout,
) -> Result<PoolUnderTest, InspectError> {
    match config.pool.backend {
        PoolBackend::Memory => seed_memory_pool(args, config, layout),
        PoolBackend::Mooncake => connect_mooncake(args, config, layout),
    }
}

/// The stored page bytes of every group at `scale`.
fn scaled_payloads(layout: &Layout, scale: f64) -> Result<Vec<usize>, LayoutError> {
    layout
        .groups
        .iter()
        .map(|group| {
            let full = layout.page_bytes(group)?;
            Ok(usize::try_from(stored_page_bytes(full, scale)).unwrap_or(usize::MAX))
        })
        .collect()
}

/// `--pool memory`: replays the seed requests and keeps the pool they wrote.
fn seed_memory_pool(
    args: &InspectArgs,
    config: &Config,
    layout: &Layout,
) -> Result<PoolUnderTest, InspectError> {
    let trace = args
        .seed_trace
        .as_ref()
        .or(args.trace.as_ref())
        .ok_or(InspectError::NoSeedTrace)?;
    let requests = args.seed_requests.unwrap_or_else(|| {
        args.line
            .map_or(0, |line| usize::try_from(line - 1).unwrap_or(usize::MAX))
    });
    let mut workload = read_mooncake_trace(trace, Some(requests.max(1)))?;
    workload.truncate(requests);
    let description = format!(
        "memory, seeded by replaying {} request(s) of {}",
        workload.len(),
        trace.display()
    );
    let cost = CostModel::for_layout(&layout.name, layout.world_size);
    let params = ReplayParams {
        config: Arc::new(config.clone()),
        layout: Arc::new(layout.clone()),
        deployment: DeploymentParams {
            instances: 1,
            kv_pages: KvPages::Memory(cost.kv_memory_bytes),
            kv_bytes_scale: args
                .kv_bytes_scale
                .map_or(KvBytesScale::Auto, KvBytesScale::Fixed),
            host_memory_limit_bytes: 4 << 30,
            pool_master: PoolMaster::Start,
        },
        routing: Routing::RoundRobin,
        max_num_tokens: 8192,
        cost,
        stall_timeout: Duration::from_secs(120),
        wait_timeout: Duration::from_millis(20),
        connector_name: "kvc".to_owned(),
        local_prefix_cache: false,
        drafter: None,
    };
    // The factory keeps the pool and the stored page sizes the connector was built with.
    let mut seeded: Option<(Arc<dyn Pool>, Vec<usize>)> = None;
    if !workload.is_empty() {
        let mut factory =
            |context: &InstanceContext| -> Result<Box<dyn ReplayConnector>, ReplayError> {
                let lens = context
                    .stored_page_bytes
                    .iter()
                    .map(|(_, bytes)| *bytes)
                    .collect();
                seeded = Some((Arc::clone(&context.pool), lens));
                kvc_connector(context)
            };
        run_replay(&params, &workload, &mut factory, &mut NoProgress)
            .map_err(|err| InspectError::Seed(Box::new(err)))?;
    }
    let (pool, payload_lens) = match seeded {
        Some(seeded) => seeded,
        None => (
            empty_memory_pool(config)?,
            scaled_payloads(layout, args.kv_bytes_scale.unwrap_or(1.0))?,
        ),
    };
    Ok(PoolUnderTest {
        pool,
        description,
        payload_lens,
    })
}

/// An empty embedded pool (nothing to seed).
fn empty_memory_pool(config: &Config) -> Result<Arc<dyn Pool>, InspectError> {
    let policy =
        crate::core::eviction::EvictionPolicy::mooncake_defaults(config.pool.capacity_bytes);
    let clock = Arc::new(crate::pool::ManualClock::new(0));
    crate::pool::MemoryPool::new(policy, clock)
        .map(|pool| Arc::new(pool) as Arc<dyn Pool>)
        .map_err(|err| InspectError::Seed(Box::new(ReplayError::from(err))))
}

/// `--pool mooncake`: a client of the configured master that stores nothing itself.
#[cfg(feature = "mooncake")]
fn connect_mooncake(
    args: &InspectArgs,
    config: &Config,
    layout: &Layout,
) -> Result<PoolUnderTest, InspectError> {
    use crate::pool::mooncake::{MooncakePool, MooncakeSettings};
    let settings = MooncakeSettings {
        global_segment_size_bytes: 0,
        ..MooncakeSettings::from_config(config)
    };
    let description = format!("mooncake, master {}", settings.master_address);
    let pool = MooncakePool::connect(settings).map_err(InspectError::Mooncake)?;
    Ok(PoolUnderTest {
        pool: Arc::new(pool),
        description,
        payload_lens: scaled_payloads(layout, args.kv_bytes_scale.unwrap_or(1.0))?,
    })
}

/// `--pool mooncake` in a build without the feature.
#[cfg(not(feature = "mooncake"))]
fn connect_mooncake(
    _args: &InspectArgs,
    _config: &Config,
    _layout: &Layout,
) -> Result<PoolUnderTest, InspectError> {
    Err(InspectError::MooncakeNotBuilt)
}
