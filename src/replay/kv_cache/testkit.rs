//! Helpers of the cache's unit tests: made-up chain hashes and a request's life in the
//! cache (admit, compute chunk by chunk, publish, release).

use crate::core::hash::BlockHash;

use super::{GroupPolicy, PromptHashes, KvCache, KvCacheError, RequestPages, SharedPrefix};

/// A window group: `W = 64`, `S = 4`, nothing kept past the window.
pub(super) const WINDOW: GroupPolicy = GroupPolicy::window(64, 4, 0);

/// A full and a window group of `num_pages` pages, `T = 16`, chunks of 32 tokens.
pub(super) fn cache(num_pages: u32) -> KvCache {
    KvCache::new(&[GroupPolicy::FULL, WINDOW], num_pages, 16, 32)
}

/// Chain hash of block `block` of token stream `stream` (equal prefixes, equal hashes).
pub(super) fn hash(stream: u8, block: usize) -> BlockHash {
    let mut bytes = [stream; 16];
    bytes[..8].copy_from_slice(&(block as u64).to_le_bytes());
    BlockHash(bytes)
}

/// The chain hashes of the first `blocks` blocks of `stream`.
pub(super) fn hashes(stream: u8, blocks: usize) -> PromptHashes {
    PromptHashes::from_chain((0..blocks).map(|block| hash(stream, block)).collect())
}

/// Admits a prompt without a local match.
pub(super) fn admit(cache: &mut KvCache, prompt_len: usize) -> Result<RequestPages, KvCacheError> {
    Ok(cache.admit(prompt_len, SharedPrefix::none())?.pages)
}

/// Computes tokens `[from, to)` chunk by chunk as the engine does (window pages
/// allocated per chunk, out-of-window ones dropped after it).
pub(super) fn compute(
    cache: &mut KvCache,
    pages: &mut RequestPages,
    from: usize,
    to: usize,
) -> Result<(), KvCacheError> {
    let mut computed = from;
    while computed < to {
        let end = (computed + 32).min(to);
        for group in 0..pages.tables().len() {
            for block in cache.chunk_blocks(&(computed..end)) {
                cache.ensure_block(pages, group, block)?;
            }
        }
        computed = end;
        cache.drop_out_of_window(pages, computed);
    }
    Ok(())
}

/// Admits, computes, publishes and releases one prompt of `stream`.
pub(super) fn serve(
    cache: &mut KvCache,
    stream: u8,
    prompt_len: usize,
) -> Result<PromptHashes, KvCacheError> {
    let hashes = hashes(stream, prompt_len / 16);
    let mut pages = admit(cache, prompt_len)?;
    compute(cache, &mut pages, 0, prompt_len)?;
    cache.publish(&pages, &hashes, prompt_len);
    cache.release(pages);
    Ok(hashes)
}
