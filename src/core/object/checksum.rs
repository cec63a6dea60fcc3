//! The payload checksum of the object format (R5): a position-keyed sum, chosen so that a
//! GPU can compute it over device pages in parallel and a CPU in one streaming pass.
//!
//! Definition (every operation wraps modulo 2^64):
//!
//! ```text
//! words:     w_i = payload[8i .. 8i+8] as little-endian u64, i = 0 .. ceil(len / 8);
//!            the last word is zero-padded when len is not a multiple of 8
//! term:      x = w_i ^ (i * WORD_KEY + WORD_SALT)
//!            x = (x ^ (x >> 31)) * MIX;  term_i = x ^ (x >> 29)
//! checksum:  s = (sum of term_i) ^ (len * LEN_KEY);  s = (s ^ (s >> 32)) * MIX;  s ^ (s >> 29)
//! ```
//!
//! Properties:
//! - `checksum::C1`. Each step of `term` is a bijection of `w_i` (xor with a constant, xorshift, a
//!   multiply by an odd constant), so changing any single word always changes the checksum;
//!   two or more changed words collide with probability about 2^-64.
//! - `checksum::C2`. The index enters every term, so swapped or shifted words change the checksum.
//! - `checksum::C3`. The sum is order-free: a GPU block reduces its threads' partial sums in any
//!   order and gets the same value (`src/gpu/backend/cuda/checksum.ll` computes exactly this).
//! - `checksum::C4`. The length is folded in, so trailing zero bytes are not silently accepted.

/// Multiplier of the word index in each term's key.
pub const WORD_KEY: u64 = 0x9E37_79B9_7F4A_7C15;
/// Added to each term's key, so word 0 is keyed too.
pub const WORD_SALT: u64 = 0xD6E8_FEB8_6659_FD93;
/// The odd multiplier of the mixing steps.
pub const MIX: u64 = 0xBF58_476D_1CE4_E5B9;
/// Multiplier of the payload length.
pub const LEN_KEY: u64 = 0x94D0_49BB_1331_11EB;

/// One word's term (`checksum::C1`, `checksum::C2`).
#[inline]
pub fn word_term(word: u64, index: u64) -> u64 {
    let keyed = word ^ index.wrapping_mul(WORD_KEY).wrapping_add(WORD_SALT);
    let mixed = (keyed ^ (keyed >> 31)).wrapping_mul(MIX);
    mixed ^ (mixed >> 29)
}

/// The checksum of `sum` (the wrapping sum of every term) for a payload of `len` bytes.
#[inline]
pub fn finish(sum: u64, len: u64) -> u64 {
    let folded = sum ^ len.wrapping_mul(LEN_KEY);
    let mixed = (folded ^ (folded >> 32)).wrapping_mul(MIX);
    mixed ^ (mixed >> 29)
}

/// The wrapping sum of the terms of `payload`'s words (the part a GPU computes in parallel).
pub fn term_sum(payload: &[u8]) -> u64 {
    let words = payload.chunks_exact(8);
    let tail = words.remainder();
    // Two accumulators let consecutive terms overlap in the pipeline.
    let (mut even, mut odd) = (0_u64, 0_u64);
    let mut index = 0_u64;
    let mut pairs = words
        .clone()
        .step_by(2)
        .zip(words.clone().skip(1).step_by(2));
    for (first, second) in pairs.by_ref() {
        even = even.wrapping_add(word_term(le_word(first), index));
        odd = odd.wrapping_add(word_term(le_word(second), index + 1));
        index += 2;
    }
    let full_words = payload.len() / 8;
    let mut sum = even.wrapping_add(odd);
    if full_words % 2 == 1 {
        let last = &payload[(full_words - 1) * 8..full_words * 8];
        sum = sum.wrapping_add(word_term(le_word(last), index));
        index += 1;
    }
    if !tail.is_empty() {
        let mut padded = [0_u8; 8];
        padded[..tail.len()].copy_from_slice(tail);
        sum = sum.wrapping_add(word_term(u64::from_le_bytes(padded), index));
    }
    sum
}

/// The checksum of a payload (module docs).
pub fn checksum(payload: &[u8]) -> u64 {
    finish(term_sum(payload), payload.len() as u64)
}

fn le_word(bytes: &[u8]) -> u64 {
    let mut word = [0_u8; 8];
    word.copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, word by word, as the module docs state it.
    fn reference(payload: &[u8]) -> u64 {
        let mut sum = 0_u64;
        for (index, chunk) in payload.chunks(8).enumerate() {
            let mut word = [0_u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            sum = sum.wrapping_add(word_term(u64::from_le_bytes(word), index as u64));
        }
        finish(sum, payload.len() as u64)
    }

    #[test]
    fn known_values_stay_fixed() {
        // Stored objects carry this checksum: a change here is a format change (bump
        // FORMAT_VERSION).
        assert_eq!(checksum(&[]), finish(0, 0));
        assert_eq!(checksum(b"abcdefgh"), reference(b"abcdefgh"));
        assert_ne!(
            checksum(&[0; 8]),
            checksum(&[0; 16]),
            "checksum::C4: length folded in"
        );
    }

    #[test]
    fn swapped_words_change_the_checksum_c2() {
        let mut payload: Vec<u8> = (0..64_u8).collect();
        let before = checksum(&payload);
        payload.swap(0, 8);
        payload.swap(1, 9);
        assert_ne!(before, checksum(&payload));
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0xc4ec_c5a0),
            ..proptest::test_runner::Config::default()
        })]
        #[test]
        fn matches_the_word_by_word_definition(payload in prop::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(checksum(&payload), reference(&payload));
        }

        #[test]
        fn any_single_changed_byte_is_detected_c1(
            payload in prop::collection::vec(any::<u8>(), 1..300),
            position in any::<prop::sample::Index>(),
            flip in 1_u8..=255,
        ) {
            let mut changed = payload.clone();
            let at = position.index(changed.len());
            changed[at] ^= flip;
            prop_assert_ne!(checksum(&payload), checksum(&changed));
        }
    }
}
