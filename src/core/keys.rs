//! Pool keys (R3, R4).

use std::fmt;

/// Which tensor-parallel rank a page belongs to, or `Replicated` for pages whose bytes are
/// identical on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shard {
    /// Per-rank pages: key segment `w{world}r{rank}`.
    Rank {
        /// Tensor-parallel world size.
        world: u32,
        /// This rank, `0..world`.
        rank: u32,
    },
    /// Pages identical on every rank: key segment `replicated`.
    Replicated,
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shard::Rank { world, rank } => write!(f, "w{world}r{rank}"),
            Shard::Replicated => f.write_str("replicated"),
        }
    }
}
