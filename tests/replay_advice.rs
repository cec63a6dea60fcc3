//! The replay's warnings and refusals about sizes: they say what is true of the stored
//! pool and name values that work for the whole workload.
#![cfg(feature = "cli")]

use std::process::Command;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Runs the binary's `replay --quiet` with `flags`, default log level; (success, stderr).
fn replay(flags: &[&str]) -> Result<(bool, String), Box<dyn std::error::Error>> {
    let output = Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args(["replay", "--quiet"])
        .args(flags)
        .env_remove("RUST_LOG")
        .output()?;
    Ok((output.status.success(), String::from_utf8(output.stderr)?))
}

/// A model of mostly window layers stores only window tails for them (R17): the default
/// pool holds its prompts, so no warning says otherwise; a pool too small for one prompt's
/// stored pages is warned about, in stored bytes.
#[test]
fn the_pool_size_warning_counts_what_a_prompt_really_stores() -> TestResult {
    let (ok, stderr) = replay(&["--model", "gemma-3-27b", "--limit", "3"])?;
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("cannot hold"), "{stderr}");
    let (ok, stderr) = replay(&[
        "--model",
        "gemma-3-27b",
        "--limit",
        "3",
        "--pool-capacity",
        "64MiB",
    ])?;
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("cannot hold even the largest prompt's stored pages"),
        "{stderr}"
    );
    assert!(stderr.contains("largest_prompt_stored_bytes="), "{stderr}");
    Ok(())
}

/// Too few KV pages: the advice names the count that fits the whole workload (its
/// largest prompt), before the replay starts.
#[test]
fn kv_pages_advice_fits_the_whole_workload() -> TestResult {
    let flags = [
        "--generate",
        "long-multiturn",
        "--sessions",
        "2",
        "--turns",
        "3",
        "--first-turn-tokens",
        "3000",
        "--last-turn-tokens",
        "6000",
        "--system-prefix-tokens",
        "1000",
        "--kv-pages",
        "200",
        "--model",
        "tiny-full",
    ];
    let (ok, stderr) = replay(&flags)?;
    assert!(!ok, "a prompt larger than the cache ran");
    assert!(stderr.contains("the workload's largest prompt"), "{stderr}");
    assert!(stderr.contains("(6000 tokens"), "{stderr}");
    Ok(())
}

/// A layout whose one block is larger than a rank's KV memory gets advice, not
/// "--kv-pages = 0 is out of range".
#[test]
fn a_block_larger_than_the_kv_memory_is_explained() -> TestResult {
    let path = std::env::temp_dir().join(format!("kvc-huge-block-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "name = \"huge\"\ntokens_per_block = 1000000000\nworld_size = 1\n[[groups]]\nid = 0\n\
         kind = \"full\"\nlayers = [0]\nkv_heads = 8\nhead_dim = 128\ndtype_bytes = 2\n",
    )?;
    let layout = path.display().to_string();
    let result = replay(&["--set", &format!("model.layout_file={layout}")]);
    std::fs::remove_file(&path)?;
    let (ok, stderr) = result?;
    assert!(!ok);
    assert!(!stderr.contains("--kv-pages = 0"), "{stderr}");
    assert!(
        stderr.contains("one block of every layer group takes"),
        "{stderr}"
    );
    Ok(())
}

/// `--host-memory-limit` counts what every page costs beyond its bytes: a layout of tiny
/// blocks whose payload fits is refused before the replay allocates anything.
#[test]
fn the_host_memory_limit_counts_the_overhead_of_small_pages() -> TestResult {
    let path = std::env::temp_dir().join(format!("kvc-tiny-block-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "name = \"tiny-block\"\ntokens_per_block = 1\nworld_size = 1\n[[groups]]\nid = 0\n\
         kind = \"full\"\nlayers = [0]\nkv_heads = 1\nhead_dim = 1\ndtype_bytes = 1\n",
    )?;
    let layout = path.display().to_string();
    // One million 2-byte pages: 2 MB of payload, but about 160 MB with their overhead.
    let result = replay(&[
        "--layout",
        &layout,
        "--kv-pages",
        "1000000",
        "--host-memory-limit",
        "64MiB",
        "--connector",
        "none",
        "--limit",
        "1",
    ]);
    std::fs::remove_file(&path)?;
    let (ok, stderr) = result?;
    assert!(!ok, "the pages' overhead went past the limit unchecked");
    assert!(stderr.contains("before any page payload"), "{stderr}");
    assert!(stderr.contains("--host-memory-limit"), "{stderr}");
    Ok(())
}

/// A large `--world` multiplies the connectors' staging pools: refused up front, naming
/// the staging keys and a size that fits.
#[test]
fn the_host_memory_limit_counts_every_rank_s_staging_pools() -> TestResult {
    let (ok, stderr) = replay(&[
        "--model",
        "llama-3.1-8b",
        "--world",
        "8",
        "--instances",
        "2",
        "--limit",
        "1",
    ])?;
    assert!(
        !ok,
        "16 ranks of 768 MiB of staging went past 4 GiB unchecked"
    );
    assert!(
        stderr.contains("staging pools of the connectors of 16 ranks"),
        "{stderr}"
    );
    assert!(stderr.contains("--set saver.staging_bytes="), "{stderr}");
    Ok(())
}

/// Whether this host could give one allocation of `bytes` (RAM plus swap, as Linux's
/// default overcommit heuristic checks).
fn host_could_allocate(bytes: u64) -> bool {
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else {
        return true;
    };
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim_start_matches(':').trim().strip_suffix("kB"))
            .and_then(|kib| kib.trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    field("MemTotal") + field("SwapTotal") >= bytes
}

/// A staging pool the host cannot give fails with one line naming the key and a value that
/// fits, not an abort.
#[test]
fn a_staging_pool_the_host_refuses_names_the_key_and_a_size_that_fits() -> TestResult {
    if host_could_allocate(64 << 30) {
        println!("skipped: this host may give 64 GiB at once");
        return Ok(());
    }
    let output = Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args(["replay", "--quiet", "--limit", "1"])
        .args([
            "--host-memory-limit",
            "1TiB",
            "--set",
            "saver.staging_bytes=64GiB",
        ])
        .env_remove("RUST_LOG")
        .output()?;
    let stderr = String::from_utf8(output.stderr)?;
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("saver.staging_bytes = ") && stderr.contains("e.g. saver.staging_bytes="),
        "{stderr}"
    );
    assert!(!stderr.contains("memory allocation"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    Ok(())
}

/// Up front as well: with the default limit the same staging is refused before the replay.
#[test]
fn staging_past_the_host_memory_limit_is_refused_before_the_replay() -> TestResult {
    let (ok, stderr) = replay(&["--limit", "1", "--set", "saver.staging_bytes=64GiB"])?;
    assert!(!ok);
    assert!(stderr.contains("before any page payload"), "{stderr}");
    Ok(())
}
