//! The built `kv-connector keys` binary against the reference vectors and the library
//! (R1, R3): it prints the reference's hashes and keys, matches the one-shot library
//! functions on random input, and fails cleanly (no panic, non-zero exit) on bad input.
#![cfg(feature = "cli")]

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use kv_connector::core::hash::{hash_blocks, scope_seed, BlockHash, Scope};
use kv_connector::core::keys::{KeyPrefix, KeySpec, Shard};
use kv_connector::core::layout::GroupId;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

type TestResult = Result<(), Box<dyn Error>>;

/// One row of `--json` output.
#[derive(Debug, PartialEq, Eq, serde::Deserialize)]
struct Row {
    block: usize,
    hash: String,
    keys: Vec<String>,
}

/// The fields of a vector case this test needs.
#[derive(serde::Deserialize)]
struct Case {
    name: String,
    tokens: Vec<i64>,
    tokens_per_block: usize,
    salt: Option<String>,
    lora: Option<i64>,
    media_hex: Vec<String>,
    hashes_hex: Vec<String>,
    keys_w2r1_lg0: Vec<String>,
    keys_replicated_lg1: Vec<String>,
}

#[derive(serde::Deserialize)]
struct Vectors {
    cases: Vec<Case>,
}

/// Runs the binary with `args`, feeding `stdin`.
fn run_binary(args: &[String], stdin: &str) -> Result<Output, Box<dyn Error>> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kv-connector"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let written = child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(stdin.as_bytes());
    // A run that fails on its flags exits without reading stdin: the pipe may close first.
    match written {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other?,
    }
    Ok(child.wait_with_output()?)
}

/// Runs the binary with `--json` and parses its rows.
fn run_json(args: &[String], stdin: &str) -> Result<Vec<Row>, Box<dyn Error>> {
    let mut args = args.to_vec();
    args.push("--json".to_owned());
    let output = run_binary(&args, stdin)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?} failed: {stderr}");
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// `keys` arguments common to every call, then `extra`.
fn keys_args(tokens_per_block: usize, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "keys",
        "--namespace",
        "ns",
        "--model-key",
        "model-a",
        "--tokens-per-block",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    args.push(tokens_per_block.to_string());
    args.extend(extra.iter().map(ToString::to_string));
    args
}

fn scope_args(salt: Option<&str>, lora: Option<i64>, media_hex: &[String]) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(salt) = salt {
        args.extend(["--salt".to_owned(), salt.to_owned()]);
    }
    if let Some(lora) = lora {
        args.extend(["--lora".to_owned(), lora.to_string()]);
    }
    for digest in media_hex {
        args.extend(["--media-digest".to_owned(), digest.clone()]);
    }
    args
}

fn load_cases() -> Result<Vec<Case>, Box<dyn Error>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/hash_vectors.json");
    let vectors: Vectors = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    Ok(vectors.cases)
}

fn json_tokens(tokens: &[i64]) -> Result<String, serde_json::Error> {
    serde_json::to_string(tokens)
}

fn text_tokens(tokens: &[i64]) -> String {
    let words: Vec<String> = tokens.iter().map(ToString::to_string).collect();
    words.join(" ")
}

#[test]
fn r3_binary_json_matches_reference_vectors() -> TestResult {
    for case in load_cases()? {
        let scope = scope_args(case.salt.as_deref(), case.lora, &case.media_hex);
        let columns = [
            (
                [
                    "--world",
                    "2",
                    "--rank",
                    "1",
                    "--group",
                    "0",
                    "--bytes-per-page",
                    "4096",
                ]
                .as_slice(),
                &case.keys_w2r1_lg0,
            ),
            (
                ["--replicated", "--group", "1", "--bytes-per-page", "512"].as_slice(),
                &case.keys_replicated_lg1,
            ),
        ];
        for (flags, expected_keys) in columns {
            let mut args = keys_args(case.tokens_per_block, flags);
            args.extend(scope.iter().cloned());
            let rows = run_json(&args, &json_tokens(&case.tokens)?)?;
            let expected: Vec<Row> = case
                .hashes_hex
                .iter()
                .zip(expected_keys)
                .enumerate()
                .map(|(block, (hash, key))| Row {
                    block,
                    hash: hash.clone(),
                    keys: vec![key.clone()],
                })
                .collect();
            assert_eq!(rows, expected, "{} {flags:?}", case.name);
        }
    }
    Ok(())
}

#[test]
fn r3_binary_text_matches_reference_vectors() -> TestResult {
    for case in load_cases()? {
        let mut args = keys_args(
            case.tokens_per_block,
            &["--world", "2", "--rank", "1", "--bytes-per-page", "4096"],
        );
        args.extend(scope_args(case.salt.as_deref(), case.lora, &case.media_hex));
        let output = run_binary(&args, &text_tokens(&case.tokens))?;
        assert!(output.status.success(), "{}", case.name);
        let expected: Vec<String> = case
            .hashes_hex
            .iter()
            .zip(&case.keys_w2r1_lg0)
            .enumerate()
            .map(|(block, (hash, key))| format!("{block}\t{hash}\t{key}"))
            .collect();
        let stdout = String::from_utf8(output.stdout)?;
        assert_eq!(
            stdout.lines().collect::<Vec<_>>(),
            expected,
            "{}",
            case.name
        );
        assert!(stdout.ends_with('\n'), "{}", case.name);
    }
    Ok(())
}

/// Runs the binary on bad input and returns its stderr, checking it failed without a panic.
fn failing_stderr(
    extra: &[&str],
    tokens_per_block: usize,
    stdin: &str,
) -> Result<String, Box<dyn Error>> {
    let output = run_binary(&keys_args(tokens_per_block, extra), stdin)?;
    let stderr = String::from_utf8(output.stderr)?;
    assert!(!output.status.success(), "{extra:?} succeeded");
    assert_ne!(output.status.code(), Some(101), "panicked: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.stdout.is_empty(), "printed output before failing");
    Ok(stderr)
}

#[test]
fn bad_input_fails_with_a_clear_error() -> TestResult {
    let stderr = failing_stderr(&["--bytes-per-page", "1"], 4, "1 2 3\n4 five 6\n")?;
    assert!(
        stderr.contains("line 2") && stderr.contains("\"five\""),
        "{stderr}"
    );
    let stderr = failing_stderr(
        &["--bytes-per-page", "1", "--world", "2", "--rank", "2"],
        4,
        "1",
    )?;
    assert!(
        stderr.contains("--rank 2 must be below --world 2"),
        "{stderr}"
    );
    let stderr = failing_stderr(&["--bytes-per-page", "1"], 0, "1")?;
    assert!(
        stderr.contains("--tokens-per-block must be at least 1"),
        "{stderr}"
    );
    let stderr = failing_stderr(&["--bytes-per-page", "1"], 4, "[1, \"a\"]")?;
    assert!(stderr.contains("not a JSON array"), "{stderr}");
    let stderr = failing_stderr(
        &["--replicated", "--rank", "1", "--bytes-per-page", "1"],
        4,
        "",
    )?;
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    Ok(())
}

/// Key fields the runtime refuses are refused here too: `keys` never prints a key the
/// runtime cannot produce, and input without a full block says so instead of printing
/// nothing.
#[test]
fn keys_the_runtime_never_produces_are_refused() -> TestResult {
    let tokens = "1 2 3 4 5 6 7 8";
    for (flag, value, expected) in [
        ("--namespace", "", "namespace must not be empty"),
        ("--namespace", "a/b", "namespace must not contain '/'"),
        ("--model-key", "x/y", "model_key must not contain '/'"),
        ("--namespace", "a\tb", "whitespace or control characters"),
    ] {
        let mut args = keys_args(4, &["--bytes-per-page", "1"]);
        let at = args
            .iter()
            .position(|arg| arg == flag)
            .ok_or("flag not in the common arguments")?;
        value.clone_into(&mut args[at + 1]);
        let output = run_binary(&args, tokens)?;
        let stderr = String::from_utf8(output.stderr)?;
        assert!(!output.status.success(), "{flag} accepted");
        assert!(stderr.contains(expected), "{flag}: {stderr}");
        assert!(output.stdout.is_empty());
    }
    let stderr = failing_stderr(&["--bytes-per-page", "0"], 4, tokens)?;
    assert!(
        stderr.contains("bytes_per_page must be at least 1"),
        "{stderr}"
    );
    for input in ["", "1 2 3"] {
        let stderr = failing_stderr(&["--bytes-per-page", "1"], 4, input)?;
        assert!(stderr.contains("no full block"), "{input:?}: {stderr}");
    }
    Ok(())
}

/// Expected `--json` rows computed with the library's one-shot functions.
fn expected_rows(input: &RandomInput) -> Result<Vec<Row>, Box<dyn Error>> {
    let scope = Scope {
        salt: input.salt.clone(),
        lora: input.lora,
        media: input.media.clone(),
    };
    let hashes = hash_blocks(scope_seed(&scope), &input.tokens, input.tokens_per_block)?;
    let prefixes: Vec<KeyPrefix> = input
        .groups
        .iter()
        .map(|&group| {
            KeyPrefix::new(&KeySpec {
                namespace: "ns",
                model_key: "model-a",
                shard: input.shard,
                group: GroupId(group),
                tokens_per_block: input.tokens_per_block,
                bytes_per_page: input.bytes_per_page,
            })
        })
        .collect();
    Ok(hashes
        .iter()
        .enumerate()
        .map(|(block, hash)| Row {
            block,
            hash: hash.to_hex(),
            keys: prefixes.iter().map(|prefix| prefix.key(hash)).collect(),
        })
        .collect())
}

#[derive(Debug, Clone)]
struct RandomInput {
    tokens: Vec<i64>,
    tokens_per_block: usize,
    salt: Option<String>,
    lora: Option<i64>,
    media: Vec<[u8; 32]>,
    shard: Shard,
    groups: Vec<u32>,
    bytes_per_page: u64,
    as_json: bool,
}

impl RandomInput {
    fn args(&self) -> Vec<String> {
        let media_hex: Vec<String> = self
            .media
            .iter()
            .map(|digest| {
                let (high, low) = digest.split_at(16);
                let half = |bytes: &[u8]| {
                    let mut hash = [0u8; 16];
                    hash.copy_from_slice(bytes);
                    BlockHash(hash).to_hex()
                };
                half(high) + &half(low)
            })
            .collect();
        let mut args = keys_args(self.tokens_per_block, &[]);
        args.extend([
            "--bytes-per-page".to_owned(),
            self.bytes_per_page.to_string(),
        ]);
        match self.shard {
            Shard::Replicated => args.push("--replicated".to_owned()),
            Shard::Rank { world, rank } => args.extend([
                "--world".to_owned(),
                world.to_string(),
                "--rank".to_owned(),
                rank.to_string(),
            ]),
        }
        for group in &self.groups {
            args.extend(["--group".to_owned(), group.to_string()]);
        }
        args.extend(scope_args(self.salt.as_deref(), self.lora, &media_hex));
        args
    }
}

fn random_input() -> impl Strategy<Value = RandomInput> {
    let shard = prop_oneof![
        Just(Shard::Replicated),
        (1u32..9)
            .prop_flat_map(|world| (0..world).prop_map(move |rank| Shard::Rank { world, rank })),
    ];
    (
        proptest::collection::vec(any::<i64>(), 0..700),
        1usize..70,
        proptest::option::of("[a-z0-9 é-]{0,12}"),
        proptest::option::of(any::<i64>()),
        proptest::collection::vec(any::<[u8; 32]>(), 0..3),
        shard,
        proptest::collection::vec(0u32..40, 1..4),
        1u64..1 << 40,
        any::<bool>(),
    )
        .prop_map(
            |(
                tokens,
                tokens_per_block,
                salt,
                lora,
                media,
                shard,
                groups,
                bytes_per_page,
                as_json,
            )| RandomInput {
                tokens,
                tokens_per_block,
                salt,
                lora,
                media,
                shard,
                groups,
                bytes_per_page,
                as_json,
            },
        )
}

proptest! {
    #![proptest_config(Config {
        cases: 24,
        rng_seed: RngSeed::Fixed(0x006b_6579_7363_6c69),
        failure_persistence: None,
        ..Config::default()
    })]

    /// R1, R3: on random input the binary prints what the library's one-shot functions give.
    #[test]
    fn r1_binary_matches_library_on_random_input(input in random_input()) {
        let stdin = if input.as_json {
            json_tokens(&input.tokens).map_err(|e| TestCaseError::fail(e.to_string()))?
        } else {
            text_tokens(&input.tokens)
        };
        if input.tokens.len() < input.tokens_per_block {
            let output = run_binary(&input.args(), &stdin)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(!output.status.success());
            prop_assert!(String::from_utf8_lossy(&output.stderr).contains("no full block"));
            return Ok(());
        }
        let rows = run_json(&input.args(), &stdin).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let expected = expected_rows(&input).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(rows.len(), input.tokens.len() / input.tokens_per_block);
        prop_assert_eq!(rows, expected);
    }
}
