//! The Mooncake Store pool of a replay: `--pool mooncake` (cargo feature `mooncake`).
//!
//! Workflow ([`MooncakeDeployment::start`]):
//! 1. the master: with [`PoolMaster::Configured`] (`--master HOST:PORT`) the running one at
//!    `mooncake.master_address`, its metadata server from `mooncake.metadata_server` (empty:
//!    `http://HOST:8080/metadata`); with [`PoolMaster::Start`] a `mooncake_master` this
//!    process starts on free loopback ports, with `pool.eviction_high_watermark_ratio`,
//!    `pool.eviction_ratio` and `pool.kv_lease_ttl_ms`, logging to a file in the temporary
//!    directory;
//! 2. one client per instance, as every serving process runs its own, each contributing an
//!    equal share of the pool's stored capacity as its segment (so the segments add up to
//!    the capacity the memory pool would have), the rest of each client from `[mooncake]`;
//!    with [`PoolMaster::StartWithRealClient`] (`--real-client`, Mooncake's one-node
//!    layout) one node-local `mooncake_client` holds the whole capacity instead, and every
//!    instance's client is a dummy client of it over shared memory, sized for its ranks'
//!    staging pools (`mooncake.shared_memory_bytes`, when 0, per rank);
//! 3. [`MooncakeDeployment::close`] at the end, after every connector has stopped: the
//!    clients close (concurrently; each blocks about two seconds, one after the other,
//!    waited for at most `mooncake.close_timeout_ms`), then the real client and the master
//!    this process started are stopped by their PIDs.
//!
//! Each client starts within `mooncake.connect_timeout_ms`, and a stop asked for meanwhile
//! (SIGINT, SIGTERM) abandons the start (`MooncakePool::connect_until`, R30).
//!
//! Time: the master's leases and eviction run on real time, not on the replay's simulated
//! clock (the memory pool's `ManualClock` does not apply). A lease of `pool.kv_lease_ttl_ms`
//! lasts that long in wall-clock time, which the replay covers in far less than the
//! simulated time, so under eviction pressure Mooncake keeps probed objects longer (in
//! simulated terms) than the memory pool does. With a pool that does not evict, the two
//! backends replay the same.
//!
//! Invariants:
//! - `replay::mooncake::M1`. Clients close before the real client and the master stop (`close`,
//!   and the field order for drops on an error path).
//! - `replay::mooncake::M2`. Every process started here is stopped by its PID
//!   (`mooncake::master::I1`), never by name.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::pool::mooncake::{
    MasterSettings, MooncakeError, MooncakeInstall, MooncakeMaster, MooncakePool,
    MooncakeRealClient, MooncakeSettings, RealClientSettings,
};
use crate::pool::Pool;

use super::error::ReplayError;
use super::setup::PoolMaster;

/// Distinguishes the master logs of several replays in one process.
static MASTER_LOGS: AtomicU64 = AtomicU64::new(0);

/// A replay's Mooncake pool: one client per instance, and the master if this process
/// started it.
pub struct MooncakeDeployment {
    /// One client per instance; dropped (closed) before the master (`replay::mooncake::M1`).
    clients: Vec<Arc<MooncakePool>>,
    /// The node-local real client this process started, with `--real-client`.
    real_client: Option<MooncakeRealClient>,
    /// The master this process started, `None` with `--master`.
    master: Option<MooncakeMaster>,
    /// Segment bytes of each client.
    segment_bytes: u64,
}

impl MooncakeDeployment {
    /// Starts (or finds) the master, and the real client with `--real-client`, and connects
    /// one client per instance (module workflow 1-2); `stopped()` is asked while a client
    /// starts.
    ///
    /// # Errors
    ///
    /// [`ReplayError::Mooncake`] when the wheel is missing, the master or the real client
    /// does not start, or a client cannot connect in time (the message names the address
    /// and the setting), or with [`MooncakeError::Interrupted`] when `stopped()` said so.
    pub fn start(
        config: &Config,
        clients: Clients,
        master: PoolMaster,
        stopped: &mut dyn FnMut() -> bool,
    ) -> Result<Self, ReplayError> {
        let Clients {
            segment_bytes,
            instances,
            ranks,
        } = clients;
        let base = MooncakeSettings {
            global_segment_size_bytes: segment_bytes,
            ..MooncakeSettings::from_config(config)
        };
        let (master, real_client, settings) = match master {
            PoolMaster::Configured => (None, None, base),
            PoolMaster::Start => {
                let master = start_master(config)?;
                let settings = master.client_settings(base);
                (Some(master), None, settings)
            }
            PoolMaster::StartWithRealClient => {
                let master = start_master(config)?;
                let capacity = segment_bytes.saturating_mul(instances as u64);
                let real_client = start_real_client(config, &master, capacity)?;
                let shared_memory_bytes = if config.mooncake.shared_memory_bytes == 0 {
                    base.shared_memory_bytes.saturating_mul(u64::from(ranks.max(1)))
                } else {
                    base.shared_memory_bytes
                };
                let settings = MooncakeSettings {
                    real_client_address: real_client.address(),
                    shared_memory_bytes,
                    ..master.client_settings(base)
                };
                (Some(master), Some(real_client), settings)
            }
        };
        tracing::info!(
            master_address = %settings.master_address,
            metadata_server = %settings.metadata_server,
            real_client_address = %settings.real_client_address,
            started_here = master.is_some(),
            instances,
            segment_bytes,
            "replay pool: mooncake"
        );
        let mut clients = Vec::with_capacity(instances);
        for _ in 0..instances {
            let client =
                MooncakePool::connect_until(settings.clone(), stopped).map_err(mooncake_error)?;
            clients.push(Arc::new(client));
        }
        Ok(Self {
            clients,
            real_client,
            master,
            segment_bytes,
        })
    }

    /// Every instance's client, index = instance.
    pub fn pools(&self) -> Vec<Arc<dyn Pool>> {
        self.clients
            .iter()
            .map(|client| Arc::clone(client) as Arc<dyn Pool>)
            .collect()
    }

    /// Bytes of all segments together: the pool's capacity.
    pub fn capacity_bytes(&self) -> u64 {
        let clients = u64::try_from(self.clients.len()).unwrap_or(u64::MAX);
        self.segment_bytes.saturating_mul(clients)
    }

    /// Closes every client concurrently, each waited for at most `mooncake.close_timeout_ms`
    /// (not at all when the connectors last found the pool unreachable: `reachable` false;
    /// the close then goes on in the background), then stops the master if this process
    /// started it (module workflow 3, `replay::mooncake::M1`). Failures are logged: the
    /// replay's results stand.
    pub fn close(mut self, reachable: bool) {
        std::thread::scope(|scope| {
            for client in &self.clients {
                scope.spawn(move || {
                    let timeout = if reachable {
                        Duration::from_millis(client.settings().close_timeout_ms)
                    } else {
                        Duration::ZERO
                    };
                    match client.close_within(timeout) {
                        Ok(()) => {}
                        Err(err @ MooncakeError::CloseTimeout { .. }) if !reachable => {
                            tracing::debug!(error = %err, "mooncake client closing in the background: the pool is unreachable");
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, kind = err.kind(), "closing a mooncake client failed");
                        }
                    }
                });
            }
        });
        self.clients.clear();
        if let Some(mut real_client) = self.real_client.take() {
            real_client.stop();
        }
        if let Some(mut master) = self.master.take() {
            if let Err(err) = master.stop() {
                tracing::warn!(error = %err, kind = err.kind(), "stopping mooncake_master failed");
            }
        }
    }
}

/// What a replay's clients are sized from.
#[derive(Debug, Clone, Copy)]
pub struct Clients {
    /// Segment bytes of each instance's client (the real client holds them all).
    pub segment_bytes: u64,
    /// Context instances: one client each.
    pub instances: usize,
    /// Ranks per instance, each with its own staging pools.
    pub ranks: u32,
}

/// The node-local `mooncake_client` of `--real-client`, holding `capacity` bytes, logging
/// next to the master's log.
fn start_real_client(
    config: &Config,
    master: &MooncakeMaster,
    capacity: u64,
) -> Result<MooncakeRealClient, ReplayError> {
    let install = MooncakeInstall::discover(&config.mooncake.venv_dir).map_err(mooncake_error)?;
    let log_file = temp_log("real-client");
    let settings = RealClientSettings {
        log_file: Some(log_file),
        ..RealClientSettings::new(&install, capacity)
    };
    MooncakeRealClient::start(master, &settings).map_err(mooncake_error)
}

/// A fresh log file of a process `kind` in the temporary directory.
fn temp_log(kind: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "kv-connector-replay-{kind}-{}-{}.log",
        std::process::id(),
        MASTER_LOGS.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A master on free loopback ports with the configuration's eviction and lease settings.
fn start_master(config: &Config) -> Result<MooncakeMaster, ReplayError> {
    let install = MooncakeInstall::discover(&config.mooncake.venv_dir).map_err(mooncake_error)?;
    let log_file = temp_log("master");
    let settings = MasterSettings {
        eviction_high_watermark_ratio: config.pool.eviction_high_watermark_ratio,
        eviction_ratio: config.pool.eviction_ratio,
        kv_lease_ttl_ms: config.pool.kv_lease_ttl_ms,
        log_file: Some(log_file.clone()),
        ..MasterSettings::new(&install)
    };
    let master = MooncakeMaster::start(settings).map_err(mooncake_error)?;
    tracing::info!(
        pid = master.pid(),
        address = %master.master_address(),
        log = %log_file.display(),
        "replay started mooncake_master"
    );
    Ok(master)
}

fn mooncake_error(err: MooncakeError) -> ReplayError {
    ReplayError::Mooncake(Box::new(err))
}
