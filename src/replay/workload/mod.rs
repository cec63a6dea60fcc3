//! Replay workloads: the requests a replay feeds to simulated serving instances (`docs/DESIGN.md`
//! section 11).
//!
//! A workload is a `Vec<`[`WorkloadRequest`]`>` in arrival order. A request does not hold
//! its prompt tokens: the shared Mooncake trace alone has 61 M prompt tokens, so a request
//! holds a compact [`PromptSource`] and produces its tokens on demand
//! ([`WorkloadRequest::write_prompt_tokens`]) into a buffer the caller reuses.
//!
//! Workflow:
//! 1. build the requests: [`read_mooncake_trace`] (a trace file, streamed line by line) or
//!    [`generate_long_multiturn`] (conversations: long ones growing from about 100k to 170k
//!    tokens, or many about a few shared documents);
//! 2. for each request in order, write its prompt tokens, hash them into a chain (R1), and
//!    ask the [`Oracle`] how many tokens an unbounded prefix pool would have reused (and,
//!    for hybrid layouts, how many with window groups stored at prompt ends and at window
//!    checkpoints).
//!
//! Invariants:
//! - `workload::I1`. Tokens are a pure function of the prompt source: the same source always writes
//!   the same tokens, on every machine and run.
//! - `workload::I2`. Every token is in `[0, VOCAB_SIZE)`.
//! - `workload::I3`. `prompt_len()` equals the number of tokens `write_prompt_tokens` writes.
//! - `workload::I4`. A Mooncake hash id always gives the same 512-token block (the first `n` tokens
//!   of it when the block is cut), whatever request or position it appears in.

mod error;
mod generate;
mod oracle;
mod trace;

pub use error::{GenerateError, TraceError};
pub use generate::{generate_long_multiturn, LongMultiturnParams};
pub use oracle::Oracle;
pub use trace::{read_mooncake_trace, MAX_INPUT_LENGTH};
#[cfg(feature = "internals")]
pub use {
    generate::MAX_GENERATED_REQUESTS,
    oracle::OracleTotals,
    trace::{TraceReader, MAX_LINE_BYTES, MAX_OUTPUT_LENGTH, MAX_TIMESTAMP_MS},
};

/// Vocabulary size of the token ids a workload produces (that of gpt-oss).
pub const VOCAB_SIZE: u32 = 201_088;

/// Tokens per hash id in a Mooncake trace.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;

/// The golden-ratio increment of splitmix64.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// Domain tag for the seeds of Mooncake blocks, so that they never collide with the seeds of
/// generated segments.
const MOONCAKE_DOMAIN: u64 = 0x6d6f_6f6e_6361_6b65;

/// The splitmix64 finaliser: a bijective mix of 64 bits.
pub(crate) fn mix64(value: u64) -> u64 {
    let mut z = value;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Derives a stream seed from a list of parts (domain, seed, session, turn, ...).
pub(crate) fn derive_seed(parts: &[u64]) -> u64 {
    parts.iter().fold(GOLDEN_GAMMA, |acc, part| {
        mix64(acc ^ mix64(part.wrapping_add(GOLDEN_GAMMA)))
    })
}

/// Token `index` of the deterministic stream `seed` (`workload::I1`, `workload::I2`): random
/// access, so a stream cut anywhere is a prefix of the same stream cut later.
pub fn stream_token(seed: u64, index: u64) -> i64 {
    let z = mix64(seed.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)));
    // The high 32 bits scaled onto the vocabulary: below 2^32 * VOCAB_SIZE < 2^50, no overflow.
    let high = i64::from(u32::try_from(z >> 32).unwrap_or(u32::MAX));
    (high * i64::from(VOCAB_SIZE)) >> 32
}

/// Appends the first `len` tokens of stream `seed` to `out`.
fn extend_with_stream(out: &mut Vec<i64>, seed: u64, len: u64) {
    out.extend((0..len).map(|index| stream_token(seed, index)));
}

/// Appends the first `len` tokens (at most 512) of the block of Mooncake hash id `hash_id`
/// to `out` (`workload::I4`).
pub fn extend_with_mooncake_block(out: &mut Vec<i64>, hash_id: u64, len: usize) {
    let len = len.min(MOONCAKE_BLOCK_TOKENS);
    let seed = derive_seed(&[MOONCAKE_DOMAIN, hash_id]);
    extend_with_stream(out, seed, u64::try_from(len).unwrap_or(0));
}

/// A run of tokens from one deterministic stream: the first `len` tokens of stream `seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenSegment {
    /// The stream (see [`stream_token`]).
    pub seed: u64,
    /// How many tokens of it, from its start.
    pub len: u32,
}

/// Where a request's prompt tokens come from; tokens are produced on demand (`workload::I1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptSource {
    /// A Mooncake trace line: one 512-token block per hash id, the last block cut so that the
    /// prompt has exactly `prompt_len` tokens (`workload::I4`).
    MooncakeBlocks {
        /// The line's `hash_ids`, in order.
        hash_ids: Vec<u64>,
        /// The line's `input_length`: `(n - 1) * 512 < prompt_len <= n * 512`.
        prompt_len: u32,
    },
    /// The concatenation of token segments (generated conversations).
    Segments(Vec<TokenSegment>),
}

impl PromptSource {
    /// Prompt length in tokens (`workload::I3`).
    pub fn prompt_len(&self) -> usize {
        match self {
            PromptSource::MooncakeBlocks { prompt_len, .. } => to_usize(u64::from(*prompt_len)),
            PromptSource::Segments(segments) => segments
                .iter()
                .map(|segment| to_usize(u64::from(segment.len)))
                .sum(),
        }
    }

    /// Clears `out` and writes the prompt tokens into it; reuse one buffer across requests.
    pub fn write_tokens(&self, out: &mut Vec<i64>) {
        out.clear();
        out.reserve(self.prompt_len());
        match self {
            PromptSource::MooncakeBlocks {
                hash_ids,
                prompt_len,
            } => {
                let mut left = to_usize(u64::from(*prompt_len));
                for &hash_id in hash_ids {
                    let len = left.min(MOONCAKE_BLOCK_TOKENS);
                    extend_with_mooncake_block(out, hash_id, len);
                    left -= len;
                }
            }
            PromptSource::Segments(segments) => {
                for segment in segments {
                    extend_with_stream(out, segment.seed, u64::from(segment.len));
                }
            }
        }
    }
}

/// `u64` to `usize`, saturating (every length here is far below either bound).
fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// One request of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadRequest {
    /// Position in the workload, from 0, in arrival order.
    pub id: u64,
    /// Nominal arrival time in simulated milliseconds from the start of the workload.
    pub arrival_ms: u64,
    /// The conversation this request belongs to, when the workload knows it (generated
    /// workloads do; Mooncake traces do not).
    pub session: Option<u64>,
    /// Where the prompt tokens come from.
    pub prompt: PromptSource,
    /// Tokens the answer has (decode steps after the prompt).
    pub output_tokens: u32,
}

impl WorkloadRequest {
    /// Prompt length in tokens.
    #[cfg(feature = "internals")]
    pub fn prompt_len(&self) -> usize {
        self.prompt.prompt_len()
    }

    /// The prompt tokens, freshly allocated; prefer [`Self::write_prompt_tokens`] in loops.
    #[cfg(feature = "internals")]
    pub fn prompt_tokens(&self) -> Vec<i64> {
        let mut out = Vec::new();
        self.prompt.write_tokens(&mut out);
        out
    }

    /// Clears `out` and writes the prompt tokens into it.
    pub fn write_prompt_tokens(&self, out: &mut Vec<i64>) {
        self.prompt.write_tokens(out);
    }
}

/// Totals of a workload (what the tests check a workload against).
#[cfg(feature = "internals")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkloadSummary {
    /// Number of requests.
    pub requests: u64,
    /// Sum of prompt lengths.
    pub prompt_tokens: u64,
    /// Sum of answer lengths.
    pub output_tokens: u64,
    /// Longest prompt.
    pub max_prompt_len: u64,
    /// Arrival of the last request, in simulated milliseconds.
    pub last_arrival_ms: u64,
}

#[cfg(feature = "internals")]
impl WorkloadSummary {
    /// Sums a workload.
    pub fn of(requests: &[WorkloadRequest]) -> Self {
        let mut summary = WorkloadSummary::default();
        for request in requests {
            let prompt_len = u64::try_from(request.prompt_len()).unwrap_or(u64::MAX);
            summary.requests += 1;
            summary.prompt_tokens += prompt_len;
            summary.output_tokens += u64::from(request.output_tokens);
            summary.max_prompt_len = summary.max_prompt_len.max(prompt_len);
            summary.last_arrival_ms = summary.last_arrival_ms.max(request.arrival_ms);
        }
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_tokens_are_in_vocabulary_and_deterministic() {
        for seed in [0, 1, u64::MAX, 0x1234_5678] {
            for index in 0..2_000 {
                let token = stream_token(seed, index);
                assert!((0..i64::from(VOCAB_SIZE)).contains(&token), "{token}");
                assert_eq!(token, stream_token(seed, index));
            }
        }
    }

    #[test]
    fn stream_tokens_spread_over_the_vocabulary() {
        let tokens: std::collections::HashSet<i64> =
            (0..10_000).map(|index| stream_token(7, index)).collect();
        // 10k draws from 201k values: about 9.75k distinct; a broken mix gives far fewer.
        assert!(tokens.len() > 9_500, "{}", tokens.len());
        assert!(tokens
            .iter()
            .any(|&token| token > i64::from(VOCAB_SIZE) / 2));
    }

    #[test]
    fn mooncake_prompt_cuts_the_last_block_exactly() {
        let prompt = PromptSource::MooncakeBlocks {
            hash_ids: vec![5, 9],
            prompt_len: 600,
        };
        let tokens = {
            let mut out = vec![-1; 3];
            prompt.write_tokens(&mut out);
            out
        };
        assert_eq!(tokens.len(), 600);
        assert_eq!(prompt.prompt_len(), 600);
        let mut block = Vec::new();
        extend_with_mooncake_block(&mut block, 9, 512);
        assert_eq!(&tokens[512..], &block[..88]);
        block.clear();
        extend_with_mooncake_block(&mut block, 5, 512);
        assert_eq!(&tokens[..512], &block[..]);
    }

    #[test]
    fn segments_concatenate_streams() {
        let prompt = PromptSource::Segments(vec![
            TokenSegment { seed: 1, len: 3 },
            TokenSegment { seed: 2, len: 2 },
        ]);
        let expected: Vec<i64> = vec![
            stream_token(1, 0),
            stream_token(1, 1),
            stream_token(1, 2),
            stream_token(2, 0),
            stream_token(2, 1),
        ];
        assert_eq!(prompt.prompt_len(), 5);
        let request = WorkloadRequest {
            id: 0,
            arrival_ms: 0,
            session: None,
            prompt,
            output_tokens: 1,
        };
        assert_eq!(request.prompt_tokens(), expected);
    }

    #[test]
    fn summary_sums_requests() {
        let request = |id, arrival_ms, prompt_len| WorkloadRequest {
            id,
            arrival_ms,
            session: None,
            prompt: PromptSource::Segments(vec![TokenSegment {
                seed: id,
                len: prompt_len,
            }]),
            output_tokens: 10,
        };
        let summary = WorkloadSummary::of(&[request(0, 5, 100), request(1, 9, 300)]);
        assert_eq!(
            summary,
            WorkloadSummary {
                requests: 2,
                prompt_tokens: 400,
                output_tokens: 20,
                max_prompt_len: 300,
                last_arrival_ms: 9,
            }
        );
    }
}
