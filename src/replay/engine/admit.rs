//! Admission: prefix-aware scheduling through `reserve_prefix` (engine workflow step 2).
//!
//! Requests are tried in arrival order. The head request that does not fit in the KV cache
//! stops admission (first come, first served, as a real scheduler without preemption
//! does); a request whose lookup is still `Pending` is skipped and asked again next step.
//! With the local prefix cache on, the request's local match `L` is found when its lookup
//! starts and stays the `num_computed` of every `reserve_prefix` (`engine::E5`); at admission the
//! match must still be cached, or the request takes what is left and gives the offer back.
//! An offer counts from `L` and is cut to whole blocks that end before the last prompt
//! token (the engine must compute at least one token); the cut part is released at once.
//!
//! - `admit::A1`. Token budget: a request is considered (looked up, then admitted) only while the
//!   prompt tokens ahead of it (what admitted requests still compute, plus the prompts of
//!   requests whose lookup is pending) are fewer than one step's `max_num_tokens`. vLLM and
//!   TensorRT-LLM schedule a waiting request only into a step with tokens left for it, so
//!   its lookup sees the KV of the prompts computed before it. Admitting whatever fits the
//!   KV cache instead looked up a saturated instance's whole queue at once (every request
//!   behind a pending lookup was asked too): prompts were looked up before the earlier
//!   turns of their conversations were computed, and reuse depended on queue length rather
//!   than on what the pool held when the request started.

use std::time::{Duration, Instant};

use crate::connector::ReserveAnswer;
use crate::core::ids::{RequestId, ReservationId};

use super::types::HookTimer;
use super::{Active, ArrivedRequest, Engine, Phase, Waiting};
use crate::replay::cost::SimMicros;
use crate::replay::error::ReplayError;
use crate::replay::kv_cache::{KvCacheError, RequestPages, SharedPrefix};

impl Active {
    /// Prompt tokens the request still computes: after its load, if it is loading.
    fn tokens_left(&self) -> usize {
        let from = match self.phase {
            Phase::Loading { kept_end, .. } => kept_end,
            Phase::Ready { .. } => self.computed,
        };
        self.request.prompt_len.saturating_sub(from)
    }
}

/// Time on top of a lookup's own deadline for its answer to come back to the engine (the
/// courier's hand-off, thread wake-ups on a loaded machine).
const LOOKUP_ANSWER_SLACK: Duration = Duration::from_millis(500);

/// Longest real-time wait for a just-started lookup's answer (`admit::A2`), as replays use
/// it: the connector answers every lookup within `planner.lookup_timeout_ms` plus one
/// `pool.probe_timeout_ms` (R30; at once while the pool is unreachable), so admission never
/// waits on the pool longer than the connector's own deadlines allow.
pub fn lookup_wait(runtime: &crate::config::RuntimeConfig) -> Duration {
    runtime.planner.lookup_timeout + runtime.pool_calls.probe_timeout + LOOKUP_ANSWER_SLACK
}
/// One `wait_for_progress` while waiting for a lookup.
const LOOKUP_POLL: Duration = Duration::from_millis(20);

/// What admission did in one step.
#[derive(Debug, Default)]
pub(super) struct Admitted {
    /// Whether any request was admitted.
    pub changed: bool,
    /// Indices into `active` of requests whose reservation pages were allocated this step.
    pub reservations: Vec<usize>,
    /// How long the step waits for sync loads started in it.
    pub sync_wait_us: SimMicros,
}

impl Engine {
    /// Admits waiting requests in arrival order while the cache has room. Lookups started
    /// by the first pass are awaited and a second pass admits them (`admit::A2`).
    pub(super) fn admit(&mut self, now: SimMicros) -> Result<Admitted, ReplayError> {
        let mut admitted = Admitted::default();
        let started = self.admission_pass(now, &mut admitted)?;
        if !started.is_empty() && !self.lookup_wait.is_zero() {
            self.await_lookups(&started);
            self.admission_pass(now, &mut admitted)?;
        }
        Ok(admitted)
    }

    /// One walk over the waiting queue (`admit::A1`); returns the requests whose lookup it started
    /// and which are still `Pending`, with what `reserve_prefix` needs.
    fn admission_pass(
        &mut self,
        now: SimMicros,
        admitted: &mut Admitted,
    ) -> Result<Vec<(RequestId, usize, ReservationId)>, ReplayError> {
        let mut started_pending = Vec::new();
        self.admission_blocked = false;
        // Only this round's answers count: a request behind a head that no longer fits is
        // not asked, and an old `Pending` must not make the engine wait on the connector.
        for waiting in &mut self.waiting {
            waiting.pending = false;
        }
        let mut index = 0;
        let mut lookups_started = false;
        let mut ahead = self.tokens_ahead();
        while index < self.waiting.len() && ahead < self.max_num_tokens {
            let head = &self.waiting[index];
            let local_tokens = self.admission_local_tokens(head);
            if !self.cache.can_admit(head.request.prompt_len, local_tokens) {
                self.admission_blocked = true;
                break;
            }
            let (request, reservation) = (head.request.id, head.reservation);
            let prompt = self.waiting[index].prompt.take();
            if prompt.is_some() {
                self.waiting[index].local_tokens = local_tokens;
                self.cache.touch_match(SharedPrefix {
                    hashes: &self.waiting[index].request.hashes,
                    tokens: local_tokens,
                });
            }
            let started = HookTimer::start();
            let looked_up = prompt.is_some();
            if let Some(prompt) = prompt {
                if let Err(refused) = self.connector.lookup_prefix(request, prompt, local_tokens) {
                    // Replay ids are unique: a refusal is a simulator bug, and the
                    // connector then offers and saves nothing for the request (R32).
                    tracing::error!(%refused, "lookup refused");
                }
            }
            let answer = self
                .connector
                .reserve_prefix(request, local_tokens, reservation);
            self.connector_time += started.stop();
            lookups_started |= looked_up;
            if looked_up && matches!(answer, ReserveAnswer::Pending) {
                started_pending.push((request, local_tokens, reservation));
            }
            match answer {
                ReserveAnswer::Pending => {
                    // `admit::A1`: the request keeps its place in the budget while its lookup runs.
                    ahead += self.waiting[index]
                        .request
                        .prompt_len
                        .saturating_sub(local_tokens);
                    self.waiting[index].pending = true;
                    index += 1;
                }
                ReserveAnswer::Offer {
                    extra_tokens,
                    is_async,
                } => {
                    let Some(waiting) = self.waiting.remove(index) else {
                        break;
                    };
                    admitted.changed = true;
                    self.start_request(waiting, extra_tokens, is_async, now, admitted)?;
                    ahead += self.active.last().map_or(0, Active::tokens_left);
                }
            }
        }
        if lookups_started {
            // `admit::A2`: the pass's lookups go out together, at its end.
            let started = HookTimer::start();
            self.connector.flush_lookups();
            self.connector_time += started.stop();
        }
        Ok(started_pending)
    }

    /// Prompt tokens admitted requests still have to compute, after their loads (`admit::A1`).
    pub(super) fn tokens_ahead(&self) -> usize {
        self.active.iter().map(Active::tokens_left).sum()
    }

    /// - `admit::A2`. A lookup takes no simulated time: after a pass has started lookups (all of
    ///   them, back to back, as an engine sends them; the pass ends with `flush_lookups`, so
    ///   a connector may send them as one batch), the engine waits in real time (up to
    ///   its `lookup_wait`, [`lookup_wait`] in replays) for their answers, and a second pass
    ///   admits them. Where a request is admitted then does not depend on how fast the pool
    ///   answers in real time: the replay is deterministic, and the embedded pool and
    ///   Mooncake give the same schedule. A real engine would go on stepping meanwhile; a
    ///   lookup's milliseconds are small against the steps the cost model charges. The asks
    ///   while waiting are not charged to the step's connector time (a real engine asks once
    ///   per step); a lookup still pending after the wait is asked again at the next step.
    fn await_lookups(&mut self, started: &[(RequestId, usize, ReservationId)]) {
        let started_at = Instant::now();
        let deadline = started_at + self.lookup_wait;
        for &(request, local_tokens, reservation) in started {
            while matches!(
                self.connector
                    .reserve_prefix(request, local_tokens, reservation),
                ReserveAnswer::Pending
            ) && Instant::now() < deadline
            {
                self.connector.wait_for_progress(LOOKUP_POLL);
            }
        }
        self.counters.lookup_wait += started_at.elapsed();
    }

    /// The local match a waiting request is admitted with: the one its lookup got, or,
    /// before its lookup, its local match now.
    pub(super) fn admission_local_tokens(&self, waiting: &Waiting) -> usize {
        if waiting.prompt.is_some() {
            self.local_match(&waiting.request)
        } else {
            waiting.local_tokens
        }
    }

    /// The request's local match now: 0 with the local prefix cache off, or when sharing
    /// would make its quota larger than the cache.
    fn local_match(&self, request: &ArrivedRequest) -> usize {
        if !self.local_prefix_cache {
            return 0;
        }
        let tokens = self
            .cache
            .local_match(&request.hashes, request.prompt_len, usize::MAX);
        if self.cache.fits_empty(request.prompt_len, tokens) {
            tokens
        } else {
            0
        }
    }

    /// Shares an admitted request's local match, allocates its other pages and, for a
    /// nonzero offer, its reservation.
    fn start_request(
        &mut self,
        waiting: Waiting,
        extra_tokens: usize,
        is_async: bool,
        now: SimMicros,
        admitted: &mut Admitted,
    ) -> Result<(), ReplayError> {
        let Waiting {
            request,
            reservation,
            local_tokens,
            ..
        } = waiting;
        let (local, extra_tokens) =
            self.confirm_local_match(&request, reservation, local_tokens, extra_tokens);
        let admission = self.cache.admit(
            request.prompt_len,
            SharedPrefix {
                hashes: &request.hashes,
                tokens: local,
            },
        )?;
        let mut pages = admission.pages;
        for (group, page) in admission.fresh {
            self.checker
                .write_stale(&self.devices, self.groups[group].id, page)?;
        }
        self.check_shared_pages(&request, &pages, local)?;
        let end = self.trim_offer(&request, reservation, local, extra_tokens);
        let phase = if end == local {
            Phase::Ready { at_us: now }
        } else {
            let bytes_per_rank = self.allocate_load(&mut pages, local, end)?;
            let start = self.link_free_us.max(now);
            let modeled_end_us = start + self.cost.load_micros(bytes_per_rank);
            self.link_free_us = modeled_end_us;
            if !is_async {
                admitted.sync_wait_us = admitted.sync_wait_us.max(modeled_end_us - now);
            }
            admitted.reservations.push(self.active.len());
            Phase::Loading {
                reservation,
                start: local,
                end,
                kept_end: end,
                modeled_end_us,
            }
        };
        self.counters.local_hit_tokens += u64::try_from(local).unwrap_or(u64::MAX);
        self.active.push(Active {
            request,
            computed: local,
            pages,
            phase,
            reused_tokens: 0,
            local_hit_tokens: local,
            taken_back: Vec::new(),
        });
        Ok(())
    }

    /// The local match the request is admitted with, and the offer it keeps: the lookup's
    /// match while it is still cached, else the shorter match left, with the whole offer
    /// given back (the connector planned its load for the lookup's match).
    fn confirm_local_match(
        &mut self,
        request: &ArrivedRequest,
        reservation: ReservationId,
        local_tokens: usize,
        extra_tokens: usize,
    ) -> (usize, usize) {
        if local_tokens == 0 {
            return (0, extra_tokens);
        }
        let now = self
            .cache
            .local_match(&request.hashes, request.prompt_len, local_tokens);
        if now == local_tokens {
            return (local_tokens, extra_tokens);
        }
        self.counters.local_match_shrunk += 1;
        if extra_tokens > 0 {
            let started = HookTimer::start();
            self.connector.release_prefix_reservation(
                request.id,
                reservation,
                local_tokens,
                local_tokens + extra_tokens,
            );
            self.connector_time += started.stop();
        }
        (now, 0)
    }

    /// Checks every shared page of the local match like a loaded one (`engine::E5`).
    fn check_shared_pages(
        &mut self,
        request: &ArrivedRequest,
        pages: &RequestPages,
        local: usize,
    ) -> Result<(), ReplayError> {
        for (group, content) in self.groups.iter().enumerate() {
            for block in self.cache.load_blocks(group, local) {
                let (Some(page), Some(hash)) =
                    (pages.page(group, block), request.hashes.get(content.naming, block))
                else {
                    return Err(KvCacheError::SharedPageMissing { group, block }.into());
                };
                let counts = self
                    .checker
                    .check_page(&self.devices, content, page, hash)?;
                self.counters.verified_pages += counts.verified;
                self.counters.mismatched_pages += counts.mismatched;
            }
        }
        Ok(())
    }

    /// Allocates the pages a load resuming at `end` fills past the local match `local`
    /// (R15); returns the bytes it moves per rank at full page size.
    fn allocate_load(
        &mut self,
        pages: &mut RequestPages,
        local: usize,
        end: usize,
    ) -> Result<u64, ReplayError> {
        let first_loaded = local / self.cache.tokens_per_block();
        let mut bytes_per_rank = 0;
        for group in 0..self.groups.len() {
            for block in self.cache.load_blocks(group, end) {
                let allocated = self.cache.ensure_block(pages, group, block)?;
                if block < first_loaded {
                    // Below the match the request shares the page; nothing is loaded
                    // (`engine::E5`).
                    if allocated.is_some() {
                        return Err(KvCacheError::SharedPageMissing { group, block }.into());
                    }
                    continue;
                }
                if let Some(page) = allocated {
                    self.checker
                        .write_stale(&self.devices, self.groups[group].id, page)?;
                }
                bytes_per_rank += self.full_page_bytes[group];
            }
        }
        Ok(bytes_per_rank)
    }

    /// Cuts an offer of `extra_tokens` past the local match to whole blocks before the
    /// last prompt token and releases the rest; returns where the load ends.
    fn trim_offer(
        &mut self,
        request: &ArrivedRequest,
        reservation: ReservationId,
        local: usize,
        extra_tokens: usize,
    ) -> usize {
        let t = self.cache.tokens_per_block();
        let limit = request.prompt_len.saturating_sub(1) / t * t;
        let kept = (extra_tokens / t * t).min(limit.saturating_sub(local));
        if kept < extra_tokens {
            self.counters.offers_trimmed += 1;
            let started = HookTimer::start();
            self.connector.release_prefix_reservation(
                request.id,
                reservation,
                local + kept,
                local + extra_tokens,
            );
            self.connector_time += started.stop();
        }
        local + kept
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::sync::Arc;

    use super::*;
    use crate::connector::{
        EngineConnector, FinishedLoad, HookError, NoConnector, SchedulerOutput,
    };
    use crate::core::hash::{hash_blocks, scope_seed, Scope};
    use crate::core::ids::RequestId;
    use crate::core::layout::{GroupId, Layout};
    use crate::gpu::{Device, PagePoolSpec};
    use crate::replay::connectors::ReplayConnector;
    use crate::replay::cost::CostModel;
    use crate::replay::engine::EngineSetup;
    use crate::stats::ConnectorStats;

    /// What the recording connector saw.
    #[derive(Default)]
    struct Log {
        /// `(request, local_match_tokens)` of every lookup.
        lookups: Vec<(u64, usize)>,
        /// `(request, num_computed)` of every `reserve_prefix`.
        reserves: Vec<(u64, usize)>,
        /// `(request, start, end)` of every release.
        releases: Vec<(u64, usize, usize)>,
        /// Requests named with a new reservation in `on_step`.
        reservations: Vec<u64>,
    }

    /// Answers `Pending` once for `pending_for`, then offers `offer` tokens past the local
    /// match to requests with one (never filling them: the engine must give them back).
    struct Recording {
        log: Rc<RefCell<Log>>,
        pending_for: RequestId,
        offer: usize,
        answered: Vec<RequestId>,
    }

    impl EngineConnector for Recording {
        fn lookup_prefix(
            &mut self,
            request: RequestId,
            _prompt: Arc<[i64]>,
            local: usize,
        ) -> Result<(), HookError> {
            self.log.borrow_mut().lookups.push((request.0, local));
            Ok(())
        }

        fn reserve_prefix(
            &mut self,
            request: RequestId,
            num_computed: usize,
            _reservation: ReservationId,
        ) -> ReserveAnswer {
            self.log
                .borrow_mut()
                .reserves
                .push((request.0, num_computed));
            if request == self.pending_for && !self.answered.contains(&request) {
                self.answered.push(request);
                return ReserveAnswer::Pending;
            }
            ReserveAnswer::Offer {
                extra_tokens: if num_computed > 0 { self.offer } else { 0 },
                is_async: true,
            }
        }

        fn release_prefix_reservation(
            &mut self,
            request: RequestId,
            _reservation: ReservationId,
            start: usize,
            end: usize,
        ) {
            self.log.borrow_mut().releases.push((request.0, start, end));
        }

        fn get_finished_prefix_loads(&mut self) -> Vec<FinishedLoad> {
            Vec::new()
        }

        fn on_step(&mut self, output: &SchedulerOutput<'_>) {
            for scheduled in &output.requests {
                if scheduled.new_reservation.is_some() {
                    self.log.borrow_mut().reservations.push(scheduled.request.0);
                }
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

    impl ReplayConnector for Recording {
        fn report(&mut self) -> ConnectorStats {
            ConnectorStats::default()
        }
    }

    /// A tiny-full engine of `kv_pages` pages, 4 KiB each.
    fn engine(
        kv_pages: u32,
        local_prefix_cache: bool,
        connector: Box<dyn ReplayConnector>,
    ) -> Result<Engine, ReplayError> {
        let spec = PagePoolSpec {
            group: GroupId(0),
            page_bytes: 4096,
            num_pages: kv_pages,
        };
        let setup = EngineSetup {
            instance: 0,
            layout: Arc::new(Layout::preset("tiny-full")?),
            devices: vec![Device::open_host(&[spec])?],
            kv_pages,
            max_num_tokens: 256,
            rewind_tokens: 0,
            checkpoint_tokens: 0,
            cost: CostModel::for_layout("tiny-full", 1),
            local_prefix_cache,
            drafter: None,
            lookup_wait: Duration::ZERO,
            release_during_loads: false,
        };
        Engine::new(setup, connector)
    }

    /// Enqueues request `id`: `prompt_len` tokens counting up from `first_token`.
    fn enqueue(
        engine: &mut Engine,
        id: u64,
        first_token: i64,
        prompt_len: usize,
    ) -> Result<(), ReplayError> {
        let tokens: Vec<i64> = (first_token..).take(prompt_len).collect();
        let request = ArrivedRequest {
            workload_index: 0,
            id: RequestId(id),
            prompt_len,
            arrival_us: 0,
            hashes: hash_blocks(scope_seed(&Scope::default()), &tokens, 16)?.into(),
        };
        engine.enqueue(request, Arc::from(tokens))
    }

    /// Steps until every request is done; returns the simulated time.
    fn run(engine: &mut Engine, mut now: SimMicros) -> Result<SimMicros, ReplayError> {
        for _ in 0..100 {
            if !engine.has_requests() {
                return Ok(now);
            }
            let result = engine.step(now)?;
            now += result.duration_us.max(1);
        }
        Err(ReplayError::NoRequests)
    }

    #[test]
    fn a_repeated_prompt_is_served_by_the_local_cache_e5() -> Result<(), ReplayError> {
        let mut engine = engine(64, true, Box::new(NoConnector))?;
        enqueue(&mut engine, 7, 0, 100)?;
        let now = run(&mut engine, 0)?;
        // Six full blocks are cached; the partial seventh went back to the free list.
        assert_eq!(engine.cache.evictable_pages(), vec![6]);
        assert_eq!(engine.cache.free_pages(), vec![58]);
        enqueue(&mut engine, 8, 0, 100)?;
        engine.admit(now)?;
        // Block 6 holds the last token: 96 tokens are shared, 4 computed.
        let active = &engine.active[0];
        assert_eq!(active.local_hit_tokens, 96);
        for block in 0..6 {
            let page = active.pages.page(0, block).unwrap_or(u32::MAX);
            assert!(engine.cache.is_cached(0, page), "block {block}");
        }
        let last = active.pages.page(0, 6).unwrap_or(u32::MAX);
        assert!(!engine.cache.is_cached(0, last));
        run(&mut engine, now)?;
        assert_eq!(engine.counters.local_hit_tokens, 96);
        assert_eq!(engine.counters.computed_tokens, 104);
        // Every shared page was checked, and held its block's content.
        assert_eq!(
            (
                engine.counters.verified_pages,
                engine.counters.mismatched_pages
            ),
            (6, 0)
        );
        assert_eq!(engine.cache.evictable_pages(), vec![6]);
        assert_eq!(engine.cache.free_pages(), vec![58]);
        Ok(())
    }

    #[test]
    fn without_the_local_cache_a_repeated_prompt_is_computed_again() -> Result<(), ReplayError> {
        let mut engine = engine(64, false, Box::new(NoConnector))?;
        enqueue(&mut engine, 7, 0, 100)?;
        let now = run(&mut engine, 0)?;
        enqueue(&mut engine, 8, 0, 100)?;
        run(&mut engine, now)?;
        assert_eq!(engine.counters.local_hit_tokens, 0);
        assert_eq!(engine.counters.computed_tokens, 200);
        assert_eq!(engine.cache.evictable_pages(), vec![0]);
        assert_eq!(engine.cache.free_pages(), vec![64]);
        Ok(())
    }

    #[test]
    fn concurrent_requests_share_cached_pages_with_reference_counts() -> Result<(), ReplayError> {
        let mut engine = engine(64, true, Box::new(NoConnector))?;
        enqueue(&mut engine, 7, 0, 100)?;
        let now = run(&mut engine, 0)?;
        // Two longer prompts extending the first one, admitted in the same step: the
        // first leaves 300 - 96 = 204 tokens to compute, less than the 256 of a step (`admit::A1`).
        enqueue(&mut engine, 8, 0, 300)?;
        enqueue(&mut engine, 9, 0, 300)?;
        engine.admit(now)?;
        let (first, second) = (&engine.active[0].pages, &engine.active[1].pages);
        for block in 0..6 {
            assert_eq!(first.page(0, block), second.page(0, block));
            let page = first.page(0, block).unwrap_or(u32::MAX);
            assert_eq!(engine.cache.holders(0, page), 2, "block {block}");
        }
        assert_ne!(first.page(0, 6), second.page(0, 6));
        run(&mut engine, now)?;
        assert_eq!(engine.counters.local_hit_tokens, 2 * 96);
        assert_eq!(engine.counters.mismatched_pages, 0);
        // The first of them cached blocks 6..18; the second's copies went back free.
        assert_eq!(engine.cache.evictable_pages(), vec![18]);
        assert_eq!(engine.cache.free_pages(), vec![46]);
        Ok(())
    }

    #[test]
    fn a1_requests_are_looked_up_only_while_a_step_has_tokens_left() -> Result<(), ReplayError> {
        let log = Rc::new(RefCell::new(Log::default()));
        let connector = Recording {
            log: Rc::clone(&log),
            pending_for: RequestId(1),
            offer: 0,
            answered: Vec::new(),
        };
        let mut engine = engine(64, false, Box::new(connector))?;
        for (id, first_token) in [(1, 1_000), (2, 2_000), (3, 3_000), (4, 4_000)] {
            enqueue(&mut engine, id, first_token, 200)?;
        }
        // Request 1's lookup is pending: its 200 tokens hold their place in the budget,
        // so request 2 is looked up and admitted (400 tokens ahead), and 3 and 4 wait.
        assert!(engine.wants_lookup());
        engine.admit(0)?;
        assert_eq!(log.borrow().lookups, vec![(1, 0), (2, 0)]);
        assert_eq!(engine.active.len(), 1);
        assert!(
            !engine.wants_lookup(),
            "no step has tokens left for request 3"
        );
        // Request 1 is admitted (200 + 200 ahead); still no room for request 3.
        engine.admit(0)?;
        assert_eq!(engine.active.len(), 2);
        assert_eq!(log.borrow().lookups.len(), 2);
        // One step computes 256 tokens (request 2's 200 and 56 of request 1): 144 are
        // left, so request 3 is looked up and admitted.
        let step = engine.step(0)?;
        assert_eq!(step.done.len(), 1);
        assert_eq!(engine.tokens_ahead(), 144);
        assert!(engine.wants_lookup());
        engine.admit(1)?;
        assert_eq!(log.borrow().lookups, vec![(1, 0), (2, 0), (3, 0)]);
        assert_eq!(engine.active.len(), 2);
        assert!(!engine.wants_lookup());
        Ok(())
    }

    #[test]
    fn an_evicted_local_match_is_cut_and_the_offer_given_back_e5() -> Result<(), ReplayError> {
        let log = Rc::new(RefCell::new(Log::default()));
        let connector = Recording {
            log: Rc::clone(&log),
            pending_for: RequestId(8),
            offer: 16,
            answered: Vec::new(),
        };
        let mut engine = engine(16, true, Box::new(connector))?;
        enqueue(&mut engine, 7, 0, 100)?;
        let now = run(&mut engine, 0)?;
        // Request 8 repeats it (match 96) but its lookup is pending for a step, while
        // request 9 (12 pages) is admitted and evicts the two tail blocks of the match.
        enqueue(&mut engine, 8, 0, 100)?;
        enqueue(&mut engine, 9, 1_000, 192)?;
        run(&mut engine, now)?;
        let log = log.borrow();
        assert!(log.lookups.contains(&(8, 96)));
        let reserves: Vec<usize> = log
            .reserves
            .iter()
            .filter(|(request, _)| *request == 8)
            .map(|&(_, computed)| computed)
            .collect();
        assert_eq!(
            reserves,
            vec![96, 96],
            "every reserve passes the lookup's match"
        );
        // Admitted with the 64 tokens left; the offer past 96 was given back, not loaded.
        assert_eq!(log.releases, vec![(8, 96, 112)]);
        assert!(log.reservations.is_empty());
        assert_eq!(engine.counters.local_match_shrunk, 1);
        assert_eq!(engine.counters.local_hit_tokens, 64);
        assert_eq!(engine.counters.computed_tokens, 100 + 192 + 36);
        assert_eq!(
            (
                engine.counters.verified_pages,
                engine.counters.mismatched_pages
            ),
            (4, 0)
        );
        Ok(())
    }
}
