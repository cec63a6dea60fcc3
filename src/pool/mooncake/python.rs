//! Embedding: finding the Mooncake wheel in a virtual environment and making it importable
//! in this process's Python. A binary has no interpreter until the first client starts one
//! ([`prepare`] initializes it); inside the Python extension the host interpreter is
//! already running and is used as it is.
//!
//! # Workflow
//!
//! 1. [`MooncakeInstall::discover`] finds `<venv>/lib/python3.X/site-packages/mooncake`
//!    and the `mooncake_master` binary the wheel ships beside the client; no Python runs.
//! 2. [`prepare`] (called by every client start) starts the interpreter if this process
//!    has none yet ([`ensure_interpreter`]), checks that the venv was made for the
//!    interpreter's version, adds its site-packages once (`site.addsitedir`, so its
//!    `.pth` files apply), exports the transfer engine's environment (`MC_TCP_BIND_ADDRESS`,
//!    `MC_LOG_LEVEL`, `MC_RPC_TIMEOUT_MS`, `MC_RPC_CONNECT_TIMEOUT_MS`,
//!    `MC_STORE_CLIENT_SETUP_RETRIES`) through `os.environ`, shortens the interpreter's GIL
//!    switch interval if `gil_switch_interval_us` asks it, and imports `mooncake.store`.
//!
//! # Invariants
//!
//! - `mooncake::python::I1`. The registry lock is taken before the interpreter is entered, never
//!   while inside it (the lock-then-GIL order of the whole backend; see `client.rs`).
//! - `mooncake::python::I2`. A site-packages folder is added to `sys.path` at most once per
//!   process.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::{MooncakeError, MooncakeSettings};

/// Site-packages folders already added to the embedded interpreter (`mooncake::python::I2`).
static ADDED_SITE_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Where the wheel is installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MooncakeInstall {
    /// The virtual environment.
    pub venv_dir: PathBuf,
    /// Its site-packages folder (the one holding `mooncake/`).
    pub site_packages: PathBuf,
    /// The `mooncake_master` binary shipped in the wheel.
    pub master_binary: PathBuf,
}

impl MooncakeInstall {
    /// Finds the wheel under `venv_dir`.
    ///
    /// # Errors
    ///
    /// [`MooncakeError::VenvMissing`] when no `lib/python3.*/site-packages/mooncake` with a
    /// `mooncake_master` exists there.
    pub fn discover(venv_dir: &Path) -> Result<Self, MooncakeError> {
        let lib = venv_dir.join("lib");
        let missing = |looked_for: PathBuf| MooncakeError::VenvMissing {
            venv_dir: venv_dir.to_path_buf(),
            looked_for,
        };
        let Ok(entries) = std::fs::read_dir(&lib) else {
            return Err(missing(lib));
        };
        let mut candidates: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("python3"))
            .map(|entry| entry.path().join("site-packages"))
            .filter(|site_packages| {
                site_packages
                    .join("mooncake")
                    .join("mooncake_master")
                    .is_file()
            })
            .collect();
        candidates.sort();
        let Some(site_packages) = candidates.pop() else {
            return Err(missing(
                lib.join("python3.11/site-packages/mooncake/mooncake_master"),
            ));
        };
        Ok(Self {
            venv_dir: venv_dir.to_path_buf(),
            master_binary: site_packages.join("mooncake").join("mooncake_master"),
            site_packages,
        })
    }
}

/// Makes `mooncake.store` importable in the embedded interpreter and exports the transfer
/// engine's environment from `settings`. Idempotent; cheap after the first call.
///
/// # Errors
///
/// [`MooncakeError::VenvMissing`] when the wheel is not in `settings.venv_dir` or the venv
/// belongs to another Python version; [`MooncakeError::Python`] when a step raises.
pub fn prepare(settings: &MooncakeSettings) -> Result<MooncakeInstall, MooncakeError> {
    let install = MooncakeInstall::discover(&settings.venv_dir)?;
    ensure_interpreter();
    let mut added = ADDED_SITE_DIRS.lock(); // `mooncake::python::I1`: before the interpreter
    Python::attach(|py| {
        let version = py.version_info();
        let expected = install
            .venv_dir
            .join("lib")
            .join(format!("python{}.{}", version.major, version.minor))
            .join("site-packages");
        if expected != install.site_packages {
            return Err(MooncakeError::VenvMissing {
                venv_dir: install.venv_dir.clone(),
                looked_for: expected,
            });
        }
        if !added.contains(&install.site_packages) {
            py.import("site")
                .and_then(|site| site.call_method1("addsitedir", (&install.site_packages,)))
                .map_err(python_error("add the venv's site-packages"))?;
            added.push(install.site_packages.clone());
        }
        export_environment(py, settings).map_err(python_error("export MC_* variables"))?;
        shorten_switch_interval(py, settings.gil_switch_interval_us)
            .map_err(python_error("set the GIL switch interval"))?;
        super::glog::route_to_files(py);
        py.import("mooncake.store")
            .map_err(python_error("import mooncake.store"))?;
        Ok(())
    })?;
    Ok(install)
}

/// Starts the embedded interpreter unless one runs already: a binary has none until its
/// first client, a Python extension runs inside its host's (then this does nothing).
/// Idempotent and cheap; every entry into Python in this backend comes after it.
pub fn ensure_interpreter() {
    Python::initialize();
}

/// Sets the variables the transfer engine and the store client read when a client starts:
/// where TCP listens, the log level, the TCP lanes and slice size, the master RPC deadlines
/// and the setup retries (R30).
fn export_environment(py: Python<'_>, settings: &MooncakeSettings) -> PyResult<()> {
    let environ = py.import("os")?.getattr("environ")?;
    for (name, value) in optional_environment(settings) {
        environ.set_item(name, value)?;
    }
    let rpc_timeout_ms = settings.rpc_timeout_ms.to_string();
    for (name, value) in [
        ("MC_RPC_TIMEOUT_MS", rpc_timeout_ms.clone()),
        ("MC_RPC_CONNECT_TIMEOUT_MS", rpc_timeout_ms),
        (
            "MC_STORE_CLIENT_SETUP_RETRIES",
            settings.setup_retries().to_string(),
        ),
    ] {
        environ.set_item(name, value)?;
    }
    Ok(())
}

/// Sets the interpreter's GIL switch interval to `interval_us` if it is longer now (0: leave
/// it). Every Mooncake call from a runtime thread takes the GIL twice (to start, and to
/// return after Mooncake's wait); behind a Python thread that holds it, each take waits
/// until the interpreter asks that thread to let go, one switch interval later.
fn shorten_switch_interval(py: Python<'_>, interval_us: u32) -> PyResult<()> {
    if interval_us == 0 {
        return Ok(());
    }
    let sys = py.import("sys")?;
    let now: f64 = sys.call_method0("getswitchinterval")?.extract()?;
    let wanted = f64::from(interval_us) / 1e6;
    if now > wanted {
        sys.call_method1("setswitchinterval", (wanted,))?;
        tracing::info!(
            from_us = (now * 1e6).round(),
            to_us = interval_us,
            "set the interpreter's GIL switch interval (mooncake.gil_switch_interval_us)"
        );
    }
    Ok(())
}

/// The variables of the settings that may leave the process environment as it is: a
/// setting that is empty or 0 exports nothing.
fn optional_environment(settings: &MooncakeSettings) -> Vec<(&'static str, String)> {
    let mut exported = Vec::new();
    for (name, value) in [
        ("MC_TCP_BIND_ADDRESS", &settings.tcp_bind_address),
        ("MC_LOG_LEVEL", &settings.log_level),
    ] {
        if !value.is_empty() {
            exported.push((name, value.clone()));
        }
    }
    if settings.tcp_lanes_per_peer > 0 {
        exported.push(("MC_TCP_ENABLE_CONNECTION_POOL", "1".to_owned()));
        exported.push(("MC_TCP_LANES_PER_PEER", settings.tcp_lanes_per_peer.to_string()));
    }
    if settings.tcp_slice_size_bytes > 0 {
        exported.push(("MC_TCP_SLICE_SIZE", settings.tcp_slice_size_bytes.to_string()));
    }
    exported
}

/// Wraps a Python exception of `step` as a [`MooncakeError`].
pub(crate) fn python_error(step: &'static str) -> impl Fn(PyErr) -> MooncakeError {
    move |source| MooncakeError::Python { step, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kvc-mooncake-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn zero_lanes_and_slice_size_leave_the_environment_as_it_is() {
        let set = optional_environment(&MooncakeSettings {
            tcp_lanes_per_peer: 8,
            tcp_slice_size_bytes: 1 << 20,
            ..MooncakeSettings::default()
        });
        assert!(set.contains(&("MC_TCP_ENABLE_CONNECTION_POOL", "1".to_owned())));
        assert!(set.contains(&("MC_TCP_LANES_PER_PEER", "8".to_owned())));
        assert!(set.contains(&("MC_TCP_SLICE_SIZE", "1048576".to_owned())));
        let kept = optional_environment(&MooncakeSettings {
            tcp_bind_address: String::new(),
            log_level: String::new(),
            ..MooncakeSettings::default()
        });
        assert!(kept.is_empty(), "the defaults keep Mooncake's own: {kept:?}");
    }

    #[test]
    fn a_missing_venv_names_the_setup_script() {
        let dir = scratch_dir("missing");
        let err = MooncakeInstall::discover(&dir).expect_err("no venv there");
        assert_eq!(err.kind(), "venv_missing");
        assert!(err.to_string().contains("scripts/setup-mooncake"), "{err}");
    }

    #[test]
    fn discover_finds_the_master_beside_the_client() -> Result<(), Box<dyn std::error::Error>> {
        let dir = scratch_dir("fake");
        let package = dir.join("lib/python3.11/site-packages/mooncake");
        std::fs::create_dir_all(&package)?;
        std::fs::write(package.join("mooncake_master"), b"")?;
        std::fs::create_dir_all(dir.join("lib/python3.10/site-packages"))?;
        let install = MooncakeInstall::discover(&dir)?;
        assert_eq!(
            install.site_packages,
            dir.join("lib/python3.11/site-packages")
        );
        assert_eq!(install.master_binary, package.join("mooncake_master"));
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
