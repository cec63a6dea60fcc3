//! `--help` of every subcommand: each flag is explained, and `replay --help` alone is
//! enough to run a Mooncake replay.
#![cfg(feature = "cli")]

use clap::CommandFactory;
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
