//! Helpers of the fault tests (feature `faults`): a pool behind a fault injector, the test
//! prompt saved without faults, and one load or one save of it through a faulty pool with
//! the checks every fault test makes (filled pages are the saved bytes, pages handed back,
//! accounting closed).

use std::sync::Arc;

use kv_connector::config::Config;
use kv_connector::connector::{EngineConnector, ReserveAnswer};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::{GroupId, Layout};
use kv_connector::pool::faults::{FaultInjector, FaultSpec, FaultyPool};
use kv_connector::pool::{MemoryPool, Pool};

use super::{finished_loads, memory_pool, page_content, prompt, reserve, start, Instance};

/// Tokens of the test prompt: 8 full blocks of tiny-full and one more token.
pub const PROMPT_BLOCKS: usize = 8;

pub fn tiny() -> Result<Layout, Box<dyn std::error::Error>> {
    Ok(Layout::preset("tiny-full")?)
}

/// `inner` behind a fault injector of `spec`.
pub fn faulty(inner: &Arc<MemoryPool>, spec: FaultSpec) -> (Arc<dyn Pool>, Arc<FaultInjector>) {
    let injector = Arc::new(FaultInjector::new(spec));
    let pool = FaultyPool::new(Arc::clone(inner) as Arc<dyn Pool>, Arc::clone(&injector));
    (Arc::new(pool), injector)
}

/// Saves the test prompt through a pool without faults.
pub fn saved_pool(layout: &Layout) -> (Arc<MemoryPool>, Arc<[i64]>) {
    let inner = memory_pool(64 << 20);
    let t = layout.tokens_per_block as usize;
    let tokens = prompt(0, PROMPT_BLOCKS * t + 1);
    let mut saver = start(
        Arc::clone(&inner) as Arc<dyn Pool>,
        layout,
        Config::default(),
    );
    saver.save_prompt(RequestId(1), &tokens, layout, 0);
    let _ = saver.handle.shutdown();
    (inner, tokens)
}

/// Looks up, reserves and loads the test prompt into pages 100..; returns whether the load
/// was filled, after checking that a filled load's pages are the saved bytes.
pub fn load_once(
    instance: &mut Instance,
    layout: &Layout,
    tokens: &Arc<[i64]>,
    request: u64,
) -> Result<bool, Box<dyn std::error::Error>> {
    let (request, reservation) = (RequestId(request), ReservationId(request));
    instance
        .handle
        .lookup_prefix(request, Arc::clone(tokens), 0)
        .unwrap();
    let ReserveAnswer::Offer { extra_tokens, .. } =
        reserve(&mut instance.handle, request, reservation)
    else {
        return Err("reserve stayed pending".into());
    };
    if extra_tokens == 0 {
        return Ok(false);
    }
    instance.start_load(request, reservation, tokens.len(), layout, 100);
    let finished = finished_loads(&mut instance.handle);
    let filled = finished.iter().any(|load| load.filled);
    if filled {
        let len = instance.devices[0].page_pool(GroupId(0))?.page_bytes;
        for block in 0..PROMPT_BLOCKS {
            let page = u32::try_from(100 + block)?;
            let bytes = instance.devices[0].read_page_to_vec(GroupId(0), page)?;
            assert_eq!(
                bytes,
                page_content(GroupId(0), 0, block, len),
                "a filled load has the saved bytes (block {block})"
            );
        }
    }
    instance.handle.request_finished(request);
    Ok(filled)
}

/// Saves the test prompt through `spec`; returns the stats after checking that the
/// request's pages were handed back (R22) and the accounting is closed (A1).
pub fn save_with(
    spec: FaultSpec,
    config: Config,
) -> Result<(kv_connector::stats::ConnectorStats, Arc<FaultInjector>), Box<dyn std::error::Error>> {
    let layout = tiny()?;
    let inner = memory_pool(64 << 20);
    let (pool, injector) = faulty(&inner, spec);
    let mut instance = start(pool, &layout, config);
    let t = layout.tokens_per_block as usize;
    let tokens = prompt(0, PROMPT_BLOCKS * t + 1);
    instance.save_prompt(RequestId(1), &tokens, &layout, 0);
    let keep = instance.handle.request_finished(RequestId(1));
    instance.handle.settle_saves();
    let freed = instance.handle.get_finished_saves();
    assert!(
        !keep || freed == vec![RequestId(1)],
        "pages handed back (R22)"
    );
    let stats = instance.handle.shutdown();
    stats.check_accounting()?;
    assert_eq!(stats.saves.saves_enqueued, PROMPT_BLOCKS as u64);
    Ok((stats, injector))
}
