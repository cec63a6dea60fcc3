//! The metrics endpoint (`kv-connector replay --metrics-addr`, `stats.metrics_addr`):
//! started on a free loopback port, scraped over HTTP while the embedding example's engine
//! saves and loads, and after its connector stopped.
#![cfg(feature = "cli")]

#[path = "../examples/embed.rs"]
#[expect(dead_code, reason = "only the example's engine is used here")]
mod embed;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::core::ids::RequestId;
use kv_connector::metrics::{exposition, MetricsServer, MetricsSources};
use kv_connector::pool::{MemoryPool, Pool, SystemClock};

/// One HTTP/1.0 GET: the status code, the `Content-Type` and the body.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("response without a header end")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .context("no status code")?
        .parse()?;
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    Ok((status, content_type, body.to_owned()))
}

/// The value of the counter-like series whose name and labels are `series`.
fn value(body: &str, series: &str) -> anyhow::Result<u64> {
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix(series) {
            return Ok(rest.trim().parse()?);
        }
    }
    bail!("{series} missing from:\n{body}")
}

#[test]
fn scraped_counters_move_after_saves_and_loads() -> anyhow::Result<()> {
    let pool: Arc<dyn Pool> = Arc::new(MemoryPool::new(
        EvictionPolicy::mooncake_defaults(64 << 20),
        Arc::new(SystemClock::new()),
    )?);
    let mut engine = embed::MiniEngine::start(pool)?;
    let sources = MetricsSources::new();
    sources.add("0", engine.handle.stats_source());
    let server = MetricsServer::start("127.0.0.1:0".parse()?, Arc::clone(&sources))?;
    let addr = server.local_addr();
    assert_ne!(addr.port(), 0, "port 0 is replaced by the bound port");

    let stored = "kv_connector_save_pages_total{connector=\"0\",result=\"stored\"}";
    let loads_done = "kv_connector_load_done_total{connector=\"0\"}";
    let (status, content_type, before) = get(addr, "/metrics")?;
    assert_eq!(status, 200);
    assert_eq!(content_type, exposition::CONTENT_TYPE);
    assert_eq!(value(&before, stored)?, 0);
    assert_eq!(value(&before, loads_done)?, 0);

    let first = embed::prompt(512, 10_000, 133);
    let second = embed::prompt(512, 20_000, 70);
    assert_eq!(engine.serve(RequestId(1), &first)?, 0);
    assert_eq!(engine.serve(RequestId(2), &second)?, 512);

    let (status, _, after) = get(addr, "/metrics")?;
    assert_eq!(status, 200);
    assert_eq!(value(&after, stored)?, 44);
    assert_eq!(value(&after, loads_done)?, 1);
    assert_eq!(
        value(&after, "kv_connector_load_pages_total{connector=\"0\"}")?,
        32
    );
    assert!(value(&after, "kv_connector_load_bytes_total{connector=\"0\"}")? > 0);
    let outcome = |name: &str| {
        value(
            &after,
            &format!("kv_connector_lookup_outcomes_total{{connector=\"0\",outcome=\"{name}\"}}"),
        )
    };
    assert_eq!((outcome("full")?, outcome("full_miss")?), (1, 1));
    let load_count = "kv_connector_load_seconds_count{connector=\"0\"}";
    assert_eq!(value(&after, load_count)?, 1);
    let inf = "kv_connector_load_seconds_bucket{le=\"+Inf\",connector=\"0\"}";
    assert_eq!(value(&after, inf)?, 1);

    // Invariant 2: a stopped connector keeps its last totals; nothing goes backwards.
    let final_stats = engine.shutdown();
    let (_, _, stopped) = get(addr, "/metrics")?;
    assert_eq!(value(&stopped, stored)?, final_stats.saves.saves_done);
    assert_eq!(value(&stopped, loads_done)?, 1);

    assert_eq!(get(addr, "/nope")?.0, 404);
    server.stop();
    Ok(())
}

/// docs/OPERATIONS.md lists every metric the endpoint serves.
#[test]
fn every_served_metric_is_documented() -> anyhow::Result<()> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/OPERATIONS.md"))?;
    for name in exposition::exposed_names() {
        assert!(
            doc.contains(&format!("`{name}`")),
            "{name} missing from docs/OPERATIONS.md"
        );
    }
    Ok(())
}

/// The binary end to end: `replay --metrics-addr` starts the endpoint, `--log-format json`
/// with `RUST_LOG=info` writes only JSON lines to stderr, and the run completes. Also the
/// regression test for stderr being locked by `replay` for its whole run: a log line from
/// any other thread (here the metrics thread's "listening" line; in production an actor's
/// warning) then blocked that thread, and the replay hung joining or waiting on it.
#[test]
fn replay_with_json_info_logs_and_metrics_completes() -> anyhow::Result<()> {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args([
            "--log-format",
            "json",
            "replay",
            "--limit",
            "4",
            "--json",
            "--quiet",
        ])
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--set",
            "stats.interval_s=1",
        ])
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || sender.send(child.wait_with_output()));
    let Ok(output) = receiver.recv_timeout(Duration::from_secs(120)) else {
        // Leave no hung replay behind.
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .status();
        bail!("the replay did not finish in 120 s");
    };
    let output = output?;
    let stderr = String::from_utf8(output.stderr)?;
    assert!(output.status.success(), "replay failed:\n{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    assert!(report.is_object());
    let mut messages = Vec::new();
    for line in stderr.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("not a JSON log line: {line}"))?;
        messages.push(event["message"].as_str().unwrap_or_default().to_owned());
        if event["message"] == "lookups" {
            assert!(event["full"].is_u64(), "{line}");
        }
    }
    assert!(
        messages
            .iter()
            .any(|message| message == "metrics endpoint listening"),
        "{stderr}"
    );
    Ok(())
}

/// Runs the binary's `replay` with `args` and `RUST_LOG` as given (unset with `None`) and
/// returns its stderr; fails when the replay fails.
fn replay_stderr(args: &[&str], rust_log: Option<&str>) -> anyhow::Result<String> {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kv-connector"));
    command.arg("replay").args(args);
    command.env_remove("RUST_LOG");
    if let Some(filter) = rust_log {
        command.env("RUST_LOG", filter);
    }
    let output = command.stdin(std::process::Stdio::null()).output()?;
    let stderr = String::from_utf8(output.stderr)?;
    anyhow::ensure!(output.status.success(), "replay failed:\n{stderr}");
    Ok(stderr)
}

/// With `--metrics-addr 127.0.0.1:0` the system picks the port; the user learns it at the
/// default log level, with the port actually bound.
#[test]
fn the_chosen_metrics_port_is_shown_at_the_default_log_level() -> anyhow::Result<()> {
    let stderr = replay_stderr(
        &["--limit", "2", "--quiet", "--metrics-addr", "127.0.0.1:0"],
        None,
    )?;
    let line = stderr
        .lines()
        .find(|line| line.contains("metrics endpoint listening"))
        .with_context(|| format!("no listening line:\n{stderr}"))?;
    let addr = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("addr="))
        .with_context(|| format!("no addr field: {line}"))?;
    let addr: SocketAddr = addr.parse()?;
    assert_ne!(addr.port(), 0, "{line}");
    Ok(())
}

/// `RUST_LOG=info` shows the stats reports and lifecycle events, not one line per request.
#[test]
fn info_logs_carry_no_per_request_progress_lines() -> anyhow::Result<()> {
    let stderr = replay_stderr(&["--limit", "20", "--quiet"], Some("info"))?;
    assert!(!stderr.contains("replay progress"), "{stderr}");
    let debug = replay_stderr(&["--limit", "3", "--quiet"], Some("debug"))?;
    assert!(
        debug.contains("replay progress"),
        "progress lines vanished entirely"
    );
    Ok(())
}

/// A port in use gets advice that works: not the same port again.
#[test]
fn a_metrics_port_in_use_gets_advice_that_works() -> anyhow::Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?;
    let Err(err) = MetricsServer::start(addr, MetricsSources::new()) else {
        bail!("bound a port already in use");
    };
    let message = err.to_string();
    assert!(message.contains(&addr.to_string()), "{message}");
    assert!(message.contains("127.0.0.1:0"), "{message}");
    assert!(!message.contains("9464"), "{message}");
    Ok(())
}

/// At INFO a replay's connectors log their lifecycle end, as the operations guide says:
/// one `connector stopped` line per instance, with the final totals, naming its instance.
#[test]
fn each_connector_logs_that_it_stopped_naming_its_instance() -> anyhow::Result<()> {
    let stderr = replay_stderr(
        &["--limit", "3", "--quiet", "--instances", "2"],
        Some("info"),
    )?;
    let stopped: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("connector stopped"))
        .collect();
    assert_eq!(stopped.len(), 2, "{stderr}");
    assert!(
        stopped.iter().all(|line| line.contains("saves_done=")),
        "{stderr}"
    );
    for instance in ["instance=\"0\"", "instance=\"1\""] {
        assert!(
            stopped.iter().any(|line| line.contains(instance)),
            "{instance} missing:\n{stderr}"
        );
    }
    Ok(())
}
