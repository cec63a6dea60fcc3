//! The docs are references a newcomer can follow inside the repository:
//!
//! - every rule `R<n>` cited in [`CITING`] (the sources and docs of `src/`, `crates/`,
//!   `tests/`, `docs/` and the other folders there) or `README.md` is defined in
//!   `docs/DESIGN.md`, where a definition is a line that starts (after indentation) with
//!   `- R<n>.`;
//! - every invariant label `module::Xn` cited there is defined exactly once, by a list item
//!   ``- `module::Xn`. ...`` where its module documents it, and no other list item defines a
//!   bare `X<n>` (the syntax: [`labels`]);
//! - no file under `src/`, `crates/` or `docs/`, and not `README.md`, names an issue
//!   number, a session or a style-guide item (the patterns of [`history_mentions`]);
//! - every relative link of a Markdown file (`[text](path#anchor)`, resolved from the
//!   file's folder) and every backticked repository path in one (`` `docs/...` ``,
//!   `` `src/...` ``, `` `tests/...` `` and the other top-level folders, resolved from the
//!   repository root) names a file or folder that exists, and a link's anchor names a
//!   heading of the linked page.
//!
//! Each check is a function from file contents to the violations it finds; the scanner
//! tests feed them known-bad text, so a scanner that finds nothing cannot pass unnoticed.
//! Hidden folders, `__pycache__` and `target` (caches and build output) are not scanned,
//! nor files holding a NUL byte (binaries).

#[path = "docs/labels.rs"]
mod labels;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// Top-level folders whose backticked paths a doc may name.
const REPO_FOLDERS: [&str; 8] = [
    "docs/",
    "src/",
    "tests/",
    "scripts/",
    "config/",
    "examples/",
    "benches/",
    "fuzz/",
];

/// The folders whose files may cite rules and labels (with `README.md`).
const CITING: [&str; 8] = [
    "src",
    "crates",
    "tests",
    "docs",
    "examples",
    "benches",
    "config",
    "fuzz/fuzz_targets",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether a folder holds caches or build output rather than sources.
fn is_skipped(folder: &Path) -> bool {
    folder
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with('.') || name == "__pycache__" || name == "target")
}

/// Every file under `dir` (relative to the repository root), sorted, outside hidden,
/// `__pycache__` and `target` folders.
fn files_under(dir: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root().join(dir)];
    while let Some(path) = stack.pop() {
        if path.is_dir() && !is_skipped(&path) {
            for entry in fs::read_dir(&path).with_context(|| format!("{}", path.display()))? {
                stack.push(entry?.path());
            }
        } else if path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// A file's text; bytes that are not UTF-8 are replaced, which no pattern here matches,
/// and a binary (a file holding a NUL byte) reads as empty.
pub(crate) fn text(path: &Path) -> anyhow::Result<String> {
    let bytes = fs::read(path).with_context(|| format!("{}", path.display()))?;
    if bytes.contains(&0) {
        return Ok(String::new());
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `README.md` and every file under [`CITING`].
pub(crate) fn citing_files() -> anyhow::Result<Vec<PathBuf>> {
    let mut files = vec![root().join("README.md")];
    for dir in CITING {
        files.extend(files_under(dir)?);
    }
    Ok(files)
}

pub(crate) fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Starts of the whole-word occurrences of `word` in `line` (ASCII case-insensitive when
/// `fold`), each with the run of digits that follows it (after `gap`, skipped if present).
fn numbered(line: &str, word: &str, gap: &[&str], fold: bool) -> Vec<(usize, String)> {
    let haystack = if fold {
        line.to_ascii_lowercase()
    } else {
        line.to_string()
    };
    let word = if fold {
        word.to_ascii_lowercase()
    } else {
        word.to_string()
    };
    let mut out = Vec::new();
    for (start, _) in haystack.match_indices(&word) {
        if haystack[..start].chars().next_back().is_some_and(is_word) {
            continue;
        }
        let mut rest = &haystack[start + word.len()..];
        for skip in gap {
            rest = rest.strip_prefix(skip).unwrap_or(rest);
        }
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = rest[digits.len()..].chars().next();
        if !digits.is_empty() && !after.is_some_and(is_word) {
            out.push((start, digits));
        }
    }
    out
}

/// The rule numbers `text` cites: every whole word `R<digits>`.
fn cited_rules(text: &str) -> BTreeSet<u32> {
    text.lines()
        .flat_map(|line| numbered(line, "R", &[], false))
        .filter_map(|(_, digits)| digits.parse().ok())
        .collect()
}

/// The rule numbers `design` defines: lines starting with `- R<n>.`.
fn defined_rules(design: &str) -> BTreeSet<u32> {
    design
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("- R"))
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            rest[digits.len()..]
                .starts_with('.')
                .then(|| digits.parse().ok())?
        })
        .collect()
}

/// Lines of `text` that name an issue, a session or a style-guide item: `issue 3`,
/// `issues 3`, `issue #3`, `session 4`, `STYLE G1` and any whole word `G<1-2 digits>`
/// (case-insensitive) but the tail of a label (`python::connector::G1`), as `line: text`.
fn history_mentions(text: &str) -> Vec<String> {
    let patterns: [(&str, &[&str]); 4] = [
        ("issue", &[" ", "s", " ", "#"]),
        ("session", &[" "]),
        ("style g", &[]),
        ("g", &[]),
    ];
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let hit = patterns.iter().any(|(word, gap)| {
            numbered(line, word, gap, true)
                .iter()
                .any(|(start, digits)| {
                    *word != "g" || (digits.len() <= 2 && !line[..*start].ends_with("::"))
                })
        });
        if hit {
            out.push(format!("{}: {}", number + 1, line.trim()));
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| is_word(*c) || *c == '-' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of a Markdown text outside code fences.
fn prose(markdown: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push(line);
        }
    }
    out
}

/// The anchors of a Markdown page's headings.
fn anchors(markdown: &str) -> BTreeSet<String> {
    prose(markdown)
        .into_iter()
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor_of(line.trim_start_matches('#')))
        .collect()
}

/// Relative link targets of a Markdown text: `[text](target)`, no URLs or bare anchors.
fn link_targets(markdown: &str) -> Vec<String> {
    let prose = prose(markdown).join("\n");
    let mut out = Vec::new();
    for (start, _) in prose.match_indices("](") {
        let rest = &prose[start + 2..];
        let Some(end) = rest.find(')') else { continue };
        let target = &rest[..end];
        let external = target.contains("://") || target.starts_with("mailto:");
        if !external && !target.starts_with('#') && !target.contains(char::is_whitespace) {
            out.push(target.to_string());
        }
    }
    out
}

/// Repository paths named in backticks: `` `src/...` `` and the other [`REPO_FOLDERS`],
/// without a trailing `::item`, with `{a,b}` expanded; placeholders (`<x>`, `*`, `$`) and
/// text with spaces are not paths.
fn backticked_paths(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let spans = prose(markdown)
        .into_iter()
        .flat_map(|line| line.split('`').enumerate());
    for (index, span) in spans {
        let is_code = index % 2 == 1;
        let is_path = REPO_FOLDERS.iter().any(|folder| span.starts_with(folder));
        if !is_code || !is_path || span.contains(['<', '*', '$', ' ']) {
            continue;
        }
        let path = span.split("::").next().unwrap_or(span);
        match (path.find('{'), path.find('}')) {
            (Some(open), Some(close)) if open < close => {
                for choice in path[open + 1..close].split(',') {
                    out.push(format!("{}{choice}{}", &path[..open], &path[close + 1..]));
                }
            }
            _ => out.push(path.to_string()),
        }
    }
    out
}

/// Broken references of the Markdown file at `file` (absolute), as `target: why`.
fn broken_references(file: &Path, markdown: &str) -> anyhow::Result<Vec<String>> {
    let folder = file.parent().context("a file has a folder")?;
    let mut out = Vec::new();
    for target in link_targets(markdown) {
        let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let resolved = folder.join(path);
        let is_page = resolved
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("md"));
        if !resolved.exists() {
            out.push(format!("{target}: no such file"));
        } else if !anchor.is_empty() && is_page && !anchors(&text(&resolved)?).contains(anchor) {
            out.push(format!("{target}: no heading with this anchor"));
        }
    }
    for path in backticked_paths(markdown) {
        if !root().join(&path).exists() {
            out.push(format!("`{path}`: no such file"));
        }
    }
    Ok(out)
}

/// Every Markdown file of the repository, outside build output.
fn markdown_files() -> anyhow::Result<Vec<PathBuf>> {
    let mut files = vec![root().join("README.md")];
    for dir in [
        "docs", "src", "crates", "tests", "examples", "benches", "config", "scripts",
    ] {
        files.extend(
            files_under(dir)?
                .into_iter()
                .filter(|f| f.extension().is_some_and(|e| e.eq_ignore_ascii_case("md"))),
        );
    }
    Ok(files)
}

#[test]
fn every_cited_rule_is_defined_in_design_md() -> anyhow::Result<()> {
    let defined = defined_rules(&text(&root().join("docs/DESIGN.md"))?);
    let mut missing = Vec::new();
    for file in &citing_files()? {
        for rule in cited_rules(&text(file)?).difference(&defined) {
            missing.push(format!("{}: R{rule}", relative(file)));
        }
    }
    assert!(!defined.is_empty(), "docs/DESIGN.md defines no rule");
    assert!(
        missing.is_empty(),
        "rules cited but not defined in docs/DESIGN.md:\n{}",
        missing.join("\n")
    );
    Ok(())
}

#[test]
fn docs_and_code_name_no_issue_session_or_style_item() -> anyhow::Result<()> {
    let mut files = vec![root().join("README.md")];
    for dir in ["src", "crates", "docs"] {
        files.extend(files_under(dir)?);
    }
    let mut found = Vec::new();
    for file in &files {
        for mention in history_mentions(&text(file)?) {
            found.push(format!("{}:{mention}", relative(file)));
        }
    }
    assert!(
        found.is_empty(),
        "say what the code does instead:\n{}",
        found.join("\n")
    );
    Ok(())
}

#[test]
fn every_relative_reference_of_a_doc_exists() -> anyhow::Result<()> {
    let mut broken = Vec::new();
    for file in markdown_files()? {
        for reference in broken_references(&file, &text(&file)?)? {
            broken.push(format!("{}: {reference}", relative(&file)));
        }
    }
    assert!(
        broken.is_empty(),
        "broken references:\n{}",
        broken.join("\n")
    );
    Ok(())
}

#[test]
fn rule_scanners_find_citations_and_definitions() {
    let undefined = format!("R{}", 4 * 25);
    let cited = cited_rules(&format!(
        "see R3, R10-R15 and {undefined}; not PR7, R2x or xR4"
    ));
    assert_eq!(cited, BTreeSet::from([3, 10, 15, 100]));
    let design = "- R1. First.\n  - R2. Nested.\n- R3 no dot\nR4. no dash\n";
    assert_eq!(defined_rules(design), BTreeSet::from([1, 2]));
}

#[test]
fn history_scanner_finds_issues_sessions_and_style_items() {
    let bad = "fixed in issue 8\nsee Issues #12\nsession 4 notes\nper STYLE G11\nG9 here\n";
    assert_eq!(history_mentions(bad).len(), 5);
    let good = "an issue queue\nsessions 4 and session-level\nG100 or dG1 or eg1\ntissue 3\n\
                the label `python::connector::G1`\n";
    assert_eq!(history_mentions(good), Vec::<String>::new());
}

#[test]
fn reference_scanner_finds_missing_files_and_anchors() -> anyhow::Result<()> {
    let file = root().join("docs/ARCHITECTURE.md");
    let markdown = "[ok](DESIGN.md#9-configuration) [gone](NOWHERE.md) \
                    [bad anchor](DESIGN.md#no-such-heading) [web](https://example.com) \
                    `src/lib.rs` `src/nowhere.rs` `tests/docs.rs::a_test` \
                    `src/gpu/backend/cuda/checksum.{ll,missing}` `fuzz/seeds/<target>`";
    let broken = broken_references(&file, markdown)?;
    assert_eq!(
        broken,
        [
            "NOWHERE.md: no such file",
            "DESIGN.md#no-such-heading: no heading with this anchor",
            "`src/nowhere.rs`: no such file",
            "`src/gpu/backend/cuda/checksum.missing`: no such file",
        ]
    );
    Ok(())
}
