//! Build script. Does nothing unless the `mooncake` feature is on; then it adds the folder
//! of the embedded Python's shared libpython to the run path of every binary, test and
//! bench, so they start without `LD_LIBRARY_PATH` (the interpreter is the one `PYO3_PYTHON`
//! names; `scripts/setup-mooncake` prints it).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "mooncake")]
    pyo3_build_config::add_libpython_rpath_link_args();
}
