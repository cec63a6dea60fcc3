//! The `kv-connector` subcommands.
//!
//! `main.rs` parses a [`Cli`], sets up logging and calls [`run`]; each subcommand lives in
//! its own file with its arguments (`clap::Args`), its typed error and a function that takes
//! its input and output as `Read` / `Write`, so it is tested without a process.
//!
//! `replay` stops gracefully on SIGINT / SIGTERM ([`signals`]): it prints its partial report
//! on stderr and fails with [`replay::ReplayCliError::Interrupted`], whose
//! [`CliError::exit_code`] is 130 / 143. A replay that ran to its end but failed its
//! checks (a mismatched page, a page published past its chunk end, accounting that does
//! not close) writes its whole report, then fails with
//! [`replay::ReplayCliError::ChecksFailed`]: exit status 3.
//!
//! Adding a subcommand: add a module, a variant of [`Command`] holding its `Args`, a variant of
//! [`CliError`] wrapping its error, and an arm in [`run`] and in [`CliError::kind`].

internal_modules! {
    mod bench;
    mod engine_args_file;
    mod inspect;
    mod keys;
    mod replay;
    mod signals;
    mod validate;
}

use std::io;

use crate::config::ConfigSources;
use crate::logging::LogFormat;

/// The cargo features a build can carry that change what the binary can do, and whether
/// this build has each.
pub const BUILD_FEATURES: &[(&str, bool)] = &[
    ("cuda", cfg!(feature = "cuda")),
    ("mooncake", cfg!(feature = "mooncake")),
    ("faults", cfg!(feature = "faults")),
];

/// `--version`: the version and the features of [`BUILD_FEATURES`] this build has, so a
/// copied binary can be checked before a run that needs one (`cuda: no` refuses
/// `replay --device cuda`).
fn long_version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let features: Vec<String> = BUILD_FEATURES
            .iter()
            .map(|(name, on)| format!("{name}: {}", if *on { "yes" } else { "no" }))
            .collect();
        format!("{} ({})", env!("CARGO_PKG_VERSION"), features.join(", "))
    })
}

/// The command line of the `kv-connector` binary.
#[derive(Debug, clap::Parser)]
#[command(name = "kv-connector", version, long_version = long_version(), about, long_about = None)]
pub struct Cli {
    /// Log lines on stderr: text (`key=value` fields) or json (one object per line). Filter
    /// with `RUST_LOG`, e.g. `RUST_LOG=info` for the periodic stats reports.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        env = "KVC_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
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
    /// Load the configuration (file, KVC_* environment, flags), the layout and optional
    /// engine arguments as the runtime would; print the effective configuration as TOML and
    /// every refusal. Exits 1 when anything is refused.
    Validate(validate::ValidateArgs),
    /// Show where a prompt's blocks live in a pool: per group and shard, which blocks and
    /// window tails are present, and what a lookup would offer (the real planner), with its
    /// outcome.
    Inspect(Box<inspect::InspectArgs>),
    /// Run the connector's own micro-benchmarks (hashing, keys, planner, embedded pool
    /// get/put) and print a table or JSON.
    Bench(bench::BenchArgs),
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
    /// The signal handlers could not be installed.
    #[error("installing the sigint / sigterm handlers failed")]
    Signals(#[source] io::Error),
    /// `kv-connector validate` failed or refused something.
    #[error(transparent)]
    Validate(#[from] validate::ValidateError),
    /// `kv-connector inspect` failed.
    #[error(transparent)]
    Inspect(Box<inspect::InspectError>),
    /// `kv-connector bench` failed.
    #[error(transparent)]
    Bench(#[from] bench::BenchError),
}

impl From<inspect::InspectError> for CliError {
    fn from(err: inspect::InspectError) -> Self {
        Self::Inspect(Box::new(err))
    }
}

impl CliError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Keys(err) => err.kind(),
            Self::Replay(err) => err.kind(),
            Self::Signals(_) => "signals",
            Self::Validate(err) => err.kind(),
            Self::Inspect(err) => err.kind(),
            Self::Bench(err) => err.kind(),
        }
    }

    /// The process exit status for this error: 128 + the signal number for a run stopped
    /// by a signal (130 for SIGINT, 143 for SIGTERM), 3 for a replay that failed its checks,
    /// 1 otherwise (`replay --help` lists them).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Replay(
                replay::ReplayCliError::Interrupted { signal, .. }
                | replay::ReplayCliError::StoppedWhileStarting { signal },
            ) => signal.exit_code(),
            Self::Replay(replay::ReplayCliError::ChecksFailed(_)) => 3,
            _ => 1,
        }
    }
}

/// Runs the parsed command line against the process's stdin and stdout; `replay` installs
/// the SIGINT / SIGTERM handlers first.
///
/// # Errors
///
/// The failed subcommand's error, wrapped in [`CliError`]; [`CliError::Signals`] when the
/// handlers cannot be installed.
pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Keys(args) => keys::run(&args, io::stdin().lock(), io::stdout().lock())?,
        Command::Replay(args) => {
            let stop = signals::StopSignal::install().map_err(CliError::Signals)?;
            replay::run_until_stopped(
                &args,
                ConfigSources::from_process_env().env,
                &stop,
                &mut io::stdout().lock(),
                // Not locked: log lines from the connector's threads also go to stderr, and a
                // lock held for the whole replay would block them, and the replay waiting on
                // them, forever (a deadlock).
                &mut io::stderr(),
            )?;
        }
        Command::Validate(args) => validate::run(
            &args,
            ConfigSources::from_process_env().env,
            &mut io::stdout().lock(),
            &mut io::stderr().lock(),
        )?,
        Command::Inspect(args) => inspect::run(
            &args,
            ConfigSources::from_process_env().env,
            &mut io::stdout().lock(),
        )?,
        Command::Bench(args) => bench::run(&args, &mut io::stdout().lock())?,
    }
    Ok(())
}
