//! Starting the actor system of one connector (one serving instance) on its own thread.
//!
//! Every loader's and every saver's staging pool is registered with the pool as soon as it
//! is made ([`Pool::register_staging`]), so a backend with registered-memory transfers
//! (Mooncake) moves pages without an extra copy. [`StagingRegistrations`] remembers them
//! and unregisters them, all at once, when the connector stops (after its actor thread has
//! ended) or when start fails, so the memory can be freed and reused.

use std::num::NonZeroU64;
use std::sync::Arc;

use actix::prelude::*;

use crate::actors::loader::Loader;
use crate::actors::lookup_planner::{LookupPlanner, PlannerCapacity};
use crate::actors::reservation_manager::{AttachLoaders, ReservationManager};
use crate::actors::saver_queue::{SaverParams, SaverQueue};
use crate::actors::stats_reporter::StatsReporter;
use crate::actors::supervisor::{StagingSupervisor, Supervisee};
use crate::connector::share::{RankShare, ShareError};
use crate::config::{bytes_text, Config, RuntimeConfig, MIB};
use crate::core::hash::BlockHash;
use crate::core::keys::KeySpace;
use crate::core::layout::{GroupId, Layout};
use crate::core::ledger::Ledger;
use crate::core::object::HEADER_BYTES;
use crate::gpu::host_memory::host_memory;
use crate::gpu::{Device, GpuError, StagingPool};
use crate::messages::EngineInbox;
use crate::pool::{ActorFaults, GuardSettings, GuardedPool, HealthView, Pool, PoolError};
use crate::transfer::lookup::PlannerSettings;
use crate::transfer::NoSpaceRetry;

/// What a connector is started with.
pub struct ConnectorParams {
    /// The effective configuration.
    pub config: Config,
    /// The KV layout (its world size gives the number of ranks).
    pub layout: Layout,
    /// The shared pool.
    pub pool: Arc<dyn Pool>,
    /// One device per rank of `share`, with a page pool per group; none for a lookup-only
    /// connector (it looks up and offers, and never loads or saves).
    pub devices: Vec<Device>,
    /// The part of the deployment this connector serves (all of it by default).
    pub share: RankShare,
    /// Scope seed of every chain (R1).
    pub seed: BlockHash,
    /// Model key for pool keys (the fingerprint is appended, R4).
    pub model_key: String,
}

/// Addresses of the started actors.
pub(super) struct Started {
    pub planner: Addr<LookupPlanner>,
    pub manager: Addr<ReservationManager>,
    pub savers: Vec<Addr<SaverQueue>>,
    pub reporter: Addr<StatsReporter>,
    pub keys: Arc<KeySpace>,
    pub system: System,
    pub staging: StagingRegistrations,
}

/// Which staging pool a registration is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StagingRole {
    /// A loader's staging pool.
    Loader,
    /// The saver's staging pool.
    Saver,
}

impl StagingRole {
    /// The role as a label for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loader => "loader",
            Self::Saver => "saver",
        }
    }

    /// The configuration key that sizes a staging pool of this role.
    pub fn config_key(self) -> &'static str {
        match self {
            Self::Loader => "loaders.staging_bytes_per_loader",
            Self::Saver => "saver.staging_bytes",
        }
    }
}

/// The staging pools one connector registered with its pool; unregistered by
/// [`release`](Self::release) or on drop.
pub(super) struct StagingRegistrations {
    pool: Arc<dyn Pool>,
    /// Start address of every registered staging pool.
    starts: Vec<usize>,
}

impl StagingRegistrations {
    fn new(pool: Arc<dyn Pool>) -> Self {
        Self {
            pool,
            starts: Vec::new(),
        }
    }

    /// Registers `staging` of `rank` with the pool and remembers it.
    fn register(
        &mut self,
        staging: &StagingPool,
        rank: u32,
        role: StagingRole,
    ) -> Result<(), StartError> {
        self.pool
            .register_staging(staging.bytes())
            .map_err(|source| StartError::RegisterStaging {
                rank,
                role,
                bytes: staging.len(),
                source,
            })?;
        self.starts.push(staging.as_ptr().addr());
        Ok(())
    }

    /// Unregisters every staging pool (idempotent), all at once: against a pool whose calls
    /// may block (an unregister waits about 3 s on a frozen Mooncake master) the stop then
    /// waits for one pool call, not one per staging pool (the shutdown bound of
    /// `docs/RELIABILITY.md`). Called once the pools' owners have stopped, so no transfer
    /// uses the memory any more. A refusal is logged, since nothing is left to retry it: at
    /// DEBUG while the pool is unreachable (the outage was logged once already, R30; the
    /// backend drops the registrations when its client closes), else at WARN.
    pub(super) fn release(&mut self) {
        let starts = std::mem::take(&mut self.starts);
        let pool = self.pool.as_ref();
        if starts.len() < 2 || !pool.calls_may_block() {
            for start in starts {
                unregister_staging(pool, start);
            }
            return;
        }
        std::thread::scope(|scope| {
            for start in starts {
                let spawned = std::thread::Builder::new()
                    .name("kvc-unregister".into())
                    .spawn_scoped(scope, move || unregister_staging(pool, start));
                if spawned.is_err() {
                    // No thread to spare: this one waits in place.
                    unregister_staging(pool, start);
                }
            }
        });
    }
}

/// Unregisters the staging pool at `start` from `pool`, logging a refusal
/// ([`StagingRegistrations::release`]).
fn unregister_staging(pool: &dyn Pool, start: usize) {
    match pool.unregister_staging(start) {
        Ok(()) => {}
        Err(err @ PoolError::Unreachable { .. }) => tracing::debug!(
            pool = pool.name(),
            addr = start,
            error = %err,
            "staging pool left registered: the pool is unreachable"
        ),
        Err(err) => tracing::warn!(
            pool = pool.name(),
            addr = start,
            error = %err,
            kind = err.kind(),
            "could not unregister a staging pool"
        ),
    }
}

impl Drop for StagingRegistrations {
    fn drop(&mut self) {
        self.release();
    }
}

/// Why a connector could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The devices or the layout do not fit the connector's share of the deployment.
    #[error(transparent)]
    Share(#[from] ShareError),
    /// The layout is refused for this deployment (R7).
    #[error(transparent)]
    Layout(#[from] crate::core::layout::LayoutError),
    /// A key segment is invalid.
    #[error(transparent)]
    Keys(#[from] crate::core::keys::KeyError),
    /// A device resource could not be made.
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
    /// The ledger could not be built.
    #[error(transparent)]
    Ledger(#[from] crate::core::ledger::LedgerError),
    /// The pool refused to register a staging pool.
    #[error(
        "the pool refused to register the {} staging pool of rank {rank} ({bytes} bytes)",
        role.as_str()
    )]
    RegisterStaging {
        /// The rank whose staging pool it is.
        rank: u32,
        /// A loader's or the saver's.
        role: StagingRole,
        /// Its size.
        bytes: usize,
        /// The pool's answer.
        #[source]
        source: PoolError,
    },
    /// The pool, which moves data only through memory of its own, could not lend it for a
    /// staging pool (Mooncake's dummy client: its shared memory is spent).
    #[error("the pool could not lend memory for the {} staging pool of rank {rank} ({bytes} bytes): {source}", role.as_str())]
    LendStaging {
        /// The rank whose staging pool it is.
        rank: u32,
        /// A loader's or the saver's.
        role: StagingRole,
        /// Its configured size.
        bytes: u64,
        /// The pool's answer.
        #[source]
        source: PoolError,
    },
    /// A staging pool holds more slots than a staging pool can address.
    #[error(
        "the {} staging pool of rank {rank} ({bytes} bytes) holds more than 2^32 slots of \
         {slot_bytes} bytes; give it fewer bytes",
        role.as_str()
    )]
    StagingSlots {
        /// The rank whose staging pool it is.
        rank: u32,
        /// A loader's or the saver's.
        role: StagingRole,
        /// Its configured size.
        bytes: u64,
        /// Bytes of one slot.
        slot_bytes: usize,
    },
    /// The host refused the memory of a staging pool.
    #[error(
        "cannot allocate the {} staging pool of rank {rank}: {} = {} is more than this host \
         gives; set it lower, e.g. {}={}MiB",
        role.as_str(), role.config_key(), bytes_text(*bytes), role.config_key(), fits_bytes / MIB
    )]
    StagingAlloc {
        /// The rank whose staging pool it is.
        rank: u32,
        /// A loader's or the saver's.
        role: StagingRole,
        /// Its configured size.
        bytes: u64,
        /// A size that fits the host's available memory now (whole MiB).
        fits_bytes: u64,
    },
    /// The checkpoint interval does not fall on block boundaries of a layout with window
    /// groups (R28).
    #[error(
        "saver.window_checkpoint_tokens = {tokens} is not a multiple of the layout's {tokens_per_block} tokens per block; use {} (or 0 to turn window checkpoints off)",
        (tokens / tokens_per_block).max(1) * tokens_per_block
    )]
    CheckpointTokens {
        /// The configured interval.
        tokens: usize,
        /// `T` of the layout.
        tokens_per_block: usize,
    },
    /// The configuration is refused (`Config::validate`).
    #[error(transparent)]
    Config(Box<crate::config::ConfigError>),
    /// The actor thread did not come up.
    #[error("the actor system thread did not start")]
    Thread,
}

impl From<crate::config::ConfigError> for StartError {
    fn from(error: crate::config::ConfigError) -> Self {
        Self::Config(Box::new(error))
    }
}

/// Per group in layout order: the bytes of its pages, and the pages the ledger may lend.
type PagePools = (Vec<usize>, Vec<(GroupId, usize)>);

/// The [`PagePools`] of the first device's page pools or, for a lookup-only connector, the
/// layout's page bytes and one page (its ledger never lends one: it has no loaders).
fn page_pools(layout: &Layout, device: Option<&Device>) -> Result<PagePools, StartError> {
    let mut lens = Vec::with_capacity(layout.groups.len());
    let mut budgets = Vec::with_capacity(layout.groups.len());
    for group in &layout.groups {
        let (bytes, pages) = match device {
            Some(device) => {
                let spec = device.page_pool(group.id)?;
                (spec.page_bytes, spec.num_pages as usize)
            }
            None => (usize::try_from(layout.page_bytes(group)?).unwrap_or(usize::MAX), 1),
        };
        lens.push(bytes);
        budgets.push((group.id, pages));
    }
    Ok((lens, budgets))
}

/// Starts the actors on a new thread and returns their addresses once they run;
/// `runtime` is `params.config` validated.
pub(super) fn start_actors(
    params: ConnectorParams,
    runtime: RuntimeConfig,
    inbox: EngineInbox,
) -> Result<(Started, std::thread::JoinHandle<()>), StartError> {
    params
        .layout
        .register(runtime.reservations.prefix_aware_scheduling)?;
    check_checkpoint_interval(&params.layout, &runtime)?;
    params.share.check(&params.layout, params.devices.len())?;
    let (payload_lens, budgets) = page_pools(&params.layout, params.devices.first())?;
    let ledger = Ledger::new(u64::from(params.layout.tokens_per_block), budgets)?;
    let keys = Arc::new(KeySpace::named_by(
        &params.layout,
        &params.share.fingerprints(&params.layout),
        &params.config.keys.namespace,
        &params.model_key,
        &payload_lens,
    )?);
    // Every pool call of this connector goes through the guard: deadlines and the pool's
    // health (R30).
    let instance = match params.config.stats.instance.as_str() {
        "" => "0",
        named => named,
    };
    let guarded = GuardedPool::new(
        params.pool,
        GuardSettings::new(&runtime.pool_calls, instance),
    );
    let health = guarded.health();
    let params = ConnectorParams {
        pool: Arc::new(guarded),
        ..params
    };
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    let thread_keys = Arc::clone(&keys);
    let thread = std::thread::Builder::new()
        .name("kvc-actors".into())
        .spawn(move || {
            let system = System::new();
            let started = system.block_on(async move {
                let shared = Shared {
                    inbox,
                    keys: thread_keys,
                    health,
                };
                spawn_all(params, &runtime, shared, ledger, &payload_lens).await
            });
            let ok = started.is_ok();
            let _ = sender.send(started);
            if ok {
                let _ = system.run();
            }
        })
        .map_err(|_| StartError::Thread)?;
    let started = receiver.recv().map_err(|_| StartError::Thread)??;
    Ok((Started { keys, ..started }, thread))
}

/// What every actor of one connector shares.
struct Shared {
    inbox: EngineInbox,
    keys: Arc<KeySpace>,
    /// The guarded pool's health, for the stats reporter.
    health: HealthView,
}

async fn spawn_all(
    params: ConnectorParams,
    runtime: &RuntimeConfig,
    shared: Shared,
    ledger: Ledger,
    payload_lens: &[usize],
) -> Result<Started, StartError> {
    let Shared {
        inbox,
        keys,
        health,
    } = shared;
    let settings = PlannerSettings::new(runtime, &params.layout, params.seed);
    let planner = LookupPlanner::new(
        Arc::clone(&params.pool),
        Arc::clone(&keys),
        settings,
        inbox.clone(),
        PlannerCapacity {
            mailbox: runtime.planner.mailbox_capacity.get(),
            max_concurrent_lookups: runtime.planner.max_concurrent_lookups.get(),
        },
    )
    .start();
    let faults = ActorFaults::of(&params.pool);
    let manager = ReservationManager::new(
        ledger,
        Arc::clone(&keys),
        inbox.clone(),
        runtime.reservations.mailbox_capacity.get(),
        faults.clone(),
    )
    .start();
    let mut registrations = StagingRegistrations::new(Arc::clone(&params.pool));
    let ranks = RankActors {
        runtime,
        pool: &params.pool,
        keys: &keys,
        inbox: &inbox,
        manager: &manager,
        slot_bytes: HEADER_BYTES + payload_lens.iter().copied().max().unwrap_or(0),
    };
    let mut loaders = Vec::new();
    let mut savers = Vec::new();
    // One device per rank of the share, checked by `start_actors`.
    let first_rank = params.share.first_rank;
    for (rank, device) in (first_rank..).zip(&params.devices) {
        loaders.push(ranks.loaders(rank, device, &mut registrations)?);
        savers.push(ranks.saver(rank, device, &mut registrations)?);
    }
    if manager.send(AttachLoaders { first_rank, loaders }).await.is_err() {
        return Err(StartError::Thread);
    }
    let reporter = StatsReporter::new(
        planner.clone(),
        manager.clone(),
        savers.clone(),
        runtime.stats.interval,
        faults,
        params.config.stats.instance.clone(),
        health,
    )
    .start();
    Ok(Started {
        planner,
        manager,
        savers,
        reporter,
        keys,
        system: System::current(),
        staging: registrations,
    })
}

/// What every rank's loaders and saver are built from.
struct RankActors<'a> {
    runtime: &'a RuntimeConfig,
    pool: &'a Arc<dyn Pool>,
    keys: &'a Arc<KeySpace>,
    inbox: &'a EngineInbox,
    manager: &'a Addr<ReservationManager>,
    /// Bytes of one staging slot: a header and the largest page.
    slot_bytes: usize,
}

impl RankActors<'_> {
    /// A staging pool of `bytes` on `device`, registered with the pool: as many slots as
    /// fit, and at least one (a pool smaller than a slot stages one page at a time).
    fn staging(
        &self,
        device: &Device,
        bytes: NonZeroU64,
        rank: u32,
        role: StagingRole,
        registrations: &mut StagingRegistrations,
    ) -> Result<StagingPool, StartError> {
        let fitting = bytes.get() / self.slot_bytes as u64;
        let slots = u32::try_from(fitting.max(1)).map_err(|_| StartError::StagingSlots {
            rank,
            role,
            bytes: bytes.get(),
            slot_bytes: self.slot_bytes,
        })?;
        let lent = self.pool.lend_staging(self.slot_bytes.saturating_mul(slots as usize));
        let staging = match lent {
            None => device.staging_pool(self.slot_bytes, slots),
            Some(lease) => {
                let lease = lease.map_err(|source| StartError::LendStaging {
                    rank,
                    role,
                    bytes: bytes.get(),
                    source,
                })?;
                device.staging_pool_lent(self.slot_bytes, slots, lease)
            }
        }
        .map_err(|error| match error {
                GpuError::HostAllocFailed { .. } => StartError::StagingAlloc {
                    rank,
                    role,
                    bytes: bytes.get(),
                    fits_bytes: fitting_staging_bytes(),
                },
                other => other.into(),
            })?;
        registrations.register(&staging, rank, role)?;
        Ok(staging)
    }

    /// Starts the loaders of `rank`, each on its own Arbiter with its own stream and
    /// supervised staging pool.
    fn loaders(
        &self,
        rank: u32,
        device: &Device,
        registrations: &mut StagingRegistrations,
    ) -> Result<Vec<Addr<Loader>>, StartError> {
        let loaders = &self.runtime.loaders;
        let mut started = Vec::with_capacity(loaders.load_threads.get());
        for _ in 0..loaders.load_threads.get() {
            let stream = device.stream()?;
            let staging = self.staging(
                device,
                loaders.staging_bytes_per_loader,
                rank,
                StagingRole::Loader,
                registrations,
            )?;
            let supervisee = Supervisee {
                actor: "loader",
                rank,
            };
            let staging = StagingSupervisor::new(supervisee, Arc::clone(self.pool), staging);
            let (pool, manager, capacity, load_timeout) = (
                Arc::clone(self.pool),
                self.manager.clone(),
                loaders.mailbox_capacity.get(),
                loaders.load_timeout,
            );
            let arbiter = Arbiter::new();
            started.push(Loader::start_in_arbiter(&arbiter.handle(), move |_| {
                Loader::new(pool, stream, staging, manager, capacity, load_timeout)
            }));
        }
        Ok(started)
    }

    /// Starts the saver of `rank` on its own Arbiter.
    fn saver(
        &self,
        rank: u32,
        device: &Device,
        registrations: &mut StagingRegistrations,
    ) -> Result<Addr<SaverQueue>, StartError> {
        let config = &self.runtime.saver;
        let staging = self.staging(
            device,
            config.staging_bytes,
            rank,
            StagingRole::Saver,
            registrations,
        )?;
        let saver = SaverParams {
            rank,
            pool: Arc::clone(self.pool),
            keys: Arc::clone(self.keys),
            stream: device.stream()?,
            staging,
            queue_capacity_pages: config.queue_capacity_pages,
            window_first: config.window_first,
            inbox: self.inbox.clone(),
            mailbox_capacity: config.mailbox_capacity.get(),
            no_space_retry: NoSpaceRetry {
                retries: config.no_space_retries,
                backoff: config.no_space_backoff,
            },
        };
        let arbiter = Arbiter::new();
        Ok(SaverQueue::start_in_arbiter(&arbiter.handle(), move |_| {
            SaverQueue::new(saver)
        }))
    }
}

/// A staging size that fits the host's available memory now: a quarter of it, at most the
/// default (256 MiB), in whole MiB and at least 1 MiB (a pool smaller than a slot still
/// stages one page at a time).
fn fitting_staging_bytes() -> u64 {
    let default = crate::config::LoadersConfig::default().staging_bytes_per_loader;
    let fits = host_memory().map_or(default, |host| (host.available_bytes / 4).min(default));
    (fits / MIB).max(1) * MIB
}

/// Window checkpoints are resume points, so they must fall on block boundaries wherever a
/// window group saves them (R28); a layout without one ignores the interval.
fn check_checkpoint_interval(layout: &Layout, runtime: &RuntimeConfig) -> Result<(), StartError> {
    let tokens_per_block = layout.tokens_per_block as usize;
    let windowed = layout
        .groups
        .iter()
        .any(|group| group.attention().is_window());
    match runtime.saver.window_checkpoint_tokens {
        Some(tokens) if windowed && tokens.get() % tokens_per_block.max(1) != 0 => {
            Err(StartError::CheckpointTokens {
                tokens: tokens.get(),
                tokens_per_block,
            })
        }
        _ => Ok(()),
    }
}
