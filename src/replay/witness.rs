//! The replay's own witness of what connectors publish (R16, R18): every object a
//! connector hands to the pool is checked against what computing its block gives.
//!
//! Why: a connector counts `published_past_chunk_end` from its own save plan, so a plan
//! that is wrong the same way as its count shows nothing there. The witness sits at the
//! pool, on the engine's side of the replay: by `engine::E1` a page holds its block's
//! computed content, or the stale or the draft pattern while the block is not computed;
//! a connector that publishes a page past the chunk end of its step publishes one of those
//! patterns (`content::C3`), or, for a page the engine gave to another block, that block's
//! content.
//!
//! Workflow:
//! 1. the deployment ([`super::setup`]) puts a [`WitnessedPool`] in front of the pool of
//!    every instance, all sharing one [`PublishWitness`];
//! 2. every object a `put`, `put_absent` or `commit_objects` hands over is read: group,
//!    shard and chain hash from its key (R3), the payload after its header (R5); the
//!    payload's first [`CHECKED_BYTES`] bytes are compared with the content of (group,
//!    shard, hash) (`content::C1`);
//! 3. the report's `published_uncomputed_pages` counts the objects that differ, and a
//!    replay with any fails its checks ([`super::checks`]).
//!
//! Decision: only a prefix of each payload is compared. A page holds one kind of content
//! as a whole (`engine::E1`: the engine writes whole pages), and the first 64 bytes tell
//! the three kinds apart (`content::C3`), so the check costs the saver thread about a
//! hundred nanoseconds per page instead of a second pass over it. Pages that reach an
//! engine are compared in full by the page check (`engine::E2`).
//!
//! Invariants:
//! - `witness::W1`. The wrapper changes no pool call: every argument and result passes
//!   through unchanged, and the objects are only read.
//! - `witness::W2`. An object whose payload is its block's computed content is never
//!   counted (`content::C1`); an object whose key is not a page key (R3) is counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::core::hash::BlockHash;
use crate::core::keys::Shard;
use crate::core::layout::GroupId;
use crate::core::object::HEADER_BYTES;
use crate::gpu::host_memory::{HostSlot, SharedSlot};
use crate::pool::{Pool, PoolCounters, PoolError};

use super::content::{fill_page, page_seed};

/// Bytes of each payload compared with the computed content (module docs, "Decision").
pub const CHECKED_BYTES: usize = 64;

/// Counts the objects handed to the pool that are not a computed page; shared by every
/// instance's [`WitnessedPool`].
#[derive(Debug, Default)]
pub struct PublishWitness {
    uncomputed: AtomicU64,
}

impl PublishWitness {
    /// A witness with nothing counted.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// `pool` with this witness in front of it.
    pub fn wrap(self: &Arc<Self>, pool: Arc<dyn Pool>) -> Arc<dyn Pool> {
        Arc::new(WitnessedPool {
            inner: pool,
            witness: Arc::clone(self),
        })
    }

    /// Objects handed to the pool so far whose payload is not their block's computed
    /// content (`witness::W2`).
    pub fn uncomputed_pages(&self) -> u64 {
        self.uncomputed.load(Ordering::Relaxed)
    }

    /// Checks one batch of objects (module workflow, step 2).
    fn witness<'a>(&self, keys: &[&str], objects: impl Iterator<Item = &'a [u8]>) {
        let uncomputed = keys
            .iter()
            .zip(objects)
            .filter(|(key, object)| !holds_computed_content(key, object))
            .count();
        if uncomputed > 0 {
            self.uncomputed.fetch_add(
                u64::try_from(uncomputed).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
    }
}

/// Whether `object`, stored under `key`, holds the computed content of the page the key
/// names (its first [`CHECKED_BYTES`] payload bytes).
fn holds_computed_content(key: &str, object: &[u8]) -> bool {
    let Some((group, shard, hash)) = page_of_key(key) else {
        return false;
    };
    let Some(payload) = object.get(HEADER_BYTES..) else {
        return false;
    };
    let checked = payload.len().min(CHECKED_BYTES);
    if checked == 0 {
        return false;
    }
    let mut expected = [0_u8; CHECKED_BYTES];
    fill_page(&mut expected[..checked], page_seed(group, shard, &hash));
    payload[..checked] == expected[..checked]
}

/// Group, shard and chain hash of a page key
/// `{namespace}/{model_key}/{shard}/lg{group}/t{T}b{bytes}/{hex}` (R3, `keys::I3`), read
/// from its end; `None` for anything else.
fn page_of_key(key: &str) -> Option<(GroupId, Shard, BlockHash)> {
    let mut segments = key.rsplit('/');
    let hash = BlockHash::from_hex(segments.next()?).ok()?;
    let _page_size = segments.next()?.strip_prefix('t')?;
    let group = GroupId(segments.next()?.strip_prefix("lg")?.parse().ok()?);
    let shard = match segments.next()? {
        "replicated" => Shard::Replicated,
        rank_shard => {
            let (world, rank) = rank_shard.strip_prefix('w')?.split_once('r')?;
            Shard::Rank {
                world: world.parse().ok()?,
                rank: rank.parse().ok()?,
            }
        }
    };
    Some((group, shard, hash))
}

/// A pool seen through a [`PublishWitness`] (`witness::W1`).
struct WitnessedPool {
    inner: Arc<dyn Pool>,
    witness: Arc<PublishWitness>,
}

impl Pool for WitnessedPool {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.inner.exists(keys)
    }

    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.witness.witness(keys, values.iter().copied());
        self.inner.put(keys, values)
    }

    fn put_absent(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        self.witness.witness(keys, values.iter().copied());
        self.inner.put_absent(keys, values)
    }

    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        self.inner.get_into(keys, buffers)
    }

    fn lend(&self, keys: &[&str]) -> Option<Vec<Result<SharedSlot, PoolError>>> {
        self.inner.lend(keys)
    }

    fn alloc_objects(&self, lens: &[usize]) -> Option<Vec<Result<HostSlot, PoolError>>> {
        self.inner.alloc_objects(lens)
    }

    fn commit_objects(&self, keys: &[&str], objects: Vec<HostSlot>) -> Vec<Result<(), PoolError>> {
        self.witness
            .witness(keys, objects.iter().map(|object| &object[..]));
        self.inner.commit_objects(keys, objects)
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        self.inner.touch(keys)
    }

    fn counters(&self) -> PoolCounters {
        self.inner.counters()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// The inner pool's: the embedded pool stays called in place behind the witness, so a
    /// slow call there (CPU contention) is never a missed deadline or an outage (R35).
    fn calls_may_block(&self) -> bool {
        self.inner.calls_may_block()
    }

    fn lend_staging(
        &self,
        bytes: usize,
    ) -> Option<Result<Box<dyn crate::gpu::LentHostMemory>, PoolError>> {
        self.inner.lend_staging(bytes)
    }

    fn register_staging(&self, staging: &[u8]) -> Result<(), PoolError> {
        self.inner.register_staging(staging)
    }

    fn unregister_staging(&self, start_addr: usize) -> Result<(), PoolError> {
        self.inner.unregister_staging(start_addr)
    }

    #[cfg(feature = "faults")]
    fn faults(&self) -> Option<&crate::pool::faults::FaultInjector> {
        self.inner.faults()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::eviction::EvictionPolicy;
    use crate::pool::{MemoryPool, SystemClock};
    use crate::replay::content::{fill_draft, fill_stale};

    const HASH: &str = "00112233445566778899aabbccddeeff";
    const PAGE: usize = 256;

    fn key(shard: &str, group: u32) -> String {
        format!("ns/model.fp/{shard}/lg{group}/t16b{PAGE}/{HASH}")
    }

    /// An object (zero header) whose payload is `fill`ed.
    fn object(fill: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut object = vec![0; HEADER_BYTES + PAGE];
        fill(&mut object[HEADER_BYTES..]);
        object
    }

    fn computed(group: u32, shard: Shard) -> Result<Vec<u8>, crate::core::hash::HashError> {
        let hash = BlockHash::from_hex(HASH)?;
        Ok(object(|payload| {
            fill_page(payload, page_seed(GroupId(group), shard, &hash));
        }))
    }

    type Witnessed = (Arc<PublishWitness>, Arc<dyn Pool>);

    fn witnessed() -> Result<Witnessed, Box<dyn std::error::Error>> {
        let inner = MemoryPool::new(
            EvictionPolicy::mooncake_defaults(1 << 20),
            Arc::new(SystemClock::new()),
        )?;
        let witness = PublishWitness::new();
        let pool = witness.wrap(Arc::new(inner));
        Ok((witness, pool))
    }

    /// R35: the witness does not turn the embedded pool into one whose calls may block (the
    /// guard would then give its probes deadlines, and a loaded machine would drop saves as
    /// an outage of a pool that cannot be unreachable).
    #[test]
    fn the_embedded_pool_behind_the_witness_is_called_in_place(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (_, pool) = witnessed()?;
        assert!(!pool.calls_may_block());
        Ok(())
    }

    #[test]
    fn keys_give_their_group_shard_and_hash() -> Result<(), Box<dyn std::error::Error>> {
        let hash = BlockHash::from_hex(HASH)?;
        assert_eq!(
            page_of_key(&key("w2r1", 3)),
            Some((GroupId(3), Shard::Rank { world: 2, rank: 1 }, hash))
        );
        assert_eq!(
            page_of_key(&key("replicated", 0)),
            Some((GroupId(0), Shard::Replicated, hash))
        );
        for bad in [
            "ns/model/w2r1/lg0/t16b256/abc",
            "ns/model/w2x1/lg0/t16b256/00112233445566778899aabbccddeeff",
            "ns/model/w2r1/group0/t16b256/00112233445566778899aabbccddeeff",
            "00112233445566778899aabbccddeeff",
        ] {
            assert_eq!(page_of_key(bad), None, "{bad}");
        }
        Ok(())
    }

    #[test]
    fn computed_pages_pass_and_stale_draft_or_foreign_pages_count_w2(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (witness, pool) = witnessed()?;
        let rank1 = Shard::Rank { world: 2, rank: 1 };
        let good = computed(0, rank1)?;
        let keys = [key("w2r1", 0), key("replicated", 1)];
        let replicated = computed(1, Shard::Replicated)?;
        let results = pool.put(&[&keys[0], &keys[1]], &[&good, &replicated]);
        assert_eq!(results, vec![Ok(()), Ok(())], "`witness::W1`");
        assert_eq!(witness.uncomputed_pages(), 0);
        let bad = [
            object(fill_stale),
            object(fill_draft),
            computed(0, Shard::Rank { world: 2, rank: 0 })?,
            computed(2, rank1)?,
            vec![0; HEADER_BYTES],
        ];
        for (index, value) in bad.iter().enumerate() {
            let key = format!("ns/m/w2r1/lg0/t16b{PAGE}/{index:032x}");
            // Another hash than the key's: every one of these is foreign content.
            pool.put_absent(&[&key], &[value]);
        }
        let stale_under_its_key = object(fill_stale);
        pool.put(&[&key("w2r1", 5)], &[&stale_under_its_key]);
        pool.put(&["not/a/page/key"], &[&good]);
        assert_eq!(witness.uncomputed_pages(), 5 + 1 + 1);
        // The objects were stored as given (`witness::W1`).
        let mut back = vec![0; HEADER_BYTES + PAGE];
        assert_eq!(
            pool.get_into(&[&keys[0]], &mut [&mut back]),
            vec![Ok(back.len())]
        );
        assert_eq!(back, good);
        Ok(())
    }
}
