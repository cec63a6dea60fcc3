//! Integration tests of the replay workloads: the Mooncake trace reader on the shared trace
//! and on bad files, the long multi-turn generator, and the oracle on both.
#![cfg(feature = "cli")]

use std::collections::HashMap;
use std::error::Error as _;
use std::path::{Path, PathBuf};

use kv_connector::core::hash::BlockHash;
use kv_connector::replay::workload::{
    extend_with_mooncake_block, generate_long_multiturn, read_mooncake_trace, GenerateError,
    LongMultiturnParams, Oracle, PromptSource, TraceError, WorkloadRequest, WorkloadSummary,
    MOONCAKE_BLOCK_TOKENS,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SHARED_TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/mooncake_synthetic_trace.jsonl"
);

/// Sum of `input_length` over the shared trace, from `../shared/traces/README.md`'s file.
const SHARED_TRACE_INPUT_TOKENS: u64 = 61_194_628;

/// A file under the system temp directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn with_bytes(name: &str, bytes: &[u8]) -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!(
            "kvc-workload-test-{}-{name}.jsonl",
            std::process::id()
        ));
        std::fs::write(&path, bytes)?;
        Ok(TempFile(path))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A chain of 16-byte `BLAKE2b` hashes (R1's shape) over 8-byte little-endian items.
fn chain_hashes<'a>(blocks: impl Iterator<Item = &'a [i64]>, out: &mut Vec<BlockHash>) {
    out.clear();
    let mut parent = [0_u8; 16];
    let mut bytes = Vec::new();
    for block in blocks {
        bytes.clear();
        bytes.extend_from_slice(&parent);
        for item in block {
            bytes.extend_from_slice(&item.to_le_bytes());
        }
        let digest = blake2b_simd::Params::new().hash_length(16).hash(&bytes);
        parent.copy_from_slice(digest.as_bytes());
        out.push(BlockHash(parent));
    }
}

fn mooncake_ids(request: &WorkloadRequest) -> &[u64] {
    match &request.prompt {
        PromptSource::MooncakeBlocks { hash_ids, .. } => hash_ids,
        PromptSource::Segments(_) => &[],
    }
}

// ---------------------------------------------------------------- the shared trace

#[test]
fn shared_trace_has_3993_requests_and_every_input_token() -> TestResult {
    let requests = read_mooncake_trace(Path::new(SHARED_TRACE), None)?;
    assert_eq!(requests.len(), 3_993);
    // The sum of `input_length` fields, computed independently of the reader.
    let mut expected_tokens = 0_u64;
    for line in std::fs::read_to_string(SHARED_TRACE)?.lines() {
        let value: serde_json::Value = serde_json::from_str(line)?;
        expected_tokens += value["input_length"].as_u64().ok_or("input_length")?;
    }
    assert_eq!(expected_tokens, SHARED_TRACE_INPUT_TOKENS);
    let summary = WorkloadSummary::of(&requests);
    assert_eq!(summary.prompt_tokens, expected_tokens);
    assert_eq!(summary.max_prompt_len, 191_378);
    assert_eq!(summary.last_arrival_ms, 1_022_025);
    assert!(requests
        .iter()
        .zip(0..)
        .all(|(request, id)| request.id == id));
    assert!(requests.iter().all(|request| request.session.is_none()));
    Ok(())
}

#[test]
fn shared_trace_limit_reads_the_first_requests() -> TestResult {
    let all = read_mooncake_trace(Path::new(SHARED_TRACE), None)?;
    let first = read_mooncake_trace(Path::new(SHARED_TRACE), Some(10))?;
    assert_eq!(first.as_slice(), &all[..10]);
    assert!(read_mooncake_trace(Path::new(SHARED_TRACE), Some(0))?.is_empty());
    Ok(())
}

#[test]
fn shared_trace_prompts_cut_the_last_block_exactly() -> TestResult {
    let requests = read_mooncake_trace(Path::new(SHARED_TRACE), Some(200))?;
    let mut tokens = Vec::new();
    let mut block = Vec::new();
    for request in &requests {
        request.write_prompt_tokens(&mut tokens);
        assert_eq!(tokens.len(), request.prompt_len());
        let ids = mooncake_ids(request);
        let last = *ids.last().ok_or("no ids")?;
        let cut = tokens.len() - (ids.len() - 1) * MOONCAKE_BLOCK_TOKENS;
        assert!((1..=MOONCAKE_BLOCK_TOKENS).contains(&cut));
        block.clear();
        extend_with_mooncake_block(&mut block, last, MOONCAKE_BLOCK_TOKENS);
        assert_eq!(
            &tokens[tokens.len() - cut..],
            &block[..cut],
            "request {}",
            request.id
        );
    }
    Ok(())
}

#[test]
fn shared_trace_equal_ids_give_equal_blocks_and_different_ids_differ() -> TestResult {
    let requests = read_mooncake_trace(Path::new(SHARED_TRACE), None)?;
    // The first block of every request, keyed by its hash id.
    let mut first_blocks: HashMap<u64, Vec<i64>> = HashMap::new();
    let mut repeats = 0;
    for request in requests
        .iter()
        .filter(|request| request.prompt_len() >= 512)
    {
        let tokens = request.prompt_tokens();
        let first_id = mooncake_ids(request)[0];
        match first_blocks.get(&first_id) {
            Some(block) => {
                assert_eq!(block.as_slice(), &tokens[..512], "id {first_id}");
                repeats += 1;
            }
            None => {
                first_blocks.insert(first_id, tokens[..512].to_vec());
            }
        }
        if repeats >= 20 && first_blocks.len() >= 50 {
            break;
        }
    }
    assert!(repeats >= 20, "the trace repeats first blocks: {repeats}");
    let distinct: std::collections::HashSet<&Vec<i64>> = first_blocks.values().collect();
    assert_eq!(
        distinct.len(),
        first_blocks.len(),
        "different ids, different tokens"
    );
    Ok(())
}

#[test]
fn oracle_on_the_shared_trace_reuses_65_percent_at_t512() -> TestResult {
    let requests = read_mooncake_trace(Path::new(SHARED_TRACE), None)?;
    let mut oracle = Oracle::new();
    let mut hashes = Vec::new();
    for request in &requests {
        // One chain item per full 512-token block: its hash id.
        let full_blocks = request.prompt_len() / MOONCAKE_BLOCK_TOKENS;
        let ids: Vec<i64> = mooncake_ids(request)[..full_blocks]
            .iter()
            .map(|&id| i64::try_from(id))
            .collect::<Result<_, _>>()?;
        chain_hashes(ids.chunks(1), &mut hashes);
        oracle.admit(&hashes, request.prompt_len(), MOONCAKE_BLOCK_TOKENS);
    }
    let totals = oracle.totals();
    assert_eq!(totals.prompt_tokens, SHARED_TRACE_INPUT_TOKENS);
    // Computed independently (a Python model of the same rule) from the same file.
    assert_eq!(totals.reusable_tokens, 39_802_880);
    assert_eq!(oracle.seen_blocks(), 40_148);
    let share = totals.reusable_share();
    println!("oracle share of the shared trace at T=512: {share:.4}");
    assert!((0.64..=0.66).contains(&share), "{share}");
    Ok(())
}

// ---------------------------------------------------------------- bad trace files

const GOOD_LINE: &str =
    r#"{"timestamp": 10, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}"#;

/// Reads a file whose line 1 is good and line 2 is `bad`; returns the error.
fn error_on_line_2(name: &str, bad: &str) -> Result<TraceError, Box<dyn std::error::Error>> {
    let file = TempFile::with_bytes(
        name,
        format!("{GOOD_LINE}\n{bad}\n{GOOD_LINE}\n").as_bytes(),
    )?;
    match read_mooncake_trace(&file.0, None) {
        Ok(requests) => Err(format!("{name}: accepted {} requests", requests.len()).into()),
        Err(err) => {
            let message = err.to_string();
            assert!(message.contains(&file.0.display().to_string()), "{message}");
            assert!(message.contains("line 2"), "{message}");
            assert_eq!(err.line(), Some(2), "{message}");
            Ok(err)
        }
    }
}

/// A line with the four fields, each given as JSON text.
fn line_with(timestamp: &str, input_length: &str, output_length: &str, hash_ids: &str) -> String {
    format!(
        r#"{{"timestamp": {timestamp}, "input_length": {input_length}, "output_length": {output_length}, "hash_ids": {hash_ids}}}"#
    )
}

/// Each case: a name, the bad line 2, the error kind, and a fragment its message (with its
/// source, lower-cased) must hold: the field and the value.
fn check_bad_lines(cases: &[(&str, String, &str, &str)]) -> TestResult {
    for (name, bad, kind, fragment) in cases {
        let err = error_on_line_2(name, bad)?;
        assert_eq!(err.kind(), *kind, "{name}: {err}");
        let message = match err.source() {
            Some(source) => format!("{err}: {source}").to_lowercase(),
            None => err.to_string(),
        };
        assert!(
            message.contains(fragment),
            "{name}: {message:?} lacks {fragment:?}"
        );
    }
    Ok(())
}

#[test]
fn v1_bad_shapes_and_fields_name_the_line_and_field() -> TestResult {
    let ok_rest = r#""output_length": 4, "hash_ids": [1, 2]"#;
    check_bad_lines(&[
        (
            "not-json",
            r#"{"timestamp": 1,"#.into(),
            "not_json_object",
            "json",
        ),
        ("not-object", "[1, 2]".into(), "not_json_object", "[1,2]"),
        (
            "unknown",
            format!(r#"{{"timestamp": 1, "input_length": 600, {ok_rest}, "session": 3}}"#),
            "unknown_field",
            r#"unknown field "session""#,
        ),
        (
            "missing-timestamp",
            format!(r#"{{"input_length": 600, {ok_rest}}}"#),
            "missing_field",
            r#"missing field "timestamp""#,
        ),
        (
            "missing-input",
            format!(r#"{{"timestamp": 11, {ok_rest}}}"#),
            "missing_field",
            r#"missing field "input_length""#,
        ),
        (
            "missing-output",
            r#"{"timestamp": 11, "input_length": 600, "hash_ids": [1, 2]}"#.into(),
            "missing_field",
            r#"missing field "output_length""#,
        ),
        (
            "missing-ids",
            r#"{"timestamp": 11, "input_length": 600, "output_length": 4}"#.into(),
            "missing_field",
            r#"missing field "hash_ids""#,
        ),
    ])
}

#[test]
fn v1_wrong_types_name_the_field_and_value() -> TestResult {
    let huge = "18446744073709551616";
    check_bad_lines(&[
        (
            "string-length",
            line_with("11", r#""600""#, "4", "[1, 2]"),
            "wrong_type",
            r#"input_length must be a non-negative integer, got "600""#,
        ),
        (
            "fraction",
            line_with("11", "600.5", "4", "[1, 2]"),
            "wrong_type",
            "input_length must be a non-negative integer, got 600.5",
        ),
        (
            "beyond-64-bits",
            line_with(huge, "600", "4", "[1, 2]"),
            "wrong_type",
            "timestamp must",
        ),
        (
            "ids-not-array",
            line_with("11", "600", "4", "7"),
            "wrong_type",
            "hash_ids must be an array of non-negative integers, got 7",
        ),
        (
            "id-string",
            line_with("11", "600", "4", r#"[1, "x"]"#),
            "wrong_type",
            r#"hash_ids[1] must be a non-negative integer, got "x""#,
        ),
    ])
}

#[test]
fn v2_v3_out_of_range_values_name_the_field_and_value() -> TestResult {
    check_bad_lines(&[
        (
            "negative-output",
            line_with("11", "600", "-3", "[1, 2]"),
            "out_of_range",
            "output_length must not be negative, got -3",
        ),
        (
            "negative-id",
            line_with("11", "600", "4", "[1, -2]"),
            "out_of_range",
            "hash_ids[1] must not be negative, got -2",
        ),
        (
            "negative-timestamp",
            line_with("-1", "600", "4", "[1, 2]"),
            "out_of_range",
            "timestamp must not be negative, got -1",
        ),
        (
            "zero-input",
            line_with("11", "0", "4", "[]"),
            "out_of_range",
            "input_length must be at least 1, got 0",
        ),
        (
            "zero-output",
            line_with("11", "600", "0", "[1, 2]"),
            "out_of_range",
            "output_length must be at least 1, got 0",
        ),
        (
            "big-input",
            line_with("11", "5000000", "4", "[1]"),
            "too_large",
            "input_length is 5000000, above the limit 4194304",
        ),
        (
            "big-output",
            line_with("11", "600", "2000000", "[1, 2]"),
            "too_large",
            "output_length is 2000000, above the limit 1048576",
        ),
        (
            "big-timestamp",
            line_with("2000000000000", "600", "4", "[1, 2]"),
            "too_large",
            "timestamp is 2000000000000, above the limit 1000000000000",
        ),
    ])
}

#[test]
fn v2_v4_inconsistent_lines_name_both_values() -> TestResult {
    check_bad_lines(&[
        (
            "few-ids",
            line_with("11", "1025", "4", "[1, 2]"),
            "hash_id_count",
            "input_length 1025 needs 3 hash ids of 512 tokens, got 2",
        ),
        (
            "many-ids",
            line_with("11", "512", "4", "[1, 2]"),
            "hash_id_count",
            "input_length 512 needs 1 hash ids of 512 tokens, got 2",
        ),
        (
            "backwards",
            line_with("9", "600", "4", "[1, 2]"),
            "timestamp_backwards",
            "timestamp 9 is earlier than the previous request's 10",
        ),
    ])
}

#[test]
fn bad_lines_are_reported_as_structured_fields() -> TestResult {
    let err = error_on_line_2(
        "structured",
        r#"{"timestamp": 11, "input_length": 600, "output_length": 4, "hash_ids": [1, 2, 3]}"#,
    )?;
    assert!(matches!(
        err,
        TraceError::HashIdCountMismatch {
            line: 2,
            input_length: 600,
            needed_hash_ids: 2,
            hash_ids: 3,
            ..
        }
    ));
    Ok(())
}

#[test]
fn bytes_that_are_not_utf8_are_not_json() -> TestResult {
    let mut bytes = format!("{GOOD_LINE}\n").into_bytes();
    bytes.extend_from_slice(b"{\"timestamp\": \xff}\n");
    let file = TempFile::with_bytes("utf8", &bytes)?;
    let err = read_mooncake_trace(&file.0, None).err();
    assert!(
        matches!(err, Some(TraceError::NotJson { line: 2, .. })),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn empty_and_missing_files_are_refused() -> TestResult {
    let empty = TempFile::with_bytes("empty", b"")?;
    let err = read_mooncake_trace(&empty.0, None).err();
    assert!(matches!(err, Some(TraceError::Empty { .. })), "{err:?}");
    let blank = TempFile::with_bytes("blank", b"\n \n\n")?;
    let err = read_mooncake_trace(&blank.0, Some(5)).err();
    assert!(matches!(err, Some(TraceError::Empty { .. })), "{err:?}");
    let missing = std::env::temp_dir().join("kvc-workload-test-no-such-file.jsonl");
    let err = read_mooncake_trace(&missing, None).err();
    assert!(matches!(&err, Some(TraceError::Open { .. })), "{err:?}");
    assert_eq!(err.map(|err| err.kind()), Some("io"));
    Ok(())
}

#[test]
fn a_limit_stops_before_a_later_bad_line() -> TestResult {
    let file = TempFile::with_bytes(
        "limit",
        format!("{GOOD_LINE}\n{GOOD_LINE}\nnot json\n").as_bytes(),
    )?;
    assert_eq!(read_mooncake_trace(&file.0, Some(2))?.len(), 2);
    let err = read_mooncake_trace(&file.0, Some(3)).err();
    assert!(
        matches!(err, Some(TraceError::NotJson { line: 3, .. })),
        "{err:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------- the generator

fn small_params() -> LongMultiturnParams {
    LongMultiturnParams {
        sessions: 3,
        turns_per_session: 5,
        first_turn_tokens: 10_000,
        last_turn_tokens: 17_000,
        output_tokens: 300,
        system_prefix_tokens: 2_000,
        ..LongMultiturnParams::default()
    }
}

fn common_prefix(left: &[i64], right: &[i64]) -> usize {
    left.iter().zip(right).take_while(|(a, b)| a == b).count()
}

/// Prompt tokens of each session's turns, in turn order.
fn tokens_by_session(requests: &[WorkloadRequest]) -> HashMap<u64, Vec<Vec<i64>>> {
    let mut sessions: HashMap<u64, Vec<Vec<i64>>> = HashMap::new();
    for request in requests {
        let session = request.session.unwrap_or(u64::MAX);
        sessions
            .entry(session)
            .or_default()
            .push(request.prompt_tokens());
    }
    sessions
}

#[test]
fn generator_is_deterministic_for_a_seed() -> TestResult {
    let params = small_params();
    let first = generate_long_multiturn(&params)?;
    let second = generate_long_multiturn(&params)?;
    assert_eq!(first, second);
    assert_eq!(first[7].prompt_tokens(), second[7].prompt_tokens());
    let other_seed = generate_long_multiturn(&LongMultiturnParams { seed: 1, ..params })?;
    let same_turn = &other_seed[7];
    assert_eq!(same_turn.prompt_len(), first[7].prompt_len());
    assert_ne!(same_turn.prompt_tokens(), first[7].prompt_tokens());
    Ok(())
}

#[test]
fn generator_grows_turns_from_first_to_last_and_shares_prefixes() -> TestResult {
    let params = small_params();
    let requests = generate_long_multiturn(&params)?;
    assert_eq!(requests.len(), 15);
    let sessions = tokens_by_session(&requests);
    assert_eq!(sessions.len(), 3);
    for turns in sessions.values() {
        let lens: Vec<usize> = turns.iter().map(Vec::len).collect();
        assert_eq!(lens, [10_000, 11_750, 13_500, 15_250, 17_000]);
        for pair in turns.windows(2) {
            assert_eq!(
                common_prefix(&pair[0], &pair[1]),
                pair[0].len(),
                "generate::I3"
            );
        }
    }
    // `generate::I4`: sessions share the system prefix and nothing after it.
    assert_eq!(common_prefix(&sessions[&0][0], &sessions[&1][0]), 2_000);
    assert_eq!(common_prefix(&sessions[&1][4], &sessions[&2][4]), 2_000);
    Ok(())
}

#[test]
fn generator_arrivals_interleave_sessions() -> TestResult {
    let requests = generate_long_multiturn(&LongMultiturnParams::default())?;
    assert!(requests
        .windows(2)
        .all(|pair| pair[0].arrival_ms <= pair[1].arrival_ms));
    assert!(requests
        .iter()
        .zip(0..)
        .all(|(request, id)| request.id == id));
    let order: Vec<u64> = requests
        .iter()
        .filter_map(|request| request.session)
        .collect();
    assert_eq!(&order[..6], &[0, 1, 0, 1, 0, 1]);
    assert_eq!(requests[1].arrival_ms, 10_000);
    assert_eq!(requests[2].arrival_ms, 30_000);
    Ok(())
}

#[test]
fn generator_divergence_rerenders_only_the_tail() -> TestResult {
    let params = LongMultiturnParams {
        divergence_tokens_max: 700,
        ..small_params()
    };
    let requests = generate_long_multiturn(&params)?;
    let mut diverged = 0;
    for turns in tokens_by_session(&requests).values() {
        let lens: Vec<usize> = turns.iter().map(Vec::len).collect();
        assert_eq!(
            lens,
            [10_000, 11_750, 13_500, 15_250, 17_000],
            "lengths unchanged"
        );
        for pair in turns.windows(2) {
            let shared = common_prefix(&pair[0], &pair[1]);
            assert!(shared + 700 >= pair[0].len(), "{shared}");
            diverged += usize::from(shared < pair[0].len());
        }
    }
    assert!(
        diverged >= 6,
        "most turns re-render some tokens: {diverged} of 12"
    );
    Ok(())
}

#[test]
fn generator_refuses_bad_parameters() {
    let base = small_params();
    let cases = [
        (
            LongMultiturnParams {
                sessions: 0,
                ..base
            },
            "zero_parameter",
        ),
        (
            LongMultiturnParams {
                turns_per_session: 0,
                ..base
            },
            "zero_parameter",
        ),
        (
            LongMultiturnParams {
                output_tokens: 0,
                ..base
            },
            "zero_parameter",
        ),
        (
            LongMultiturnParams {
                system_prefix_tokens: 10_000,
                ..base
            },
            "inconsistent_lengths",
        ),
        (
            LongMultiturnParams {
                last_turn_tokens: 9_999,
                ..base
            },
            "inconsistent_lengths",
        ),
        (
            LongMultiturnParams {
                output_tokens: 1_750,
                ..base
            },
            "inconsistent_lengths",
        ),
        (
            LongMultiturnParams {
                last_turn_tokens: 5_000_000,
                ..base
            },
            "too_large",
        ),
        (
            LongMultiturnParams {
                sessions: 1_000_000,
                ..base
            },
            "too_large",
        ),
        (
            LongMultiturnParams {
                think_time_ms: u64::MAX,
                ..base
            },
            "too_large",
        ),
    ];
    for (params, kind) in cases {
        let err = generate_long_multiturn(&params).err();
        assert_eq!(
            err.as_ref().map(GenerateError::kind),
            Some(kind),
            "{params:?}: {err:?}"
        );
    }
    let err = generate_long_multiturn(&LongMultiturnParams {
        output_tokens: 1_750,
        ..base
    })
    .err();
    assert_eq!(
        err,
        Some(GenerateError::GrowthTooSmall {
            growth_per_turn: 1_750,
            output_tokens: 1_750
        })
    );
    assert!(err.is_some_and(|err| err.to_string().contains("at most 1749")));
}

/// Oracle share of a generated workload with chain hashes over its real tokens.
fn generated_share(
    params: &LongMultiturnParams,
    tokens_per_block: usize,
) -> Result<f64, GenerateError> {
    let requests = generate_long_multiturn(params)?;
    let mut oracle = Oracle::new();
    let mut tokens = Vec::new();
    let mut hashes = Vec::new();
    for request in &requests {
        request.write_prompt_tokens(&mut tokens);
        chain_hashes(tokens.chunks_exact(tokens_per_block), &mut hashes);
        oracle.admit(&hashes, tokens.len(), tokens_per_block);
    }
    assert_eq!(oracle.totals().prompt_tokens, params.total_prompt_tokens());
    Ok(oracle.totals().reusable_share())
}

#[test]
fn generator_defaults_are_small_and_at_least_96_percent_reusable() -> TestResult {
    let params = LongMultiturnParams::default();
    let summary = WorkloadSummary::of(&generate_long_multiturn(&params)?);
    assert_eq!(summary.prompt_tokens, params.total_prompt_tokens());
    assert_eq!(
        summary.prompt_tokens, 6_479_978,
        "a few million tokens: 48 turns of 100k..170k"
    );
    assert_eq!(summary.max_prompt_len, 170_000);
    let share = generated_share(&params, 32)?;
    println!("oracle share of the long multi-turn defaults at T=32: {share:.4}");
    assert!((0.96..0.97).contains(&share), "{share}");
    Ok(())
}

#[test]
fn generator_divergence_lowers_the_oracle_share() -> TestResult {
    let params = small_params();
    let exact = generated_share(&params, 16)?;
    let diverging = generated_share(
        &LongMultiturnParams {
            divergence_tokens_max: 700,
            ..params
        },
        16,
    )?;
    assert!(diverging < exact, "{diverging} < {exact}");
    Ok(())
}
