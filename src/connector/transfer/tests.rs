//! Load and save procedures on the embedded pool and the host device (R5, R19, R24, R25).

use std::sync::Arc;

use super::*;
use crate::core::eviction::EvictionPolicy;
use crate::core::hash::BlockHash;
use crate::core::keys::Shard;
use crate::core::layout::{GroupId, LayoutFingerprint};
use crate::gpu::{Device, PagePoolSpec};
use crate::pool::{MemoryPool, SystemClock};

const PAGE: usize = 256;

struct Rig {
    pool: MemoryPool,
    device: Device,
    stream: CopyStream,
    staging: Option<StagingPool>,
}

fn rig(slots: u32) -> Rig {
    let pool = MemoryPool::new(
        EvictionPolicy::mooncake_defaults(1 << 20),
        Arc::new(SystemClock::new()),
    )
    .unwrap();
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

fn save_item(block: u8, page: u32) -> SaveItem {
    SaveItem {
        key: format!("k{block}"),
        identity: identity(block),
        page,
        payload_len: PAGE,
    }
}

fn load_item(block: u8, page: u32) -> LoadItem {
    LoadItem {
        key: format!("k{block}"),
        identity: identity(block),
        page,
        payload_len: PAGE,
    }
}

impl Rig {
    fn save(&mut self, items: &[SaveItem]) -> Vec<SaveResult> {
        let staging = self.staging.take().unwrap();
        let (staging, results) = save_pages(&self.pool, &mut self.stream, staging, items);
        self.staging = Some(staging);
        results
    }

    fn load(&mut self, items: &[LoadItem]) -> Result<LoadMoved, LoadFailure> {
        let staging = self.staging.take().unwrap();
        let (staging, result) = load_pages(&self.pool, &mut self.stream, staging, items, None);
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
    let saves: Vec<_> = (0..5_u8).map(|b| save_item(b, u32::from(b))).collect();
    assert_eq!(rig.save(&saves), vec![SaveResult::Stored; 5]);
    let loads: Vec<_> = (0..5_u8).map(|b| load_item(b, 8 + u32::from(b))).collect();
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
    assert_eq!(rig.save(&[save_item(1, 0)]), vec![SaveResult::Stored]);
    let before = rig.pool.counters().puts;
    assert_eq!(
        rig.save(&[save_item(1, 0), save_item(2, 0)]),
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
    rig.save(&[save_item(1, 0)]);
    assert_eq!(
        rig.load(&[load_item(1, 3), load_item(9, 4)]),
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
    rig.save(&[save_item(1, 0)]);
    // Another block's key pointing at block 1's object: the hash in the header differs.
    let mut wrong = load_item(1, 3);
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
    assert_eq!(rig.load(&[load_item(3, 3)]), Err(LoadFailure::Corrupt));
    // A short object.
    rig.pool
        .put(&["k4"], &[&object[..HEADER_BYTES]])
        .into_iter()
        .for_each(|r| r.unwrap());
    assert_eq!(rig.load(&[load_item(4, 3)]), Err(LoadFailure::Corrupt));
}

/// R25: a failed device copy fails the load; a failed gather fails the save.
#[test]
fn failed_copies_fail_loads_and_saves_r25() {
    let mut rig = rig(4);
    rig.device
        .write_page(GroupId(0), 0, &page_bytes(1))
        .unwrap();
    rig.device.inject_copy_failures(1);
    assert_eq!(rig.save(&[save_item(1, 0)]), vec![SaveResult::Failed]);
    assert_eq!(rig.save(&[save_item(1, 0)]), vec![SaveResult::Stored]);
    rig.device.inject_copy_failures(1);
    assert_eq!(rig.load(&[load_item(1, 3)]), Err(LoadFailure::DeviceCopy));
    assert_eq!(
        rig.load(&[load_item(1, 3)]),
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
    rig.save(&[save_item(1, 0)]);
    let staging = rig.staging.take().unwrap();
    let past = std::time::Instant::now();
    let (staging, result) = load_pages(
        &rig.pool,
        &mut rig.stream,
        staging,
        &[load_item(1, 5)],
        Some(past),
    );
    rig.staging = Some(staging);
    assert_eq!(result, Err(LoadFailure::Timeout));
    assert_ne!(
        rig.device.read_page_to_vec(GroupId(0), 5).unwrap(),
        page_bytes(1)
    );
}
