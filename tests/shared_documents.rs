//! The shared-documents workload (`--generate shared-documents`): conversations share a
//! system prefix and one of a few long documents (`generate::I4`), so later conversations
//! resume at a document's end, where no prompt ended. The tests check the generator's
//! sharing, the three oracles on its defaults (the prompt-end window oracle misses what the
//! checkpoint window oracle gets, R28) and that a replay of a small instance reports both
//! window oracles.
#![cfg(feature = "cli")]

mod common;

use std::num::NonZeroUsize;

use kv_connector::core::hash::{hash_blocks, scope_seed, Scope};
use kv_connector::replay::workload::{
    generate_long_multiturn, GenerateError, LongMultiturnParams, Oracle, OracleTotals,
    WorkloadRequest, WorkloadSummary,
};

use common::{replay_json, report_field};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Prompt tokens of each session's turns, in turn order.
fn turns_by_session(requests: &[WorkloadRequest]) -> Vec<Vec<Vec<i64>>> {
    let mut sessions: Vec<Vec<Vec<i64>>> = Vec::new();
    for request in requests {
        let session = usize::try_from(request.session.unwrap_or(0)).unwrap_or(usize::MAX);
        if sessions.len() <= session {
            sessions.resize(session + 1, Vec::new());
        }
        sessions[session].push(request.prompt_tokens());
    }
    sessions
}

fn common_prefix(left: &[i64], right: &[i64]) -> usize {
    left.iter().zip(right).take_while(|(a, b)| a == b).count()
}

#[test]
fn sessions_share_the_system_prefix_and_their_document() -> TestResult {
    let params = LongMultiturnParams::shared_documents();
    let requests = generate_long_multiturn(&params)?;
    let summary = WorkloadSummary::of(&requests);
    assert_eq!(summary.requests, 64);
    assert_eq!(summary.prompt_tokens, 3_520_000);
    assert_eq!(summary.prompt_tokens, params.total_prompt_tokens());
    assert_eq!(params.shared_prefix_tokens(), 50_000);
    let sessions = turns_by_session(&requests);
    assert_eq!(sessions.len(), 32);
    for turns in &sessions {
        let lens: Vec<usize> = turns.iter().map(Vec::len).collect();
        assert_eq!(lens, [54_000, 56_000], "generate::I2");
        assert_eq!(common_prefix(&turns[0], &turns[1]), 54_000, "generate::I3");
    }
    // `generate::I4`: sessions 0, 4, 8, ... have document 0; 1, 5, ... document 1.
    assert_eq!(params.document_of(9), Some(1));
    assert_eq!(common_prefix(&sessions[0][0], &sessions[4][0]), 50_000);
    assert_eq!(common_prefix(&sessions[1][1], &sessions[9][1]), 50_000);
    assert_eq!(common_prefix(&sessions[0][0], &sessions[1][0]), 20_000);
    assert_eq!(common_prefix(&sessions[3][1], &sessions[6][0]), 20_000);
    // Without documents the same lengths share the system prefix only.
    let plain = LongMultiturnParams {
        documents: 0,
        document_tokens: 0,
        sessions: 5,
        ..params
    };
    assert_eq!(plain.document_of(4), None);
    let plain = turns_by_session(&generate_long_multiturn(&plain)?);
    assert_eq!(common_prefix(&plain[0][0], &plain[4][0]), 20_000);
    Ok(())
}

#[test]
fn document_parameters_are_checked() -> TestResult {
    let params = LongMultiturnParams::shared_documents();
    assert_eq!(params.validate(), Ok(()));
    for (documents, document_tokens) in [(0, 30_000), (4, 0)] {
        let err = LongMultiturnParams {
            documents,
            document_tokens,
            ..params
        }
        .validate();
        assert_eq!(
            err,
            Err(GenerateError::DocumentsWithoutTokens {
                documents,
                document_tokens
            })
        );
    }
    let err = LongMultiturnParams {
        document_tokens: 34_000,
        ..params
    }
    .validate();
    assert_eq!(
        err,
        Err(GenerateError::DocumentTooLong {
            system_prefix_tokens: 20_000,
            document_tokens: 34_000,
            first_turn_tokens: 54_000
        })
    );
    assert!(err.is_err_and(|err| err.kind() == "inconsistent_lengths"
        && err.to_string().contains("lower document_tokens")));
    // A re-rendered tail never reaches into the document (`generate::I3`).
    let diverging = LongMultiturnParams {
        divergence_tokens_max: 10_000,
        sessions: 4,
        ..params
    };
    for turns in turns_by_session(&generate_long_multiturn(&diverging)?) {
        assert!(common_prefix(&turns[0], &turns[1]) >= 50_000);
    }
    Ok(())
}

/// The oracles' totals over the shared-documents defaults at `T`, `R = 2048` (the default
/// rewind) and window checkpoints every `interval` tokens.
fn oracle_totals(
    tokens_per_block: usize,
    interval: usize,
) -> Result<OracleTotals, Box<dyn std::error::Error>> {
    let requests = generate_long_multiturn(&LongMultiturnParams::shared_documents())?;
    let seed = scope_seed(&Scope::default());
    let mut oracle = Oracle::with_window(2048, NonZeroUsize::new(interval));
    let mut tokens = Vec::new();
    for request in &requests {
        request.write_prompt_tokens(&mut tokens);
        let hashes = hash_blocks(seed, &tokens, tokens_per_block)?;
        oracle.admit(&hashes, tokens.len(), tokens_per_block);
    }
    Ok(oracle.totals())
}

#[expect(clippy::cast_precision_loss, reason = "token counts far below 2^52")]
fn share(part: u64, whole: u64) -> f64 {
    part as f64 / whole as f64
}

/// The defaults, by hand at `T = 32`: the three sessions that open documents 1-3 share the
/// system prefix (20,000 tokens, block aligned), the 28 later first turns share a document
/// through 50,000 tokens (49,984 at a block boundary), every second turn its first turn
/// through 53,984. No prompt ends within `R` after 20,000 or 49,984 (first turns end at
/// 54,000), so the prompt-end window oracle gets only the second turns; the checkpoint
/// window oracle gets 16,384 and 49,152 (the multiples of 8192 below) in the first turns.
/// At `T = 16` the boundaries fall at 50,000 and 54,000 exactly.
#[test]
fn checkpoints_serve_the_shared_documents_where_prompt_ends_do_not() -> TestResult {
    for (tokens_per_block, full, window, checkpoint) in [
        (32, 3_187_040, 1_727_488, 3_152_896),
        (16, 3_188_000, 1_728_000, 3_153_408),
    ] {
        let totals = oracle_totals(tokens_per_block, 8192)?;
        assert_eq!(totals.prompt_tokens, 3_520_000);
        assert_eq!(totals.reusable_tokens, full, "T = {tokens_per_block}");
        assert_eq!(totals.window_reusable_tokens, window);
        assert_eq!(totals.window_checkpoint_reusable_tokens, checkpoint);
        let checkpoint_share = share(checkpoint, full);
        let window_share = share(window, full);
        println!(
            "shared-documents at T = {tokens_per_block}: oracle {full}, prompt-end window \
             {window} ({:.1} %), checkpoint window {checkpoint} ({:.1} %)",
            100.0 * window_share,
            100.0 * checkpoint_share
        );
        assert!(checkpoint_share >= 0.97, "{checkpoint_share}");
        assert!(window_share < 0.6, "{window_share}");
    }
    // Checkpoints off: the checkpoint window oracle is the prompt-end one.
    let off = oracle_totals(32, 0)?;
    assert_eq!(off.window_reusable_tokens, 1_727_488);
    assert_eq!(off.window_checkpoint_reusable_tokens, 1_727_488);
    Ok(())
}

/// A small instance on tiny-hybrid (`T = 16`, `W = 64`): 6 sessions over 2 documents, each
/// first turn a 640-token system prefix, a 1,000-token document and a 360-token question,
/// `R = 64`, checkpoints every 512 tokens. The report carries both window oracles.
#[test]
fn a_small_replay_reports_both_window_oracles() -> TestResult {
    let flags = |interval: &'static str| {
        [
            "--generate",
            "shared-documents",
            "--model",
            "tiny-hybrid",
            "--sessions",
            "6",
            "--documents",
            "2",
            "--system-prefix-tokens",
            "640",
            "--document-tokens",
            "1000",
            "--first-turn-tokens",
            "2000",
            "--last-turn-tokens",
            "2200",
            "--output-tokens",
            "16",
            "--swa-rewind-tokens",
            "64",
            "--set",
            interval,
        ]
    };
    let report = replay_json(&flags("saver.window_checkpoint_tokens=512"))?;
    assert_eq!(report["setup"]["window_checkpoint_tokens"], 512);
    assert_eq!(report_field(&report, "requests")?, 12);
    let full = report_field(&report, "oracle_reusable_tokens")?;
    let window = report_field(&report, "oracle_window_reusable_tokens")?;
    let checkpoint = report_field(&report, "oracle_window_checkpoint_reusable_tokens")?;
    // Sessions 1 and 2..5 resume in the system prefix (512) or the document (1536); the
    // second turns at their first turn's end (2000), as both window oracles do.
    assert_eq!(full, 640 + 4 * 1_632 + 6 * 2_000);
    assert_eq!(window, 6 * 2_000);
    assert_eq!(checkpoint, 512 + 4 * 1_536 + 6 * 2_000);
    let reused = report_field(&report, "reused_tokens")?;
    let shares = [
        ("reused_share_of_window_oracle", window),
        ("reused_share_of_window_checkpoint_oracle", checkpoint),
    ];
    for (field, oracle) in shares {
        let value = report[field].as_f64().ok_or(field)?;
        assert!((value - share(reused, oracle)).abs() < 1e-9, "{field}");
    }
    assert_eq!(report_field(&report, "mismatched_pages")?, 0);
    // The connector resumes at the checkpoints (R28): everything the checkpoint oracle
    // gives, for window pages saved for checkpoints alone.
    assert_eq!(
        reused, checkpoint,
        "reuse reaches the checkpoint window oracle"
    );
    assert!(
        report["lookups"]["checkpoint"]
            .as_u64()
            .ok_or("checkpoint")?
            > 0
    );
    assert!(report_field(&report, "checkpoint_pages_enqueued")? > 0);
    let off = replay_json(&flags("saver.window_checkpoint_tokens=0"))?;
    assert!(
        report_field(&off, "reused_tokens")? < reused,
        "without checkpoints the first turns resume only at prompt ends"
    );
    assert_eq!(report_field(&off, "checkpoint_pages_enqueued")?, 0);
    assert_eq!(report_field(&off, "mismatched_pages")?, 0);
    assert_eq!(report_field(&off, "oracle_window_reusable_tokens")?, window);
    assert_eq!(
        report_field(&off, "oracle_window_checkpoint_reusable_tokens")?,
        window
    );
    Ok(())
}
