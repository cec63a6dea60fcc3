//! Shared by the real-GPU tests (`gpu_cuda.rs`, `gpu_cuda_checked.rs`): page pool specs
//! and the page references of gpt-oss-120b-sized pages.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the helpers"
)]

use kv_connector::core::hash::BlockHash;
use kv_connector::core::keys::Shard;
use kv_connector::core::layout::{GroupId, LayoutFingerprint};
use kv_connector::core::object::ObjectIdentity;
use kv_connector::gpu::PagePoolSpec;
use kv_connector::transfer::PageRef;

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
