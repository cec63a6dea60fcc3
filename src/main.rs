//! The `kv-connector` binary: parses the command line, sets up logging and hands over to
//! [`kv_connector::cli::run`]. Everything else lives in the library.
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `warn`), as text or JSON lines
//! (`--log-format`, see [`kv_connector::logging`]); stdout carries only the subcommand's
//! output. Errors print as `error: ...` with their causes, and the process exits with
//! status 1 (clap's usage errors exit with 2); a replay stopped by SIGINT or SIGTERM exits
//! with 130 or 143 after its partial report, and a replay that failed its checks exits with
//! 3 after its whole report ([`cli::CliError::exit_code`]).

use std::process::ExitCode;

use clap::Parser;
use kv_connector::cli::{self, Cli};
use kv_connector::logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = logging::init(cli.log_format) {
        eprintln!("error: {:#}", anyhow::Error::from(err));
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
