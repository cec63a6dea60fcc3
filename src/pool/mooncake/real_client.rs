//! Starting and stopping a node-local `mooncake_client` (the "real client" of Mooncake's
//! one-node layout, which holds the node's segment and serves dummy clients over shared
//! memory), for tests and for `replay --pool mooncake --real-client`.
//!
//! # Workflow
//!
//! 1. A master runs ([`MooncakeMaster`]); [`RealClientSettings::new`] takes the binary from
//!    the same wheel.
//! 2. [`MooncakeRealClient::start`] picks a free loopback port, spawns the client against
//!    the master with a segment of `segment_bytes`, and waits until the port listens.
//! 3. Clients attach with `mooncake.real_client_address` =
//!    [`MooncakeRealClient::address`] (`shared.rs`).
//! 4. [`MooncakeRealClient::stop`] (or drop) kills it by its PID and reaps it, after every
//!    dummy client closed.
//!
//! # Invariants
//!
//! - `mooncake::real_client::R1`. The process is killed and reaped by its PID, never by name,
//!   and dies with this process (as the master, `mooncake::master::I3`).

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use super::master::{log_sink, spawn_master};
use super::{MooncakeError, MooncakeInstall, MooncakeMaster};

/// How often readiness is polled.
const READY_POLL: Duration = Duration::from_millis(50);

/// How to run a real client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealClientSettings {
    /// The `mooncake_client` binary.
    pub binary: PathBuf,
    /// `--global_segment_size`: the node's pool memory.
    pub segment_bytes: u64,
    /// `--threads`: its transfer threads.
    pub threads: u32,
    /// Where its log goes; `None` discards it.
    pub log_file: Option<PathBuf>,
    /// How long [`MooncakeRealClient::start`] waits for the port to listen.
    pub ready_timeout_ms: u64,
}

impl RealClientSettings {
    /// The `mooncake_client` beside the master of `install`, with a segment of
    /// `segment_bytes` and two threads.
    pub fn new(install: &MooncakeInstall, segment_bytes: u64) -> Self {
        Self {
            binary: install.master_binary.with_file_name("mooncake_client"),
            segment_bytes,
            threads: 2,
            log_file: None,
            ready_timeout_ms: 30_000,
        }
    }
}

/// A running node-local `mooncake_client` (`mooncake::real_client::R1`).
#[derive(Debug)]
pub struct MooncakeRealClient {
    port: u16,
    child: Option<Child>,
}

impl MooncakeRealClient {
    /// Starts a real client against `master` on a free loopback port (module workflow 2).
    ///
    /// # Errors
    ///
    /// [`MooncakeError::NoFreePort`], [`MooncakeError::MasterSpawn`] (a missing binary),
    /// [`MooncakeError::MasterLog`], [`MooncakeError::RealClientStart`] when it exits or does
    /// not listen in time.
    pub fn start(master: &MooncakeMaster, settings: &RealClientSettings) -> Result<Self, MooncakeError> {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.local_addr())
            .map_err(|source| MooncakeError::NoFreePort { source })?
            .port();
        let host = Ipv4Addr::LOCALHOST;
        let args = vec![
            format!("--host={host}"),
            format!("--port={port}"),
            format!("--master_server_address={}", master.master_address()),
            format!("--metadata_server={}", master.metadata_server()),
            format!("--global_segment_size={}", settings.segment_bytes),
            "--local_buffer_size=16777216".to_owned(),
            format!("--threads={}", settings.threads.max(1)),
            "--logtostderr=true".to_owned(),
        ];
        let stderr = || log_sink(settings.log_file.as_deref());
        let spawn_error = |source| MooncakeError::MasterSpawn {
            binary: settings.binary.clone(),
            source,
        };
        std::fs::metadata(&settings.binary).map_err(spawn_error)?;
        let child = spawn_master(&settings.binary, &args, &stderr)?.map_err(spawn_error)?;
        let mut client = Self {
            port,
            child: Some(child),
        };
        client.wait_ready(settings)?;
        tracing::info!(pid = client.pid(), port, "mooncake_client started");
        Ok(client)
    }

    /// `127.0.0.1:PORT`, a dummy client's `mooncake.real_client_address`.
    pub fn address(&self) -> String {
        format!("{}:{}", Ipv4Addr::LOCALHOST, self.port)
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process by its PID and reaps it (`mooncake::real_client::R1`). Idempotent;
    /// a failure is logged.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        if let Ok(None) = child.try_wait() {
            if let Err(error) = child.kill() {
                tracing::warn!(pid, %error, "could not kill mooncake_client");
            }
        }
        if let Err(error) = child.wait() {
            tracing::warn!(pid, %error, "could not reap mooncake_client");
        }
    }

    /// Polls the port until it accepts connections; on failure the process is stopped.
    fn wait_ready(&mut self, settings: &RealClientSettings) -> Result<(), MooncakeError> {
        let started = Instant::now();
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let failed = |what: String| MooncakeError::RealClientStart {
            what,
            log: settings.log_file.clone(),
        };
        loop {
            let exited = self.child.as_mut().and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.stop();
                return Err(failed(format!("exited with {status}")));
            }
            if TcpStream::connect_timeout(&address, READY_POLL).is_ok() {
                return Ok(());
            }
            if started.elapsed() >= Duration::from_millis(settings.ready_timeout_ms) {
                self.stop();
                return Err(failed(format!(
                    "did not listen on {address} within {} ms",
                    settings.ready_timeout_ms
                )));
            }
            std::thread::sleep(READY_POLL);
        }
    }
}

impl Drop for MooncakeRealClient {
    fn drop(&mut self) {
        self.stop();
    }
}
