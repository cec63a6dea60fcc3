//! `--help` of every subcommand: each flag is explained, and `replay --help` alone is
//! enough to run a Mooncake replay: the commands it shows parse with the values they name,
//! and the exit statuses it lists are the ones the binary exits with.
#![cfg(feature = "cli")]

use clap::{CommandFactory, Parser};
use kv_connector::cli::Cli;

#[test]
fn every_flag_of_every_subcommand_has_help_text() {
    let mut cli = Cli::command();
    cli.build();
    let mut missing = Vec::new();
    for sub in cli.get_subcommands() {
        for arg in sub.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let text = arg.get_help().map(ToString::to_string).unwrap_or_default();
            if text.trim().len() < 10 {
                missing.push(format!("{} --{id}", sub.get_name()));
            }
        }
    }
    assert!(missing.is_empty(), "flags without help: {missing:?}");
}

/// `--version` names the features the binary was built with (a bundle checks it before a
/// GPU run).
#[test]
fn long_version_names_the_build_features() {
    let long = Cli::command().render_long_version();
    for (name, on) in [
        ("cuda", cfg!(feature = "cuda")),
        ("mooncake", cfg!(feature = "mooncake")),
        ("faults", cfg!(feature = "faults")),
    ] {
        let expected = format!("{name}: {}", if on { "yes" } else { "no" });
        assert!(long.contains(&expected), "{long:?} lacks {expected:?}");
    }
}

#[test]
fn replay_help_explains_a_mooncake_run_and_the_env_names() {
    let mut cli = Cli::command();
    let help = cli
        .find_subcommand_mut("replay")
        .map(|sub| sub.render_long_help().to_string())
        .unwrap_or_default();
    for needle in [
        "scripts/setup-mooncake",
        "--features mooncake",
        "--pool mooncake",
        "--master",
        "KVC_MOONCAKE_MASTER_ADDRESS",
        "KVC_POOL_BACKEND",
        "KVC_<SECTION>_<KEY>",
        "--report-dir",
    ] {
        assert!(help.contains(needle), "replay --help lacks {needle}");
    }
}

#[test]
fn the_new_subcommands_are_listed() {
    let names: Vec<String> = Cli::command()
        .get_subcommands()
        .map(|sub| sub.get_name().to_owned())
        .collect();
    for name in ["keys", "replay", "validate", "inspect", "bench"] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} missing from {names:?}"
        );
    }
}

/// The long help of `replay`.
fn replay_help() -> String {
    let mut cli = Cli::command();
    cli.find_subcommand_mut("replay")
        .map(|sub| sub.render_long_help().to_string())
        .unwrap_or_default()
}

/// Every `kv-connector replay` command `replay --help` shows (continuation lines joined,
/// comments dropped) parses, with the values it names.
#[test]
fn the_commands_replay_help_shows_parse_with_their_values() -> Result<(), Box<dyn std::error::Error>>
{
    use kv_connector::cli::Command;
    use kv_connector::config::PoolBackend;

    let help = replay_help();
    let joined = help.replace("\\\n", " ");
    let commands: Vec<Vec<&str>> = joined
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter_map(|line| line.strip_prefix("target/release/"))
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(commands.len(), 2, "{help}");
    for words in &commands {
        let Command::Replay(args) = Cli::try_parse_from(words)?.command else {
            return Err(format!("{words:?} is not a replay").into());
        };
        assert_eq!(args.pool, Some(PoolBackend::Mooncake), "{words:?}");
    }
    let Command::Replay(traced) = Cli::try_parse_from(&commands[0])?.command else {
        return Err("not a replay".into());
    };
    assert_eq!(traced.instances, 2);
    assert_eq!(traced.limit, Some(150));
    assert_eq!(traced.model.as_deref(), Some("llama-3.1-8b"));
    assert_eq!(traced.kv_bytes_scale, Some(0.0002));
    let Command::Replay(mastered) = Cli::try_parse_from(&commands[1])?.command else {
        return Err("not a replay".into());
    };
    assert_eq!(mastered.master.as_deref(), Some("127.0.0.1:50051"));
    Ok(())
}

/// The exit statuses `replay --help` lists are the ones the errors map to, and the binary
/// exits with them: 0 for a replay that passed its checks, 1 for an error, 2 for a usage
/// error; 3 (checks failed) and 130 / 143 (signals) come from the same mapping
/// (`tests/replay_checks.rs` and `tests/signals.rs` run them).
#[test]
fn the_exit_statuses_in_replay_help_are_the_binary_s() -> Result<(), Box<dyn std::error::Error>> {
    use kv_connector::cli::replay::ReplayCliError;
    use kv_connector::cli::signals::Signal;
    use kv_connector::cli::CliError;
    use kv_connector::replay::checks::{FailedCheck, FailedChecks};

    let help = replay_help();
    let listed = |status: &str, meaning: &str| {
        help.lines().any(|line| {
            let line = line.trim_start();
            line.starts_with(status) && line.contains(meaning)
        })
    };
    let checks = ReplayCliError::ChecksFailed(FailedChecks(vec![FailedCheck::MismatchedPages {
        pages: 1,
    }]));
    let interrupted = |signal| ReplayCliError::Interrupted {
        signal,
        completed: 1,
        requests: 2,
    };
    let cases = [
        ("3 ", "failed a check", CliError::from(checks).exit_code()),
        (
            "130",
            "stopped by SIGINT",
            CliError::from(interrupted(Signal::Interrupt)).exit_code(),
        ),
        (
            "1 ",
            "any other error",
            CliError::from(ReplayCliError::FaultsNotBuilt).exit_code(),
        ),
    ];
    for (status, meaning, code) in cases {
        assert!(listed(status, meaning), "--help lists {status} {meaning}");
        assert_eq!(status.trim(), code.to_string(), "{meaning}");
    }
    assert!(listed("130", "143 stopped by SIGTERM"));
    assert_eq!(
        CliError::from(interrupted(Signal::Terminate)).exit_code(),
        143
    );
    let binary = env!("CARGO_BIN_EXE_kv-connector");
    let run = |args: &[&str]| -> Result<Option<i32>, std::io::Error> {
        let output = std::process::Command::new(binary)
            .args(args)
            .env("RUST_LOG", "error")
            .output()?;
        Ok(output.status.code())
    };
    let small = [
        "replay",
        "--model",
        "tiny-full",
        "--device",
        "host",
        "--sessions",
        "1",
        "--turns",
        "2",
        "--first-turn-tokens",
        "1000",
        "--last-turn-tokens",
        "1200",
        "--system-prefix-tokens",
        "500",
        "--output-tokens",
        "4",
        "--quiet",
    ];
    assert!(listed("0 ", "passed its checks"));
    assert_eq!(run(&small)?, Some(0), "a replay that passes its checks");
    assert!(listed("2 ", "usage error"));
    assert_eq!(run(&["replay", "--no-such-flag"])?, Some(2));
    let mut refused = small.to_vec();
    refused.extend(["--pool", "memory", "--master", "127.0.0.1:1"]);
    assert_eq!(run(&refused)?, Some(1), "an error");
    Ok(())
}
