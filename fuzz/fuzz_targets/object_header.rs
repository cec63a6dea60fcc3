//! Fuzzes the stored-object decoder (R5): `open` on arbitrary bytes returns a payload only
//! for an object whose header matches the expected identity and whose checksum matches;
//! and an object sealed from the input, with one byte flipped, is always refused.
#![no_main]

use kv_connector::core::hash::BlockHash;
use kv_connector::core::keys::Shard;
use kv_connector::core::layout::{GroupId, LayoutFingerprint};
use kv_connector::core::object::{object_len, open, seal, ObjectIdentity, HEADER_BYTES};
use libfuzzer_sys::fuzz_target;

fn identity() -> ObjectIdentity {
    ObjectIdentity {
        layout_fingerprint: LayoutFingerprint(0x5eed),
        chain_hash: BlockHash([7; 16]),
        group: GroupId(1),
        shard: Shard::Rank { world: 2, rank: 1 },
    }
}

fuzz_target!(|data: &[u8]| {
    let expected = identity();
    // Arbitrary bytes as an object of every plausible payload length.
    for payload_len in [0, 1, data.len().saturating_sub(HEADER_BYTES)] {
        if let Ok(payload) = open(&expected, data, payload_len) {
            assert_eq!(payload.len(), payload_len);
            assert_eq!(payload, &data[HEADER_BYTES..HEADER_BYTES + payload_len]);
        }
    }
    // Seal the input as a payload, then flip one byte chosen by the input.
    let Some((&selector, payload)) = data.split_first() else {
        return;
    };
    let mut object = vec![0; object_len(payload.len())];
    object[HEADER_BYTES..].copy_from_slice(payload);
    let len = seal(&expected, &mut object, payload.len()).expect("the buffer fits");
    assert_eq!(open(&expected, &object[..len], payload.len()).ok(), Some(payload));
    let flip = usize::from(selector) * 7919 % len;
    object[flip] ^= 1 << (selector % 8);
    assert!(
        open(&expected, &object[..len], payload.len()).is_err(),
        "a flipped byte at {flip} went unnoticed"
    );
});
