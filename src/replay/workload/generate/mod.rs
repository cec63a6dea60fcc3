//! The conversation generator (`docs/DESIGN.md` section 11), with two presets:
//! `--generate long-multiturn` ([`LongMultiturnParams::default`]), conversations whose
//! prompts grow from about 100k to 170k tokens over their turns, and `--generate
//! shared-documents` ([`LongMultiturnParams::shared_documents`]), many conversations about a
//! few long shared documents.
//!
//! Workflow, per session `s`:
//! 1. turn 0's prompt is the system prefix (the same tokens in every session), then, with
//!    `documents > 0`, document `s % documents` (`document_tokens` tokens, the same in every
//!    session that has it), then a first user message that fills the turn to
//!    `first_turn_tokens`;
//! 2. turn `k`'s prompt is turn `k - 1`'s prompt, then that turn's answer
//!    (`output_tokens`), then a new user message; with `divergence_tokens_max > 0` the last
//!    `d` tokens of turn `k - 1`'s prompt (`d` drawn in `0..=divergence_tokens_max`) are
//!    first re-rendered as different tokens, as a chat template that renders history
//!    differently from the generation prompt does;
//! 3. turn `k` arrives at `s * session_spacing_ms + k * think_time_ms`.
//!
//! All sessions' turns are then sorted by (arrival, session, turn) and numbered, so sessions
//! interleave when `session_spacing_ms < think_time_ms`.
//!
//! Invariants of a generated workload:
//! - `generate::I1`. Deterministic: the same parameters give the same requests and tokens.
//! - `generate::I2`. Turn `k` of every session has exactly
//!   `first + (last - first) * k / (turns - 1)` tokens (integer division): turn 0 has
//!   `first_turn_tokens`, the last turn `last_turn_tokens`.
//! - `generate::I3`. Without divergence, turn `k - 1`'s prompt is a prefix of turn `k`'s; with it,
//!   they share all but at most `divergence_tokens_max` tokens of turn `k - 1`'s prompt, and never
//!   fewer than the shared prefix (the system prefix and the session's document).
//! - `generate::I4`. All sessions share the first `system_prefix_tokens` tokens; sessions with the
//!   same document (`s % documents`) also share the `document_tokens` after them; everything
//!   else comes from streams of their own.
//!
//! The defaults (2 sessions of 24 turns, 100k to 170k tokens, a shared 96k-token prefix:
//! a long document or code base every conversation is about) total 6.48 M prompt tokens,
//! of which an unbounded pool reuses 96.2 % at `T = 16`, `32` or `64` (96.1 % at `T = 512`).
//! The share is bounded by the tokens each session adds: a session's 70k tokens of growth
//! are new by nature, and so are the first turn of the first session and every later
//! session's first user message, so at least `(cold tokens) / total` is never reusable.
//! Measured at `T = 32`: 4 sessions x 10 turns with an 8k prefix reuse 87.8 %, 4 x 12 with
//! the 96k prefix 93.9 %, 3 x 20 with it 96.1 % (8.1 M tokens); 96 % needs about 25 times
//! the cold tokens in total, hence two long sessions.
//!
//! The shared-documents defaults (32 sessions of 2 turns, a 20k-token system prefix, 4
//! documents of 30k tokens, a 4k-token first question and 2k tokens more in the second
//! turn) put the longest prefix later sessions share at the end of a document (50k
//! tokens), where no prompt ends: each first turn carries a question longer than the
//! default rewind `R = 2048` after it. A window group is then stored there only by a window
//! checkpoint (R28), so the prompt-end window oracle misses what the checkpoint window
//! oracle gets: 54.2 % and 98.9 % of the oracle at `T = 32` and `I = 8192`
//! (`tests/shared_documents.rs`).

use serde::{Deserialize, Serialize};

use super::{
    derive_seed, GenerateError, PromptSource, TokenSegment, WorkloadRequest, MAX_INPUT_LENGTH,
};

/// Most requests one generated workload may hold.
pub const MAX_GENERATED_REQUESTS: u64 = 1_000_000;

/// Domain tag of generated streams.
const GENERATOR_DOMAIN: u64 = 0x6c6f_6e67_6d74_726e;

/// What a derived stream is for (one more seed part).
#[derive(Clone, Copy)]
enum Stream {
    SystemPrefix = 1,
    UserMessage = 2,
    Answer = 3,
    Rerender = 4,
    Divergence = 5,
    Document = 6,
}

/// Parameters of `--generate long-multiturn`; every field has a default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LongMultiturnParams {
    /// Conversations.
    pub sessions: u32,
    /// Turns (requests) per conversation.
    pub turns_per_session: u32,
    /// Prompt tokens of each session's first turn, system prefix included.
    pub first_turn_tokens: u32,
    /// Prompt tokens of each session's last turn.
    pub last_turn_tokens: u32,
    /// Answer tokens of every turn; they become part of the next turn's prompt.
    pub output_tokens: u32,
    /// Simulated milliseconds between two turns of a session.
    pub think_time_ms: u64,
    /// Simulated milliseconds between the starts of two sessions.
    pub session_spacing_ms: u64,
    /// Seed of every token stream; the same seed gives the same workload (`generate::I1`).
    pub seed: u64,
    /// Leading tokens common to all sessions (`generate::I4`); below `first_turn_tokens`.
    pub system_prefix_tokens: u32,
    /// Shared documents: session `s` has document `s % documents` after the system prefix
    /// (`generate::I4`); 0 for none.
    pub documents: u32,
    /// Tokens of each document; 0 exactly when `documents` is 0, and with the system prefix
    /// below `first_turn_tokens`.
    pub document_tokens: u32,
    /// Most tokens at the end of a turn's prompt that the next turn re-renders differently;
    /// 0 keeps consecutive prompts exact prefixes of each other (`generate::I3`).
    pub divergence_tokens_max: u32,
}

impl Default for LongMultiturnParams {
    fn default() -> Self {
        LongMultiturnParams {
            sessions: 2,
            turns_per_session: 24,
            first_turn_tokens: 100_000,
            last_turn_tokens: 170_000,
            output_tokens: 512,
            think_time_ms: 30_000,
            session_spacing_ms: 10_000,
            seed: 0x5eed,
            system_prefix_tokens: 96_000,
            documents: 0,
            document_tokens: 0,
            divergence_tokens_max: 0,
        }
    }
}

impl LongMultiturnParams {
    /// The `--generate shared-documents` preset (module docs): 32 sessions of 2 turns, each
    /// first turn a 20k-token system prefix, one of 4 documents of 30k tokens and a
    /// 4k-token question, 3.52 M prompt tokens in all.
    pub fn shared_documents() -> Self {
        LongMultiturnParams {
            sessions: 32,
            turns_per_session: 2,
            first_turn_tokens: 54_000,
            last_turn_tokens: 56_000,
            output_tokens: 256,
            system_prefix_tokens: 20_000,
            documents: 4,
            document_tokens: 30_000,
            ..LongMultiturnParams::default()
        }
    }

    /// The document session `session` has, `None` without documents (`generate::I4`).
    pub fn document_of(&self, session: u32) -> Option<u32> {
        session.checked_rem(self.documents)
    }

    /// Leading tokens a session shares with every session that has its document: the
    /// system prefix and the document (`generate::I4`).
    pub fn shared_prefix_tokens(&self) -> u64 {
        let document = if self.documents > 0 {
            self.document_tokens
        } else {
            0
        };
        u64::from(self.system_prefix_tokens) + u64::from(document)
    }

    /// Checks the parameters describe a workload that can be built.
    ///
    /// # Errors
    ///
    /// A [`GenerateError`] naming the first parameter at fault.
    pub fn validate(&self) -> Result<(), GenerateError> {
        if self.sessions == 0 {
            return Err(GenerateError::ZeroSessions);
        }
        if self.turns_per_session == 0 {
            return Err(GenerateError::ZeroTurns);
        }
        if self.output_tokens == 0 {
            return Err(GenerateError::ZeroOutputTokens);
        }
        if self.last_turn_tokens > MAX_INPUT_LENGTH {
            return Err(GenerateError::PromptTooLong {
                last_turn_tokens: self.last_turn_tokens,
                max: MAX_INPUT_LENGTH,
            });
        }
        if self.last_turn_tokens < self.first_turn_tokens {
            return Err(GenerateError::LastTurnBelowFirst {
                first_turn_tokens: self.first_turn_tokens,
                last_turn_tokens: self.last_turn_tokens,
            });
        }
        if self.system_prefix_tokens >= self.first_turn_tokens {
            return Err(GenerateError::SystemPrefixTooLong {
                system_prefix_tokens: self.system_prefix_tokens,
                first_turn_tokens: self.first_turn_tokens,
            });
        }
        self.validate_documents()?;
        if self.turns_per_session > 1 {
            let growth_per_turn = u64::from(self.last_turn_tokens - self.first_turn_tokens)
                / u64::from(self.turns_per_session - 1);
            if growth_per_turn <= u64::from(self.output_tokens) {
                return Err(GenerateError::GrowthTooSmall {
                    growth_per_turn,
                    output_tokens: self.output_tokens,
                });
            }
        }
        let requests = u64::from(self.sessions) * u64::from(self.turns_per_session);
        if requests > MAX_GENERATED_REQUESTS {
            return Err(GenerateError::TooManyRequests {
                requests,
                max: MAX_GENERATED_REQUESTS,
            });
        }
        self.arrival_ms(self.sessions - 1, self.turns_per_session - 1)
            .map(|_| ())
    }

    /// The document parameters: both 0 or both positive, the shared prefix below the first
    /// turn.
    fn validate_documents(&self) -> Result<(), GenerateError> {
        if (self.documents == 0) != (self.document_tokens == 0) {
            return Err(GenerateError::DocumentsWithoutTokens {
                documents: self.documents,
                document_tokens: self.document_tokens,
            });
        }
        if self.shared_prefix_tokens() >= u64::from(self.first_turn_tokens) {
            return Err(GenerateError::DocumentTooLong {
                system_prefix_tokens: self.system_prefix_tokens,
                document_tokens: self.document_tokens,
                first_turn_tokens: self.first_turn_tokens,
            });
        }
        Ok(())
    }

    /// Prompt length of turn `turn` (`generate::I2`).
    pub fn turn_prompt_len(&self, turn: u32) -> u64 {
        let first = u64::from(self.first_turn_tokens);
        if self.turns_per_session <= 1 {
            return first;
        }
        let growth = u64::from(self.last_turn_tokens.saturating_sub(self.first_turn_tokens));
        first + growth * u64::from(turn) / u64::from(self.turns_per_session - 1)
    }

    /// Sum of all prompt lengths of the workload.
    #[cfg(feature = "internals")]
    pub fn total_prompt_tokens(&self) -> u64 {
        let per_session: u64 = (0..self.turns_per_session)
            .map(|turn| self.turn_prompt_len(turn))
            .sum();
        per_session * u64::from(self.sessions)
    }

    /// Arrival of a turn.
    fn arrival_ms(&self, session: u32, turn: u32) -> Result<u64, GenerateError> {
        let start = u64::from(session).checked_mul(self.session_spacing_ms);
        let offset = u64::from(turn).checked_mul(self.think_time_ms);
        start
            .zip(offset)
            .and_then(|(start, offset)| start.checked_add(offset))
            .ok_or(GenerateError::ArrivalOverflow)
    }

    /// The seed of one stream of the workload.
    fn stream_seed(&self, stream: Stream, session: u32, turn: u32) -> u64 {
        derive_seed(&[
            GENERATOR_DOMAIN,
            self.seed,
            stream as u64,
            u64::from(session),
            u64::from(turn),
        ])
    }
}

/// Builds the long multi-turn workload, in arrival order.
///
/// # Errors
///
/// A [`GenerateError`] when [`LongMultiturnParams::validate`] refuses the parameters.
pub fn generate_long_multiturn(
    params: &LongMultiturnParams,
) -> Result<Vec<WorkloadRequest>, GenerateError> {
    params.validate()?;
    let mut requests = Vec::new();
    for session in 0..params.sessions {
        let mut segments = first_turn_segments(params, session);
        for turn in 0..params.turns_per_session {
            if turn > 0 {
                extend_to_next_turn(params, &mut segments, session, turn);
            }
            requests.push((
                params.arrival_ms(session, turn)?,
                session,
                turn,
                segments.clone(),
            ));
        }
    }
    requests.sort_by_key(|&(arrival_ms, session, turn, _)| (arrival_ms, session, turn));
    Ok(requests
        .into_iter()
        .zip(0..)
        .map(|((arrival_ms, session, _, segments), id)| WorkloadRequest {
            id,
            arrival_ms,
            session: Some(u64::from(session)),
            prompt: PromptSource::Segments(segments),
            output_tokens: params.output_tokens,
        })
        .collect())
}

/// Turn 0's prompt: the shared system prefix, the session's document, then the first user
/// message (workflow step 1).
fn first_turn_segments(params: &LongMultiturnParams, session: u32) -> Vec<TokenSegment> {
    let mut segments = Vec::new();
    if params.system_prefix_tokens > 0 {
        segments.push(TokenSegment {
            seed: params.stream_seed(Stream::SystemPrefix, 0, 0),
            len: params.system_prefix_tokens,
        });
    }
    if let Some(document) = params.document_of(session) {
        segments.push(TokenSegment {
            seed: params.stream_seed(Stream::Document, document, 0),
            len: params.document_tokens,
        });
    }
    let shared = params.shared_prefix_tokens();
    segments.push(TokenSegment {
        seed: params.stream_seed(Stream::UserMessage, session, 0),
        len: u32::try_from(u64::from(params.first_turn_tokens) - shared).unwrap_or(0),
    });
    segments
}

/// Turns turn `turn - 1`'s prompt into turn `turn`'s prompt (workflow step 2).
fn extend_to_next_turn(
    params: &LongMultiturnParams,
    segments: &mut Vec<TokenSegment>,
    session: u32,
    turn: u32,
) {
    let previous_len = params.turn_prompt_len(turn - 1);
    let divergence = divergence_tokens(params, session, turn, previous_len);
    if divergence > 0 {
        truncate_segments(segments, previous_len - u64::from(divergence));
        segments.push(TokenSegment {
            seed: params.stream_seed(Stream::Rerender, session, turn),
            len: divergence,
        });
    }
    segments.push(TokenSegment {
        seed: params.stream_seed(Stream::Answer, session, turn - 1),
        len: params.output_tokens,
    });
    let user_len = params.turn_prompt_len(turn) - previous_len - u64::from(params.output_tokens);
    segments.push(TokenSegment {
        seed: params.stream_seed(Stream::UserMessage, session, turn),
        len: u32::try_from(user_len).unwrap_or(u32::MAX),
    });
}

/// How many tokens of turn `turn - 1`'s prompt turn `turn` re-renders (`generate::I3`): never into
/// the shared prefix.
fn divergence_tokens(
    params: &LongMultiturnParams,
    session: u32,
    turn: u32,
    previous_len: u64,
) -> u32 {
    if params.divergence_tokens_max == 0 {
        return 0;
    }
    let draw = params.stream_seed(Stream::Divergence, session, turn)
        % (u64::from(params.divergence_tokens_max) + 1);
    let room = previous_len - params.shared_prefix_tokens();
    u32::try_from(draw.min(room)).unwrap_or(0)
}

/// Keeps the first `len` tokens of a segment list.
fn truncate_segments(segments: &mut Vec<TokenSegment>, len: u64) {
    let mut kept_tokens = 0_u64;
    let mut kept_segments = 0;
    for segment in segments.iter_mut() {
        if kept_tokens >= len {
            break;
        }
        let take = (len - kept_tokens).min(u64::from(segment.len));
        segment.len = u32::try_from(take).unwrap_or(segment.len);
        kept_tokens += take;
        kept_segments += 1;
    }
    segments.truncate(kept_segments);
}

#[cfg(test)]
mod tests;
