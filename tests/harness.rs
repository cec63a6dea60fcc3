//! Checks of the test suite itself: its waits fail instead of hanging (`common::wait_until`,
//! `common::WAIT_LIMIT`), and every property test runs from a fixed seed, so two CI runs
//! of one commit try the same cases (a failing case is also saved by proptest under
//! `proptest-regressions/` beside its source, to be committed with the fix).

mod common;

use std::panic::catch_unwind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::wait_until_within;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The panic message of a caught panic.
fn message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
        .unwrap_or_default()
}

#[test]
fn a_wait_that_never_ends_fails_naming_what_it_waited_for() {
    let panic = catch_unwind(|| {
        wait_until_within(Duration::from_millis(20), "the answer", || None::<()>);
    })
    .expect_err("the wait gives up");
    let text = message(&panic);
    assert!(text.contains("gave up waiting for the answer"), "{text}");
}

/// A connector whose planner never answers (its thread paused) fails `reserve` with the
/// request named, instead of leaving the test waiting forever.
#[cfg(feature = "faults")]
#[test]
fn a_lookup_that_never_answers_fails_the_wait_instead_of_hanging() -> TestResult {
    use std::panic::AssertUnwindSafe;
    use std::sync::Arc;

    use common::{memory_pool, prompt, reserve_within, start};
    use kv_connector::config::Config;
    use kv_connector::connector::EngineConnector;
    use kv_connector::core::ids::{RequestId, ReservationId};
    use kv_connector::core::layout::Layout;

    let layout = Layout::preset("tiny-full")?;
    let mut instance = start(memory_pool(64 << 20), &layout, Config::default());
    let paused = instance.handle.pause_actors();
    instance
        .handle
        .lookup_prefix(RequestId(7), Arc::clone(&prompt(0, 65)), 0)
        .expect("the request is new");
    let handle = &mut instance.handle;
    let panic = catch_unwind(AssertUnwindSafe(|| {
        reserve_within(
            handle,
            RequestId(7),
            ReservationId(7),
            Duration::from_millis(300),
        )
    }))
    .expect_err("the lookup never answers");
    let text = message(&panic);
    assert!(
        text.contains("gave up waiting for the lookup of request 7"),
        "{text}"
    );
    drop(paused);
    let _ = instance.handle.shutdown();
    Ok(())
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Every `proptest!` block sets its configuration first (`#![proptest_config(..)]`), and
/// every file with one fixes the seed (`RngSeed::Fixed`).
#[test]
fn every_property_test_runs_from_a_fixed_seed() -> TestResult {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "crates", "benches", "examples"] {
        rust_files(&root.join(dir), &mut files)?;
    }
    let opening = concat!("proptest", "! {");
    let mut blocks = 0;
    let mut unseeded = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file)?;
        let name = file.strip_prefix(root)?.display().to_string();
        for (at, _) in text.match_indices(opening) {
            blocks += 1;
            let body = &text[at + opening.len()..];
            let first_item = body.trim_start();
            if !first_item.starts_with("#![proptest_config(") || !text.contains("RngSeed::Fixed(") {
                unseeded.push(format!("{name} at byte {at}"));
            }
        }
    }
    assert!(blocks >= 19, "found only {blocks} proptest blocks");
    assert!(
        unseeded.is_empty(),
        "proptest blocks without a fixed seed: {unseeded:?}"
    );
    Ok(())
}
