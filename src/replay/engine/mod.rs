//! The engine simulator of one serving instance: a scheduler with prefix-aware admission,
//! chunked prefill and a paged KV cache, driving one connector through the engine hooks
//! (`docs/DESIGN.md` section 2; the lifecycle is in `crate::connector`'s docs).
//!
//! Workflow of one request:
//! 1. [`Engine::enqueue`]: the request arrives; `lookup_prefix` starts its lookup the first
//!    time admission considers it, with the request's local match `L` (0 unless the local
//!    prefix cache is on, see below);
//! 2. admission (`admit`), in arrival order: a request waits while the KV cache lacks its
//!    page quota, or while the prompt tokens ahead of it fill a step (rule `admit::A1` in
//!    `admit`); `reserve_prefix(request, L, ..)` answering `Pending` keeps it waiting
//!    (later ones may still be admitted while a step has tokens left); an `Offer` shares
//!    the pages of the local match, allocates the others and, for `extra_tokens > 0`, a
//!    reservation for tokens `[L, L + extra_tokens)` whose pages are reported in this
//!    step's `on_step` and filled by the connector while the request is parked
//!    (`Loading`);
//! 3. `loads`: `get_finished_prefix_loads` reports the reservation filled (every loaded
//!    page is read back and checked, and the request resumes at the later of the report and
//!    the modeled end of the load) or failed (the range is released and the prefix
//!    computed);
//! 4. `prefill`: each step gives running requests chunks of at most `max_num_tokens`
//!    tokens in total, writes the pages of the blocks each chunk completes, calls
//!    `on_step`, and frees window pages no later token reads;
//! 5. when its last chunk is computed the request has its first token (it then decodes on
//!    the generation stage, which the driver models); with the local prefix cache on, the
//!    pages of its computed full blocks are cached; `request_finished` says whether its
//!    pages stay until `get_finished_saves` reports it.
//!
//! ## Local prefix cache (off by default)
//!
//! With [`EngineSetup::local_prefix_cache`] on, the instance reuses its own finished
//! requests' pages, as vLLM's automatic prefix caching and TensorRT-LLM's KV cache reuse
//! do (the rules of the match, sharing and eviction are in `kv_cache`'s docs):
//! - at the request's first admission attempt, `L` is its local match: whole blocks
//!   cached in every group, never the block holding the last prompt token; on a hybrid
//!   layout also the sinks and window of `L`, walking back to a shorter match if needed.
//!   The match is marked recently used, and the connector is asked only for what lies
//!   beyond it (`lookup_prefix(.., L)`, every `reserve_prefix(.., L, ..)`), so it neither
//!   loads nor saves the matched blocks again (R19);
//! - at admission the same `L` must still be cached. If evictions since the lookup cut
//!   it, the request takes the shorter match and gives the whole offer back
//!   (`release_prefix_reservation`): the connector's plan was made for `L`
//!   (`local_match_shrunk` counts it);
//! - shared pages are checked like loaded ones (they count in `verified_pages` and
//!   `mismatched_pages`), and `local_hit_tokens` counts the matched tokens; the engine
//!   computes from `L`.
//!
//! ## Drafter (off by default)
//!
//! With [`EngineSetup::drafter`] set (`kv-connector replay --drafter`), an EAGLE-style
//! drafter runs (see `draft`): the cache reserves `k` extra KV tokens past the prompt end
//! and past each chunk end, whose pages hold the stale pattern; after the last chunk the
//! draft tokens are written into the generation pages (the draft pattern) and, once
//! `on_step` has seen the step, the pages of rejected drafts are rewound. The connector
//! must publish nothing past the chunk end (R16) and only prompt blocks (R18).
//!
//! ## Releases during loads (off by default)
//!
//! With [`EngineSetup::release_during_loads`] on (`kv-connector replay
//! --release-during-loads`), the engine takes back half of every load while it runs and
//! hands those pages to another request that writes them at once; the page check then
//! covers R29 (`release`).
//!
//! Sync loads (`is_async = false`) park the request the same way; the difference is time:
//! the step that starts a sync load lasts until the load's modeled end (the engine waits),
//! and the connector is expected to report it at the next poll.
//!
//! Invariants:
//! - `engine::E1`. A request's pages hold, for every block, either its computed content, the stale
//!   pattern or (drafter, past the prompt's last full block) the draft pattern, except while
//!   a load fills them; a block's content is written only once all of its tokens are
//!   computed (R16 is checkable).
//! - `engine::E2`. A request counts loaded tokens as computed only after the connector reported the
//!   reservation filled, and every loaded page was checked first (R24, R25).
//! - `engine::E3`. Pages of a finished request are freed only after `get_finished_saves` reports
//!   it, when `request_finished` returned `true` (R22).
//! - `engine::E4`. The engine makes the same calls in the same order for the same inputs and
//!   connector answers (determinism).
//! - `engine::E5`. A page shared from the local cache is never written by the engine (checked
//!   before every write) and never freed while a request holds it; the connector is never handed a
//!   range below the local match: every `reserve_prefix` of a request passes the `L` its lookup
//!   got, and a reservation starts at `L`.

mod admit;
#[cfg(test)]
mod cap_tests;
mod draft;
#[cfg(test)]
mod load_check_tests;
mod loads;
mod prefill;
mod release;
mod types;

pub use admit::lookup_wait;
pub use draft::DrafterSetup;
pub use types::{
    ArrivedRequest, DraftTally, DraftsByPrefix, EngineCounters, EngineSummary, PromptDone,
    StepResult,
};

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::core::ids::{RequestId, ReservationId};
use crate::core::layout::Layout;
use crate::core::page_names::PageNaming;
use crate::gpu::Device;
use crate::stats::Latency;

use super::connectors::ReplayConnector;
use super::content::{ContentGroup, PageChecker};
use super::cost::{CostModel, SimMicros};
use super::error::ReplayError;
use super::kv_cache::{GroupPolicy, KvCache, RequestPages};
use types::{HookTime, HookTimer};

/// How one instance's engine is set up.
pub struct EngineSetup {
    /// The instance's index, for errors.
    pub instance: usize,
    /// The layout (full page sizes; the world size is `devices.len()`).
    pub layout: Arc<Layout>,
    /// One device per tensor-parallel rank.
    pub devices: Vec<Device>,
    /// Pages per group.
    pub kv_pages: u32,
    /// Prompt tokens one step computes, over all requests.
    pub max_num_tokens: usize,
    /// `R`: window tokens kept beyond `W` (`planner.swa_endpoint_rewind_tokens`).
    pub rewind_tokens: usize,
    /// `I`: window checkpoints whose windows are kept (`saver.window_checkpoint_tokens`,
    /// R28); 0: none.
    pub checkpoint_tokens: usize,
    /// Simulated time.
    pub cost: CostModel,
    /// Keep finished requests' pages and share them with later prompts (module docs).
    pub local_prefix_cache: bool,
    /// A speculative drafter (module docs, "Drafter"); `None`: no drafter.
    pub drafter: Option<DrafterSetup>,
    /// How long admission waits in real time for a just-started lookup (`admit::A2`);
    /// [`lookup_wait`] in replays, zero in tests that script `Pending` answers.
    pub lookup_wait: std::time::Duration,
    /// Take back half of every load while it runs and hand those pages to another
    /// request (`release`'s docs, R29).
    pub release_during_loads: bool,
}

/// A request waiting for admission.
struct Waiting {
    request: ArrivedRequest,
    /// The prompt, until its lookup starts at the request's first admission attempt.
    prompt: Option<Arc<[i64]>>,
    /// Used for every `reserve_prefix` call of this request.
    reservation: ReservationId,
    /// The last `reserve_prefix` answered `Pending`.
    pending: bool,
    /// `L`, the local match the lookup was started with (0 before it started).
    local_tokens: usize,
}

/// Where an admitted request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Parked while the connector fills tokens `[start, end)`, of which the engine still
    /// reserves `[start, kept_end)` (`release`).
    Loading {
        reservation: ReservationId,
        start: usize,
        end: usize,
        kept_end: usize,
        modeled_end_us: SimMicros,
    },
    /// Computing from `at_us` on.
    Ready { at_us: SimMicros },
}

/// An admitted request.
struct Active {
    request: ArrivedRequest,
    computed: usize,
    pages: RequestPages,
    phase: Phase,
    reused_tokens: usize,
    local_hit_tokens: usize,
    /// `(group, page)` the engine took back from its load and a stand-in request holds
    /// until the load is reported (`release`).
    taken_back: Vec<(usize, u32)>,
}

/// The engine simulator of one instance (module docs).
pub struct Engine {
    instance: usize,
    connector: Box<dyn ReplayConnector>,
    devices: Vec<Device>,
    groups: Vec<ContentGroup>,
    /// Per group, layout order: full page bytes (cost model) and stored bytes (devices).
    full_page_bytes: Vec<u64>,
    stored_page_bytes: Vec<u64>,
    cache: KvCache,
    checker: PageChecker,
    cost: CostModel,
    max_num_tokens: usize,
    waiting: VecDeque<Waiting>,
    /// Admitted requests in admission order (the chunk order).
    active: Vec<Active>,
    /// Finished requests whose pages wait for `get_finished_saves` (`engine::E3`).
    held: Vec<(RequestId, RequestPages)>,
    busy_until_us: SimMicros,
    /// When the instance's load link is free (loads share it, one after the other).
    link_free_us: SimMicros,
    next_reservation: u64,
    /// The local prefix cache is on (module docs).
    local_prefix_cache: bool,
    /// The drafter, if one runs (module docs, "Drafter").
    drafter: Option<DrafterSetup>,
    lookup_wait: std::time::Duration,
    /// Take back half of every load while it runs (`release`).
    release_during_loads: bool,
    /// The head of the queue did not fit in the cache at the last admission.
    admission_blocked: bool,
    counters: EngineCounters,
    /// Time inside connector calls since the last recorded step: `lookup_prefix` of new
    /// arrivals and every hook the step calls; not `wait_for_progress` or `settle_saves`.
    connector_time: HookTime,
    step_latency: Latency,
    step_cpu_latency: Latency,
}

impl Engine {
    /// An engine with an empty cache driving `connector`.
    ///
    /// # Errors
    ///
    /// A layout error (page bytes overflow) or a device without a pool for a group.
    pub fn new(
        setup: EngineSetup,
        connector: Box<dyn ReplayConnector>,
    ) -> Result<Self, ReplayError> {
        let layout = &setup.layout;
        let policies: Vec<GroupPolicy> = layout
            .groups
            .iter()
            .map(|group| GroupPolicy {
                attention: group.attention(),
                keep_extra_tokens: setup.rewind_tokens,
                checkpoint_tokens: setup.checkpoint_tokens,
                naming: PageNaming::from(group.role),
            })
            .collect();
        let mut full_page_bytes = Vec::new();
        let mut stored_page_bytes = Vec::new();
        for group in &layout.groups {
            full_page_bytes.push(layout.page_bytes(group)?);
            let stored = match setup.devices.first() {
                Some(device) => device.page_pool(group.id)?.page_bytes,
                None => 0,
            };
            stored_page_bytes.push(u64::try_from(stored).unwrap_or(u64::MAX));
        }
        let world = u32::try_from(setup.devices.len()).unwrap_or(u32::MAX);
        Ok(Self {
            instance: setup.instance,
            connector,
            groups: layout.groups.iter().map(ContentGroup::of).collect(),
            devices: setup.devices,
            full_page_bytes,
            stored_page_bytes,
            cache: KvCache::new(
                &policies,
                setup.kv_pages,
                to_usize(layout.tokens_per_block),
                setup.max_num_tokens,
            )
            .with_extra_tokens(setup.drafter.map_or(0, |drafter| drafter.draft_tokens)),
            checker: PageChecker::new(world),
            cost: setup.cost,
            max_num_tokens: setup.max_num_tokens.max(1),
            waiting: VecDeque::new(),
            active: Vec::new(),
            held: Vec::new(),
            busy_until_us: 0,
            link_free_us: 0,
            next_reservation: 1,
            local_prefix_cache: setup.local_prefix_cache,
            drafter: setup.drafter,
            lookup_wait: setup.lookup_wait,
            release_during_loads: setup.release_during_loads,
            admission_blocked: false,
            counters: EngineCounters::default(),
            connector_time: HookTime::default(),
            step_latency: Latency::default(),
            step_cpu_latency: Latency::default(),
        })
    }

    /// Whether a prompt of `prompt_len` tokens fits this instance's empty cache at all.
    /// The replay checks the workload's largest prompt before it starts, so the advice
    /// names the page count that fits every request.
    ///
    /// # Errors
    ///
    /// [`ReplayError::PromptTooLarge`] naming the pages the prompt needs.
    pub fn check_fits(&self, request: u64, prompt_len: usize) -> Result<(), ReplayError> {
        if self.cache.fits_empty(prompt_len, 0) {
            return Ok(());
        }
        let quota = self.cache.quota_for(prompt_len, 0);
        Err(ReplayError::PromptTooLarge {
            request,
            prompt_len,
            pages_needed: quota.into_iter().max().unwrap_or(0),
            kv_pages: self.cache.num_pages(),
        })
    }

    /// Hands an arrived request to this instance; its lookup starts when admission first
    /// considers it (as an engine looks up at scheduling time, not at arrival).
    ///
    /// # Errors
    ///
    /// [`ReplayError::PromptTooLarge`] when the prompt could never fit in the cache.
    pub fn enqueue(
        &mut self,
        request: ArrivedRequest,
        prompt: Arc<[i64]>,
    ) -> Result<(), ReplayError> {
        self.check_fits(request.id.0, request.prompt_len)?;
        let reservation = ReservationId(self.next_reservation);
        self.next_reservation += 1;
        self.waiting.push_back(Waiting {
            request,
            prompt: Some(prompt),
            reservation,
            pending: false,
            local_tokens: 0,
        });
        Ok(())
    }

    /// Whether the next admission round would start a lookup (a request admission will
    /// consider has not been looked up yet): the driver settles every connector's saves
    /// first, so the lookup sees what simulated time says is saved.
    pub fn wants_lookup(&self) -> bool {
        // The admission round's walk (`admit::A1`), taking every lookup in flight as pending.
        let mut ahead = self.tokens_ahead();
        for waiting in &self.waiting {
            let local_tokens = self.admission_local_tokens(waiting);
            if ahead >= self.max_num_tokens
                || !self
                    .cache
                    .can_admit(waiting.request.prompt_len, local_tokens)
            {
                return false;
            }
            if waiting.prompt.is_some() {
                return true;
            }
            ahead += waiting.request.prompt_len.saturating_sub(local_tokens);
        }
        false
    }

    /// One scheduler step at simulated time `now` (module workflow 2-5). The engine is busy
    /// until `now + duration_us` afterwards.
    ///
    /// # Errors
    ///
    /// A device error while writing or checking pages, or a cache bug.
    pub fn step(&mut self, now: SimMicros) -> Result<StepResult, ReplayError> {
        let carried = self.connector_time;
        let mut changed = self.poll_loads(now)?;
        changed |= self.poll_saves();
        let admitted = self.admit(now)?;
        changed |= admitted.changed;
        let chunks = self.schedule_chunks(now)?;
        if chunks.is_empty() && admitted.reservations.is_empty() {
            // No step ran. A real engine polls once per step; the simulator polls again
            // each time it waits, so these polls are not charged to any step.
            self.connector_time = carried;
            return Ok(StepResult {
                changed,
                ..StepResult::default()
            });
        }
        let compute_us = self.cost.step_micros(
            chunks
                .iter()
                .map(|chunk| (chunk.before, chunk.after - chunk.before)),
        );
        let duration_us = compute_us + admitted.sync_wait_us;
        self.call_on_step(&chunks, &admitted.reservations);
        self.release_during_loads(&admitted.reservations)?;
        let done = self.after_step(&chunks, now + duration_us);
        self.busy_until_us = now + duration_us;
        self.counters.steps += 1;
        let hooks = std::mem::take(&mut self.connector_time);
        self.step_latency.record(hooks.wall);
        self.step_cpu_latency.record(hooks.cpu);
        Ok(StepResult {
            changed: true,
            #[cfg(feature = "internals")]
            duration_us,
            done,
        })
    }

    /// Asks the connector for finished saves and frees the pages of those requests (`engine::E3`).
    fn poll_saves(&mut self) -> bool {
        let started = HookTimer::start();
        let finished = self.connector.get_finished_saves();
        self.connector_time += started.stop();
        let mut changed = false;
        for request in finished {
            match self.held.iter().position(|(held, _)| *held == request) {
                Some(index) => {
                    let (_, pages) = self.held.remove(index);
                    self.cache.release(pages);
                    changed = true;
                }
                None => self.counters.unexpected_save_reports += 1,
            }
        }
        changed
    }

    /// Whether the engine is between steps at `now`.
    pub fn is_idle(&self, now: SimMicros) -> bool {
        self.busy_until_us <= now
    }

    /// Whether requests are waiting, loading or computing.
    pub fn has_requests(&self) -> bool {
        !self.waiting.is_empty() || !self.active.is_empty()
    }

    /// Finished requests whose pages wait for saves.
    pub fn held_requests(&self) -> usize {
        self.held.len()
    }

    /// Whether, idle at `now`, only the connector can unblock this engine: a lookup is
    /// pending, a load is past its modeled end but unreported, or admission waits for pages
    /// that saves hold.
    pub fn waits_on_connector(&self, now: SimMicros) -> bool {
        self.waiting.iter().any(|waiting| waiting.pending)
            || self.active.iter().any(|active| {
                matches!(active.phase, Phase::Loading { modeled_end_us, .. } if modeled_end_us <= now)
            })
            || (self.admission_blocked && !self.held.is_empty())
    }

    /// The next simulated time after `now` at which this engine has something to do.
    pub fn next_event_us(&self, now: SimMicros) -> Option<SimMicros> {
        let busy = (self.busy_until_us > now).then_some(self.busy_until_us);
        let requests = self.active.iter().map(|active| match active.phase {
            Phase::Ready { at_us } => at_us,
            Phase::Loading { modeled_end_us, .. } => modeled_end_us,
        });
        busy.into_iter()
            .chain(requests)
            .filter(|&at| at > now)
            .min()
    }

    /// Counts of waiting, loading and held requests, for stall errors.
    pub fn queue_sizes(&self) -> (usize, usize, usize) {
        let loading = self
            .active
            .iter()
            .filter(|active| matches!(active.phase, Phase::Loading { .. }))
            .count();
        (self.waiting.len(), loading, self.held.len())
    }

    /// Frees the pages of requests whose saves finished; returns whether any were freed.
    pub fn poll_held(&mut self) -> bool {
        self.poll_saves()
    }

    /// `settle_saves` on this instance's connector (not counted as step time).
    pub fn settle_saves(&mut self) {
        self.connector.settle_saves();
    }

    /// `wait_for_progress` on this instance's connector (not counted as step time).
    pub fn wait_for_progress(&mut self, timeout: Duration) {
        self.connector.wait_for_progress(timeout);
    }

    /// The instance's index.
    pub fn instance(&self) -> usize {
        self.instance
    }

    /// Ends the engine: asks the connector for its report.
    pub fn finish(mut self) -> EngineSummary {
        EngineSummary {
            counters: self.counters,
            device: self
                .devices
                .first()
                .map_or("none", |device| device.kind().as_str()),
            step_latency: self.step_latency,
            step_cpu_latency: self.step_cpu_latency,
            connector: self.connector.finish(),
            held_at_end: self.held.len(),
        }
    }
}

/// `u32` to `usize` (lossless on every supported target).
fn to_usize(value: u32) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::NoConnector;
    use crate::core::hash::{hash_blocks, scope_seed, Scope};
    use crate::core::keys::Shard;
    use crate::core::layout::GroupId;
    use crate::gpu::PagePoolSpec;
    use crate::replay::content::{fill_page, page_seed, STALE_BYTE};

    fn engine(max_num_tokens: usize) -> Result<Engine, ReplayError> {
        let layout = Arc::new(Layout::preset("tiny-full")?);
        let spec = PagePoolSpec {
            group: GroupId(0),
            page_bytes: 4096,
            num_pages: 64,
        };
        let setup = EngineSetup {
            instance: 0,
            layout,
            devices: vec![Device::open_host(&[spec])?],
            kv_pages: 64,
            max_num_tokens,
            rewind_tokens: 0,
            checkpoint_tokens: 0,
            cost: CostModel::for_layout("tiny-full", 1),
            local_prefix_cache: false,
            drafter: None,
            lookup_wait: std::time::Duration::ZERO,
            release_during_loads: false,
        };
        Engine::new(setup, Box::new(NoConnector))
    }

    fn request(prompt_len: usize) -> Result<(ArrivedRequest, Arc<[i64]>), ReplayError> {
        let tokens: Vec<i64> = (0..).take(prompt_len).collect();
        let hashes = hash_blocks(scope_seed(&Scope::default()), &tokens, 16)?;
        let request = ArrivedRequest {
            workload_index: 0,
            id: RequestId(7),
            prompt_len,
            arrival_us: 0,
            hashes: hashes.into(),
        };
        Ok((request, Arc::from(tokens)))
    }

    /// The page of `block` of the first active request, read back.
    fn page_bytes(engine: &Engine, block: usize) -> Result<Vec<u8>, ReplayError> {
        let page = engine.active[0].pages.page(0, block).unwrap_or(u32::MAX);
        Ok(engine.devices[0].read_page_to_vec(GroupId(0), page)?)
    }

    fn computed_content(engine: &Engine, block: usize) -> Vec<u8> {
        let shard = Shard::Rank { world: 1, rank: 0 };
        let mut bytes = vec![0; 4096];
        fill_page(
            &mut bytes,
            page_seed(GroupId(0), shard, &engine.active[0].request.hashes.chain()[block]),
        );
        bytes
    }

    #[test]
    fn chunks_write_completed_blocks_and_leave_partial_ones_stale_e1() -> Result<(), ReplayError> {
        let mut engine = engine(40)?;
        let (arrived, prompt) = request(100)?;
        engine.enqueue(arrived, prompt)?;
        let first = engine.step(0)?;
        assert!(first.changed && first.duration_us > 0 && first.done.is_empty());
        assert_eq!(engine.active[0].computed, 40);
        // Tokens [0, 40): blocks 0 and 1 are complete, block 2 holds 8 of 16 tokens.
        for block in 0..2 {
            assert_eq!(
                page_bytes(&engine, block)?,
                computed_content(&engine, block)
            );
        }
        assert!(page_bytes(&engine, 2)?
            .iter()
            .all(|&byte| byte == STALE_BYTE));
        assert!(!engine.is_idle(first.duration_us - 1));
        let second = engine.step(first.duration_us)?;
        assert_eq!(engine.active[0].computed, 80);
        assert_eq!(page_bytes(&engine, 2)?, computed_content(&engine, 2));
        let third = engine.step(first.duration_us + second.duration_us)?;
        // The last block (tokens 96..100) is never full; the prompt is done.
        assert_eq!(third.done.len(), 1);
        assert_eq!(
            third.done[0].first_token_us,
            first.duration_us + second.duration_us + third.duration_us
        );
        assert!(!engine.has_requests());
        assert_eq!(engine.cache.free_pages(), vec![64]);
        assert_eq!(engine.counters.computed_tokens, 100);
        assert_eq!(engine.counters.steps, 3);
        Ok(())
    }

    #[test]
    fn prompts_larger_than_the_cache_are_refused() -> Result<(), ReplayError> {
        let mut engine = engine(40)?;
        let (arrived, prompt) = request(64 * 16 + 1)?;
        assert!(matches!(
            engine.enqueue(arrived, prompt),
            Err(ReplayError::PromptTooLarge {
                pages_needed: 65,
                kv_pages: 64,
                ..
            })
        ));
        Ok(())
    }
}
