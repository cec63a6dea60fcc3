//! Page pools: the device's page address space, one pool of equal-sized pages per layer
//! group (`docs/DESIGN.md` section 1, "Page").
//!
//! Workflow:
//! 1. The caller describes each group's pool with a [`PagePoolSpec`] (page size from the
//!    layout, R6; page count from the engine's cache size).
//! 2. [`PageGeometry::new`] validates the specs once, when the device opens.
//! 3. Backends allocate memory in the geometry's pool order, and every page access or copy
//!    is resolved and bounds-checked through [`PageGeometry::locate`] before a byte moves.
//!
//! Invariants:
//! - `pages::P1`. Every group has at most one pool.
//! - `pages::P2`. `page_bytes >= 1` and `num_pages >= 1` for every pool.
//! - `pages::P3`. `page_bytes * num_pages` fits in `usize` for every pool, so byte offsets computed
//!   from a checked page index never overflow.

use crate::core::layout::GroupId;

use super::error::GpuError;

/// How much device page memory one layer group gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagePoolSpec {
    /// The layer group the pages belong to.
    pub group: GroupId,
    /// Bytes of one page: one block of every layer of the group on this rank.
    pub page_bytes: usize,
    /// Pages in the pool, addressed `0..num_pages`.
    pub num_pages: u32,
}

impl PagePoolSpec {
    /// Bytes of the whole pool, or `None` if that does not fit in `usize`.
    pub fn pool_bytes(&self) -> Option<usize> {
        self.page_bytes.checked_mul(self.num_pages as usize)
    }

    /// Byte offset of `page` inside the pool. The caller has checked `page < num_pages`.
    pub(crate) fn page_offset(&self, page: u32) -> usize {
        debug_assert!(
            page < self.num_pages,
            "pages::P3 needs a checked page index"
        );
        page as usize * self.page_bytes
    }
}

/// The validated set of page pools of one device (`pages::P1`..P3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageGeometry {
    /// Sorted by group, so lookups are a binary search and the order is stable.
    pools: Vec<PagePoolSpec>,
}

impl PageGeometry {
    /// Validates `specs` and sorts them by group.
    ///
    /// # Errors
    /// [`GpuError::NoPagePools`] for an empty list, [`GpuError::DuplicateGroup`] (`pages::P1`),
    /// [`GpuError::EmptyPagePool`] (`pages::P2`), [`GpuError::SizeOverflow`] (`pages::P3`).
    pub fn new(specs: &[PagePoolSpec]) -> Result<Self, GpuError> {
        if specs.is_empty() {
            return Err(GpuError::NoPagePools);
        }
        let mut pools = specs.to_vec();
        pools.sort_by_key(|spec| spec.group);
        for pair in pools.windows(2) {
            if pair[0].group == pair[1].group {
                return Err(GpuError::DuplicateGroup {
                    group: pair[0].group,
                });
            }
        }
        for spec in &pools {
            if spec.page_bytes == 0 || spec.num_pages == 0 {
                return Err(GpuError::EmptyPagePool {
                    group: spec.group,
                    page_bytes: spec.page_bytes,
                    num_pages: spec.num_pages,
                });
            }
            if spec.pool_bytes().is_none() {
                return Err(GpuError::SizeOverflow {
                    what: "page pool",
                    count: spec.num_pages,
                    unit_bytes: spec.page_bytes,
                });
            }
        }
        Ok(Self { pools })
    }

    /// The pools, sorted by group. Backends allocate in this order.
    pub fn pools(&self) -> &[PagePoolSpec] {
        &self.pools
    }

    /// The pool of `group`.
    ///
    /// # Errors
    /// [`GpuError::UnknownGroup`] if the device has no pool for `group`.
    pub fn pool(&self, group: GroupId) -> Result<PagePoolSpec, GpuError> {
        self.index_of(group).map(|index| self.pools[index])
    }

    /// Checks that `page` exists in `group` and returns the pool's position in
    /// [`pools`](Self::pools) and its spec.
    ///
    /// # Errors
    /// [`GpuError::UnknownGroup`], or [`GpuError::PageOutOfRange`] if
    /// `page >= num_pages`.
    pub fn locate(&self, group: GroupId, page: u32) -> Result<(usize, PagePoolSpec), GpuError> {
        let index = self.index_of(group)?;
        let spec = self.pools[index];
        if page >= spec.num_pages {
            return Err(GpuError::PageOutOfRange {
                group,
                page,
                num_pages: spec.num_pages,
            });
        }
        Ok((index, spec))
    }

    /// The position of `group`'s pool in [`pools`](Self::pools).
    ///
    /// # Errors
    /// [`GpuError::UnknownGroup`] if the device has no pool for `group`.
    pub fn index_of(&self, group: GroupId) -> Result<usize, GpuError> {
        self.pools
            .binary_search_by_key(&group, |spec| spec.group)
            .map_err(|_| GpuError::UnknownGroup { group })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(group: u32, page_bytes: usize, num_pages: u32) -> PagePoolSpec {
        PagePoolSpec {
            group: GroupId(group),
            page_bytes,
            num_pages,
        }
    }

    #[test]
    fn pools_are_sorted_by_group_and_located() -> Result<(), GpuError> {
        let geometry = PageGeometry::new(&[spec(7, 16, 2), spec(1, 8, 4)])?;
        let groups: Vec<u32> = geometry.pools().iter().map(|s| s.group.0).collect();
        assert_eq!(groups, vec![1, 7]);
        assert_eq!(geometry.locate(GroupId(7), 1)?, (1, spec(7, 16, 2)));
        assert_eq!(geometry.pool(GroupId(1))?.page_offset(3), 24);
        Ok(())
    }

    #[test]
    fn p1_duplicate_group_is_rejected() {
        let err = PageGeometry::new(&[spec(2, 8, 1), spec(2, 8, 1)]).unwrap_err();
        assert!(
            matches!(err, GpuError::DuplicateGroup { group: GroupId(2) }),
            "{err}"
        );
    }

    #[test]
    fn p2_empty_pools_are_rejected() {
        for bad in [spec(0, 0, 4), spec(0, 8, 0)] {
            let err = PageGeometry::new(&[bad]).unwrap_err();
            assert_eq!(err.kind(), "empty_page_pool");
        }
        assert!(matches!(PageGeometry::new(&[]), Err(GpuError::NoPagePools)));
    }

    #[test]
    fn p3_pool_size_overflow_is_rejected() {
        let err = PageGeometry::new(&[spec(0, usize::MAX / 2, 3)]).unwrap_err();
        assert_eq!(err.kind(), "size_overflow");
    }

    #[test]
    fn unknown_group_and_page_out_of_range() -> Result<(), GpuError> {
        let geometry = PageGeometry::new(&[spec(0, 8, 4)])?;
        assert!(matches!(
            geometry.locate(GroupId(1), 0),
            Err(GpuError::UnknownGroup { group: GroupId(1) })
        ));
        assert!(matches!(
            geometry.locate(GroupId(0), 4),
            Err(GpuError::PageOutOfRange {
                page: 4,
                num_pages: 4,
                ..
            })
        ));
        Ok(())
    }
}
