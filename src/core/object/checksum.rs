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
    keyed_term(word, index.wrapping_mul(WORD_KEY).wrapping_add(WORD_SALT))
}

/// The checksum of `sum` (the wrapping sum of every term) for a payload of `len` bytes.
#[inline]
pub fn finish(sum: u64, len: u64) -> u64 {
    let folded = sum ^ len.wrapping_mul(LEN_KEY);
    let mixed = (folded ^ (folded >> 32)).wrapping_mul(MIX);
    mixed ^ (mixed >> 29)
}

/// Words per round of [`term_sum`], one accumulator and one running key each: two AVX2
/// registers' worth, so the two vector chains overlap (one AVX-512 register; 16 lanes
/// measured no faster there).
const LANES: usize = 8;

/// The wrapping sum of the terms of `payload`'s words (the part a GPU computes in parallel).
///
/// [`LANES`] words a round, each lane with its own accumulator and its own key, advanced by
/// addition (word `i = r * LANES + l`, lane `l` of round `r`, has the key
/// `l * WORD_KEY + r * LANES * WORD_KEY + WORD_SALT`), so the rounds carry no multiply by the
/// index and the compiler can keep the lanes in vector registers where the target has
/// vector multiplies (the host device's checksums compile it that way with AVX2 and AVX-512,
/// `gpu::backend::host`). Inlined into its callers for that reason.
#[inline(always)]
#[allow(clippy::inline_always, reason = "the host device compiles it again for AVX2 and AVX-512 (see above)")]
pub fn term_sum(payload: &[u8]) -> u64 {
    let mut rounds = payload.chunks_exact(8 * LANES);
    let step = WORD_KEY.wrapping_mul(LANES as u64);
    let mut keys = [0_u64; LANES];
    for (lane, key) in keys.iter_mut().enumerate() {
        *key = (lane as u64).wrapping_mul(WORD_KEY).wrapping_add(WORD_SALT);
    }
    let mut sums = [0_u64; LANES];
    for round in rounds.by_ref() {
        for lane in 0..LANES {
            let word = le_word(&round[8 * lane..8 * lane + 8]);
            sums[lane] = sums[lane].wrapping_add(keyed_term(word, keys[lane]));
            keys[lane] = keys[lane].wrapping_add(step);
        }
    }
    let tail = rounds.remainder();
    let sum = sums.iter().fold(0_u64, |total, &lane| total.wrapping_add(lane));
    let first = ((payload.len() - tail.len()) / 8) as u64;
    (first..).zip(tail.chunks(8)).fold(sum, |sum, (index, word)| {
        let mut padded = [0_u8; 8];
        padded[..word.len()].copy_from_slice(word);
        sum.wrapping_add(word_term(u64::from_le_bytes(padded), index))
    })
}

/// [`word_term`] with its key (`index * WORD_KEY + WORD_SALT`) already made.
#[inline(always)]
#[allow(clippy::inline_always, reason = "the innermost step of term_sum's rounds")]
fn keyed_term(word: u64, key: u64) -> u64 {
    let keyed = word ^ key;
    let mixed = (keyed ^ (keyed >> 31)).wrapping_mul(MIX);
    mixed ^ (mixed >> 29)
}

/// The checksum of a payload (module docs). Inlined, as [`term_sum`] is.
#[inline(always)]
#[allow(clippy::inline_always, reason = "the host device compiles it again for AVX2 and AVX-512 (term_sum)")]
pub fn checksum(payload: &[u8]) -> u64 {
    finish(term_sum(payload), payload.len() as u64)
}

#[inline(always)]
#[allow(clippy::inline_always, reason = "the innermost step of term_sum's rounds")]
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
        fn matches_the_word_by_word_definition(payload in prop::collection::vec(any::<u8>(), 0..600)) {
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
