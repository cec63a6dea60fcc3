//! Releases during loads (off by default; [`EngineSetup::release_during_loads`],
//! `kv-connector replay --release-during-loads`): the engine takes back half of a
//! reservation while its load runs and hands those pages to another request, which writes
//! them at once, as an engine that frees a block reuses it (R29).
//!
//! Workflow, for every load a step starts (after `on_step` reported it):
//! 1. a reservation `[start, end)` of at least two blocks keeps its first half: the engine
//!    calls `release_prefix_reservation(mid, end)`, `mid` block aligned;
//! 2. once the hook returns, the pages of the blocks from `mid / T` on, in every group,
//!    leave the request for a stand-in request, which writes the foreign pattern into
//!    them (`content::C3`); the request gets fresh pages for those blocks when it computes
//!    them (`kv_cache::taken`);
//! 3. when the load is reported, filled or failed, every stand-in page must still hold the
//!    foreign pattern (counted in `verified_pages` / `mismatched_pages`: a page the
//!    connector wrote after the release is a mismatch); then it is freed;
//! 4. a filled load resumes at `mid` on a layout of full-attention groups only, after the
//!    usual check of its pages; with window groups the window of `mid` was not loaded
//!    (R15), so the request computes from `start`, as after a failed load.
//!
//! A load whose stand-in the cache cannot promise pages to is left whole
//! (`kv_cache::taken::T1`).
//!
//! [`EngineSetup::release_during_loads`]: super::EngineSetup::release_during_loads

use super::types::HookTimer;
use super::{Engine, Phase};
use crate::replay::error::ReplayError;

impl Engine {
    /// Step 1 and 2 for the loads this step started (indices into `active`).
    pub(super) fn release_during_loads(&mut self, started: &[usize]) -> Result<(), ReplayError> {
        if self.release_during_loads {
            for &index in started {
                self.release_second_half(index)?;
            }
        }
        Ok(())
    }

    fn release_second_half(&mut self, index: usize) -> Result<(), ReplayError> {
        let t = self.cache.tokens_per_block();
        let active = &self.active[index];
        let Phase::Loading {
            reservation,
            start,
            end,
            modeled_end_us,
            ..
        } = active.phase
        else {
            return Ok(());
        };
        let blocks = (end - start) / t;
        if blocks < 2 {
            return Ok(());
        }
        let mid = start + blocks / 2 * t;
        let mut needed = vec![0_u32; self.groups.len()];
        let mut taken = Vec::new();
        for (group, needed) in needed.iter_mut().enumerate() {
            for block in mid / t..end / t {
                if active.pages.page(group, block).is_some() {
                    *needed += 1;
                    taken.push((group, block));
                }
            }
        }
        if !self.cache.can_promise(&needed) {
            return Ok(());
        }
        let request = active.request.id;
        let started = HookTimer::start();
        self.connector
            .release_prefix_reservation(request, reservation, mid, end);
        self.connector_time += started.stop();
        let ranks = u64::try_from(self.devices.len()).unwrap_or(u64::MAX);
        let active = &mut self.active[index];
        for (group, block) in taken {
            if let Some(page) = self.cache.take_back(&mut active.pages, group, block) {
                self.checker
                    .write_foreign(&self.devices, self.groups[group].id, page)?;
                active.taken_back.push((group, page));
                self.counters.pages_released_in_flight += ranks;
            }
        }
        active.phase = Phase::Loading {
            reservation,
            start,
            end,
            kept_end: mid,
            modeled_end_us,
        };
        self.counters.loads_released_in_flight += 1;
        Ok(())
    }

    /// Step 3: the stand-in's pages still hold what it wrote; then they are freed.
    pub(super) fn settle_taken_back(&mut self, index: usize) -> Result<(), ReplayError> {
        let taken = std::mem::take(&mut self.active[index].taken_back);
        for (group, page) in taken {
            let counts = self
                .checker
                .check_foreign(&self.devices, self.groups[group].id, page)?;
            self.counters.verified_pages += counts.verified;
            self.counters.mismatched_pages += counts.mismatched;
            self.cache.give_back(group, page);
        }
        Ok(())
    }
}
