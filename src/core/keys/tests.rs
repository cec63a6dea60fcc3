//! Tests of key formatting, validation and columns (R3, R4).

use super::*;

const HASH_HEX: &str = "2cbd989e68a1d62fe8bebc04262e3dd9";

fn spec() -> KeySpec<'static> {
    KeySpec {
        namespace: "ns",
        model_key: "model-a",
        shard: Shard::Rank { world: 2, rank: 1 },
        group: GroupId(0),
        tokens_per_block: 4,
        bytes_per_page: 4096,
    }
}

#[test]
fn r3_key_matches_reference_format() -> Result<(), Box<dyn std::error::Error>> {
    let hash = BlockHash::from_hex(HASH_HEX)?;
    let prefix = KeyPrefix::validated(&spec())?;
    assert_eq!(prefix.as_str(), "ns/model-a/w2r1/lg0/t4b4096/");
    assert_eq!(
        prefix.key(&hash),
        format!("ns/model-a/w2r1/lg0/t4b4096/{HASH_HEX}")
    );
    let replicated = KeySpec {
        shard: Shard::Replicated,
        group: GroupId(1),
        bytes_per_page: 512,
        ..spec()
    };
    assert_eq!(
        KeyPrefix::new(&replicated).key(&hash),
        format!("ns/model-a/replicated/lg1/t4b512/{HASH_HEX}")
    );
    Ok(())
}

#[test]
fn r3_column_extends_incrementally_with_equal_length_keys() {
    let hashes: Vec<BlockHash> = (0u8..5).map(|i| BlockHash([i; 16])).collect();
    let prefix = KeyPrefix::new(&spec());
    let mut column = KeyColumn::new(prefix.clone());
    assert!(column.is_empty());
    column.reserve(5);
    column.extend(&hashes[..2]);
    column.extend(&[]);
    column.extend(&hashes[2..]);
    assert_eq!(column.len(), 5);
    let expected: Vec<String> = hashes.iter().map(|h| prefix.key(h)).collect();
    assert_eq!(column.as_strs(), expected);
    assert_eq!(column.iter().len(), 5);
    assert!(column.iter().all(|key| key.len() == column.key_len()));
    assert_eq!(column.get(4), Some(expected[4].as_str()));
    assert_eq!(column.get(5), None);
    column.truncate(3);
    assert_eq!(column.as_strs(), expected[..3]);
    column.truncate(7);
    assert_eq!(column.len(), 3);
    let rebuilt = KeyColumn::with_hashes(prefix, &hashes[..3]);
    assert_eq!(rebuilt.as_strs(), column.as_strs());
}

#[test]
fn r3_column_handles_non_ascii_prefix() {
    let odd = KeySpec {
        namespace: "ns é",
        ..spec()
    };
    let hashes = [BlockHash([0xab; 16]), BlockHash([0x01; 16])];
    let prefix = KeyPrefix::new(&odd);
    let column = KeyColumn::with_hashes(prefix.clone(), &hashes);
    let expected: Vec<String> = hashes.iter().map(|h| prefix.key(h)).collect();
    assert_eq!(column.as_strs(), expected);
    assert_eq!(column.get(1), Some(expected[1].as_str()));
}

#[test]
fn r4_unvalidated_prefixes_can_collide_and_validated_refuses_them() {
    let left = KeySpec {
        namespace: "a/b",
        model_key: "c",
        ..spec()
    };
    let right = KeySpec {
        namespace: "a",
        model_key: "b/c",
        ..spec()
    };
    assert_eq!(KeyPrefix::new(&left), KeyPrefix::new(&right));
    let err = KeyPrefix::validated(&left).err();
    assert_eq!(
        err,
        Some(KeyError::SlashInSegment {
            field: KeyField::Namespace,
            value: "a/b".to_owned()
        })
    );
    assert_eq!(err.map(|e| e.kind()), Some("slash_in_segment"));
    assert!(matches!(
        KeyPrefix::validated(&right),
        Err(KeyError::SlashInSegment {
            field: KeyField::ModelKey,
            ..
        })
    ));
}

#[test]
fn r4_validated_refuses_each_bad_field() {
    let cases = [
        (
            KeySpec {
                namespace: "",
                ..spec()
            },
            "empty_segment",
        ),
        (
            KeySpec {
                model_key: "",
                ..spec()
            },
            "empty_segment",
        ),
        (
            KeySpec {
                tokens_per_block: 0,
                ..spec()
            },
            "zero_tokens_per_block",
        ),
        (
            KeySpec {
                bytes_per_page: 0,
                ..spec()
            },
            "zero_bytes_per_page",
        ),
        (
            KeySpec {
                shard: Shard::Rank { world: 2, rank: 2 },
                ..spec()
            },
            "rank_out_of_range",
        ),
        (
            KeySpec {
                shard: Shard::Rank { world: 0, rank: 0 },
                ..spec()
            },
            "rank_out_of_range",
        ),
    ];
    for (bad, kind) in cases {
        let err = KeyPrefix::validated(&bad).err();
        assert_eq!(err.as_ref().map(KeyError::kind), Some(kind), "{bad:?}");
    }
    let message = KeyPrefix::validated(&KeySpec {
        namespace: "",
        ..spec()
    })
    .err()
    .map(|e| e.to_string());
    assert_eq!(
        message.as_deref(),
        Some("namespace must not be empty; set it to a name such as \"kv\"")
    );
}

#[test]
fn r4_adjacent_numbers_stay_apart() -> Result<(), KeyError> {
    let hash = BlockHash::default();
    let key = |tokens_per_block, bytes_per_page, group, world, rank| {
        let spec = KeySpec {
            tokens_per_block,
            bytes_per_page,
            group: GroupId(group),
            shard: Shard::Rank { world, rank },
            ..spec()
        };
        KeyPrefix::validated(&spec).map(|prefix| prefix.key(&hash))
    };
    assert_ne!(key(1, 12, 0, 2, 1)?, key(11, 2, 0, 2, 1)?);
    assert_ne!(key(1, 2, 1, 12, 1)?, key(1, 2, 1, 121, 1)?);
    assert_ne!(key(1, 2, 0, 12, 1)?, key(1, 2, 0, 1, 0)?);
    Ok(())
}

mod properties {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    use super::super::*;

    /// Owned form of a [`KeySpec`] plus a hash, so proptest can generate it.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Fields {
        namespace: String,
        model_key: String,
        shard: Shard,
        group: u32,
        tokens_per_block: usize,
        bytes_per_page: u64,
        hash: [u8; 16],
    }

    impl Fields {
        fn spec(&self) -> KeySpec<'_> {
            KeySpec {
                namespace: &self.namespace,
                model_key: &self.model_key,
                shard: self.shard,
                group: GroupId(self.group),
                tokens_per_block: self.tokens_per_block,
                bytes_per_page: self.bytes_per_page,
            }
        }

        /// The validated key, or `None` when validation refuses the fields.
        fn key(&self) -> Option<String> {
            let prefix = KeyPrefix::validated(&self.spec()).ok()?;
            Some(prefix.key(&BlockHash(self.hash)))
        }

        /// A copy with the fields whose bit is set in `mask` taken from `other`
        /// (bit 0 namespace, 1 model key, 2 shard, 3 group, 4 T, 5 page bytes, 6 hash).
        fn with_fields_of(&self, other: &Self, mask: u8) -> Self {
            let mut out = self.clone();
            let take = |bit: u8| mask & (1 << bit) != 0;
            if take(0) {
                out.namespace.clone_from(&other.namespace);
            }
            if take(1) {
                out.model_key.clone_from(&other.model_key);
            }
            if take(2) {
                out.shard = other.shard;
            }
            if take(3) {
                out.group = other.group;
            }
            if take(4) {
                out.tokens_per_block = other.tokens_per_block;
            }
            if take(5) {
                out.bytes_per_page = other.bytes_per_page;
            }
            if take(6) {
                out.hash = other.hash;
            }
            out
        }
    }

    /// Small domains with digits, letters used by the format and '/', so that
    /// near-collisions ("t1b12" against "t11b2", "a/b"+"c" against "a"+"b/c") occur.
    fn fields() -> impl Strategy<Value = Fields> {
        let shard = prop_oneof![
            Just(Shard::Replicated),
            (0u32..13, 0u32..13).prop_map(|(world, rank)| Shard::Rank { world, rank }),
        ];
        let hash = prop_oneof![Just([0u8; 16]), Just([1u8; 16]), any::<[u8; 16]>()];
        (
            "[ab1/rw]{0,3}",
            "[ab1/rw]{0,3}",
            shard,
            0u32..13,
            0usize..13,
            0u64..13,
            hash,
        )
            .prop_map(
                |(namespace, model_key, shard, group, tokens_per_block, bytes_per_page, hash)| {
                    Fields {
                        namespace,
                        model_key,
                        shard,
                        group,
                        tokens_per_block,
                        bytes_per_page,
                        hash,
                    }
                },
            )
    }

    fn config() -> Config {
        Config {
            cases: 2048,
            rng_seed: RngSeed::Fixed(0x6b65_7973),
            failure_persistence: None,
            ..Config::default()
        }
    }

    /// Reads a validated key back into its fields (I3); `None` if it does not parse.
    fn parse(key: &str) -> Option<Fields> {
        let mut parts = key.split('/');
        let namespace = parts.next()?.to_owned();
        let model_key = parts.next()?.to_owned();
        let shard = match parts.next()? {
            "replicated" => Shard::Replicated,
            rank_part => {
                let (world, rank) = rank_part.strip_prefix('w')?.split_once('r')?;
                Shard::Rank {
                    world: world.parse().ok()?,
                    rank: rank.parse().ok()?,
                }
            }
        };
        let group = parts.next()?.strip_prefix("lg")?.parse().ok()?;
        let (tokens, bytes) = parts.next()?.strip_prefix('t')?.split_once('b')?;
        let hash = BlockHash::from_hex(parts.next()?).ok()?.0;
        if parts.next().is_some() {
            return None;
        }
        Some(Fields {
            namespace,
            model_key,
            shard,
            group,
            tokens_per_block: tokens.parse().ok()?,
            bytes_per_page: bytes.parse().ok()?,
            hash,
        })
    }

    proptest! {
        #![proptest_config(config())]

        /// R4: changing any field, or several at once, of a validated spec changes the
        /// key.
        #[test]
        fn r4_keys_differ_when_any_field_differs(
            base in fields(),
            other in fields(),
            mask in 1u8..128,
        ) {
            let changed = base.with_fields_of(&other, mask);
            if let (Some(key), Some(changed_key)) = (base.key(), changed.key()) {
                prop_assert_eq!(key == changed_key, base == changed);
            }
        }

        /// R4 / I3: a validated key reads back into exactly its fields, so distinct
        /// fields can never share a key.
        #[test]
        fn r4_validated_keys_read_back_to_their_fields(fields in fields()) {
            if let Some(key) = fields.key() {
                prop_assert_eq!(parse(&key), Some(fields));
            }
        }

        /// I1: a column equals the keys formatted one by one, in order.
        #[test]
        fn r3_column_equals_per_key_formatting(
            fields in fields(),
            hashes in proptest::collection::vec(any::<[u8; 16]>(), 0..40),
            split in any::<prop::sample::Index>(),
        ) {
            let hashes: Vec<BlockHash> = hashes.into_iter().map(BlockHash).collect();
            let prefix = KeyPrefix::new(&fields.spec());
            let cut = split.index(hashes.len() + 1);
            let mut column = KeyColumn::new(prefix.clone());
            column.extend(&hashes[..cut]);
            column.extend(&hashes[cut..]);
            let expected: Vec<String> = hashes.iter().map(|h| prefix.key(h)).collect();
            prop_assert_eq!(column.as_strs(), expected);
        }
    }
}
