//! What a Mooncake client is built with: [`MooncakeSettings`].
//!
//! The first seven fields are the arguments of the store client's `setup` call; the rest
//! say how this process embeds the client (where the wheel is, the environment the
//! transfer engine reads at start) and how the pool splits its calls. Every default works
//! on one machine over loopback TCP against a master on Mooncake's default ports; tests and
//! `replay` without `--master` take the addresses from a started
//! [`MooncakeMaster`](super::MooncakeMaster) instead
//! ([`MooncakeMaster::client_settings`](super::MooncakeMaster::client_settings)).

use std::path::PathBuf;

use crate::config::Config;

/// Settings of one Mooncake Store client (one `MooncakePool`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MooncakeSettings {
    /// Address other clients reach this client's segment at. Loopback keeps a one-machine
    /// deployment off the network; across machines use this node's RDMA- or TCP-reachable
    /// address.
    pub local_hostname: String,
    /// Where the transfer engine publishes segment descriptors: the master's built-in HTTP
    /// metadata server (`http://HOST:PORT/metadata`, master flag
    /// `--enable_http_metadata_server=true`).
    pub metadata_server: String,
    /// Bytes of memory this client contributes to the pool. The master places objects in
    /// any mounted segment; those held here leave the pool when the client closes. Counts
    /// against the node's memory budget (R9).
    pub global_segment_size_bytes: u64,
    /// Bytes of the client's own transfer buffer, used by Mooncake's copying calls; this
    /// pool passes registered memory instead, so a small buffer suffices.
    pub local_buffer_size_bytes: u64,
    /// Transport: `tcp` (one machine, or no RDMA NICs) or `rdma`.
    pub protocol: String,
    /// RDMA device names (for example `mlx5_0`); empty for TCP.
    pub device_name: String,
    /// The master's RPC address, `HOST:PORT`.
    pub master_address: String,
    /// The node-local `mooncake_client` (the "real client", which holds the segment) to
    /// attach to as a dummy client over shared memory, `HOST:PORT` of its RPC port; empty
    /// runs a client of its own that contributes `global_segment_size_bytes` and moves data
    /// over `protocol`. In the dummy layout the segment fields are the real client's business.
    pub real_client_address: String,
    /// Bytes of shared memory a dummy client maps for the real client (`setup_dummy`'s
    /// memory pool): every staging pool and the fallback buffer live in it. Unused without
    /// `real_client_address`.
    pub shared_memory_bytes: u64,
    /// The virtual environment holding the `mooncake-transfer-engine-non-cuda` wheel; its
    /// site-packages is added to the embedded interpreter (`scripts/setup-mooncake` makes
    /// `.venv`). A relative path is taken from the working directory.
    pub venv_dir: PathBuf,
    /// Exported as `MC_TCP_BIND_ADDRESS` before the first client starts, so the TCP
    /// transport listens on this address only; empty leaves the environment as it is.
    pub tcp_bind_address: String,
    /// Exported as `MC_LOG_LEVEL` before the first client starts; empty leaves it as is.
    pub log_level: String,
    /// TCP connections per peer: exported with `MC_TCP_ENABLE_CONNECTION_POOL=1` as
    /// `MC_TCP_LANES_PER_PEER` before the first client starts; 0 leaves both as they are.
    pub tcp_lanes_per_peer: u32,
    /// Exported as `MC_TCP_SLICE_SIZE` before the first client starts; 0 leaves it as is.
    pub tcp_slice_size_bytes: u64,
    /// The interpreter's GIL switch interval in microseconds, set when a client starts if
    /// the interpreter's is longer; 0 leaves it as it is.
    pub gil_switch_interval_us: u32,
    /// Most keys one put or get call carries. The TCP transport queues at most 1024
    /// transfers per peer; a larger batch partly fails with code -800.
    pub max_keys_per_call: usize,
    /// Keys per existence call; larger probes are split into chunks that run concurrently
    /// (R10). Matches `planner.probe_chunk`.
    pub probe_chunk_keys: usize,
    /// Bytes of the registered buffer that caller buffers outside any registered region
    /// are staged through. Grows to fit a single larger object.
    pub fallback_staging_bytes: usize,
    /// Exported as `MC_RPC_TIMEOUT_MS` and `MC_RPC_CONNECT_TIMEOUT_MS` before the client
    /// starts: how long the client waits for the master on each call (R30).
    pub rpc_timeout_ms: u64,
    /// How long [`MooncakePool::connect`](super::MooncakePool::connect) may take; also sets
    /// `MC_STORE_CLIENT_SETUP_RETRIES` ([`Self::setup_retries`]).
    pub connect_timeout_ms: u64,
    /// How long [`MooncakePool::close_within`](super::MooncakePool::close_within) waits.
    pub close_timeout_ms: u64,
}

impl Default for MooncakeSettings {
    fn default() -> Self {
        Self {
            local_hostname: "127.0.0.1".into(),
            metadata_server: "http://127.0.0.1:8080/metadata".into(),
            global_segment_size_bytes: 1 << 30,
            local_buffer_size_bytes: 16 << 20,
            protocol: "tcp".into(),
            device_name: String::new(),
            master_address: "127.0.0.1:50051".into(),
            real_client_address: String::new(),
            // What the default staging settings take: two loaders' and the saver's 256 MiB
            // each, plus the spare (`MooncakeConfig::effective_shared_memory_bytes`).
            shared_memory_bytes: (3 * 256 + 64) << 20,
            venv_dir: PathBuf::from(".venv"),
            tcp_bind_address: "127.0.0.1".into(),
            log_level: "WARNING".into(),
            tcp_lanes_per_peer: 0,
            tcp_slice_size_bytes: 0,
            gil_switch_interval_us: 500,
            max_keys_per_call: 1024,
            probe_chunk_keys: 4096,
            fallback_staging_bytes: 16 << 20,
            rpc_timeout_ms: 2000,
            connect_timeout_ms: 10_000,
            close_timeout_ms: 5000,
        }
    }
}

impl MooncakeSettings {
    /// The client of `config`: the `[mooncake]` section (an empty `metadata_server` becomes
    /// `http://HOST:8080/metadata` of `master_address`; a `shared_memory_bytes` of 0 fits
    /// one rank's staging pools), `planner.probe_chunk` as the probe chunk; the call limits
    /// and the fallback buffer keep their defaults.
    pub fn from_config(config: &Config) -> Self {
        let mooncake = &config.mooncake;
        Self {
            local_hostname: mooncake.local_hostname.clone(),
            metadata_server: mooncake.effective_metadata_server(),
            global_segment_size_bytes: mooncake.global_segment_size_bytes,
            local_buffer_size_bytes: mooncake.local_buffer_size_bytes,
            protocol: mooncake.protocol.clone(),
            device_name: mooncake.device_name.clone(),
            master_address: mooncake.master_address.clone(),
            real_client_address: mooncake.real_client_address.clone(),
            shared_memory_bytes: mooncake.effective_shared_memory_bytes(config),
            venv_dir: mooncake.venv_dir.clone(),
            tcp_bind_address: mooncake.tcp_bind_address.clone(),
            log_level: mooncake.log_level.clone(),
            tcp_lanes_per_peer: mooncake.tcp_lanes_per_peer,
            tcp_slice_size_bytes: mooncake.tcp_slice_size_bytes,
            gil_switch_interval_us: mooncake.gil_switch_interval_us,
            probe_chunk_keys: config.planner.probe_chunk,
            rpc_timeout_ms: mooncake.rpc_timeout_ms,
            connect_timeout_ms: mooncake.connect_timeout_ms,
            close_timeout_ms: mooncake.close_timeout_ms,
            ..Self::default()
        }
    }

    /// [`from_config`](Self::from_config) for a connector without loaders or a saver (a
    /// lookup-only scheduler side): a dummy client's shared memory then holds only the
    /// fallback buffer, unless `mooncake.shared_memory_bytes` sets it.
    pub fn lookup_only_from_config(config: &Config) -> Self {
        let shared_memory_bytes = match config.mooncake.shared_memory_bytes {
            0 => crate::config::MOONCAKE_SHARED_MEMORY_SPARE_BYTES,
            set => set,
        };
        Self {
            shared_memory_bytes,
            ..Self::from_config(config)
        }
    }

    /// `MC_STORE_CLIENT_SETUP_RETRIES`: as many `setup` attempts as fit in
    /// `connect_timeout_ms` when each waits out a connect and a request deadline of
    /// `rpc_timeout_ms` (a master that accepts and never answers), at least 1 and at most
    /// Mooncake's own 20.
    pub fn setup_retries(&self) -> u64 {
        let attempt_ms = self.rpc_timeout_ms.max(1).saturating_mul(2);
        (self.connect_timeout_ms / attempt_ms).clamp(1, 20)
    }

    /// `max_keys_per_call` and `probe_chunk_keys`, each at least one.
    pub(crate) fn call_limits(&self) -> (usize, usize) {
        (self.max_keys_per_call.max(1), self.probe_chunk_keys.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_stay_on_loopback_and_split_below_the_tcp_queue() {
        let settings = MooncakeSettings::default();
        assert!(settings.local_hostname.starts_with("127."));
        assert!(settings.metadata_server.starts_with("http://127.0.0.1:"));
        assert!(settings.master_address.starts_with("127.0.0.1:"));
        assert_eq!(settings.tcp_bind_address, "127.0.0.1");
        assert!(settings.max_keys_per_call <= 1024);
    }

    #[test]
    fn partial_toml_keeps_the_other_defaults_and_unknown_keys_are_errors(
    ) -> Result<(), toml::de::Error> {
        let settings: MooncakeSettings = toml::from_str("master_address = \"10.0.0.5:50051\"")?;
        assert_eq!(settings.master_address, "10.0.0.5:50051");
        assert_eq!(settings.protocol, "tcp");
        assert!(toml::from_str::<MooncakeSettings>("master = \"x\"").is_err());
        Ok(())
    }

    #[test]
    fn config_defaults_give_the_default_client() {
        assert_eq!(
            MooncakeSettings::from_config(&Config::default()),
            MooncakeSettings::default()
        );
    }

    #[test]
    fn shared_memory_fits_one_ranks_staging_unless_set() {
        let mut config = Config::default();
        config.mooncake.real_client_address = "127.0.0.1:50052".into();
        config.loaders.load_threads = 4;
        config.loaders.staging_bytes_per_loader = 64 << 20;
        config.saver.staging_bytes = 128 << 20;
        let settings = MooncakeSettings::from_config(&config);
        assert_eq!(settings.real_client_address, "127.0.0.1:50052");
        assert_eq!(settings.shared_memory_bytes, (4 * 64 + 128 + 64) << 20);
        assert_eq!(
            MooncakeSettings::lookup_only_from_config(&config).shared_memory_bytes,
            64 << 20,
            "no staging: the fallback buffer and the spare"
        );
        config.mooncake.shared_memory_bytes = 3 << 30;
        assert_eq!(MooncakeSettings::from_config(&config).shared_memory_bytes, 3 << 30);
        assert_eq!(
            MooncakeSettings::lookup_only_from_config(&config).shared_memory_bytes,
            3 << 30
        );
    }

    #[test]
    fn config_sets_the_client_and_derives_the_metadata_server() {
        let mut config = Config::default();
        config.mooncake.master_address = "10.0.0.5:50051".into();
        config.mooncake.protocol = "rdma".into();
        config.mooncake.device_name = "mlx5_0".into();
        config.mooncake.global_segment_size_bytes = 4 << 30;
        config.planner.probe_chunk = 512;
        let settings = MooncakeSettings::from_config(&config);
        assert_eq!(settings.master_address, "10.0.0.5:50051");
        assert_eq!(settings.metadata_server, "http://10.0.0.5:8080/metadata");
        assert_eq!(
            (settings.protocol.as_str(), settings.device_name.as_str()),
            ("rdma", "mlx5_0")
        );
        assert_eq!(settings.global_segment_size_bytes, 4 << 30);
        assert_eq!(settings.probe_chunk_keys, 512);
        assert_eq!(settings.max_keys_per_call, 1024);
    }

    #[test]
    fn setup_retries_fit_the_connect_deadline() {
        let settings = |connect_timeout_ms, rpc_timeout_ms| MooncakeSettings {
            rpc_timeout_ms,
            connect_timeout_ms,
            ..MooncakeSettings::default()
        };
        assert_eq!(settings(10_000, 2000).setup_retries(), 2);
        assert_eq!(
            settings(1000, 2000).setup_retries(),
            1,
            "at least one attempt"
        );
        assert_eq!(
            settings(3_600_000, 100).setup_retries(),
            20,
            "never more than Mooncake's"
        );
    }

    #[test]
    fn zero_limits_are_raised_to_one() {
        let settings = MooncakeSettings {
            max_keys_per_call: 0,
            probe_chunk_keys: 0,
            ..MooncakeSettings::default()
        };
        assert_eq!(settings.call_limits(), (1, 1));
    }
}
