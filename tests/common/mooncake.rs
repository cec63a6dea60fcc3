//! The Mooncake install of the real-master tests (`.venv` from `scripts/setup-mooncake`).
//!
//! `scripts/test` installs Mooncake, then builds and runs the tests with
//! `KV_CONNECTOR_REQUIRE_MOONCAKE=1`: a missing or unusable install then fails every
//! real-master test, naming what is missing. Built without it (a developer's `cargo test` without the
//! venv), the tests skip instead, and each test binary says so once, on one line of
//! stderr (written past the test harness's output capture, so it shows).

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Once;

use kv_connector::pool::mooncake::{
    MasterSettings, MooncakeError, MooncakeInstall, MooncakeMaster,
};

/// Whether these tests were built to require Mooncake (`KV_CONNECTOR_REQUIRE_MOONCAKE=1`
/// when cargo compiled them; cargo rebuilds them when it changes). Not a `KVC_` name: those
/// are configuration keys, and the connector refuses an unknown one.
pub fn required() -> bool {
    option_env!("KV_CONNECTOR_REQUIRE_MOONCAKE") == Some("1")
}

/// The venv `scripts/setup-mooncake` makes.
pub fn venv_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv")
}

/// The wheel in [`venv_dir`], or `None` when the tests skip (module docs): then the first
/// call of the test binary says so on stderr.
///
/// # Panics
///
/// When it is missing and [`required`].
pub fn install() -> Option<MooncakeInstall> {
    static NOTICE: Once = Once::new();
    match discover(&venv_dir(), required()) {
        Ok(install) => Some(install),
        Err(err) => {
            NOTICE.call_once(|| {
                let binary = std::env::args().next().unwrap_or_default();
                let _ = writeln!(
                    std::io::stderr(),
                    "{binary}: skipping the real-Mooncake tests: {err} (scripts/setup-mooncake \
                     installs it; built with KV_CONNECTOR_REQUIRE_MOONCAKE=1 this is a failure)"
                );
            });
            None
        }
    }
}

/// The wheel in `venv`, or why it is not usable.
///
/// # Panics
///
/// When it is not usable and `required`, with the reason.
pub fn discover(venv: &Path, required: bool) -> Result<MooncakeInstall, MooncakeError> {
    match MooncakeInstall::discover(venv) {
        Err(err) if required => panic!(
            "the Mooncake install is required (KV_CONNECTOR_REQUIRE_MOONCAKE=1, set by \
             scripts/test) but not usable: {err}; run scripts/setup-mooncake"
        ),
        found => found,
    }
}

/// A listener on loopback that completes TCP handshakes and never answers (the kernel
/// accepts into its backlog): a master or metadata server that is frozen. Keep the
/// listener alive for as long as it must stay silent.
pub fn silent_listener() -> Result<(TcpListener, String), std::io::Error> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?.to_string();
    Ok((listener, address))
}

/// Where the master of test `name` logs: a file under the target's temporary folder.
pub fn master_log(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("mooncake-master-{name}.log"))
}

/// A master on loopback for test `name`, logging to a fresh [`master_log`].
pub fn start_master(
    install: &MooncakeInstall,
    name: &str,
) -> Result<MooncakeMaster, Box<dyn std::error::Error>> {
    let log = master_log(name);
    let _ = std::fs::remove_file(&log);
    Ok(MooncakeMaster::start(MasterSettings {
        log_file: Some(log),
        ..MasterSettings::new(install)
    })?)
}
