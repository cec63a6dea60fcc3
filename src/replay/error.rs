//! [`ReplayError`]: why a replay could not be set up or could not finish.
//!
//! The large layer errors (configuration, layout, trace) are boxed so that the error stays
//! small on the factory's and the driver's `Result`s.

use crate::config::ConfigError;
use crate::core::hash::HashError;
use crate::core::layout::LayoutError;
use crate::gpu::GpuError;
use crate::pool::PoolError;

use super::kv_cache::KvCacheError;
use super::workload::{GenerateError, TraceError};

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The configuration could not be loaded.
    #[error(transparent)]
    Config(Box<ConfigError>),
    /// The layout could not be loaded or does not fit the world size.
    #[error(transparent)]
    Layout(Box<LayoutError>),
    /// The trace file could not be read.
    #[error(transparent)]
    Trace(Box<TraceError>),
    /// The generated workload's parameters were refused.
    #[error(transparent)]
    Generate(#[from] GenerateError),
    /// A device operation of the simulator failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The pool could not be built.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// Hashing a prompt failed.
    #[error(transparent)]
    Hash(#[from] HashError),
    /// The simulated KV cache refused an operation (a simulator bug).
    #[error("simulated kv cache: {0}")]
    KvCache(#[from] KvCacheError),
    /// A setting is out of range.
    #[error("{setting} = {value} is out of range; {working} works")]
    InvalidSetting {
        /// The flag or key.
        setting: &'static str,
        /// The refused value, as given.
        value: String,
        /// A value that would be accepted.
        working: &'static str,
    },
    /// The configured pool backend is not built into this binary.
    #[error(
        "pool.backend = {backend} needs a build with the {feature} feature (scripts/setup-mooncake, \
         then PYO3_PYTHON=.venv/bin/python cargo build --release --features {feature}); or use \
         --pool memory"
    )]
    UnsupportedPool {
        /// The configured backend.
        backend: &'static str,
        /// The cargo feature that builds it in.
        feature: &'static str,
    },
    /// `--master` names a Mooncake master, but the pool is not Mooncake.
    #[error("--master {master} needs --pool mooncake (pool.backend is {backend})")]
    MasterWithoutMooncake {
        /// The address given.
        master: String,
        /// The configured backend.
        backend: &'static str,
    },
    /// `--real-client` asks for Mooncake's one-node layout, but the pool is not Mooncake.
    #[error("--real-client needs --pool mooncake (pool.backend is {backend})")]
    RealClientWithoutMooncake {
        /// The configured backend.
        backend: &'static str,
    },
    /// Each instance's Mooncake segment would be smaller than Mooncake mounts.
    #[error(
        "a mooncake segment of {segment_bytes} bytes per instance is below the {min_segment_bytes} \
         mooncake mounts; use --pool-capacity {min_pool_capacity_bytes} or more (or a larger \
         --kv-bytes-scale)"
    )]
    MooncakeSegmentTooSmall {
        /// Stored pool capacity divided among the instances.
        segment_bytes: u64,
        /// The smallest segment Mooncake mounts.
        min_segment_bytes: u64,
        /// The smallest modeled `--pool-capacity` that gives every instance that much.
        min_pool_capacity_bytes: u64,
    },
    /// The Mooncake master or a client could not start (boxed: it carries a Python error).
    #[cfg(feature = "mooncake")]
    #[error(transparent)]
    Mooncake(Box<crate::pool::mooncake::MooncakeError>),
    /// The workload holds no request.
    #[error("the workload holds no request; raise --limit or use another workload")]
    NoRequests,
    /// A prompt needs more KV pages than an instance has, so it could never run.
    #[error(
        "request {request} ({prompt_len} tokens, the workload's largest prompt) needs \
         {pages_needed} kv pages in one group but an instance has {kv_pages}; \
         --kv-pages {pages_needed} or more fits every request"
    )]
    PromptTooLarge {
        /// Workload id of the request.
        request: u64,
        /// Its prompt length.
        prompt_len: usize,
        /// Pages it needs in its largest group.
        pages_needed: u32,
        /// Pages per group of an instance.
        kv_pages: u32,
    },
    /// One rank's KV memory holds not even one block of every group (a layout with huge
    /// blocks), so the cache would have no page at all.
    #[error(
        "one block of every layer group takes {block_bytes} bytes, more than the {memory_bytes} \
         bytes of KV memory of one rank; give --kv-pages (e.g. 64) or a --kv-memory of at \
         least {block_bytes} times the pages wanted, or use smaller tokens_per_block"
    )]
    KvMemoryBelowOneBlock {
        /// KV memory of one rank.
        memory_bytes: u64,
        /// Bytes of one block of every group at full page size.
        block_bytes: u64,
    },
    /// The replay's host memory (pages, their tables, staging) would not fit the limit.
    #[error(
        "the simulated kv pages, their tables and the connectors' staging pools need \
         {needed_bytes} bytes of host memory, above the --host-memory-limit of \
         {limit_bytes}; use --kv-bytes-scale {largest_scale} or fewer --kv-pages"
    )]
    DeviceMemoryTooLarge {
        /// Bytes the replay would allocate for its instances.
        needed_bytes: u64,
        /// The limit.
        limit_bytes: u64,
        /// The largest scale that fits.
        largest_scale: f64,
    },
    /// What the replay allocates whatever the page size (staging pools, page overhead and
    /// tables) is already above the host memory limit.
    #[error(
        "the replay needs {fixed_bytes} bytes of host memory before any page payload \
         ({staging_bytes} of them staging pools of the connectors of {ranks} ranks), above \
         the --host-memory-limit of {limit_bytes}; set smaller staging pools (e.g. --set \
         loaders.staging_bytes_per_loader={fits_mib}MiB --set saver.staging_bytes={fits_mib}MiB), \
         or fewer --kv-pages, --world or --instances, or raise --host-memory-limit",
        fits_mib = staging_fits_bytes / crate::config::MIB
    )]
    HostMemoryTooSmall {
        /// Bytes allocated whatever the page size.
        fixed_bytes: u64,
        /// The limit.
        limit_bytes: u64,
        /// Of those, the connectors' staging pools.
        staging_bytes: u64,
        /// Ranks over all instances.
        ranks: u64,
        /// A staging pool size that leaves half the limit to the rest.
        staging_fits_bytes: u64,
    },
    /// `--connector kvc` before the real connector is wired into the replay.
    #[error(
        "connector {connector} is not wired into replay yet (instance {instance}); use \
         --connector none for the baseline"
    )]
    ConnectorNotWired {
        /// The connector asked for.
        connector: &'static str,
        /// The instance being built.
        instance: usize,
    },
    /// The factory could not build an instance's connector.
    #[error("building the connector of instance {instance} failed")]
    Connector {
        /// The instance being built.
        instance: usize,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Requests wait on the connector and it made no progress for too long.
    #[error(
        "instance {instance} made no progress for {waited_s} s of real time ({waiting} \
         waiting, {loading} loading, {held} held for saves); the connector is stuck or \
         --stall-timeout-s is too short"
    )]
    Stalled {
        /// The first stuck instance.
        instance: usize,
        /// Seconds waited.
        waited_s: u64,
        /// Its requests waiting for admission.
        waiting: usize,
        /// Its requests parked on loads.
        loading: usize,
        /// Its finished requests whose pages wait for saves.
        held: usize,
    },
}

impl From<ConfigError> for ReplayError {
    fn from(err: ConfigError) -> Self {
        Self::Config(Box::new(err))
    }
}

impl From<LayoutError> for ReplayError {
    fn from(err: LayoutError) -> Self {
        Self::Layout(Box::new(err))
    }
}

impl From<TraceError> for ReplayError {
    fn from(err: TraceError) -> Self {
        Self::Trace(Box::new(err))
    }
}

impl ReplayError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config(err) => err.kind(),
            Self::Layout(err) => err.kind(),
            Self::Trace(err) => err.kind(),
            Self::Generate(err) => err.kind(),
            Self::Gpu(err) => err.kind(),
            Self::Pool(err) => err.kind(),
            Self::Hash(err) => err.kind(),
            Self::KvCache(err) => err.kind(),
            Self::InvalidSetting { .. } => "invalid_setting",
            Self::UnsupportedPool { .. } => "unsupported_pool",
            Self::MasterWithoutMooncake { .. } => "master_without_mooncake",
            Self::RealClientWithoutMooncake { .. } => "real_client_without_mooncake",
            Self::MooncakeSegmentTooSmall { .. } => "mooncake_segment_too_small",
            #[cfg(feature = "mooncake")]
            Self::Mooncake(err) => err.kind(),
            Self::NoRequests => "no_requests",
            Self::PromptTooLarge { .. } => "prompt_too_large",
            Self::KvMemoryBelowOneBlock { .. } => "kv_memory_below_one_block",
            Self::DeviceMemoryTooLarge { .. } => "device_memory_too_large",
            Self::HostMemoryTooSmall { .. } => "host_memory_too_small",
            Self::ConnectorNotWired { .. } => "connector_not_wired",
            Self::Connector { .. } => "connector",
            Self::Stalled { .. } => "stalled",
        }
    }
}
