//! Bad input: every malformed or impossible input is refused with a
//! typed error whose message names where it came from (file and line, or the setting)
//! and, where the user can fix it, a value that works. Nothing panics.
//!
//! One table per input kind: configuration, layout files, trace lines. A pool answer of
//! the wrong length is covered next to the code that checks it
//! (`transfer::tests::a_pool_answer_of_the_wrong_length_fails_the_load_r5_r25`),
//! oversized counts, sizes and timeouts in `config::validate::tests`.
#![cfg(feature = "cli")]

use std::collections::HashMap;
use std::error::Error;
use std::io::Cursor;
use std::path::Path;

use kv_connector::config::{parse_override, Config, ConfigSources};
use kv_connector::core::layout::Layout;
use kv_connector::replay::workload::{TraceReader, MAX_LINE_BYTES};

type TestResult = Result<(), Box<dyn Error>>;

/// The error's message followed by its sources, as `main` prints it (`{:#}`).
fn message_chain(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn assert_mentions(case: &str, message: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            message.contains(part),
            "{case}: {part:?} missing from {message:?}"
        );
    }
}

/// A configuration file's text plus environment variables and `--set` overrides.
struct ConfigCase {
    name: &'static str,
    toml: &'static str,
    env: &'static [(&'static str, &'static str)],
    set: &'static [&'static str],
    mentions: &'static [&'static str],
}

/// The configuration cases: each is refused, and its message mentions every part.
const CONFIG_CASES: &[ConfigCase] = &[
    ConfigCase {
        name: "malformed toml",
        toml: "[saver]\nqueue_capacity_pages = 8\n[loaders\n",
        env: &[],
        set: &[],
        mentions: &["bad.toml", "not valid toml", "line 3"],
    },
    ConfigCase {
        name: "unknown key with a near miss",
        toml: "[saver]\nwindow_frist = true\n",
        env: &[],
        set: &[],
        mentions: &[
            "saver.window_frist",
            "file bad.toml",
            "did you mean `saver.window_first`",
        ],
    },
    ConfigCase {
        name: "unknown section",
        toml: "[savers]\nwindow_first = true\n",
        env: &[],
        set: &[],
        mentions: &["savers", "file bad.toml"],
    },
    ConfigCase {
        name: "unknown environment variable",
        toml: "",
        env: &[("KVC_SAVER_WINDOW_FRIST", "1")],
        set: &[],
        mentions: &["KVC_SAVER_WINDOW_FRIST", "environment variable"],
    },
    ConfigCase {
        name: "wrong type in the file",
        toml: "[saver]\nqueue_capacity_pages = \"many\"\n",
        env: &[],
        set: &[],
        mentions: &["saver.queue_capacity_pages", "file bad.toml", "such as"],
    },
    ConfigCase {
        name: "negative count",
        toml: "[saver]\nqueue_capacity_pages = -1\n",
        env: &[],
        set: &[],
        mentions: &["saver.queue_capacity_pages", "-1", "such as"],
    },
    ConfigCase {
        name: "integer too large for toml",
        toml: "[saver]\nqueue_capacity_pages = 99999999999999999999\n",
        env: &[],
        set: &[],
        mentions: &["bad.toml", "line 2"],
    },
    ConfigCase {
        name: "oversized staging pool",
        toml: "[saver]\nstaging_bytes = 1099511627776\n",
        env: &[],
        set: &[],
        mentions: &[
            "saver.staging_bytes",
            "KVC_SAVER_STAGING_BYTES",
            "at most",
            "e.g. 268435456",
        ],
    },
    ConfigCase {
        name: "oversized value from the environment",
        toml: "",
        env: &[("KVC_SAVER_QUEUE_CAPACITY_PAGES", "99999999999999999999")],
        set: &[],
        mentions: &[
            "KVC_SAVER_QUEUE_CAPACITY_PAGES",
            "99999999999999999999",
            "such as",
        ],
    },
    ConfigCase {
        name: "zero where at least one is needed",
        toml: "",
        env: &[],
        set: &["loaders.load_threads=0"],
        mentions: &["loaders.load_threads", "at least 1", "e.g. 2"],
    },
    ConfigCase {
        name: "impossible ratio",
        toml: "[pool]\neviction_ratio = 1.5\n",
        env: &[],
        set: &[],
        mentions: &["pool.eviction_ratio", "1.5", "e.g. 0.05"],
    },
    ConfigCase {
        name: "section given a value",
        toml: "saver = 3\n",
        env: &[],
        set: &[],
        mentions: &["saver", "table"],
    },
];

#[test]
fn bad_configuration_is_refused_naming_the_file_or_setting() -> TestResult {
    for case in CONFIG_CASES {
        let sources = ConfigSources {
            env: case
                .env
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect::<HashMap<_, _>>(),
            cli_overrides: case
                .set
                .iter()
                .map(|text| parse_override(text))
                .collect::<Result<_, _>>()?,
            ..ConfigSources::default()
        };
        let Err(err) = Config::load_toml_text(case.toml, Path::new("bad.toml"), &sources) else {
            panic!("{}: accepted", case.name);
        };
        assert_mentions(case.name, &message_chain(&err), case.mentions);
    }
    Ok(())
}

#[test]
fn a_malformed_override_names_the_argument_and_the_form() {
    let Err(err) = parse_override("saver.queue_capacity_pages") else {
        panic!("an override without '=' was accepted");
    };
    assert_mentions(
        "override",
        &err.to_string(),
        &["saver.queue_capacity_pages", "section.key=value"],
    );
}

#[test]
fn a_missing_configuration_file_names_the_path() {
    let sources = ConfigSources {
        toml_path: Some("/nonexistent/kvc.toml".into()),
        ..ConfigSources::default()
    };
    let Err(err) = Config::load(&sources) else {
        panic!("a missing file was accepted");
    };
    assert_mentions(
        "missing file",
        &message_chain(&err),
        &["/nonexistent/kvc.toml"],
    );
}

/// One layer group in layout TOML (tiny-hybrid's shape), with `extra` lines appended.
const HEADER: &str = "name = \"bad\"\ntokens_per_block = 16\nworld_size = 1\n";

#[test]
fn impossible_layouts_are_refused_naming_the_group_and_field() {
    let full = "[[groups]]\nid = 0\nkind = \"full\"\nlayers = [0, 1]\nkv_heads = 2\nhead_dim = 16\ndtype_bytes = 2\n";
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        ("missing groups", HEADER.to_owned(), vec!["layout bad.toml", "line 1", "groups"]),
        (
            "no groups (R7)",
            format!("{HEADER}groups = []\n"),
            vec!["no groups", "[[groups]]"],
        ),
        (
            "sinks not below the window (R7)",
            format!("{HEADER}[[groups]]\nid = 0\nkind = \"window\"\nwindow_tokens = 8\nsink_tokens = 8\nlayers = [0]\nkv_heads = 2\nhead_dim = 16\ndtype_bytes = 2\n"),
            vec!["group 0", "sink_tokens (8)", "window_tokens (8)"],
        ),
        (
            "window of zero (R7)",
            format!("{HEADER}[[groups]]\nid = 0\nkind = \"window\"\nwindow_tokens = 0\nsink_tokens = 0\nlayers = [0]\nkv_heads = 2\nhead_dim = 16\ndtype_bytes = 2\n"),
            vec!["group 0", "window_tokens"],
        ),
        (
            "page size zero (R7)",
            format!("{HEADER}[[groups]]\nid = 0\nkind = \"full\"\nlayers = [0]\nkv_heads = 0\nhead_dim = 16\ndtype_bytes = 2\n"),
            vec!["group 0", "kv_heads", "at least 1"],
        ),
        (
            "layer listed twice (R7)",
            format!("{HEADER}{full}[[groups]]\nid = 1\nkind = \"full\"\nlayers = [1]\nkv_heads = 2\nhead_dim = 16\ndtype_bytes = 2\n"),
            vec!["layer 1", "listed twice"],
        ),
        (
            "page size overflows",
            "name = \"bad\"\ntokens_per_block = 4294967295\nworld_size = 1\n[[groups]]\nid = 0\nkind = \"full\"\nlayers = [0]\nkv_heads = 4294967295\nhead_dim = 4294967295\ndtype_bytes = 4294967295\n".to_owned(),
            vec!["group 0", "overflows", "e.g. head_dim = 128"],
        ),
        (
            "negative size",
            format!("{HEADER}[[groups]]\nid = 0\nkind = \"full\"\nlayers = [0]\nkv_heads = -2\nhead_dim = 16\ndtype_bytes = 2\n"),
            vec!["layout bad.toml", "kv_heads"],
        ),
        (
            "unknown field",
            format!("{HEADER}{full}windows = 3\n"),
            vec!["layout bad.toml", "windows"],
        ),
        (
            "malformed toml",
            format!("{HEADER}[[groups]\n"),
            vec!["layout bad.toml", "line 4"],
        ),
        (
            "zero tokens per block",
            format!("name = \"bad\"\ntokens_per_block = 0\nworld_size = 1\n{full}"),
            vec!["tokens_per_block", "32"],
        ),
    ];
    for (name, text, mentions) in cases {
        let Err(err) = Layout::from_toml_str(&text, "bad.toml") else {
            panic!("{name}: accepted");
        };
        assert_mentions(name, &message_chain(&err), &mentions);
    }
}

#[test]
fn bad_trace_lines_are_refused_naming_the_file_and_line() {
    let good = r#"{"timestamp": 10, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}"#;
    let long_line = format!(
        r#"{{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1], "pad": "{}"}}"#,
        "x".repeat(usize::try_from(MAX_LINE_BYTES).unwrap_or(usize::MAX))
    );
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        ("not json", "{timestamp: 1".to_owned(), vec!["not valid JSON"]),
        ("not an object", "[1, 2, 3]".to_owned(), vec!["expected a JSON object"]),
        (
            "negative input length",
            r#"{"timestamp": 20, "input_length": -5, "output_length": 4, "hash_ids": [1]}"#.to_owned(),
            vec!["input_length", "negative", "-5"],
        ),
        (
            "negative hash id",
            r#"{"timestamp": 20, "input_length": 5, "output_length": 4, "hash_ids": [-1]}"#.to_owned(),
            vec!["hash_ids"],
        ),
        (
            "hash ids inconsistent with the input length",
            r#"{"timestamp": 20, "input_length": 1500, "output_length": 4, "hash_ids": [1]}"#.to_owned(),
            vec!["input_length 1500", "needs 3 hash ids", "got 1"],
        ),
        (
            "fractional length",
            r#"{"timestamp": 20, "input_length": 5.5, "output_length": 4, "hash_ids": [1]}"#.to_owned(),
            vec!["input_length", "5.5"],
        ),
        (
            "oversized input length",
            r#"{"timestamp": 20, "input_length": 99999999999, "output_length": 4, "hash_ids": [1]}"#.to_owned(),
            vec!["input_length", "above the limit"],
        ),
        (
            "zero output length",
            r#"{"timestamp": 20, "input_length": 5, "output_length": 0, "hash_ids": [1]}"#.to_owned(),
            vec!["output_length", "at least 1"],
        ),
        (
            "timestamp going back",
            r#"{"timestamp": 5, "input_length": 5, "output_length": 4, "hash_ids": [1]}"#.to_owned(),
            vec!["timestamp 5", "previous request's 10", "sort the trace"],
        ),
        (
            "misspelt field",
            r#"{"timestamp": 20, "input_lenght": 5, "output_length": 4, "hash_ids": [1]}"#.to_owned(),
            vec!["input_lenght"],
        ),
        ("line too long", long_line, vec!["longer than"]),
    ];
    for (name, bad, mentions) in cases {
        // The bad line is line 3: a good line and a blank line come first.
        let text = format!("{good}\n\n{bad}\n{good}\n");
        let results: Vec<_> =
            TraceReader::new(Cursor::new(text.into_bytes()), "bad.jsonl").collect();
        assert_eq!(
            results.len(),
            2,
            "{name}: one request, then the error ends the read"
        );
        assert!(
            results[0].is_ok(),
            "{name}: the good line before it is kept"
        );
        let Some(Err(err)) = results.last() else {
            panic!("{name}: accepted");
        };
        let message = message_chain(err);
        assert_mentions(name, &message, &["trace file bad.jsonl, line 3"]);
        assert_mentions(name, &message, &mentions);
    }
}
