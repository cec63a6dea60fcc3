//! Pool keys, built column-wise (R3, R4).
//!
//! A key is
//!
//! ```text
//! {namespace}/{model_key}/{shard}/lg{group}/t{T}b{bytes_per_page}/{hex(chain hash)}
//! ```
//!
//! exactly as `../shared/reference/hash_reference.py` formats it.
//!
//! ## Workflow
//!
//! 1. Describe the column with a [`KeySpec`] (named fields, so same-typed values cannot be
//!    swapped by position).
//! 2. Format its prefix once: [`KeyPrefix::validated`] in the runtime, [`KeyPrefix::new`]
//!    where any input must encode like the reference (the `keys` CLI).
//! 3. Append the keys of a chain's hashes to a [`KeyColumn`] as the chain grows
//!    ([`KeyColumn::extend`]); hand [`KeyColumn::as_strs`] to batched pool calls.
//!
//! A deployment's [`KeySpace`] holds every (group, shard) prefix of its layout, built once
//! at start, with each group's device page size ([`GroupKeys`]).
//!
//! ## Invariants
//!
//! - `keys::I1`. Every key of a column is `prefix + 32 lower-case hex digits`, so all keys of a
//!   column have the same byte length and key `i` is the byte range `[i*len, (i+1)*len)` of one
//!   contiguous string (no allocation per key).
//! - `keys::I2`. A prefix is formatted once per column, never per key (R3).
//! - `keys::I3`. For prefixes built by [`KeyPrefix::validated`], the key is injective: two keys are
//!   equal only when namespace, model key, shard, group, `T`, page bytes and hash are all
//!   equal (R4). Why: validated namespace and model key are non-empty and hold no `/`, so the
//!   key splits into exactly six `/`-separated segments; the shard segment is `w{W}r{R}` or
//!   `replicated`, the group and `t{T}b{B}` segments are decimal numbers without leading zeros
//!   separated by letters, and the hash is fixed-width hex. Each field is thus read back
//!   unambiguously from the key.
//! - `keys::I4`. [`KeyPrefix::new`] checks nothing, like the reference. Its keys can collide across
//!   fields: namespace `a/b` with model key `c` gives the same key as namespace `a` with model
//!   key `b/c`. Only tools that must reproduce the reference for arbitrary input use it.

use std::fmt;

use crate::core::hash::{BlockHash, HASH_BYTES};
use crate::core::layout::GroupId;

mod space;

pub use space::{GroupKeys, KeySpace};

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

/// The fields of one key column: everything in a key but the hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeySpec<'a> {
    /// Deployment namespace; carries or stands for the layout fingerprint (R4).
    pub namespace: &'a str,
    /// The model (and its fingerprint) the pages belong to (R4).
    pub model_key: &'a str,
    /// Which rank's pages, or replicated ones.
    pub shard: Shard,
    /// The layer group whose pages the keys name.
    pub group: GroupId,
    /// Tokens per block `T`.
    pub tokens_per_block: usize,
    /// Bytes of one page of this group on one rank.
    pub bytes_per_page: u64,
}

/// The key segment that a [`KeyError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyField {
    /// The namespace segment.
    Namespace,
    /// The model key segment.
    ModelKey,
}

impl fmt::Display for KeyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Namespace => "namespace",
            Self::ModelKey => "model_key",
        })
    }
}

/// Why a [`KeySpec`] cannot give injective keys (`keys::I3`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The namespace or model key is empty.
    #[error("{field} must not be empty; set it to a name such as \"kv\"")]
    EmptySegment {
        /// Which segment is empty.
        field: KeyField,
    },
    /// The namespace or model key holds a `/`, which would make keys ambiguous (`keys::I4`).
    #[error("{field} must not contain '/', got {value:?}; use '-' or '_' instead")]
    SlashInSegment {
        /// Which segment holds the slash.
        field: KeyField,
        /// The offending value.
        value: String,
    },
    /// The namespace or model key holds whitespace or a control character, which the
    /// tab-separated key listings and the pool's logs could not show unambiguously.
    #[error("{field} must not contain whitespace or control characters, got {value:?}; use '-' or '_' instead")]
    SpaceInSegment {
        /// Which segment holds the character.
        field: KeyField,
        /// The offending value.
        value: String,
    },
    /// `T` is zero.
    #[error("tokens_per_block must be at least 1 (for example 32), got 0")]
    ZeroTokensPerBlock,
    /// The page size is zero.
    #[error("bytes_per_page must be at least 1, got 0")]
    ZeroBytesPerPage,
    /// The rank is not below the world size.
    #[error("rank {rank} is out of range for world size {world}; use a rank in 0..{world}")]
    RankOutOfRange {
        /// Tensor-parallel world size.
        world: u32,
        /// The offending rank.
        rank: u32,
    },
}

impl KeyError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::EmptySegment { .. } => "empty_segment",
            Self::SlashInSegment { .. } => "slash_in_segment",
            Self::SpaceInSegment { .. } => "space_in_segment",
            Self::ZeroTokensPerBlock => "zero_tokens_per_block",
            Self::ZeroBytesPerPage => "zero_bytes_per_page",
            Self::RankOutOfRange { .. } => "rank_out_of_range",
        }
    }
}

/// The formatted `{namespace}/{model_key}/{shard}/lg{group}/t{T}b{bytes}/` part of a
/// column's keys (`keys::I2`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyPrefix {
    /// The prefix text, ending in `/`.
    text: String,
}

impl KeyPrefix {
    /// Formats the prefix exactly as the reference does, for any input (`keys::I4`: the keys of
    /// different specs may collide; use [`validated`](Self::validated) in the runtime).
    pub fn new(spec: &KeySpec<'_>) -> Self {
        let KeySpec {
            namespace,
            model_key,
            shard,
            group,
            tokens_per_block,
            bytes_per_page,
        } = spec;
        let text = format!(
            "{namespace}/{model_key}/{shard}/lg{group}/t{tokens_per_block}b{bytes_per_page}/"
        );
        Self { text }
    }

    /// Formats the prefix after checking that its keys are injective (`keys::I3`, R4).
    ///
    /// # Errors
    ///
    /// [`KeyError::EmptySegment`] or [`KeyError::SlashInSegment`] for a namespace or model key
    /// that is empty or holds `/`; [`KeyError::ZeroTokensPerBlock`],
    /// [`KeyError::ZeroBytesPerPage`]; [`KeyError::RankOutOfRange`] when `rank >= world`.
    pub fn validated(spec: &KeySpec<'_>) -> Result<Self, KeyError> {
        check_segment(KeyField::Namespace, spec.namespace)?;
        check_segment(KeyField::ModelKey, spec.model_key)?;
        if spec.tokens_per_block == 0 {
            return Err(KeyError::ZeroTokensPerBlock);
        }
        if spec.bytes_per_page == 0 {
            return Err(KeyError::ZeroBytesPerPage);
        }
        if let Shard::Rank { world, rank } = spec.shard {
            if rank >= world {
                return Err(KeyError::RankOutOfRange { world, rank });
            }
        }
        Ok(Self::new(spec))
    }

    /// The prefix text, ending in `/`.
    #[cfg(feature = "internals")]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Byte length of every key with this prefix (`keys::I1`).
    pub fn key_len(&self) -> usize {
        self.text.len() + 2 * HASH_BYTES
    }

    /// The key of one hash. For many hashes, use a [`KeyColumn`].
    pub fn key(&self, hash: &BlockHash) -> String {
        let mut key = String::with_capacity(self.key_len());
        key.push_str(&self.text);
        let mut hex = [0u8; 2 * HASH_BYTES];
        hash.write_hex(&mut hex);
        key.extend(hex.iter().copied().map(char::from));
        key
    }
}

impl fmt::Display for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Whether a namespace or model key holds only characters a key segment may hold: no
/// `/` (it separates segments, `keys::I3`), no whitespace or control characters (the
/// tab-separated key listings and the pool's logs could not show them unambiguously).
/// The configuration's checks use the same rule.
pub fn segment_chars_ok(value: &str) -> bool {
    !value.contains('/') && !value.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Refuses an empty segment, or one holding a character [`segment_chars_ok`] refuses,
/// naming which (`keys::I3`).
fn check_segment(field: KeyField, value: &str) -> Result<(), KeyError> {
    if value.is_empty() {
        return Err(KeyError::EmptySegment { field });
    }
    if value.contains('/') {
        return Err(KeyError::SlashInSegment {
            field,
            value: value.to_owned(),
        });
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(KeyError::SpaceInSegment {
            field,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// `HEX_PAIRS[b]` is the two lower-case hex digits of byte `b`.
#[cfg(any(feature = "cli", feature = "internals"))]
const HEX_PAIRS: [[u8; 2]; 256] = {
    let digits = b"0123456789abcdef";
    let mut table = [[0u8; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = [digits[byte >> 4], digits[byte & 0x0f]];
        byte += 1;
    }
    table
};

/// The keys of one prefix for a run of hashes, in one contiguous string (`keys::I1`).
#[derive(Clone, Debug)]
#[cfg(any(feature = "cli", feature = "internals"))]
pub struct KeyColumn {
    /// The shared prefix of every key.
    prefix: KeyPrefix,
    /// Every key back to back, `len * key_len` bytes.
    text: String,
    /// Byte length of one key.
    key_len: usize,
    /// Number of keys.
    len: usize,
    /// Reused buffer for the bytes of the keys one `extend` appends.
    scratch: Vec<u8>,
}

#[cfg(any(feature = "cli", feature = "internals"))]
impl KeyColumn {
    /// An empty column of keys under `prefix`.
    pub fn new(prefix: KeyPrefix) -> Self {
        Self {
            key_len: prefix.key_len(),
            prefix,
            text: String::new(),
            len: 0,
            scratch: Vec::new(),
        }
    }

    /// A column holding the keys of `hashes`, in order.
    pub fn with_hashes(prefix: KeyPrefix, hashes: &[BlockHash]) -> Self {
        let mut column = Self::new(prefix);
        column.extend(hashes);
        column
    }

    /// Appends the keys of `hashes`, in order (`keys::I2`: the prefix is copied, not formatted).
    ///
    /// # Panics
    ///
    /// Never: the appended bytes are the prefix (a `String`) and ASCII hex digits, so they
    /// are valid UTF-8.
    #[expect(
        clippy::expect_used,
        reason = "the bytes are a valid UTF-8 prefix and ASCII hex digits, so decoding cannot fail"
    )]
    pub fn extend(&mut self, hashes: &[BlockHash]) {
        let prefix = self.prefix.text.as_bytes();
        self.scratch.clear();
        self.scratch.reserve(hashes.len() * self.key_len);
        for hash in hashes {
            self.scratch.extend_from_slice(prefix);
            for byte in hash.0 {
                self.scratch
                    .extend_from_slice(&HEX_PAIRS[usize::from(byte)]);
            }
        }
        let appended = std::str::from_utf8(&self.scratch).expect("prefix is UTF-8, hex is ASCII");
        self.text.push_str(appended);
        self.len += hashes.len();
    }

    /// Makes room for `additional` more keys, so that appending them does not reallocate.
    #[cfg(feature = "internals")]
    pub fn reserve(&mut self, additional: usize) {
        self.text.reserve(additional * self.key_len);
    }

    /// Key `index`, or `None` past the end.
    #[cfg(feature = "internals")]
    pub fn get(&self, index: usize) -> Option<&str> {
        if index >= self.len {
            return None;
        }
        let start = index * self.key_len;
        self.text.get(start..start + self.key_len)
    }

    /// The keys, first to last.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        let key_len = self.key_len;
        // `keys::I1`: every key starts where the previous one ends, on a char boundary.
        (0..self.len).map(move |index| &self.text[index * key_len..(index + 1) * key_len])
    }

    /// The keys as a vector of borrowed strings, for batched pool calls.
    #[cfg(feature = "internals")]
    pub fn as_strs(&self) -> Vec<&str> {
        self.iter().collect()
    }

    /// Number of keys.
    #[cfg(feature = "internals")]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the column holds no key.
    #[cfg(feature = "internals")]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops the keys from `len` on (no effect if the column is shorter).
    #[cfg(feature = "internals")]
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.text.truncate(len * self.key_len);
            self.len = len;
        }
    }

    /// The prefix every key shares.
    #[cfg(feature = "internals")]
    pub fn prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// Byte length of every key (`keys::I1`).
    #[cfg(feature = "internals")]
    pub fn key_len(&self) -> usize {
        self.key_len
    }
}

#[cfg(test)]
mod tests;
