//! A scripted connector for replays (feature `cli`): it remembers every block any instance
//! computed, offers the longest remembered prefix, and fills a reservation's pages with
//! the content generator's bytes (`replay::content`). It works out by itself which blocks
//! a load resuming at `e` fills (R12, R15: full groups every block up to `e`; window
//! groups their sink blocks `[0, ceil(S/T))` and the blocks overlapping `[e - W, e)`),
//! independently of the engine simulator, and can make one of the mistakes of
//! [`WindowMistake`] there. It counts the pages it leaves unfilled that the engine's page
//! table lists for the load, which the engine's page check must report as mismatched.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kv_connector::connector::{
    EngineConnector, FinishedLoad, HookError, ReserveAnswer, SchedulerOutput,
};
use kv_connector::core::hash::{hash_blocks, scope_seed, BlockHash, Scope};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Attention;
use kv_connector::gpu::Device;
use kv_connector::replay::content::{ContentGroup, PageChecker};
use kv_connector::replay::{InstanceContext, ReplayConnector};
use kv_connector::stats::ConnectorStats;
use parking_lot::Mutex;

/// What a [`WindowLoader`] gets wrong in the window groups of a load resuming at `e`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowMistake {
    /// Nothing: it fills every block R15 names.
    None,
    /// It leaves out the first block overlapping `[e - W, e)` (one window block short).
    OneWindowBlockShort,
    /// It leaves out the sink blocks `[0, ceil(S/T))` outside the window.
    SkipSinks,
    /// It fills the window of `e - T` instead of `e` (the wrong resume point).
    WrongResumePoint,
    /// Every page gets the content of another block (wrong bytes in every group).
    WrongBytes,
}

/// Blocks a load resuming at `resume` fills in a group of `attention` (R15), with
/// `mistake` applied to window groups.
pub fn blocks_to_fill(
    attention: Attention,
    tokens_per_block: usize,
    resume: usize,
    mistake: WindowMistake,
) -> BTreeSet<usize> {
    let t = tokens_per_block;
    let end = resume / t;
    if !attention.is_window() {
        return (0..end).collect();
    }
    let window_of = |e: usize| (e.saturating_sub(attention.window_tokens) / t)..e / t;
    let sinks: BTreeSet<usize> = (0..attention.sink_tokens.div_ceil(t).min(end)).collect();
    let mut window: BTreeSet<usize> = window_of(resume).collect();
    match mistake {
        WindowMistake::None | WindowMistake::WrongBytes => {}
        WindowMistake::OneWindowBlockShort => {
            if let Some(&first) = window.iter().find(|block| !sinks.contains(block)) {
                window.remove(&first);
            }
        }
        WindowMistake::SkipSinks => return window,
        WindowMistake::WrongResumePoint => window = window_of(resume.saturating_sub(t)).collect(),
    }
    window.extend(sinks);
    window
}

/// The computed blocks every [`WindowLoader`] of a replay shares (a pool of hashes).
pub type Computed = Arc<Mutex<HashSet<BlockHash>>>;

struct Request {
    hashes: Vec<BlockHash>,
    prompt_len: usize,
    /// Tokens offered (`e`), cut by releases.
    offered: usize,
}

/// The scripted connector (module docs).
pub struct WindowLoader {
    mistake: WindowMistake,
    devices: Vec<Device>,
    groups: Vec<(ContentGroup, Attention)>,
    tokens_per_block: usize,
    computed: Computed,
    requests: HashMap<RequestId, Request>,
    finished: Vec<FinishedLoad>,
    checker: PageChecker,
    report: ConnectorStats,
    /// Pages (per rank) the engine's tables list for a load that this connector did not
    /// fill, over all loads; shared so a test can read it after the replay.
    unfilled: Arc<Mutex<u64>>,
}

impl WindowLoader {
    /// A loader for one instance.
    pub fn new(
        context: &InstanceContext,
        mistake: WindowMistake,
        computed: Computed,
        unfilled: Arc<Mutex<u64>>,
    ) -> Self {
        Self {
            mistake,
            devices: context.devices.clone(),
            groups: context
                .layout
                .groups
                .iter()
                .map(|group| (ContentGroup::of(group), group.attention()))
                .collect(),
            tokens_per_block: context.layout.tokens_per_block as usize,
            computed,
            requests: HashMap::new(),
            finished: Vec::new(),
            checker: PageChecker::new(context.layout.world_size),
            report: ConnectorStats::default(),
            unfilled,
        }
    }

    /// Fills the pages of a new reservation of `request` from block `first` on.
    fn fill(&mut self, request: RequestId, tables: &[&[i32]], first: usize) {
        let Some(state) = self.requests.get(&request) else {
            return;
        };
        let ranks = self.devices.len() as u64;
        let mut unfilled = 0;
        for ((group, attention), table) in self.groups.iter().zip(tables) {
            let t = self.tokens_per_block;
            let chosen = blocks_to_fill(*attention, t, state.offered, self.mistake);
            let listed = (first..state.offered / t).filter(|&block| {
                table
                    .get(block)
                    .is_some_and(|&page| page >= 0 && !chosen.contains(&block))
            });
            unfilled += listed.count() as u64 * ranks;
            for block in chosen.into_iter().filter(|&block| block >= first) {
                let (Some(&page), Some(hash)) = (table.get(block), state.hashes.get(block)) else {
                    continue;
                };
                let Ok(page) = u32::try_from(page) else {
                    continue;
                };
                let hash = match self.mistake {
                    WindowMistake::WrongBytes => BlockHash([0xEE; 16]),
                    _ => *hash,
                };
                let written = self
                    .checker
                    .write_computed(&self.devices, group, page, &hash);
                assert!(written.is_ok(), "{written:?}");
            }
        }
        *self.unfilled.lock() += unfilled;
    }
}

impl EngineConnector for WindowLoader {
    fn lookup_prefix(
        &mut self,
        request: RequestId,
        prompt: Arc<[i64]>,
        _local: usize,
    ) -> Result<(), HookError> {
        let hashes = hash_blocks(
            scope_seed(&Scope::default()),
            &prompt,
            self.tokens_per_block,
        )
        .unwrap_or_default();
        let state = Request {
            hashes,
            prompt_len: prompt.len(),
            offered: 0,
        };
        self.requests.insert(request, state);
        Ok(())
    }

    fn reserve_prefix(
        &mut self,
        request: RequestId,
        num_computed: usize,
        _reservation: ReservationId,
    ) -> ReserveAnswer {
        let t = self.tokens_per_block;
        let Some(state) = self.requests.get_mut(&request) else {
            return ReserveAnswer::Offer {
                extra_tokens: 0,
                is_async: true,
            };
        };
        let computed = self.computed.lock();
        let cap = state.prompt_len.saturating_sub(1) / t;
        let blocks = state
            .hashes
            .iter()
            .take(cap)
            .take_while(|hash| computed.contains(hash))
            .count();
        state.offered = blocks * t;
        if blocks == 0 {
            self.report.lookups.full_miss += 1;
        } else {
            self.report.lookups.full += 1;
        }
        ReserveAnswer::Offer {
            extra_tokens: state.offered.saturating_sub(num_computed),
            is_async: true,
        }
    }

    fn release_prefix_reservation(
        &mut self,
        request: RequestId,
        _reservation: ReservationId,
        start: usize,
        _end: usize,
    ) {
        if let Some(state) = self.requests.get_mut(&request) {
            state.offered = state.offered.min(start);
        }
    }

    fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
        std::mem::take(&mut self.finished)
    }

    fn on_step(&mut self, output: &SchedulerOutput<'_>) {
        for scheduled in &output.requests {
            let t = self.tokens_per_block;
            if let Some(reservation) = scheduled.new_reservation {
                self.fill(
                    scheduled.request,
                    scheduled.page_tables,
                    scheduled.computed_before / t,
                );
                self.report.loads.loads_started += 1;
                self.report.loads.loads_done += 1;
                self.finished.push(FinishedLoad {
                    reservation,
                    request: scheduled.request,
                    filled: true,
                });
            } else if let Some(state) = self.requests.get(&scheduled.request) {
                let done = (scheduled.computed_after / t).min(state.hashes.len());
                self.computed
                    .lock()
                    .extend(state.hashes[..done].iter().copied());
            }
        }
    }

    fn request_finished(&mut self, request: RequestId) -> bool {
        self.requests.remove(&request);
        false
    }

    fn get_finished_saves(&mut self) -> Vec<RequestId> {
        Vec::new()
    }

    fn wait_for_progress(&mut self, _timeout: Duration) {}

    fn settle_saves(&mut self) {}
}

impl ReplayConnector for WindowLoader {
    fn report(&mut self) -> ConnectorStats {
        self.report.clone()
    }
}
