//! Sizing a replay deployment: KV pages per instance, stored page sizes under
//! `--kv-bytes-scale`, the host-memory check, and the shared pool.
//!
//! Workflow ([`Deployment::build`]):
//! 1. pages per group: `--kv-pages`, or the KV memory of one rank (the cost model's
//!    `kv_memory_bytes`, or `--kv-memory`) divided by the full bytes of one page of every
//!    group (every group gets the same count: a conservative split for window groups);
//! 2. the scale: the one given, or the largest power of two `<= 1` whose stored pages fit
//!    the host memory limit ([`KvBytesScale::Auto`]);
//! 3. stored page bytes: `F x` the layout's page bytes, rounded to a multiple of 64 and at
//!    least 64 (exactly the layout's bytes at `F = 1`);
//! 4. the pool. `pool.capacity_bytes` is the modeled (full page size) capacity; the pool
//!    holds `F x` it, so that it keeps as many pages as the modeled deployment would.
//!    - `memory`: the embedded memory pool with the configured eviction ratios and lease,
//!      on a manual clock the driver keeps at simulated time, shared by every instance;
//!    - `mooncake` (cargo feature `mooncake`): a Mooncake Store with one client per
//!      instance, each contributing `1/instances` of the stored capacity as its segment,
//!      against a master the replay starts or one already running ([`PoolMaster`]; see
//!      `replay::mooncake`). Its leases run on real time: the manual clock does not apply.
//!
//!    Each instance's connector sees its pool through the deployment's publish witness
//!    ([`super::witness`]), which checks every object handed to the pool.
//!
//! Invariants:
//! - `setup::S1`. Stored page bytes are `>= 64` and a multiple of 64 whenever `F < 1`.
//! - `setup::S2`. Everything the replay allocates for its instances fits the host memory
//!   limit, checked before anything is allocated: every rank's device pages (payload and
//!   per-page overhead) and connector staging pools, and every instance's page tables; or
//!   setup fails naming a scale, or a staging size, that fits. The embedded pool is bounded
//!   by its own stored capacity (`pool.capacity_bytes x F`), allocated as it stores.
//! - `setup::S3`. Every instance has a pool (`Deployment::pools[instance]`); [`Deployment::close`]
//!   closes what the replay started, after the connectors have stopped.

use std::sync::Arc;

use crate::config::{Config, PoolBackend, MIB, MOONCAKE_MIN_SEGMENT_BYTES};
use crate::core::eviction::EvictionPolicy;
use crate::core::layout::{GroupId, Layout};
use crate::gpu::{Device, DeviceRequest, PagePoolSpec};
use crate::pool::{ManualClock, MemoryPool, Pool};

use super::error::ReplayError;
use super::witness::PublishWitness;

/// Smallest automatic scale: `2^-20`.
const MIN_AUTO_SCALE_LOG2: i32 = 20;

/// Host bytes a simulated device page takes beyond its payload: its lock and the heap
/// block of its bytes (`gpu`'s host device keeps one per page), rounded up.
pub const DEVICE_PAGE_OVERHEAD_BYTES: u64 = 64;

/// Host bytes one page of one group of one instance costs in tables, whatever its size:
/// the engine's KV cache (free list, holders, chain hash, eviction clock) and the
/// connector's reservation ledger, rounded up.
pub const PAGE_BOOKKEEPING_BYTES: u64 = 96;

/// How many KV pages each group of an instance gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPages {
    /// Exactly this many pages per group.
    Fixed(u32),
    /// As many as this many bytes per rank hold at full page size.
    Memory(u64),
}

/// The `--kv-bytes-scale` choice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvBytesScale {
    /// The largest power of two `<= 1` that fits the host memory limit.
    Auto,
    /// This scale, in `(0, 1]`.
    Fixed(f64),
}

/// Where a Mooncake pool's master comes from (`pool.backend = "mooncake"`; ignored by the
/// memory pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMaster {
    /// The replay starts a `mooncake_master` on free loopback ports and stops it at the end.
    Start,
    /// A running master at `mooncake.master_address` (`--master HOST:PORT`).
    Configured,
    /// As `Start`, plus a node-local `mooncake_client` holding the pool's capacity, with
    /// every instance a dummy client of it (`--real-client`: Mooncake's one-node layout).
    StartWithRealClient,
}

/// What a deployment is sized from.
#[derive(Clone, Debug)]
pub struct DeploymentParams {
    /// Context instances.
    pub instances: usize,
    /// Pages per group.
    pub kv_pages: KvPages,
    /// Stored page size scale.
    pub kv_bytes_scale: KvBytesScale,
    /// Most bytes the replay may allocate for its instances (`setup::S2`).
    pub host_memory_limit_bytes: u64,
    /// The Mooncake master to use with `pool.backend = "mooncake"`.
    pub pool_master: PoolMaster,
}

/// The sized deployment.
pub struct Deployment {
    /// Pages per group per instance.
    pub kv_pages: u32,
    /// The scale in force.
    pub kv_bytes_scale: f64,
    /// Stored bytes of one page per group, layout order.
    pub stored_page_bytes: Vec<(GroupId, usize)>,
    /// Bytes all devices allocate.
    pub device_bytes: u64,
    /// The pool each instance's connector uses, index = instance (`setup::S3`): the one memory
    /// pool, or that instance's Mooncake client.
    pub pools: Vec<Arc<dyn Pool>>,
    /// `"memory"` or `"mooncake"`.
    pub pool_backend: &'static str,
    /// The memory pool's lease clock (simulated ms); Mooncake's leases run on real time.
    pub pool_clock: Arc<ManualClock>,
    /// The pool's capacity in stored bytes (for Mooncake, all segments together).
    pub pool_stored_capacity_bytes: u64,
    /// Checks what every connector publishes: each of `pools` goes through it.
    pub witness: Arc<PublishWitness>,
    /// The Mooncake master and clients, closed by [`Deployment::close`].
    #[cfg(feature = "mooncake")]
    mooncake: Option<super::mooncake::MooncakeDeployment>,
}

/// Stored bytes of a page of `full` bytes at `scale` (`setup::S1`).
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "page sizes are far below 2^52 and the scale is in (0, 1]"
)]
pub fn stored_page_bytes(full: u64, scale: f64) -> u64 {
    if scale >= 1.0 {
        return full;
    }
    let blocks = (full as f64 * scale / 64.0).round() as u64;
    blocks.max(1) * 64
}

impl Deployment {
    /// Sizes the deployment and builds the pool (module workflow).
    ///
    /// # Errors
    ///
    /// [`ReplayError::InvalidSetting`] for a scale outside `(0, 1]` or zero pages,
    /// [`ReplayError::DeviceMemoryTooLarge`] (`setup::S2`), [`ReplayError::UnsupportedPool`] for
    /// Mooncake in a build without the feature, [`ReplayError::MooncakeSegmentTooSmall`],
    /// `ReplayError::Mooncake` when its master or clients do not start, or the layout's
    /// and pool's errors.
    #[cfg(feature = "internals")]
    pub fn build(
        layout: &Layout,
        config: &Config,
        params: &DeploymentParams,
        with_connector: bool,
    ) -> Result<Self, ReplayError> {
        Self::build_until(layout, config, params, with_connector, &mut || false)
    }

    /// [`build`](Self::build), abandoned when `stopped()` says so while a pool client
    /// starts (a Mooncake master that does not answer).
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), and `ReplayError::Mooncake` with an interrupted start.
    pub fn build_until(
        layout: &Layout,
        config: &Config,
        params: &DeploymentParams,
        with_connector: bool,
        stopped: &mut dyn FnMut() -> bool,
    ) -> Result<Self, ReplayError> {
        let full: Vec<(GroupId, u64)> = layout
            .groups
            .iter()
            .map(|group| Ok((group.id, layout.page_bytes(group)?)))
            .collect::<Result<_, ReplayError>>()?;
        let kv_pages = kv_pages(&full, params.kv_pages)?;
        let memory = HostMemoryUse {
            instances: u64::try_from(params.instances).unwrap_or(u64::MAX),
            world: u64::from(layout.world_size),
            pages: u64::from(kv_pages),
            groups: u64::try_from(full.len()).unwrap_or(u64::MAX),
            staging: if with_connector {
                StagingUse::of(config)?
            } else {
                StagingUse::default()
            },
        };
        if memory.fixed() > params.host_memory_limit_bytes {
            return Err(memory.too_small(params.host_memory_limit_bytes));
        }
        let needed = |scale: f64| -> u64 {
            let payload_per_rank: u64 = full
                .iter()
                .map(|&(_, bytes)| u64::from(kv_pages) * stored_page_bytes(bytes, scale))
                .sum();
            memory.with_payload(payload_per_rank)
        };
        let fits = |scale: f64| needed(scale) <= params.host_memory_limit_bytes;
        let largest_fitting = (0..=MIN_AUTO_SCALE_LOG2)
            .map(|log2| 0.5_f64.powi(log2))
            .find(|&scale| fits(scale));
        let smallest = 0.5_f64.powi(MIN_AUTO_SCALE_LOG2);
        let scale = match params.kv_bytes_scale {
            KvBytesScale::Fixed(scale) if !(scale > 0.0 && scale <= 1.0) => {
                return Err(ReplayError::InvalidSetting {
                    setting: "--kv-bytes-scale",
                    value: scale.to_string(),
                    working: "0.25",
                });
            }
            KvBytesScale::Fixed(scale) => scale,
            KvBytesScale::Auto => largest_fitting.unwrap_or(smallest),
        };
        if !fits(scale) {
            return Err(ReplayError::DeviceMemoryTooLarge {
                needed_bytes: needed(scale),
                limit_bytes: params.host_memory_limit_bytes,
                largest_scale: largest_fitting.unwrap_or(smallest),
            });
        }
        let stored = full
            .iter()
            .map(|&(group, bytes)| {
                let stored = stored_page_bytes(bytes, scale);
                (group, usize::try_from(stored).unwrap_or(usize::MAX))
            })
            .collect();
        let mut deployment = Self {
            kv_pages,
            kv_bytes_scale: scale,
            stored_page_bytes: stored,
            device_bytes: needed(scale),
            pools: Vec::new(),
            pool_backend: "memory",
            pool_clock: Arc::new(ManualClock::new(0)),
            pool_stored_capacity_bytes: scaled_capacity(config.pool.capacity_bytes, scale),
            witness: PublishWitness::new(),
            #[cfg(feature = "mooncake")]
            mooncake: None,
        };
        match config.pool.backend {
            PoolBackend::Memory => deployment.build_memory_pool(config, params.instances)?,
            PoolBackend::Mooncake => {
                deployment.build_mooncake_pool(config, params, layout.world_size, stopped)?;
            }
        }
        Ok(deployment)
    }

    /// The embedded pool on the simulated clock, shared by every instance (workflow 4).
    fn build_memory_pool(&mut self, config: &Config, instances: usize) -> Result<(), ReplayError> {
        let policy = EvictionPolicy {
            capacity_bytes: self.pool_stored_capacity_bytes,
            high_watermark_ratio: config.pool.eviction_high_watermark_ratio,
            eviction_ratio: config.pool.eviction_ratio,
            lease_ttl_ms: config.pool.kv_lease_ttl_ms,
        };
        let pool = Arc::new(MemoryPool::new(policy, self.pool_clock.clone())?);
        self.pools = vec![self.witness.wrap(pool); instances];
        Ok(())
    }

    /// A Mooncake client per instance, against the master `params` names (workflow 4).
    fn build_mooncake_pool(
        &mut self,
        config: &Config,
        params: &DeploymentParams,
        ranks: u32,
        stopped: &mut dyn FnMut() -> bool,
    ) -> Result<(), ReplayError> {
        let segment_bytes = self.mooncake_segment_bytes(params.instances)?;
        #[cfg(feature = "mooncake")]
        {
            let mooncake = super::mooncake::MooncakeDeployment::start(
                config,
                super::mooncake::Clients {
                    segment_bytes,
                    instances: params.instances,
                    ranks,
                },
                params.pool_master,
                stopped,
            )?;
            self.pools = mooncake
                .pools()
                .into_iter()
                .map(|pool| self.witness.wrap(pool))
                .collect();
            self.pool_backend = "mooncake";
            self.pool_stored_capacity_bytes = mooncake.capacity_bytes();
            self.mooncake = Some(mooncake);
            Ok(())
        }
        #[cfg(not(feature = "mooncake"))]
        {
            let _ = (config, segment_bytes, params.pool_master, ranks, stopped);
            Err(ReplayError::UnsupportedPool {
                backend: "mooncake",
                feature: "mooncake",
            })
        }
    }

    /// Each instance's segment: an equal share of the stored capacity, rounded up, and at
    /// least what Mooncake mounts.
    fn mooncake_segment_bytes(&self, instances: usize) -> Result<u64, ReplayError> {
        let instances = u64::try_from(instances.max(1)).unwrap_or(u64::MAX);
        let segment_bytes = self.pool_stored_capacity_bytes.div_ceil(instances);
        if segment_bytes >= MOONCAKE_MIN_SEGMENT_BYTES {
            return Ok(segment_bytes);
        }
        let min_stored = MOONCAKE_MIN_SEGMENT_BYTES.saturating_mul(instances);
        Err(ReplayError::MooncakeSegmentTooSmall {
            segment_bytes,
            min_segment_bytes: MOONCAKE_MIN_SEGMENT_BYTES,
            min_pool_capacity_bytes: modeled_capacity(min_stored, self.kv_bytes_scale)
                .next_multiple_of(MIB),
        })
    }

    /// Closes what the replay started for its pool (`setup::S3`): Mooncake's clients, then its
    /// master. Call it after every connector has stopped; the memory pool needs nothing.
    /// `reachable`: whether the connectors last saw the pool reachable; if not, the clients'
    /// close is not waited for (it cannot reach the master either).
    #[cfg_attr(
        not(feature = "mooncake"),
        expect(unused_variables, reason = "only Mooncake clients are closed")
    )]
    pub fn close(self, reachable: bool) {
        #[cfg(feature = "mooncake")]
        if let Some(mooncake) = self.mooncake {
            mooncake.close(reachable);
        }
    }

    /// Opens the devices of one instance: one host device per rank, one page pool per
    /// group of `kv_pages` stored pages.
    ///
    /// # Errors
    ///
    /// The device's errors (an empty or oversized pool).
    pub fn open_devices(
        &self,
        world_size: u32,
        request: DeviceRequest,
    ) -> Result<Vec<Device>, ReplayError> {
        let specs: Vec<PagePoolSpec> = self
            .stored_page_bytes
            .iter()
            .map(|&(group, page_bytes)| PagePoolSpec {
                group,
                page_bytes,
                num_pages: self.kv_pages,
            })
            .collect();
        (0..world_size)
            .map(|_| Device::open(request, &specs).map_err(ReplayError::from))
            .collect()
    }
}

/// What a replay allocates on the host besides the pool (`setup::S2`): per instance, every
/// rank's device pages (payload and [`DEVICE_PAGE_OVERHEAD_BYTES`]) and staging pools,
/// and the page tables ([`PAGE_BOOKKEEPING_BYTES`]).
#[derive(Clone, Copy, Debug)]
struct HostMemoryUse {
    instances: u64,
    world: u64,
    /// Pages per group.
    pages: u64,
    groups: u64,
    /// The connector's staging pools on one rank (none without a connector).
    staging: StagingUse,
}

/// The staging pools of one rank's connector: its loaders' and its saver's.
#[derive(Clone, Copy, Debug, Default)]
struct StagingUse {
    pools: u64,
    bytes: u64,
}

impl StagingUse {
    /// What the connector `config` configures allocates on each rank.
    fn of(config: &Config) -> Result<Self, ReplayError> {
        let runtime = config.validate()?;
        let loaders = &runtime.loaders;
        let threads = u64::try_from(loaders.load_threads.get()).unwrap_or(u64::MAX);
        Ok(Self {
            pools: threads.saturating_add(1),
            bytes: threads
                .saturating_mul(loaders.staging_bytes_per_loader.get())
                .saturating_add(runtime.saver.staging_bytes.get()),
        })
    }
}

impl HostMemoryUse {
    /// Bytes that do not depend on the page size: staging, page overhead and tables.
    fn fixed(&self) -> u64 {
        let pages = self.pages.saturating_mul(self.groups);
        let per_instance = self
            .world
            .saturating_mul(
                self.staging
                    .bytes
                    .saturating_add(pages.saturating_mul(DEVICE_PAGE_OVERHEAD_BYTES)),
            )
            .saturating_add(pages.saturating_mul(PAGE_BOOKKEEPING_BYTES));
        per_instance.saturating_mul(self.instances)
    }

    /// Everything, with `payload_per_rank` bytes of page payload on each rank.
    fn with_payload(&self, payload_per_rank: u64) -> u64 {
        let payload = payload_per_rank
            .saturating_mul(self.world)
            .saturating_mul(self.instances);
        self.fixed().saturating_add(payload)
    }

    /// The refusal when the fixed part alone passes `limit_bytes`.
    fn too_small(&self, limit_bytes: u64) -> ReplayError {
        let ranks = self.world.saturating_mul(self.instances);
        let staging_bytes = self.staging.bytes.saturating_mul(ranks);
        // A size for every staging pool that leaves half the limit to the rest.
        let pools = ranks.saturating_mul(self.staging.pools).max(1);
        ReplayError::HostMemoryTooSmall {
            fixed_bytes: self.fixed(),
            limit_bytes,
            staging_bytes,
            ranks,
            staging_fits_bytes: (limit_bytes / 2 / pools / MIB).max(1) * MIB,
        }
    }
}

/// Pages per group (workflow 1).
fn kv_pages(full: &[(GroupId, u64)], kv_pages: KvPages) -> Result<u32, ReplayError> {
    let pages = match kv_pages {
        KvPages::Fixed(pages) => pages,
        KvPages::Memory(bytes) => {
            let per_block: u64 = full.iter().map(|&(_, bytes)| bytes).sum();
            if bytes < per_block {
                return Err(ReplayError::KvMemoryBelowOneBlock {
                    memory_bytes: bytes,
                    block_bytes: per_block,
                });
            }
            u32::try_from(bytes / per_block.max(1)).unwrap_or(u32::MAX)
        }
    };
    let max = u32::try_from(i32::MAX).unwrap_or(u32::MAX);
    if pages == 0 || pages > max {
        return Err(ReplayError::InvalidSetting {
            setting: "--kv-pages",
            value: pages.to_string(),
            working: "16384",
        });
    }
    Ok(pages)
}

/// The pool's stored capacity for a modeled capacity (workflow 4), at least 1 byte.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "capacities are far below 2^52 and the scale is in (0, 1]"
)]
fn scaled_capacity(capacity_bytes: u64, scale: f64) -> u64 {
    if scale >= 1.0 {
        return capacity_bytes;
    }
    ((capacity_bytes as f64 * scale).ceil() as u64).max(1)
}

/// The modeled capacity whose stored capacity at `scale` is at least `stored_bytes`.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "capacities are far below 2^52 and the scale is in (0, 1]"
)]
fn modeled_capacity(stored_bytes: u64, scale: f64) -> u64 {
    if scale >= 1.0 {
        return stored_bytes;
    }
    (stored_bytes as f64 / scale).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kv_pages: KvPages, scale: KvBytesScale, limit: u64) -> DeploymentParams {
        DeploymentParams {
            instances: 2,
            kv_pages,
            kv_bytes_scale: scale,
            host_memory_limit_bytes: limit,
            pool_master: PoolMaster::Start,
        }
    }

    #[test]
    fn stored_pages_are_multiples_of_64_and_at_least_64_s1() {
        assert_eq!(stored_page_bytes(4096, 1.0), 4096);
        assert_eq!(stored_page_bytes(100, 1.0), 100);
        assert_eq!(stored_page_bytes(4096, 0.5), 2048);
        assert_eq!(stored_page_bytes(4096, 0.001), 64);
        assert_eq!(stored_page_bytes(4_194_304, 0.01), 41_920);
        assert_eq!(stored_page_bytes(4_194_304, 0.01) % 64, 0);
    }

    #[test]
    fn auto_scale_picks_the_largest_power_of_two_that_fits_s2() -> Result<(), ReplayError> {
        let layout = Layout::preset("llama-3.1-8b")?;
        let config = Config::default();
        // 1000 pages of 4 MiB x 2 instances = 8000 MiB; 1 GiB fits at 1/8.
        let deployment = Deployment::build(
            &layout,
            &config,
            &params(KvPages::Fixed(1000), KvBytesScale::Auto, 1 << 30),
            false,
        )?;
        assert!((deployment.kv_bytes_scale - 0.125).abs() < f64::EPSILON);
        assert_eq!(deployment.stored_page_bytes, vec![(GroupId(0), 512 << 10)]);
        assert!(deployment.device_bytes <= 1 << 30);
        assert_eq!(
            deployment.pool_stored_capacity_bytes,
            config.pool.capacity_bytes / 8
        );
        Ok(())
    }

    #[test]
    fn a_fixed_scale_that_does_not_fit_names_one_that_does_s2() -> Result<(), ReplayError> {
        let layout = Layout::preset("llama-3.1-8b")?;
        let result = Deployment::build(
            &layout,
            &Config::default(),
            &params(KvPages::Fixed(1000), KvBytesScale::Fixed(1.0), 1 << 30),
            false,
        );
        match result {
            Err(ReplayError::DeviceMemoryTooLarge { largest_scale, .. }) => {
                assert!((largest_scale - 0.125).abs() < f64::EPSILON);
            }
            other => panic!("expected DeviceMemoryTooLarge, got {:?}", other.err()),
        }
        for bad in [0.0, -1.0, 1.5, f64::NAN] {
            let result = Deployment::build(
                &layout,
                &Config::default(),
                &params(KvPages::Fixed(10), KvBytesScale::Fixed(bad), 1 << 30),
                false,
            );
            assert!(
                matches!(result, Err(ReplayError::InvalidSetting { .. })),
                "{bad}"
            );
        }
        Ok(())
    }

    #[test]
    fn pages_follow_from_memory_over_every_group() -> Result<(), ReplayError> {
        let layout = Layout::preset("tiny-hybrid")?;
        // Two groups of 4 KiB pages: 8 KiB per block.
        let deployment = Deployment::build(
            &layout,
            &Config::default(),
            &params(KvPages::Memory(8 << 20), KvBytesScale::Auto, 1 << 30),
            false,
        )?;
        assert_eq!(deployment.kv_pages, 1024);
        assert!((deployment.kv_bytes_scale - 1.0).abs() < f64::EPSILON);
        let devices = deployment.open_devices(2, DeviceRequest::Host)?;
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[1].page_pool(GroupId(1))?.num_pages, 1024);
        Ok(())
    }

    #[test]
    fn the_memory_pool_is_shared_by_every_instance_s3() -> Result<(), ReplayError> {
        let layout = Layout::preset("tiny-full")?;
        let deployment = Deployment::build(
            &layout,
            &Config::default(),
            &params(KvPages::Fixed(16), KvBytesScale::Fixed(1.0), 1 << 30),
            false,
        )?;
        assert_eq!(deployment.pools.len(), 2);
        assert!(Arc::ptr_eq(&deployment.pools[0], &deployment.pools[1]));
        assert_eq!(deployment.pool_backend, "memory");
        deployment.close(true);
        Ok(())
    }

    #[test]
    fn mooncake_segments_split_the_stored_capacity_or_name_one_that_mounts(
    ) -> Result<(), ReplayError> {
        let layout = Layout::preset("tiny-full")?;
        let mut config = Config::default();
        config.pool.capacity_bytes = 8 << 30;
        let scaled = params(
            KvPages::Fixed(16),
            KvBytesScale::Fixed(1.0 / 256.0),
            1 << 30,
        );
        let deployment = Deployment::build(&layout, &config, &scaled, false)?;
        // 8 GiB at 1/256 stores 32 MiB: two segments of 16 MiB mount, three of 11 do not.
        assert_eq!(deployment.mooncake_segment_bytes(2)?, 16 << 20);
        let Err(err) = deployment.mooncake_segment_bytes(3) else {
            panic!("three segments of 11 MiB are below what mooncake mounts");
        };
        let ReplayError::MooncakeSegmentTooSmall {
            min_pool_capacity_bytes,
            ..
        } = err
        else {
            panic!("expected mooncake_segment_too_small, got {err:?}");
        };
        assert_eq!(min_pool_capacity_bytes, 12 << 30, "3 x 16 MiB x 256");
        assert!(
            err.to_string().contains("--pool-capacity 12884901888"),
            "{err}"
        );
        config.pool.capacity_bytes = min_pool_capacity_bytes;
        let deployment = Deployment::build(&layout, &config, &scaled, false)?;
        assert!(deployment.mooncake_segment_bytes(3)? >= MOONCAKE_MIN_SEGMENT_BYTES);
        Ok(())
    }

    #[cfg(not(feature = "mooncake"))]
    #[test]
    fn mooncake_without_the_feature_names_the_feature() -> Result<(), ReplayError> {
        let layout = Layout::preset("tiny-full")?;
        let mut config = Config::default();
        config.pool.backend = PoolBackend::Mooncake;
        let result = Deployment::build(
            &layout,
            &config,
            &params(KvPages::Fixed(16), KvBytesScale::Fixed(1.0), 1 << 30),
            false,
        );
        let Err(err) = result else {
            panic!("a build without the feature has no mooncake pool");
        };
        assert_eq!(err.kind(), "unsupported_pool");
        assert!(err.to_string().contains("--features mooncake"), "{err}");
        Ok(())
    }
}
