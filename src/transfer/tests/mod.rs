//! Load and save procedures on the embedded pool and the host device (R5, R19, R24, R25).

use std::sync::Arc;

use super::*;
use crate::core::eviction::EvictionPolicy;
use crate::core::hash::BlockHash;
use crate::core::keys::Shard;
use crate::core::layout::{GroupId, LayoutFingerprint};
use crate::core::ledger::LoadFailure;
use crate::core::object;
use crate::gpu::CopyStream;
use crate::gpu::{Device, PagePoolSpec};
use crate::pool::{MemoryPool, SystemClock};
use crate::pool::{Pool, PoolError};

const PAGE: usize = 256;

struct Rig {
    pool: MemoryPool,
    device: Device,
    stream: CopyStream,
    staging: Option<StagingPool>,
}

fn rig_pool() -> MemoryPool {
    MemoryPool::new(
        EvictionPolicy::mooncake_defaults(1 << 20),
        Arc::new(SystemClock::new()),
    )
    .unwrap()
}

fn rig(slots: u32) -> Rig {
    let pool = rig_pool();
    let device = Device::open_host(&[PagePoolSpec {
        group: GroupId(0),
        page_bytes: PAGE,
        num_pages: 16,
    }])
    .unwrap();
    let stream = device.stream().unwrap();
    let staging = device.staging_pool(HEADER_BYTES + PAGE, slots).unwrap();
    Rig {
        pool,
        device,
        stream,
        staging: Some(staging),
    }
}

fn identity(block: u8) -> ObjectIdentity {
    ObjectIdentity {
        layout_fingerprint: LayoutFingerprint(42),
        chain_hash: BlockHash([block; 16]),
        group: GroupId(0),
        shard: Shard::Rank { world: 1, rank: 0 },
    }
}

fn page_bytes(block: u8) -> Vec<u8> {
    (0..PAGE)
        .map(|i| {
            u8::try_from(i % 251)
                .unwrap()
                .wrapping_mul(31)
                .wrapping_add(block)
        })
        .collect()
}

fn page_ref(block: u8, page: u32) -> PageRef {
    PageRef {
        key: format!("k{block}"),
        identity: identity(block),
        page,
        payload_len: PAGE,
    }
}

/// Loads `items` with every page lent (item `i` holds block `i`).
fn load_all(
    pool: &dyn Pool,
    stream: &mut CopyStream,
    staging: StagingPool,
    items: &[PageRef],
    deadline: Option<std::time::Instant>,
) -> (StagingPool, Result<LoadMoved, LoadFailure>) {
    let blocks: Vec<u64> = (0..items.len() as u64).collect();
    let grant = LoadGrant::new(0..items.len() as u64, 1);
    let order = LoadOrder {
        items,
        blocks: &blocks,
        grant: &grant,
    };
    load_pages(pool, stream, staging, order, deadline)
}

impl Rig {
    fn save(&mut self, items: &[PageRef]) -> Vec<SaveResult> {
        let staging = self.staging.take().unwrap();
        let (staging, results) = save_pages(&self.pool, &mut self.stream, staging, items);
        self.staging = Some(staging);
        results
    }

    fn load(&mut self, items: &[PageRef]) -> Result<LoadMoved, LoadFailure> {
        let staging = self.staging.take().unwrap();
        let (staging, result) = load_all(&self.pool, &mut self.stream, staging, items, None);
        self.staging = Some(staging);
        result
    }
}

/// Saved pages come back byte-identical in other pages, across several staging batches.
#[test]
fn save_then_load_is_byte_identical_r24() {
    let mut rig = rig(2);
    for block in 0..5_u8 {
        rig.device
            .write_page(GroupId(0), u32::from(block), &page_bytes(block))
            .unwrap();
    }
    let saves: Vec<_> = (0..5_u8).map(|b| page_ref(b, u32::from(b))).collect();
    assert_eq!(rig.save(&saves), vec![SaveResult::Stored; 5]);
    let loads: Vec<_> = (0..5_u8).map(|b| page_ref(b, 8 + u32::from(b))).collect();
    assert_eq!(
        rig.load(&loads),
        Ok(LoadMoved {
            pages: 5,
            bytes: 5 * PAGE as u64
        })
    );
    for block in 0..5_u8 {
        assert_eq!(
            rig.device
                .read_page_to_vec(GroupId(0), 8 + u32::from(block))
                .unwrap(),
            page_bytes(block)
        );
    }
}

/// R19: a key already present is skipped, not rewritten.
#[test]
fn present_keys_are_skipped_r19() {
    let mut rig = rig(4);
    rig.device
        .write_page(GroupId(0), 0, &page_bytes(1))
        .unwrap();
    assert_eq!(rig.save(&[page_ref(1, 0)]), vec![SaveResult::Stored]);
    let before = rig.pool.counters().puts;
    assert_eq!(
        rig.save(&[page_ref(1, 0), page_ref(2, 0)]),
        vec![SaveResult::SkippedPresent, SaveResult::Stored]
    );
    assert_eq!(rig.pool.counters().puts, before + 1);
}

/// R25: a missing object fails the whole load.
#[test]
fn a_missing_object_fails_the_load_as_evicted_r25() {
    let mut rig = rig(4);
    rig.device
        .write_page(GroupId(0), 0, &page_bytes(1))
        .unwrap();
    rig.save(&[page_ref(1, 0)]);
    assert_eq!(
        rig.load(&[page_ref(1, 3), page_ref(9, 4)]),
        Err(LoadFailure::Evicted)
    );
}

/// R5: an object whose header names another block, or whose payload changed, is corrupt.
#[test]
fn corrupt_objects_fail_the_load_r5() {
    let mut rig = rig(4);
    rig.device
        .write_page(GroupId(0), 0, &page_bytes(1))
        .unwrap();
    rig.save(&[page_ref(1, 0)]);
    // Another block's key pointing at block 1's object: the hash in the header differs.
    let mut wrong = page_ref(1, 3);
    wrong.identity.chain_hash = BlockHash([2; 16]);
    assert_eq!(rig.load(&[wrong]), Err(LoadFailure::Corrupt));
    // A tampered payload under a fresh key.
    let mut object = vec![0; HEADER_BYTES + PAGE];
    object[HEADER_BYTES..].copy_from_slice(&page_bytes(3));
    object::seal(&identity(3), &mut object, PAGE).unwrap();
    object[HEADER_BYTES + 7] ^= 1;
    rig.pool
        .put(&["k3"], &[&object])
        .into_iter()
        .for_each(|r| r.unwrap());
    assert_eq!(rig.load(&[page_ref(3, 3)]), Err(LoadFailure::Corrupt));
    // A short object.
    rig.pool
        .put(&["k4"], &[&object[..HEADER_BYTES]])
        .into_iter()
        .for_each(|r| r.unwrap());
    assert_eq!(rig.load(&[page_ref(4, 3)]), Err(LoadFailure::Corrupt));
}

/// R25: a failed device copy fails the load; a failed gather fails the save.
#[test]
fn failed_copies_fail_loads_and_saves_r25() {
    let mut rig = rig(4);
    rig.device
        .write_page(GroupId(0), 0, &page_bytes(1))
        .unwrap();
    rig.device.inject_copy_failures(1);
    assert_eq!(rig.save(&[page_ref(1, 0)]), vec![SaveResult::Failed]);
    assert_eq!(rig.save(&[page_ref(1, 0)]), vec![SaveResult::Stored]);
    rig.device.inject_copy_failures(1);
    assert_eq!(rig.load(&[page_ref(1, 3)]), Err(LoadFailure::DeviceCopy));
    assert_eq!(
        rig.load(&[page_ref(1, 3)]),
        Ok(LoadMoved {
            pages: 1,
            bytes: PAGE as u64
        })
    );
}

/// R25: a load past its deadline fails as a timeout and places nothing.
#[test]
fn a_load_past_its_deadline_times_out_r25() {
    let mut rig = rig(4);
    rig.device
        .write_page(GroupId(0), 0, &page_bytes(1))
        .unwrap();
    rig.save(&[page_ref(1, 0)]);
    let staging = rig.staging.take().unwrap();
    let past = std::time::Instant::now();
    let (staging, result) = load_all(
        &rig.pool,
        &mut rig.stream,
        staging,
        &[page_ref(1, 5)],
        Some(past),
    );
    rig.staging = Some(staging);
    assert_eq!(result, Err(LoadFailure::Timeout));
    assert_ne!(
        rig.device.read_page_to_vec(GroupId(0), 5).unwrap(),
        page_bytes(1)
    );
}

/// A pool that stores like the embedded one but answers gets with a chosen byte count
/// (or a chosen number of answers), and puts with no answer at all.
struct WrongAnswers {
    inner: MemoryPool,
    /// Replaces every successful get's byte count.
    read: Option<usize>,
    /// Drops the answers to gets and puts.
    no_answers: bool,
}

impl Pool for WrongAnswers {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.inner.exists(keys)
    }

    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        let answers = self.inner.put(keys, values);
        if self.no_answers {
            Vec::new()
        } else {
            answers
        }
    }

    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        let answers = self.inner.get_into(keys, buffers);
        if self.no_answers {
            return Vec::new();
        }
        answers
            .into_iter()
            .map(|answer| answer.map(|read| self.read.unwrap_or(read)))
            .collect()
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.inner.touch(keys)
    }

    fn counters(&self) -> crate::pool::PoolCounters {
        self.inner.counters()
    }

    fn name(&self) -> &'static str {
        "wrong-answers"
    }
}

/// Bad input: a get answered with another byte count than the object's, larger
/// than the staging slot, or with no answers at all fails the load (R25) without a panic,
/// and the destination page keeps its bytes (no unverified page reaches the device).
#[test]
fn a_pool_answer_of_the_wrong_length_fails_the_load_r5_r25() {
    let object = HEADER_BYTES + PAGE;
    let cases = [
        (Some(object - 1), false, LoadFailure::Corrupt),
        (Some(object + 1), false, LoadFailure::Corrupt),
        (Some(0), false, LoadFailure::Corrupt),
        (Some(usize::MAX), false, LoadFailure::Corrupt),
        (None, true, LoadFailure::PoolError),
    ];
    for (read, no_answers, failure) in cases {
        let mut rig = rig(4);
        rig.device
            .write_page(GroupId(0), 0, &page_bytes(1))
            .unwrap();
        rig.save(&[page_ref(1, 0)]);
        let before = vec![0xA5; PAGE];
        rig.device.write_page(GroupId(0), 5, &before).unwrap();
        let pool = WrongAnswers {
            inner: rig.pool,
            read,
            no_answers,
        };
        let staging = rig.staging.take().unwrap();
        let (_, result) = load_all(&pool, &mut rig.stream, staging, &[page_ref(1, 5)], None);
        assert_eq!(
            result,
            Err(failure),
            "read {read:?}, no answers {no_answers}"
        );
        assert_eq!(rig.device.read_page_to_vec(GroupId(0), 5).unwrap(), before);
    }
}

/// Bad input: a put answered with no results counts every page failed, never
/// stored.
#[test]
fn a_put_without_answers_counts_the_saves_failed() {
    let mut rig = rig(4);
    rig.device
        .write_page(GroupId(0), 0, &page_bytes(1))
        .unwrap();
    rig.device
        .write_page(GroupId(0), 1, &page_bytes(2))
        .unwrap();
    let pool = WrongAnswers {
        inner: rig.pool,
        read: None,
        no_answers: true,
    };
    let staging = rig.staging.take().unwrap();
    let (_, results) = save_pages(
        &pool,
        &mut rig.stream,
        staging,
        &[page_ref(1, 0), page_ref(2, 1)],
    );
    assert_eq!(results, [SaveResult::Failed, SaveResult::Failed]);
}

/// A pool too small for the object refuses it for want of room: `NoSpace`, not `Failed`,
/// so the saver counts it apart (`saves_no_space`).
#[test]
fn a_page_the_pool_has_no_room_for_is_no_space() {
    let mut rig = rig(2);
    rig.pool = MemoryPool::new(
        EvictionPolicy::mooncake_defaults(64),
        Arc::new(SystemClock::new()),
    )
    .unwrap();
    rig.device
        .write_page(GroupId(0), 0, &page_bytes(1))
        .unwrap();
    assert_eq!(rig.save(&[page_ref(1, 0)]), [SaveResult::NoSpace]);
}

mod batches;
mod retry;
