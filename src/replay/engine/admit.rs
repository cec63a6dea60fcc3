//! Admission: prefix-aware scheduling through `reserve_prefix` (engine workflow step 2).
//!
//! Requests are tried in arrival order. The head request that does not fit in the KV cache
//! stops admission (first come, first served, as a real scheduler without preemption
//! does); a request whose lookup is still `Pending` is skipped and asked again next step.
//! An offer is cut to whole blocks that end before the last prompt token (the engine must
//! compute at least one token); the cut part is released at once.

use crate::connector::ReserveAnswer;
use crate::core::ids::ReservationId;

use super::types::HookTimer;
use super::{Active, Engine, Phase, Waiting};
use crate::replay::cost::SimMicros;
use crate::replay::error::ReplayError;
use crate::replay::kv_cache::KvCacheError;

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
    /// Admits waiting requests in arrival order while the cache has room.
    pub(super) fn admit(&mut self, now: SimMicros) -> Result<Admitted, ReplayError> {
        let mut admitted = Admitted::default();
        self.admission_blocked = false;
        // Only this round's answers count: a request behind a head that no longer fits is
        // not asked, and an old `Pending` must not make the engine wait on the connector.
        for waiting in &mut self.waiting {
            waiting.pending = false;
        }
        let mut index = 0;
        while index < self.waiting.len() {
            let head = &self.waiting[index];
            if !self.cache.can_admit(head.request.prompt_len) {
                self.admission_blocked = true;
                break;
            }
            let (request, reservation) = (head.request.id, head.reservation);
            let started = HookTimer::start();
            if let Some(prompt) = self.waiting[index].prompt.take() {
                self.connector.lookup_prefix(request, prompt, 0);
            }
            let answer = self.connector.reserve_prefix(request, 0, reservation);
            self.connector_time += started.stop();
            match answer {
                ReserveAnswer::Pending => {
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
                    self.start_request(waiting, extra_tokens, is_async, now, &mut admitted)?;
                }
            }
        }
        Ok(admitted)
    }

    /// Allocates an admitted request's pages and, for a nonzero offer, its reservation.
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
            ..
        } = waiting;
        let Some((mut pages, allocated)) = self.cache.admit(request.prompt_len) else {
            // `can_admit` held a moment ago and nothing ran since.
            return Err(ReplayError::KvCache(KvCacheError::NoRoom {
                prompt_len: request.prompt_len,
            }));
        };
        for (group, page) in allocated {
            self.checker
                .write_stale(&self.devices, self.groups[group].id, page)?;
        }
        let end = self.trim_offer(&request, reservation, extra_tokens);
        let phase = if end == 0 {
            Phase::Ready { at_us: now }
        } else {
            let mut bytes_per_rank = 0;
            for group in 0..self.groups.len() {
                for block in self.cache.load_blocks(group, end) {
                    if let Some(page) = self.cache.ensure_block(&mut pages, group, block)? {
                        self.checker
                            .write_stale(&self.devices, self.groups[group].id, page)?;
                    }
                    bytes_per_rank += self.full_page_bytes[group];
                }
            }
            let start = self.link_free_us.max(now);
            let modeled_end_us = start + self.cost.load_micros(bytes_per_rank);
            self.link_free_us = modeled_end_us;
            if !is_async {
                admitted.sync_wait_us = admitted.sync_wait_us.max(modeled_end_us - now);
            }
            admitted.reservations.push(self.active.len());
            Phase::Loading {
                reservation,
                start: 0,
                end,
                modeled_end_us,
            }
        };
        self.active.push(Active {
            request,
            computed: 0,
            pages,
            phase,
            reused_tokens: 0,
        });
        Ok(())
    }

    /// Cuts an offer to whole blocks before the last prompt token and releases the rest;
    /// returns the tokens kept.
    fn trim_offer(
        &mut self,
        request: &super::ArrivedRequest,
        reservation: ReservationId,
        extra_tokens: usize,
    ) -> usize {
        let t = self.cache.tokens_per_block();
        let limit = request.prompt_len.saturating_sub(1) / t * t;
        let kept = (extra_tokens / t * t).min(limit);
        if kept < extra_tokens {
            self.counters.offers_trimmed += 1;
            let started = HookTimer::start();
            self.connector
                .release_prefix_reservation(request.id, reservation, kept, extra_tokens);
            self.connector_time += started.stop();
        }
        kept
    }
}
