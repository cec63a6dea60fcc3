//! Shared by the real-GPU tests (`gpu_cuda.rs`, `gpu_cuda_checked.rs`): page pool specs
//! and the page references of gpt-oss-120b-sized pages.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the helpers"
)]

use kv_connector::core::hash::BlockHash;
use kv_connector::core::keys::Shard;
use kv_connector::core::layout::{GroupId, LayoutFingerprint};
use kv_connector::core::ledger::LoadFailure;
use kv_connector::core::object::ObjectIdentity;
use kv_connector::gpu::{CopyStream, PagePoolSpec, StagingPool};
use kv_connector::pool::Pool;
use kv_connector::transfer::{load_pages, LoadGrant, LoadMoved, LoadOrder, PageRef};

/// gpt-oss-120b: 18 layers x K,V x 8 heads x 64 x bf16 x 32 tokens per page.
pub const GPT_OSS_PAGE: usize = 18 * 2 * 8 * 64 * 2 * 32;

pub fn spec(group: u32, page_bytes: usize, num_pages: u32) -> PagePoolSpec {
    PagePoolSpec {
        group: GroupId(group),
        page_bytes,
        num_pages,
    }
}

pub fn identity(block: u32) -> ObjectIdentity {
    let mut hash = [0; 16];
    hash[..4].copy_from_slice(&block.to_le_bytes());
    ObjectIdentity {
        layout_fingerprint: LayoutFingerprint(120),
        chain_hash: BlockHash(hash),
        group: GroupId(0),
        shard: Shard::Rank { world: 1, rank: 0 },
    }
}

pub fn page_ref(block: u32, page: u32) -> PageRef {
    PageRef {
        key: format!("gpt-oss/{block}"),
        identity: identity(block),
        page,
        payload_len: GPT_OSS_PAGE,
    }
}

/// `load_pages` with every page lent (item `i` holds block `i`).
pub fn load_all(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    staging: StagingPool,
    items: &[PageRef],
    deadline: Option<std::time::Instant>,
) -> (StagingPool, Result<LoadMoved, LoadFailure>) {
    let blocks: Vec<u64> = (0..items.len() as u64).collect();
    let grant = LoadGrant::new(0..items.len() as u64, 1);
    let order = LoadOrder {
        items,
        blocks: &blocks,
        grant: &grant,
    };
    load_pages(pool, stream, staging, order, deadline)
}
