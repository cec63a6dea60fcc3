//! The Mooncake Store pool backend (`docs/DESIGN.md` section 10; cargo feature `mooncake`).
//!
//! [`MooncakePool`] implements [`Pool`](crate::pool::Pool) over the Mooncake Store client
//! of the Python package index wheel `mooncake-transfer-engine-non-cuda`, driven in-process through `pyo3`: an
//! embedded `CPython` 3.11 (shared `libpython`) with the wheel's virtual environment added at
//! start, or, inside the `kv_connector` Python extension, the host interpreter. [`MooncakeMaster`] runs a `mooncake_master` on loopback for tests and for
//! `replay --pool mooncake` without `--master`.
//!
//! ```text
//!  Pool calls (any thread)        MooncakePool                     mooncake_master
//!  exists / touch ───────────► batch_is_exist, chunks concurrent ──► metadata RPC (lease)
//!  put ─────────► probe, then batch_put_from (<= 1024 keys/call) ──► alloc in a segment
//!  get_into ─────► batch_get_into (<= 1024 keys/call) ─────────────► replica lookup
//!                        │  registered buffer: direct
//!                        └─ other buffer: copied through the fallback staging buffer
//!  lend_staging ─► a dummy client's shared memory (alloc_from_mem_pool), for staging
//! ```
//!
//! Two layouts. By default each process runs a client of its own that contributes a
//! segment and moves data over TCP (or RDMA). With `real_client_address` the process is a
//! dummy client (`setup_dummy`) of the node's `mooncake_client`, which holds the segment;
//! data then moves only through the shared memory they map together, so every staging
//! pool and the fallback buffer are leased from it (`shared.rs`; `MooncakeRealClient`
//! starts one for tests and `replay --real-client`).
//!
//! # Workflow
//!
//! 1. `scripts/setup-mooncake` makes `.venv` (Python 3.11, the wheel) and installs
//!    `libibverbs1`; build with `PYO3_PYTHON=.venv/bin/python` (`build.rs` puts libpython's
//!    folder in the run path).
//! 2. Either start a master ([`MooncakeMaster::start`], then
//!    [`MooncakeMaster::client_settings`]) or point [`MooncakeSettings::master_address`] and
//!    [`MooncakeSettings::metadata_server`] at a running one.
//!    The start checks both first (`reach.rs`): a metadata server that accepts and never
//!    answers is named at once instead of failing `setup` in the master's name.
//! 3. [`MooncakePool::connect`], within `connect_timeout_ms`
//!    ([`MooncakePool::connect_until`] also gives up when asked to); register the loaders'
//!    and the saver's staging pools once with [`MooncakePool::register_buffer`]; share the
//!    pool as `Arc<dyn Pool>`.
//! 4. At shutdown, [`MooncakePool::close`] on a thread that may block (about two seconds,
//!    GIL held), or [`MooncakePool::close_within`] a deadline; then stop the master if this
//!    process started it.
//!
//! # Invariants
//!
//! - `mooncake::I1`. Lock then GIL: no thread waits on a Rust lock while holding the GIL
//!   (`client.rs`).
//! - `mooncake::I2`. At most `max_keys_per_call` keys per put or get call (`pool.rs`).
//! - `mooncake::I3`. One result per key in key order, even when a call raises or the master is
//!   gone.
//! - `mooncake::I4`. Pointers cross to Python as integers and this module never dereferences
//!   them. Its one `unsafe` item is the lender's promise behind a dummy client's shared
//!   memory (`shared.rs`, an `unsafe impl` of `gpu::LentHostMemory`); `gpu::lent` turns the
//!   lease into bytes.
//!
//! # Failure behaviour
//!
//! A stopped master turns calls into per-key errors ([`PoolError::Unavailable`] for
//! Mooncake's `RPC_FAIL`), each after about 4.5 s of reconnecting (no setting changes it); a
//! frozen master (one that accepts and never answers) turns them into `RPC_TIMEOUT` after
//! `rpc_timeout_ms` (exported as `MC_RPC_TIMEOUT_MS`). The connector's guarded pool
//! (`crate::pool::guard`) keeps probes within their own deadline and stops calling a pool it
//! found unreachable (R30). After the master restarts on the same address the same client
//! works again once its heartbeat re-mounts its segment (about a second); until then puts
//! answer `NO_AVAILABLE_HANDLE` (the saver counts those pages `saves_no_space`, and the
//! guard reads the pool `degraded` until a put stores). A new client is not needed.
//! Against a dead master `close` takes 11-17 s (its unmount retries), and the library's
//! exit handler tears down every client still open the same way, so a process's exit waits
//! for it. Against a frozen one each `unregister_buffer` waits about 3 s (its metadata
//! update) with the GIL released, so the connector unregisters its staging pools at once.
//!
//! A dummy client whose real client has stopped closes in about two seconds, GIL held; the
//! last shared-memory lease destroys it under the GIL at once (`shared.rs`), so that wait
//! falls on the thread that lets go of the staging, never later on another.
//!
//! [`PoolError::Unavailable`]: crate::pool::PoolError::Unavailable

mod client;
mod contract;
mod counters;
pub mod error;
mod glog;
mod lifecycle;
#[cfg(any(feature = "replay", feature = "internals"))]
mod master;
mod pool;
mod python;
mod reach;
#[cfg(any(feature = "replay", feature = "internals"))]
mod real_client;
mod settings;
mod shared;
mod staging;

pub use error::MooncakeError;
#[cfg(feature = "internals")]
pub use master::MasterPorts;
#[cfg(any(feature = "replay", feature = "internals"))]
pub use master::{MasterSettings, MooncakeMaster};
pub use pool::MooncakePool;
#[cfg(feature = "internals")]
pub use python::ensure_interpreter;
#[cfg(any(feature = "replay", feature = "internals"))]
pub use python::MooncakeInstall;
#[cfg(any(feature = "replay", feature = "internals"))]
pub use real_client::{MooncakeRealClient, RealClientSettings};
pub use settings::MooncakeSettings;
