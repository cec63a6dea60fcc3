//! Embedding kv-connector in a serving engine: a minimal serving loop that drives
//! [`ConnectorHandle`] through the engine hooks (`docs/DESIGN.md` section 2) on the embedded memory
//! pool and the host device. `docs/EMBEDDING.md` walks through it.
//!
//! Run it with `cargo run --example embed`. It serves two requests one after the other;
//! the second shares the first's leading 32 blocks, finds them in the pool, loads them
//! instead of computing them, checks the loaded bytes, and prints what the connector
//! counted. `tests/examples.rs` runs the same [`run`] in CI.
//!
//! The loop, per request:
//!
//! 1. `lookup_prefix`: the connector starts probing the pool (never blocks);
//! 2. `reserve_prefix` every step until it answers an offer of `extra_tokens`;
//! 3. the engine allocates pages for the whole prompt and, when `extra_tokens > 0`, reports
//!    the reservation in `on_step`; `get_finished_prefix_loads` later says whether the
//!    pages were filled (count them computed) or not (release and compute them, R25);
//! 4. each prefill chunk is reported in `on_step`, which saves the blocks it completed (R16);
//! 5. `request_finished`; if it answers `true`, the pages stay until `get_finished_saves`
//!    lists the request (R22);
//! 6. at exit, `shutdown` drains the saves and returns the final statistics.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use kv_connector::{
    scope_seed, Config, ConnectorHandle, ConnectorParams, ConnectorStats, Device, EngineConnector,
    EvictionPolicy, GroupId, Layout, MemoryPool, PagePoolSpec, Pool, RequestId, ReservationId,
    ReserveAnswer, ScheduledRequest, SchedulerOutput, Scope, SystemClock,
};

/// Pages per layer group on the device.
const PAGES: u32 = 256;
/// Prompt tokens one engine step computes (chunked prefill).
const CHUNK_TOKENS: usize = 128;
/// How long an idle engine waits for the connector before polling again.
const IDLE_WAIT: Duration = Duration::from_millis(10);

/// What the example saw.
#[derive(Debug)]
pub struct EmbedOutcome {
    /// Tokens each request loaded from the pool instead of computing, in order.
    pub reused_tokens: Vec<usize>,
    /// The connector's final statistics.
    pub stats: ConnectorStats,
}

/// A toy engine: one device per rank, a page allocator, and the connector.
pub struct MiniEngine {
    /// The connector; the engine calls it only from this (the scheduler's) thread.
    pub handle: ConnectorHandle,
    devices: Vec<Device>,
    layout: Layout,
    free_pages: Vec<u32>,
}

impl MiniEngine {
    /// Opens host devices for the `tiny-full` layout and starts a connector on `pool`.
    ///
    /// # Errors
    ///
    /// When the layout, the devices or the connector cannot be set up.
    pub fn start(pool: Arc<dyn Pool>) -> anyhow::Result<Self> {
        let layout = Layout::preset("tiny-full")?;
        let mut devices = Vec::new();
        for _rank in 0..layout.world_size {
            let specs = layout
                .groups
                .iter()
                .map(|group| {
                    Ok(PagePoolSpec {
                        group: group.id,
                        page_bytes: usize::try_from(layout.page_bytes(group)?)?,
                        num_pages: PAGES,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            devices.push(Device::open_host(&specs)?);
        }
        let mut config = Config::default();
        // Small staging pools: this toy moves a few hundred KiB.
        config.loaders.staging_bytes_per_loader = 4 << 20;
        config.saver.staging_bytes = 4 << 20;
        let handle = ConnectorHandle::start(ConnectorParams {
            config,
            layout: layout.clone(),
            pool,
            devices: devices.clone(),
            share: kv_connector::RankShare::default(),
            seed: scope_seed(&Scope::default()),
            model_key: "embed-example".into(),
        })?;
        Ok(Self {
            handle,
            devices,
            layout,
            free_pages: (0..PAGES).rev().collect(),
        })
    }

    /// Serves one request to its last prompt token; returns the tokens it loaded.
    ///
    /// # Errors
    ///
    /// When pages run out, a device access fails, or a loaded page differs from the KV the
    /// engine would have computed.
    pub fn serve(&mut self, request: RequestId, prompt: &Arc<[i64]>) -> anyhow::Result<usize> {
        let t = self.layout.tokens_per_block as usize;
        let blocks = prompt.len().div_ceil(t);
        ensure!(
            blocks <= self.free_pages.len(),
            "out of pages for {request}"
        );
        let pages: Vec<u32> = self.free_pages.split_off(self.free_pages.len() - blocks);
        let table: Vec<i32> = pages
            .iter()
            .map(|&page| i32::try_from(page))
            .collect::<Result<_, _>>()?;

        // Steps 1-3: lookup, reservation, load.
        self.handle.lookup_prefix(request, Arc::clone(prompt), 0)?;
        let reservation = ReservationId(request.0);
        let extra_tokens = self.reserve(request, reservation);
        let mut computed = 0;
        if extra_tokens > 0 {
            self.report(request, prompt.len(), &table, (0, 0), Some(reservation));
            if self.wait_for_load(reservation) {
                self.check_loaded(prompt, &pages, extra_tokens / t)?;
                computed = extra_tokens;
            } else {
                self.handle
                    .release_prefix_reservation(request, reservation, 0, extra_tokens);
            }
        }
        let reused = computed;

        // Step 4: chunked prefill; the connector saves each completed block.
        while computed < prompt.len() {
            let chunk_end = (computed + CHUNK_TOKENS).min(prompt.len());
            let completed = pages.iter().enumerate().take(chunk_end / t);
            for (block, &page) in completed.skip(computed / t) {
                self.write_block(prompt, block, page)?;
            }
            self.report(request, prompt.len(), &table, (computed, chunk_end), None);
            computed = chunk_end;
        }

        // Step 5: the request ends; its pages stay until its saves are done.
        if self.handle.request_finished(request) {
            while !self.handle.get_finished_saves().contains(&request) {
                self.handle.wait_for_progress(IDLE_WAIT);
            }
        }
        self.free_pages.extend(pages);
        Ok(reused)
    }

    /// Asks `reserve_prefix` each step until the lookup answers; a real engine schedules
    /// other requests meanwhile.
    fn reserve(&mut self, request: RequestId, reservation: ReservationId) -> usize {
        loop {
            match self.handle.reserve_prefix(request, 0, reservation) {
                ReserveAnswer::Pending => self.handle.wait_for_progress(IDLE_WAIT),
                ReserveAnswer::Offer { extra_tokens, .. } => return extra_tokens,
            }
        }
    }

    /// Polls `get_finished_prefix_loads` until `reservation` is reported; `true` when
    /// filled. A real engine keeps computing other requests while `is_async` loads run.
    fn wait_for_load(&mut self, reservation: ReservationId) -> bool {
        loop {
            let finished = self.handle.get_finished_prefix_loads();
            if let Some(load) = finished.iter().find(|load| load.reservation == reservation) {
                return load.filled;
            }
            self.handle.wait_for_progress(IDLE_WAIT);
        }
    }

    /// Reports one step of `request` to the connector.
    fn report(
        &mut self,
        request: RequestId,
        prompt_len: usize,
        table: &[i32],
        (computed_before, computed_after): (usize, usize),
        new_reservation: Option<ReservationId>,
    ) {
        let tables: Vec<&[i32]> = self.layout.groups.iter().map(|_| table).collect();
        self.handle.on_step(&SchedulerOutput {
            requests: vec![ScheduledRequest {
                request,
                prompt_len,
                computed_before,
                computed_after,
                new_reservation,
                page_tables: &tables,
            }],
        });
    }

    /// "Computes" block `block`: writes its KV, a function of the prompt up to the
    /// block's end, into `page` of every group on every rank.
    fn write_block(&self, prompt: &[i64], block: usize, page: u32) -> anyhow::Result<()> {
        for (rank, device) in self.devices.iter().enumerate() {
            for group in &self.layout.groups {
                let bytes = device.page_pool(group.id)?.page_bytes;
                device.write_page(
                    group.id,
                    page,
                    &kv_bytes(prompt, block, group.id, rank, bytes),
                )?;
            }
        }
        Ok(())
    }

    /// Checks that the first `blocks` loaded pages hold what computing them would give.
    fn check_loaded(&self, prompt: &[i64], pages: &[u32], blocks: usize) -> anyhow::Result<()> {
        for (rank, device) in self.devices.iter().enumerate() {
            for group in &self.layout.groups {
                let bytes = device.page_pool(group.id)?.page_bytes;
                for (block, &page) in pages.iter().enumerate().take(blocks) {
                    let loaded = device.read_page_to_vec(group.id, page)?;
                    if loaded != kv_bytes(prompt, block, group.id, rank, bytes) {
                        bail!("block {block} of group {} loaded wrong bytes", group.id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Drains the connector and returns its final statistics.
    pub fn shutdown(self) -> ConnectorStats {
        self.handle.shutdown()
    }
}

/// Deterministic stand-in for the KV of one block: depends on every token up to the
/// block's end, as real KV does.
fn kv_bytes(prompt: &[i64], block: usize, group: GroupId, rank: usize, len: usize) -> Vec<u8> {
    let t = 16;
    let seed = prompt[..(block + 1) * t].iter().fold(
        u64::from(group.0) * 31 + rank as u64,
        |acc, &token| {
            acc.wrapping_mul(1_000_003)
                .wrapping_add(token.unsigned_abs())
        },
    );
    (0..len)
        .map(|i| (seed.wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

/// A shared-system-prompt conversation: `shared` leading tokens, then `own` tokens of the
/// request's own, starting at `own_start`.
pub fn prompt(shared: i64, own_start: i64, own: i64) -> Arc<[i64]> {
    let shared = (0..shared).map(|token| 7 + token % 1_000);
    let own = own_start..own_start + own;
    shared.chain(own).collect::<Vec<_>>().into()
}

/// Serves two requests that share 32 blocks (512 tokens) and returns what happened.
///
/// # Errors
///
/// When the engine or the connector fails (see [`MiniEngine::serve`]).
pub fn run() -> anyhow::Result<EmbedOutcome> {
    let pool: Arc<dyn Pool> = Arc::new(MemoryPool::new(
        EvictionPolicy::mooncake_defaults(64 << 20),
        Arc::new(SystemClock::new()),
    )?);
    let mut engine = MiniEngine::start(pool).context("starting the connector")?;
    let first = prompt(512, 10_000, 133);
    let second = prompt(512, 20_000, 70);
    let reused_tokens = vec![
        engine.serve(RequestId(1), &first)?,
        engine.serve(RequestId(2), &second)?,
    ];
    let stats = engine.shutdown();
    Ok(EmbedOutcome {
        reused_tokens,
        stats,
    })
}

fn main() -> anyhow::Result<()> {
    let outcome = run()?;
    ensure!(
        outcome.reused_tokens == [0, 512],
        "expected the second request to reuse the first's 512-token prefix, got {:?}",
        outcome.reused_tokens
    );
    let stats = &outcome.stats;
    println!(
        "tokens reused per request: {:?}; lookups {} (full {}, full_miss {}); \
         pages saved {}, pages loaded {}",
        outcome.reused_tokens,
        stats.lookups.lookups(),
        stats.lookups.full,
        stats.lookups.full_miss,
        stats.saves.saves_done,
        stats.loads.pages_loaded,
    );
    Ok(())
}
