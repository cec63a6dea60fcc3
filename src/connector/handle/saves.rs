//! Saves on the engine's thread (R16-R22): each step's saves are planned into one batch
//! per rank ([`ConnectorHandle::plan_saves`], see `save_plan`) and handed to the courier
//! as one message per rank ([`ConnectorHandle::send_saves`]); settlements come back
//! through the engine inbox ([`ConnectorHandle::drain_saves`]).
//!
//! Invariants:
//! 1. A page counts as pending for its request from the hand-off; a batch refused (by
//!    the outbox at once, or by the saver's mailbox through the courier) settles its
//!    pages as dropped (`saves_refused`, R22), so they leave the pending count again.
//! 2. A finished request enters `saves_done` once, when its last pending page settles.
//! 3. Every saver hears of a request the handle forgot in a later save batch (a refused
//!    batch names it again), after every page of the request: its save queue forgets
//!    that it shed the request (`save_order::I7`) before the engine may reuse the id.


use super::ConnectorHandle;
use crate::connector::{ScheduledRequest, SchedulerOutput};
use crate::core::layout::{Attention, GroupKind};
use crate::core::save_order::SavePriority;
use crate::core::save_plan::{
    block_ranges_to_save, checkpoint_only_blocks, past_chunk_end, SaveCap, SaveStep,
};
use crate::messages::courier::Outgoing;
use crate::messages::saver_queue::EnqueueSave;
use crate::messages::SavesSettled;

impl ConnectorHandle {
    pub(super) fn drain_saves(&mut self) {
        while let Ok(settled) = self.saves.try_recv() {
            self.accept_settled(settled);
        }
    }

    pub(super) fn accept_settled(&mut self, settled: SavesSettled) {
        if let Some(state) = self.requests.get_mut(&settled.request) {
            let was_pending = state.pending_saves > 0;
            state.pending_saves = state.pending_saves.saturating_sub(settled.pages);
            if state.finished && was_pending && state.pending_saves == 0 {
                self.saves_done.push(settled.request);
            }
        }
    }

    /// Room for one rank's save batch of a step, in pages and runs: an upper estimate
    /// from the chunks (every full-attention block a chunk completes, plus a window
    /// group's sinks and `W + R` tail at a prompt's last chunk, R17, and its sinks and
    /// window at each checkpoint the chunk passes, R28), so the batch's
    /// lists are allocated once. Growing them page by page was about 40 % of `on_step` on
    /// the hybrid preset (profiled). A low estimate only costs a reallocation.
    pub(super) fn save_batch_capacity(&self, output: &SchedulerOutput<'_>) -> (usize, usize) {
        let tokens_per_block = self.tokens_per_block.max(1);
        let (mut pages, mut runs) = (0, 0);
        for scheduled in &output.requests {
            if scheduled.computed_after <= scheduled.computed_before {
                continue;
            }
            let last_chunk = scheduled.computed_after >= scheduled.prompt_len;
            let prompt_blocks = scheduled.prompt_len / tokens_per_block + 1;
            let chunk_blocks =
                (scheduled.computed_after - scheduled.computed_before) / tokens_per_block + 2;
            for group in &self.groups {
                pages += match group.attention {
                    Attention {
                        kind: GroupKind::Full,
                        ..
                    } => chunk_blocks,
                    Attention {
                        kind: GroupKind::Window,
                        window_tokens,
                        sink_tokens,
                    } if last_chunk => {
                        let reach = window_tokens
                            .saturating_add(sink_tokens)
                            .saturating_add(self.rewind_tokens);
                        (reach / tokens_per_block + 3).min(prompt_blocks)
                    }
                    Attention {
                        kind: GroupKind::Window,
                        ..
                    } => 0,
                } + self.checkpoint_pages(scheduled, group.attention);
                runs += 2;
            }
        }
        (pages, runs)
    }

    /// An upper estimate of the pages a window group saves at the checkpoints the
    /// request's chunk passes (R28); 0 for a full group or with checkpoints off.
    fn checkpoint_pages(&self, scheduled: &ScheduledRequest<'_>, attention: Attention) -> usize {
        let (Some(every), GroupKind::Window) = (self.checkpoint_tokens, attention.kind) else {
            return 0;
        };
        let passed = scheduled.computed_after.min(scheduled.prompt_len) / every.get()
            - scheduled.computed_before.min(scheduled.prompt_len) / every.get();
        let window = attention
            .window_tokens
            .saturating_add(attention.sink_tokens);
        passed.saturating_mul(window / self.tokens_per_block.max(1) + 3)
    }

    /// Plans the saves of one scheduled request (R16-R21, see `save_plan`) into the step's
    /// per-rank batches (replicated groups on rank 0 only). Only page numbers are copied
    /// here; the saver turns them into keyed items off the engine thread.
    pub(super) fn plan_saves(
        &mut self,
        scheduled: &ScheduledRequest<'_>,
        per_rank: &mut [EnqueueSave],
    ) {
        let Some(state) = self.requests.get_mut(&scheduled.request) else {
            return;
        };
        // A disputed request's engine may be computing other tokens than its hashes' (R32).
        let (false, Some((_, hashes))) = (state.disputed, &state.lookup) else {
            return;
        };
        let hashes = hashes.clone();
        let (reused_until, window_saved) = (state.reused_until, state.window_saved);
        state.window_saved |= scheduled.computed_after >= scheduled.prompt_len;
        let mut step = self.save_step(
            reused_until,
            window_saved,
            scheduled.prompt_len,
            scheduled.computed_before..scheduled.computed_after,
        );
        for (position, group) in self.groups.iter().enumerate() {
            let (Some(keys), Some(table)) = (
                self.keys.group(position),
                scheduled.page_tables.get(position),
            ) else {
                continue;
            };
            // A draft page is saved only under its next-token name (R37): blocks without
            // one are not planned (`page_names::N1`).
            let names = hashes.names(keys.naming);
            step.hashed_blocks = names.len();
            block_ranges_to_save(
                group.attention,
                &step,
                SaveCap::ChunkEnd,
                &mut self.save_ranges,
            );
            // A replicated page is stored once, by the connector holding rank 0.
            let ranks = match (group.replicated, self.saves_replicated) {
                (false, _) => per_rank.len(),
                (true, true) => per_rank.len().min(1),
                (true, false) => 0,
            };
            self.published_past_chunk_end +=
                pages_past_chunk_end(&step, &self.save_ranges, table) * ranks as u64;
            self.checkpoint_pages_planned +=
                (checkpoint_only_blocks(group.attention, &step) * ranks) as u64;
            for batch in per_rank.iter_mut().take(ranks) {
                for (blocks, priority) in &self.save_ranges {
                    batch.push_run(
                        scheduled.request,
                        keys.group,
                        *priority,
                        blocks.clone(),
                        table,
                        names,
                    );
                }
            }
        }
    }

    /// The save step of a request's chunk `computed`, given what came from the pool or the
    /// local match and whether its window was saved before (`hashed_blocks` left 0: it is
    /// the group's to set, R37).
    pub(super) fn save_step(
        &self,
        reused_until: usize,
        window_saved: bool,
        prompt_len: usize,
        computed: std::ops::Range<usize>,
    ) -> SaveStep {
        SaveStep {
            tokens_per_block: self.tokens_per_block,
            prompt_len,
            computed_before: computed.start,
            computed_after: computed.end,
            reused_until,
            hashed_blocks: 0,
            last_chunk: computed.end >= prompt_len && !window_saved,
            rewind_tokens: self.rewind_tokens,
            checkpoint_tokens: self.checkpoint_tokens,
            resave_min_tokens: self.resave_min_tokens,
        }
    }

    /// Hands one step's saves to the courier: one message per rank however many requests
    /// it covers, naming the requests ended since the last step (invariant 3). Pages
    /// refused later (a full outbox or mailbox) are counted dropped and settle (R22,
    /// `take_back`).
    pub(super) fn send_saves(&mut self, per_rank: &mut Vec<EnqueueSave>) {
        let ended = std::mem::take(&mut self.ended);
        for (rank, mut batch) in per_rank.drain(..).enumerate() {
            batch.end_requests(&ended);
            if batch.carries_nothing() {
                continue;
            }
            // Pending from now on; a refusal (at once or from the courier) settles them
            // as dropped.
            for (request, count) in batch.pages_per_request() {
                if let Some(state) = self.requests.get_mut(&request) {
                    state.pending_saves += count;
                }
            }
            self.hand_off(Outgoing::Save { rank, batch });
        }
    }
}

/// Planned pages (with a valid page) whose block ends past the step's chunk end: the
/// run-time check of R16, which must stay 0 (`published_past_chunk_end`). Only the blocks
/// from the first one past the cap are looked at, so a correct plan costs nothing.
fn pages_past_chunk_end(
    step: &SaveStep,
    ranges: &[(std::ops::Range<usize>, SavePriority)],
    page_table: &[i32],
) -> u64 {
    let first_past = step.computed_after / step.tokens_per_block.max(1);
    let mut count = 0;
    for (blocks, _) in ranges {
        for block in blocks.start.max(first_past)..blocks.end {
            let has_page = page_table.get(block).is_some_and(|&page| page >= 0);
            if has_page && past_chunk_end(step, block) {
                count += 1;
            }
        }
    }
    count
}
