//! What the connector buys: the replay's side-by-side run without a connector.
#![cfg(feature = "cli")]

mod common;

use common::{replay_json, report_field};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn float(value: &serde_json::Value, what: &str) -> Result<f64, Box<dyn std::error::Error>> {
    value
        .as_f64()
        .ok_or_else(|| format!("{what} is not a number").into())
}

/// The built-in demo compares by default: the connector's figures are the report's own,
/// the baseline's are those of a `--connector none` run of the same workload, and the
/// ratios are computed from the two.
#[test]
fn the_demo_compares_against_the_same_workload_without_a_connector() -> TestResult {
    let report = replay_json(&[])?;
    let baseline = &report["baseline"];
    assert!(baseline.is_object(), "no baseline in the demo's report");
    let with = &baseline["with_connector"];
    let without = &baseline["without_connector"];
    assert_eq!(with["computed_tokens"], report["computed_tokens"]);
    assert_eq!(with["ttft_p50_s"], report["sim"]["ttft_p50_s"]);
    assert_eq!(with["throughput_rps"], report["sim"]["throughput_rps"]);

    let alone = replay_json(&["--connector", "none"])?;
    assert!(
        alone["baseline"].is_null(),
        "a run without a connector compared itself"
    );
    assert_eq!(without["computed_tokens"], alone["computed_tokens"]);
    assert_eq!(without["ttft_p99_s"], alone["sim"]["ttft_p99_s"]);
    assert_eq!(without["throughput_rps"], alone["sim"]["throughput_rps"]);

    let (with_tokens, without_tokens) = (
        report_field(&report, "computed_tokens")?,
        report_field(&alone, "computed_tokens")?,
    );
    assert!(
        with_tokens < without_tokens,
        "the demo reuses nothing: {with_tokens} computed with the connector, {without_tokens} without"
    );
    #[expect(clippy::cast_precision_loss, reason = "token counts of a small demo")]
    let expected = with_tokens as f64 / without_tokens as f64;
    let ratio = float(&baseline["computed_tokens_ratio"], "computed_tokens_ratio")?;
    assert!((ratio - expected).abs() < 1e-12, "{ratio} != {expected}");
    let speedup = float(&baseline["ttft_p50_speedup"], "ttft_p50_speedup")?;
    let expected =
        float(&without["ttft_p50_s"], "p50 without")? / float(&with["ttft_p50_s"], "p50 with")?;
    assert!(
        (speedup - expected).abs() < 1e-12,
        "{speedup} != {expected}"
    );
    Ok(())
}

/// Other workloads compare only when asked, and the comparison reaches the table.
#[test]
fn other_workloads_compare_when_asked() -> TestResult {
    let flags = [
        "--generate",
        "long-multiturn",
        "--sessions",
        "1",
        "--turns",
        "2",
        "--first-turn-tokens",
        "3000",
        "--last-turn-tokens",
        "4000",
        "--system-prefix-tokens",
        "2000",
    ];
    let plain = replay_json(&flags)?;
    assert!(plain["baseline"].is_null());
    let mut asked = flags.to_vec();
    asked.push("--compare-baseline");
    let compared = replay_json(&asked)?;
    assert!(compared["baseline"]["without_connector"].is_object());

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args(["replay", "--quiet"])
        .env_remove("RUST_LOG")
        .output()?;
    let table = String::from_utf8(output.stdout)?;
    assert!(output.status.success(), "{table}");
    assert!(table.contains("against no connector"), "{table}");
    assert!(table.contains("prefill tokens"), "{table}");
    Ok(())
}
