//! Where the transfer engine's own log lines go. The Mooncake client logs through the glog
//! library its wheel bundles; left alone, glog writes every line to the process's stderr
//! (healthy runs print `http=404 metadata not found` and similar lines, and they break
//! `--log-format json` pipelines, since they are not JSON).
//!
//! [`route_to_files`] initialises that glog once per process, before the first client
//! starts: its lines go to files in a folder of the temporary directory (one file per
//! severity, named by glog), only FATAL lines still reach stderr, and the folder is
//! announced once at INFO on the `logging::ANNOUNCE` target. A wheel without a bundled glog
//! leaves logging as it is.
//!
//! ## Invariants
//!
//! - `mooncake::glog::I1`. glog is initialised at most once per process (a second
//!   `InitGoogleLogging` aborts); a failed attempt is not retried.

use std::path::PathBuf;
use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The log folder once routing was attempted (`None`: left as it is) (`mooncake::glog::I1`).
static ROUTED: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Finds the wheel's bundled glog next to the `mooncake` package, initialises it with its
/// log folder and raises its stderr threshold to FATAL. Returns the folder, or `None`
/// when the wheel bundles no glog.
const ROUTE: &std::ffi::CStr = c"
import ctypes, glob, os
os.makedirs(log_dir, exist_ok=True)
os.environ['GLOG_log_dir'] = log_dir  # read by glog when it loads, with the package below
import mooncake
found = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(mooncake.__file__)),
    '*.libs', 'libglog-*.so*')))
routed = None
if found:
    lib = ctypes.CDLL(found[0])
    lib._ZN6google17InitGoogleLoggingEPKc(b'kv-connector-mooncake')
    ctypes.c_int32.in_dll(lib, '_ZN3fLI21FLAGS_stderrthresholdE').value = 3
    routed = log_dir
";

/// Routes the transfer engine's glog lines to files (module docs); call with the
/// interpreter attached, after the wheel's site-packages are importable.
pub(super) fn route_to_files(py: Python<'_>) -> Option<PathBuf> {
    ROUTED
        .get_or_init(|| {
            let log_dir = std::env::temp_dir()
                .join(format!("kv-connector-mooncake-{}", std::process::id()));
            let routed = run_route(py, &log_dir);
            match &routed {
                Ok(Some(dir)) => tracing::info!(
                    target: crate::logging::ANNOUNCE,
                    dir = %dir.display(),
                    "mooncake transfer engine log lines go to files in this folder"
                ),
                Ok(None) => tracing::debug!("the mooncake wheel bundles no glog; its log is left as it is"),
                Err(err) => tracing::warn!(error = %err, "could not route the mooncake transfer engine's log to files"),
            }
            routed.ok().flatten()
        })
        .clone()
}

fn run_route(py: Python<'_>, log_dir: &std::path::Path) -> PyResult<Option<PathBuf>> {
    let globals = PyDict::new(py);
    globals.set_item("log_dir", log_dir.to_string_lossy().as_ref())?;
    py.run(ROUTE, Some(&globals), None)?;
    let routed = globals.get_item("routed")?;
    Ok(match routed {
        Some(value) if !value.is_none() => Some(value.extract()?),
        _ => None,
    })
}
