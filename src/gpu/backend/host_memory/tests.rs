//! Tests of the arena and its slots (`host_memory::A1`-`host_memory::A6`).

use super::*;
use proptest::prelude::*;

/// The byte range `[start, end)` a slot's class covers.
fn class_range(slot: &HostSlot) -> (usize, usize) {
    let class = slot.owner.as_ref().map_or(0, |owner| owner.class_bytes);
    let start = slot.as_ptr().addr();
    (start, start + class)
}

fn assert_disjoint(slots: &[HostSlot]) {
    let mut ranges: Vec<(usize, usize)> = slots.iter().map(class_range).collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "A2: {pair:?} overlap");
    }
}

#[test]
fn a_slot_keeps_what_was_written() -> Result<(), GpuError> {
    let arena = HostArena::heap_with_chunk_bytes(4096);
    let mut slot = arena.alloc(100)?;
    assert_eq!(slot.len(), 100);
    assert!(slot.iter().all(|&b| b == 0), "A4: a new chunk is zeroed");
    slot.copy_from_slice(&[7; 100]);
    assert_eq!(&slot[..], &[7; 100][..]);
    assert!(!slot.is_pinned() && !arena.is_pinned());
    assert_eq!(slot.as_ptr().addr() % SLOT_ALIGN, 0, "A5");
    let shared = slot.share();
    assert_eq!(shared.clone().len(), 100);
    assert_eq!(&shared[..], &[7; 100][..]);
    assert_eq!(arena.stats().live_slots, 1);
    drop(shared);
    assert_eq!(arena.stats().live_slots, 0);
    Ok(())
}

#[test]
fn reserved_slots_are_handed_out_without_carving() -> Result<(), GpuError> {
    // Chunks of 4 slots of 1,024 bytes: 10 slots need 3 chunks.
    let arena = HostArena::heap_with_chunk_bytes(4096);
    assert_eq!(arena.reserve(1000, 10)?, 3);
    let reserved = arena.stats();
    assert_eq!((reserved.chunks, reserved.free_slots), (3, 12));
    // A second reserve of what is there carves nothing; another class carves its own.
    assert_eq!(arena.reserve(1000, 12)?, 0);
    assert_eq!(arena.reserve(64, 1)?, 1);
    let slots = (0..12)
        .map(|_| arena.alloc(1000))
        .collect::<Result<Vec<_>, _>>()?;
    assert_eq!(
        arena.stats().chunks,
        4,
        "12 reserved slots came from reserved chunks"
    );
    assert_disjoint(&slots);
    // Freed slots count as available: reserving them again carves nothing.
    drop(slots);
    assert_eq!(arena.reserve(1000, 12)?, 0);
    assert_eq!(arena.alloc(1000)?.len(), 1000);
    assert_eq!(arena.stats().chunks, 4);
    Ok(())
}

#[test]
fn reserve_bytes_is_what_reserve_carves_and_reserved_slots_read_zero() -> Result<(), GpuError> {
    // Chunks of 4 slots of 1,024 bytes: 10 slots need 3 chunks of 4,096 bytes.
    let arena = HostArena::heap_with_chunk_bytes(4096);
    assert_eq!(arena.chunk_bytes(1000)?, 4096);
    assert_eq!(arena.reserve_bytes(1000, 10)?, 3 * 4096);
    assert_eq!(arena.stats().chunks, 0, "asking carves nothing");
    assert_eq!(arena.reserve(1000, 10)?, 3);
    assert_eq!(arena.stats().chunk_bytes, 3 * 4096);
    assert_eq!(arena.reserve_bytes(1000, 12)?, 0, "12 slots are there");
    assert_eq!(arena.reserve_bytes(1000, 13)?, 4096);
    // A slot larger than the chunk size gets a chunk of its own.
    assert_eq!(arena.chunk_bytes(10_000)?, 10_048);
    assert_eq!(arena.reserve_bytes(10_000, 2)?, 2 * 10_048);
    // Prefaulted chunks keep reading zero (`host_memory::A4`).
    let slots = (0..12)
        .map(|_| arena.alloc(1000))
        .collect::<Result<Vec<_>, _>>()?;
    assert!(slots.iter().all(|slot| slot.iter().all(|&b| b == 0)));
    assert!(matches!(
        arena.reserve_bytes(0, 1),
        Err(GpuError::EmptyArenaSlot)
    ));
    Ok(())
}

#[test]
fn zero_length_slots_are_refused() {
    let arena = HostArena::heap();
    assert!(matches!(arena.alloc(0), Err(GpuError::EmptyArenaSlot)));
    assert!(matches!(
        arena.alloc(usize::MAX),
        Err(GpuError::SizeOverflow { .. })
    ));
    assert_eq!(arena.stats(), ArenaStats::default());
}

#[test]
fn a2_slots_of_different_classes_do_not_overlap() -> Result<(), GpuError> {
    let arena = HostArena::heap_with_chunk_bytes(1024);
    let mut slots = Vec::new();
    for (i, len) in [1, 64, 65, 200, 1, 128, 1500, 64, 3]
        .into_iter()
        .enumerate()
    {
        let mut slot = arena.alloc(len)?;
        slot.fill(u8::try_from(i).unwrap_or(0));
        slots.push(slot);
    }
    assert_disjoint(&slots);
    for (i, slot) in slots.iter().enumerate() {
        assert!(
            slot.iter().all(|&b| usize::from(b) == i),
            "slot {i} changed"
        );
    }
    Ok(())
}

#[test]
fn a_freed_slot_is_reused_before_a_chunk_is_carved() -> Result<(), GpuError> {
    let arena = HostArena::heap_with_chunk_bytes(256);
    let mut first = arena.alloc(64)?;
    first.fill(9);
    let address = first.as_ptr().addr();
    let stats = arena.stats();
    drop(first);
    let again = arena.alloc(60)?;
    assert_eq!(again.as_ptr().addr(), address);
    assert!(
        again.iter().all(|&b| b == 9),
        "A4: a reused slot keeps old bytes"
    );
    assert_eq!(arena.stats(), stats);
    Ok(())
}

#[test]
fn chunks_grow_only_when_a_class_is_full() -> Result<(), GpuError> {
    let arena = HostArena::heap_with_chunk_bytes(256); // 4 slots of 64 bytes
    let held: Vec<HostSlot> = (0..4).map(|_| arena.alloc(64)).collect::<Result<_, _>>()?;
    assert_eq!(arena.stats().chunks, 1);
    assert_eq!(arena.stats().free_slots, 0);
    let big = arena.alloc(200)?; // another class: its own chunk (1 slot of 256)
    assert_eq!(arena.stats().chunks, 2);
    let fifth = arena.alloc(1)?;
    let stats = arena.stats();
    assert_eq!(stats.chunks, 3);
    assert_eq!(stats.chunk_bytes, 3 * 256);
    assert_eq!((stats.live_slots, stats.free_slots), (6, 3));
    drop((held, big, fifth));
    assert_eq!(arena.stats().live_slots, 0);
    assert_eq!(arena.stats().free_slots, 9);
    Ok(())
}

#[test]
fn a_chunk_holds_at_least_one_oversized_slot() -> Result<(), GpuError> {
    let arena = HostArena::heap_with_chunk_bytes(128);
    let slot = arena.alloc(1000)?;
    assert_eq!(arena.stats().chunk_bytes, 1024);
    assert_eq!(slot.len(), 1000);
    Ok(())
}

#[test]
fn a_shared_slot_outlives_the_arena_handle_a1() -> Result<(), GpuError> {
    let arena = HostArena::heap_with_chunk_bytes(4096);
    let mut slot = arena.alloc(10)?;
    slot.copy_from_slice(b"0123456789");
    let shared = slot.share();
    let probe = shared.clone();
    drop(arena);
    drop(shared);
    assert_eq!(&probe[..], b"0123456789");
    assert!(format!("{probe:?}").contains("len: 10"));
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free(usize),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..300).prop_map(Op::Alloc),
        2 => (0usize..64).prop_map(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, rng_seed: proptest::test_runner::RngSeed::Fixed(0x6172_656e), ..ProptestConfig::default() })]

    /// Random alloc/free sequences: live slots never overlap (`host_memory::A2`), keep their bytes,
    /// are aligned (`host_memory::A5`), and the counts add up (`host_memory::A6`).
    #[test]
    fn random_allocs_and_frees_keep_the_invariants(ops in prop::collection::vec(arb_op(), 1..120)) {
        let arena = HostArena::heap_with_chunk_bytes(512);
        let mut live: Vec<(HostSlot, u8)> = Vec::new();
        let mut stamp = 0u8;
        for op in ops {
            match op {
                Op::Alloc(len) => {
                    let mut slot = arena.alloc(len).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    stamp = stamp.wrapping_add(1);
                    slot.fill(stamp);
                    prop_assert_eq!(slot.len(), len);
                    prop_assert_eq!(slot.as_ptr().addr() % SLOT_ALIGN, 0);
                    live.push((slot, stamp));
                }
                Op::Free(i) => {
                    if !live.is_empty() {
                        let index = i % live.len();
                        live.swap_remove(index);
                    }
                }
            }
            let slots: Vec<&HostSlot> = live.iter().map(|(slot, _)| slot).collect();
            let mut ranges: Vec<(usize, usize)> = slots.iter().map(|s| class_range(s)).collect();
            ranges.sort_unstable();
            for pair in ranges.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "A2: {:?} overlap", pair);
            }
            for (slot, stamp) in &live {
                prop_assert!(slot.iter().all(|b| b == stamp));
            }
            let stats = arena.stats();
            prop_assert_eq!(stats.live_slots, live.len());
            let state = arena.inner.state.lock();
            let ready: usize = state.classes.values().map(|class| {
                class.free.len() + class.fresh.iter().map(|run| run.slots - run.next).sum::<usize>()
            }).sum();
            prop_assert_eq!(ready, stats.free_slots);
            let chunk_slots: usize = state.chunks.iter().map(|c| c.bytes / c.class_bytes).sum();
            prop_assert_eq!(chunk_slots, stats.live_slots + stats.free_slots, "A6");
            let chunk_bytes: usize = state.chunks.iter().map(|c| c.bytes).sum();
            prop_assert_eq!(chunk_bytes, stats.chunk_bytes);
        }
    }
}
