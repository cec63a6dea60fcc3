//! The `kv-connector` subcommands.
//!
//! `main.rs` parses a [`Cli`], sets up logging and calls [`run`]; each subcommand lives in
//! its own file with its arguments (`clap::Args`), its typed error and a function that takes
//! its input and output as `Read` / `Write`, so it is tested without a process.
//!
//! Adding a subcommand: add a module, a variant of [`Command`] holding its `Args`, a variant of
//! [`CliError`] wrapping its error, and an arm in [`run`] and in [`CliError::kind`].

pub mod keys;
pub mod replay;

use std::io;

use crate::config::ConfigSources;

/// The command line of the `kv-connector` binary.
#[derive(Debug, clap::Parser)]
#[command(name = "kv-connector", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print the chain hash and the pool keys of every full block of a token list (R1, R3).
    Keys(keys::KeysArgs),
    /// Replay a workload through simulated serving instances sharing one pool, and report
    /// the prefix reuse, page checks and simulated latency the connector achieved.
    Replay(Box<replay::ReplayArgs>),
}

/// Why a subcommand failed; one variant per subcommand.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// `kv-connector keys` failed.
    #[error(transparent)]
    Keys(#[from] keys::KeysError),
    /// `kv-connector replay` failed.
    #[error(transparent)]
    Replay(#[from] replay::ReplayCliError),
}

impl CliError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Keys(err) => err.kind(),
            Self::Replay(err) => err.kind(),
        }
    }
}

/// Runs the parsed command line against the process's stdin and stdout.
///
/// # Errors
///
/// The failed subcommand's error, wrapped in [`CliError`].
pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Keys(args) => keys::run(&args, io::stdin().lock(), io::stdout().lock())?,
        Command::Replay(args) => replay::run(
            &args,
            ConfigSources::from_process_env().env,
            &mut io::stdout().lock(),
            // Not locked for the whole run: actor threads log to stderr meanwhile, and a
            // lock held here made their first warning wait for the replay, which waited
            // for them (a deadlock found by the fault soak, issue 8).
            &mut io::stderr(),
        )?,
    }
    Ok(())
}
