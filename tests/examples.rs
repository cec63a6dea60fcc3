//! Runs the examples' logic in CI, so they keep working and not only building
//! (`docs/EMBEDDING.md`).

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
