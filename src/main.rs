//! The `kv-connector` binary: parses the command line, sets up logging and hands over to
//! [`kv_connector::cli::run`]. Everything else lives in the library (STYLE G1).
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `warn`); stdout carries only the
//! subcommand's output. Errors print as `error: ...` with their causes, and the process exits
//! with status 1 (clap's usage errors exit with 2); a replay stopped by SIGINT or SIGTERM
//! exits with 130 or 143 after its partial report ([`cli::CliError::exit_code`]).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use kv_connector::cli::{self, Cli};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = init_tracing() {
        eprintln!("error: {err:#}");
        return ExitCode::FAILURE;
    }
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let code = err.exit_code();
            eprintln!("error: {:#}", anyhow::Error::from(err));
            ExitCode::from(code)
        }
    }
}

/// Sends logs to stderr, filtered by `RUST_LOG`, warnings and errors by default.
fn init_tracing() -> anyhow::Result<()> {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .map_err(|err| anyhow::anyhow!(err))
}
