//! Layout tests: presets, page sizes, the R7 refusal table, fingerprints (R4).

use super::*;

fn group(id: u32, kind: GroupKind, layers: Vec<u32>) -> LayerGroup {
    LayerGroup {
        id: GroupId(id),
        kind,
        window_tokens: (kind == GroupKind::Window).then_some(128),
        sink_tokens: 0,
        role: ModelRole::Target,
        layers,
        kv_heads: 8,
        head_dim: 64,
        dtype_bytes: 2,
        replicated: false,
    }
}

fn hybrid() -> Layout {
    Layout {
        name: "test".into(),
        tokens_per_block: 32,
        world_size: 1,
        groups: vec![
            group(0, GroupKind::Window, vec![0, 2]),
            group(1, GroupKind::Full, vec![1, 3]),
        ],
    }
}

#[test]
fn every_preset_loads_and_validates() -> Result<(), LayoutError> {
    for name in Layout::preset_names() {
        let layout = Layout::preset(name)?;
        assert_eq!(layout.name, name);
        for group in &layout.groups {
            assert!(layout.page_bytes(group)? > 0);
        }
    }
    Ok(())
}

#[test]
fn eagle_preset_adds_a_draft_group_of_its_own_r6() -> Result<(), LayoutError> {
    let eagle = Layout::preset("llama-3.1-8b-eagle")?;
    let target = Layout::preset("llama-3.1-8b")?;
    assert_eq!(eagle.groups.len(), 2);
    assert_eq!(eagle.groups[0].role, ModelRole::Target);
    assert_eq!(eagle.groups[0].layers, target.groups[0].layers);
    let draft = &eagle.groups[1];
    assert_eq!(draft.role, ModelRole::Draft);
    assert_eq!(draft.attention(), Attention::FULL);
    // Draft layer 0 is not target layer 0 (`layout::I4` is per model).
    assert_eq!(draft.layers, vec![0]);
    // One layer x K,V x 8 heads x 128 x bf16 x 32 tokens.
    assert_eq!(eagle.page_bytes(draft)?, 2 * 8 * 128 * 2 * 32);
    // The draft group changes what the pool holds: never the target's keys (R4).
    assert_ne!(eagle.fingerprint(), target.fingerprint());
    let mut as_target = eagle.clone();
    as_target.groups[1].role = ModelRole::Target;
    as_target.groups[1].layers = vec![32];
    assert_ne!(eagle.fingerprint(), as_target.fingerprint());
    Ok(())
}

#[test]
fn gpt_oss_preset_matches_the_model() -> Result<(), LayoutError> {
    let layout = Layout::preset("gpt-oss-120b")?;
    assert_eq!(layout.groups.len(), 2);
    let layers: usize = layout.groups.iter().map(|g| g.layers.len()).sum();
    assert_eq!(layers, 36);
    let window = &layout.groups[0];
    assert_eq!(window.attention(), Attention::window(128, 0));
    // 18 layers x K,V x 8 heads x 64 x bf16 x 32 tokens.
    assert_eq!(layout.page_bytes(window)?, 18 * 2 * 8 * 64 * 2 * 32);
    Ok(())
}

#[test]
fn gemma_preset_has_five_window_layers_per_full_layer() -> Result<(), LayoutError> {
    let layout = Layout::preset("gemma-3-27b")?;
    let window = layout
        .groups
        .iter()
        .find(|g| g.is_window())
        .map(|g| g.layers.len());
    let full = layout
        .groups
        .iter()
        .find(|g| !g.is_window())
        .map(|g| g.layers.len());
    assert_eq!((window, full), (Some(52), Some(10)));
    Ok(())
}

#[test]
fn tiny_hybrid_has_sinks_and_small_pages() -> Result<(), LayoutError> {
    let layout = Layout::preset("tiny-hybrid")?;
    let window = layout
        .groups
        .iter()
        .find(|g| g.is_window())
        .map(LayerGroup::attention);
    assert!(matches!(
        window,
        Some(Attention { kind: GroupKind::Window, sink_tokens, .. }) if sink_tokens > 0
    ));
    for group in &layout.groups {
        assert!(layout.page_bytes(group)? <= 64 * 1024);
    }
    Ok(())
}

#[test]
fn unknown_preset_names_the_known_ones() {
    let err = Layout::preset("no-such-model").unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("no-such-model") && text.contains("llama-3.1-8b"),
        "{text}"
    );
}

/// The R7 refusal table: each broken layout, the variant and a phrase of its message.
#[test]
fn validation_refusals_r7() {
    type Breaker = fn(&mut Layout);
    let cases: Vec<(&str, Breaker, &str)> = vec![
        ("no groups", |l| l.groups.clear(), "has no groups"),
        (
            "T = 0",
            |l| l.tokens_per_block = 0,
            "tokens_per_block must be at least 1",
        ),
        (
            "world 0",
            |l| l.world_size = 0,
            "world_size must be at least 1",
        ),
        (
            "S >= W",
            |l| l.groups[0].sink_tokens = 128,
            "sink_tokens (128) must be below window_tokens (128)",
        ),
        (
            "W = 0",
            |l| l.groups[0].window_tokens = Some(0),
            "window_tokens must be at least 1",
        ),
        (
            "window without W",
            |l| l.groups[0].window_tokens = None,
            "has no window_tokens",
        ),
        (
            "full with W",
            |l| l.groups[1].window_tokens = Some(64),
            "is a full-attention group",
        ),
        (
            "no layers",
            |l| l.groups[1].layers.clear(),
            "because layers is 0",
        ),
        (
            "no heads",
            |l| l.groups[1].kv_heads = 0,
            "because kv_heads is 0",
        ),
        (
            "head dim 0",
            |l| l.groups[1].head_dim = 0,
            "because head_dim is 0",
        ),
        (
            "dtype 0",
            |l| l.groups[1].dtype_bytes = 0,
            "because dtype_bytes is 0",
        ),
        (
            "layer twice",
            |l| l.groups[1].layers.push(0),
            "layer 0 of the Target model is listed twice",
        ),
        (
            "same group id",
            |l| l.groups[1].id = GroupId(0),
            "group id 0 is listed twice",
        ),
        (
            "uneven heads",
            |l| l.world_size = 3,
            "do not split evenly over world_size 3",
        ),
    ];
    for (name, breaker, phrase) in cases {
        let mut layout = hybrid();
        breaker(&mut layout);
        let err = layout.validate().expect_err(name);
        assert!(err.to_string().contains(phrase), "{name}: {err}");
        assert_eq!(err.kind(), "invalid_layout", "{name}");
    }
}

#[test]
fn draft_layers_may_reuse_target_layer_numbers() -> Result<(), LayoutError> {
    let mut layout = hybrid();
    let mut draft = group(2, GroupKind::Full, vec![0]);
    draft.role = ModelRole::Draft;
    layout.groups.push(draft);
    layout.validate()
}

#[test]
fn window_layout_needs_prefix_aware_scheduling_r7() -> Result<(), LayoutError> {
    let layout = hybrid();
    let err = layout.register(false).unwrap_err();
    assert!(
        err.to_string()
            .contains("reservations.prefix_aware_scheduling = true"),
        "{err}"
    );
    layout.register(true)?;
    Layout::preset("llama-3.1-8b")?.register(false)
}

#[test]
fn tensor_parallel_split_and_shards() -> Result<(), LayoutError> {
    let layout = hybrid().with_world_size(2)?;
    let full = &layout.groups[1];
    assert_eq!(layout.page_bytes(full)?, 2 * 2 * 4 * 64 * 2 * 32);
    assert_eq!(
        full.shards(2)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["w2r0", "w2r1"]
    );
    let mut replicated = full.clone();
    replicated.replicated = true;
    assert_eq!(replicated.shards(2), vec![Shard::Replicated]);
    assert_eq!(replicated.page_bytes(32, 2)?, 2 * 2 * 8 * 64 * 2 * 32);
    // Fewer heads than ranks: each rank holds one (duplicated) head.
    let mut few = full.clone();
    few.kv_heads = 1;
    assert_eq!(few.page_bytes(32, 2)?, 2 * 2 * 64 * 2 * 32);
    Ok(())
}

/// R4: every field that changes a page's meaning changes the fingerprint; the name does not.
#[test]
fn fingerprint_separates_layouts_r4() {
    type Change = fn(&mut Layout);
    let base = hybrid().fingerprint();
    let changes: Vec<(&str, Change)> = vec![
        ("T", |l| l.tokens_per_block = 16),
        ("world", |l| l.world_size = 2),
        ("window", |l| l.groups[0].window_tokens = Some(256)),
        ("sinks", |l| l.groups[0].sink_tokens = 4),
        ("dtype", |l| l.groups[1].dtype_bytes = 1),
        ("heads", |l| l.groups[1].kv_heads = 4),
        ("head dim", |l| l.groups[1].head_dim = 128),
        ("layers", |l| l.groups[1].layers.push(5)),
        ("role", |l| l.groups[1].role = ModelRole::Draft),
        ("replicated", |l| l.groups[1].replicated = true),
        ("group id", |l| l.groups[1].id = GroupId(7)),
    ];
    for (name, change) in changes {
        let mut layout = hybrid();
        change(&mut layout);
        assert_ne!(layout.fingerprint(), base, "{name}");
    }
    let mut renamed = hybrid();
    renamed.name = "other".into();
    assert_eq!(renamed.fingerprint(), base);
}

#[test]
fn layout_toml_refuses_unknown_keys() {
    let text = "name = \"x\"\ntokens_per_block = 16\nbogus = 1\n[[groups]]\nid = 0\nkind = \"full\"\nlayers = [0]\nkv_heads = 1\nhead_dim = 1\ndtype_bytes = 1\n";
    let err = Layout::from_toml_str(text, "inline").unwrap_err();
    assert_eq!(err.kind(), "toml");
    let source = std::error::Error::source(&err)
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(source.contains("bogus"), "{source}");
}

/// `layout::I5`: a world size suits a group's KV heads when they split evenly over it or
/// each repeats on the same number of ranks, up to `MAX_WORLD_SIZE`; a refusal names a
/// world size that works, for presets and layout files alike.
#[test]
fn world_sizes_are_checked_against_the_kv_heads_i5() -> Result<(), LayoutError> {
    let llama = Layout::preset("llama-3.1-8b")?;
    for world in [1, 2, 4, 8, 16, 64] {
        assert_eq!(llama.with_world_size(world)?.world_size, world);
    }
    let uneven = llama.with_world_size(12).expect_err("8 heads on 12 ranks");
    assert!(
        matches!(uneven, LayoutError::HeadsNotDivisible { fits: 8, .. }),
        "{uneven:?}"
    );
    assert!(uneven.to_string().contains("e.g. 8"), "{uneven}");
    let huge = llama.with_world_size(1000).expect_err("1000 ranks");
    assert!(
        matches!(huge, LayoutError::WorldTooLarge { fits: 64, .. }),
        "{huge:?}"
    );
    let file = Layout::from_toml_str(
        include_str!("../../../config/models/tiny-hybrid.toml"),
        "custom.toml",
    )?;
    let custom = file.with_world_size(3).expect_err("2 heads on 3 ranks");
    assert!(
        matches!(custom, LayoutError::HeadsNotDivisible { fits: 2, .. }),
        "{custom:?}"
    );
    Ok(())
}
