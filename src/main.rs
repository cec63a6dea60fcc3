//! The `kv-connector` binary: parses the command line, sets up logging and hands over to
//! [`kv_connector::cli::run`]. Everything else lives in the library (STYLE G1).
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `warn`), as text or JSON lines
//! (`--log-format`, see [`kv_connector::logging`]); stdout carries only the subcommand's
//! output. Errors print as `error: ...` with their causes, and the process exits
//! with status 1 (clap's usage errors exit with 2).

use std::process::ExitCode;

use clap::Parser;
use kv_connector::cli::{self, Cli};
use kv_connector::logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let started = logging::init(cli.log_format)
        .map_err(anyhow::Error::from)
        .and_then(|()| cli::run(cli).map_err(anyhow::Error::from));
    match started {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
