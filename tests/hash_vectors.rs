//! The Rust port reproduces the reference vectors byte for byte (R1, R3): scope seeds,
//! every block hash, and the keys of two columns per case, computed both in one shot and
//! by extending a chain chunk by chunk (R2). The vectors are those of
//! `../shared/reference/hash_vectors.json`, vendored as `tests/data/hash_vectors.json` so
//! the suite runs without `../shared`; where `../shared` is checked out beside the
//! repository, the vendored copies of it must equal their sources.

use std::error::Error;
use std::path::PathBuf;

use kv_connector::core::hash::{hash_blocks, scope_seed, BlockHash, HashChain, Scope};
use kv_connector::core::keys::{KeyColumn, KeyPrefix, KeySpec, Shard};
use kv_connector::core::layout::GroupId;

type TestResult = Result<(), Box<dyn Error>>;

/// The vector file: the reference's encoding notes and its cases.
#[derive(serde::Deserialize)]
struct Vectors {
    cases: Vec<Case>,
}

/// One case, as `hash_reference.py vectors` writes it.
#[derive(serde::Deserialize)]
struct Case {
    name: String,
    tokens: Vec<i64>,
    tokens_per_block: usize,
    salt: Option<String>,
    lora: Option<i64>,
    media_hex: Vec<String>,
    seed_hex: String,
    hashes_hex: Vec<String>,
    keys_w2r1_lg0: Vec<String>,
    keys_replicated_lg1: Vec<String>,
}

impl Case {
    fn scope(&self) -> Result<Scope, Box<dyn Error>> {
        let media = self
            .media_hex
            .iter()
            .map(|hex| media_digest(hex))
            .collect::<Result<_, _>>()?;
        Ok(Scope {
            salt: self.salt.clone(),
            lora: self.lora,
            media,
        })
    }

    /// The key spec of one of the two columns the vectors hold.
    fn spec(&self, shard: Shard, group: u32, bytes_per_page: u64) -> KeySpec<'static> {
        KeySpec {
            namespace: "ns",
            model_key: "model-a",
            shard,
            group: GroupId(group),
            tokens_per_block: self.tokens_per_block,
            bytes_per_page,
        }
    }
}

/// A 32-byte media digest from 64 hex digits.
fn media_digest(hex: &str) -> Result<[u8; 32], Box<dyn Error>> {
    let (high, low) = hex.split_at_checked(32).ok_or("media digest too short")?;
    let mut digest = [0u8; 32];
    digest[..16].copy_from_slice(&BlockHash::from_hex(high)?.0);
    digest[16..].copy_from_slice(&BlockHash::from_hex(low)?.0);
    Ok(digest)
}

fn load_vectors() -> Result<Vec<Case>, Box<dyn Error>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/hash_vectors.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    let vectors: Vectors = serde_json::from_str(&text)?;
    assert_eq!(vectors.cases.len(), 8, "the reference writes eight cases");
    Ok(vectors.cases)
}

fn hex_all(hashes: &[BlockHash]) -> Vec<String> {
    hashes.iter().map(BlockHash::to_hex).collect()
}

#[test]
fn r1_seeds_and_hashes_match_reference() -> TestResult {
    for case in load_vectors()? {
        let seed = scope_seed(&case.scope()?);
        assert_eq!(seed.to_hex(), case.seed_hex, "seed of {}", case.name);
        let hashes = hash_blocks(seed, &case.tokens, case.tokens_per_block)?;
        assert_eq!(
            hashes.len(),
            case.tokens.len() / case.tokens_per_block,
            "{}",
            case.name
        );
        assert_eq!(hex_all(&hashes), case.hashes_hex, "hashes of {}", case.name);
        let parsed: Vec<BlockHash> = case
            .hashes_hex
            .iter()
            .map(|hex| BlockHash::from_hex(hex))
            .collect::<Result<_, _>>()?;
        assert_eq!(parsed, hashes, "from_hex of {}", case.name);
    }
    Ok(())
}

#[test]
fn r2_chunked_chain_matches_reference() -> TestResult {
    for case in load_vectors()? {
        let seed = scope_seed(&case.scope()?);
        let mut chain = HashChain::new(seed, case.tokens_per_block)?;
        // Chunks of 7 tokens cut blocks of 4, 32 and 64 tokens at many offsets.
        let mut streamed = Vec::new();
        for end in (0..case.tokens.len()).step_by(7).chain([case.tokens.len()]) {
            streamed.extend(hex_all(chain.extend_to(&case.tokens[..end])?));
        }
        assert_eq!(
            streamed, case.hashes_hex,
            "streamed hashes of {}",
            case.name
        );
        assert_eq!(hex_all(chain.hashes()), case.hashes_hex, "{}", case.name);
        assert_eq!(chain.seed(), seed);
        assert_eq!(chain.tokens_per_block(), case.tokens_per_block);
    }
    Ok(())
}

#[test]
fn r3_keys_match_reference() -> TestResult {
    for case in load_vectors()? {
        let hashes = hash_blocks(
            scope_seed(&case.scope()?),
            &case.tokens,
            case.tokens_per_block,
        )?;
        let columns = [
            (
                case.spec(Shard::Rank { world: 2, rank: 1 }, 0, 4096),
                &case.keys_w2r1_lg0,
            ),
            (
                case.spec(Shard::Replicated, 1, 512),
                &case.keys_replicated_lg1,
            ),
        ];
        for (spec, expected) in columns {
            let prefix = KeyPrefix::validated(&spec)?;
            let column = KeyColumn::with_hashes(prefix.clone(), &hashes);
            assert_eq!(&column.as_strs(), expected, "{} {spec:?}", case.name);
            let mut grown = KeyColumn::new(prefix);
            for chunk in hashes.chunks(5) {
                grown.extend(chunk);
            }
            assert_eq!(&grown.as_strs(), expected, "grown {} {spec:?}", case.name);
        }
    }
    Ok(())
}

/// The vendored test data equals its source in `../shared` where that is checked out (it
/// is the source of truth; `tests/data` is its copy for machines without it).
#[test]
fn vendored_data_equals_the_shared_sources_when_present() -> TestResult {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let pairs = [
        (
            "tests/data/hash_vectors.json",
            "../shared/reference/hash_vectors.json",
        ),
        (
            "tests/data/mooncake_synthetic_trace.jsonl",
            "../shared/traces/mooncake_synthetic_trace.jsonl",
        ),
    ];
    for (vendored, source) in pairs {
        let Ok(original) = std::fs::read(root.join(source)) else {
            continue;
        };
        let copy = std::fs::read(root.join(vendored))?;
        assert!(
            copy == original,
            "{vendored} differs from {source}: copy it again"
        );
    }
    Ok(())
}
