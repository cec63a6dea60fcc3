//! The shape of a staging pool: [`StagingGeometry`], slot size and slot count, validated
//! once (R23). The pool itself (the memory) is the front's `StagingPool`; plans and
//! backends need only the shape.
//!
//! Slot `i` covers bytes `i * slot_bytes .. (i + 1) * slot_bytes` of one contiguous buffer,
//! which is what lets copies of neighbouring slots coalesce (`copy.rs`).
//!
//! Invariants:
//! - `staging::S1`. `slot_bytes >= 1`, `slots >= 1`, and `slot_bytes * slots` fits in `usize`.

use std::ops::Range;

use super::error::GpuError;

/// The shape of a staging pool: slot size and slot count (`staging::S1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StagingGeometry {
    slot_bytes: usize,
    slots: u32,
}

impl StagingGeometry {
    /// Validates a staging shape.
    ///
    /// # Errors
    /// [`GpuError::EmptyStagingPool`] when either number is zero, [`GpuError::SizeOverflow`]
    /// when the total does not fit in `usize` (`staging::S1`).
    pub fn new(slot_bytes: usize, slots: u32) -> Result<Self, GpuError> {
        if slot_bytes == 0 || slots == 0 {
            return Err(GpuError::EmptyStagingPool { slot_bytes, slots });
        }
        if slot_bytes.checked_mul(slots as usize).is_none() {
            return Err(GpuError::SizeOverflow {
                what: "staging pool",
                count: slots,
                unit_bytes: slot_bytes,
            });
        }
        Ok(Self { slot_bytes, slots })
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes of the whole pool (fits by `staging::S1`).
    pub fn total_bytes(&self) -> usize {
        self.slot_bytes * self.slots as usize
    }

    /// The byte range of `slot` inside the pool's buffer.
    ///
    /// # Errors
    /// [`GpuError::StagingSlotOutOfRange`] if `slot >= slots`.
    pub fn slot_range(&self, slot: u32) -> Result<Range<usize>, GpuError> {
        if slot >= self.slots {
            return Err(GpuError::StagingSlotOutOfRange {
                slot,
                slots: self.slots,
            });
        }
        let start = slot as usize * self.slot_bytes;
        Ok(start..start + self.slot_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s1_empty_and_overflowing_shapes_are_rejected() {
        assert_eq!(
            StagingGeometry::new(0, 4).unwrap_err().kind(),
            "empty_staging_pool"
        );
        assert_eq!(
            StagingGeometry::new(4, 0).unwrap_err().kind(),
            "empty_staging_pool"
        );
        assert_eq!(
            StagingGeometry::new(usize::MAX, 2).unwrap_err().kind(),
            "size_overflow"
        );
    }
}
