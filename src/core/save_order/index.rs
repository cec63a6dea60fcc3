//! Which entries each request has queued, and which request is the oldest: what a full
//! queue sheds by (R22), in O(log n) per entry.

use std::collections::{BTreeMap, HashMap};

use super::{SaveKey, SavePriority};
use crate::core::ids::RequestId;

/// The queue's index by request. It holds exactly the keys of the queue's entries
/// (`save_order::I8`); the queue keeps the two in step.
#[derive(Debug, Default)]
pub(super) struct RequestIndex {
    /// Per request with an entry queued: its entries' classes by push sequence number (a
    /// [`SaveKey`] is its class and seq). Never holds an empty map.
    queued: HashMap<RequestId, BTreeMap<u64, SavePriority>>,
    /// Every request with an entry queued, by the seq of its oldest queued entry: the
    /// first is the oldest request, the one a full queue sheds first.
    by_age: BTreeMap<u64, RequestId>,
}

impl RequestIndex {
    /// Records a new entry of `request`. Its key is the newest pushed (`save_order::I3`),
    /// so it is the request's oldest entry only when the request had none queued.
    pub(super) fn insert(&mut self, request: RequestId, key: SaveKey) {
        let seqs = self.queued.entry(request).or_default();
        if seqs.is_empty() {
            self.by_age.insert(key.seq(), request);
        }
        seqs.insert(key.seq(), key.class());
    }

    /// Forgets one entry of `request` (it was popped or removed).
    pub(super) fn remove(&mut self, request: RequestId, key: SaveKey) {
        let Some(seqs) = self.queued.get_mut(&request) else {
            return;
        };
        let oldest = seqs.first_key_value().map(|(&seq, _)| seq);
        seqs.remove(&key.seq());
        if oldest != Some(key.seq()) {
            return;
        }
        self.by_age.remove(&key.seq());
        match seqs.first_key_value() {
            Some((&next, _)) => {
                self.by_age.insert(next, request);
            }
            None => {
                self.queued.remove(&request);
            }
        }
    }

    /// The request whose oldest queued entry was pushed first.
    pub(super) fn oldest(&self) -> Option<RequestId> {
        self.by_age.first_key_value().map(|(_, &request)| request)
    }

    /// Forgets every entry of `request` and returns their keys in push order.
    pub(super) fn take(&mut self, request: RequestId) -> Vec<SaveKey> {
        let Some(seqs) = self.queued.remove(&request) else {
            return Vec::new();
        };
        if let Some((&oldest, _)) = seqs.first_key_value() {
            self.by_age.remove(&oldest);
        }
        seqs.into_iter()
            .map(|(seq, class)| SaveKey::new(class, seq))
            .collect()
    }

    /// Entries queued for `request`.
    #[cfg(test)]
    pub(super) fn len_of(&self, request: RequestId) -> usize {
        self.queued.get(&request).map_or(0, BTreeMap::len)
    }

    /// Entries indexed, over every request.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.queued.values().map(BTreeMap::len).sum()
    }
}
