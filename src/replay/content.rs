//! Deterministic KV content: what computing a block writes into its page, so that every
//! page loaded from the pool can be checked (`docs/DESIGN.md` section 11, "KV content is
//! deterministic").
//!
//! A page's bytes are a function of (layer group, shard, page name) only, the name being
//! the block's chain hash, or for a drafter's group its next-token hash (R37: a hidden-state
//! drafter's page also depends on the token after the block):
//!
//! 1. [`page_seed`] hashes those fields with xxh3 into a 64-bit seed;
//! 2. [`fill_page`] expands the seed with splitmix64 into the page, 8 bytes at a time.
//!
//! A page the engine allocated but whose block is not fully computed yet holds
//! [`STALE_BYTE`] everywhere ([`fill_stale`]): a connector that saves a page past the end of
//! the current chunk (R16), or reports a load filled without writing it, leaves bytes that
//! the page check ([`PageChecker`]) later refuses. A page a drafter wrote draft tokens into
//! (past the prompt end, or the prompt's partial last block) holds [`DRAFT_BYTE`]
//! everywhere ([`fill_draft`]) until its block is computed: a draft that might still be
//! rejected is never what computing the block gives (R18). A page the engine took back from
//! a load in flight and handed to another request holds [`FOREIGN_BYTE`] everywhere (the
//! replay writes it for that request, `--release-during-loads`): a loader that writes it
//! after the release leaves bytes the check refuses (R29).
//!
//! Invariants:
//! - `content::C1`. Equal (group, shard, hash) give equal bytes, on every machine and run; any
//!   difference in one of them gives different bytes (up to 64-bit seed collisions).
//! - `content::C2`. A replicated group's page has the same bytes on every rank (its shard is
//!   `replicated`); a per-rank group's pages differ between ranks.
//! - `content::C3`. No filled page equals a stale, a draft or a foreign page (a splitmix64
//!   stream is never 8 equal bytes for a whole page of 64 bytes or more), and those three
//!   differ from each other.

use xxhash_rust::xxh3::xxh3_64;

use crate::core::hash::BlockHash;
use crate::core::keys::Shard;
use crate::core::page_names::PageNaming;
use crate::core::layout::{GroupId, LayerGroup};
use crate::gpu::{Device, GpuError};

/// The byte a page holds while its block is not fully computed (`content::C3`).
pub const STALE_BYTE: u8 = 0xA5;

/// The byte a page holds while it carries draft tokens that are not verified (`content::C3`).
pub const DRAFT_BYTE: u8 = 0x5D;

/// The byte a page holds once the engine took it back from a load and another request
/// wrote it (`content::C3`, R29).
pub const FOREIGN_BYTE: u8 = 0x3C;

/// Domain tag in every seed, so page content never collides with other xxh3 uses.
const CONTENT_DOMAIN: &[u8; 8] = b"kvc-page";

/// The golden-ratio increment of splitmix64.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The seed of a page's content (`content::C1`).
pub fn page_seed(group: GroupId, shard: Shard, hash: &BlockHash) -> u64 {
    let (world, rank) = match shard {
        Shard::Rank { world, rank } => (world, rank),
        Shard::Replicated => (u32::MAX, u32::MAX),
    };
    let mut input = [0_u8; 8 + 4 + 4 + 4 + 16];
    input[..8].copy_from_slice(CONTENT_DOMAIN);
    input[8..12].copy_from_slice(&group.0.to_le_bytes());
    input[12..16].copy_from_slice(&world.to_le_bytes());
    input[16..20].copy_from_slice(&rank.to_le_bytes());
    input[20..].copy_from_slice(&hash.0);
    xxh3_64(&input)
}

/// Fills `out` with the splitmix64 stream of `seed` (little-endian words; a tail shorter
/// than 8 bytes takes the first bytes of the next word).
pub fn fill_page(out: &mut [u8], seed: u64) {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(GOLDEN_GAMMA);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)).to_le_bytes()
    };
    let mut words = out.chunks_exact_mut(8);
    for word in &mut words {
        word.copy_from_slice(&next());
    }
    let tail = words.into_remainder();
    let len = tail.len();
    tail.copy_from_slice(&next()[..len]);
}

/// Fills `out` with the stale pattern (`content::C3`).
#[cfg(feature = "internals")]
pub fn fill_stale(out: &mut [u8]) {
    out.fill(STALE_BYTE);
}

/// Fills `out` with the draft pattern (`content::C3`).
#[cfg(feature = "internals")]
pub fn fill_draft(out: &mut [u8]) {
    out.fill(DRAFT_BYTE);
}

/// One layer group as the content writer and checker see it.
#[derive(Clone, Debug)]
pub struct ContentGroup {
    /// The group's id (its page pool on every device).
    pub id: GroupId,
    /// Whether its pages are identical on every rank (`content::C2`).
    pub replicated: bool,
    /// Which name of a block its page content is drawn from (R37).
    pub naming: PageNaming,
}

impl ContentGroup {
    /// The group as content sees it.
    pub fn of(group: &LayerGroup) -> Self {
        Self {
            id: group.id,
            replicated: group.replicated,
            naming: PageNaming::from(group.role),
        }
    }

    /// The shard of this group's page on `rank` (`content::C2`).
    pub fn shard(&self, world_size: u32, rank: u32) -> Shard {
        if self.replicated {
            Shard::Replicated
        } else {
            Shard::Rank {
                world: world_size,
                rank,
            }
        }
    }
}

/// Writes computed and stale pages and checks loaded ones, on every rank of one instance.
/// Holds two page-sized scratch buffers so that no page write allocates.
#[derive(Debug)]
pub struct PageChecker {
    /// Tensor-parallel world size (one device per rank).
    world_size: u32,
    /// The expected or written bytes of one page.
    expected: Vec<u8>,
    /// The bytes read back from a device.
    actual: Vec<u8>,
}

/// Pages checked by [`PageChecker::check_page`], counted per rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckCounts {
    /// Pages whose bytes equal what computing them gives.
    pub verified: u64,
    /// Pages whose bytes differ.
    pub mismatched: u64,
}

impl PageChecker {
    /// A checker for devices of `world_size` ranks.
    pub fn new(world_size: u32) -> Self {
        Self {
            world_size,
            expected: Vec::new(),
            actual: Vec::new(),
        }
    }

    /// Writes the computed content of block `hash` into `page` of `group` on every rank.
    ///
    /// # Errors
    ///
    /// The device's [`GpuError`] (an unknown group or a page out of range).
    pub fn write_computed(
        &mut self,
        devices: &[Device],
        group: &ContentGroup,
        page: u32,
        hash: &BlockHash,
    ) -> Result<(), GpuError> {
        for (rank, device) in (0_u32..).zip(devices) {
            let page_bytes = device.page_pool(group.id)?.page_bytes;
            self.expected.resize(page_bytes, 0);
            let seed = page_seed(group.id, group.shard(self.world_size, rank), hash);
            fill_page(&mut self.expected, seed);
            device.write_page(group.id, page, &self.expected)?;
        }
        Ok(())
    }

    /// Writes the stale pattern into `page` of `group` on every rank.
    ///
    /// # Errors
    ///
    /// The device's [`GpuError`].
    pub fn write_stale(
        &mut self,
        devices: &[Device],
        group: GroupId,
        page: u32,
    ) -> Result<(), GpuError> {
        self.write_uniform(devices, group, page, STALE_BYTE)
    }

    /// Writes the draft pattern into `page` of `group` on every rank (a drafter wrote
    /// unverified draft tokens into it).
    ///
    /// # Errors
    ///
    /// The device's [`GpuError`].
    pub fn write_draft(
        &mut self,
        devices: &[Device],
        group: GroupId,
        page: u32,
    ) -> Result<(), GpuError> {
        self.write_uniform(devices, group, page, DRAFT_BYTE)
    }

    /// Writes the foreign pattern into `page` of `group` on every rank (another request
    /// took the page over, R29).
    ///
    /// # Errors
    ///
    /// The device's [`GpuError`].
    pub fn write_foreign(
        &mut self,
        devices: &[Device],
        group: GroupId,
        page: u32,
    ) -> Result<(), GpuError> {
        self.write_uniform(devices, group, page, FOREIGN_BYTE)
    }

    /// Reads `page` of `group` back from every rank and checks it still holds the foreign
    /// pattern; counts one verified or mismatched page per rank.
    ///
    /// # Errors
    ///
    /// The device's [`GpuError`].
    pub fn check_foreign(
        &mut self,
        devices: &[Device],
        group: GroupId,
        page: u32,
    ) -> Result<CheckCounts, GpuError> {
        let mut counts = CheckCounts::default();
        for device in devices {
            let page_bytes = device.page_pool(group)?.page_bytes;
            self.actual.resize(page_bytes, 0);
            device.read_page(group, page, &mut self.actual)?;
            if self.actual.iter().all(|&byte| byte == FOREIGN_BYTE) {
                counts.verified += 1;
            } else {
                counts.mismatched += 1;
            }
        }
        Ok(counts)
    }

    /// Fills `page` of `group` with `byte` on every rank.
    fn write_uniform(
        &mut self,
        devices: &[Device],
        group: GroupId,
        page: u32,
        byte: u8,
    ) -> Result<(), GpuError> {
        for device in devices {
            let page_bytes = device.page_pool(group)?.page_bytes;
            self.expected.resize(page_bytes, 0);
            self.expected.fill(byte);
            device.write_page(group, page, &self.expected)?;
        }
        Ok(())
    }

    /// Reads `page` of `group` back from every rank and compares it with the content of
    /// block `hash`; counts one verified or mismatched page per rank.
    ///
    /// # Errors
    ///
    /// The device's [`GpuError`].
    pub fn check_page(
        &mut self,
        devices: &[Device],
        group: &ContentGroup,
        page: u32,
        hash: &BlockHash,
    ) -> Result<CheckCounts, GpuError> {
        let mut counts = CheckCounts::default();
        for (rank, device) in (0_u32..).zip(devices) {
            let page_bytes = device.page_pool(group.id)?.page_bytes;
            self.expected.resize(page_bytes, 0);
            self.actual.resize(page_bytes, 0);
            let seed = page_seed(group.id, group.shard(self.world_size, rank), hash);
            fill_page(&mut self.expected, seed);
            device.read_page(group.id, page, &mut self.actual)?;
            if self.actual == self.expected {
                counts.verified += 1;
            } else {
                counts.mismatched += 1;
            }
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::PagePoolSpec;

    fn hash(byte: u8) -> BlockHash {
        BlockHash([byte; 16])
    }

    fn page(seed: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        fill_page(&mut out, seed);
        out
    }

    #[test]
    fn content_depends_on_every_field_c1() {
        let rank0 = Shard::Rank { world: 2, rank: 0 };
        let rank1 = Shard::Rank { world: 2, rank: 1 };
        let base = page_seed(GroupId(0), rank0, &hash(1));
        assert_eq!(base, page_seed(GroupId(0), rank0, &hash(1)));
        for other in [
            page_seed(GroupId(1), rank0, &hash(1)),
            page_seed(GroupId(0), rank1, &hash(1)),
            page_seed(GroupId(0), Shard::Replicated, &hash(1)),
            page_seed(GroupId(0), rank0, &hash(2)),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn fill_is_a_prefix_stable_stream_with_a_tail() {
        let long = page(7, 64);
        let short = page(7, 13);
        assert_eq!(&long[..13], &short[..]);
        assert_ne!(page(7, 64), page(8, 64));
    }

    #[test]
    fn filled_pages_are_never_stale_or_draft_c3() {
        assert_ne!(STALE_BYTE, DRAFT_BYTE);
        let mut draft = vec![0; 64];
        fill_draft(&mut draft);
        let mut stale = vec![0; 64];
        fill_stale(&mut stale);
        assert_ne!(draft, stale);
        for seed in 0..1_000 {
            let filled = page(seed, 64);
            assert!(filled.iter().any(|&byte| byte != STALE_BYTE));
            assert_ne!(filled, draft);
        }
    }

    #[test]
    fn checker_verifies_written_pages_and_refuses_stale_or_foreign_ones() -> Result<(), GpuError> {
        let spec = PagePoolSpec {
            group: GroupId(0),
            page_bytes: 128,
            num_pages: 4,
        };
        let devices = vec![Device::open_host(&[spec])?, Device::open_host(&[spec])?];
        let group = ContentGroup {
            id: GroupId(0),
            replicated: false,
            naming: PageNaming::Chain,
        };
        let mut checker = PageChecker::new(2);
        checker.write_computed(&devices, &group, 1, &hash(3))?;
        let ok = checker.check_page(&devices, &group, 1, &hash(3))?;
        assert_eq!(
            ok,
            CheckCounts {
                verified: 2,
                mismatched: 0
            }
        );
        // Rank pages differ (`content::C2`: per-rank group).
        assert_ne!(
            devices[0].read_page_to_vec(GroupId(0), 1)?,
            devices[1].read_page_to_vec(GroupId(0), 1)?
        );
        let wrong_hash = checker.check_page(&devices, &group, 1, &hash(4))?;
        assert_eq!(wrong_hash.mismatched, 2);
        checker.write_stale(&devices, GroupId(0), 1)?;
        assert_eq!(
            checker
                .check_page(&devices, &group, 1, &hash(3))?
                .mismatched,
            2
        );
        checker.write_draft(&devices, GroupId(0), 1)?;
        assert_eq!(
            devices[1].read_page_to_vec(GroupId(0), 1)?,
            vec![DRAFT_BYTE; 128]
        );
        assert_eq!(
            checker
                .check_page(&devices, &group, 1, &hash(3))?
                .mismatched,
            2
        );
        Ok(())
    }

    #[test]
    fn replicated_groups_have_equal_pages_on_every_rank_c2() -> Result<(), GpuError> {
        let spec = PagePoolSpec {
            group: GroupId(2),
            page_bytes: 64,
            num_pages: 1,
        };
        let devices = vec![Device::open_host(&[spec])?, Device::open_host(&[spec])?];
        let group = ContentGroup {
            id: GroupId(2),
            replicated: true,
            naming: PageNaming::Chain,
        };
        PageChecker::new(2).write_computed(&devices, &group, 0, &hash(9))?;
        assert_eq!(
            devices[0].read_page_to_vec(GroupId(2), 0)?,
            devices[1].read_page_to_vec(GroupId(2), 0)?
        );
        Ok(())
    }
}
