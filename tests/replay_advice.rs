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
