//! KV layout: layer groups, page sizes, fingerprint and validation (R4, R6, R7).
//!
//! A [`Layout`] describes how a model's KV cache is paged: tokens per block `T`, the
//! tensor-parallel world size, and the layer groups that share one page table. A page is
//! the bytes of one block of one group on one rank (all layers of the group, K and V).
//!
//! Layouts come from TOML: the presets in `config/models/<name>.toml` (compiled into the
//! binary, so `--model NAME` works from any directory) or a file given by the user.
//!
//! Invariants of a layout that passed [`Layout::validate`]:
//! - `layout::I1`. at least one group; group ids unique; `T >= 1`; world size `>= 1`;
//! - `layout::I2`. every group's page is at least one byte;
//! - `layout::I3`. a window group has `W >= 1` and `S < W`; a full group has no window fields;
//! - `layout::I4`. no layer is listed twice within one model (target or draft);
//! - `layout::I5`. `world_size <= MAX_WORLD_SIZE`, and every group that is not replicated
//!   has KV heads that split evenly over the ranks (`kv_heads % world == 0`) or repeat
//!   evenly on them (`world % kv_heads == 0`: each head on `world / kv_heads` ranks, as
//!   vLLM replicates KV heads when the tensor-parallel size exceeds them).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::keys::Shard;

mod error;
pub use error::LayoutError;

/// Most tensor-parallel ranks a layout takes (`layout::I5`): eight 8-GPU nodes, beyond any
/// tensor-parallel group serving engines run, and a bound on what the replay simulates.
pub const MAX_WORLD_SIZE: u32 = 64;

/// Identifier of a layer group (the `lg{group}` segment of a key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GroupId(pub u32);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Whether a group attends to the whole prefix or to a sliding window: the crate's one
/// attention kind. A window group's `W` and `S` travel beside it ([`Attention`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupKind {
    /// Full attention: every block of the prefix is read.
    Full,
    /// Sliding-window attention: only the sinks and the last `W` tokens are read.
    Window,
}

/// The attention a group performs: its kind, with the window parameters made explicit
/// (both 0 for a full group). Match on it as a struct:
/// `Attention { kind: GroupKind::Window, window_tokens, sink_tokens }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attention {
    /// Full or window attention.
    pub kind: GroupKind,
    /// `W`: tokens the window reaches back; 0 for a full group.
    pub window_tokens: usize,
    /// `S`: sink tokens `[0, S)` every later token attends to; `S < W` (R7); 0 for a full
    /// group.
    pub sink_tokens: usize,
}

impl Attention {
    /// Full attention.
    pub const FULL: Self = Self {
        kind: GroupKind::Full,
        window_tokens: 0,
        sink_tokens: 0,
    };

    /// A sliding window of `window_tokens` with `sink_tokens` sinks at positions `[0, S)`.
    pub const fn window(window_tokens: usize, sink_tokens: usize) -> Self {
        Self {
            kind: GroupKind::Window,
            window_tokens,
            sink_tokens,
        }
    }

    /// Whether this is sliding-window attention.
    pub fn is_window(&self) -> bool {
        self.kind == GroupKind::Window
    }
}

/// Which model a group's layers belong to.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ModelRole {
    /// The served (target) model.
    #[default]
    Target,
    /// The speculative drafter's own layers.
    Draft,
}

/// One layer group: layers sharing one page table (R6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerGroup {
    /// Group id, unique within the layout.
    pub id: GroupId,
    /// Full or window attention.
    pub kind: GroupKind,
    /// `W` for window groups; absent for full groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_tokens: Option<u32>,
    /// `S` for window groups (sinks stored in the pool); 0 when the model has none.
    #[serde(default)]
    pub sink_tokens: u32,
    /// Target or draft model.
    #[serde(default)]
    pub role: ModelRole,
    /// Layer indices of the group (within its model).
    pub layers: Vec<u32>,
    /// KV heads of the whole model (before tensor-parallel splitting).
    pub kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// Bytes per element of the KV cache (2 for bf16).
    pub dtype_bytes: u32,
    /// Pages identical on every rank (stored once, under the `replicated` shard).
    #[serde(default)]
    pub replicated: bool,
}

/// The KV layout of a model on one deployment (R6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    /// A name for logs and reports (the preset name for presets).
    pub name: String,
    /// `T`: tokens per KV block.
    pub tokens_per_block: u32,
    /// Tensor-parallel world size.
    #[serde(default = "one")]
    pub world_size: u32,
    /// The layer groups.
    pub groups: Vec<LayerGroup>,
}

fn one() -> u32 {
    1
}

/// The 8-byte layout fingerprint that keeps different layouts apart in the pool (R4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LayoutFingerprint(pub u64);

impl fmt::Display for LayoutFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The model presets shipped in `config/models/`, compiled in.
const PRESETS: &[(&str, &str)] = &[
    (
        "llama-3.1-8b",
        include_str!("../../../config/models/llama-3.1-8b.toml"),
    ),
    (
        "llama-3.1-8b-eagle",
        include_str!("../../../config/models/llama-3.1-8b-eagle.toml"),
    ),
    (
        "gpt-oss-120b",
        include_str!("../../../config/models/gpt-oss-120b.toml"),
    ),
    (
        "gemma-3-27b",
        include_str!("../../../config/models/gemma-3-27b.toml"),
    ),
    (
        "tiny-hybrid",
        include_str!("../../../config/models/tiny-hybrid.toml"),
    ),
    (
        "tiny-full",
        include_str!("../../../config/models/tiny-full.toml"),
    ),
];

impl LayerGroup {
    /// The group's attention with window parameters made explicit.
    ///
    /// Only meaningful on a validated layout (a window group without `window_tokens` reads
    /// as a window of 0 tokens, which validation refuses).
    pub fn attention(&self) -> Attention {
        let to_usize = |value: u32| usize::try_from(value).unwrap_or(usize::MAX);
        match self.kind {
            GroupKind::Full => Attention::FULL,
            GroupKind::Window => Attention::window(
                to_usize(self.window_tokens.unwrap_or(0)),
                to_usize(self.sink_tokens),
            ),
        }
    }

    /// Whether this group's KV heads can be laid out on `world_size` ranks (`layout::I5`):
    /// replicated, split evenly, or each head repeated on the same number of ranks.
    fn suits_world(&self, world_size: u32) -> bool {
        self.replicated
            || world_size == 0
            || self.kv_heads % world_size == 0
            || (self.kv_heads > 0 && world_size % self.kv_heads == 0)
    }

    /// Whether this is a sliding-window group.
    pub fn is_window(&self) -> bool {
        self.kind == GroupKind::Window
    }

    /// KV heads one rank holds: an even split, or all heads when the group is replicated,
    /// or one head when there are fewer heads than ranks (heads are then duplicated).
    fn kv_heads_per_rank(&self, world_size: u32) -> u32 {
        if self.replicated || world_size <= 1 {
            self.kv_heads
        } else if self.kv_heads < world_size {
            1
        } else {
            self.kv_heads / world_size
        }
    }

    /// Bytes of one page: layers x (K and V) x heads per rank x head dim x dtype x `T`.
    ///
    /// # Errors
    /// [`LayoutError::PageBytesOverflow`] when the product does not fit in `u64`.
    pub fn page_bytes(&self, tokens_per_block: u32, world_size: u32) -> Result<u64, LayoutError> {
        let overflow = || LayoutError::PageBytesOverflow { group: self.id };
        let layers = u64::try_from(self.layers.len()).map_err(|_| overflow())?;
        [
            2,
            u64::from(self.kv_heads_per_rank(world_size)),
            u64::from(self.head_dim),
        ]
        .into_iter()
        .chain([u64::from(self.dtype_bytes), u64::from(tokens_per_block)])
        .try_fold(layers, u64::checked_mul)
        .ok_or_else(overflow)
    }

    /// The shards this group's pages are stored under.
    pub fn shards(&self, world_size: u32) -> Vec<Shard> {
        if self.replicated {
            vec![Shard::Replicated]
        } else {
            (0..world_size)
                .map(|rank| Shard::Rank {
                    world: world_size,
                    rank,
                })
                .collect()
        }
    }
}

impl Layout {
    /// The names of the compiled-in presets.
    pub fn preset_names() -> impl Iterator<Item = &'static str> {
        PRESETS.iter().map(|(name, _)| *name)
    }

    /// Loads a compiled-in preset by name and validates it.
    ///
    /// # Errors
    /// [`LayoutError::UnknownPreset`] naming the known presets, or a validation error.
    pub fn preset(name: &str) -> Result<Layout, LayoutError> {
        let (_, text) = PRESETS
            .iter()
            .find(|(preset, _)| *preset == name)
            .ok_or_else(|| LayoutError::UnknownPreset {
                name: name.to_owned(),
                known: Layout::preset_names().collect::<Vec<_>>().join(", "),
            })?;
        Layout::from_toml_str(text, name)
    }

    /// Reads a layout file and validates it.
    ///
    /// # Errors
    /// [`LayoutError::Io`], [`LayoutError::Toml`] or a validation error.
    pub fn from_file(path: &Path) -> Result<Layout, LayoutError> {
        let text = std::fs::read_to_string(path).map_err(|source| LayoutError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Layout::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses layout TOML (`origin` names the file or preset in errors) and validates it.
    ///
    /// # Errors
    /// [`LayoutError::Toml`] for malformed TOML or unknown keys, or a validation error.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Layout, LayoutError> {
        let layout: Layout = toml::from_str(text).map_err(|source| LayoutError::Toml {
            origin: origin.to_owned(),
            source,
        })?;
        layout.validate()?;
        Ok(layout)
    }

    /// `validate_layout` (R7): refuses no groups, `S >= W`, `W = 0`, zero page size,
    /// layers listed twice, duplicate group ids, and uneven head splits.
    ///
    /// # Errors
    /// The first refusal found, as a [`LayoutError`] naming the group and field.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.groups.is_empty() {
            return Err(LayoutError::NoGroups {
                layout: self.name.clone(),
            });
        }
        if self.tokens_per_block == 0 {
            return Err(LayoutError::ZeroTokensPerBlock);
        }
        if self.world_size == 0 {
            return Err(LayoutError::ZeroWorldSize);
        }
        if self.world_size > MAX_WORLD_SIZE {
            return Err(LayoutError::WorldTooLarge {
                world_size: self.world_size,
                max: MAX_WORLD_SIZE,
                fits: (1..=MAX_WORLD_SIZE)
                    .rev()
                    .find(|&world| self.groups.iter().all(|group| group.suits_world(world)))
                    .unwrap_or(1),
            });
        }
        let mut ids = BTreeSet::new();
        let mut layer_owner: BTreeMap<(ModelRole, u32), GroupId> = BTreeMap::new();
        for group in &self.groups {
            if !ids.insert(group.id) {
                return Err(LayoutError::DuplicateGroupId { group: group.id });
            }
            self.validate_group(group)?;
            for &layer in &group.layers {
                if let Some(&first) = layer_owner.get(&(group.role, layer)) {
                    return Err(LayoutError::LayerListedTwice {
                        layer,
                        role: group.role,
                        first,
                        second: group.id,
                    });
                }
                layer_owner.insert((group.role, layer), group.id);
            }
        }
        Ok(())
    }

    fn validate_group(&self, group: &LayerGroup) -> Result<(), LayoutError> {
        let id = group.id;
        match (group.kind, group.window_tokens) {
            (GroupKind::Full, None) if group.sink_tokens == 0 => {}
            (GroupKind::Full, _) => return Err(LayoutError::WindowFieldsOnFullGroup { group: id }),
            (GroupKind::Window, None) => return Err(LayoutError::MissingWindow { group: id }),
            (GroupKind::Window, Some(0)) => return Err(LayoutError::ZeroWindow { group: id }),
            (GroupKind::Window, Some(window_tokens)) if group.sink_tokens >= window_tokens => {
                return Err(LayoutError::SinksNotBelowWindow {
                    group: id,
                    sink_tokens: group.sink_tokens,
                    window_tokens,
                });
            }
            (GroupKind::Window, Some(_)) => {}
        }
        let zero_field = [
            ("layers", group.layers.len()),
            (
                "kv_heads",
                usize::try_from(group.kv_heads).unwrap_or(usize::MAX),
            ),
            (
                "head_dim",
                usize::try_from(group.head_dim).unwrap_or(usize::MAX),
            ),
            (
                "dtype_bytes",
                usize::try_from(group.dtype_bytes).unwrap_or(usize::MAX),
            ),
        ]
        .into_iter()
        .find(|(_, value)| *value == 0);
        if let Some((field, _)) = zero_field {
            return Err(LayoutError::ZeroPageBytes { group: id, field });
        }
        if !group.suits_world(self.world_size) {
            return Err(LayoutError::HeadsNotDivisible {
                group: id,
                kv_heads: group.kv_heads,
                world_size: self.world_size,
                fits: (1..self.world_size)
                    .rev()
                    .find(|&world| group.suits_world(world))
                    .unwrap_or(1),
            });
        }
        group.page_bytes(self.tokens_per_block, self.world_size)?;
        Ok(())
    }

    /// Registers the layout with the runtime: validation plus the R7 rule that window
    /// groups need prefix-aware scheduling (window loads go through reservations).
    ///
    /// # Errors
    /// A validation error, or [`LayoutError::WindowNeedsPrefixAwareScheduling`].
    pub fn register(&self, prefix_aware_scheduling: bool) -> Result<(), LayoutError> {
        self.validate()?;
        match self.groups.iter().find(|group| group.is_window()) {
            Some(group) if !prefix_aware_scheduling => {
                Err(LayoutError::WindowNeedsPrefixAwareScheduling {
                    layout: self.name.clone(),
                    group: group.id,
                })
            }
            _ => Ok(()),
        }
    }

    /// Page bytes of a group on one rank.
    ///
    /// # Errors
    /// [`LayoutError::PageBytesOverflow`]; never on a validated layout.
    pub fn page_bytes(&self, group: &LayerGroup) -> Result<u64, LayoutError> {
        group.page_bytes(self.tokens_per_block, self.world_size)
    }

    /// Whether the drafter's layers have groups of their own (role `draft`, R6): only
    /// then are pages named by next-token hashes (R37).
    pub fn has_draft_groups(&self) -> bool {
        self.groups.iter().any(|group| group.role == ModelRole::Draft)
    }

    /// The fingerprint over everything that changes a page's meaning (R4): `T`, world
    /// size, and per group its id, kind, window, sinks, role, replication, layers, heads,
    /// head dim, dtype and page bytes. The layout's name is not part of it.
    pub fn fingerprint(&self) -> LayoutFingerprint {
        let mut state = blake2b_simd::Params::new().hash_length(8).to_state();
        state.update(b"kv-connector layout v1");
        state.update(&self.tokens_per_block.to_le_bytes());
        state.update(&self.world_size.to_le_bytes());
        let mut groups: Vec<&LayerGroup> = self.groups.iter().collect();
        groups.sort_by_key(|group| group.id);
        for group in groups {
            let kind: u32 = match group.kind {
                GroupKind::Full => 0,
                GroupKind::Window => 1,
            };
            let role: u32 = match group.role {
                ModelRole::Target => 0,
                ModelRole::Draft => 1,
            };
            let page = self.page_bytes(group).unwrap_or(u64::MAX);
            for word in [
                group.id.0,
                kind,
                group.window_tokens.unwrap_or(0),
                group.sink_tokens,
                role,
            ]
            .into_iter()
            .chain([
                u32::from(group.replicated),
                group.kv_heads,
                group.head_dim,
                group.dtype_bytes,
            ]) {
                state.update(&word.to_le_bytes());
            }
            state.update(&page.to_le_bytes());
            state.update(
                &u64::try_from(group.layers.len())
                    .unwrap_or(u64::MAX)
                    .to_le_bytes(),
            );
            for layer in &group.layers {
                state.update(&layer.to_le_bytes());
            }
        }
        let digest = state.finalize();
        let mut bytes = [0_u8; 8];
        bytes.copy_from_slice(digest.as_bytes());
        LayoutFingerprint(u64::from_le_bytes(bytes))
    }
}

impl Layout {
    /// The same layout on another tensor-parallel world size (validated).
    ///
    /// # Errors
    /// A validation error, e.g. heads that do not split over `world_size`.
    pub fn with_world_size(&self, world_size: u32) -> Result<Layout, LayoutError> {
        let layout = Layout {
            world_size,
            ..self.clone()
        };
        layout.validate()?;
        Ok(layout)
    }
}

#[cfg(test)]
mod tests;
