//! Registered memory: which caller buffers Mooncake may read and write directly, the
//! fallback buffer that other caller buffers are staged through, and how a batch is cut
//! into calls.
//!
//! Mooncake transfers only from and into memory registered with the client
//! (`register_buffer`; over RDMA it is the NIC's memory registration). Loaders and the
//! saver register their staging pools once, so their slots go straight to Mooncake. Any
//! other buffer (a test's `Vec`, a one-off read) is copied through [`FallbackStaging`]:
//! correct, one extra copy, and serialised on the fallback buffer's lock.
//!
//! # Invariants
//!
//! - `mooncake::staging::I1`. A caller buffer goes to Mooncake directly only if it lies wholly
//!   inside one registered region ([`Regions::contains`]).
//! - `mooncake::staging::I2`. A round ([`plan_rounds`]) has at most `max_keys` items, and the
//!   staged items of a round occupy disjoint, 64-byte-aligned ranges of the fallback buffer, each
//!   inside it.
//! - `mooncake::staging::I3`. Items keep their order: rounds list item indices in increasing order.

use parking_lot::RwLock;

use crate::gpu::StagingPool;

/// Alignment of staged items inside the fallback buffer.
const STAGING_ALIGN: usize = 64;
/// Alignment of the fallback buffer itself.
const PAGE_BYTES: usize = 4096;

/// Registered regions of one client, as `(start, len)`.
#[derive(Debug, Default)]
pub(crate) struct Regions {
    list: RwLock<Vec<(usize, usize)>>,
}

impl Regions {
    /// Records a registered region.
    pub(crate) fn add(&self, start: usize, len: usize) {
        self.list.write().push((start, len));
    }

    /// Forgets the region starting at `start`; whether there was one.
    pub(crate) fn remove(&self, start: usize) -> bool {
        let mut list = self.list.write();
        let before = list.len();
        list.retain(|&(region_start, _)| region_start != start);
        list.len() != before
    }

    /// How many regions are registered.
    pub(crate) fn len(&self) -> usize {
        self.list.read().len()
    }

    /// Start addresses of the registered regions that share a byte with
    /// `[start, start + len)`.
    pub(crate) fn overlapping(&self, start: usize, len: usize) -> Vec<usize> {
        let end = start.saturating_add(len);
        self.list
            .read()
            .iter()
            .filter(|&&(region_start, region_len)| {
                len != 0 && region_start < end && start < region_start.saturating_add(region_len)
            })
            .map(|&(region_start, _)| region_start)
            .collect()
    }

    /// Whether `[start, start + len)` lies inside one registered region (`mooncake::staging::I1`).
    pub(crate) fn contains(&self, start: usize, len: usize) -> bool {
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        self.list.read().iter().any(|&(region_start, region_len)| {
            start >= region_start && end <= region_start.saturating_add(region_len)
        })
    }
}

/// A registered buffer that unregistered caller buffers are copied through: heap memory,
/// or a dummy client's shared memory (`shared.rs`), where Mooncake moves data only. Its
/// usable part starts on a page boundary: transfers into a buffer at a 16-byte offset
/// (plain `malloc`) measured about 40% slower than into a page-aligned one.
pub(crate) struct FallbackStaging {
    memory: FallbackMemory,
    /// Offset of the first page boundary in the memory.
    start: usize,
    /// Usable bytes from `start`.
    len: usize,
}

/// Where a fallback buffer's bytes live.
enum FallbackMemory {
    Heap(Box<[u8]>),
    /// A one-slot staging pool over leased shared memory.
    Lent(StagingPool),
}

impl FallbackStaging {
    /// A zeroed heap buffer of `len` usable, page-aligned bytes (not yet registered).
    pub(crate) fn new(len: usize) -> Self {
        Self::over(len, FallbackMemory::Heap(vec![0u8; len + PAGE_BYTES].into_boxed_slice()))
    }

    /// A buffer of all of `memory`, `len` bytes of a dummy client's shared memory (not yet
    /// registered). It starts where the lease does: a dummy client registers only whole
    /// leases, which Mooncake's pool hands out page-aligned.
    pub(crate) fn lent(len: usize, memory: StagingPool) -> Self {
        Self {
            memory: FallbackMemory::Lent(memory),
            start: 0,
            len,
        }
    }

    fn over(len: usize, mut memory: FallbackMemory) -> Self {
        let bytes = Self::bytes(&mut memory);
        let start = bytes.as_ptr().align_offset(PAGE_BYTES).min(PAGE_BYTES);
        Self { memory, start, len }
    }

    fn bytes(memory: &mut FallbackMemory) -> &mut [u8] {
        match memory {
            FallbackMemory::Heap(bytes) => bytes,
            FallbackMemory::Lent(pool) => pool.bytes_mut(),
        }
    }

    /// Its usable size.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Its page-aligned start address, for `register_buffer` and the calls.
    pub(crate) fn addr(&mut self) -> usize {
        let start = self.start;
        Self::bytes(&mut self.memory)[start..].as_mut_ptr().addr()
    }

    /// The staged range `[offset, offset + len)` of the usable part.
    pub(crate) fn range_mut(&mut self, offset: usize, len: usize) -> &mut [u8] {
        let from = self.start + offset;
        &mut Self::bytes(&mut self.memory)[from..from + len]
    }
}

/// Where one item of a round goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Index of the item in the batch.
    pub item: usize,
    /// Offset in the fallback buffer, or `None` for a direct (registered) buffer.
    pub staging_offset: Option<usize>,
}

/// Cuts items (given by length and whether they need staging) into calls: at most `max_keys` items
/// each, staged items packed into `staging_len` bytes (`mooncake::staging::I2`,
/// `mooncake::staging::I3`). Every staged item must fit `staging_len` alone (the caller grows the
/// buffer first).
pub(crate) fn plan_rounds(
    items: &[(usize, bool)],
    max_keys: usize,
    staging_len: usize,
) -> Vec<Vec<Slot>> {
    let max_keys = max_keys.max(1);
    let mut rounds: Vec<Vec<Slot>> = Vec::new();
    let mut round: Vec<Slot> = Vec::new();
    let mut used = 0usize;
    for (item, &(len, staged)) in items.iter().enumerate() {
        let offset = used.next_multiple_of(STAGING_ALIGN);
        let fits = !staged || offset.saturating_add(len) <= staging_len;
        if !round.is_empty() && (round.len() == max_keys || !fits) {
            rounds.push(std::mem::take(&mut round));
            used = 0;
        }
        let staging_offset = staged.then(|| {
            let offset = used.next_multiple_of(STAGING_ALIGN);
            used = offset + len;
            offset
        });
        round.push(Slot {
            item,
            staging_offset,
        });
    }
    if !round.is_empty() {
        rounds.push(round);
    }
    rounds
}

/// The fallback size that fits every staged item: at least `configured`, and the largest
/// staged item rounded up to a power of two.
pub(crate) fn staging_len_for(items: &[(usize, bool)], configured: usize) -> usize {
    let largest = items
        .iter()
        .filter(|(_, staged)| *staged)
        .map(|(len, _)| *len)
        .max()
        .unwrap_or(0);
    configured.max(largest.next_power_of_two())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn regions_contain_only_whole_ranges() {
        let regions = Regions::default();
        regions.add(1000, 100);
        assert!(regions.contains(1000, 100));
        assert!(regions.contains(1050, 50));
        assert!(!regions.contains(1050, 51), "runs past the end");
        assert!(!regions.contains(999, 2), "starts before");
        assert!(!regions.contains(usize::MAX, 2), "overflow is outside");
        assert!(regions.remove(1000));
        assert!(!regions.contains(1000, 1));
        assert!(!regions.remove(1000));
    }

    #[test]
    fn overlapping_finds_regions_sharing_a_byte_only() {
        let regions = Regions::default();
        regions.add(1000, 100);
        regions.add(2000, 100);
        assert_eq!(regions.overlapping(1000, 100), [1000]);
        assert_eq!(regions.overlapping(1099, 902), [1000, 2000]);
        assert!(regions.overlapping(1100, 900).is_empty(), "touching ends");
        assert!(regions.overlapping(900, 100).is_empty());
        assert!(regions.overlapping(1050, 0).is_empty(), "an empty range");
    }

    #[test]
    fn direct_items_split_only_at_max_keys() {
        let items = vec![(1 << 20, false); 2500];
        let rounds = plan_rounds(&items, 1024, 0);
        let sizes: Vec<usize> = rounds.iter().map(Vec::len).collect();
        assert_eq!(sizes, [1024, 1024, 452]);
    }

    #[test]
    fn staged_items_start_a_new_round_when_the_buffer_is_full() {
        let items = [(40, true), (40, true), (10, false), (40, true)];
        let rounds = plan_rounds(&items, 10, 128);
        assert_eq!(rounds.len(), 2);
        assert_eq!(rounds[0][1].staging_offset, Some(64));
        assert_eq!(rounds[0][2].staging_offset, None);
        assert_eq!(
            rounds[1][0],
            Slot {
                item: 3,
                staging_offset: Some(0)
            }
        );
    }

    #[test]
    fn the_fallback_buffer_starts_on_a_page_and_keeps_its_length() {
        let mut staging = FallbackStaging::new(10_000);
        assert_eq!(staging.addr() % PAGE_BYTES, 0);
        assert_eq!(staging.len(), 10_000);
        staging.range_mut(9_990, 10).fill(7);
        assert_eq!(staging.range_mut(9_990, 10), &[7; 10]);
    }

    #[test]
    fn staging_len_grows_to_the_largest_staged_item() {
        assert_eq!(
            staging_len_for(&[(5000, true), (1 << 30, false)], 1024),
            8192
        );
        assert_eq!(staging_len_for(&[(10, true)], 1024), 1024);
        assert_eq!(staging_len_for(&[], 1024), 1024);
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x6d6f_6f6e),
            ..ProptestConfig::default()
        })]

        /// `mooncake::staging::I2` and `mooncake::staging::I3` on random batches.
        #[test]
        fn rounds_keep_order_bounds_and_disjoint_staging(
            items in prop::collection::vec((0usize..5000, any::<bool>()), 0..200),
            max_keys in 1usize..40,
            configured in 1usize..20_000,
        ) {
            let staging_len = staging_len_for(&items, configured);
            let rounds = plan_rounds(&items, max_keys, staging_len);
            let order: Vec<usize> = rounds.iter().flatten().map(|slot| slot.item).collect();
            prop_assert_eq!(order, (0..items.len()).collect::<Vec<_>>());
            for round in &rounds {
                prop_assert!(!round.is_empty() && round.len() <= max_keys);
                let mut ranges: Vec<(usize, usize)> = round
                    .iter()
                    .filter_map(|slot| slot.staging_offset.map(|offset| (offset, offset + items[slot.item].0)))
                    .collect();
                ranges.sort_unstable();
                for (start, end) in &ranges {
                    prop_assert_eq!(start % STAGING_ALIGN, 0);
                    prop_assert!(*end <= staging_len);
                }
                for pair in ranges.windows(2) {
                    prop_assert!(pair[0].1 <= pair[1].0, "overlap {:?}", pair);
                }
            }
            for slot in rounds.iter().flatten() {
                prop_assert_eq!(slot.staging_offset.is_some(), items[slot.item].1);
            }
        }
    }
}
