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
use crate::replay::pool_fit::prompt_stored_bytes;
use crate::replay::setup::stored_page_bytes;
use crate::replay::workload::{read_mooncake_trace, WorkloadRequest};
use crate::replay::{
    kvc_connector, run_replay, DeploymentParams, InstanceContext, KvBytesScale, KvPages,
    PoolMaster, ProgressSink, ReplayConnector, ReplayError, ReplayParams, Routing,
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
    let Some(trace) = args.seed_trace.as_ref().or(args.trace.as_ref()) else {
        return Ok(PoolUnderTest {
            pool: empty_memory_pool(config)?,
            description: "memory, empty (no --trace or --seed-trace to seed it)".to_owned(),
            payload_lens: scaled_payloads(layout, args.kv_bytes_scale.unwrap_or(1.0))?,
        });
    };
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
        config: Arc::new(seeding_config(config, layout, &workload)),
        layout: Arc::new(layout.clone()),
        deployment: DeploymentParams {
            instances: 1,
            kv_pages: seeding_kv_pages(layout, &workload, cost.kv_memory_bytes),
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
        release_during_loads: false,
        pace: None,
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
        run_replay(&params, &workload, &mut factory, &mut SeedProgress::new())
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

/// The seeding replay's configuration: the pool holds every seeded prompt's pages (at
/// full page size; the question is where a prompt is, not what eviction left), unless the
/// configuration sets a capacity of its own.
fn seeding_config(config: &Config, layout: &Layout, workload: &[WorkloadRequest]) -> Config {
    let mut config = config.clone();
    if config.pool.capacity_bytes == Config::default().pool.capacity_bytes {
        let pages: Vec<u64> = layout
            .groups
            .iter()
            .map(|group| layout.page_bytes(group).unwrap_or(0))
            .collect();
        let rewind = config.planner.swa_endpoint_rewind_tokens;
        let all_prompts = workload
            .iter()
            .map(|request| {
                let len = u64::try_from(request.prompt.prompt_len()).unwrap_or(u64::MAX);
                prompt_stored_bytes(layout, &pages, rewind, len)
            })
            .fold(0, u64::saturating_add);
        // Eviction starts at a high watermark: leave room above it.
        config.pool.capacity_bytes = config
            .pool
            .capacity_bytes
            .max(all_prompts.saturating_mul(2));
    }
    config
}

/// KV pages per group for the seeding replay: the cost model's, or enough for the largest
/// seeded prompt when that is more (the seeding replay must not refuse a prompt).
fn seeding_kv_pages(layout: &Layout, workload: &[WorkloadRequest], kv_memory: u64) -> KvPages {
    let t = usize::try_from(layout.tokens_per_block)
        .unwrap_or(usize::MAX)
        .max(1);
    let largest_blocks = workload
        .iter()
        .map(|request| request.prompt.prompt_len().div_ceil(t))
        .max()
        .unwrap_or(0);
    let per_block: u64 = layout
        .groups
        .iter()
        .map(|group| layout.page_bytes(group).unwrap_or(0))
        .sum();
    let from_memory = kv_memory / per_block.max(1);
    let needed = u64::try_from(largest_blocks)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    match u32::try_from(from_memory.max(needed)) {
        Ok(pages) => KvPages::Fixed(pages),
        Err(_) => KvPages::Memory(kv_memory),
    }
}

/// A progress bar on stderr while the seeding replay runs (hidden when stderr is not a
/// terminal); a long trace prefix takes minutes.
struct SeedProgress {
    bar: indicatif::ProgressBar,
}

impl SeedProgress {
    fn new() -> Self {
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "seeding the pool {bar:40} {pos}/{len} requests",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Self { bar }
    }
}

impl ProgressSink for SeedProgress {
    fn start(&mut self, total: u64) {
        self.bar.set_length(total);
    }

    fn advance(&mut self, completed: u64, _sim_seconds: f64) {
        self.bar.set_position(completed);
    }

    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
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
