//! The pool eviction model: Mooncake Store's master eviction, as pure code
//! (`docs/DESIGN.md` section 10).
//!
//! No locks, no clocks: the caller passes the time (`now_ms`) and the pool's state in, and
//! gets back which objects to evict, in eviction order. The embedded memory pool
//! (`pool::memory`, a layer up) applies the plan under its lock; the replay simulator and the
//! tests can call it directly.
//!
//! # What Mooncake does
//!
//! From `mooncake-store` (`include/types.h`, `src/master_service.cpp`, kvcache-ai/Mooncake):
//!
//! - Defaults: `eviction_high_watermark_ratio = 0.95`, `eviction_ratio = 0.05`,
//!   `default_kv_lease_ttl = 5000` ms (the constants [`MOONCAKE_EVICTION_HIGH_WATERMARK_RATIO`],
//!   [`MOONCAKE_EVICTION_RATIO`], [`MOONCAKE_KV_LEASE_TTL_MS`]), as in the `types.h` of the
//!   releases the wheel ships; newer sources moved to 0.90 and 10 s. Both ratios are checked
//!   to lie in `[0, 1]` at start. `config/default.toml` uses the same ratios and a shorter
//!   lease (2000 ms, `pool.kv_lease_ttl_ms`).
//! - Leases: an existence check or a replica lookup (a get) sets the object's lease timeout to
//!   `max(lease_timeout, now + ttl)`. A put grants no lease: a new object's lease timeout is
//!   the clock's epoch. An object whose lease has not expired is never evicted.
//! - Trigger: a background thread wakes every 10 ms and runs a pass when the memory used
//!   ratio is above the high watermark, or when a put's allocation failed since the last
//!   pass (the put itself fails with "no available handle").
//! - Pass size: `target = max(eviction_ratio, used_ratio - high_watermark + eviction_ratio)`,
//!   as a share of the number of **objects** (not bytes) that hold evictable memory,
//!   rounded up: a pass evicts `ceil(objects * target)` objects, or every candidate if fewer.
//! - Victims: objects with an expired lease, oldest lease timeout first. Since every grant
//!   moves the timeout to `now + ttl`, that is approximately least recently probed or read.
//!
//! # How this model simplifies it
//!
//! 1. Synchronous: the pass runs inside the put that needs it, before the object is stored,
//!    instead of on a background thread. A put that fits after the pass succeeds (Mooncake's
//!    would fail and a retry would succeed). So a pool never exceeds its capacity, even
//!    between passes.
//! 2. The used ratio that sizes a pass is the one the put would leave, capped at 1.
//! 3. Order: least recently *accessed* first, where a put, a probe hit, a get hit and a touch
//!    are accesses, with ties broken by id. Mooncake sorts by lease timeout, in which every
//!    never-read object sits at the epoch and they go first in no set order; we order them by
//!    write time instead, which is deterministic and closer to LRU.
//! 4. A pass that cannot make room for the put (every remaining object leased) evicts
//!    nothing and the put fails with no space; Mooncake evicts what it can and fails the put.
//! 5. Not modelled: soft and hard pins, replicas, the second "lower bound" pass (it only
//!    matters when objects change between Mooncake's census and its eviction, which cannot
//!    happen here), disk offload, tenants.
//!
//! # Workflow
//!
//! 1. [`EvictionPolicy::validate`] once, at start.
//! 2. For each put: [`EvictionPolicy::plan_victims`] with the pool's usage, the incoming size,
//!    the time, and the objects oldest first (lazily; it stops as soon as it has enough), or
//!    [`EvictionPolicy::plan_eviction`] with all entries in any order (it sorts them).
//! 3. Remove the victims, then store the object.
//!
//! # Invariants
//!
//! For a plan returned `Ok` for a put of `incoming` bytes:
//!
//! - `eviction::I1`. Capacity: `used_bytes + incoming - freed_bytes <= capacity_bytes`.
//! - `eviction::I2`. Leases: no victim is under a lease at `now_ms` (`now_ms < lease_expires_ms`).
//! - `eviction::I3`. Order: victims are a prefix of the unleased objects in least recently accessed
//!   order, and are returned in that order.
//! - `eviction::I4`. Pass size: when a pass is triggered, it evicts at least
//!   `min(ceil(objects * eviction_ratio), unleased objects)` objects (counted in objects,
//!   following Mooncake).
//! - `eviction::I5`. No pass, no victims: if `used_bytes + incoming` stays at or below
//!   `high_watermark_ratio * capacity_bytes`, the plan is empty.
//! - `eviction::I6`. Minimal: dropping the last victim would miss the pass size or the room the put
//!   needs.
//!
//! A plan returned `Err` evicts nothing (simplification 4).

use std::cmp::Ordering;

/// Mooncake's default `eviction_high_watermark_ratio` (`include/types.h`).
pub const MOONCAKE_EVICTION_HIGH_WATERMARK_RATIO: f64 = 0.95;
/// Mooncake's default `eviction_ratio` (`include/types.h`).
pub const MOONCAKE_EVICTION_RATIO: f64 = 0.05;
/// Mooncake's default `default_kv_lease_ttl`, in milliseconds (`include/types.h`).
pub const MOONCAKE_KV_LEASE_TTL_MS: u64 = 5_000;

/// A capacity that works as an example in error messages: 16 GiB.
const WORKING_CAPACITY_BYTES: u64 = 16 << 30;

/// When to evict and how much: the pool's capacity, Mooncake's two ratios and lease length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictionPolicy {
    /// Bytes of object payload the pool may hold (keys and bookkeeping are not counted).
    pub capacity_bytes: u64,
    /// A pass starts when a put would leave more than this share of capacity used
    /// (`eviction_high_watermark_ratio`), in `(0, 1]`.
    pub high_watermark_ratio: f64,
    /// The least share of objects a pass evicts (`eviction_ratio`), in `(0, 1]`.
    pub eviction_ratio: f64,
    /// How long a probe or a get protects an object from eviction (`kv_lease_ttl`), in ms.
    /// 0 turns leases off.
    pub lease_ttl_ms: u64,
}

/// Why an [`EvictionPolicy`] was refused by [`EvictionPolicy::validate`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvictionPolicyError {
    /// The pool could hold nothing.
    #[error("pool capacity_bytes must be greater than 0; {working} (16 GiB) works")]
    ZeroCapacity {
        /// A capacity that would be accepted.
        working: u64,
    },
    /// A ratio outside `(0, 1]` (or not a number).
    #[error("pool {key} = {value} is outside (0, 1]; {working} (mooncake's default) works")]
    RatioOutOfRange {
        /// The setting's name, as Mooncake spells it.
        key: &'static str,
        /// The refused value.
        value: f64,
        /// A value that would be accepted.
        working: f64,
    },
}

impl EvictionPolicyError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ZeroCapacity { .. } => "zero_capacity",
            Self::RatioOutOfRange { .. } => "ratio_out_of_range",
        }
    }
}

/// Why a put cannot be made room for. A plan that fails evicts nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EvictionError {
    /// The object alone is larger than the pool.
    #[error("object of {needed_bytes} bytes exceeds pool capacity_bytes = {capacity_bytes}; raise capacity_bytes to at least {needed_bytes}")]
    LargerThanCapacity {
        /// Size of the incoming object.
        needed_bytes: u64,
        /// The pool's capacity.
        capacity_bytes: u64,
    },
    /// Free space plus every unleased object is still too little: the rest is under leases.
    #[error("object of {needed_bytes} bytes does not fit: {available_bytes} of {capacity_bytes} bytes are free or evictable, the rest is under a lease; raise capacity_bytes or lower kv_lease_ttl")]
    Leased {
        /// Size of the incoming object.
        needed_bytes: u64,
        /// Free bytes plus the bytes of every unleased object.
        available_bytes: u64,
        /// The pool's capacity.
        capacity_bytes: u64,
    },
}

impl EvictionError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::LargerThanCapacity { .. } => "larger_than_capacity",
            Self::Leased { .. } => "leased",
        }
    }
}

/// What the pool holds before a put.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Payload bytes stored.
    pub used_bytes: u64,
    /// Objects stored; a pass's size is a share of this (Mooncake counts objects).
    pub objects: usize,
}

/// Why a pass ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionTrigger {
    /// The put would leave usage above the high watermark, but would fit.
    HighWatermark,
    /// The put would not fit without evicting (Mooncake: an allocation failure).
    AllocationFailure,
}

impl EvictionTrigger {
    /// A short, stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HighWatermark => "high_watermark",
            Self::AllocationFailure => "allocation_failure",
        }
    }
}

/// What a pass must achieve: both at least `min_victims` objects and `min_freed_bytes` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictionGoal {
    /// Why the pass runs.
    pub trigger: EvictionTrigger,
    /// `ceil(objects * target)` (`eviction::I4`); fewer only if fewer objects are unleased.
    pub min_victims: usize,
    /// The room the put needs beyond the free space (`eviction::I1`); 0 for a watermark pass.
    pub min_freed_bytes: u64,
}

/// One stored object as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictionEntry<K> {
    /// The caller's identity for the object (a key, an index, a tick).
    pub id: K,
    /// Payload bytes.
    pub size_bytes: u64,
    /// When it was last accessed: any stamp that grows with each access (a tick or ms).
    pub last_access: u64,
    /// The object is leased while `now_ms < lease_expires_ms`; 0 when never leased.
    pub lease_expires_ms: u64,
}

impl<K> EvictionEntry<K> {
    /// Whether the object is under a lease at `now_ms`, and so cannot be evicted (`eviction::I2`).
    pub fn is_leased(&self, now_ms: u64) -> bool {
        now_ms < self.lease_expires_ms
    }
}

/// The objects to evict before a put, in eviction order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionPlan<K> {
    /// Why a pass ran; `None` when no pass was needed (and `victims` is empty, `eviction::I5`).
    pub trigger: Option<EvictionTrigger>,
    /// Ids to evict, least recently accessed first (`eviction::I3`).
    pub victims: Vec<K>,
    /// Sum of the victims' sizes.
    pub freed_bytes: u64,
}

impl<K> EvictionPlan<K> {
    fn none() -> Self {
        Self {
            trigger: None,
            victims: Vec::new(),
            freed_bytes: 0,
        }
    }
}

impl EvictionPolicy {
    /// Mooncake's defaults (0.95, 0.05, 5 s) with the given capacity.
    pub fn mooncake_defaults(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            high_watermark_ratio: MOONCAKE_EVICTION_HIGH_WATERMARK_RATIO,
            eviction_ratio: MOONCAKE_EVICTION_RATIO,
            lease_ttl_ms: MOONCAKE_KV_LEASE_TTL_MS,
        }
    }

    /// Checks the policy can be used.
    ///
    /// # Errors
    ///
    /// [`EvictionPolicyError::ZeroCapacity`] when `capacity_bytes` is 0;
    /// [`EvictionPolicyError::RatioOutOfRange`] when either ratio is outside `(0, 1]` or NaN,
    /// naming the setting and Mooncake's default as a working value.
    pub fn validate(&self) -> Result<(), EvictionPolicyError> {
        if self.capacity_bytes == 0 {
            return Err(EvictionPolicyError::ZeroCapacity {
                working: WORKING_CAPACITY_BYTES,
            });
        }
        check_ratio(
            "eviction_high_watermark_ratio",
            self.high_watermark_ratio,
            MOONCAKE_EVICTION_HIGH_WATERMARK_RATIO,
        )?;
        check_ratio(
            "eviction_ratio",
            self.eviction_ratio,
            MOONCAKE_EVICTION_RATIO,
        )
    }

    /// When a lease granted at `now_ms` ends.
    pub fn lease_expiry_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_add(self.lease_ttl_ms)
    }

    /// Whether a put of `incoming_bytes` onto `usage` needs a pass, and what it must achieve.
    ///
    /// # Errors
    ///
    /// [`EvictionError::LargerThanCapacity`] when the object alone exceeds the capacity.
    pub fn goal(
        &self,
        usage: PoolUsage,
        incoming_bytes: u64,
    ) -> Result<Option<EvictionGoal>, EvictionError> {
        if incoming_bytes > self.capacity_bytes {
            return Err(EvictionError::LargerThanCapacity {
                needed_bytes: incoming_bytes,
                capacity_bytes: self.capacity_bytes,
            });
        }
        let projected = usage.used_bytes.saturating_add(incoming_bytes);
        let capacity = as_f64(self.capacity_bytes);
        let over_capacity = projected > self.capacity_bytes;
        if !over_capacity && as_f64(projected) <= self.high_watermark_ratio * capacity {
            return Ok(None); // `eviction::I5`
        }
        // Mooncake: target = max(ratio, used - watermark + ratio), a share of objects.
        let used_ratio = (as_f64(projected) / capacity).min(1.0);
        let target = (used_ratio - self.high_watermark_ratio + self.eviction_ratio)
            .max(self.eviction_ratio)
            .min(1.0);
        Ok(Some(EvictionGoal {
            trigger: if over_capacity {
                EvictionTrigger::AllocationFailure
            } else {
                EvictionTrigger::HighWatermark
            },
            min_victims: ceil_share(usage.objects, target),
            min_freed_bytes: projected.saturating_sub(self.capacity_bytes),
        }))
    }

    /// Plans the pass (if any) for a put of `incoming_bytes`, reading `oldest_first` lazily.
    ///
    /// `oldest_first` must yield every stored object in least recently accessed order; only
    /// as many are read as the pass needs, and none if no pass is needed.
    ///
    /// # Errors
    ///
    /// [`EvictionError::LargerThanCapacity`] when the object alone exceeds the capacity;
    /// [`EvictionError::Leased`] when even evicting every unleased object leaves too little
    /// room. Either way nothing is to be evicted.
    pub fn plan_victims<K, I>(
        &self,
        usage: PoolUsage,
        incoming_bytes: u64,
        oldest_first: I,
        now_ms: u64,
    ) -> Result<EvictionPlan<K>, EvictionError>
    where
        I: IntoIterator<Item = EvictionEntry<K>>,
    {
        let Some(goal) = self.goal(usage, incoming_bytes)? else {
            return Ok(EvictionPlan::none());
        };
        let mut plan = EvictionPlan {
            trigger: Some(goal.trigger),
            victims: Vec::with_capacity(goal.min_victims),
            freed_bytes: 0,
        };
        for entry in oldest_first {
            if plan.victims.len() >= goal.min_victims && plan.freed_bytes >= goal.min_freed_bytes {
                break; // `eviction::I6`
            }
            if entry.is_leased(now_ms) {
                continue; // `eviction::I2`
            }
            plan.freed_bytes = plan.freed_bytes.saturating_add(entry.size_bytes);
            plan.victims.push(entry.id); // `eviction::I3`: in the order given
        }
        if plan.freed_bytes < goal.min_freed_bytes {
            let free = self.capacity_bytes.saturating_sub(usage.used_bytes);
            return Err(EvictionError::Leased {
                needed_bytes: incoming_bytes,
                available_bytes: free.saturating_add(plan.freed_bytes),
                capacity_bytes: self.capacity_bytes,
            });
        }
        Ok(plan)
    }

    /// Plans the pass for a put from all `entries`, in any order: the reference form of
    /// [`Self::plan_victims`], which sorts them least recently accessed first (ties by id).
    ///
    /// # Errors
    ///
    /// As [`Self::plan_victims`].
    pub fn plan_eviction<K: Ord + Clone>(
        &self,
        entries: &[EvictionEntry<K>],
        incoming_bytes: u64,
        now_ms: u64,
    ) -> Result<EvictionPlan<K>, EvictionError> {
        let usage = PoolUsage {
            used_bytes: entries.iter().map(|entry| entry.size_bytes).sum(),
            objects: entries.len(),
        };
        let mut ordered: Vec<&EvictionEntry<K>> = entries.iter().collect();
        ordered.sort_unstable_by(|a, b| lru_order(a, b));
        self.plan_victims(usage, incoming_bytes, ordered.into_iter().cloned(), now_ms)
    }
}

/// Least recently accessed first; ties broken by id so the order is total.
fn lru_order<K: Ord>(a: &EvictionEntry<K>, b: &EvictionEntry<K>) -> Ordering {
    a.last_access
        .cmp(&b.last_access)
        .then_with(|| a.id.cmp(&b.id))
}

fn check_ratio(key: &'static str, value: f64, working: f64) -> Result<(), EvictionPolicyError> {
    // Written so that NaN fails too.
    if value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(EvictionPolicyError::RatioOutOfRange {
            key,
            value,
            working,
        })
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "byte and object counts stay far below 2^53; ratios need a few digits"
)]
fn as_f64(value: u64) -> f64 {
    value as f64
}

/// `ceil(count * share)` for `share` in `[0, 1]`, never more than `count`.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "share is in [0, 1], so the result lies in [0, count]; counts stay below 2^53"
)]
fn ceil_share(count: usize, share: f64) -> usize {
    let wanted = (count as f64 * share.clamp(0.0, 1.0)).ceil() as usize;
    wanted.min(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(id: u32, size_bytes: u64, last_access: u64, lease: u64) -> EvictionEntry<u32> {
        EvictionEntry {
            id,
            size_bytes,
            last_access,
            lease_expires_ms: lease,
        }
    }

    /// The policy these tests are written against: watermark 0.90, ratio 0.05, 10 s.
    fn policy(capacity_bytes: u64) -> EvictionPolicy {
        EvictionPolicy {
            high_watermark_ratio: 0.90,
            lease_ttl_ms: 10_000,
            ..EvictionPolicy::mooncake_defaults(capacity_bytes)
        }
    }

    #[test]
    fn mooncake_defaults_are_the_documented_ones() {
        let defaults = EvictionPolicy::mooncake_defaults(1);
        assert!((defaults.high_watermark_ratio - 0.95).abs() < f64::EPSILON);
        assert!((defaults.eviction_ratio - 0.05).abs() < f64::EPSILON);
        assert_eq!(defaults.lease_ttl_ms, 5_000);
        assert_eq!(defaults.validate(), Ok(()));
    }

    #[test]
    fn validate_refuses_zero_capacity_and_bad_ratios_naming_the_key() {
        assert_eq!(
            policy(0).validate(),
            Err(EvictionPolicyError::ZeroCapacity { working: 16 << 30 })
        );
        let high = EvictionPolicy {
            high_watermark_ratio: 1.5,
            ..policy(10)
        };
        let err = high.validate().err();
        assert!(matches!(
            err,
            Some(EvictionPolicyError::RatioOutOfRange {
                key: "eviction_high_watermark_ratio",
                ..
            })
        ));
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("0.9"), "{message}");
        for bad in [0.0, -0.1, f64::NAN, 1.000_001] {
            let zero = EvictionPolicy {
                eviction_ratio: bad,
                ..policy(10)
            };
            assert!(matches!(
                zero.validate(),
                Err(EvictionPolicyError::RatioOutOfRange {
                    key: "eviction_ratio",
                    ..
                })
            ));
        }
        let edge = EvictionPolicy {
            high_watermark_ratio: 1.0,
            eviction_ratio: 1.0,
            ..policy(10)
        };
        assert_eq!(edge.validate(), Ok(()));
    }

    #[test]
    fn no_pass_at_or_below_the_watermark_i5() -> Result<(), EvictionError> {
        let entries = [entry(1, 40, 1, 0), entry(2, 40, 2, 0)];
        // 80 + 10 = 90 of 100: exactly at the watermark, no pass.
        let plan = policy(100).plan_eviction(&entries, 10, 0)?;
        assert_eq!(plan, EvictionPlan::none());
        Ok(())
    }

    #[test]
    fn watermark_pass_evicts_oldest_share_of_objects_i3_i4() -> Result<(), EvictionError> {
        // 20 objects of 4 bytes = 80 of 100; a put of 11 -> 91%: target = 0.91-0.9+0.05.
        let entries: Vec<_> = (0..20)
            .map(|i| entry(i, 4, u64::from(100 - i), 0))
            .collect();
        let plan = policy(100).plan_eviction(&entries, 11, 0)?;
        assert_eq!(plan.trigger, Some(EvictionTrigger::HighWatermark));
        // ceil(20 * 0.06) = 2, the two least recently accessed: ids 19 and 18.
        assert_eq!(plan.victims, vec![19, 18]);
        assert_eq!(plan.freed_bytes, 8);
        Ok(())
    }

    #[test]
    fn allocation_failure_pass_frees_room_for_the_put_i1() -> Result<(), EvictionError> {
        let entries = [entry(1, 30, 1, 0), entry(2, 30, 2, 0), entry(3, 30, 3, 0)];
        let plan = policy(100).plan_eviction(&entries, 70, 0)?;
        assert_eq!(plan.trigger, Some(EvictionTrigger::AllocationFailure));
        assert_eq!(plan.victims, vec![1, 2]);
        assert!(90 + 70 - plan.freed_bytes <= 100);
        Ok(())
    }

    #[test]
    fn leased_objects_are_skipped_i2() -> Result<(), EvictionError> {
        let entries = [entry(1, 30, 1, 500), entry(2, 30, 2, 0), entry(3, 30, 3, 0)];
        let plan = policy(100).plan_eviction(&entries, 60, 499)?;
        assert_eq!(plan.victims, vec![2, 3]);
        // At 500 the lease on 1 has expired: it goes first again.
        let plan = policy(100).plan_eviction(&entries, 60, 500)?;
        assert_eq!(plan.victims, vec![1, 2]);
        Ok(())
    }

    #[test]
    fn a_put_that_cannot_fit_past_leases_evicts_nothing() {
        let entries = [entry(1, 50, 1, 10), entry(2, 40, 2, 0)];
        assert_eq!(
            policy(100).plan_eviction(&entries, 60, 0),
            Err(EvictionError::Leased {
                needed_bytes: 60,
                available_bytes: 50,
                capacity_bytes: 100
            })
        );
        assert_eq!(
            policy(100).plan_eviction(&entries, 101, 0),
            Err(EvictionError::LargerThanCapacity {
                needed_bytes: 101,
                capacity_bytes: 100
            })
        );
    }

    #[test]
    fn ties_in_access_are_broken_by_id() -> Result<(), EvictionError> {
        let entries = [entry(7, 50, 1, 0), entry(3, 50, 1, 0)];
        let plan = policy(100).plan_eviction(&entries, 50, 0)?;
        assert_eq!(plan.victims, vec![3]);
        Ok(())
    }

    #[test]
    fn plan_victims_reads_only_as_far_as_it_needs() -> Result<(), EvictionError> {
        let mut read = 0;
        let entries = (0..1000u32).map(|i| {
            read += 1;
            entry(i, 1, u64::from(i), 0)
        });
        let usage = PoolUsage {
            used_bytes: 1000,
            objects: 1000,
        };
        let plan = policy(1000).plan_victims(usage, 1, entries, 0)?;
        // Projected ratio capped at 1: target = 1 - 0.9 + 0.05 = 0.15 -> 150 objects.
        assert_eq!(plan.victims.len(), 150);
        assert_eq!(read, 151);
        Ok(())
    }

    fn arb_entries() -> impl Strategy<Value = Vec<EvictionEntry<u32>>> {
        prop::collection::vec((1u64..40, 0u64..50, prop::bool::ANY), 0..40).prop_map(|raw| {
            raw.into_iter()
                .enumerate()
                .map(|(i, (size, access, leased))| EvictionEntry {
                    id: u32::try_from(i).unwrap_or(u32::MAX),
                    size_bytes: size,
                    last_access: access,
                    lease_expires_ms: if leased { 1_000 } else { 0 },
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(0x6b76), ..ProptestConfig::default() })]

        #[test]
        fn plan_keeps_invariants_i1_to_i6(
            entries in arb_entries(),
            incoming in 0u64..400,
            spare in 0u64..200,
            eviction_ratio in 0.01f64..=1.0,
            high_watermark_ratio in 0.01f64..=1.0,
        ) {
            let used: u64 = entries.iter().map(|e| e.size_bytes).sum();
            let policy = EvictionPolicy {
                capacity_bytes: used + spare + 1,
                high_watermark_ratio,
                eviction_ratio,
                lease_ttl_ms: 1_000,
            };
            let now = 500;
            let mut unleased: Vec<&EvictionEntry<u32>> =
                entries.iter().filter(|e| !e.is_leased(now)).collect();
            unleased.sort_by(|a, b| lru_order(a, b));
            match policy.plan_eviction(&entries, incoming, now) {
                Ok(plan) => {
                    // `eviction::I1`
                    prop_assert!(used + incoming - plan.freed_bytes <= policy.capacity_bytes);
                    // `eviction::I2` + `eviction::I3`: victims are exactly a prefix of the unleased
                    // LRU order.
                    let prefix: Vec<u32> =
                        unleased.iter().take(plan.victims.len()).map(|e| e.id).collect();
                    prop_assert_eq!(&plan.victims, &prefix);
                    let freed: u64 = unleased.iter().take(plan.victims.len()).map(|e| e.size_bytes).sum();
                    prop_assert_eq!(freed, plan.freed_bytes);
                    let projected = used + incoming;
                    #[expect(clippy::cast_precision_loss, reason = "small test values")]
                    let above = projected as f64 > high_watermark_ratio * policy.capacity_bytes as f64;
                    if projected <= policy.capacity_bytes && !above {
                        // `eviction::I5`
                        prop_assert!(plan.trigger.is_none() && plan.victims.is_empty());
                    } else {
                        // `eviction::I4`
                        let floor = ceil_share(entries.len(), eviction_ratio).min(unleased.len());
                        prop_assert!(plan.victims.len() >= floor);
                        // `eviction::I6`: without the last victim a goal is missed.
                        if let Some(last) = plan.victims.len().checked_sub(1) {
                            let goal = policy
                                .goal(PoolUsage { used_bytes: used, objects: entries.len() }, incoming)
                                .ok()
                                .flatten();
                            prop_assert!(goal.is_some());
                            if let Some(goal) = goal {
                                let freed_without = freed - unleased[last].size_bytes;
                                prop_assert!(last < goal.min_victims || freed_without < goal.min_freed_bytes);
                            }
                        }
                    }
                }
                Err(EvictionError::LargerThanCapacity { .. }) => {
                    prop_assert!(incoming > policy.capacity_bytes);
                }
                Err(EvictionError::Leased { available_bytes, .. }) => {
                    let reclaimable: u64 = unleased.iter().map(|e| e.size_bytes).sum();
                    prop_assert_eq!(available_bytes, policy.capacity_bytes - used + reclaimable);
                    prop_assert!(available_bytes < incoming);
                }
            }
        }
    }
}
