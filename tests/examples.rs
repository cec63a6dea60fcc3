//! Runs the examples' logic in CI, so they keep working and not only building
//! (`docs/EMBEDDING.md`), and that the example names only what an engine can reach.

#[path = "../examples/embed.rs"]
#[expect(dead_code, reason = "the example's own main is not called here")]
mod embed;

/// `examples/embed.rs`: the second request loads the first's 32 shared blocks (R11, R24)
/// and computes only the rest; the first found nothing (`full_miss`).
#[test]
fn the_embedding_example_reuses_the_first_requests_prefix() -> anyhow::Result<()> {
    let outcome = embed::run()?;
    assert_eq!(outcome.reused_tokens, [0, 512]);
    let stats = &outcome.stats;
    assert_eq!((stats.lookups.full_miss, stats.lookups.full), (1, 1));
    assert_eq!(stats.loads.loads_done, 1);
    assert_eq!(stats.loads.loads_failed, 0);
    assert_eq!(stats.loads.pages_loaded, 32);
    // First request: 40 full blocks of 645 tokens; second: the 4 blocks beyond the shared
    // 32 (36 full blocks of 582 tokens), since loaded blocks are not saved again (R19).
    assert_eq!(stats.saves.saves_done, 44);
    Ok(())
}

/// Paths into the runtime's inside (`kv_connector::core::...`): anything under the crate
/// root but `logging`, the one public module an engine uses.
fn inside_paths(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in source.match_indices("kv_connector::") {
        let rest = &source[at + "kv_connector::".len()..];
        let segment: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let is_module = segment.starts_with(|c: char| c.is_ascii_lowercase())
            && rest[segment.len()..].starts_with("::");
        if is_module && segment != "logging" {
            found.push(format!("kv_connector::{segment}::"));
        }
    }
    found
}

/// The example is what an engine writes, so it names only the curated surface at the crate
/// root (the compiler holds the Python package to it; the example is built with the tests,
/// which also see the inside).
#[test]
fn the_example_names_only_the_crate_root() -> anyhow::Result<()> {
    let source = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/embed.rs"),
    )?;
    assert_eq!(inside_paths(&source), Vec::<String>::new());
    Ok(())
}

#[test]
fn the_inside_path_scanner_finds_module_paths_only() {
    let text = "use kv_connector::{Config, Layout};\nuse kv_connector::core::hash::HashChain;\n\
                kv_connector::logging::init(); kv_connector::scope_seed(x); kv_connector::pool::Pool";
    assert_eq!(
        inside_paths(text),
        ["kv_connector::core::", "kv_connector::pool::"]
    );
}
