//! Invariant labels. A label `module::Xn` names invariant `n` (letter `X`) of the module or
//! page whose path it starts with: one or more lower-case segments (`[a-z_][a-z0-9_]*`)
//! joined by `::`, then one capital letter and digits, as a whole word (`ledger::I3`,
//! `kv_cache::draft::X1`, `arch::I9`). `Self::I3`, `GroupKind::Window` or
//! `crate::Foo::X1` are Rust paths, not labels.
//!
//! - A label is defined once, where its module documents it, by a list item that starts
//!   with the backticked label and a full stop (after indentation and a comment marker
//!   `//!`, `///`, `//` or `#`, if any): ``- `ledger::I3`. A request has at most ...``.
//! - Any other occurrence is a citation, backticked or not. A citation may go on with the
//!   same letter: `` `planner::P1`-P8 `` and `` `oracle::O1`..O6 `` cite every label of the
//!   range, `` `save_order::I5`, I7 `` and `` `trace::V3`/V4 `` each one named.
//! - A bare `- X<n>.` item (no module) defines nothing a citation could name: only
//!   `docs/DESIGN.md` defines bare names, its rules `R<n>`.

use std::collections::{BTreeMap, BTreeSet};

use crate::{citing_files, relative, text};

/// Whether `byte` continues a word, so that a label may not start or end beside it.
fn is_word_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || !byte.is_ascii()
}

fn is_segment_byte(byte: u8) -> bool {
    byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_'
}

/// Where the module path ending just before the `::` at `colons` starts, if the text
/// before it is a whole label path: lower-case segments joined by `::`, not preceded by a
/// word character or a colon.
fn path_start(bytes: &[u8], colons: usize) -> Option<usize> {
    let mut end = colons;
    loop {
        let len = bytes[..end]
            .iter()
            .rev()
            .take_while(|b| is_segment_byte(**b))
            .count();
        let start = end - len;
        if len == 0 || bytes[start].is_ascii_digit() {
            return None;
        }
        if bytes[..start].ends_with(b"::") {
            end = start - 2;
            continue;
        }
        let before = start.checked_sub(1).map(|i| bytes[i]);
        return (!before.is_some_and(|b| is_word_byte(b) || b == b':')).then_some(start);
    }
}

/// The labels of `line`, as `(start, end)` byte ranges, in order.
fn label_spans(line: &str) -> Vec<(usize, usize)> {
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    for (colons, _) in line.match_indices("::") {
        let letter = colons + 2;
        if !bytes.get(letter).is_some_and(u8::is_ascii_uppercase) {
            continue;
        }
        let digits = bytes[letter + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let end = letter + 1 + digits;
        if digits == 0 || bytes.get(end).is_some_and(|b| is_word_byte(*b)) {
            continue;
        }
        if let Some(start) = path_start(bytes, colons) {
            out.push((start, end));
        }
    }
    out
}

/// Whether `text` is exactly one label.
fn is_label(text: &str) -> bool {
    label_spans(text) == [(0, text.len())]
}

/// The separator, number and rest of a citation's next item in `rest`: `-X3`, `..X3`,
/// `/X3` or `, X3` for the letter `X`.
fn next_item(rest: &str, letter: u8) -> Option<(&'static str, u32, &str)> {
    let (separator, after) = ["-", "..", "/", ", "]
        .into_iter()
        .find_map(|s| Some((s, rest.strip_prefix(s)?)))?;
    let after = after.strip_prefix(char::from(letter))?;
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    let whole = !after
        .as_bytes()
        .get(digits)
        .is_some_and(|b| is_word_byte(*b));
    let number = after[..digits].parse().ok().filter(|_| whole)?;
    Some((separator, number, &after[digits..]))
}

/// The numbers a citation goes on with after byte `end` of `line` (see the module doc),
/// given the cited label's letter and number.
fn continued(line: &str, end: usize, letter: u8, first: u32) -> Vec<u32> {
    let mut rest = line[end..].strip_prefix('`').unwrap_or(&line[end..]);
    let mut last = first;
    let mut out = Vec::new();
    while let Some((separator, number, after)) = next_item(rest, letter) {
        if matches!(separator, "-" | "..") {
            out.extend(last.saturating_add(1)..number);
        }
        out.push(number);
        last = number;
        rest = after;
    }
    out
}

/// Every label `text` cites, ranges and lists expanded.
pub(crate) fn cited_labels(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        for (start, end) in label_spans(line) {
            let label = &line[start..end];
            let (path, tail) = label.rsplit_once("::").unwrap_or(("", label));
            let (letter, number) = (tail.as_bytes()[0], &tail[1..]);
            if let Ok(first) = number.parse() {
                for n in continued(line, end, letter, first) {
                    out.insert(format!("{path}::{}{n}", char::from(letter)));
                }
            }
            out.insert(label.to_string());
        }
    }
    out
}

/// A line's text after its indentation and comment marker.
fn uncommented(line: &str) -> &str {
    let line = line.trim_start();
    ["//!", "///", "//", "#"]
        .into_iter()
        .find_map(|marker| line.strip_prefix(marker))
        .unwrap_or(line)
        .trim_start()
}

/// The labels `text` defines, in order, once per definition: lines
/// ``- `module::Xn`. ...``.
pub(crate) fn defined_labels(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let rest = uncommented(line).strip_prefix("- `")?;
            let (label, after) = rest.split_once('`')?;
            (after.starts_with('.') && is_label(label)).then(|| label.to_string())
        })
        .collect()
}

/// Lines of `text` that define a bare `X<n>` (a list item `- X<n>.`), as `line: text`.
pub(crate) fn bare_definitions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let Some(rest) = uncommented(line).strip_prefix("- ") else {
            continue;
        };
        let rest = rest.trim_start_matches(['*', '(']);
        let mut chars = rest.chars();
        let letter = chars.next().is_some_and(|c| c.is_ascii_uppercase());
        let digits = chars
            .as_str()
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let stop = chars.as_str()[digits..].starts_with(['.', ')', '*', ':']);
        if letter && digits > 0 && stop {
            out.push(format!("{}: {}", number + 1, line.trim()));
        }
    }
    out
}

/// The files that define each label, once per definition.
pub(crate) fn definitions<'a>(
    files: impl IntoIterator<Item = (String, &'a str)>,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (file, text) in files {
        for label in defined_labels(text) {
            out.entry(label).or_default().push(file.clone());
        }
    }
    out
}

#[test]
fn every_cited_label_is_defined_once() -> anyhow::Result<()> {
    let mut texts = Vec::new();
    for file in citing_files()? {
        texts.push((relative(&file), text(&file)?));
    }
    let defined = definitions(texts.iter().map(|(f, t)| (f.clone(), t.as_str())));
    let mut problems: Vec<String> = defined
        .iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|(label, files)| format!("{label}: defined in each of {}", files.join(", ")))
        .collect();
    let mut cited = BTreeSet::new();
    for (file, text) in &texts {
        for label in cited_labels(text) {
            if !defined.contains_key(&label) {
                problems.push(format!("{file}: {label} is cited but defined nowhere"));
            }
            cited.insert(label);
        }
        for line in bare_definitions(text) {
            if file != "docs/DESIGN.md" {
                problems.push(format!("{file}:{line}: name the invariant `module::Xn`"));
            }
        }
    }
    assert!(
        defined.len() > 100 && cited.len() >= defined.len(),
        "labels defined: {}, cited: {}; is the scanner blind?",
        defined.len(),
        cited.len()
    );
    assert!(
        problems.is_empty(),
        "invariant labels:\n{}",
        problems.join("\n")
    );
    Ok(())
}

#[test]
fn label_scanner_finds_citations_ranges_and_lists() {
    let text = [
        "see `ledger::I3` and kv_cache::draft::X1 (`planner::P1`-P3), `oracle::O1`..O2,",
        "`save_order::I5`, I7, `trace::V3`/V4; `gpu::I2`-R4 and `gpu::I5`, I/O; not Self::I3,",
        "GroupKind::Window, crate::Foo::X1, a::b, x::I2x, 9a::I1 or ::I9",
    ]
    .join("\n");
    let want = [
        "gpu::I2",
        "gpu::I5",
        "kv_cache::draft::X1",
        "ledger::I3",
        "oracle::O1",
        "oracle::O2",
        "planner::P1",
        "planner::P2",
        "planner::P3",
        "save_order::I5",
        "save_order::I7",
        "trace::V3",
        "trace::V4",
    ];
    assert_eq!(cited_labels(&text), want.map(String::from).into());
}

#[test]
fn label_scanner_finds_definitions_in_one_shape() {
    let text = [
        "//! - `ledger::I1`. Rust module doc.",
        "    /// - `gpu::I2`. Item doc.",
        "# - `vllm::worker::W1`. Python comment.",
        "- `arch::I3`. Markdown.",
        "- `arch::I4` no full stop",
        "  (`ledger::I5`). a citation",
        "- **`ledger::I6`** bold",
        "- `Self::I7`. not a label",
    ]
    .join("\n");
    let defined = defined_labels(&text);
    assert_eq!(
        defined,
        ["ledger::I1", "gpu::I2", "vllm::worker::W1", "arch::I3"]
    );
    let again = "  - `arch::I3`. Again.";
    let files = [("a".to_string(), text.as_str()), ("b".to_string(), again)];
    let defined = definitions(files);
    assert_eq!(defined["arch::I3"], ["a", "b"]);
    assert_eq!(defined["ledger::I1"], ["a"]);
}

#[test]
fn bare_definition_scanner_finds_unlabelled_items() {
    let text = [
        "//! - P1. Bare.",
        "- **(P2)** Bare too.",
        "  - E3: and this.",
        "- `arch::I1`. Labelled.",
        "- PR1. a word",
        "- P. no number",
        "- see P4.",
    ]
    .join("\n");
    let found = bare_definitions(&text);
    assert_eq!(
        found,
        [
            "1: //! - P1. Bare.",
            "2: - **(P2)** Bare too.",
            "3: - E3: and this."
        ]
    );
}
