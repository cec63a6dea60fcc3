//! The sections of the configuration tree and their built-in defaults.
//!
//! Each struct is one `[section]` of the TOML file. Every field name carries its unit
//! (`_bytes`, `_ms`, `_s`, `_tokens`, `_ratio`) so a reader never has to guess it, and every
//! field's doc says why the setting exists. Defaults live in the explicit `impl Default`s
//! below; `config/default.toml` repeats them and a test keeps the two equal.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::gpu::DeviceRequest;

/// One mebibyte, in bytes.
pub const MIB: u64 = 1 << 20;
/// One gibibyte, in bytes.
pub const GIB: u64 = 1 << 30;

/// `[model]`: which KV layout the connector serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Name of a built-in layout preset (`llama-3.1-8b`, `gpt-oss-120b`, `gemma-3-27b`,
    /// `tiny-hybrid`). The layout decides page sizes and window groups (R6), so it must match
    /// the engine; the layout code validates the name, this tree only carries it.
    pub preset: String,
    /// A layout file that replaces the preset, for models no preset describes. Empty means
    /// "use `preset`".
    pub layout_file: PathBuf,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            preset: "tiny-hybrid".to_owned(),
            layout_file: PathBuf::new(),
        }
    }
}

impl ModelConfig {
    /// The layout file to read, or `None` when the preset is used (`layout_file` empty).
    pub fn layout_file(&self) -> Option<&Path> {
        (!self.layout_file.as_os_str().is_empty()).then_some(self.layout_file.as_path())
    }
}

/// `[keys]`: the first two segments of every pool key (R3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeysConfig {
    /// First key segment. Deployments that share one pool but must never share KV (test and
    /// production, two tenants without salts) use different namespaces. No `/`: it would
    /// shift every later key segment.
    pub namespace: String,
    /// Second key segment, naming the model. Empty means "derive it from the preset name";
    /// set it when two presets must share KV or one preset name covers two checkpoints
    /// (R4). No `/`, for the same reason as `namespace`.
    pub model_key: String,
}

impl Default for KeysConfig {
    fn default() -> Self {
        Self {
            namespace: "kvc".to_owned(),
            model_key: String::new(),
        }
    }
}

/// Which pool implementation stores the KV objects (`pool.backend`, and `--pool` of the
/// `replay` and `inspect` commands).
///
/// `mooncake` is always accepted; a build without the `mooncake` cargo feature refuses it
/// when the pool is opened, naming the feature, wherever the choice came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum PoolBackend {
    /// The embedded in-process pool: no external service, one process only.
    Memory,
    /// Mooncake Store (`mooncake_master` plus the transfer-engine client), shared by many
    /// processes and machines.
    Mooncake,
}

impl PoolBackend {
    /// The spellings accepted in TOML, the environment and on the command line.
    pub const NAMES: &'static [&'static str] = &["memory", "mooncake"];

    /// The spelling of this backend (one of [`Self::NAMES`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Mooncake => "mooncake",
        }
    }
}

/// `[pool]`: the shared object store and its eviction model (`docs/DESIGN.md` section 10).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// The embedded pool needs nothing outside the process, so it is the default; Mooncake
    /// is what a real multi-instance deployment uses.
    pub backend: PoolBackend,
    /// Bytes of the embedded pool (`memory`): larger keeps more prefixes reusable; it counts
    /// against `node.memory_budget_bytes` (R9). A Mooncake node contributes
    /// `mooncake.global_segment_size_bytes` instead. `kv-connector replay` models the pool
    /// it replays with this capacity for either backend (it sizes the Mooncake segments from
    /// it), so the two backends replay the same pool.
    pub capacity_bytes: u64,
    /// Eviction starts when usage exceeds this share of capacity. Mooncake's default (0.95)
    /// leaves headroom so a burst of puts does not fail before eviction catches up.
    pub eviction_high_watermark_ratio: f64,
    /// Share of capacity freed per eviction pass (Mooncake's default 0.05): large enough
    /// that passes are rare, small enough that hot prefixes survive.
    pub eviction_ratio: f64,
    /// A probe or get leases the object for this long so it is not evicted between the
    /// lookup and the load (R14). Shorter than Mooncake's default (5000 ms): a full pool
    /// evicts only objects whose lease has expired, so every probed object outlives the
    /// saves that come after it for the whole lease, and under pressure the fresh saves go
    /// first. A load that starts later than this after its lookup may find an object
    /// evicted; it then fails and the engine computes the prefix (R25).
    pub kv_lease_ttl_ms: u64,
    /// Deadline of each existence probe (a lookup's probes, the saver's skip-present check,
    /// the background health probes): a lookup waits for its probes, so a pool that does
    /// not answer must cost it a fraction of a second, not the backend's own timeout. A
    /// probe past it fails as a timeout (R30).
    pub probe_timeout_ms: u64,
    /// Most probe calls running at once off their callers' threads, counting calls past
    /// their deadline that the backend has not returned from yet (a call inside the
    /// Mooncake client cannot be cancelled). A probe beyond it fails at once as a missed
    /// deadline instead of starting another thread, so a hung pool cannot pile up threads.
    pub calls_in_flight: usize,
    /// Failed calls in a row (unreachable, or past their deadline) that mark the pool
    /// unreachable: from then on calls fail at once instead of each waiting out a timeout,
    /// until a background probe is answered (R30).
    pub unreachable_after_failures: u64,
    /// Wait before the first background probe of an outage; it doubles after each probe
    /// that fails, up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    /// Longest wait between two background probes of an outage: how long a recovered pool
    /// may go unused at most.
    pub retry_max_ms: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            backend: PoolBackend::Memory,
            capacity_bytes: 8 * GIB,
            eviction_high_watermark_ratio: 0.95,
            eviction_ratio: 0.05,
            kv_lease_ttl_ms: 2000,
            probe_timeout_ms: 250,
            calls_in_flight: 16,
            unreachable_after_failures: 3,
            retry_initial_ms: 250,
            retry_max_ms: 5000,
        }
    }
}

/// Transports the Mooncake Store client speaks.
pub const MOONCAKE_PROTOCOLS: &[&str] = &["tcp", "rdma"];

/// Smallest nonzero Mooncake segment: the client refuses to mount less.
pub const MOONCAKE_MIN_SEGMENT_BYTES: u64 = 16 * MIB;

/// `[mooncake]`: the Mooncake Store client of this process (`pool.backend = "mooncake"`).
///
/// These are the arguments of the client's `setup` call plus how this process embeds the
/// client; the defaults run on one machine over loopback TCP against a master on
/// Mooncake's default ports. The section is read only with `pool.backend = "mooncake"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MooncakeConfig {
    /// Address other clients reach this client's segment at. Loopback keeps a one-machine
    /// deployment off the network; across machines use an address they can reach.
    pub local_hostname: String,
    /// The master's HTTP metadata server, where transfer engines publish their segments
    /// (`http://HOST:PORT/metadata`, master flag `--enable_http_metadata_server=true`).
    /// Empty derives it from `master_address`: `http://HOST:8080/metadata`, the master's
    /// default metadata port.
    pub metadata_server: String,
    /// The master's RPC address, `HOST:PORT` (`mooncake_master --rpc_port`, default 50051).
    pub master_address: String,
    /// The one-node layout Mooncake recommends: `HOST:PORT` of a node-local
    /// `mooncake_client` (the "real client", which holds the node's segment), which this
    /// process attaches to as a dummy client over shared memory (`setup_dummy`). Empty
    /// (the default) runs a client of this process's own that contributes
    /// `global_segment_size_bytes` and moves data over `protocol`. With an address, the
    /// segment, `protocol`, `device_name` and the TCP settings are the real client's (its
    /// own flags), and every staging pool lives in `shared_memory_bytes`.
    pub real_client_address: String,
    /// Bytes of shared memory a dummy client maps with the real client
    /// (`real_client_address`); the loaders' and the saver's staging pools and a 16 MiB
    /// fallback buffer are taken from it. 0 (the default) sizes it for one rank: the staging
    /// settings plus 64 MiB (64 MiB for a connector without devices). Unused without
    /// `real_client_address`.
    pub shared_memory_bytes: u64,
    /// Transport between clients: `tcp` (one machine, or no RDMA NICs) or `rdma`.
    pub protocol: String,
    /// RDMA device names (for example `mlx5_0`); empty for TCP.
    pub device_name: String,
    /// Bytes of host memory this process contributes to the shared pool. The master places
    /// objects in any mounted segment; those in this one leave the pool when the process
    /// stops. 0 (a client that stores nothing itself) or at least 16 MiB; counts against
    /// `node.memory_budget_bytes` (R9).
    pub global_segment_size_bytes: u64,
    /// Bytes of the client's own transfer buffer, used only by Mooncake's copying calls;
    /// the connector moves pages through its registered staging pools, so a small buffer
    /// is enough.
    pub local_buffer_size_bytes: u64,
    /// The virtual environment with the `mooncake-transfer-engine-non-cuda` wheel
    /// (`scripts/setup-mooncake` makes `.venv`); relative to the working directory.
    pub venv_dir: PathBuf,
    /// Exported as `MC_TCP_BIND_ADDRESS` before the client starts, so the TCP transport
    /// listens on this address only. Empty keeps the process environment's value.
    pub tcp_bind_address: String,
    /// Exported as `MC_LOG_LEVEL` before the client starts (`INFO`, `WARNING`, `ERROR`).
    /// Empty keeps the process environment's value.
    pub log_level: String,
    /// TCP connections per peer (1 to 16): exported as `MC_TCP_ENABLE_CONNECTION_POOL=1`
    /// and `MC_TCP_LANES_PER_PEER` before the client starts, so one batch's transfers to a
    /// peer run on that many sockets. 0 keeps the process environment's values (without
    /// them, Mooncake opens a connection per transfer).
    pub tcp_lanes_per_peer: u32,
    /// Bytes the TCP transport moves per socket read or write: exported as
    /// `MC_TCP_SLICE_SIZE` before the client starts (Mooncake's own default is 64 KiB). 0
    /// keeps the process environment's value; otherwise 4 KiB to 64 MiB.
    pub tcp_slice_size_bytes: u64,
    /// The interpreter's GIL switch interval, in microseconds, set when a client
    /// starts if the interpreter's is longer (`sys.setswitchinterval`; the default of `CPython` is
    /// 5000). Every Mooncake call of the loaders and the saver takes the GIL twice, and
    /// behind a Python thread that keeps it busy (an engine's scheduler or model runner)
    /// each take waits up to this interval (500 takes back what a busy GIL cost the loads
    /// and saves, PERFORMANCE.md). 0 leaves the interpreter's as it is; otherwise 100 to
    /// 5000. Process-wide: the engine's own threads switch as often.
    pub gil_switch_interval_us: u32,
    /// Exported as `MC_RPC_TIMEOUT_MS` and `MC_RPC_CONNECT_TIMEOUT_MS` before the client
    /// starts: how long the client waits for the master on every call (Mooncake's own
    /// default is 30 s). It bounds puts and gets, which run on the loaders' and savers'
    /// threads with the caller's memory and so cannot be abandoned, against a master that
    /// accepts but does not answer (R30).
    pub rpc_timeout_ms: u64,
    /// Longest time starting the client may take (the reachability check, then `setup`
    /// with its retries, which Mooncake otherwise repeats 20 times): past it the start
    /// fails naming this key. `MC_STORE_CLIENT_SETUP_RETRIES` is set so that the retries'
    /// RPC deadlines fit in it.
    pub connect_timeout_ms: u64,
    /// Longest wait for the client to close at shutdown (unmounting its segment, which
    /// Mooncake retries for about 15 s against a dead master); a close still running then
    /// is left to finish in the background and logged. A healthy close takes about two
    /// seconds, and the clients of one process close one after the other.
    pub close_timeout_ms: u64,
}

impl Default for MooncakeConfig {
    fn default() -> Self {
        Self {
            local_hostname: "127.0.0.1".to_owned(),
            metadata_server: String::new(),
            master_address: "127.0.0.1:50051".to_owned(),
            real_client_address: String::new(),
            shared_memory_bytes: 0,
            protocol: "tcp".to_owned(),
            device_name: String::new(),
            global_segment_size_bytes: GIB,
            local_buffer_size_bytes: 16 * MIB,
            venv_dir: PathBuf::from(".venv"),
            tcp_bind_address: "127.0.0.1".to_owned(),
            log_level: "WARNING".to_owned(),
            tcp_lanes_per_peer: 0,
            tcp_slice_size_bytes: 0,
            gil_switch_interval_us: 500,
            rpc_timeout_ms: 2000,
            connect_timeout_ms: 10_000,
            close_timeout_ms: 5000,
        }
    }
}

/// What a dummy client's shared memory holds beyond the staging pools: the fallback buffer
/// (16 MiB), a slot of rounding per staging pool, and room to spare.
pub const MOONCAKE_SHARED_MEMORY_SPARE_BYTES: u64 = 64 * MIB;

impl MooncakeConfig {
    /// Whether this process attaches to a node-local real client (`real_client_address`).
    pub fn is_dummy(&self) -> bool {
        !self.real_client_address.is_empty()
    }

    /// `shared_memory_bytes`, or when it is 0 one rank's staging pools
    /// (`loaders.load_threads * loaders.staging_bytes_per_loader + saver.staging_bytes`)
    /// plus [`MOONCAKE_SHARED_MEMORY_SPARE_BYTES`].
    pub fn effective_shared_memory_bytes(&self, config: &super::Config) -> u64 {
        if self.shared_memory_bytes != 0 {
            return self.shared_memory_bytes;
        }
        let threads = u64::try_from(config.loaders.load_threads).unwrap_or(u64::MAX);
        let loaders = threads.saturating_mul(config.loaders.staging_bytes_per_loader);
        loaders
            .saturating_add(config.saver.staging_bytes)
            .saturating_add(MOONCAKE_SHARED_MEMORY_SPARE_BYTES)
    }

    /// The metadata server to use: `metadata_server`, or when it is empty
    /// `http://HOST:8080/metadata` with the host of `master_address`.
    pub fn effective_metadata_server(&self) -> String {
        if !self.metadata_server.is_empty() {
            return self.metadata_server.clone();
        }
        let host = self
            .master_address
            .rsplit_once(':')
            .map_or(self.master_address.as_str(), |(host, _)| host);
        format!("http://{host}:8080/metadata")
    }
}

/// `[device]`: where the KV pages live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceConfig {
    /// Chosen explicitly rather than sniffed inside the code that allocates, so the
    /// choice shows up in the effective configuration.
    pub kind: DeviceRequest,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            kind: DeviceRequest::Auto,
        }
    }
}

/// `[node]`: limits of the machine this process runs on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Host memory this process may spend on the pool segment and staging pools; start is
    /// refused when they do not fit (R9), instead of failing later under load. 0 skips the
    /// check.
    pub memory_budget_bytes: u64,
}

#[expect(
    clippy::derivable_impls,
    reason = "every section spells out its defaults, so a reader finds them all in one place"
)]
impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            memory_budget_bytes: 0,
        }
    }
}
