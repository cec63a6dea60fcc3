//! The page check of filled loads (`engine::E2`) leaves no block of a load unchecked: a
//! block the load covers whose page is gone stops the replay with
//! [`KvCacheError::LoadedPageMissing`], as a missing shared page does
//! ([`KvCacheError::SharedPageMissing`]), instead of being skipped.

use std::sync::Arc;

use crate::connector::{EngineConnector, FinishedLoad, HookError, ReserveAnswer, SchedulerOutput};
use crate::core::hash::{hash_blocks, scope_seed, BlockHash, Scope};
use crate::core::ids::{RequestId, ReservationId};
use crate::core::layout::{GroupId, Layout};
use crate::gpu::{Device, PagePoolSpec};
use crate::replay::connectors::ReplayConnector;
use crate::replay::content::{ContentGroup, PageChecker};
use crate::replay::cost::CostModel;
use crate::replay::error::ReplayError;
use crate::replay::kv_cache::KvCacheError;
use crate::stats::ConnectorStats;

use super::{ArrivedRequest, Engine, EngineSetup, Phase};

const T: usize = 16;

/// Offers every full block before the last prompt token and fills a reservation's pages
/// with their computed content.
struct Generator {
    devices: Vec<Device>,
    groups: Vec<ContentGroup>,
    checker: PageChecker,
    hashes: Vec<BlockHash>,
    finished: Vec<FinishedLoad>,
}

impl EngineConnector for Generator {
    fn lookup_prefix(
        &mut self,
        _request: RequestId,
        prompt: Arc<[i64]>,
        _local: usize,
    ) -> Result<(), HookError> {
        self.hashes = hash_blocks(scope_seed(&Scope::default()), &prompt, T).unwrap_or_default();
        Ok(())
    }

    fn reserve_prefix(&mut self, _: RequestId, _: usize, _: ReservationId) -> ReserveAnswer {
        ReserveAnswer::Offer {
            extra_tokens: self.hashes.len() * T,
            is_async: true,
        }
    }

    fn release_prefix_reservation(&mut self, _: RequestId, _: ReservationId, _: usize, _: usize) {}

    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
        std::mem::take(&mut self.finished)
    }

    fn on_step(&mut self, output: &SchedulerOutput<'_>) {
        for scheduled in &output.requests {
            let Some(reservation) = scheduled.new_reservation else {
                continue;
            };
            for (group, table) in self.groups.iter().zip(scheduled.page_tables) {
                for (&page, hash) in table.iter().zip(&self.hashes) {
                    if let Ok(page) = u32::try_from(page) {
                        let written = self
                            .checker
                            .write_computed(&self.devices, group, page, hash);
                        assert!(written.is_ok(), "{written:?}");
                    }
                }
            }
            self.finished.push(FinishedLoad {
                reservation,
                request: scheduled.request,
                filled: true,
            });
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

impl ReplayConnector for Generator {
    fn report(&mut self) -> ConnectorStats {
        ConnectorStats::default()
    }
}

/// A tiny-hybrid engine (`W = 64`, `S = 4`) whose one 200-token request is loading its
/// 192-token prefix, filled by the connector.
fn loading_engine() -> Result<Engine, ReplayError> {
    let layout = Layout::preset("tiny-hybrid")?;
    let specs: Vec<PagePoolSpec> = [GroupId(0), GroupId(1)]
        .into_iter()
        .map(|group| PagePoolSpec {
            group,
            page_bytes: 256,
            num_pages: 64,
        })
        .collect();
    let devices = vec![Device::open_host(&specs)?];
    let connector = Generator {
        devices: devices.clone(),
        groups: layout.groups.iter().map(ContentGroup::of).collect(),
        checker: PageChecker::new(1),
        hashes: Vec::new(),
        finished: Vec::new(),
    };
    let setup = EngineSetup {
        instance: 0,
        layout: Arc::new(layout),
        devices,
        kv_pages: 64,
        max_num_tokens: 512,
        rewind_tokens: 0,
        checkpoint_tokens: 0,
        cost: CostModel::for_layout("tiny-hybrid", 1),
        local_prefix_cache: false,
        drafter: None,
        lookup_wait: std::time::Duration::ZERO,
        release_during_loads: false,
    };
    let mut engine = Engine::new(setup, Box::new(connector))?;
    let tokens: Vec<i64> = (1_000..1_200).collect();
    let request = ArrivedRequest {
        workload_index: 0,
        id: RequestId(1),
        prompt_len: tokens.len(),
        arrival_us: 0,
        hashes: hash_blocks(scope_seed(&Scope::default()), &tokens, T)?.into(),
    };
    engine.enqueue(request, Arc::from(tokens))?;
    engine.step(0)?;
    let loading = engine
        .active
        .first()
        .is_some_and(|active| matches!(active.phase, Phase::Loading { end: 192, .. }));
    assert!(loading, "the request loads its prefix");
    Ok(engine)
}

/// Steps until the load is reported.
fn finish_load(engine: &mut Engine) -> Result<(), ReplayError> {
    let mut now = 0;
    while engine
        .active
        .first()
        .is_some_and(|active| matches!(active.phase, Phase::Loading { .. }))
    {
        now = engine.next_event_us(now).unwrap_or(now + 1);
        engine.step(now)?;
    }
    Ok(())
}

#[test]
fn every_page_of_a_filled_load_is_checked() -> Result<(), ReplayError> {
    let mut engine = loading_engine()?;
    finish_load(&mut engine)?;
    // 12 full blocks, the sink block 0 and the window blocks 8..12.
    assert_eq!(engine.counters.verified_pages, 12 + 1 + 4);
    assert_eq!(engine.counters.mismatched_pages, 0);
    Ok(())
}

#[test]
fn a_loaded_block_without_a_page_stops_the_replay() -> Result<(), ReplayError> {
    let mut engine = loading_engine()?;
    let Engine { cache, active, .. } = &mut engine;
    let pages = &mut active.first_mut().ok_or(ReplayError::NoRequests)?.pages;
    cache.drop_window_pages(pages, 0);
    let err = finish_load(&mut engine).expect_err("the page check cannot skip a block");
    assert!(
        matches!(
            err,
            ReplayError::KvCache(KvCacheError::LoadedPageMissing { group: 1, block: 0 })
        ),
        "{err}"
    );
    Ok(())
}
