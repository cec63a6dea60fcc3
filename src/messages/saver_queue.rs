//! Messages to a rank's saver.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use actix::Message;

use crate::core::hash::BlockHash;
use crate::core::ids::{PageIndex, RequestId};
use crate::core::layout::GroupId;
use crate::core::save_order::{SaveItem, SavePriority};
use crate::stats::SaveStats;

/// Queue these pages for saving (R16-R22).
///
/// - Sender: the engine's handle (`on_step`), through the courier
///   (`crate::messages::courier`), which delivers it with `try_send`; a full mailbox (or
///   outbox) drops the pages (counted) and they settle at once, so the request's pages
///   can be freed (R22).
/// - Guarantee: the handler only inserts into the priority queue and returns; every item
///   is later settled exactly once (stored, skipped as present, failed or shed) and
///   reported through the engine inbox. A full queue sheds whole requests (R22). The
///   requests in [`EnqueueSave::ended`] are forgotten by the queue first
///   (`save_order::I7`).
/// - Reply: none.
/// - Receiver gone: the courier hands it back; the handle settles the pages as dropped.
///   A batch refused by a full mailbox (or outbox) has its ended requests named again in
///   the handle's next batches.
///
/// The pages travel compactly, as runs of consecutive blocks over one page list (4 bytes a
/// page), so the engine thread copies page numbers and nothing else; the saver expands
/// them into [`SaveItem`]s ([`EnqueueSave::items`]).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct EnqueueSave {
    runs: Vec<SaveRun>,
    pages: Vec<u32>,
    /// Requests the engine ended since the handle's last batch: none sends saves any more,
    /// so the saver forgets whether it shed them and their ids may be used again.
    ended: Vec<RequestId>,
    /// When the handle sent it.
    pub enqueued_at: Instant,
}

/// Consecutive blocks of one request and group, saved at one priority.
#[derive(Debug)]
struct SaveRun {
    request: RequestId,
    group: GroupId,
    priority: SavePriority,
    first_block: usize,
    /// Where the run's pages lie in [`EnqueueSave::pages`].
    pages: Range<usize>,
    /// The prompt's chain hashes; every block of the run has one (`push_run` clamps).
    hashes: Arc<[BlockHash]>,
}

impl EnqueueSave {
    /// An empty batch.
    pub fn new(enqueued_at: Instant) -> Self {
        Self::with_capacity(enqueued_at, 0, 0)
    }

    /// An empty batch with room for `pages` pages in `runs` runs, so that planning a step
    /// allocates each list once instead of growing it page by page on the engine thread.
    pub fn with_capacity(enqueued_at: Instant, pages: usize, runs: usize) -> Self {
        EnqueueSave {
            runs: Vec::with_capacity(runs),
            pages: Vec::with_capacity(pages),
            ended: Vec::new(),
            enqueued_at,
        }
    }

    /// Names `requests` as ended (the engine sends no more saves for them).
    pub fn end_requests(&mut self, requests: &[RequestId]) {
        self.ended.extend_from_slice(requests);
    }

    /// The requests ended since the handle's last batch.
    pub fn ended(&self) -> &[RequestId] {
        &self.ended
    }

    /// Adds the blocks of `blocks` whose page in `page_table` is valid (a freed `-1` or a
    /// block past the table splits the run) and whose chain hash is known.
    pub fn push_run(
        &mut self,
        request: RequestId,
        group: GroupId,
        priority: SavePriority,
        blocks: Range<usize>,
        page_table: &[i32],
        hashes: &Arc<[BlockHash]>,
    ) {
        let end = blocks.end.min(hashes.len()).min(page_table.len());
        let mut run_start: Option<usize> = None;
        let pages = page_table.get(blocks.start..end).unwrap_or(&[]);
        for (block, &page) in (blocks.start..).zip(pages) {
            match u32::try_from(page) {
                Ok(page) => {
                    run_start.get_or_insert(block);
                    self.pages.push(page);
                }
                Err(_) => {
                    if let Some(first) = run_start.take() {
                        self.close_run(request, group, priority, first..block, hashes);
                    }
                }
            }
        }
        if let Some(first) = run_start {
            self.close_run(request, group, priority, first..end, hashes);
        }
    }

    fn close_run(
        &mut self,
        request: RequestId,
        group: GroupId,
        priority: SavePriority,
        blocks: Range<usize>,
        hashes: &Arc<[BlockHash]>,
    ) {
        let pages_end = self.pages.len();
        self.runs.push(SaveRun {
            request,
            group,
            priority,
            first_block: blocks.start,
            pages: pages_end - blocks.len()..pages_end,
            hashes: Arc::clone(hashes),
        });
    }

    /// Whether the batch holds no page.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Whether the batch holds neither a page nor an ended request: nothing to send.
    pub fn carries_nothing(&self) -> bool {
        self.pages.is_empty() && self.ended.is_empty()
    }

    /// Pages per request, in the order the runs were added (consecutive runs of one
    /// request merged): what the handle counts as pending.
    pub fn pages_per_request(&self) -> Vec<(RequestId, u64)> {
        let mut counts: Vec<(RequestId, u64)> = Vec::new();
        for run in &self.runs {
            let pages = run.pages.len() as u64;
            match counts.last_mut() {
                Some((request, count)) if *request == run.request => *count += pages,
                _ => counts.push((run.request, pages)),
            }
        }
        counts
    }

    /// Every page as a [`SaveItem`] with its priority, run by run.
    pub fn items(&self) -> impl Iterator<Item = (SaveItem, SavePriority)> + '_ {
        self.runs.iter().flat_map(move |run| {
            self.pages[run.pages.clone()]
                .iter()
                .zip(&run.hashes[run.first_block..])
                .enumerate()
                .map(move |(offset, (&page, &hash))| {
                    let item = SaveItem {
                        request: run.request,
                        group: run.group,
                        block_index: (run.first_block + offset) as u64,
                        page: PageIndex(page),
                        hash,
                    };
                    (item, run.priority)
                })
        })
    }
}

/// Answer once every save queued so far is settled.
///
/// - Sender: the handle's `settle_saves` (replay) and `shutdown`, through the courier, so
///   it reaches the saver after every save batch handed off before it (a full outbox is
///   waited for, not refused).
/// - Guarantee: `done` receives one message when the queue is empty and no batch is in
///   flight.
/// - Reply: none; the answer goes to `done` (bounded, capacity 1).
/// - Receiver gone: `done` is dropped and the waiter sees a disconnected channel.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct SettleSaves {
    /// Where to say "settled".
    pub done: flume::Sender<()>,
}

/// Report and reset the save counters (R27).
///
/// - Sender: the stats reporter and the handle's final report.
/// - Reply: [`SaveStats`].
/// - Receiver gone: the report shows no saves for this rank.
#[derive(Message, Debug)]
#[rtype(result = "SaveStats")]
pub struct CollectSaveStats;

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(count: u8) -> Arc<[BlockHash]> {
        (0..count).map(|i| BlockHash([i; 16])).collect()
    }

    /// A freed page (`-1`) splits a run; blocks past the hashes or the table are left out;
    /// every other block becomes exactly one item with its own page and hash.
    #[test]
    fn runs_skip_freed_pages_and_expand_to_one_item_per_block() {
        let hashes = hashes(6);
        let mut batch = EnqueueSave::new(Instant::now());
        let table = [10, 11, -1, 13, 14, 15, 16];
        batch.push_run(
            RequestId(1),
            GroupId(0),
            SavePriority::Full,
            0..9,
            &table,
            &hashes,
        );
        batch.push_run(
            RequestId(2),
            GroupId(3),
            SavePriority::Window,
            1..2,
            &table,
            &hashes,
        );
        let items: Vec<(u64, u64, u32, u8, SavePriority)> = batch
            .items()
            .map(|(item, priority)| {
                (
                    item.request.0,
                    item.block_index,
                    item.page.0,
                    item.hash.0[0],
                    priority,
                )
            })
            .collect();
        assert_eq!(
            items,
            vec![
                (1, 0, 10, 0, SavePriority::Full),
                (1, 1, 11, 1, SavePriority::Full),
                (1, 3, 13, 3, SavePriority::Full),
                (1, 4, 14, 4, SavePriority::Full),
                (1, 5, 15, 5, SavePriority::Full),
                (2, 1, 11, 1, SavePriority::Window),
            ]
        );
        assert_eq!(
            batch.pages_per_request(),
            vec![(RequestId(1), 5), (RequestId(2), 1)]
        );
    }

    #[test]
    fn a_batch_of_freed_pages_only_is_empty() {
        let mut batch = EnqueueSave::new(Instant::now());
        batch.push_run(
            RequestId(1),
            GroupId(0),
            SavePriority::Full,
            0..3,
            &[-1, -1, -1],
            &hashes(3),
        );
        assert!(batch.is_empty());
        assert_eq!(batch.items().count(), 0);
        assert!(batch.pages_per_request().is_empty());
        assert!(batch.carries_nothing());
    }

    /// A batch without pages still carries the requests the engine ended, for the queue
    /// to forget (`save_order::I7`).
    #[test]
    fn a_batch_naming_ended_requests_carries_them_without_pages() {
        let mut batch = EnqueueSave::new(Instant::now());
        batch.end_requests(&[RequestId(4), RequestId(9)]);
        assert!(batch.is_empty());
        assert!(!batch.carries_nothing());
        assert_eq!(batch.ended(), &[RequestId(4), RequestId(9)]);
        assert_eq!(batch.items().count(), 0);
    }
}
