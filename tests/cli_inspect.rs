//! `kv-connector inspect` on the embedded pool seeded from a small trace: presence per
//! group and shard, and the lookup the planner returns (R3, R10-R12).
#![cfg(feature = "cli")]

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Parser;
use kv_connector::cli::{inspect, Cli, Command};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A trace file in the temporary directory, removed on drop.
struct TraceFile(PathBuf);

impl TraceFile {
    /// Three requests: the third shares its first three 512-token blocks with the first.
    fn new(name: &str) -> Result<Self, std::io::Error> {
        let path = std::env::temp_dir().join(format!("kvc-{name}-{}.jsonl", std::process::id()));
        let lines = [
            r#"{"timestamp": 0, "input_length": 2048, "output_length": 4, "hash_ids": [0, 1, 2, 3]}"#,
            r#"{"timestamp": 10, "input_length": 1024, "output_length": 4, "hash_ids": [10, 11]}"#,
            r#"{"timestamp": 20, "input_length": 2000, "output_length": 4, "hash_ids": [0, 1, 2, 7]}"#,
        ];
        std::fs::write(&path, lines.join("\n") + "\n")?;
        Ok(Self(path))
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `inspect --json` with `flags`; returns the parsed output.
fn inspect_json(flags: &[&str]) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let mut line = vec!["kv-connector", "inspect", "--json"];
    line.extend_from_slice(flags);
    let Command::Inspect(args) = Cli::try_parse_from(line)?.command else {
        return Err("not the inspect subcommand".into());
    };
    let mut out = Vec::new();
    inspect::run(&args, HashMap::<String, String>::new(), &mut out)?;
    Ok(serde_json::from_slice(&out)?)
}

#[test]
fn a_shared_prefix_is_present_and_offered_r10() -> TestResult {
    let trace = TraceFile::new("inspect-shared")?;
    let path = trace.0.display().to_string();
    let found = inspect_json(&["--trace", &path, "--line", "3", "--model", "tiny-full"])?;
    assert_eq!(found["prompt_tokens"], 2000);
    assert_eq!(found["tokens_per_block"], 16);
    // 1536 shared tokens = 96 blocks of 16, saved by request 1 (its last block holds its
    // last token, so request 1 saved blocks [0, 127); only the shared 96 match).
    let shard = &found["groups"][0]["shards"][0];
    assert_eq!(shard["shard"], "w1r0");
    assert_eq!(shard["present_blocks"], 96, "{shard}");
    assert_eq!(shard["runs"], serde_json::json!([[0, 96]]));
    let lookup = &found["lookup"];
    assert_eq!(lookup["outcome"], "full", "{lookup}");
    assert_eq!(lookup["resume_tokens"], 1536);
    assert_eq!(lookup["offered_tokens"], 1536);
    assert!(shard["first_key"]
        .as_str()
        .is_some_and(|key| key.starts_with("kvc/tiny-full.") && key.contains("/w1r0/lg0/t16b")));
    Ok(())
}

#[test]
fn window_groups_show_their_saved_tails_r12_r13() -> TestResult {
    let trace = TraceFile::new("inspect-window")?;
    let path = trace.0.display().to_string();
    // R = 0: request 1 saved only its sink block and the window before its end (block
    // 127 onwards), which request 3 does not share; full groups hit 96 blocks.
    let flags = [
        "--trace",
        &path,
        "--line",
        "3",
        "--model",
        "tiny-hybrid",
        "--set",
        "planner.swa_endpoint_rewind_tokens=0",
    ];
    let found = inspect_json(&flags)?;
    let window = &found["groups"][1];
    assert!(window["attention"]
        .as_str()
        .is_some_and(|a| a.starts_with("window W = 64, S = 4")));
    assert_eq!(
        window["shards"][0]["runs"],
        serde_json::json!([[0, 1]]),
        "{window}"
    );
    let lookup = &found["lookup"];
    assert_eq!(lookup["full_hit_tokens"], 1536);
    // The fallback (R13) finds the sink block's own window complete: resume after it.
    assert_eq!(lookup["outcome"], "recovered", "{lookup}");
    assert_eq!(lookup["resume_tokens"], 16);
    let without =
        inspect_json(&[&flags[..], &["--set", "planner.window_fallback=false"]].concat())?;
    assert_eq!(without["lookup"]["outcome"], "window_miss");
    assert_eq!(without["lookup"]["offered_tokens"], 0);
    Ok(())
}

#[test]
fn an_empty_pool_is_a_full_miss_and_a_line_past_the_end_is_refused() -> TestResult {
    let trace = TraceFile::new("inspect-empty")?;
    let path = trace.0.display().to_string();
    let found = inspect_json(&[
        "--trace",
        &path,
        "--line",
        "3",
        "--model",
        "tiny-full",
        "--seed-requests",
        "0",
    ])?;
    assert_eq!(found["lookup"]["outcome"], "full_miss");
    assert_eq!(found["groups"][0]["shards"][0]["present_blocks"], 0);
    let err = inspect_json(&["--trace", &path, "--line", "9"]).expect_err("line 9 of 3");
    assert!(err.to_string().contains("use 1 to 3"), "{err}");
    Ok(())
}

/// `--tokens` alone inspects against an empty embedded pool: no seed trace is needed.
#[test]
fn tokens_alone_inspect_an_empty_pool() -> TestResult {
    let path = std::env::temp_dir().join(format!("kvc-inspect-tokens-{}.json", std::process::id()));
    let tokens: Vec<String> = (0..100).map(|token| token.to_string()).collect();
    std::fs::write(&path, format!("[{}]", tokens.join(", ")))?;
    let found = inspect_json(&[
        "--tokens",
        &path.display().to_string(),
        "--model",
        "tiny-full",
    ]);
    std::fs::remove_file(&path)?;
    let found = found?;
    assert_eq!(found["lookup"]["outcome"], "full_miss");
    assert_eq!(found["groups"][0]["shards"][0]["present_blocks"], 0);
    assert!(
        found["pool"]
            .as_str()
            .is_some_and(|pool| pool.contains("empty")),
        "{}",
        found["pool"]
    );
    Ok(())
}

/// The default seeding pool holds every seeded prompt (two 32k-token llama prompts, 8 GiB
/// at full page size, would fill the default 8 GiB pool and evict the first before the
/// third request is inspected); a capacity the user sets is kept, and evicts.
#[test]
fn the_default_seeding_pool_holds_every_seeded_prompt() -> TestResult {
    let path = std::env::temp_dir().join(format!("kvc-inspect-big-{}.jsonl", std::process::id()));
    let ids = |from: u32| -> String {
        let ids: Vec<String> = (from..from + 64).map(|id| id.to_string()).collect();
        ids.join(", ")
    };
    let lines = [
        format!(
            r#"{{"timestamp": 0, "input_length": 32768, "output_length": 4, "hash_ids": [{}]}}"#,
            ids(0)
        ),
        format!(
            r#"{{"timestamp": 10, "input_length": 32768, "output_length": 4, "hash_ids": [{}]}}"#,
            ids(1000)
        ),
        format!(
            r#"{{"timestamp": 20, "input_length": 32768, "output_length": 4, "hash_ids": [{}]}}"#,
            ids(0)
        ),
    ];
    std::fs::write(&path, lines.join("\n") + "\n")?;
    let trace = path.display().to_string();
    let flags = [
        "--trace",
        trace.as_str(),
        "--line",
        "3",
        "--model",
        "llama-3.1-8b",
    ];
    let found = inspect_json(&flags);
    let mut small = flags.to_vec();
    small.extend(["--set", "pool.capacity_bytes=2GiB"]);
    let evicted = inspect_json(&small);
    std::fs::remove_file(&path)?;
    let (found, evicted) = (found?, evicted?);
    // Everything but the block holding the last prompt token.
    assert_eq!(
        found["lookup"]["offered_tokens"],
        32768 - 32,
        "{}",
        found["lookup"]["outcome"]
    );
    assert_ne!(
        evicted["lookup"]["offered_tokens"], found["lookup"]["offered_tokens"],
        "the small pool evicted nothing, so the default pool's result proves nothing"
    );
    Ok(())
}
