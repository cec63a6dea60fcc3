//! Starting and stopping a `mooncake_master` process on free loopback ports, for tests and
//! for `replay --pool mooncake` without `--master`.
//!
//! # Workflow
//!
//! 1. [`MasterSettings::new`] from a [`MooncakeInstall`] (the binary ships in the wheel);
//!    set the eviction flags from `[pool]`.
//! 2. [`MooncakeMaster::start`] picks three free ports on 127.0.0.1 (RPC, HTTP metadata,
//!    metrics), spawns the master with its built-in HTTP metadata server, and waits until
//!    all three listen. A master that exits while starting (a port taken in between) is
//!    retried on fresh ports.
//! 3. [`MooncakeMaster::client_settings`] fills a client's `master_address` and
//!    `metadata_server`.
//! 4. [`MooncakeMaster::stop`] (or drop) kills the process by its PID and reaps it;
//!    [`MooncakeMaster::restart`] starts it again on the same ports. Clients that outlive a
//!    restart reconnect by themselves: their next calls answer per-key errors until the
//!    client's heartbeat re-mounts its segment (about a second), then work again; the
//!    objects stored before the restart are gone.
//!
//! # Invariants
//!
//! - `mooncake::master::I1`. Every process this module spawns is killed and reaped by
//!   [`MooncakeMaster::stop`], which `Drop` calls; nothing is stopped by name.
//! - `mooncake::master::I2`. The master listens on loopback only.
//! - `mooncake::master::I3`. A master dies with the process that started it, also one
//!   killed with SIGKILL (a parent-death signal, set through `setpriv`). Linux sends it when
//!   the thread that spawned the master ends: start a master from a thread that outlives it
//!   (the replay starts it on its main thread).

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{MooncakeError, MooncakeInstall, MooncakeSettings};

/// Start attempts when the master exits while starting (a port race).
const START_ATTEMPTS: usize = 3;
/// How often readiness is polled.
const READY_POLL: Duration = Duration::from_millis(20);

/// How to run a master.
#[derive(Debug, Clone, PartialEq)]
pub struct MasterSettings {
    /// The `mooncake_master` binary.
    pub binary: PathBuf,
    /// `--eviction_high_watermark_ratio` (`pool.eviction_high_watermark_ratio`).
    pub eviction_high_watermark_ratio: f64,
    /// `--eviction_ratio` (`pool.eviction_ratio`).
    pub eviction_ratio: f64,
    /// `--default_kv_lease_ttl` in milliseconds (`pool.kv_lease_ttl_ms`, R14).
    pub kv_lease_ttl_ms: u64,
    /// Where the master's log goes; `None` discards it.
    pub log_file: Option<PathBuf>,
    /// How long [`MooncakeMaster::start`] waits for the ports to listen.
    pub ready_timeout_ms: u64,
}

impl MasterSettings {
    /// The binary of `install`, with the `[pool]` section's eviction defaults.
    pub fn new(install: &MooncakeInstall) -> Self {
        let pool = crate::config::PoolConfig::default();
        Self {
            binary: install.master_binary.clone(),
            eviction_high_watermark_ratio: pool.eviction_high_watermark_ratio,
            eviction_ratio: pool.eviction_ratio,
            kv_lease_ttl_ms: pool.kv_lease_ttl_ms,
            log_file: None,
            ready_timeout_ms: 15_000,
        }
    }
}

/// The loopback ports of one master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MasterPorts {
    /// RPC port (`--rpc_port`): the clients' `master_address`.
    pub rpc: u16,
    /// HTTP metadata server port (`--http_metadata_server_port`).
    pub metadata: u16,
    /// Metrics and admin HTTP port (`--metrics_port`).
    pub metrics: u16,
}

/// A running `mooncake_master` child process; stopped on drop (`mooncake::master::I1`).
#[derive(Debug)]
pub struct MooncakeMaster {
    #[cfg(feature = "internals")]
    settings: MasterSettings,
    ports: MasterPorts,
    child: Option<Child>,
}

impl MooncakeMaster {
    /// Starts a master on free loopback ports and waits until it listens.
    ///
    /// # Errors
    ///
    /// [`MooncakeError::NoFreePort`], [`MooncakeError::MasterSpawn`] (binary missing),
    /// [`MooncakeError::MasterExited`] (after the retries), [`MooncakeError::MasterNotReady`],
    /// [`MooncakeError::MasterLog`].
    #[cfg_attr(not(feature = "internals"), allow(clippy::needless_pass_by_value, reason = "kept for restarts where those are built (the outage drills)"))]
    pub fn start(settings: MasterSettings) -> Result<Self, MooncakeError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ports = free_ports()?;
            match spawn_ready(&settings, ports) {
                Ok(child) => {
                    tracing::info!(
                        pid = child.id(),
                        rpc = ports.rpc,
                        metadata = ports.metadata,
                        "mooncake_master started"
                    );
                    return Ok(Self {
                        #[cfg(feature = "internals")]
                        settings,
                        ports,
                        child: Some(child),
                    });
                }
                Err(MooncakeError::MasterExited { .. }) if attempt < START_ATTEMPTS => {}
                Err(err) => return Err(err),
            }
        }
    }

    /// Its ports.
    #[cfg(feature = "internals")]
    pub fn ports(&self) -> MasterPorts {
        self.ports
    }

    /// `127.0.0.1:RPC`, a client's `master_address`.
    pub fn master_address(&self) -> String {
        format!("{}:{}", Ipv4Addr::LOCALHOST, self.ports.rpc)
    }

    /// `http://127.0.0.1:PORT/metadata`, a client's `metadata_server`.
    pub fn metadata_server(&self) -> String {
        format!(
            "http://{}:{}/metadata",
            Ipv4Addr::LOCALHOST,
            self.ports.metadata
        )
    }

    /// `base` with this master's `master_address` and `metadata_server`.
    pub fn client_settings(&self, base: MooncakeSettings) -> MooncakeSettings {
        MooncakeSettings {
            master_address: self.master_address(),
            metadata_server: self.metadata_server(),
            ..base
        }
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process by its PID and reaps it (`mooncake::master::I1`). Idempotent.
    ///
    /// # Errors
    ///
    /// [`MooncakeError::MasterStop`] when the kill or the wait fails.
    pub fn stop(&mut self) -> Result<(), MooncakeError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = child.id();
        let stop_error = |source| MooncakeError::MasterStop { pid, source };
        if child.try_wait().map_err(stop_error)?.is_none() {
            child.kill().map_err(stop_error)?;
        }
        child.wait().map_err(stop_error)?;
        tracing::info!(pid, "mooncake_master stopped");
        Ok(())
    }

    /// Stops the master and starts a new one on the same ports (state is lost).
    ///
    /// # Errors
    ///
    /// As [`stop`](Self::stop) and [`start`](Self::start), without the port retry.
    #[cfg(feature = "internals")]
    pub fn restart(&mut self) -> Result<(), MooncakeError> {
        self.stop()?;
        self.child = Some(spawn_ready(&self.settings, self.ports)?);
        Ok(())
    }
}

impl Drop for MooncakeMaster {
    fn drop(&mut self) {
        if let Err(err) = self.stop() {
            tracing::warn!(error = %err, "could not stop mooncake_master");
        }
    }
}

/// Three distinct free ports on 127.0.0.1 (held open together so they differ).
fn free_ports() -> Result<MasterPorts, MooncakeError> {
    let bind = || {
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| Ok((listener.local_addr()?.port(), listener)))
            .map_err(|source| MooncakeError::NoFreePort { source })
    };
    let (rpc, _rpc) = bind()?;
    let (metadata, _metadata) = bind()?;
    let (metrics, _metrics) = bind()?;
    Ok(MasterPorts {
        rpc,
        metadata,
        metrics,
    })
}

/// The master's command line (`mooncake::master::I2`).
fn master_args(settings: &MasterSettings, ports: MasterPorts) -> Vec<String> {
    let host = Ipv4Addr::LOCALHOST;
    vec![
        "--enable_http_metadata_server=true".into(),
        format!("--http_metadata_server_host={host}"),
        format!("--http_metadata_server_port={}", ports.metadata),
        format!("--rpc_address={host}"),
        format!("--rpc_port={}", ports.rpc),
        format!("--metrics_host={host}"),
        format!("--metrics_port={}", ports.metrics),
        format!("--default_kv_lease_ttl={}", settings.kv_lease_ttl_ms),
        format!(
            "--eviction_high_watermark_ratio={}",
            settings.eviction_high_watermark_ratio
        ),
        format!("--eviction_ratio={}", settings.eviction_ratio),
        "--enable_metric_reporting=false".into(),
        "--logtostderr=true".into(),
    ]
}

/// Spawns a master on `ports` and waits until every port listens.
fn spawn_ready(settings: &MasterSettings, ports: MasterPorts) -> Result<Child, MooncakeError> {
    let stderr = || log_sink(settings.log_file.as_deref());
    let spawn_error = |source| MooncakeError::MasterSpawn {
        binary: settings.binary.clone(),
        source,
    };
    // A missing binary is a spawn error, also when `setpriv` would run it.
    std::fs::metadata(&settings.binary).map_err(spawn_error)?;
    let mut child = spawn_master(&settings.binary, &master_args(settings, ports), &stderr)?
        .map_err(spawn_error)?;
    match wait_ready(&mut child, settings, ports) {
        Ok(()) => Ok(child),
        Err(err) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(err)
        }
    }
}

/// Where a spawned process's stderr goes: appended to `log_file`, or discarded.
pub(super) fn log_sink(log_file: Option<&Path>) -> Result<Stdio, MooncakeError> {
    match log_file {
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(Stdio::from)
            .map_err(|source| MooncakeError::MasterLog {
                path: path.to_path_buf(),
                source,
            }),
        None => Ok(Stdio::null()),
    }
}

/// Spawns `binary` with `args` so that it dies with this process (`mooncake::master::I3`):
/// through util-linux's `setpriv --pdeathsig KILL`, which sets Linux's parent-death signal
/// in the child and then executes the master (same PID), so a process killed with SIGKILL
/// leaves no master behind. Without `setpriv` the master runs plain, and a warning says
/// so once. `stderr` makes the master's stderr for each attempt.
pub(super) fn spawn_master(
    binary: &Path,
    args: &[String],
    stderr: &dyn Fn() -> Result<Stdio, MooncakeError>,
) -> Result<std::io::Result<Child>, MooncakeError> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let quiet = |command: &mut Command| {
        command.stdin(Stdio::null()).stdout(Stdio::null());
    };
    let mut guarded = Command::new("setpriv");
    guarded
        .args(["--pdeathsig", "KILL", "--"])
        .arg(binary)
        .args(args);
    quiet(&mut guarded);
    match guarded.stderr(stderr()?).spawn() {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        spawned => return Ok(spawned),
    }
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "setpriv (util-linux) not found: a mooncake_master this process starts outlives \
             it if it is killed with SIGKILL"
        );
    }
    let mut plain = Command::new(binary);
    plain.args(args);
    quiet(&mut plain);
    Ok(plain.stderr(stderr()?).spawn())
}

/// Polls the three ports until they accept connections, the child exits, or time runs out.
fn wait_ready(
    child: &mut Child,
    settings: &MasterSettings,
    ports: MasterPorts,
) -> Result<(), MooncakeError> {
    let started = Instant::now();
    let timeout = Duration::from_millis(settings.ready_timeout_ms);
    for port in [ports.metadata, ports.rpc, ports.metrics] {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(MooncakeError::MasterExited {
                    status,
                    log: settings.log_file.clone(),
                });
            }
            if TcpStream::connect_timeout(&address, READY_POLL).is_ok() {
                break;
            }
            if started.elapsed() >= timeout {
                return Err(MooncakeError::MasterNotReady {
                    address: address.to_string(),
                    waited_ms: settings.ready_timeout_ms,
                });
            }
            std::thread::sleep(READY_POLL);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(binary: &str) -> MasterSettings {
        MasterSettings {
            binary: binary.into(),
            eviction_high_watermark_ratio: 0.97,
            eviction_ratio: 0.01,
            kv_lease_ttl_ms: 250,
            log_file: None,
            ready_timeout_ms: 1_000,
        }
    }

    #[test]
    fn free_ports_are_distinct() -> Result<(), MooncakeError> {
        let ports = free_ports()?;
        assert_ne!(ports.rpc, ports.metadata);
        assert_ne!(ports.rpc, ports.metrics);
        assert_ne!(ports.metadata, ports.metrics);
        Ok(())
    }

    #[test]
    fn args_bind_every_port_to_loopback_and_pass_the_eviction_flags() {
        let ports = MasterPorts {
            rpc: 1,
            metadata: 2,
            metrics: 3,
        };
        let args = master_args(&settings("m"), ports);
        assert!(args.contains(&"--enable_http_metadata_server=true".to_string()));
        for flag in [
            "--http_metadata_server_host",
            "--rpc_address",
            "--metrics_host",
        ] {
            assert!(
                args.contains(&format!("{flag}=127.0.0.1")),
                "{flag}: {args:?}"
            );
        }
        assert!(args.contains(&"--rpc_port=1".to_string()));
        assert!(args.contains(&"--eviction_high_watermark_ratio=0.97".to_string()));
        assert!(args.contains(&"--eviction_ratio=0.01".to_string()));
        assert!(args.contains(&"--default_kv_lease_ttl=250".to_string()));
    }

    #[test]
    fn a_missing_binary_is_a_spawn_error_naming_the_setup_script() {
        let err = MooncakeMaster::start(settings("/nonexistent/mooncake_master"))
            .expect_err("no binary there");
        assert_eq!(err.kind(), "master_spawn");
        assert!(err.to_string().contains("scripts/setup-mooncake"), "{err}");
    }

    #[test]
    fn a_master_that_exits_at_once_is_reported_not_awaited() {
        let err = MooncakeMaster::start(settings("/bin/false")).expect_err("exits");
        assert_eq!(err.kind(), "master_exited");
    }
}
