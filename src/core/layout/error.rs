//! Why a layout was refused or could not be read (R7).

use super::{GroupId, ModelRole};

/// Why a layout was refused or could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// R7: a layout needs at least one group.
    #[error("layout {layout:?} has no groups: list at least one [[groups]] entry")]
    NoGroups {
        /// Layout name.
        layout: String,
    },
    /// `T` must be at least 1.
    #[error("tokens_per_block must be at least 1 (got 0); 32 is a common value")]
    ZeroTokensPerBlock,
    /// The world size must be at least 1.
    #[error("world_size must be at least 1 (got 0); use 1 without tensor parallelism")]
    ZeroWorldSize,
    /// Two groups share an id.
    #[error("group id {group} is listed twice: give every group its own id")]
    DuplicateGroupId {
        /// The repeated id.
        group: GroupId,
    },
    /// R7: a window of zero tokens.
    #[error("group {group}: window_tokens must be at least 1 (got 0)")]
    ZeroWindow {
        /// Offending group.
        group: GroupId,
    },
    /// A window group without `window_tokens`.
    #[error("group {group} is a window group but has no window_tokens: set it (e.g. 128)")]
    MissingWindow {
        /// Offending group.
        group: GroupId,
    },
    /// A full group with window fields.
    #[error("group {group} is a full-attention group but sets window_tokens or sink_tokens: remove them or use kind = \"window\"")]
    WindowFieldsOnFullGroup {
        /// Offending group.
        group: GroupId,
    },
    /// R7: `S >= W`.
    #[error(
        "group {group}: sink_tokens ({sink_tokens}) must be below window_tokens ({window_tokens})"
    )]
    SinksNotBelowWindow {
        /// Offending group.
        group: GroupId,
        /// `S`.
        sink_tokens: u32,
        /// `W`.
        window_tokens: u32,
    },
    /// R7: a page of zero bytes.
    #[error("group {group}: page size is zero because {field} is 0; it must be at least 1")]
    ZeroPageBytes {
        /// Offending group.
        group: GroupId,
        /// The field that is zero (`layers`, `kv_heads`, `head_dim`, `dtype_bytes`).
        field: &'static str,
    },
    /// R7: a layer in two groups (or twice in one).
    #[error("layer {layer} of the {role:?} model is listed twice (groups {first} and {second}): list each layer once")]
    LayerListedTwice {
        /// The layer.
        layer: u32,
        /// Target or draft.
        role: ModelRole,
        /// First group listing it.
        first: GroupId,
        /// Second group listing it.
        second: GroupId,
    },
    /// KV heads that neither split evenly over the ranks nor repeat evenly on them.
    #[error(
        "group {group}: {kv_heads} KV heads do not split evenly over world_size {world_size} \
         nor repeat evenly on its ranks; use a world size that divides {kv_heads} or is a \
         multiple of it, e.g. {fits}"
    )]
    HeadsNotDivisible {
        /// Offending group.
        group: GroupId,
        /// KV heads.
        kv_heads: u32,
        /// World size.
        world_size: u32,
        /// The largest world size below it that works for this group.
        fits: u32,
    },
    /// More ranks than a layout takes.
    #[error(
        "world_size {world_size} is more than {max} tensor-parallel ranks; use at most {max}, \
         e.g. {fits} (a world size that suits every group's KV heads)"
    )]
    WorldTooLarge {
        /// World size.
        world_size: u32,
        /// [`MAX_WORLD_SIZE`](super::MAX_WORLD_SIZE).
        max: u32,
        /// The largest world size up to the maximum that every group's heads suit.
        fits: u32,
    },
    /// R7: window layouts need reservations.
    #[error("layout {layout:?} has window group {group}, which needs prefix-aware scheduling: set reservations.prefix_aware_scheduling = true")]
    WindowNeedsPrefixAwareScheduling {
        /// Layout name.
        layout: String,
        /// The first window group.
        group: GroupId,
    },
    /// No preset of that name.
    #[error("unknown model preset {name:?}: choose one of {known}")]
    UnknownPreset {
        /// Requested name.
        name: String,
        /// Known names, comma separated.
        known: String,
    },
    /// The layout file could not be read.
    #[error("cannot read layout file {path}")]
    Io {
        /// File path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The layout TOML is malformed or has unknown keys.
    #[error("layout {origin} is not a valid layout")]
    Toml {
        /// File path or preset name.
        origin: String,
        /// Cause.
        #[source]
        source: toml::de::Error,
    },
    /// The page size does not fit in memory arithmetic.
    #[error("group {group}: page size overflows 64 bits (tokens_per_block x layers x kv_heads x head_dim x dtype_bytes x 2); use real model sizes, e.g. head_dim = 128")]
    PageBytesOverflow {
        /// Offending group.
        group: GroupId,
    },
}

impl LayoutError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            LayoutError::Io { .. } => "io",
            LayoutError::Toml { .. } => "toml",
            LayoutError::UnknownPreset { .. } => "unknown_preset",
            _ => "invalid_layout",
        }
    }
}
