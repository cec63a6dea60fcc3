//! Saves that survive a full pool (R35, `save_retry::N1`, `save_retry::N2`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;
use crate::core::eviction::EvictionError;

/// A pool that refuses every key of its first `refusals` puts for want of room, as a full
/// Mooncake segment does until the master has evicted, then stores.
struct FullFor {
    inner: MemoryPool,
    refusals: AtomicUsize,
    puts: AtomicUsize,
}

impl FullFor {
    fn new(inner: MemoryPool, refusals: usize) -> Self {
        FullFor {
            inner,
            refusals: AtomicUsize::new(refusals),
            puts: AtomicUsize::new(0),
        }
    }
}

fn no_space() -> PoolError {
    PoolError::NoSpace {
        source: EvictionError::LargerThanCapacity {
            needed_bytes: 1,
            capacity_bytes: 0,
        },
    }
}

impl Pool for FullFor {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.inner.exists(keys)
    }
    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        let refuse = self
            .refusals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if refuse {
            return keys.iter().map(|_| Err(no_space())).collect();
        }
        self.inner.put(keys, values)
    }
    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        self.inner.get_into(keys, buffers)
    }
    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.inner.touch(keys)
    }
    fn counters(&self) -> crate::pool::PoolCounters {
        self.inner.counters()
    }
    fn name(&self) -> &'static str {
        "full-for"
    }
}

const RETRY: NoSpaceRetry = NoSpaceRetry {
    retries: 3,
    backoff: Duration::from_millis(1),
};

fn save_retrying(rig: &mut Rig, pool: &FullFor, retry: NoSpaceRetry) -> RetriedSave {
    for block in 0..3_u8 {
        rig.device
            .write_page(GroupId(0), u32::from(block), &page_bytes(block))
            .unwrap();
    }
    let items: Vec<PageRef> = (0..3_u8)
        .map(|block| page_ref(block, u32::from(block)))
        .collect();
    let staging = rig.staging.take().unwrap();
    let (staging, saved) = save_pages_retrying(pool, &mut rig.stream, staging, &items, retry);
    rig.staging = Some(staging);
    saved
}

/// A put refused twice for room is stored on the third attempt; the pages end stored,
/// counted retried once each however many attempts they took, and load back intact.
#[test]
fn a_refused_put_is_retried_until_stored() {
    let mut rig = rig(4);
    let pool = FullFor::new(std::mem::replace(&mut rig.pool, rig_pool()), 2);
    let saved = save_retrying(&mut rig, &pool, RETRY);
    assert_eq!(saved.results, [SaveResult::Stored; 3]);
    assert_eq!(saved.retried, 3, "pages, not attempts");
    assert_eq!(
        pool.puts.load(Ordering::SeqCst),
        3,
        "two refused puts, one stored"
    );
    let staging = rig.staging.take().unwrap();
    let items: Vec<PageRef> = (0..3_u8)
        .map(|block| page_ref(block, u32::from(block) + 8))
        .collect();
    let (_, loaded) = load_all(&pool, &mut rig.stream, staging, &items, None);
    assert_eq!(
        loaded,
        Ok(LoadMoved {
            pages: 3,
            bytes: 3 * PAGE as u64
        })
    );
    for block in 0..3_u8 {
        let page = rig
            .device
            .read_page_to_vec(GroupId(0), u32::from(block) + 8)
            .unwrap();
        assert_eq!(page, page_bytes(block));
    }
}

/// Retries are bounded: a pool that stays full fails the pages as `NoSpace` after the
/// last retry, and with retries off after the first put.
#[test]
fn a_pool_that_stays_full_fails_the_pages_after_the_last_retry() {
    for (retries, puts) in [(3, 4), (0, 1)] {
        let mut rig = rig(4);
        let pool = FullFor::new(std::mem::replace(&mut rig.pool, rig_pool()), usize::MAX);
        let retry = NoSpaceRetry { retries, ..RETRY };
        let saved = save_retrying(&mut rig, &pool, retry);
        assert_eq!(saved.results, [SaveResult::NoSpace; 3]);
        assert_eq!(saved.retried, if retries == 0 { 0 } else { 3 });
        assert_eq!(pool.puts.load(Ordering::SeqCst), puts);
    }
}
