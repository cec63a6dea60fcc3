//! SIGINT and SIGTERM stop `kv-connector replay` gracefully: it stops admitting requests,
//! shuts its connectors down, prints the partial report on stderr (and writes its JSON with
//! `--json` and `--report-dir`, accounting closed) and exits with 130 / 143 (128 + the
//! signal number). Each test spawns the built binary on a generated workload
//! that runs for minutes, waits until it has logged its first completed request (no
//! sleeps: the test reads the child's stderr), sends the signal, and checks the exit and
//! the partial report's numbers: some requests but not all completed, and the stopped
//! connectors settled every save and load (accounting closed). A watchdog kills a child
//! that outlives [`WATCHDOG`], so a replay that ignores the signal fails the test instead
//! of hanging it.
#![cfg(feature = "cli")]

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// How long a child may live before the watchdog kills it (a hang, not a slow run).
const WATCHDOG: Duration = Duration::from_secs(300);

/// Kills process `pid` unless `done` is signalled within [`WATCHDOG`].
fn watchdog(pid: u32) -> std::sync::mpsc::Sender<()> {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if finished.recv_timeout(WATCHDOG) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    });
    done
}

/// What a stopped replay left: its exit code, stderr and stdout.
struct Stopped {
    code: Option<i32>,
    stderr: String,
    stdout: String,
}

/// Runs a long replay with `extra` flags, sends `signal` (a `kill` flag) after the first
/// completion, and returns what it left.
fn replay_stopped_by(signal: &str, extra: &[&str]) -> Result<Stopped, Box<dyn std::error::Error>> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args([
            "replay",
            "--model",
            "tiny-full",
            "--device",
            "host",
            "--generate",
            "long-multiturn",
            "--sessions",
            "2000",
            "--turns",
            "4",
            "--first-turn-tokens",
            "2000",
            "--last-turn-tokens",
            "4000",
            "--system-prefix-tokens",
            "1000",
            "--output-tokens",
            "8",
            "--quiet",
        ])
        .args(extra)
        .env("RUST_LOG", "warn,kv_connector::cli::replay=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let done = watchdog(child.id());
    let stderr = child.stderr.take().ok_or("no stderr pipe")?;
    let mut stderr = BufReader::new(stderr);
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line)? == 0 {
            return Err(format!("replay ended before its first completion: {seen}").into());
        }
        seen.push_str(&line);
        if line.contains("replay progress") {
            break;
        }
    }
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()?;
    assert!(status.success(), "kill {signal} failed");
    stderr.read_to_string(&mut seen)?;
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut stdout)?;
    }
    let exit = child.wait()?;
    let _ = done.send(());
    Ok(Stopped {
        code: exit.code(),
        stderr: seen,
        stdout,
    })
}

/// The partial report: the summary table with fewer completions than requests, and the
/// one-line reason.
fn assert_partial_report(stderr: &str, signal_name: &str) {
    assert!(
        stderr.contains(&format!("replay stopped by {signal_name} after")),
        "the reason is printed: {stderr}"
    );
    assert!(
        stderr.contains("prompt tokens"),
        "the partial report is printed on stderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "a graceful stop does not panic: {stderr}"
    );
    let (requests, completed) = counts(stderr).unwrap_or_else(|| panic!("no counts: {stderr}"));
    assert!(
        completed >= 1 && completed < requests,
        "stopped after its first completion, long before the {requests} requests: {completed}"
    );
    let accounting = stderr
        .lines()
        .find(|line| line.trim_start().starts_with("accounting"))
        .unwrap_or_default();
    assert!(
        accounting.contains(" closed "),
        "the stopped connectors settled every save and load: {accounting}"
    );
}

/// `(requests, completed)` from the report's `requests  N (M completed)` line.
fn counts(report: &str) -> Option<(u64, u64)> {
    let line = report
        .lines()
        .find(|line| line.trim_start().starts_with("requests "))?;
    let mut numbers = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|word| !word.is_empty())
        .map(str::parse::<u64>);
    Some((numbers.next()?.ok()?, numbers.next()?.ok()?))
}

#[test]
fn sigint_stops_the_replay_with_a_partial_report_and_exit_130() -> TestResult {
    let stopped = replay_stopped_by("-INT", &[])?;
    assert_eq!(stopped.code, Some(130), "stderr: {}", stopped.stderr);
    assert_partial_report(&stopped.stderr, "sigint");
    assert!(
        stopped.stdout.trim().is_empty(),
        "without --json the table goes to stderr only: {}",
        stopped.stdout
    );
    Ok(())
}

#[test]
fn sigterm_stops_the_replay_with_a_partial_report_and_exit_143() -> TestResult {
    let stopped = replay_stopped_by("-TERM", &[])?;
    assert_eq!(stopped.code, Some(143), "stderr: {}", stopped.stderr);
    assert_partial_report(&stopped.stderr, "sigterm");
    Ok(())
}

/// The accounting of a partial report: every save and every load counted once, the loads
/// the stop cut off included (they never reach their engine).
fn assert_closed(report: &serde_json::Value) {
    let field = |name: &str| report[name].as_u64().unwrap_or(u64::MAX);
    assert_eq!(
        field("saves_enqueued"),
        field("saves_done")
            + field("saves_skipped_present")
            + field("saves_dropped")
            + field("saves_failed"),
        "{report}"
    );
    assert_eq!(
        field("loads_started"),
        field("loads_done") + field("loads_failed"),
        "{report}"
    );
}

/// With `--json` and `--report-dir`, SIGINT writes the partial report to both, its
/// accounting closed and the signal named.
#[test]
fn sigint_writes_the_partial_json_and_report_dir_with_closed_accounting() -> TestResult {
    let reports = std::env::temp_dir().join(format!("kvc-sigint-reports-{}", std::process::id()));
    let reports_arg = reports.display().to_string();
    let stopped = replay_stopped_by("-INT", &["--json", "--report-dir", &reports_arg])?;
    assert_eq!(stopped.code, Some(130), "stderr: {}", stopped.stderr);
    assert_partial_report(&stopped.stderr, "sigint");
    let printed: serde_json::Value = serde_json::from_str(stopped.stdout.trim())?;
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reports.join("report.json"))?)?;
    for report in [&printed, &written] {
        assert_eq!(report["stopped_by"], "sigint", "{report}");
        assert!(
            report["completed"].as_u64() < report["requests"].as_u64(),
            "{report}"
        );
        assert_closed(report);
    }
    assert!(reports.join("timeline.json").is_file());
    std::fs::remove_dir_all(&reports)?;
    Ok(())
}
