//! Block hashes, the scope seed and the incremental hash chain (R1, R2).
//!
//! The encoding is the one of `../shared/reference/hash_reference.py`, reproduced byte for
//! byte (the vectors in `../shared/reference/hash_vectors.json` are checked by
//! `tests/hash_vectors.rs`):
//!
//! ```text
//! scope seed = BLAKE2b-16( framed(salt utf-8 | empty, lora as i64 LE | empty, media digest...) )
//!              framed(parts) = for each part: u32 LE length || bytes
//! h[i]       = BLAKE2b-16( parent || tokens[i*T .. (i+1)*T] as i64 LE each )
//!              parent = h[i-1], or the scope seed for i = 0
//! ```
//!
//! ## Workflow
//!
//! 1. Build a [`Scope`] for the request (cache salt, `LoRA` id, multimodal digests) and derive
//!    its seed with [`scope_seed`].
//! 2. Start a [`HashChain`] from the seed when the request is admitted.
//! 3. Each time a chunk of the prompt arrives, call [`HashChain::extend_to`] with the
//!    request's whole token list so far; it hashes only the blocks that became full.
//!
//! [`hash_blocks`] is the one-shot form, used by tools and tests.
//!
//! ## Invariants
//!
//! - `hash::I1`. Only full blocks are hashed; a trailing partial block has no hash (R1).
//! - `hash::I2`. A chain never rehashes a block it already holds: `extend_to` costs only the new
//!   blocks (R2).
//! - `hash::I3`. The token list a chain sees never shrinks; a shorter list is
//!   [`HashError::TokensShrank`] and leaves the chain unchanged (R2). The chain does not keep
//!   the tokens, so the caller promises that a longer list extends the previous one.
//! - `hash::I4`. Hashing allocates nothing per block: one scratch buffer of `16 + 8*T` bytes is
//!   reused for every block of a chain.
//!
//! ## Encoding notes
//!
//! - A salt of `None` and a salt of `Some("")` give the same seed, as in the reference (both
//!   frame an empty part). Callers that need to tell them apart must pick another salt.
//! - Frame lengths are `u32`; a salt longer than `u32::MAX` bytes (which the reference
//!   refuses) is framed with the length saturated at `u32::MAX`.

use std::fmt;

/// Length in bytes of a chain hash (`BLAKE2b` digest size).
pub const HASH_BYTES: usize = 16;

/// Length in bytes of one encoded token (`i64`, little-endian).
const TOKEN_BYTES: usize = 8;

/// Lower-case hex digits, indexed by nibble.
const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The 16-byte chain hash of one block: BLAKE2b-16 over `parent || tokens` (R1).
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize,
)]
pub struct BlockHash(pub [u8; 16]);

impl BlockHash {
    /// Lower-case hex, 32 characters.
    pub fn to_hex(&self) -> String {
        let mut out = String::with_capacity(2 * HASH_BYTES);
        for byte in self.0 {
            out.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
            out.push(char::from(HEX_DIGITS[usize::from(byte & 0x0f)]));
        }
        out
    }

    /// Writes the 32 lower-case hex digits of this hash into `out` (no allocation).
    pub fn write_hex(&self, out: &mut [u8; 2 * HASH_BYTES]) {
        for (pair, byte) in out.chunks_exact_mut(2).zip(self.0) {
            pair[0] = HEX_DIGITS[usize::from(byte >> 4)];
            pair[1] = HEX_DIGITS[usize::from(byte & 0x0f)];
        }
    }

    /// Parses 32 hex digits (either case) into a hash.
    ///
    /// # Errors
    ///
    /// [`HashError::HexLength`] when `text` is not 32 characters long, and
    /// [`HashError::HexDigit`] at the first character that is not a hex digit.
    pub fn from_hex(text: &str) -> Result<Self, HashError> {
        let bytes = text.as_bytes();
        if bytes.len() != 2 * HASH_BYTES {
            return Err(HashError::HexLength { len: bytes.len() });
        }
        let mut out = [0u8; HASH_BYTES];
        for (index, (slot, pair)) in out.iter_mut().zip(bytes.chunks_exact(2)).enumerate() {
            let high = hex_value(pair[0]).ok_or(HashError::HexDigit {
                position: 2 * index,
            })?;
            let low = hex_value(pair[1]).ok_or(HashError::HexDigit {
                position: 2 * index + 1,
            })?;
            *slot = (high << 4) | low;
        }
        Ok(Self(out))
    }
}

/// The value of one hex digit, or `None` for any other byte.
fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({})", self.to_hex())
    }
}

/// Errors of the hash layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashError {
    /// A chain was asked for with zero tokens per block.
    #[error("tokens_per_block must be at least 1 (for example 32), got 0")]
    ZeroTokensPerBlock,
    /// The token list is shorter than the one the chain saw last (`hash::I3`, R2).
    #[error("token list shrank from {had} to {now} tokens; a chain only grows")]
    TokensShrank {
        /// Tokens in the list the chain saw last.
        had: usize,
        /// Tokens in the list just passed.
        now: usize,
    },
    /// A hex hash is not 32 characters long.
    #[error("a block hash is 32 hex digits, got {len} characters")]
    HexLength {
        /// The length of the text, in bytes.
        len: usize,
    },
    /// A hex hash holds a character that is not a hex digit.
    #[error("character {position} of a block hash is not a hex digit")]
    HexDigit {
        /// Zero-based byte position of the bad character.
        position: usize,
    },
}

impl HashError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ZeroTokensPerBlock => "zero_tokens_per_block",
            Self::TokensShrank { .. } => "tokens_shrank",
            Self::HexLength { .. } => "hex_length",
            Self::HexDigit { .. } => "hex_digit",
        }
    }
}

/// What a request's chain is scoped to: two requests share block hashes only when their
/// scopes are equal (R4: tenants, `LoRA` adapters and multimodal inputs never share a key).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    /// The cache salt (tenant isolation); `None` and `Some("")` encode the same way.
    pub salt: Option<String>,
    /// The `LoRA` task id, if the request runs under an adapter.
    pub lora: Option<i64>,
    /// The 32-byte digest of each multimodal item, in prompt order.
    pub media: Vec<[u8; 32]>,
}

/// The seed of a chain: BLAKE2b-16 over the framed salt, `LoRA` id and media digests (R1).
pub fn scope_seed(scope: &Scope) -> BlockHash {
    let salt = scope.salt.as_deref().unwrap_or_default().as_bytes();
    let lora = scope.lora.map(i64::to_le_bytes);
    let lora: &[u8] = lora.as_ref().map_or(&[], |bytes| bytes.as_slice());
    let mut state = digest_params().to_state();
    for part in [salt, lora]
        .into_iter()
        .chain(scope.media.iter().map(<[u8; 32]>::as_slice))
    {
        let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
        state.update(&len.to_le_bytes());
        state.update(part);
    }
    to_block_hash(state.finalize().as_bytes())
}

/// The hashes of every full block of `tokens`, starting from `seed` (R1). Equivalent to a
/// new [`HashChain`] extended once to `tokens`.
///
/// # Errors
///
/// [`HashError::ZeroTokensPerBlock`] when `tokens_per_block` is 0.
pub fn hash_blocks(
    seed: BlockHash,
    tokens: &[i64],
    tokens_per_block: usize,
) -> Result<Vec<BlockHash>, HashError> {
    let mut chain = HashChain::new(seed, tokens_per_block)?;
    chain.extend_to(tokens)?;
    Ok(chain.into_hashes())
}

/// `BLAKE2b` parameters with a 16-byte digest; created once per chain.
pub(crate) fn digest_params() -> blake2b_simd::Params {
    let mut params = blake2b_simd::Params::new();
    params.hash_length(HASH_BYTES);
    params
}

/// Copies a 16-byte digest into a [`BlockHash`].
pub(crate) fn to_block_hash(digest: &[u8]) -> BlockHash {
    let mut bytes = [0u8; HASH_BYTES];
    bytes.copy_from_slice(&digest[..HASH_BYTES]);
    BlockHash(bytes)
}

/// The chain hashes of one request, extended as its prompt grows (R2).
///
/// ```
/// use kv_connector::core::hash::{hash_blocks, scope_seed, HashChain, Scope};
///
/// let seed = scope_seed(&Scope::default());
/// let mut chain = HashChain::new(seed, 4)?;
/// assert_eq!(chain.extend_to(&[1, 2, 3])?.len(), 0); // no full block yet
/// assert_eq!(chain.extend_to(&[1, 2, 3, 4, 5, 6, 7, 8, 9])?.len(), 2);
/// assert_eq!(chain.hashes(), hash_blocks(seed, &[1, 2, 3, 4, 5, 6, 7, 8], 4)?);
/// # Ok::<(), kv_connector::core::hash::HashError>(())
/// ```
#[derive(Clone, Debug)]
pub struct HashChain {
    /// The parent of block 0.
    seed: BlockHash,
    /// Tokens per block, at least 1.
    tokens_per_block: usize,
    /// `hashes[i]` is the hash of block `i`; only full blocks (`hash::I1`).
    hashes: Vec<BlockHash>,
    /// Length of the token list seen last, to refuse a shrinking list (`hash::I3`).
    tokens_seen: usize,
    /// BLAKE2b-16 parameters, built once rather than per block.
    params: blake2b_simd::Params,
    /// Reused `parent || block tokens` input, `16 + 8*T` bytes (`hash::I4`).
    input: Vec<u8>,
}

impl HashChain {
    /// An empty chain for blocks of `tokens_per_block` tokens, rooted at `seed`.
    ///
    /// # Errors
    ///
    /// [`HashError::ZeroTokensPerBlock`] when `tokens_per_block` is 0.
    pub fn new(seed: BlockHash, tokens_per_block: usize) -> Result<Self, HashError> {
        if tokens_per_block == 0 {
            return Err(HashError::ZeroTokensPerBlock);
        }
        Ok(Self {
            seed,
            tokens_per_block,
            hashes: Vec::new(),
            tokens_seen: 0,
            params: digest_params(),
            input: vec![0u8; HASH_BYTES + TOKEN_BYTES * tokens_per_block],
        })
    }

    /// Extends the chain to the full blocks of `tokens`, the request's whole token list so
    /// far, and returns the hashes of the blocks that became full (possibly none). Blocks the
    /// chain already holds are not hashed again (`hash::I2`).
    ///
    /// # Errors
    ///
    /// [`HashError::TokensShrank`] when `tokens` is shorter than the list passed last time;
    /// the chain is left unchanged.
    pub fn extend_to(&mut self, tokens: &[i64]) -> Result<&[BlockHash], HashError> {
        if tokens.len() < self.tokens_seen {
            return Err(HashError::TokensShrank {
                had: self.tokens_seen,
                now: tokens.len(),
            });
        }
        self.tokens_seen = tokens.len();
        let old_len = self.hashes.len();
        let new_tokens = &tokens[old_len * self.tokens_per_block..];
        let new_blocks = new_tokens.chunks_exact(self.tokens_per_block);
        self.hashes.reserve(new_blocks.len());
        let mut parent = self.last_hash();
        for block in new_blocks {
            parent = self.hash_block(parent, block);
            self.hashes.push(parent);
        }
        Ok(&self.hashes[old_len..])
    }

    /// Makes room for the hashes of a token list of `total_tokens` tokens, so that extending
    /// up to it does not reallocate (for example the prompt length, known at admission).
    #[cfg(feature = "internals")]
    pub fn reserve_for_tokens(&mut self, total_tokens: usize) {
        let blocks = total_tokens / self.tokens_per_block;
        self.hashes
            .reserve(blocks.saturating_sub(self.hashes.len()));
    }

    /// Hashes one full block after `parent`, through the reused input buffer (`hash::I4`).
    fn hash_block(&mut self, parent: BlockHash, block: &[i64]) -> BlockHash {
        let (parent_bytes, token_bytes) = self.input.split_at_mut(HASH_BYTES);
        parent_bytes.copy_from_slice(&parent.0);
        for (slot, token) in token_bytes.chunks_exact_mut(TOKEN_BYTES).zip(block) {
            slot.copy_from_slice(&token.to_le_bytes());
        }
        to_block_hash(self.params.hash(&self.input).as_bytes())
    }

    /// The hash of the last full block, or the seed when there is none.
    pub fn last_hash(&self) -> BlockHash {
        self.hashes.last().copied().unwrap_or(self.seed)
    }

    /// The hashes of every full block seen so far, block 0 first.
    #[cfg(feature = "internals")]
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Consumes the chain and returns its hashes.
    pub fn into_hashes(self) -> Vec<BlockHash> {
        self.hashes
    }

    /// Number of full blocks hashed so far.
    #[cfg(feature = "internals")]
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether no block is full yet.
    #[cfg(feature = "internals")]
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Tokens per block.
    #[cfg(feature = "internals")]
    pub fn tokens_per_block(&self) -> usize {
        self.tokens_per_block
    }

    /// The seed the chain starts from.
    #[cfg(feature = "internals")]
    pub fn seed(&self) -> BlockHash {
        self.seed
    }

    /// Length of the token list passed last to [`extend_to`](Self::extend_to).
    #[cfg(feature = "internals")]
    pub fn tokens_seen(&self) -> usize {
        self.tokens_seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's `empty_scope_two_blocks` case (R1).
    const EMPTY_SEED: &str = "c804ce198ec337e3dc762bdd1a09aece";
    const EMPTY_H0: &str = "2cbd989e68a1d62fe8bebc04262e3dd9";
    const EMPTY_H1: &str = "2a4fd6d9610279f6733a044d56664a9d";

    #[test]
    fn r1_empty_scope_matches_reference() -> Result<(), HashError> {
        let seed = scope_seed(&Scope::default());
        assert_eq!(seed.to_hex(), EMPTY_SEED);
        let hashes = hash_blocks(seed, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 4)?;
        let hex: Vec<String> = hashes.iter().map(BlockHash::to_hex).collect();
        assert_eq!(hex, [EMPTY_H0, EMPTY_H1]);
        Ok(())
    }

    #[test]
    fn r1_salt_and_lora_change_the_seed_like_the_reference() {
        let salted = Scope {
            salt: Some("tenant-a".to_owned()),
            ..Scope::default()
        };
        assert_eq!(
            scope_seed(&salted).to_hex(),
            "1c3d1880c5954bdcaa8fe0d8866c4700"
        );
        let with_lora = Scope {
            lora: Some(7),
            ..salted
        };
        assert_eq!(
            scope_seed(&with_lora).to_hex(),
            "e22bd5c0022aa1696a15b9efebe15598"
        );
    }

    #[test]
    fn r1_empty_salt_encodes_like_no_salt() {
        let empty = Scope {
            salt: Some(String::new()),
            ..Scope::default()
        };
        assert_eq!(scope_seed(&empty), scope_seed(&Scope::default()));
    }

    #[test]
    fn r2_zero_tokens_per_block_is_refused() {
        let err = HashChain::new(BlockHash::default(), 0).err();
        assert_eq!(err, Some(HashError::ZeroTokensPerBlock));
        assert_eq!(
            hash_blocks(BlockHash::default(), &[1], 0),
            Err(HashError::ZeroTokensPerBlock)
        );
    }

    #[test]
    fn r2_extend_returns_only_new_full_blocks() -> Result<(), HashError> {
        let tokens: Vec<i64> = (0..20).collect();
        let mut chain = HashChain::new(BlockHash::default(), 4)?;
        assert!(chain.extend_to(&tokens[..3])?.is_empty());
        assert_eq!(chain.extend_to(&tokens[..9])?.len(), 2);
        assert_eq!(chain.extend_to(&tokens[..9])?.len(), 0);
        chain.reserve_for_tokens(12);
        let third = chain.extend_to(&tokens[..12])?.to_vec();
        assert_eq!(third.len(), 1);
        assert_eq!(chain.len(), 3);
        assert_eq!(chain.hashes()[2], third[0]);
        assert_eq!(
            chain.hashes(),
            hash_blocks(BlockHash::default(), &tokens[..12], 4)?
        );
        Ok(())
    }

    #[test]
    fn r2_shrinking_token_list_is_refused_and_chain_kept() -> Result<(), HashError> {
        let tokens: Vec<i64> = (0..10).collect();
        let mut chain = HashChain::new(BlockHash::default(), 4)?;
        chain.extend_to(&tokens)?;
        let before = chain.hashes().to_vec();
        let err = chain.extend_to(&tokens[..9]).err();
        assert_eq!(err, Some(HashError::TokensShrank { had: 10, now: 9 }));
        assert_eq!(err.map(|e| e.kind()), Some("tokens_shrank"));
        assert_eq!(chain.hashes(), before);
        assert_eq!(chain.tokens_seen(), 10);
        Ok(())
    }

    #[test]
    fn r1_chain_depends_on_the_seed_and_every_earlier_token() -> Result<(), HashError> {
        let tokens: Vec<i64> = (0..16).collect();
        let base = hash_blocks(BlockHash::default(), &tokens, 4)?;
        let mut changed = tokens.clone();
        changed[0] = -1;
        let other = hash_blocks(BlockHash::default(), &changed, 4)?;
        assert!(base.iter().zip(&other).all(|(a, b)| a != b));
        let reseeded = hash_blocks(BlockHash([1; 16]), &tokens, 4)?;
        assert!(base.iter().zip(&reseeded).all(|(a, b)| a != b));
        Ok(())
    }

    #[test]
    fn hex_round_trips_and_rejects_bad_text() -> Result<(), HashError> {
        let hash = BlockHash::from_hex(EMPTY_H0)?;
        assert_eq!(hash.to_hex(), EMPTY_H0);
        assert_eq!(format!("{hash}"), EMPTY_H0);
        assert_eq!(format!("{hash:?}"), format!("BlockHash({EMPTY_H0})"));
        assert_eq!(BlockHash::from_hex(&EMPTY_H0.to_uppercase())?, hash);
        let mut buf = [0u8; 32];
        hash.write_hex(&mut buf);
        assert_eq!(&buf, EMPTY_H0.as_bytes());
        assert_eq!(
            BlockHash::from_hex("abc"),
            Err(HashError::HexLength { len: 3 })
        );
        let bad = format!("{}g", &EMPTY_H0[..31]);
        assert_eq!(
            BlockHash::from_hex(&bad),
            Err(HashError::HexDigit { position: 31 })
        );
        Ok(())
    }

    mod properties {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngSeed};

        use super::super::*;

        /// Fixed seed so a failure reproduces; proptest prints the minimal case.
        fn config() -> Config {
            Config {
                cases: 256,
                rng_seed: RngSeed::Fixed(0x6b76_6861_7368),
                failure_persistence: None,
                ..Config::default()
            }
        }

        proptest! {
            #![proptest_config(config())]

            /// R2: extending at arbitrary points (inside blocks too) gives the one-shot chain.
            #[test]
            fn r2_incremental_chain_equals_one_shot(
                tokens in proptest::collection::vec(any::<i64>(), 0..300),
                tokens_per_block in 1usize..20,
                mut cuts in proptest::collection::vec(0usize..=300, 0..8),
                seed in any::<[u8; 16]>(),
            ) {
                let seed = BlockHash(seed);
                for cut in &mut cuts {
                    *cut = (*cut).min(tokens.len());
                }
                cuts.sort_unstable();
                cuts.push(tokens.len());
                let mut chain = HashChain::new(seed, tokens_per_block)?;
                let mut collected = Vec::new();
                for cut in cuts {
                    collected.extend_from_slice(chain.extend_to(&tokens[..cut])?);
                    prop_assert_eq!(chain.len(), cut / tokens_per_block);
                }
                let one_shot = hash_blocks(seed, &tokens, tokens_per_block)?;
                prop_assert_eq!(chain.hashes(), one_shot.as_slice());
                prop_assert_eq!(collected, one_shot);
            }

            /// R2: any shorter token list is refused with both lengths, chain untouched.
            #[test]
            fn r2_shrinking_list_errors(
                tokens in proptest::collection::vec(any::<i64>(), 1..200),
                tokens_per_block in 1usize..16,
                shorter in any::<prop::sample::Index>(),
            ) {
                let now = shorter.index(tokens.len());
                let mut chain = HashChain::new(BlockHash::default(), tokens_per_block)?;
                chain.extend_to(&tokens)?;
                let before = chain.hashes().to_vec();
                let err = chain.extend_to(&tokens[..now]).err();
                prop_assert_eq!(err, Some(HashError::TokensShrank { had: tokens.len(), now }));
                prop_assert_eq!(chain.hashes(), before.as_slice());
            }
        }
    }
}
