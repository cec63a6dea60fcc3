//! A finished lookup as bytes, handed from the connector that looked a request up to the
//! connectors that load and save it in other processes (R33).
//!
//! A deployment whose scheduler and ranks live in separate processes looks each request
//! up once, on the scheduler's lookup-only connector; every rank's connector adopts that
//! lookup (its plan and its page names) instead of hashing the prompt and probing the pool
//! again. So all ranks load what the one offer promised and save under the same names.
//!
//! Invariants:
//!
//! - `lookup_record::L1`. A record decodes to exactly the plan and page names it was made
//!   of (round trip).
//! - `lookup_record::L2`. A record is taken only by a connector of the same deployment (the
//!   layout fingerprint that names its keys, R4) and only when it is consistent: every
//!   planned block has a name, blocks ascend, and the draft names never outnumber the chain.
//!   Anything else is refused, never half-adopted.
//! - `lookup_record::L3`. [`LookupRecord::keep_groups`] drops only other groups' loads: the
//!   offer (resume point, outcome) stays what the lookup-only connector answered.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::core::hash::{BlockHash, HASH_BYTES};
use crate::core::layout::{GroupId, LayoutFingerprint};
use crate::core::page_names::{PageNaming, PromptHashes};
use crate::core::planner::LookupPlan;

/// The wire format's version: bumped whenever [`Wire`] changes.
const VERSION: u32 = 2;

/// A lookup's result: the plan (`None` when the pool could not be asked) and the page names.
#[derive(Clone, Debug)]
pub struct LookupRecord {
    /// The plan the offer was made from.
    pub plan: Option<LookupPlan>,
    /// Tokens the engine had computed itself when it looked the request up.
    pub local_match_tokens: usize,
    /// The prompt's page names.
    pub hashes: PromptHashes,
}

/// Why a record was refused (`lookup_record::L2`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not a record of this version.
    #[error("not a lookup record of this kv_connector version: {0}")]
    Malformed(String),
    /// A record of another deployment.
    #[error(
        "a lookup record for layouts [{theirs}], but this connector's keys are named by layout \
         {ours}: give every part of a deployment its layout from the same model and settings"
    )]
    OtherDeployment {
        /// This connector's fingerprint.
        ours: LayoutFingerprint,
        /// The record's, hex.
        theirs: String,
    },
    /// A plan that does not fit its page names.
    #[error("an inconsistent lookup record: {0}")]
    Inconsistent(&'static str),
}

#[derive(Serialize, Deserialize)]
struct Wire {
    version: u32,
    fingerprints: Vec<u64>,
    plan: Option<LookupPlan>,
    local_match_tokens: usize,
    chain: NameBytes,
    next_token: NameBytes,
}

/// Page names on the wire: their bytes end to end, as one byte string. (Serde writes a
/// `[u8; 16]` field by field; for a 131,072-token prompt's names that took most of the
/// 0.2 ms an encoding cost the scheduler's thread.)
struct NameBytes(Vec<u8>);

impl NameBytes {
    fn of(names: &[BlockHash]) -> Self {
        let mut bytes = Vec::with_capacity(names.len() * HASH_BYTES);
        for name in names {
            bytes.extend_from_slice(&name.0);
        }
        NameBytes(bytes)
    }

    /// How many names the bytes hold (a partial one is refused by [`Self::names`]).
    fn count(&self) -> usize {
        self.0.len() / HASH_BYTES
    }

    fn names(&self) -> Result<Vec<BlockHash>, RecordError> {
        let partial = || {
            RecordError::Malformed(format!(
                "{} bytes of page names, not a multiple of {HASH_BYTES}",
                self.0.len()
            ))
        };
        self.0
            .chunks(HASH_BYTES)
            .map(|name| name.try_into().map(BlockHash).map_err(|_| partial()))
            .collect()
    }
}

impl Serialize for NameBytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for NameBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl serde::de::Visitor<'_> for Bytes {
            type Value = NameBytes;
            fn expecting(&self, out: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                out.write_str("page names as one byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<NameBytes, E> {
                Ok(NameBytes(bytes.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<NameBytes, E> {
                Ok(NameBytes(bytes))
            }
        }
        deserializer.deserialize_bytes(Bytes)
    }
}

impl LookupRecord {
    /// The record as bytes, for connectors keyed by any of `fingerprints` (the parts of
    /// the deployment: its pipeline stages).
    pub fn encode(&self, fingerprints: &[LayoutFingerprint]) -> Vec<u8> {
        let wire = Wire {
            version: VERSION,
            fingerprints: fingerprints.iter().map(|fingerprint| fingerprint.0).collect(),
            plan: self.plan.clone(),
            local_match_tokens: self.local_match_tokens,
            chain: NameBytes::of(self.hashes.chain()),
            next_token: NameBytes::of(self.hashes.names(PageNaming::NextToken)),
        };
        // Plain data with no maps or foreign types: encoding cannot fail.
        bincode::serde::encode_to_vec(&wire, bincode::config::standard()).unwrap_or_default()
    }

    /// The record in `bytes`, for a connector keyed by `fingerprint`.
    ///
    /// # Errors
    /// [`RecordError`] for anything `lookup_record::L2` refuses.
    pub fn decode(bytes: &[u8], fingerprint: LayoutFingerprint) -> Result<Self, RecordError> {
        let (wire, used): (Wire, usize) =
            bincode::serde::decode_from_slice(bytes, bincode::config::standard())
                .map_err(|error| RecordError::Malformed(error.to_string()))?;
        if wire.version != VERSION || used != bytes.len() {
            return Err(RecordError::Malformed(format!(
                "version {} ({} of {} bytes read)",
                wire.version,
                used,
                bytes.len()
            )));
        }
        if !wire.fingerprints.contains(&fingerprint.0) {
            return Err(RecordError::OtherDeployment {
                ours: fingerprint,
                theirs: wire.fingerprints.iter().map(|theirs| format!("{theirs:016x}")).collect::<Vec<_>>().join(", "),
            });
        }
        check(&wire)?;
        Ok(LookupRecord {
            plan: wire.plan,
            local_match_tokens: wire.local_match_tokens,
            hashes: PromptHashes::from_parts(wire.chain.names()?, wire.next_token.names()?),
        })
    }

    /// Keeps the loads of the groups `local` says this connector holds (`lookup_record::L3`).
    pub fn keep_groups(&mut self, local: impl Fn(GroupId) -> bool) {
        if let Some(plan) = &mut self.plan {
            plan.loads.retain(|load| local(load.group));
        }
    }
}

/// `lookup_record::L2`'s consistency checks.
fn check(wire: &Wire) -> Result<(), RecordError> {
    if wire.next_token.count() > wire.chain.count() {
        return Err(RecordError::Inconsistent("more draft names than blocks"));
    }
    let Some(plan) = &wire.plan else {
        return Ok(());
    };
    for load in &plan.loads {
        if load.blocks.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(RecordError::Inconsistent("planned blocks do not ascend"));
        }
        if load.blocks.last().is_some_and(|&last| last >= wire.chain.count()) {
            return Err(RecordError::Inconsistent("a planned block has no name"));
        }
    }
    if plan.resume_tokens < plan.local_match_tokens
        || plan.local_match_tokens != wire.local_match_tokens
    {
        return Err(RecordError::Inconsistent("resumes below its local match"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::RngSeed;

    use super::*;
    use crate::core::planner::{GroupLoad, LookupOutcome};

    const FINGERPRINT: LayoutFingerprint = LayoutFingerprint(0x5eed);

    fn hashes(count: usize, salt: u8) -> Vec<BlockHash> {
        (0..count)
            .map(|i| BlockHash(std::array::from_fn(|b| salt ^ (i * 31 + b * 7).to_le_bytes()[0])))
            .collect()
    }

    fn record(blocks: usize, planned: Vec<(u32, Vec<usize>)>, drafts: bool) -> LookupRecord {
        let plan = LookupPlan {
            outcome: LookupOutcome::Full,
            resume_tokens: blocks * 16,
            local_match_tokens: 0,
            full_hit_tokens: blocks * 16,
            offered_tokens: blocks * 16,
            loads: planned
                .into_iter()
                .map(|(group, blocks)| GroupLoad {
                    group: GroupId(group),
                    blocks,
                })
                .collect(),
            rounds: 1,
            probed_items: blocks,
        };
        let next = if drafts { hashes(blocks.saturating_sub(1), 7) } else { Vec::new() };
        LookupRecord {
            plan: Some(plan),
            local_match_tokens: 0,
            hashes: PromptHashes::from_parts(hashes(blocks, 1), next),
        }
    }

    fn same(a: &LookupRecord, b: &LookupRecord) -> bool {
        a.plan == b.plan
            && a.local_match_tokens == b.local_match_tokens
            && a.hashes.chain() == b.hashes.chain()
            && a.hashes.names(PageNaming::NextToken) == b.hashes.names(PageNaming::NextToken)
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            rng_seed: RngSeed::Fixed(0x4c52_4543),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// `lookup_record::L1`.
        #[test]
        fn a_record_round_trips(blocks in 1usize..300, groups in 1u32..4, drafts: bool) {
            let planned = (0..groups).map(|g| (g, (0..blocks).step_by(g as usize + 1).collect())).collect();
            let original = record(blocks, planned, drafts);
            let bytes = original.encode(&[FINGERPRINT]);
            let decoded = LookupRecord::decode(&bytes, FINGERPRINT);
            prop_assert!(decoded.is_ok_and(|decoded| same(&decoded, &original)));
        }

        /// `lookup_record::L2`: a record cut short is refused.
        #[test]
        fn a_truncated_record_is_refused(blocks in 1usize..50, cut in 1usize..64) {
            let bytes = record(blocks, vec![(0, (0..blocks).collect())], true).encode(&[FINGERPRINT]);
            let kept = bytes.len().saturating_sub(cut);
            prop_assert!(LookupRecord::decode(&bytes[..kept], FINGERPRINT).is_err());
        }
    }

    /// `lookup_record::L2`: another deployment's record is refused; any stage's is taken.
    #[test]
    fn another_deployments_record_is_refused() {
        let stages = [LayoutFingerprint(1), FINGERPRINT];
        let bytes = record(4, vec![(0, vec![0, 1, 2, 3])], false).encode(&stages);
        assert!(LookupRecord::decode(&bytes, FINGERPRINT).is_ok());
        assert!(LookupRecord::decode(&bytes, LayoutFingerprint(1)).is_ok());
        let refused = LookupRecord::decode(&bytes, LayoutFingerprint(2));
        assert!(matches!(refused, Err(RecordError::OtherDeployment { .. })));
    }

    /// `lookup_record::L2`: page names that end in part of a name are refused, with the
    /// byte count.
    #[test]
    fn a_partial_page_name_is_refused() {
        let wire = Wire {
            version: VERSION,
            fingerprints: vec![FINGERPRINT.0],
            plan: None,
            local_match_tokens: 0,
            chain: NameBytes(vec![7; 2 * HASH_BYTES + 3]),
            next_token: NameBytes(Vec::new()),
        };
        let bytes = bincode::serde::encode_to_vec(&wire, bincode::config::standard());
        let refused = bytes.map(|bytes| LookupRecord::decode(&bytes, FINGERPRINT));
        assert!(
            matches!(&refused, Ok(Err(RecordError::Malformed(why))) if why.contains("35 bytes")),
            "{refused:?}"
        );
    }

    /// `lookup_record::L2`: a block past the names, or out of order, is refused.
    #[test]
    fn inconsistent_plans_are_refused() {
        for blocks in [vec![0, 4], vec![2, 1]] {
            let bytes = record(4, vec![(0, blocks)], false).encode(&[FINGERPRINT]);
            let refused = LookupRecord::decode(&bytes, FINGERPRINT);
            assert!(matches!(refused, Err(RecordError::Inconsistent(_))));
        }
    }

    /// `lookup_record::L3`.
    #[test]
    fn keeping_groups_drops_only_other_groups_loads() {
        let mut kept = record(4, vec![(0, vec![0, 1]), (1, vec![2, 3]), (2, vec![3])], false);
        kept.keep_groups(|group| group != GroupId(1));
        let groups: Vec<u32> = kept
            .plan
            .iter()
            .flat_map(|plan| plan.loads.iter().map(|load| load.group.0))
            .collect();
        assert_eq!(groups, vec![0, 2]);
        assert_eq!(kept.plan.map(|plan| plan.resume_tokens), Some(64));
    }
}
