//! Saves that survive a full pool (R35): the pages a pool refused for want of room
//! ([`SaveResult::NoSpace`]) are saved again after the pool has had a chance to evict.
//!
//! - `save_retry::N1`. A page refused for room is saved again at most `retries` times, the
//!   `k`-th time after `backoff * 2^(k-1)`; pages stored, skipped or failed otherwise are
//!   never saved twice. Each page still ends with exactly one result (the last attempt's),
//!   so the saver's accounting (`saver_queue::A1`) holds as without retries.
//! - `save_retry::N2`. `retried` counts pages, not attempts: a page saved again twice counts
//!   once, whatever its end.
//!
//! The waits run on the batch's blocking thread (the saver's one batch in flight), so a
//! full pool slows the saves behind them by at most the sum of the waits per batch.

use std::time::Duration;

use super::{save_pages, PageRef, SaveResult};
use crate::gpu::{CopyStream, StagingPool};
use crate::pool::Pool;

/// How puts refused for want of room are retried (`saver.no_space_retries`,
/// `saver.no_space_backoff_ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoSpaceRetry {
    /// Attempts after the first; 0 turns retrying off.
    pub retries: u32,
    /// The wait before the first retry; it doubles for each later one.
    pub backoff: Duration,
}

/// What a retrying save answers: one result per item, and the pages saved again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetriedSave {
    /// One result per item, in order (`save_retry::N1`).
    pub results: Vec<SaveResult>,
    /// Items saved more than once (`save_retry::N2`).
    pub retried: u64,
}

/// [`save_pages`], then the items refused for room saved again (module docs).
pub fn save_pages_retrying(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    staging: StagingPool,
    items: &[PageRef],
    retry: NoSpaceRetry,
) -> (StagingPool, RetriedSave) {
    let (mut staging, mut results) = save_pages(pool, stream, staging, items);
    let mut ever_retried = vec![false; items.len()];
    let mut wait = retry.backoff;
    for _ in 0..retry.retries {
        let refused: Vec<usize> = (0..results.len())
            .filter(|&index| results[index] == SaveResult::NoSpace)
            .collect();
        if refused.is_empty() {
            break;
        }
        std::thread::sleep(wait);
        wait = wait.saturating_mul(2);
        let again: Vec<PageRef> = refused.iter().map(|&index| items[index].clone()).collect();
        let (returned, answers) = save_pages(pool, stream, staging, &again);
        staging = returned;
        for (&index, answer) in refused.iter().zip(answers) {
            results[index] = answer;
            ever_retried[index] = true;
        }
    }
    let retried = ever_retried.iter().filter(|&&retried| retried).count() as u64;
    (staging, RetriedSave { results, retried })
}
