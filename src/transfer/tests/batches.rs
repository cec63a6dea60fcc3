//! Batches larger than one lent batch, pools that do not lend, and mixed page sizes in one
//! batch (R5, R19, R24, R25).

use super::*;

/// A pool that does not lend or hand out objects: loads and saves go through staging.
struct NoLend<'a>(&'a MemoryPool);

impl Pool for NoLend<'_> {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.0.exists(keys)
    }
    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.0.put(keys, values)
    }
    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        self.0.get_into(keys, buffers)
    }
    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.0.touch(keys)
    }
    fn counters(&self) -> crate::pool::PoolCounters {
        self.0.counters()
    }
    fn name(&self) -> &'static str {
        "no-lend"
    }
}

const MANY: u32 = 300;

fn many_identity(block: u32) -> ObjectIdentity {
    let mut hash = [7; 16];
    hash[..4].copy_from_slice(&block.to_le_bytes());
    ObjectIdentity {
        chain_hash: BlockHash(hash),
        ..identity(0)
    }
}

fn many_bytes(block: u32) -> Vec<u8> {
    (0..u32::try_from(PAGE).unwrap())
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ block.wrapping_mul(40_503)).to_le_bytes()[1])
        .collect()
}

fn many_device() -> (Device, CopyStream, StagingPool) {
    let device = Device::open_host(&[PagePoolSpec {
        group: GroupId(0),
        page_bytes: PAGE,
        num_pages: 2 * MANY,
    }])
    .unwrap();
    let stream = device.stream().unwrap();
    let staging = device.staging_pool(HEADER_BYTES + PAGE, 4).unwrap();
    for block in 0..MANY {
        device
            .write_page(GroupId(0), block, &many_bytes(block))
            .unwrap();
    }
    (device, stream, staging)
}

fn many_saves() -> Vec<PageRef> {
    (0..MANY)
        .map(|block| PageRef {
            key: format!("m{block}"),
            identity: many_identity(block),
            page: block,
            payload_len: PAGE,
        })
        .collect()
}

fn many_loads() -> Vec<PageRef> {
    (0..MANY)
        .map(|block| PageRef {
            key: format!("m{block}"),
            identity: many_identity(block),
            page: MANY + block,
            payload_len: PAGE,
        })
        .collect()
}

/// More pages than one lent batch ([`LENT_BATCH_PAGES`]): pipelined batches of lent and
/// fresh pool objects, and parts of `staging.slots()` through a pool that does not lend,
/// all come back byte-identical (R24).
#[test]
fn many_pages_round_trip_through_lending_and_staging_pools_r24() {
    assert!(MANY as usize > LENT_BATCH_PAGES);
    for lending in [true, false] {
        let (device, mut stream, staging) = many_device();
        let memory = rig(1).pool;
        let no_lend = NoLend(&memory);
        let pool: &dyn Pool = if lending { &memory } else { &no_lend };
        let (staging, saved) = save_pages(pool, &mut stream, staging, &many_saves());
        assert_eq!(
            saved,
            vec![SaveResult::Stored; MANY as usize],
            "lending {lending}"
        );
        let (_, loaded) = load_all(pool, &mut stream, staging, &many_loads(), None);
        assert_eq!(loaded.map(|moved| moved.pages), Ok(u64::from(MANY)));
        for block in [0, 255, 256, MANY - 1] {
            assert_eq!(
                device.read_page_to_vec(GroupId(0), MANY + block).unwrap(),
                many_bytes(block),
                "lending {lending}, block {block}"
            );
        }
    }
}

/// R5, R25: a tampered object in the second lent batch fails the whole load, after the
/// first batch (already in flight) finished.
#[test]
fn a_corrupt_object_in_a_later_lent_batch_fails_the_load_r5() {
    let (_device, mut stream, staging) = many_device();
    let pool = rig(1).pool;
    let mut tampered = vec![0; HEADER_BYTES + PAGE];
    tampered[HEADER_BYTES..].copy_from_slice(&many_bytes(290));
    object::seal(&many_identity(290), &mut tampered, PAGE).unwrap();
    tampered[HEADER_BYTES + 100] ^= 4;
    pool.put(&["m290"], &[&tampered])
        .into_iter()
        .for_each(|r| r.unwrap());
    let (staging, saved) = save_pages(&pool, &mut stream, staging, &many_saves());
    assert_eq!(saved[290], SaveResult::SkippedPresent);
    let (_, loaded) = load_all(&pool, &mut stream, staging, &many_loads(), None);
    assert_eq!(loaded, Err(LoadFailure::Corrupt));
}

/// Pages of two groups with different page sizes in one save batch: every fresh pool
/// object is paired with a page of its own length (R19), and all come back (R24).
#[test]
fn mixed_page_sizes_in_one_batch_round_trip_r19_r24() {
    let small = PAGE / 4;
    let device = Device::open_host(&[
        PagePoolSpec {
            group: GroupId(0),
            page_bytes: PAGE,
            num_pages: 16,
        },
        PagePoolSpec {
            group: GroupId(1),
            page_bytes: small,
            num_pages: 16,
        },
    ])
    .unwrap();
    let mut stream = device.stream().unwrap();
    let staging = device.staging_pool(HEADER_BYTES + PAGE, 8).unwrap();
    let pool = rig(1).pool;
    let item = |block: u32, group: u32| {
        let len = if group == 0 { PAGE } else { small };
        let identity = ObjectIdentity {
            group: GroupId(group),
            ..many_identity(block)
        };
        (format!("g{group}/{block}"), identity, len)
    };
    let mut saves = Vec::new();
    for block in 0..6_u32 {
        for group in [1, 0] {
            let (key, identity, len) = item(block, group);
            device
                .write_page(GroupId(group), block, &many_bytes(block * 2 + group)[..len])
                .unwrap();
            saves.push(PageRef {
                key,
                identity,
                page: block,
                payload_len: len,
            });
        }
    }
    let (staging, stored) = save_pages(&pool, &mut stream, staging, &saves);
    assert_eq!(stored, vec![SaveResult::Stored; saves.len()]);
    let loads: Vec<PageRef> = saves
        .iter()
        .map(|save| PageRef {
            key: save.key.clone(),
            identity: save.identity,
            page: save.page + 8,
            payload_len: save.payload_len,
        })
        .collect();
    let (_, loaded) = load_all(&pool, &mut stream, staging, &loads, None);
    assert_eq!(loaded.map(|moved| moved.pages), Ok(12));
    for block in 0..6_u32 {
        for group in [0, 1] {
            let len = if group == 0 { PAGE } else { small };
            assert_eq!(
                device.read_page_to_vec(GroupId(group), block + 8).unwrap(),
                many_bytes(block * 2 + group)[..len]
            );
        }
    }
}

/// R29: pages whose blocks the engine took back before the copy keep the engine's bytes;
/// the pages still lent are filled and counted, from a lending pool and through staging
/// (several staging parts); a grant taken back whole writes nothing.
#[test]
fn pages_taken_back_are_never_written_and_the_rest_are_filled_r29() {
    for lending in [true, false] {
        let (device, mut stream, staging) = many_device();
        let memory = rig(1).pool;
        let no_lend = NoLend(&memory);
        let pool: &dyn Pool = if lending { &memory } else { &no_lend };
        let (staging, saved) = save_pages(pool, &mut stream, staging, &many_saves());
        assert!(saved.iter().all(|result| *result == SaveResult::Stored));
        let engine_bytes = vec![0x5A; PAGE];
        for block in 0..MANY {
            device
                .write_page(GroupId(0), MANY + block, &engine_bytes)
                .unwrap();
        }
        let loads = many_loads();
        let blocks: Vec<u64> = (0..u64::from(MANY)).collect();
        // Two tokens per block; the release cuts block 200 in half: it stays lent.
        let grant = LoadGrant::new(0..2 * u64::from(MANY), 2);
        assert!(!grant.release(401..2 * 300));
        let order = LoadOrder {
            items: &loads,
            blocks: &blocks,
            grant: &grant,
        };
        let (staging, loaded) = load_pages(pool, &mut stream, staging, order, None);
        assert_eq!(
            loaded.map(|moved| moved.pages),
            Ok(u64::from(MANY) - 99),
            "lending {lending}"
        );
        for block in 0..MANY {
            let expected = if (201..300).contains(&block) {
                engine_bytes.clone()
            } else {
                many_bytes(block)
            };
            assert_eq!(
                device.read_page_to_vec(GroupId(0), MANY + block).unwrap(),
                expected,
                "lending {lending}, block {block}"
            );
        }
        grant.revoke();
        for block in 0..MANY {
            device
                .write_page(GroupId(0), MANY + block, &engine_bytes)
                .unwrap();
        }
        let order = LoadOrder {
            items: &loads,
            blocks: &blocks,
            grant: &grant,
        };
        let (_, loaded) = load_pages(pool, &mut stream, staging, order, None);
        assert_eq!(loaded.map(|moved| moved.pages), Ok(0), "lending {lending}");
        for block in [0, 255, MANY - 1] {
            assert_eq!(
                device.read_page_to_vec(GroupId(0), MANY + block).unwrap(),
                engine_bytes,
                "lending {lending}, block {block}"
            );
        }
    }
}
