//! `kv-connector replay --report-dir`: a short replay writes the JSON report, the timeline
//! and four PNG plots, and the timeline adds up to the report (timeline TL1).
#![cfg(feature = "cli")]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kv_connector::cli::replay;
use kv_connector::replay::plots::REPORT_FILES;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The eight bytes every PNG file starts with.
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

/// A fresh directory under the system's temporary directory, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("kvc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `replay` with a three-turn conversation on tiny-hybrid and `--report-dir dir`.
fn short_replay(dir: &Path, extra: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    let dir_text = dir.display().to_string();
    replay_with(&[&["--report-dir", dir_text.as_str()][..], extra].concat())
}

/// Runs `replay` with a three-turn conversation on tiny-hybrid and `flags`; returns stdout.
fn replay_with(flags: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    let (result, out) = replay_output(flags)?;
    result?;
    Ok(out)
}

/// Runs `replay` as [`replay_with`] does; returns its result and stdout, written or not.
fn replay_output(
    flags: &[&str],
) -> Result<(Result<(), replay::ReplayCliError>, String), Box<dyn std::error::Error>> {
    let args = common::small_replay_args(flags)?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let result = replay::run(&args, HashMap::<String, String>::new(), &mut out, &mut err);
    Ok((result, String::from_utf8(out)?))
}

#[test]
fn report_dir_writes_json_and_png_plots() -> TestResult {
    let scratch = ScratchDir::new("report-dir");
    let table = short_replay(&scratch.0, &[])?;
    assert!(table.contains("reused (pool)"), "{table}");
    for name in REPORT_FILES {
        let bytes = std::fs::read(scratch.0.join(name))?;
        assert!(!bytes.is_empty(), "{name} is empty");
        if Path::new(name).extension().is_some_and(|ext| ext == "png") {
            assert_eq!(
                bytes.get(..8),
                Some(&PNG_SIGNATURE[..]),
                "{name} is not a png"
            );
            assert!(bytes.len() > 10_000, "{name} has {} bytes", bytes.len());
        }
    }
    Ok(())
}

#[test]
fn timeline_buckets_add_up_to_the_report() -> TestResult {
    let scratch = ScratchDir::new("timeline-totals");
    short_replay(&scratch.0, &[])?;
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(scratch.0.join("report.json"))?)?;
    let timeline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(scratch.0.join("timeline.json"))?)?;
    let buckets = timeline["buckets"].as_array().ok_or("no buckets")?;
    let sum = |field: &str| -> u64 { buckets.iter().filter_map(|b| b[field].as_u64()).sum() };
    let lookups = |field: &str| -> u64 {
        buckets
            .iter()
            .filter_map(|b| b["lookups"][field].as_u64())
            .sum()
    };
    assert!(report["reused_tokens"].as_u64().is_some_and(|t| t > 0));
    for field in [
        "reused_tokens",
        "prompt_tokens",
        "pages_saved",
        "bytes_saved",
    ] {
        assert_eq!(Some(sum(field)), report[field].as_u64(), "{field}");
    }
    assert_eq!(Some(sum("loaded_tokens")), report["reused_tokens"].as_u64());
    assert_eq!(Some(sum("loads_filled")), report["loads_filled"].as_u64());
    assert_eq!(Some(sum("prompts_done")), report["completed"].as_u64());
    for outcome in ["full", "rewound", "recovered", "window_miss", "full_miss"] {
        assert_eq!(
            Some(lookups(outcome)),
            report["lookups"][outcome].as_u64(),
            "{outcome}"
        );
    }
    let ttft = timeline["ttft_s"].as_array().ok_or("no ttft")?;
    assert_eq!(Some(ttft.len() as u64), report["completed"].as_u64());
    Ok(())
}

#[test]
fn report_dir_under_a_file_is_an_error_naming_the_path() -> TestResult {
    let scratch = ScratchDir::new("report-dir-file");
    std::fs::create_dir_all(&scratch.0)?;
    let file = scratch.0.join("plain-file");
    std::fs::write(&file, b"x")?;
    let err = short_replay(&file.join("reports"), &[]).expect_err("a file is not a directory");
    assert!(err.to_string().contains("plain-file"), "{err}");
    Ok(())
}

/// A directory that cannot take the report is refused before the replay runs: nothing is
/// printed, the error names the path.
#[test]
fn an_unwritable_report_dir_is_refused_before_the_replay() -> TestResult {
    let scratch = ScratchDir::new("report-dir-early");
    std::fs::create_dir_all(&scratch.0)?;
    let file = scratch.0.join("plain-file");
    std::fs::write(&file, b"x")?;
    let dir = file.join("reports").display().to_string();
    let (result, out) = replay_output(&["--report-dir", dir.as_str()])?;
    let err = result.expect_err("a file is not a directory");
    assert!(err.to_string().contains("plain-file"), "{err}");
    assert!(out.is_empty(), "the replay ran before the check: {out}");
    Ok(())
}

/// The report without the wall-clock fields, which differ between any two runs.
fn simulated_fields(mut report: serde_json::Value) -> serde_json::Value {
    if let Some(object) = report.as_object_mut() {
        for field in [
            "wall_seconds",
            "wall_waits",
            "connector_step_us",
            "connector_step_cpu_us",
        ] {
            object.remove(field);
        }
        if let Some(lookups) = object.get_mut("lookups").and_then(|l| l.as_object_mut()) {
            lookups.remove("probe_time_us");
        }
    }
    report
}

/// The timeline probes and samples change nothing the replay reports (`replay::driver::D2`).
#[test]
fn collecting_the_timeline_does_not_change_the_report() -> TestResult {
    let scratch = ScratchDir::new("report-same");
    short_replay(&scratch.0, &[])?;
    let with: serde_json::Value =
        serde_json::from_slice(&std::fs::read(scratch.0.join("report.json"))?)?;
    let without: serde_json::Value = serde_json::from_str(&replay_with(&["--json"])?)?;
    assert_eq!(simulated_fields(with), simulated_fields(without));
    Ok(())
}
