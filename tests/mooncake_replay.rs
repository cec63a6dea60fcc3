//! The replay and the connector on a real Mooncake Store (`docs/DESIGN.md` sections 10 and
//! 11): nothing is mocked. Every master is started on free loopback ports and stopped by PID
//! (by the replay itself, or by the test's `MooncakeMaster`); clients bind the transfer
//! engine to 127.0.0.1 (`mooncake.tcp_bind_address`).
//!
//! Covered:
//! - `kv-connector replay --pool mooncake --instances 2` on a slice of the shared trace:
//!   zero mismatched pages, and the same reuse as the same replay on the embedded pool;
//! - `--master HOST:PORT`: the replay's clients mount on a master the test started, and
//!   an address where nothing listens is refused naming `mooncake.master_address`;
//! - the connector on two Mooncake clients: a prefix counts only when every shard of world
//!   size 2 is stored (R3), and different model keys or salts share nothing (R4); every
//!   loader's and saver's staging pool is registered with the client while the connector
//!   runs and unregistered when it stops.
//!
//! - Mooncake's one-node layout (`dummy.rs`): the replay with `--real-client`, and a dummy
//!   client's calls, leases and refusals.
//!
//! The tests need `.venv` from `scripts/setup-mooncake`. `scripts/test` runs it first and
//! builds the tests with `KV_CONNECTOR_REQUIRE_MOONCAKE=1`, so a missing install fails
//! them; without that variable they skip, and the binary says so on one line
//! (`common::mooncake`).
#![cfg(all(feature = "mooncake", feature = "cli"))]

mod common;
#[path = "mooncake_replay/dummy.rs"]
mod dummy;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use common::mooncake::{install, master_log, start_master, venv_dir};
use common::{finished_loads, look_up, page_content, prompt, reserve, start, Instance};
use kv_connector::cli::{replay as replay_cli, Cli, Command};
use kv_connector::config::{Config, MIB};
use kv_connector::connector::{ConnectorHandle, ConnectorParams, EngineConnector, ReserveAnswer};
use kv_connector::core::hash::{hash_blocks, scope_seed, Scope};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::{GroupId, Layout};
use kv_connector::gpu::Device;
use kv_connector::pool::mooncake::{
    MooncakeInstall, MooncakeMaster, MooncakePool, MooncakeSettings,
};
use kv_connector::pool::Pool;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/mooncake_synthetic_trace.jsonl"
);

/// The replay flags of the trace comparison. The first 150 requests hold the trace's
/// first reuse (7 prompts share 115k tokens with earlier ones; the first 60 hold only
/// one). 1/5000 of llama-3.1-8b's 4 MiB pages stores 832-byte pages, and a modeled 512 GiB
/// pool (two segments of about 54 MiB) holds every page, so neither backend evicts.
const TRACE_SLICE: &[&str] = &[
    "--limit",
    "150",
    "--model",
    "llama-3.1-8b",
    "--instances",
    "2",
    "--kv-bytes-scale",
    "0.0002",
    "--pool-capacity",
    "512GiB",
    "--set",
    "loaders.staging_bytes_per_loader=8MiB",
    "--set",
    "saver.staging_bytes=8MiB",
];

// ---- rig ----

/// A client of `master` with a segment of `segment_bytes`.
fn client(
    install: &MooncakeInstall,
    master: &MooncakeMaster,
    segment_bytes: u64,
) -> Result<Arc<MooncakePool>, Box<dyn std::error::Error>> {
    let settings = MooncakeSettings {
        venv_dir: install.venv_dir.clone(),
        global_segment_size_bytes: segment_bytes,
        local_buffer_size_bytes: 4 * MIB,
        fallback_staging_bytes: 1 << 20,
        ..MooncakeSettings::default()
    };
    Ok(Arc::new(MooncakePool::connect(
        master.client_settings(settings),
    )?))
}

/// Runs `kv-connector replay` with `flags` and returns its JSON report and wall time.
fn replay(flags: &[&str]) -> Result<(serde_json::Value, f64), Box<dyn std::error::Error>> {
    let venv = format!("mooncake.venv_dir={}", venv_dir().display());
    let mut command_line = vec![
        "kv-connector",
        "replay",
        "--quiet",
        "--json",
        "--set",
        &venv,
    ];
    command_line.extend_from_slice(flags);
    let Command::Replay(args) = Cli::try_parse_from(command_line)?.command else {
        return Err("not the replay subcommand".into());
    };
    let started = Instant::now();
    let mut out = Vec::new();
    replay_cli::run(
        &args,
        HashMap::<String, String>::new(),
        &mut out,
        &mut Vec::new(),
    )?;
    Ok((
        serde_json::from_slice(&out)?,
        started.elapsed().as_secs_f64(),
    ))
}

fn field(report: &serde_json::Value, name: &str) -> Result<u64, String> {
    report[name]
        .as_u64()
        .ok_or_else(|| format!("no {name} in {report}"))
}

/// Connector settings with small staging pools (several connectors run at once).
fn small_staging() -> Config {
    let mut config = Config::default();
    config.loaders.staging_bytes_per_loader = 4 * MIB;
    config.saver.staging_bytes = 4 * MIB;
    config
}

// ---- the replay ----

/// `--pool mooncake --instances 2` on the shared trace: every loaded page verifies, and
/// reuse is what the embedded pool gives (neither evicts, so they must agree closely).
#[test]
fn trace_replay_on_mooncake_matches_the_embedded_pool_with_zero_mismatches() -> TestResult {
    if install().is_none() {
        return Ok(());
    }
    let mut memory_flags = vec!["--trace", TRACE, "--pool", "memory"];
    memory_flags.extend_from_slice(TRACE_SLICE);
    let (memory, memory_wall) = replay(&memory_flags)?;
    let mut mooncake_flags = vec!["--trace", TRACE, "--pool", "mooncake"];
    mooncake_flags.extend_from_slice(TRACE_SLICE);
    let (mooncake, mooncake_wall) = replay(&mooncake_flags)?;

    assert_eq!(mooncake["setup"]["pool"], "mooncake");
    assert_eq!(memory["setup"]["pool"], "memory");
    for report in [&memory, &mooncake] {
        assert_eq!(field(report, "mismatched_pages")?, 0, "{report}");
        assert_eq!(field(report, "completed")?, field(report, "requests")?);
        assert_eq!(field(report, "loads_failed")?, 0, "{report}");
    }
    let oracle = field(&memory, "oracle_reusable_tokens")?;
    let reused_memory = field(&memory, "reused_tokens")?;
    let reused_mooncake = field(&mooncake, "reused_tokens")?;
    println!(
        "trace slice: oracle {oracle} tokens; reused embedded {reused_memory} ({:.1} % of \
         oracle, replay {:.2} s, test {memory_wall:.2} s), mooncake {reused_mooncake} \
         ({:.1} %, replay {:.2} s of which {:.2} s waiting for saves to settle, test \
         {mooncake_wall:.2} s incl. master start and close)",
        percent(reused_memory, oracle),
        memory["wall_seconds"].as_f64().unwrap_or(0.0),
        percent(reused_mooncake, oracle),
        mooncake["wall_seconds"].as_f64().unwrap_or(0.0),
        mooncake["wall_waits"]["saves_settling_s"]
            .as_f64()
            .unwrap_or(0.0),
    );
    assert!(reused_memory > 0 && field(&mooncake, "verified_pages")? > 0);
    let saves = serde_json::Value::Object(
        SAVE_FIELDS
            .iter()
            .map(|&name| (name.to_owned(), mooncake[name].clone()))
            .collect(),
    );
    assert!(
        reused_mooncake.abs_diff(reused_memory) * 100 <= oracle * 3,
        "mooncake reused {reused_mooncake}, embedded {reused_memory} of oracle {oracle}; \
         mooncake's saves and pool health: {saves}; its lookups: {}; where its replay waited: {}",
        mooncake["lookups"],
        mooncake["wall_waits"]
    );
    assert_eq!(
        field(&mooncake, "pages_saved")? + field(&mooncake, "saves_skipped_present")?,
        field(&memory, "pages_saved")? + field(&memory, "saves_skipped_present")?,
        "both backends are offered the same pages; mooncake's saves and pool health: {saves}; \
         where its replay waited: {}",
        mooncake["wall_waits"]
    );
    Ok(())
}

/// The report's fields that tell why a replay reused less than another: what became of
/// its saves, and the pool's health.
const SAVE_FIELDS: [&str; 9] = [
    "saves_enqueued",
    "saves_done",
    "saves_failed",
    "saves_no_space",
    "saves_retried",
    "saves_dropped",
    "saves_outage",
    "saves_skipped_present",
    "pool_health",
];

#[expect(clippy::cast_precision_loss, reason = "token counts far below 2^52")]
fn percent(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

/// `--master HOST:PORT` uses the running master: both instances' clients mount their
/// segments there (its log says so), the run verifies every page, and the test's master
/// stays up. An address where nothing listens is refused naming the setting.
#[test]
fn master_flag_uses_a_running_master() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let mut master = start_master(&install, "replay-flag")?;
    let address = master.master_address();
    let metadata = format!("mooncake.metadata_server={}", master.metadata_server());
    let demo = [
        "--pool",
        "mooncake",
        "--model",
        "tiny-full",
        "--instances",
        "2",
        "--turns",
        "3",
        "--pool-capacity",
        "256MiB",
    ];
    let mut flags = vec!["--master", address.as_str(), "--set", metadata.as_str()];
    flags.extend_from_slice(&demo);
    let (report, _) = replay(&flags)?;
    assert_eq!(report["setup"]["pool"], "mooncake");
    assert_eq!(field(&report, "mismatched_pages")?, 0);
    assert!(field(&report, "reused_tokens")? > 0, "{report}");
    let log = std::fs::read_to_string(master_log("replay-flag"))?;
    assert_eq!(
        log.matches("action=mount_segment").count(),
        2,
        "one segment per instance on the given master:\n{log}"
    );
    assert!(
        master.pid().is_some(),
        "the replay leaves a given master running"
    );
    master.stop()?;

    let mut flags = vec!["--master", address.as_str(), "--set", metadata.as_str()];
    flags.extend_from_slice(&demo);
    let err = replay(&flags).expect_err("nothing listens there any more");
    assert!(err.to_string().contains("master_address"), "{err}");
    Ok(())
}

// ---- the connector ----

/// Starts a connector on `pool` with its own model key and salt.
fn start_scoped(
    pool: Arc<dyn Pool>,
    layout: &Layout,
    model_key: &str,
    salt: Option<&str>,
) -> Result<ConnectorHandle, Box<dyn std::error::Error>> {
    let devices: Vec<Device> = (0..layout.world_size)
        .map(|_| {
            let specs: Vec<_> = layout
                .groups
                .iter()
                .map(|group| {
                    Ok(kv_connector::gpu::PagePoolSpec {
                        group: group.id,
                        page_bytes: usize::try_from(layout.page_bytes(group)?)?,
                        num_pages: common::PAGES,
                    })
                })
                .collect::<Result<_, Box<dyn std::error::Error>>>()?;
            Ok(Device::open_host(&specs)?)
        })
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    let scope = Scope {
        salt: salt.map(str::to_owned),
        ..Scope::default()
    };
    Ok(ConnectorHandle::start(ConnectorParams {
        config: small_staging(),
        layout: layout.clone(),
        pool,
        devices,
        share: kv_connector::RankShare::default(),
        seed: scope_seed(&scope),
        model_key: model_key.to_owned(),
    })?)
}

/// Extra tokens a fresh lookup of `tokens` offers.
fn offered(handle: &mut ConnectorHandle, request: u64, tokens: &Arc<[i64]>) -> usize {
    look_up(handle, RequestId(request), tokens);
    match reserve(handle, RequestId(request), ReservationId(request)) {
        ReserveAnswer::Offer { extra_tokens, .. } => extra_tokens,
        ReserveAnswer::Pending => 0,
    }
}

/// Saves `tokens` through `writer` as request `request`, and waits for the saves.
fn save_prompt(writer: &mut Instance, layout: &Layout, request: u64, tokens: &Arc<[i64]>) {
    offered(&mut writer.handle, request, tokens);
    writer.compute(RequestId(request), tokens, layout, 0);
    writer.handle.settle_saves();
}

/// R3 on Mooncake, world size 2: with one rank's pages removed from the store the prefix
/// is not offered; once that rank saves again it is, and each rank loads its own pages
/// (written by one client, read by another).
#[test]
fn a_prefix_counts_only_when_every_shard_is_stored_r3() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let master = start_master(&install, "replay-shards")?;
    let writer_pool = client(&install, &master, 32 * MIB)?;
    let reader_pool = client(&install, &master, 32 * MIB)?;
    let layout = Layout::preset("tiny-full")?.with_world_size(2)?;
    let t = layout.tokens_per_block as usize;
    let tokens = prompt(9, 6 * t + 1);
    let mut writer = start(writer_pool.clone(), &layout, small_staging());
    let mut reader = start(reader_pool.clone(), &layout, small_staging());
    assert_eq!(
        writer_pool.registered_regions(),
        2 * 3,
        "two loaders and a saver per rank register their staging pools"
    );

    save_prompt(&mut writer, &layout, 1, &tokens);
    let hashes = hash_blocks(scope_seed(&Scope::default()), &tokens, t)?;
    let group = writer.handle.keys().group(0).ok_or("group 0")?;
    let rank1: Vec<String> = hashes.iter().map(|hash| group.key(1, hash)).collect();
    let rank1_refs: Vec<&str> = rank1.iter().map(String::as_str).collect();
    assert!(writer_pool.remove(&rank1_refs).iter().all(Result::is_ok));
    assert_eq!(
        offered(&mut reader.handle, 2, &tokens),
        0,
        "rank 1 is missing"
    );

    // The writer computes the prompt again: rank 0's pages are skipped as present (R19),
    // rank 1's are stored again.
    save_prompt(&mut writer, &layout, 3, &tokens);
    assert_eq!(offered(&mut reader.handle, 4, &tokens), 6 * t);
    reader.start_load(RequestId(4), ReservationId(4), tokens.len(), &layout, 200);
    assert!(finished_loads(&mut reader.handle)[0].filled);
    for (rank, device) in reader.devices.iter().enumerate() {
        let len = device.page_pool(GroupId(0))?.page_bytes;
        for block in 0..6 {
            let page = 200 + u32::try_from(block)?;
            assert_eq!(
                device.read_page_to_vec(GroupId(0), page)?,
                page_content(GroupId(0), rank, block, len),
                "rank {rank} block {block}"
            );
        }
    }
    let reader_stats = reader.handle.shutdown();
    assert_eq!(
        (reader_stats.lookups.full_miss, reader_stats.lookups.full),
        (1, 1)
    );
    assert_eq!(reader_stats.loads.pages_loaded, 12);
    let saves = writer.handle.shutdown().saves;
    assert_eq!((saves.saves_done, saves.saves_skipped_present), (12 + 6, 6));
    assert_eq!(
        (
            writer_pool.registered_regions(),
            reader_pool.registered_regions()
        ),
        (0, 0),
        "a stopped connector unregisters its staging pools"
    );
    writer_pool.close()?;
    reader_pool.close()?;
    Ok(())
}

/// R4 on Mooncake: a prompt saved under one model key and salt is offered to a connector
/// with the same ones, and to none with another model key or another salt. The readers
/// start one after another on one client, so each registers its staging pools where the
/// previous one's were (they are unregistered at shutdown).
#[test]
fn other_model_keys_and_salts_share_nothing_r4() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let master = start_master(&install, "replay-scopes")?;
    let writer_pool = client(&install, &master, 32 * MIB)?;
    let reader_pool = client(&install, &master, 32 * MIB)?;
    let layout = Layout::preset("tiny-full")?;
    let t = layout.tokens_per_block as usize;
    let tokens = prompt(40, 8 * t + 5);
    let mut writer = start(writer_pool.clone(), &layout, small_staging());
    save_prompt(&mut writer, &layout, 1, &tokens);
    assert_eq!(writer.handle.shutdown().saves.saves_done, 8);

    for (model_key, salt, expected) in [
        ("other-model", None, 0),
        ("test", Some("tenant-b"), 0),
        ("test", None, 8 * t),
        ("test", Some(""), 8 * t),
    ] {
        let mut reader = start_scoped(reader_pool.clone(), &layout, model_key, salt)?;
        assert_eq!(reader_pool.registered_regions(), 3);
        assert_eq!(
            offered(&mut reader, 2, &tokens),
            expected,
            "model key {model_key:?}, salt {salt:?}"
        );
        reader.shutdown();
    }
    writer_pool.close()?;
    reader_pool.close()?;
    Ok(())
}

/// `Pool::register_staging` over memory that overlaps a region still on record (a
/// connector that stopped without unregistering) replaces it, where a plain
/// `register_slice` is refused by Mooncake (`mooncake::pool::I4`); direct transfers keep working.
#[test]
fn staging_registration_replaces_a_stale_overlapping_region() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let master = start_master(&install, "replay-stale-region")?;
    let pool = client(&install, &master, 32 * MIB)?;
    let mut memory = vec![0u8; 1 << 20];
    pool.register_slice(&memory)?;
    assert!(
        pool.register_slice(&memory[4096..]).is_err(),
        "mooncake refuses overlapping regions"
    );
    pool.register_staging(&memory[4096..])?;
    assert_eq!(
        pool.registered_regions(),
        1,
        "the stale region was replaced"
    );
    memory[4096..4096 + 64].fill(9);
    let key = "kvc/stale/w1r0/lg0/t32b64/00";
    assert_eq!(pool.put(&[key], &[&memory[4096..4096 + 64]]), vec![Ok(())]);
    let mut slot = &mut memory[8192..8192 + 64];
    assert_eq!(
        pool.get_into(&[key], std::slice::from_mut(&mut slot)),
        vec![Ok(64)]
    );
    assert!(memory[8192..8192 + 64].iter().all(|&byte| byte == 9));
    pool.unregister_staging(memory[4096..].as_ptr().addr())?;
    assert_eq!(pool.registered_regions(), 0);
    pool.close()?;
    Ok(())
}

/// A healthy Mooncake replay with `--log-format json`: every stderr line is a JSON object
/// (the transfer engine's own lines go to the folder announced once, which holds them).
#[test]
fn json_logs_of_a_mooncake_replay_stay_json() -> TestResult {
    if install().is_none() {
        return Ok(());
    }
    let venv = format!("mooncake.venv_dir={}", venv_dir().display());
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args([
            "--log-format",
            "json",
            "replay",
            "--pool",
            "mooncake",
            "--limit",
            "3",
        ])
        .args([
            "--quiet",
            "--json",
            "--pool-capacity",
            "512GiB",
            "--kv-bytes-scale",
            "0.0002",
        ])
        .args(["--set", &venv])
        .env_remove("RUST_LOG")
        .output()?;
    let stderr = String::from_utf8(output.stderr)?;
    assert!(output.status.success(), "{stderr}");
    let mut folder = None;
    for line in stderr.lines() {
        let event: serde_json::Value = serde_json::from_str(line)
            .map_err(|err| format!("not a JSON log line ({err}): {line}"))?;
        if let Some(dir) = event["dir"].as_str() {
            folder = Some(PathBuf::from(dir));
        }
    }
    let folder = folder.ok_or_else(|| format!("the log folder was not announced:\n{stderr}"))?;
    let files = std::fs::read_dir(&folder)?.count();
    assert!(files > 0, "nothing was written to {}", folder.display());
    Ok(())
}

/// Whether process `pid` is gone or a zombie (dead, waiting to be reaped by its new parent).
fn process_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: `pid (comm) S ...`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// A replay killed with SIGKILL (no handler runs) takes the master it started with it
/// (`mooncake::master::I3`): nothing keeps the master's ports and memory after the replay.
#[test]
fn a_replay_killed_with_sigkill_leaves_no_master_behind() -> TestResult {
    use std::io::{BufRead, BufReader};
    if install().is_none() {
        return Ok(());
    }
    let venv = format!("mooncake.venv_dir={}", venv_dir().display());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args(["replay", "--pool", "mooncake", "--model", "tiny-full"])
        .args([
            "--generate",
            "long-multiturn",
            "--sessions",
            "2000",
            "--turns",
            "4",
        ])
        .args(["--first-turn-tokens", "2000", "--last-turn-tokens", "4000"])
        .args(["--system-prefix-tokens", "1000"])
        .args(["--pool-capacity", "1GiB", "--quiet", "--set", &venv])
        .env("RUST_LOG", "warn,kv_connector::replay::mooncake=info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr pipe")?;
    let mut master = None;
    let mut seen = String::new();
    for line in BufReader::new(stderr).lines() {
        let line = line?;
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("replay started mooncake_master") {
            master = line
                .split_whitespace()
                .find_map(|field| field.strip_prefix("pid="))
                .and_then(|pid| pid.parse::<u32>().ok());
            break;
        }
    }
    let Some(master) = master else {
        child.kill()?;
        child.wait()?;
        return Err(format!("the replay did not announce its master:\n{seen}").into());
    };
    assert!(
        !process_dead(master),
        "the master runs while the replay does"
    );
    child.kill()?;
    child.wait()?;
    // The parent-death signal is sent as the replay exits; the master then dies on its own
    // schedule. Bounded, not a timing assertion: a master left running never dies.
    let started = Instant::now();
    while !process_dead(master) && started.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let orphaned = !process_dead(master);
    if orphaned {
        // Clean up after the failure: this test started it, by PID.
        let _ = std::process::Command::new("kill")
            .args(["-9", &master.to_string()])
            .status();
    }
    assert!(
        !orphaned,
        "mooncake_master {master} outlived the replay killed with SIGKILL"
    );
    Ok(())
}
