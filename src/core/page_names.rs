//! Which hash names each group's pages (R1, R37): the chain hash of the block for the
//! target model's groups, the chain extended by the next token for the drafter's.
//!
//! A hidden-state drafter (EAGLE, MTP) computes its KV row at position `i` from the
//! target's hidden state at `i` and the embedding of token `i + 1`. So the drafter's page of
//! block `k` (rows `[k*T, (k+1)*T)`) depends on token `(k+1)*T` too, which block `k`'s
//! chain hash does not cover: two prompts that agree on `[0, (k+1)*T)` and differ at
//! `(k+1)*T` compute different draft pages for block `k`. Under the chain hash alone the
//! first of them to save would serve the other a page it never computed. A draft page is
//! therefore named by
//!
//! ```text
//! n[k] = BLAKE2b-16( h[k] || tokens[(k+1)*T] as i64 LE )
//! ```
//!
//! the hash the chain would give a one-token block after block `k`: the key covers every
//! token the page depends on. A draft model that reads no next token (a small standalone
//! LM) is named the same way; it only gives up the draft page of a block whose next token
//! is not in the prompt.
//!
//! ## Invariants
//!
//! - `page_names::N1`. `n[k]` exists exactly for the blocks `k < h.len()` with
//!   `(k+1)*T < tokens.len()`: a draft page whose next token is not a prompt token has no
//!   name, so it is never saved, probed or loaded (R18: nothing past the prompt is
//!   published).
//! - `page_names::N2`. Every block a lookup may offer has a name in every group: the
//!   candidates end before the block holding the last prompt token (R10), so their next
//!   token is a prompt token.
//! - `page_names::N3`. `n[k]` depends on exactly the tokens `[0, (k+1)*T]` and the scope:
//!   equal inputs give equal names, a different next token gives a different name.

use std::sync::Arc;

use crate::core::hash::{digest_params, hash_blocks, to_block_hash, BlockHash, HashError, HASH_BYTES};
use crate::core::layout::ModelRole;

/// How a group's pages are named in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageNaming {
    /// By the block's chain hash (R1): the target model's groups.
    Chain,
    /// By the chain extended by the token after the block (R37): the drafter's groups.
    NextToken,
}

impl From<ModelRole> for PageNaming {
    fn from(role: ModelRole) -> Self {
        match role {
            ModelRole::Target => PageNaming::Chain,
            ModelRole::Draft => PageNaming::NextToken,
        }
    }
}

/// The names of one prompt's pages: its chain hashes and, where the layout has draft
/// groups, its next-token hashes. Cloning shares both lists.
#[derive(Clone, Debug, Default)]
pub struct PromptHashes {
    /// `h[k]`, the chain hash of every full block (R1).
    chain: Arc<[BlockHash]>,
    /// `n[k]` (`page_names::N1`); empty when no group is named by it.
    next_token: Arc<[BlockHash]>,
}

impl PromptHashes {
    /// The names of `prompt`'s pages, chaining from `seed`; the next-token hashes only when
    /// `with_next_token` (a layout with draft groups).
    ///
    /// # Errors
    ///
    /// [`HashError::ZeroTokensPerBlock`] when `tokens_per_block` is 0.
    pub fn of_prompt(
        seed: BlockHash,
        prompt: &[i64],
        tokens_per_block: usize,
        with_next_token: bool,
    ) -> Result<Self, HashError> {
        let chain = hash_blocks(seed, prompt, tokens_per_block)?;
        let next_token = if with_next_token {
            next_token_hashes(&chain, prompt, tokens_per_block)
        } else {
            Vec::new()
        };
        Ok(PromptHashes {
            chain: Arc::from(chain),
            next_token: Arc::from(next_token),
        })
    }

    /// Names made of chain hashes alone (no draft group).
    pub fn from_chain(chain: Vec<BlockHash>) -> Self {
        PromptHashes {
            chain: Arc::from(chain),
            next_token: Arc::from(Vec::new()),
        }
    }

    /// Names made of both lists as they are (a record of another connector's lookup).
    pub fn from_parts(chain: Vec<BlockHash>, next_token: Vec<BlockHash>) -> Self {
        PromptHashes {
            chain: Arc::from(chain),
            next_token: Arc::from(next_token),
        }
    }

    /// The chain hashes of the prompt's full blocks.
    pub fn chain(&self) -> &[BlockHash] {
        &self.chain
    }

    /// The names of the pages of a group named by `naming`, indexed by block.
    pub fn names(&self, naming: PageNaming) -> &Arc<[BlockHash]> {
        match naming {
            PageNaming::Chain => &self.chain,
            PageNaming::NextToken => &self.next_token,
        }
    }

    /// The name of block `block`'s page in a group named by `naming`; `None` where the
    /// page has none (`page_names::N1`).
    pub fn get(&self, naming: PageNaming, block: usize) -> Option<&BlockHash> {
        self.names(naming).get(block)
    }
}

impl From<Vec<BlockHash>> for PromptHashes {
    fn from(chain: Vec<BlockHash>) -> Self {
        PromptHashes::from_chain(chain)
    }
}

/// `n[k]` for every block of `chain` whose next token is in `tokens` (`page_names::N1`).
pub fn next_token_hashes(
    chain: &[BlockHash],
    tokens: &[i64],
    tokens_per_block: usize,
) -> Vec<BlockHash> {
    let params = digest_params();
    let mut input = [0_u8; HASH_BYTES + 8];
    chain
        .iter()
        .enumerate()
        .map_while(|(block, hash)| {
            let next = tokens.get((block + 1).checked_mul(tokens_per_block)?)?;
            input[..HASH_BYTES].copy_from_slice(&hash.0);
            input[HASH_BYTES..].copy_from_slice(&next.to_le_bytes());
            Some(to_block_hash(params.hash(&input).as_bytes()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hash::{scope_seed, HashChain, Scope};
    use proptest::prelude::*;

    fn seed() -> BlockHash {
        scope_seed(&Scope::default())
    }

    /// `n[k]` is the chain's hash of a one-token block after block `k`.
    #[test]
    fn next_token_hash_is_a_one_token_chain_step() -> Result<(), HashError> {
        let tokens: Vec<i64> = (0..20).collect();
        let chain = hash_blocks(seed(), &tokens, 4)?;
        let names = next_token_hashes(&chain, &tokens, 4);
        for (block, name) in names.iter().enumerate() {
            let mut one = HashChain::new(chain[block], 1)?;
            let next = tokens[(block + 1) * 4];
            assert_eq!(one.extend_to(&[next])?, &[*name]);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x6e61_6d65),
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]
        /// `page_names::N1`, N3: names exist exactly where the next token does, and each
        /// depends on that token.
        #[test]
        fn names_exist_where_the_next_token_does(
            len in 0_usize..80,
            t in 1_usize..9,
            flip in 0_usize..80,
        ) {
            let tokens: Vec<i64> = (0_i64..).take(len).map(|i| i * 7 % 13).collect();
            let hashes = PromptHashes::of_prompt(seed(), &tokens, t, true).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let expected = (0..hashes.chain().len()).filter(|k| (k + 1) * t < len).count();
            prop_assert_eq!(hashes.names(PageNaming::NextToken).len(), expected);
            let mut other = tokens.clone();
            if let Some(token) = other.get_mut(flip) {
                *token += 100;
            }
            let changed = PromptHashes::of_prompt(seed(), &other, t, true).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for k in 0..expected {
                let covered = flip <= (k + 1) * t;
                let same = hashes.get(PageNaming::NextToken, k) == changed.get(PageNaming::NextToken, k);
                prop_assert_eq!(same, !covered || flip >= len, "block {} flip {}", k, flip);
            }
        }
    }

    #[test]
    fn without_draft_groups_no_next_token_hashes() -> Result<(), HashError> {
        let hashes = PromptHashes::of_prompt(seed(), &[1, 2, 3, 4, 5], 2, false)?;
        assert_eq!(hashes.chain().len(), 2);
        assert!(hashes.get(PageNaming::NextToken, 0).is_none());
        assert_eq!(hashes.get(PageNaming::Chain, 1), hashes.chain().get(1));
        Ok(())
    }
}
