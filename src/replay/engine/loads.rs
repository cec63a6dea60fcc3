//! Finished loads (engine workflow step 3) and the page check.
//!
//! A reservation reported filled is checked before its tokens count as computed (`engine::E2`):
//! every page of the reserved range that the group holds (sinks and window blocks only in a
//! window group, R15) is read back from every rank and compared with the content computing
//! its block gives. The request resumes at the later of the report and the load's modeled
//! end. A failed load releases the range (R25): the reserved pages get the stale pattern
//! again, the window pages the load added are dropped, and the request computes the prefix
//! itself from where the load started (its local match, whose pages it keeps).
//! Per filled load, the window groups' bytes (per rank, full page size) are counted for
//! the report's `window_bytes_per_load`.

use crate::connector::FinishedLoad;

use super::types::HookTimer;
use super::{Engine, Phase};
use crate::replay::cost::SimMicros;
use crate::replay::error::ReplayError;
use crate::replay::kv_cache::KvCacheError;

impl Engine {
    /// Handles the loads the connector reports finished; returns whether any request
    /// changed state.
    pub(super) fn poll_loads(&mut self, now: SimMicros) -> Result<bool, ReplayError> {
        let started = HookTimer::start();
        let finished = self.connector.get_finished_prefix_loads();
        self.connector_time += started.stop();
        let mut changed = false;
        for report in finished {
            let index = self.active.iter().position(|active| {
                active.request.id == report.request
                    && matches!(active.phase, Phase::Loading { reservation, .. } if reservation == report.reservation)
            });
            let Some(index) = index else {
                // R26: a stale completion is ignored.
                self.counters.stale_load_reports += 1;
                continue;
            };
            changed = true;
            if report.filled {
                self.load_filled(index, now)?;
            } else {
                self.load_failed(index, report, now)?;
            }
        }
        Ok(changed)
    }

    /// Checks every loaded page, then counts the range as computed (`engine::E2`). Pages
    /// the engine took back during the load are checked too and freed (`release`).
    fn load_filled(&mut self, index: usize, now: SimMicros) -> Result<(), ReplayError> {
        let Phase::Loading {
            start,
            end,
            kept_end,
            modeled_end_us,
            ..
        } = self.active[index].phase
        else {
            return Ok(());
        };
        self.check_loaded_pages(index, start, end, kept_end)?;
        self.settle_taken_back(index)?;
        self.counters.loads_filled += 1;
        if kept_end < end && self.cache.policies().any(|policy| !policy.is_full()) {
            // The window of the trimmed end was not loaded (R15): compute from the start.
            return self.compute_instead(index, now);
        }
        let active = &mut self.active[index];
        let loaded = kept_end - start;
        active.computed = kept_end;
        active.reused_tokens += loaded;
        active.phase = Phase::Ready {
            at_us: now.max(modeled_end_us),
        };
        self.counters.reused_tokens += u64::try_from(loaded).unwrap_or(u64::MAX);
        Ok(())
    }

    /// Reads back every page of the load the request still holds and compares it with its
    /// block's content. The blocks from `kept_end` on were taken back while the load ran
    /// (`--release-during-loads`): they have no page here, and their pages are checked
    /// where they went (`settle_taken_back`).
    fn check_loaded_pages(
        &mut self,
        index: usize,
        start: usize,
        end: usize,
        kept_end: usize,
    ) -> Result<(), ReplayError> {
        let t = self.cache.tokens_per_block();
        let ranks = u64::try_from(self.devices.len()).unwrap_or(u64::MAX);
        let active = &self.active[index];
        let window_groups: Vec<bool> = self
            .cache
            .policies()
            .map(|policy| !policy.is_full())
            .collect();
        let mut window_bytes = 0;
        for (group, content) in self.groups.iter().enumerate() {
            for block in self.cache.load_blocks(group, end) {
                if block < start / t || block >= kept_end / t {
                    continue;
                }
                let (Some(page), Some(hash)) = (
                    active.pages.page(group, block),
                    active.request.hashes.get(content.naming, block),
                ) else {
                    // Every block of the load has a page (`allocate_load`): a missing one
                    // would go unchecked, so it stops the replay (`engine::E2`).
                    return Err(KvCacheError::LoadedPageMissing { group, block }.into());
                };
                let counts = self
                    .checker
                    .check_page(&self.devices, content, page, hash)?;
                self.counters.verified_pages += counts.verified;
                self.counters.mismatched_pages += counts.mismatched;
                self.counters.pages_loaded += ranks;
                self.counters.bytes_loaded += ranks * self.stored_page_bytes[group];
                self.counters.modeled_bytes_loaded += ranks * self.full_page_bytes[group];
                if window_groups[group] {
                    window_bytes += self.full_page_bytes[group];
                }
            }
        }
        if window_bytes > 0 {
            self.counters.window_loads += 1;
            self.counters.window_bytes_loaded += window_bytes;
            let max = &mut self.counters.window_bytes_per_load_max;
            *max = (*max).max(window_bytes);
        }
        Ok(())
    }

    /// Releases a failed reservation and makes the request compute its prefix (R25).
    fn load_failed(
        &mut self,
        index: usize,
        report: FinishedLoad,
        now: SimMicros,
    ) -> Result<(), ReplayError> {
        let Phase::Loading { start, end, .. } = self.active[index].phase else {
            return Ok(());
        };
        let started = HookTimer::start();
        self.connector
            .release_prefix_reservation(report.request, report.reservation, start, end);
        self.connector_time += started.stop();
        self.settle_taken_back(index)?;
        self.compute_instead(index, now)
    }

    /// The request computes the reserved range itself: its pages get the stale pattern
    /// again, the window pages the load added are dropped, and it resumes from where the
    /// load started (its local match, whose pages it keeps).
    fn compute_instead(&mut self, index: usize, now: SimMicros) -> Result<(), ReplayError> {
        let Phase::Loading { start, end, .. } = self.active[index].phase else {
            return Ok(());
        };
        let t = self.cache.tokens_per_block();
        let active = &mut self.active[index];
        for (group, content) in self.groups.iter().enumerate() {
            for block in start / t..end / t {
                if let Some(page) = active.pages.page(group, block) {
                    self.cache.ensure_writable(group, page)?;
                    self.checker.write_stale(&self.devices, content.id, page)?;
                }
            }
        }
        // The window pages below `start` are the local match's, which the request resumes
        // with; the ones the load added go.
        self.cache.drop_window_pages(&mut active.pages, start / t);
        active.computed = start;
        active.phase = Phase::Ready { at_us: now };
        Ok(())
    }
}
