//! Messages to the lookup planner.

use crate::core::request_scope::RequestScope;
use std::time::Instant;

use actix::Message;

use crate::core::ids::{LookupTicket, RequestId};
use crate::messages::prompt::Prompt;
use crate::stats::LookupStats;

/// Look up the longest reusable prefix of a prompt (R10-R15).
///
/// - Sender: whoever drives the planner directly (the actor tests); the engine's handle
///   records each `lookup_prefix` as one and sends them batched, as [`LookupPrefixes`].
/// - Guarantee: the planner hashes the prompt, probes each key at most once, and sends
///   exactly one `LookupCompleted` to the engine inbox.
/// - Reply: none (`()`); the result arrives through the engine inbox.
/// - Receiver gone: the send fails; the sender decides (the handle answers "nothing to
///   offer").
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct LookupPrefix {
    /// The request.
    pub request: RequestId,
    /// This lookup's ticket, echoed in its `LookupCompleted` (R32).
    pub ticket: LookupTicket,
    /// The prompt's tokens, or what reads them (`prompt` module).
    pub prompt: Prompt,
    /// The engine's own prefix-cache hit (block aligned).
    pub local_match_tokens: usize,
    /// The request's own scope (R34); empty for most requests.
    pub scope: RequestScope,
    /// When the handle sent it (queueing time in stats).
    pub enqueued_at: Instant,
}

/// Look up the prompts of the requests one admission pass started, in one message (one
/// planner wake-up a pass, however many requests it looked up).
///
/// - Sender: the engine's handle, when the engine ends its admission pass
///   (`flush_lookups`) or at its next step hook, through the courier
///   (`crate::messages::courier`), which delivers it with `try_send`; a full mailbox (or
///   outbox) makes the handle keep every lookup of the message and send them again at the
///   next flush point, including every `reserve_prefix` (answered `Pending` meanwhile;
///   each lookup counted as `deferred`).
/// - Guarantee: each lookup is handled as a [`LookupPrefix`], in the order of
///   [`LookupPrefixes::lookups`]: exactly one `LookupCompleted` each.
/// - Reply: none (`()`); the results arrive through the engine inbox.
/// - Receiver gone: the courier hands it back and the handle answers "nothing to offer"
///   to each.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct LookupPrefixes {
    /// The lookups, in the order the engine started them.
    pub lookups: Vec<LookupPrefix>,
}

/// Report and reset the lookup counters (R27).
///
/// - Sender: the stats reporter on its tick, and the handle for the final report.
/// - Guarantee: the reply holds the counts since the previous collection.
/// - Reply: [`LookupStats`].
/// - Receiver gone: the sender's `send` fails; the report shows no lookups.
#[derive(Message, Debug)]
#[rtype(result = "LookupStats")]
pub struct CollectLookupStats;
