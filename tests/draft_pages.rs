//! A drafter's pages are named by the chain extended with the token after their block
//! (R37, `page_names`), through the real connector and the embedded pool:
//!
//! - a prompt that shares a prefix with a saved one up to a block boundary and differs at
//!   the next token is offered one block less: the saved draft page of the last shared
//!   block was computed with another next token, so it is not this prompt's (without the
//!   next-token name the pool would serve it, and the drafter would resume on a row it never
//!   computed);
//! - the same prompt again is offered every candidate block, draft pages loaded with the
//!   target's;
//! - a prompt ending on a block boundary saves no draft page for its last block (its next
//!   token is a generated token, not in the prompt), and every other page once;

mod common;

use std::sync::Arc;

use common::{finished_loads, memory_pool, page_content, reserve, start, Instance};
use kv_connector::config::Config;
use kv_connector::connector::ReserveAnswer;
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::{GroupId, Layout, ModelRole};
use kv_connector::pool::{MemoryPool, Pool};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `T` of tiny-full.
const T: usize = 16;

/// tiny-full with a drafter's group (group 1, one draft layer).
fn eagle_layout() -> Result<Layout, Box<dyn std::error::Error>> {
    let mut layout = Layout::preset("tiny-full")?;
    let mut draft = layout.groups[0].clone();
    draft.id = GroupId(1);
    draft.role = ModelRole::Draft;
    draft.layers = vec![0];
    layout.groups.push(draft);
    layout.name = "tiny-full-eagle".into();
    Ok(layout)
}

/// A prompt of `blocks` full blocks and `extra` more tokens whose token at `blocks_before *
/// T` is `fork` (the rest counts up from 0).
fn forked(blocks: usize, extra: usize, fork_at_block: usize, fork: i64) -> Arc<[i64]> {
    let mut tokens: Vec<i64> = (0_i64..).take(blocks * T + extra).collect();
    tokens[fork_at_block * T] = fork;
    tokens.into()
}

/// The offer of a fresh lookup of `tokens` on `instance`.
fn offer(instance: &mut Instance, request: RequestId, tokens: &Arc<[i64]>) -> usize {
    common::look_up(&mut instance.handle, request, tokens);
    match reserve(&mut instance.handle, request, ReservationId(request.0)) {
        ReserveAnswer::Offer { extra_tokens, .. } => extra_tokens,
        ReserveAnswer::Pending => unreachable!("reserve waits for an answer"),
    }
}

fn saved(pool: &Arc<MemoryPool>, layout: &Layout, tokens: &Arc<[i64]>) -> Instance {
    let mut saver = start(Arc::clone(pool) as Arc<dyn Pool>, layout, Config::default());
    saver.save_prompt(RequestId(1), tokens, layout, 0);
    saver
}

#[test]
fn r37_a_draft_page_computed_with_another_next_token_is_not_offered() -> TestResult {
    let layout = eagle_layout()?;
    let pool = memory_pool(64 << 20);
    // A: blocks 0-5 of counting tokens, then one more token (candidates: blocks 0-5).
    let a = forked(6, 1, 0, 0);
    let saver = saved(&pool, &layout, &a);
    let mut reader = start(
        Arc::clone(&pool) as Arc<dyn Pool>,
        &layout,
        Config::default(),
    );
    // B agrees with A on blocks 0-3 and differs at token 4T: the target holds 4 blocks,
    // but A's draft page of block 3 read A's token 4T.
    let b = forked(6, 1, 4, -7);
    assert_eq!(offer(&mut reader, RequestId(10), &b), 3 * T);
    // The same prompt as A: every candidate block, target and draft.
    assert_eq!(offer(&mut reader, RequestId(11), &a), 6 * T);
    // Its load fills the draft pages with A's bytes, as the target's.
    reader.start_load(RequestId(11), ReservationId(11), a.len(), &layout, 100);
    let loads = finished_loads(&mut reader.handle);
    assert!(loads.iter().all(|load| load.filled), "{loads:?}");
    for group in &layout.groups {
        let device = &reader.devices[0];
        let len = device.page_pool(group.id)?.page_bytes;
        let mut page = vec![0; len];
        for block in 0..6 {
            device.read_page(group.id, 100 + u32::try_from(block)?, &mut page)?;
            assert_eq!(
                page,
                page_content(group.id, 0, block, len),
                "group {group:?} block {block}"
            );
        }
    }
    let _ = reader.handle.shutdown();
    let _ = saver.handle.shutdown();
    Ok(())
}

#[test]
fn r37_the_last_block_of_a_block_aligned_prompt_saves_no_draft_page() -> TestResult {
    let layout = eagle_layout()?;
    let pool = memory_pool(64 << 20);
    // 4 full blocks and nothing more: block 3's next token would be generated.
    let saver = saved(&pool, &layout, &forked(4, 0, 0, 0));
    assert_eq!(
        pool.counters().puts,
        4 + 3,
        "4 target pages and draft pages of blocks 0-2"
    );
    let stats = saver.handle.shutdown().saves;
    assert_eq!(stats.saves_enqueued, 7);
    assert_eq!(stats.saves_done, 7);
    Ok(())
}
