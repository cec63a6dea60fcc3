//! [`LoadGrant`]: the pages of one load that the engine still lends to it, shared by the
//! engine's handle and the loaders of every rank (R29).
//!
//! The contract: once `release_prefix_reservation` (or `request_finished`, or a
//! replacement) returns, the connector never writes the pages it took back, and the engine
//! may hand them to another request at once (as vLLM and `SGLang` reuse a freed block).
//!
//! - A loader asks the grant right before each batch's device copy which of the batch's
//!   blocks are still lent ([`LoadGrant::begin_copy`]) and copies only those; the returned
//!   [`CopyPermit`] lives until that copy has landed (waited for).
//! - A release ([`LoadGrant::release`], [`LoadGrant::revoke`]) records the blocks it takes
//!   back, then waits for every copy of the load that began before it: such a copy may
//!   target those pages. It waits for what a loader does between beginning a copy and
//!   seeing it land: the copy itself (at most two batches per rank, as a load is
//!   pipelined) and, from a pool that lends objects in process, lending the next batch;
//!   never for a pool call over the network (`transfer::load_pages`). A release that takes
//!   no page back does not wait.
//!
//! Invariant:
//!
//! - `grant::W1`. A page is written only by a copy that began while its block was lent,
//!   and a copy that began before a release has landed by the time that release returns.
//!   Together: no write reaches a page after the release that took it back returned.
//!
//! Blocks follow the ledger's rule ([`crate::core::ledger::overlaps`]): a block stays lent
//! while any of its tokens is reserved, so a release need not be block aligned.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::core::ledger::{overlaps, subtract_range};

/// The engine's pages lent to one load (module docs).
#[derive(Debug)]
pub struct LoadGrant {
    tokens_per_block: u64,
    state: Mutex<GrantState>,
    /// Signalled whenever a copy lands.
    landed: Condvar,
}

#[derive(Debug)]
struct GrantState {
    /// Tokens still lent: sorted, disjoint, non-empty ranges (empty once all taken back).
    lent: Vec<Range<u64>>,
    /// Number of the next copy to begin.
    next_copy: u64,
    /// Copies begun and not yet landed.
    copying: BTreeSet<u64>,
}

impl LoadGrant {
    /// A grant of the pages of tokens `tokens` (blocks of `tokens_per_block` tokens).
    pub fn new(tokens: Range<u64>, tokens_per_block: u64) -> Self {
        let lent = if tokens.is_empty() {
            Vec::new()
        } else {
            vec![tokens]
        };
        Self {
            tokens_per_block: tokens_per_block.max(1),
            state: Mutex::new(GrantState {
                lent,
                next_copy: 0,
                copying: BTreeSet::new(),
            }),
            landed: Condvar::new(),
        }
    }

    /// A loader is about to copy into the pages of `blocks`: returns, per block, whether
    /// it is still lent (copy it) or was taken back (skip it), and the permit that must
    /// live until the copy has landed.
    pub fn begin_copy(&self, blocks: &[u64]) -> (CopyPermit<'_>, Vec<bool>) {
        let mut state = self.lock();
        let lent = blocks
            .iter()
            .map(|&block| overlaps(block, self.tokens_per_block, &state.lent))
            .collect();
        let number = state.next_copy;
        state.next_copy += 1;
        state.copying.insert(number);
        drop(state);
        let permit = CopyPermit {
            grant: self,
            number,
        };
        (permit, lent)
    }

    /// Whether every page was taken back (a loader may stop early).
    pub fn is_revoked(&self) -> bool {
        self.lock().lent.is_empty()
    }

    /// The engine takes back tokens `tokens`; returns once no copy into a page whose block
    /// has no lent token left can land any more (`grant::W1`). Returns whether every page
    /// is now taken back.
    pub fn release(&self, tokens: Range<u64>) -> bool {
        let mut state = self.lock();
        if subtract_range(&mut state.lent, tokens) {
            state = self.wait_for_copies_begun(state);
        }
        state.lent.is_empty()
    }

    /// The engine takes back every page (the reservation was released whole, replaced, or
    /// its request finished); returns once no copy can land in any of them (`grant::W1`).
    pub fn revoke(&self) {
        let mut state = self.lock();
        if !state.lent.is_empty() {
            state.lent.clear();
            drop(self.wait_for_copies_begun(state));
        }
    }

    /// Waits until every copy begun so far has landed.
    fn wait_for_copies_begun<'a>(
        &'a self,
        mut state: MutexGuard<'a, GrantState>,
    ) -> MutexGuard<'a, GrantState> {
        let begun = state.next_copy;
        while state.copying.first().is_some_and(|&number| number < begun) {
            state = self
                .landed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state
    }

    fn lock(&self) -> MutexGuard<'_, GrantState> {
        // The state stays consistent under a panic (each change is one assignment).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One copy into a load's pages, begun with [`LoadGrant::begin_copy`]; dropping it says
/// the copy has landed (or will never be issued), which a waiting release needs.
#[derive(Debug)]
pub struct CopyPermit<'a> {
    grant: &'a LoadGrant,
    number: u64,
}

impl Drop for CopyPermit<'_> {
    fn drop(&mut self) {
        let mut state = self.grant.lock();
        state.copying.remove(&self.number);
        drop(state);
        self.grant.landed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::LoadGrant;

    #[test]
    fn a_released_block_is_skipped_by_later_copies_and_kept_blocks_are_not() {
        let grant = LoadGrant::new(0..64, 16);
        assert!(!grant.release(40..64), "blocks 0-2 keep tokens");
        let (permit, lent) = grant.begin_copy(&[0, 1, 2, 3]);
        assert_eq!(
            lent,
            [true, true, true, false],
            "block 2 keeps tokens 32..40"
        );
        drop(permit);
        assert!(!grant.is_revoked());
        assert!(grant.release(0..40));
        assert!(grant.is_revoked());
        let (_permit, lent) = grant.begin_copy(&[0]);
        assert_eq!(lent, [false]);
    }

    #[test]
    fn a_release_returns_only_after_a_copy_begun_before_it_landed_w1() {
        let grant = Arc::new(LoadGrant::new(0..64, 16));
        let landed = Arc::new(AtomicBool::new(false));
        let (began_tx, began) = flume::bounded(1);
        let copier = {
            let (grant, landed) = (Arc::clone(&grant), Arc::clone(&landed));
            std::thread::spawn(move || {
                let (permit, lent) = grant.begin_copy(&[3]);
                assert_eq!(lent, [true]);
                began_tx.send(()).ok();
                // The copy takes a while; the release must wait for it.
                std::thread::sleep(std::time::Duration::from_millis(50));
                landed.store(true, Ordering::SeqCst);
                drop(permit);
            })
        };
        began.recv().ok();
        grant.release(48..64);
        assert!(
            landed.load(Ordering::SeqCst),
            "the release returned while a copy into the page it took back was in flight"
        );
        copier.join().ok();
    }

    #[test]
    fn a_release_that_takes_nothing_back_does_not_wait() {
        let grant = LoadGrant::new(0..64, 16);
        assert!(!grant.release(48..64));
        let (permit, _) = grant.begin_copy(&[0]);
        // Nothing left to take back in 48..64: this returns with a copy in flight.
        assert!(!grant.release(48..64));
        assert!(!grant.release(64..80));
        drop(permit);
        grant.revoke();
        assert!(grant.is_revoked());
    }
}
