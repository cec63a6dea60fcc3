//! R16 through the engine simulator: a connector that copies pages into a pool when saves
//! are planned and back when a later prompt reuses them, with the save planner's chunk-end
//! cap on or bypassed. With the cap bypassed, stale pages past the chunk end reach the
//! pool and the page check catches them on reuse; with it, nothing past the cap is
//! published and every reused page verifies.

use std::collections::HashMap;
use std::sync::Arc;

use crate::connector::{
    EngineConnector, FinishedLoad, HookError, ReserveAnswer, ScheduledRequest, SchedulerOutput,
};
use crate::core::hash::{hash_blocks, scope_seed, BlockHash, Scope};
use crate::core::ids::{RequestId, ReservationId};
use crate::core::layout::{Attention, GroupId, Layout};
use crate::core::save_plan::{blocks_to_save_capped, past_chunk_end, SaveCap, SaveStep};
use crate::gpu::{Device, PagePoolSpec};
use crate::replay::connectors::ReplayConnector;
use crate::replay::cost::CostModel;
use crate::replay::error::ReplayError;
use crate::stats::ConnectorStats;

use super::{ArrivedRequest, DrafterSetup, Engine, EngineSetup};

const T: usize = 16;
const GROUP: GroupId = GroupId(0);

/// Saves by copying device pages into `pool` inside `on_step` (the point where saves are
/// handed to the pool), loads by copying them back inside the step that reserves.
struct CopyingConnector {
    devices: Vec<Device>,
    cap: SaveCap,
    pool: HashMap<BlockHash, Vec<u8>>,
    hashes: HashMap<RequestId, Vec<BlockHash>>,
    /// Offered tokens per request, from `reserve_prefix`.
    offers: HashMap<RequestId, usize>,
    finished: Vec<FinishedLoad>,
    published_past_chunk_end: u64,
}

impl CopyingConnector {
    fn new(devices: Vec<Device>, cap: SaveCap) -> Self {
        Self {
            devices,
            cap,
            pool: HashMap::new(),
            hashes: HashMap::new(),
            offers: HashMap::new(),
            finished: Vec::new(),
            published_past_chunk_end: 0,
        }
    }

    fn save(&mut self, scheduled: &ScheduledRequest<'_>) -> Result<(), ReplayError> {
        let Some(hashes) = self.hashes.get(&scheduled.request) else {
            return Ok(());
        };
        let step = SaveStep {
            tokens_per_block: T,
            prompt_len: scheduled.prompt_len,
            computed_before: scheduled.computed_before,
            computed_after: scheduled.computed_after,
            reused_until: self.offers.get(&scheduled.request).copied().unwrap_or(0),
            hashed_blocks: hashes.len(),
            last_chunk: scheduled.computed_after >= scheduled.prompt_len,
            rewind_tokens: 0,
            checkpoint_tokens: None,
            resave_min_tokens: None,
        };
        for (block, _) in blocks_to_save_capped(Attention::FULL, &step, self.cap) {
            let page = u32::try_from(scheduled.page_tables[0][block]).unwrap_or(u32::MAX);
            self.published_past_chunk_end += u64::from(past_chunk_end(&step, block));
            let bytes = self.devices[0].read_page_to_vec(GROUP, page)?;
            self.pool.entry(hashes[block]).or_insert(bytes);
        }
        Ok(())
    }

    fn load(&mut self, scheduled: &ScheduledRequest<'_>) -> Result<(), ReplayError> {
        let (Some(reservation), Some(hashes), Some(&offer)) = (
            scheduled.new_reservation,
            self.hashes.get(&scheduled.request),
            self.offers.get(&scheduled.request),
        ) else {
            return Ok(());
        };
        let first = scheduled.computed_before / T;
        let blocks = hashes
            .iter()
            .zip(scheduled.page_tables[0])
            .skip(first)
            .take((offer / T).saturating_sub(first));
        for (hash, &page) in blocks {
            let page = u32::try_from(page).unwrap_or(u32::MAX);
            if let Some(bytes) = self.pool.get(hash) {
                self.devices[0].write_page(GROUP, page, bytes)?;
            }
        }
        self.finished.push(FinishedLoad {
            reservation,
            request: scheduled.request,
            filled: true,
        });
        Ok(())
    }
}

impl EngineConnector for CopyingConnector {
    fn lookup_prefix(
        &mut self,
        request: RequestId,
        prompt: Arc<[i64]>,
        _local: usize,
    ) -> Result<(), HookError> {
        let hashes = hash_blocks(scope_seed(&Scope::default()), &prompt, T).unwrap_or_default();
        self.hashes.insert(request, hashes);
        Ok(())
    }

    fn reserve_prefix(
        &mut self,
        request: RequestId,
        num_computed: usize,
        _reservation: ReservationId,
    ) -> ReserveAnswer {
        let hashes = self.hashes.get(&request).map_or(&[][..], Vec::as_slice);
        // Never the block holding the last prompt token (hashes cover full blocks only;
        // the prompts here end mid-block).
        let present = hashes
            .iter()
            .take_while(|hash| self.pool.contains_key(*hash))
            .count();
        let extra = (present * T).saturating_sub(num_computed);
        self.offers.insert(request, num_computed + extra);
        ReserveAnswer::Offer {
            extra_tokens: extra,
            is_async: true,
        }
    }

    fn release_prefix_reservation(
        &mut self,
        _request: RequestId,
        _reservation: ReservationId,
        _start: usize,
        _end: usize,
    ) {
    }

    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
        std::mem::take(&mut self.finished)
    }

    fn on_step(&mut self, output: &SchedulerOutput<'_>) {
        for scheduled in &output.requests {
            let result = if scheduled.new_reservation.is_some() {
                self.load(scheduled)
            } else {
                self.save(scheduled)
            };
            assert!(result.is_ok(), "{result:?}");
        }
    }

    fn request_finished(&mut self, _request: RequestId) -> bool {
        false
    }

    fn get_finished_saves(&mut self) -> Vec<RequestId> {
        Vec::new()
    }

    fn wait_for_progress(&mut self, _timeout: std::time::Duration) {}

    fn settle_saves(&mut self) {}
}

impl ReplayConnector for CopyingConnector {
    fn report(&mut self) -> ConnectorStats {
        let mut stats = ConnectorStats::default();
        stats.saves.published_past_chunk_end = self.published_past_chunk_end;
        stats
    }
}

/// A tiny-full engine with a 3-token drafter and 40-token chunks, driving a copying
/// connector with `cap`.
fn engine(cap: SaveCap) -> Result<Engine, ReplayError> {
    let spec = PagePoolSpec {
        group: GROUP,
        page_bytes: 4096,
        num_pages: 64,
    };
    let devices = vec![Device::open_host(&[spec])?];
    let setup = EngineSetup {
        instance: 0,
        layout: Arc::new(Layout::preset("tiny-full")?),
        devices: devices.clone(),
        kv_pages: 64,
        max_num_tokens: 40,
        rewind_tokens: 0,
        checkpoint_tokens: 0,
        cost: CostModel::for_layout("tiny-full", 1),
        local_prefix_cache: false,
        drafter: Some(DrafterSetup {
            draft_tokens: 3,
            acceptance: 0.5,
        }),
        lookup_wait: std::time::Duration::ZERO,
        release_during_loads: false,
    };
    Engine::new(setup, Box::new(CopyingConnector::new(devices, cap)))
}

/// Runs one 100-token prompt (the same tokens every time) to its first token.
fn serve(engine: &mut Engine, id: u64, start_us: u64) -> Result<u64, ReplayError> {
    let tokens: Vec<i64> = (500..600).collect();
    let request = ArrivedRequest {
        workload_index: 0,
        id: RequestId(id),
        prompt_len: tokens.len(),
        arrival_us: start_us,
        hashes: hash_blocks(scope_seed(&Scope::default()), &tokens, T)?.into(),
    };
    engine.enqueue(request, Arc::from(tokens))?;
    let mut now = start_us;
    for _ in 0..100 {
        engine.step(now)?;
        if !engine.has_requests() {
            return Ok(now);
        }
        now = engine.next_event_us(now).unwrap_or(now + 1);
    }
    Err(ReplayError::NoRequests)
}

#[test]
fn bypassing_the_chunk_end_cap_publishes_stale_pages_the_check_catches_r16(
) -> Result<(), ReplayError> {
    let mut engine = engine(SaveCap::PromptEnd)?;
    let end = serve(&mut engine, 1, 0)?;
    serve(&mut engine, 2, end + 1)?;
    let summary = engine.finish();
    // Chunks [0, 40), [40, 80), [80, 100): the first step publishes blocks 2..6, whose
    // tokens are not computed yet (stale pages).
    assert_eq!(summary.connector.saves.published_past_chunk_end, 4 + 1);
    assert!(summary.counters.mismatched_pages >= 4);
    assert_eq!(summary.counters.reused_tokens, 96);
    Ok(())
}

#[test]
fn with_the_chunk_end_cap_every_reused_page_verifies_r16_r18() -> Result<(), ReplayError> {
    let mut engine = engine(SaveCap::ChunkEnd)?;
    let end = serve(&mut engine, 1, 0)?;
    serve(&mut engine, 2, end + 1)?;
    let summary = engine.finish();
    assert_eq!(summary.connector.saves.published_past_chunk_end, 0);
    assert_eq!(summary.counters.mismatched_pages, 0);
    assert_eq!(summary.counters.verified_pages, 6);
    assert_eq!(summary.counters.reused_tokens, 96);
    // The drafter ran: 3 drafts per prompt written after the last chunk.
    assert_eq!(summary.counters.draft_tokens_proposed, 6);
    Ok(())
}
