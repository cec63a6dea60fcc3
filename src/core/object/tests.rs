//! Object format tests (R5): round trip and every corrupted field refused.

use proptest::prelude::*;

use super::*;

fn identity() -> ObjectIdentity {
    ObjectIdentity {
        layout_fingerprint: LayoutFingerprint(0x0123_4567_89ab_cdef),
        chain_hash: BlockHash([7; 16]),
        group: GroupId(1),
        shard: Shard::Rank { world: 2, rank: 1 },
    }
}

fn sealed(payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0; object_len(payload.len())];
    buf[HEADER_BYTES..].copy_from_slice(payload);
    let written = seal(&identity(), &mut buf, payload.len()).unwrap();
    assert_eq!(written, buf.len());
    buf
}

#[test]
fn round_trip_returns_the_payload() -> Result<(), ObjectError> {
    let payload: Vec<u8> = (0..4096_u32).map(|i| (i % 251) as u8).collect();
    let object = sealed(&payload);
    assert_eq!(open(&identity(), &object, payload.len())?, &payload[..]);
    // A longer buffer (a staging slot) still opens to exactly the payload.
    let mut slot = object.clone();
    slot.extend_from_slice(&[0xAA; 100]);
    assert_eq!(open(&identity(), &slot, payload.len())?, &payload[..]);
    Ok(())
}

#[test]
fn header_fits_its_area() {
    let header = WireHeader {
        magic: MAGIC,
        version: 0,
        layout_fingerprint: 0,
        chain_hash: [0; 16],
        group: 0,
        shard_kind: 0,
        shard_world: 0,
        shard_rank: 0,
        payload_len: 0,
        checksum: 0,
    };
    let bytes = bincode::encode_to_vec(header, wire_config()).unwrap();
    assert!(bytes.len() <= HEADER_BYTES, "{}", bytes.len());
}

/// Every field of the expected identity, changed, is refused with its own error.
#[test]
fn every_mismatched_identity_field_is_refused() {
    let object = sealed(&[1, 2, 3, 4]);
    let mut other = identity();
    other.layout_fingerprint = LayoutFingerprint(1);
    assert!(matches!(
        open(&other, &object, 4),
        Err(ObjectError::FingerprintMismatch { .. })
    ));
    let mut other = identity();
    other.chain_hash = BlockHash([8; 16]);
    assert!(matches!(
        open(&other, &object, 4),
        Err(ObjectError::HashMismatch { .. })
    ));
    let mut other = identity();
    other.group = GroupId(0);
    assert!(matches!(
        open(&other, &object, 4),
        Err(ObjectError::GroupMismatch { .. })
    ));
    for shard in [
        Shard::Rank { world: 2, rank: 0 },
        Shard::Rank { world: 4, rank: 1 },
        Shard::Replicated,
    ] {
        let mut other = identity();
        other.shard = shard;
        assert!(
            matches!(
                open(&other, &object, 4),
                Err(ObjectError::ShardMismatch { .. })
            ),
            "{shard}"
        );
    }
    assert!(matches!(
        open(&identity(), &object[..object.len() - 1], 4),
        Err(ObjectError::Truncated { .. })
    ));
    let mut longer = object.clone();
    longer.push(0);
    assert!(matches!(
        open(&identity(), &longer, 5),
        Err(ObjectError::PayloadLengthMismatch { .. })
    ));
}

#[test]
fn corrupted_magic_version_and_payload_are_refused() {
    let object = sealed(&[9; 64]);
    let mut bad = object.clone();
    bad[0] ^= 1;
    assert!(matches!(
        open(&identity(), &bad, 64),
        Err(ObjectError::BadMagic { .. })
    ));
    let mut bad = object.clone();
    bad[4] ^= 1;
    assert_eq!(
        open(&identity(), &bad, 64),
        Err(ObjectError::UnsupportedVersion {
            found: FORMAT_VERSION ^ 1
        })
    );
    let mut bad = object.clone();
    bad[HEADER_BYTES + 10] ^= 0x80;
    assert!(matches!(
        open(&identity(), &bad, 64),
        Err(ObjectError::ChecksumMismatch { .. })
    ));
    let mut bad = object;
    bad[HEADER_BYTES - 1] = 1;
    assert_eq!(open(&identity(), &bad, 64), Err(ObjectError::Undecodable));
}

#[test]
fn seal_refuses_a_short_buffer() {
    let mut buf = vec![0; HEADER_BYTES + 3];
    assert_eq!(
        seal(&identity(), &mut buf, 4),
        Err(ObjectError::BufferTooSmall {
            len: HEADER_BYTES + 3,
            payload_len: 4
        })
    );
}

proptest! {
    #![proptest_config(proptest::test_runner::Config {
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x0b1e_c7f1),
        ..proptest::test_runner::Config::default()
    })]
    /// Any single flipped bit anywhere in header or payload is refused (R5).
    #[test]
    fn any_flipped_bit_is_refused(payload in prop::collection::vec(any::<u8>(), 1..512), pick in any::<prop::sample::Index>(), bit in 0_u8..8) {
        let object = sealed(&payload);
        let mut bad = object.clone();
        let at = pick.index(bad.len());
        bad[at] ^= 1 << bit;
        prop_assert!(open(&identity(), &bad, payload.len()).is_err(), "flip at byte {at} bit {bit} accepted");
        prop_assert_eq!(open(&identity(), &object, payload.len()), Ok(&payload[..]));
    }
}
