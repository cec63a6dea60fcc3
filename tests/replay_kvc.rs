//! Replays of the shared Mooncake trace through the real connector on the embedded pool:
//! every loaded page verified, outcomes accounted, reuse close to the oracle.
#![cfg(feature = "cli")]

mod common;

use common::{replay_json as replay, report_field as field};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/mooncake_synthetic_trace.jsonl"
);

/// The whole shared trace, two instances round robin: about
/// 20 s in a release build on two cores.
#[test]
fn the_shared_trace_reuses_its_oracle_with_zero_mismatches() -> TestResult {
    let report = replay(&[
        "--trace",
        TRACE,
        "--model",
        "llama-3.1-8b",
        "--instances",
        "2",
        "--pool-capacity",
        "4TiB",
        "--kv-bytes-scale",
        "0.0009765625",
    ])?;
    assert_eq!(field(&report, "mismatched_pages")?, 0);
    assert!(field(&report, "verified_pages")? > 0);
    assert_eq!(field(&report, "completed")?, 3993);
    let lookups = &report["lookups"];
    let outcomes: u64 = ["full", "rewound", "recovered", "window_miss", "full_miss"]
        .iter()
        .map(|name| lookups[*name].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        outcomes, 3993,
        "every request ends its lookup with one outcome"
    );
    let (reused, oracle) = (
        field(&report, "reused_tokens")?,
        field(&report, "oracle_reusable_tokens")?,
    );
    assert!(
        oracle > 0 && reused * 100 >= oracle * 97,
        "reused {reused} of oracle {oracle}"
    );
    Ok(())
}

/// Two sessions of `turns` turns growing from 20k to 30k tokens, two instances, the
/// full-attention preset: small enough for a test, long enough for every turn to reuse.
fn small_multiturn(turns: &'static str) -> Vec<&'static str> {
    vec![
        "--generate",
        "long-multiturn",
        "--sessions",
        "2",
        "--turns",
        turns,
        "--first-turn-tokens",
        "20000",
        "--last-turn-tokens",
        "30000",
        "--system-prefix-tokens",
        "8000",
        "--model",
        "llama-3.1-8b",
        "--instances",
        "2",
        "--pool-capacity",
        "4TiB",
        "--kv-bytes-scale",
        "0.0009765625",
    ]
}

#[test]
fn tensor_parallel_ranks_reuse_the_same_share() -> TestResult {
    // Turns of a session wait for the previous one, so timing cannot change what is
    // reusable: both world sizes must reuse exactly the same tokens.
    let base = small_multiturn("4");
    let one = replay(&base)?;
    let mut with_two = base.clone();
    with_two.extend_from_slice(&["--world", "2"]);
    let two = replay(&with_two)?;
    for report in [&one, &two] {
        assert_eq!(field(report, "mismatched_pages")?, 0);
    }
    assert!(field(&one, "reused_tokens")? > 0);
    assert_eq!(field(&two, "reused_tokens")?, field(&one, "reused_tokens")?);
    assert_eq!(
        field(&two, "reused_tokens")?,
        field(&two, "oracle_reusable_tokens")?
    );
    assert_eq!(
        field(&two, "verified_pages")?,
        2 * field(&one, "verified_pages")?,
        "each rank's pages are checked"
    );
    Ok(())
}

/// The courier's three ways of waiting (poll, park after every message, poll slowly and
/// never park) deliver the same messages in the same order: the replay reuses, loads and
/// saves exactly the same pages, and verifies every one.
#[test]
fn every_courier_timing_replays_the_same_pages() -> TestResult {
    let base = small_multiturn("3");
    let mut reports = Vec::new();
    for timing in [
        &[][..],
        &["--set", "handoff.poll_interval_us=0"][..],
        &[
            "--set",
            "handoff.poll_interval_us=10000",
            "--set",
            "handoff.park_after_idle_ms=60000",
        ][..],
    ] {
        let mut flags = base.clone();
        flags.extend_from_slice(timing);
        reports.push(replay(&flags)?);
    }
    for report in &reports {
        assert_eq!(field(report, "mismatched_pages")?, 0);
        assert_eq!(field(report, "loads_failed")?, 0);
    }
    assert!(field(&reports[0], "reused_tokens")? > 0);
    for name in [
        "reused_tokens",
        "verified_pages",
        "pages_loaded",
        "pages_saved",
    ] {
        let values: Vec<u64> = reports
            .iter()
            .map(|report| field(report, name))
            .collect::<Result<_, _>>()?;
        assert!(
            values.iter().all(|value| *value == values[0]),
            "{name}: {values:?}"
        );
    }
    Ok(())
}
