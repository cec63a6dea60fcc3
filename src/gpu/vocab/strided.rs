//! Strided runs: consecutive page copies that one 2D copy can move (one DMA descriptor
//! instead of one per page).
//!
//! A checked submission moves one page per copy. When consecutive copies have the same
//! length and both their host and their device addresses advance by a constant stride
//! (fresh pool objects saved in order sit in consecutive arena slots, staging slots are
//! equally spaced, and engines allocate pages in runs), the CUDA backend issues the run as
//! one `cuMemcpy2DAsync` with those strides as pitches.
//!
//! Invariants:
//! - `strided::T1`. Runs cover the copies in order, each exactly once.
//! - `strided::T2`. Within a run of two or more, every copy has the run's length, and copy `i` of
//!   the run is at `host + i * host_stride` and `device + i * device_stride`, both strides at least
//!   the length (so rows never overlap).
//! - `strided::T3`. The host stride exceeds the length by at most [`MAX_HOST_GAP`]: rows sit next
//!   to each other in one host allocation (the driver refuses a 2D copy whose host rows span
//!   separate pinned allocations).

/// Most bytes between the end of one host row and the start of the next (`strided::T3`): room for
/// an object header and slot rounding, far less than the gap between separate allocations.
pub(crate) const MAX_HOST_GAP: u64 = 4096;

/// One run: `count` copies from index `first`, `len` bytes each, strides between rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StridedRun {
    /// Index of the run's first copy.
    pub(crate) first: usize,
    /// Copies in the run (at least 1).
    pub(crate) count: usize,
    /// Host address step between rows (0 for a single copy).
    pub(crate) host_stride: u64,
    /// Device address step between rows (0 for a single copy).
    pub(crate) device_stride: u64,
}

/// Splits `copies` (host address, device address, length), in order, into strided runs
/// (`strided::T1`, `strided::T2`).
pub(crate) fn strided_runs(copies: &[(u64, u64, usize)]) -> Vec<StridedRun> {
    let mut runs: Vec<StridedRun> = Vec::new();
    for (index, &(host, device, len)) in copies.iter().enumerate() {
        if let Some(run) = runs.last_mut() {
            let (first_host, first_device, first_len) = copies[run.first];
            let continues = len == first_len
                && if run.count == 1 {
                    stride(first_host, host, len)
                        .filter(|&step| step - len as u64 <= MAX_HOST_GAP)
                        .zip(stride(first_device, device, len))
                        .is_some()
                } else {
                    let rows = run.count as u64;
                    Some(host) == first_host.checked_add(rows * run.host_stride)
                        && Some(device) == first_device.checked_add(rows * run.device_stride)
                };
            if continues {
                if run.count == 1 {
                    run.host_stride = host - first_host;
                    run.device_stride = device - first_device;
                }
                run.count += 1;
                continue;
            }
        }
        runs.push(StridedRun {
            first: index,
            count: 1,
            host_stride: 0,
            device_stride: 0,
        });
    }
    runs
}

/// `to - from` when it is at least `len` (rows of `len` bytes then never overlap).
fn stride(from: u64, to: u64, len: usize) -> Option<u64> {
    to.checked_sub(from).filter(|&step| step >= len as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn equally_spaced_copies_make_one_run() {
        let copies: Vec<_> = (0..4_u64)
            .map(|i| (1000 + i * 80, 50_000 + i * 64, 64))
            .collect();
        assert_eq!(
            strided_runs(&copies),
            vec![StridedRun {
                first: 0,
                count: 4,
                host_stride: 80,
                device_stride: 64
            }]
        );
    }

    #[test]
    fn a_break_in_either_stride_or_the_length_starts_a_new_run() {
        let copies = [
            (0, 0, 8),
            (16, 8, 8),
            (32, 16, 8),
            (48, 40, 8), // device jumps
            (64, 48, 8),
            (80, 56, 4), // length changes
            (80, 0, 4),  // host goes back: no negative strides
        ];
        let runs = strided_runs(&copies);
        let shape: Vec<(usize, usize)> = runs.iter().map(|run| (run.first, run.count)).collect();
        assert_eq!(shape, vec![(0, 3), (3, 2), (5, 1), (6, 1)]);
    }

    #[test]
    fn host_rows_far_apart_are_not_merged_t3() {
        let far = 64 + MAX_HOST_GAP + 1;
        assert_eq!(strided_runs(&[(0, 0, 64), (far, 64, 64)]).len(), 2);
        assert_eq!(
            strided_runs(&[(0, 0, 64), (64 + MAX_HOST_GAP, 64, 64)]).len(),
            1
        );
    }

    #[test]
    fn overlapping_rows_are_never_merged() {
        // A step smaller than the length would make rows overlap.
        let runs = strided_runs(&[(0, 0, 16), (8, 16, 16)]);
        assert_eq!(runs.len(), 2);
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5772_1de0),
            ..proptest::test_runner::Config::default()
        })]
        /// `strided::T1` and `strided::T2` for arbitrary copy lists.
        #[test]
        fn runs_cover_every_copy_in_order_with_exact_addresses(
            copies in prop::collection::vec((0_u64..4096, 0_u64..4096, 1_usize..64), 0..40)
        ) {
            let runs = strided_runs(&copies);
            let mut next = 0;
            for run in &runs {
                prop_assert_eq!(run.first, next);
                prop_assert!(run.count >= 1);
                let (host, device, len) = copies[run.first];
                for row in 0..run.count {
                    let copy = copies[run.first + row];
                    prop_assert_eq!(copy.2, len);
                    prop_assert_eq!(copy.0, host + row as u64 * run.host_stride);
                    prop_assert_eq!(copy.1, device + row as u64 * run.device_stride);
                }
                if run.count > 1 {
                    prop_assert!(run.host_stride >= len as u64 && run.device_stride >= len as u64);
                    prop_assert!(run.host_stride - len as u64 <= MAX_HOST_GAP);
                }
                next += run.count;
            }
            prop_assert_eq!(next, copies.len());
        }
    }
}
