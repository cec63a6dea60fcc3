//! How one rank's load is shared among that rank's loaders (R23, R24).
//!
//! A loader moves its pages in batches, each a pool call then a device copy, one after the
//! other on its own thread. When a pool copies into staging (Mooncake), the loader's copy
//! of one batch does not overlap its next pool call. A large load is cut into contiguous
//! parts, one for each loader of the rank. Each loader then runs its pool calls and copies
//! beside the other's, with its own staging pool and stream. The reservation manager
//! reports the load finished once every part has answered, and failed if any part failed.
//!
//! A small load stays whole. Each part costs at least one pool call and one device
//! submission of its own, so a part gets at least [`LOAD_PART_MIN_PAGES`] pages.
//!
//! ## Invariants
//!
//! - `load_parts::D1`. The parts cover `0..pages` in order, each starting where the one
//!   before ended. A load of no pages is one empty part, so every rank still answers.
//! - `load_parts::D2`. There are at most `loaders` parts (at least one). A load is cut only
//!   where every part gets at least `min_part` pages, and the parts' sizes differ by at most
//!   one page.

use std::ops::Range;

/// Fewest pages a part of a shared load gets: fewer than a quarter of a lent batch
/// (`transfer::LENT_BATCH_PAGES`) would add a pool call and a device submission for a copy
/// of tens of milliseconds at most.
pub const LOAD_PART_MIN_PAGES: usize = 64;

/// The parts of a load of `pages` pages among `loaders` loaders (module docs).
pub fn load_parts(pages: usize, loaders: usize, min_part: usize) -> Vec<Range<usize>> {
    let count = (pages / min_part.max(1)).clamp(1, loaders.max(1));
    let (size, longer) = (pages / count, pages % count);
    let mut start = 0;
    (0..count)
        .map(|part| {
            let end = start + size + usize::from(part < longer);
            let range = start..end;
            start = end;
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_small_load_stays_whole_and_a_large_one_is_halved() {
        assert_eq!(load_parts(0, 2, 64), vec![0..0]);
        assert_eq!(load_parts(127, 2, 64), vec![0..127]);
        assert_eq!(load_parts(128, 2, 64), vec![0..64, 64..128]);
        assert_eq!(load_parts(301, 2, 64), vec![0..151, 151..301]);
        assert_eq!(load_parts(301, 1, 64), vec![0..301]);
        assert_eq!(load_parts(200, 4, 64), vec![0..67, 67..134, 134..200]);
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x10ad_9a27),
            ..proptest::test_runner::Config::default()
        })]
        #[test]
        fn parts_cover_the_load_in_order_d1_d2(
            pages in 0_usize..5_000,
            loaders in 0_usize..9,
            min_part in 0_usize..300,
        ) {
            let parts = load_parts(pages, loaders, min_part);
            prop_assert!(!parts.is_empty() && parts.len() <= loaders.max(1));
            prop_assert_eq!(parts[0].start, 0);
            prop_assert_eq!(parts[parts.len() - 1].end, pages);
            for pair in parts.windows(2) {
                prop_assert_eq!(pair[0].end, pair[1].start);
            }
            let sizes: Vec<usize> = parts.iter().map(ExactSizeIterator::len).collect();
            let (least, most) = (sizes.iter().min(), sizes.iter().max());
            prop_assert!(most.zip(least).is_some_and(|(most, least)| most - least <= 1));
            if parts.len() > 1 {
                prop_assert!(sizes.iter().all(|&size| size >= min_part));
            }
            // Cut wherever the parts could all hold `min_part` pages and a loader is free.
            let could_cut = loaders > 1 && pages >= 2 * min_part.max(1);
            prop_assert_eq!(parts.len() > 1, could_cut);
        }
    }
}
