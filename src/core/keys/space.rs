//! Where a page lives in the pool and what its header says, for every (group, shard):
//! key prefixes built once at start (R3), the layout fingerprint in the model key (R4).

use super::{KeyError, KeyPrefix, KeySpec, Shard};
use crate::core::hash::BlockHash;
use crate::core::layout::{GroupId, Layout, LayoutFingerprint};
use crate::core::object::ObjectIdentity;
use crate::core::page_names::{PageNaming, PromptHashes};

/// One group of the layout with its per-shard key prefixes and its device page size.
#[derive(Debug)]
pub struct GroupKeys {
    /// The group id.
    pub group: GroupId,
    /// Whether its pages are replicated (one shard) or per rank.
    pub replicated: bool,
    /// Payload bytes stored per page (the device page size).
    pub payload_len: usize,
    /// Which hash names its pages (R37: the drafter's by the next-token hash).
    pub naming: PageNaming,
    /// Key prefix per shard: index = rank, or a single entry for replicated groups.
    prefixes: Vec<(Shard, KeyPrefix)>,
}

/// The key space of one deployment: every (group, shard) prefix and the fingerprint.
#[derive(Debug)]
pub struct KeySpace {
    /// The layout fingerprint written into every header.
    pub fingerprint: LayoutFingerprint,
    /// The fingerprints its groups are keyed under (one, but for a lookup-only connector
    /// over several pipeline stages, `share::S2`), ascending.
    pub parts: Vec<LayoutFingerprint>,
    /// Groups in layout order.
    pub groups: Vec<GroupKeys>,
}

impl KeySpace {
    /// Builds the prefixes. The model key stored in keys is `{model_key}.{fingerprint}`
    /// so that layouts never share keys (R4); `payload_lens` gives each group's device page
    /// size in layout order (it may be scaled below the layout's page bytes in replay).
    ///
    /// # Errors
    /// [`KeyError`] when the namespace or model key is empty or contains '/'.
    pub fn new(
        layout: &Layout,
        namespace: &str,
        model_key: &str,
        payload_lens: &[usize],
    ) -> Result<Self, KeyError> {
        let own = layout.fingerprint();
        let named: Vec<_> = layout.groups.iter().map(|group| (group.id, own)).collect();
        Self::named_by(layout, &named, namespace, model_key, payload_lens)
    }

    /// [`KeySpace::new`] with each group keyed under the fingerprint `named` gives it (a
    /// lookup-only connector over several pipeline stages keys each group as its stage
    /// does, `share::S2`); a group `named` leaves out is keyed under the layout's.
    ///
    /// # Errors
    /// [`KeyError`] as for [`KeySpace::new`].
    pub fn named_by(
        layout: &Layout,
        named: &[(GroupId, LayoutFingerprint)],
        namespace: &str,
        model_key: &str,
        payload_lens: &[usize],
    ) -> Result<Self, KeyError> {
        let fingerprint = layout.fingerprint();
        let fingerprint_of = |id: GroupId| {
            named
                .iter()
                .find(|(group, _)| *group == id)
                .map_or(fingerprint, |(_, fingerprint)| *fingerprint)
        };
        let mut parts: Vec<LayoutFingerprint> = layout.groups.iter().map(|g| fingerprint_of(g.id)).collect();
        parts.sort_unstable();
        parts.dedup();
        let mut groups = Vec::with_capacity(layout.groups.len());
        for (group, &payload_len) in layout.groups.iter().zip(payload_lens) {
            let model = format!("{model_key}.{}", fingerprint_of(group.id));
            let prefixes = group
                .shards(layout.world_size)
                .into_iter()
                .map(|shard| {
                    let spec = KeySpec {
                        namespace,
                        model_key: &model,
                        shard,
                        group: group.id,
                        tokens_per_block: layout.tokens_per_block as usize,
                        bytes_per_page: payload_len as u64,
                    };
                    KeyPrefix::validated(&spec).map(|prefix| (shard, prefix))
                })
                .collect::<Result<Vec<_>, _>>()?;
            groups.push(GroupKeys {
                group: group.id,
                replicated: group.replicated,
                payload_len,
                naming: PageNaming::from(group.role),
                prefixes,
            });
        }
        Ok(KeySpace {
            fingerprint,
            parts,
            groups,
        })
    }

    /// The group at layout position `index`.
    pub fn group(&self, index: usize) -> Option<&GroupKeys> {
        self.groups.get(index)
    }

    /// The layout position of a group id.
    pub fn index_of(&self, group: GroupId) -> Option<usize> {
        self.groups.iter().position(|keys| keys.group == group)
    }

    /// Whether some group's pages are named by next-token hashes (a layout with draft
    /// groups): only then does a prompt need them (R37).
    pub fn needs_next_token(&self) -> bool {
        self.groups
            .iter()
            .any(|group| group.naming == PageNaming::NextToken)
    }

    /// The name of block `block`'s page in group `group`: its chain hash or its next-token
    /// hash (R37); `None` for an unknown group or a page without a name.
    pub fn page_hash(
        &self,
        hashes: &PromptHashes,
        group: GroupId,
        block: usize,
    ) -> Option<BlockHash> {
        let naming = self.groups.get(self.index_of(group)?)?.naming;
        hashes.get(naming, block).copied()
    }

    /// The object identity of a block's page in a group on a rank.
    pub fn identity(&self, group: &GroupKeys, rank: u32, hash: BlockHash) -> ObjectIdentity {
        ObjectIdentity {
            layout_fingerprint: self.fingerprint,
            chain_hash: hash,
            group: group.group,
            shard: group.shard_of(rank),
        }
    }
}

impl GroupKeys {
    /// The shard a rank's page of this group is stored under.
    pub fn shard_of(&self, rank: u32) -> Shard {
        let index = if self.replicated { 0 } else { rank as usize };
        self.prefixes
            .get(index)
            .map_or(Shard::Replicated, |(shard, _)| *shard)
    }

    /// The key of a block's page on a rank.
    pub fn key(&self, rank: u32, hash: &BlockHash) -> String {
        let index = if self.replicated { 0 } else { rank as usize };
        self.prefixes
            .get(index)
            .map(|(_, prefix)| prefix.key(hash))
            .unwrap_or_default()
    }

    /// Every shard's key of a block: all must be present for the block to count (R3).
    pub fn all_shard_keys<'a>(&'a self, hash: &'a BlockHash) -> impl Iterator<Item = String> + 'a {
        self.prefixes
            .iter()
            .map(move |(_, prefix)| prefix.key(hash))
    }

    /// Shards behind one probe item.
    pub fn shard_count(&self) -> usize {
        self.prefixes.len()
    }
}
