//! Lookups handed between the parts of one deployment (R33): the lookup-only connector of
//! a scheduler that lives apart from its ranks gives each request's finished lookup as a
//! record ([`ConnectorHandle::lookup_record`]); every rank's connector adopts it
//! ([`ConnectorHandle::adopt_lookup`]) in place of a lookup of its own, then reserves,
//! loads and saves the request as usual. See `core::lookup_record` for the record.
//!
//! Invariants:
//!
//! - `records::A1`. An adopted request starts exactly like a looked-up one whose lookup
//!   has finished: same ticket bookkeeping, its local match reused (never saved again,
//!   R19), and only this connector's groups planned for loading.
//! - `records::A2`. A refused adoption (a live request, a record of another deployment or
//!   an inconsistent one) changes nothing; a live request is marked disputed, as a second
//!   `lookup_prefix` marks it (R32).

use std::sync::Arc;

use super::{ConnectorHandle, RequestState};
use crate::connector::refusal::{AdoptError, HookError};
use crate::core::ids::{LookupTicket, RequestId};
use crate::core::lookup_record::LookupRecord;
use crate::core::page_names::PromptHashes;

impl ConnectorHandle {
    /// The finished lookup of `request` as bytes for the other parts of the deployment;
    /// `None` while it runs, for an unknown request, or one looked up twice (R32).
    pub fn lookup_record(&mut self, request: RequestId) -> Option<Vec<u8>> {
        self.flush_queued_lookups();
        self.drain_lookups();
        let state = self.requests.get(&request)?;
        if state.disputed {
            return None;
        }
        let (plan, hashes) = state.lookup.as_ref()?;
        let record = LookupRecord {
            plan: plan.as_deref().cloned(),
            local_match_tokens: state.reused_until,
            hashes: hashes.clone(),
        };
        Some(record.encode(&self.keys.parts))
    }

    /// Takes `record` (another connector's [`lookup_record`](Self::lookup_record)) as the
    /// finished lookup of `request` (`records::A1`).
    ///
    /// # Errors
    /// [`AdoptError`] when refused (`records::A2`).
    pub fn adopt_lookup(&mut self, request: RequestId, record: &[u8]) -> Result<(), AdoptError> {
        if let Some(live) = self.requests.get_mut(&request) {
            live.disputed = true;
            return Err(HookError::LiveRequest { request }.into());
        }
        let mut record = LookupRecord::decode(record, self.keys.fingerprint)
            .map_err(|source| AdoptError::Record { request, source })?;
        let keys = &self.keys;
        record.keep_groups(|group| keys.groups.iter().any(|local| local.group == group));
        self.last_ticket = LookupTicket(self.last_ticket.0 + 1);
        let lookup = if self.thread.is_none() {
            // Closed: nothing is offered or saved, as for a lookup after close.
            (None, PromptHashes::default())
        } else {
            (record.plan.map(Arc::new), record.hashes)
        };
        let state = RequestState {
            ticket: self.last_ticket,
            reused_until: record.local_match_tokens,
            lookup: Some(lookup),
            ..RequestState::default()
        };
        self.requests.insert(request, state);
        Ok(())
    }
}
