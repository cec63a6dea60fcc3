//! Chunked prefill (engine workflow steps 4 and 5): chunks, page writes, `on_step`, and
//! the end of each prompt.
//!
//! Order within a step, so that a connector sees computed bytes for every block the step
//! completes, and the stale pattern for the rest (`engine::E1`):
//! 1. each running request gets a chunk, in admission order, until `max_num_tokens` is
//!    spent; window pages the chunk touches are allocated (stale);
//! 2. the pages of blocks whose tokens are now all computed get their content; with a
//!    drafter, the pages the extra KV tokens reach past the chunk end are allocated
//!    (stale), and after the last chunk the drafts are written (`draft`);
//! 3. `on_step` gets every chunk and every new reservation, with page tables;
//! 4. window pages out of the kept range are freed; a drafter's rejected drafts are
//!    rewound; requests whose prompt is done call
//!    `request_finished`; with the local prefix cache on their computed full blocks are
//!    cached; their pages are held for saves or released (`engine::E3`).

use crate::connector::{ScheduledRequest, SchedulerOutput};
use crate::core::ids::ReservationId;

use super::types::HookTimer;
use super::{Engine, Phase, PromptDone};
use crate::replay::cost::SimMicros;
use crate::replay::error::ReplayError;

/// One request's chunk in a step: tokens `[before, after)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Chunk {
    /// Index into `active`.
    pub index: usize,
    /// Tokens computed before the step.
    pub before: usize,
    /// The chunk end (R16).
    pub after: usize,
}

impl Engine {
    /// Gives running requests their chunks and computes them (steps 1 and 2).
    pub(super) fn schedule_chunks(&mut self, now: SimMicros) -> Result<Vec<Chunk>, ReplayError> {
        let mut budget = self.max_num_tokens;
        let mut chunks = Vec::new();
        for index in 0..self.active.len() {
            if budget == 0 {
                break;
            }
            let active = &self.active[index];
            let Phase::Ready { at_us } = active.phase else {
                continue;
            };
            let prompt_len = active.request.prompt_len;
            if at_us > now || active.computed >= prompt_len {
                continue;
            }
            let before = active.computed;
            let after = before + (prompt_len - before).min(budget);
            self.compute_chunk(index, before, after)?;
            budget -= after - before;
            chunks.push(Chunk {
                index,
                before,
                after,
            });
        }
        Ok(chunks)
    }

    /// Allocates the chunk's window pages and writes the blocks it completes (`engine::E1`).
    fn compute_chunk(
        &mut self,
        index: usize,
        before: usize,
        after: usize,
    ) -> Result<(), ReplayError> {
        let t = self.cache.tokens_per_block();
        let active = &mut self.active[index];
        for group in 0..self.groups.len() {
            for block in self.cache.chunk_blocks(&(before..after)) {
                if let Some(page) = self.cache.ensure_block(&mut active.pages, group, block)? {
                    self.checker
                        .write_stale(&self.devices, self.groups[group].id, page)?;
                }
            }
        }
        // Block `b` completes when `before < (b + 1) * T <= after`.
        // A drafter's page of a block whose next token is past the prompt has no name
        // (`page_names::N1`): it is never saved, shared or loaded, so it is not written.
        for block in before / t..after / t {
            for (group, content) in self.groups.iter().enumerate() {
                let Some(hash) = active.request.hashes.get(content.naming, block) else {
                    continue;
                };
                if let Some(page) = active.pages.page(group, block) {
                    self.cache.ensure_writable(group, page)?;
                    self.checker
                        .write_computed(&self.devices, content, page, hash)?;
                }
            }
        }
        active.computed = after;
        self.counters.computed_tokens += u64::try_from(after - before).unwrap_or(u64::MAX);
        self.draft_past_chunk_end(index, after)
    }

    /// Reports the step to the connector (step 3).
    pub(super) fn call_on_step(&mut self, chunks: &[Chunk], reservations: &[usize]) {
        let mut entries: Vec<(usize, usize, usize, Option<ReservationId>)> = chunks
            .iter()
            .map(|chunk| (chunk.index, chunk.before, chunk.after, None))
            .collect();
        for &index in reservations {
            let active = &self.active[index];
            if let Phase::Loading { reservation, .. } = active.phase {
                entries.push((index, active.computed, active.computed, Some(reservation)));
            }
        }
        entries.sort_unstable_by_key(|entry| entry.0);
        let tables: Vec<Vec<&[i32]>> = entries
            .iter()
            .map(|entry| {
                self.active[entry.0]
                    .pages
                    .tables()
                    .iter()
                    .map(Vec::as_slice)
                    .collect()
            })
            .collect();
        let output = SchedulerOutput {
            requests: entries
                .iter()
                .zip(&tables)
                .map(|(&(index, before, after, new_reservation), page_tables)| {
                    let request = &self.active[index].request;
                    ScheduledRequest {
                        request: request.id,
                        prompt_len: request.prompt_len,
                        computed_before: before,
                        computed_after: after,
                        new_reservation,
                        page_tables,
                    }
                })
                .collect(),
        };
        let started = HookTimer::start();
        self.connector.on_step(&output);
        self.connector_time += started.stop();
    }

    /// Frees out-of-window pages and ends finished prompts (step 4).
    pub(super) fn after_step(
        &mut self,
        chunks: &[Chunk],
        step_end_us: SimMicros,
    ) -> Vec<PromptDone> {
        let mut finished = Vec::new();
        for chunk in chunks {
            let active = &mut self.active[chunk.index];
            self.cache
                .drop_out_of_window(&mut active.pages, chunk.after);
            if chunk.after == active.request.prompt_len {
                finished.push(chunk.index);
            }
        }
        for &index in &finished {
            self.verify_drafts(index);
        }
        let mut done = Vec::with_capacity(finished.len());
        let mut hold = Vec::with_capacity(finished.len());
        for &index in &finished {
            let active = &self.active[index];
            let started = HookTimer::start();
            hold.push(self.connector.request_finished(active.request.id));
            self.connector_time += started.stop();
            done.push(PromptDone {
                workload_index: active.request.workload_index,
                arrival_us: active.request.arrival_us,
                first_token_us: step_end_us,
                reused_tokens: active.reused_tokens,
                local_hit_tokens: active.local_hit_tokens,
            });
        }
        // Remove from the back so earlier indices stay valid.
        for (&index, &must_hold) in finished.iter().zip(&hold).rev() {
            let active = self.active.remove(index);
            if self.local_prefix_cache {
                // Read-only from here on, even while held for saves (`kv_cache::K5`).
                self.cache
                    .publish(&active.pages, &active.request.hashes, active.computed);
            }
            if must_hold {
                self.held.push((active.request.id, active.pages));
            } else {
                self.cache.release(active.pages);
            }
        }
        done
    }
}
