//! Errors of the Mooncake backend: [`MooncakeError`] for starting, registering and closing,
//! and the mapping of Mooncake's per-key return codes onto [`PoolError`].
//!
//! Mooncake's batch calls answer one integer per key: `0` (put done), the bytes read (get),
//! `1`/`0` (exists), or a negative `ErrorCode` of `mooncake-store/include/types.h`. The
//! codes this backend gives a meaning of its own are the constants below; every other
//! negative code is [`PoolError::Backend`] with the code kept.

use std::path::PathBuf;
use std::time::Duration;

use crate::pool::PoolError;

/// `INVALID_PARAMS`: among others, a get into a buffer shorter than the object (the buffer
/// is left unwritten) and a put of zero bytes.
pub const INVALID_PARAMS: i32 = -600;
/// `OBJECT_NOT_FOUND`: no object under the key.
pub const OBJECT_NOT_FOUND: i32 = -704;
/// `OBJECT_ALREADY_EXISTS`. The client turns it into `0` for puts (a put of a present key
/// reports success and writes nothing), so the pool probes before it puts.
pub const OBJECT_ALREADY_EXISTS: i32 = -705;
/// `NO_AVAILABLE_HANDLE`: no segment has room right now. The master evicts in the
/// background (every few milliseconds above the high watermark), so a later put succeeds.
pub const NO_AVAILABLE_HANDLE: i32 = -200;
/// `TRANSFER_FAIL`: the transport failed, for example a batch above the per-peer queue.
#[cfg(feature = "internals")]
pub const TRANSFER_FAIL: i32 = -800;
/// `RPC_FAIL`: the master cannot be reached.
pub const RPC_FAIL: i32 = -900;
/// `RPC_TIMEOUT`: the master did not answer before the client's deadline.
pub const RPC_TIMEOUT: i32 = -901;
/// Not a Mooncake code: the Python call itself raised (logged with the exception) or
/// answered a list of the wrong length.
pub const PYTHON_CALL_FAILED: i32 = -99_999;

/// Why the Mooncake backend could not start, register memory, or stop.
#[derive(Debug, thiserror::Error)]
pub enum MooncakeError {
    /// The virtual environment with the wheel is not where the settings say.
    #[error("no mooncake wheel in the virtual environment {venv_dir:?} (looked for {looked_for:?}); run scripts/setup-mooncake, or set venv_dir to a venv with mooncake-transfer-engine-non-cuda installed")]
    VenvMissing {
        /// The configured `venv_dir`.
        venv_dir: PathBuf,
        /// The path that is missing.
        looked_for: PathBuf,
    },
    /// A Python step (adding the venv, importing `mooncake.store`, a client call) raised.
    #[error("python step '{step}' failed: {source}")]
    Python {
        /// What was being done.
        step: &'static str,
        /// The Python exception.
        #[source]
        source: pyo3::PyErr,
    },
    /// `setup` answered a nonzero code: the master or the metadata server is unreachable,
    /// or the segment could not be mounted.
    #[error("mooncake setup returned {code} for master_address = {master_address:?}, metadata_server = {metadata_server:?}; check that mooncake_master runs there with --enable_http_metadata_server=true")]
    Setup {
        /// The code `setup` returned.
        code: i64,
        /// The configured master.
        master_address: String,
        /// The configured metadata server.
        metadata_server: String,
    },
    /// `setup_dummy` answered a nonzero code: no `mooncake_client` serves dummy clients at
    /// `mooncake.real_client_address`, or it could not map the shared memory.
    #[error("mooncake setup_dummy returned {code} for mooncake.real_client_address = {real_client_address:?} (mooncake.shared_memory_bytes = {shared_memory_bytes}); start the node's mooncake_client there (mooncake_client --host=HOST --port=PORT --master_server_address=... --metadata_server=...) or set mooncake.real_client_address = \"\" for a client of this process's own")]
    DummySetup {
        /// The code `setup_dummy` returned.
        code: i64,
        /// The configured real client.
        real_client_address: String,
        /// The shared memory asked for.
        shared_memory_bytes: u64,
    },
    /// A dummy client's shared memory has too little left for a staging pool.
    #[error("the dummy client's shared memory cannot give {asked} more bytes ({used} of mooncake.shared_memory_bytes = {total} taken); raise it, e.g. mooncake.shared_memory_bytes = {suggested}")]
    SharedMemorySpent {
        /// Bytes asked for.
        asked: u64,
        /// Bytes taken before.
        used: u64,
        /// The configured size.
        total: u64,
        /// A size that holds everything taken and asked, with the spare.
        suggested: u64,
    },
    /// The master or the HTTP metadata server does not accept connections (checked before
    /// `setup`, which would otherwise wait about 90 seconds holding the GIL).
    #[error("cannot reach {setting} = {address:?}: {source}; start {} there or fix {setting}", server_of(setting))]
    Unreachable {
        /// `mooncake.master_address` or `mooncake.metadata_server`.
        setting: &'static str,
        /// The address tried.
        address: String,
        /// The connect error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP metadata server accepts connections but gave no HTTP answer (a frozen
    /// master, or another service on that port); checked before `setup`, which would
    /// otherwise fail after its retries blaming the master.
    #[error("mooncake.metadata_server = {metadata_server:?} accepts connections but gave no HTTP answer within {waited_ms} ms ({what}); point it at the master's HTTP metadata server (mooncake_master --enable_http_metadata_server=true), e.g. mooncake.metadata_server={suggested}")]
    MetadataSilent {
        /// The configured metadata server.
        metadata_server: String,
        /// How long the check waited.
        waited_ms: u64,
        /// What came back instead of an answer.
        what: &'static str,
        /// The master's default metadata server (`http://HOST:8080/metadata` of
        /// `master_address`).
        suggested: String,
    },
    /// `register_buffer` or `unregister_buffer` answered a nonzero code.
    #[error("mooncake {call} returned {code} for {len} bytes at {addr:#x}")]
    Register {
        /// `register_buffer` or `unregister_buffer`.
        call: &'static str,
        /// The code returned.
        code: i64,
        /// Start of the region.
        addr: usize,
        /// Length of the region.
        len: usize,
    },
    /// The client did not start within `mooncake.connect_timeout_ms` (a master that accepts
    /// connections but does not answer); the start was abandoned.
    #[error("the mooncake client did not start within {waited_ms} ms (mooncake.connect_timeout_ms) against master_address = {master_address:?}; check that mooncake_master answers there, or raise mooncake.connect_timeout_ms")]
    ConnectTimeout {
        /// How long the start waited.
        waited_ms: u64,
        /// The configured master.
        master_address: String,
    },
    /// A stop was asked for (SIGINT, SIGTERM) while the client was starting; the start was
    /// abandoned.
    #[error("the mooncake client start was stopped before the master answered")]
    Interrupted,
    /// The pool was closed; it takes no more calls.
    #[error("the mooncake client is closed")]
    Closed,
    /// `close` answered a nonzero code.
    #[error("mooncake close returned {code}")]
    Close {
        /// The code returned.
        code: i64,
    },
    /// `close` had not returned after `mooncake.close_timeout_ms` (it unmounts the segment,
    /// which Mooncake retries for a long time against a dead master); it goes on in the
    /// background.
    #[error("the mooncake client had not closed after {waited_ms} ms (mooncake.close_timeout_ms); its close goes on in the background")]
    CloseTimeout {
        /// How long the caller waited.
        waited_ms: u64,
    },
    /// No free loopback port for the master could be found.
    #[error("no free loopback port for mooncake_master: {source}")]
    NoFreePort {
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The master binary could not be started.
    #[error("could not start {binary:?}: {source}; run scripts/setup-mooncake")]
    MasterSpawn {
        /// The binary.
        binary: PathBuf,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// The master exited while starting (its log has why).
    #[error("mooncake_master exited while starting with {status}; see {log:?}")]
    MasterExited {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Where its log went (`None`: discarded; set `log_file` to keep it).
        log: Option<PathBuf>,
    },
    /// The master did not listen on its ports in time.
    #[error(
        "mooncake_master did not listen on {address} within {waited_ms} ms; raise ready_timeout_ms"
    )]
    MasterNotReady {
        /// The address that stayed closed.
        address: String,
        /// How long start waited.
        waited_ms: u64,
    },
    /// A node-local `mooncake_client` this process started exited or did not listen in
    /// time (its log has why).
    #[error("the mooncake_client started for the one-node layout {what}; see {log:?}")]
    RealClientStart {
        /// What went wrong: "exited with ..." or "did not listen on ... within ... ms".
        what: String,
        /// Where its log went.
        log: Option<PathBuf>,
    },
    /// Stopping the master failed.
    #[error("could not stop mooncake_master (pid {pid}): {source}")]
    MasterStop {
        /// The master's process id.
        pid: u32,
        /// The kill or wait error.
        #[source]
        source: std::io::Error,
    },
    /// The master's log file could not be created.
    #[error("could not create the mooncake_master log {path:?}: {source}")]
    MasterLog {
        /// The log path.
        path: PathBuf,
        /// The create error.
        #[source]
        source: std::io::Error,
    },
}

/// What serves at the address `setting` names.
fn server_of(setting: &str) -> &'static str {
    if setting == "mooncake.real_client_address" {
        "the node's mooncake_client"
    } else {
        "mooncake_master"
    }
}

impl MooncakeError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::VenvMissing { .. } => "venv_missing",
            Self::Python { .. } => "python",
            Self::Setup { .. } => "setup",
            Self::DummySetup { .. } => "dummy_setup",
            Self::SharedMemorySpent { .. } => "shared_memory_spent",
            Self::Unreachable { .. } => "unreachable",
            Self::MetadataSilent { .. } => "metadata_silent",
            Self::Register { .. } => "register",
            Self::ConnectTimeout { .. } => "connect_timeout",
            Self::Interrupted => "interrupted",
            Self::Closed => "closed",
            Self::Close { .. } => "close",
            Self::CloseTimeout { .. } => "close_timeout",
            Self::NoFreePort { .. } => "no_free_port",
            Self::MasterSpawn { .. } => "master_spawn",
            Self::MasterExited { .. } => "master_exited",
            Self::MasterNotReady { .. } => "master_not_ready",
            Self::MasterStop { .. } => "master_stop",
            Self::RealClientStart { .. } => "real_client_start",
            Self::MasterLog { .. } => "master_log",
        }
    }

    /// The per-key [`PoolError`] this becomes where the pool trait reports it: a nonzero
    /// code is kept, a closed or unreachable client is [`PoolError::Unavailable`], anything
    /// else is [`PYTHON_CALL_FAILED`].
    pub fn pool_error(&self) -> PoolError {
        match self {
            Self::Register { code, .. }
            | Self::Setup { code, .. }
            | Self::DummySetup { code, .. }
            | Self::Close { code } => {
                PoolError::Backend {
                    code: i32::try_from(*code).unwrap_or(PYTHON_CALL_FAILED),
                }
            }
            Self::Closed | Self::Unreachable { .. } | Self::MetadataSilent { .. } => {
                PoolError::Unavailable
            }
            Self::SharedMemorySpent {
                asked,
                used,
                total,
                suggested,
            } => PoolError::TransferMemory {
                asked: *asked,
                used: *used,
                total: *total,
                key: "mooncake.shared_memory_bytes",
                suggested: *suggested,
            },
            _ => PoolError::Backend {
                code: PYTHON_CALL_FAILED,
            },
        }
    }
}

/// The pool error for a negative code, where it needs no more context.
/// `elapsed` is how long the call took, reported by [`PoolError::Timeout`].
pub fn pool_error(code: i64, elapsed: Duration) -> PoolError {
    let Ok(code) = i32::try_from(code) else {
        return PoolError::Backend {
            code: PYTHON_CALL_FAILED,
        };
    };
    match code {
        OBJECT_NOT_FOUND => PoolError::NotFound,
        OBJECT_ALREADY_EXISTS => PoolError::AlreadyExists,
        RPC_FAIL => PoolError::Unavailable,
        RPC_TIMEOUT => PoolError::Timeout {
            after_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        },
        code => PoolError::Backend { code },
    }
}

/// A put's per-key answer.
pub(crate) fn put_result(code: i64, elapsed: Duration) -> Result<(), PoolError> {
    if code == 0 {
        Ok(())
    } else {
        Err(pool_error(code, elapsed))
    }
}

/// An existence probe's per-key answer: `1` present, `0` absent.
pub(crate) fn exists_result(code: i64, elapsed: Duration) -> Result<bool, PoolError> {
    match code {
        1 => Ok(true),
        0 => Ok(false),
        code if code > 1 => Err(PoolError::Backend {
            code: PYTHON_CALL_FAILED,
        }),
        code => Err(pool_error(code, elapsed)),
    }
}

/// A get's per-key answer: bytes read, which must fit the buffer of `capacity` bytes.
pub(crate) fn get_result(
    code: i64,
    capacity: usize,
    elapsed: Duration,
) -> Result<usize, PoolError> {
    match usize::try_from(code) {
        Ok(read) if read <= capacity => Ok(read),
        Ok(_) => Err(PoolError::Backend {
            code: PYTHON_CALL_FAILED,
        }),
        Err(_) => Err(pool_error(code, elapsed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_TIME: Duration = Duration::ZERO;

    #[test]
    fn known_codes_map_to_their_pool_errors() {
        assert_eq!(pool_error(-704, NO_TIME), PoolError::NotFound);
        assert_eq!(pool_error(-705, NO_TIME), PoolError::AlreadyExists);
        assert_eq!(pool_error(-900, NO_TIME), PoolError::Unavailable);
        assert_eq!(
            pool_error(-901, Duration::from_millis(1500)),
            PoolError::Timeout { after_ms: 1500 }
        );
        assert_eq!(pool_error(-200, NO_TIME), PoolError::Backend { code: -200 });
        assert_eq!(
            pool_error(i64::MIN, NO_TIME),
            PoolError::Backend {
                code: PYTHON_CALL_FAILED
            }
        );
    }

    #[test]
    fn per_call_results_read_success_values() {
        assert_eq!(put_result(0, NO_TIME), Ok(()));
        assert_eq!(
            put_result(-800, NO_TIME),
            Err(PoolError::Backend { code: -800 })
        );
        assert_eq!(exists_result(1, NO_TIME), Ok(true));
        assert_eq!(exists_result(0, NO_TIME), Ok(false));
        assert_eq!(exists_result(-900, NO_TIME), Err(PoolError::Unavailable));
        assert!(exists_result(2, NO_TIME).is_err());
        assert_eq!(get_result(100, 100, NO_TIME), Ok(100));
        assert_eq!(get_result(-704, 100, NO_TIME), Err(PoolError::NotFound));
        assert!(
            get_result(101, 100, NO_TIME).is_err(),
            "more than the buffer"
        );
    }

    #[test]
    fn start_errors_become_per_key_pool_errors_keeping_the_code() {
        let register = MooncakeError::Register {
            call: "register_buffer",
            code: -600,
            addr: 0x1000,
            len: 64,
        };
        assert_eq!(
            register.pool_error(),
            PoolError::Backend {
                code: INVALID_PARAMS
            }
        );
        assert_eq!(MooncakeError::Closed.pool_error(), PoolError::Unavailable);
        assert_eq!(
            MooncakeError::Close { code: i64::MIN }.pool_error(),
            PoolError::Backend {
                code: PYTHON_CALL_FAILED
            }
        );
    }

    #[test]
    fn messages_name_the_fix() {
        let message = MooncakeError::VenvMissing {
            venv_dir: ".venv".into(),
            looked_for: ".venv/lib".into(),
        }
        .to_string();
        assert!(message.contains("scripts/setup-mooncake"), "{message}");
        let message = MooncakeError::Setup {
            code: -1,
            master_address: "127.0.0.1:1".into(),
            metadata_server: "http://127.0.0.1:2/metadata".into(),
        }
        .to_string();
        assert!(message.contains("master_address"), "{message}");
    }
}
