//! Why a workload could not be built: a bad trace file ([`TraceError`]) or bad generator
//! parameters ([`GenerateError`]).
//!
//! Every trace error names the file and, where one line is at fault, its 1-based line number,
//! the field and the offending value.

use std::path::PathBuf;

/// Why a Mooncake trace file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened.
    #[error("cannot open trace file {}: check the trace path", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A line could not be read (an I/O error, or bytes that are not UTF-8).
    #[error("trace file {}, line {line}: cannot read the line", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A line longer than [`super::MAX_LINE_BYTES`].
    #[error("trace file {}, line {line}: the line is longer than {max_bytes} bytes", path.display())]
    LineTooLong {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The limit.
        max_bytes: u64,
    },
    /// A line that is not JSON.
    #[error("trace file {}, line {line}: not valid JSON", path.display())]
    NotJson {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// A line that is JSON but not an object.
    #[error("trace file {}, line {line}: expected a JSON object, got {value}", path.display())]
    NotAnObject {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The line's value, shortened.
        value: String,
    },
    /// A required field is absent.
    #[error("trace file {}, line {line}: missing field {field:?}", path.display())]
    MissingField {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The absent field.
        field: &'static str,
    },
    /// A field the format does not define (a typo would otherwise be ignored).
    #[error("trace file {}, line {line}: unknown field {field:?}; the fields are timestamp, input_length, output_length, hash_ids", path.display())]
    UnknownField {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The unknown field.
        field: String,
    },
    /// A field of the wrong JSON type (a string, a fraction, a number beyond 64 bits, ...).
    #[error("trace file {}, line {line}: field {field} must be {expected}, got {value}", path.display())]
    WrongType {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The field (`hash_ids[3]` for an element).
        field: String,
        /// What the format wants.
        expected: &'static str,
        /// The value found, as JSON, shortened.
        value: String,
    },
    /// A negative number.
    #[error("trace file {}, line {line}: field {field} must not be negative, got {value}", path.display())]
    Negative {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The field (`hash_ids[3]` for an element).
        field: String,
        /// The value found.
        value: i64,
    },
    /// A length of zero.
    #[error("trace file {}, line {line}: field {field} must be at least 1, got 0", path.display())]
    ZeroLength {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The field.
        field: &'static str,
    },
    /// A value above the limit the replay accepts.
    #[error("trace file {}, line {line}: field {field} is {value}, above the limit {max}", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
        /// The largest accepted value.
        max: u64,
    },
    /// `input_length` and the number of hash ids disagree: `n` ids of 512 tokens cover
    /// `(n - 1) * 512 + 1 ..= n * 512` tokens.
    #[error("trace file {}, line {line}: input_length {input_length} needs {needed_hash_ids} hash ids of 512 tokens, got {hash_ids}", path.display())]
    HashIdCountMismatch {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The line's `input_length`.
        input_length: u64,
        /// The number of ids that length needs.
        needed_hash_ids: u64,
        /// The number of ids found.
        hash_ids: u64,
    },
    /// A timestamp earlier than the previous line's: a trace must be sorted by arrival.
    #[error("trace file {}, line {line}: timestamp {timestamp} is earlier than the previous request's {previous}; sort the trace by timestamp", path.display())]
    TimestampBackwards {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// This line's timestamp.
        timestamp: u64,
        /// The previous request's timestamp.
        previous: u64,
    },
    /// A file without a single request.
    #[error("trace file {} holds no requests", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

impl TraceError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            TraceError::Open { .. } | TraceError::Read { .. } => "io",
            TraceError::LineTooLong { .. } => "line_too_long",
            TraceError::NotJson { .. } | TraceError::NotAnObject { .. } => "not_json_object",
            TraceError::MissingField { .. } => "missing_field",
            TraceError::UnknownField { .. } => "unknown_field",
            TraceError::WrongType { .. } => "wrong_type",
            TraceError::Negative { .. } | TraceError::ZeroLength { .. } => "out_of_range",
            TraceError::TooLarge { .. } => "too_large",
            TraceError::HashIdCountMismatch { .. } => "hash_id_count",
            TraceError::TimestampBackwards { .. } => "timestamp_backwards",
            TraceError::Empty { .. } => "empty",
        }
    }

    /// The 1-based line at fault, if one line is.
    pub fn line(&self) -> Option<u64> {
        match self {
            TraceError::Open { .. } | TraceError::Empty { .. } => None,
            TraceError::Read { line, .. }
            | TraceError::LineTooLong { line, .. }
            | TraceError::NotJson { line, .. }
            | TraceError::NotAnObject { line, .. }
            | TraceError::MissingField { line, .. }
            | TraceError::UnknownField { line, .. }
            | TraceError::WrongType { line, .. }
            | TraceError::Negative { line, .. }
            | TraceError::ZeroLength { line, .. }
            | TraceError::TooLarge { line, .. }
            | TraceError::HashIdCountMismatch { line, .. }
            | TraceError::TimestampBackwards { line, .. } => Some(*line),
        }
    }
}

/// Why long multi-turn parameters were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GenerateError {
    /// No sessions.
    #[error("sessions must be at least 1 (got 0)")]
    ZeroSessions,
    /// No turns.
    #[error("turns_per_session must be at least 1 (got 0)")]
    ZeroTurns,
    /// No answer tokens.
    #[error("output_tokens must be at least 1 (got 0)")]
    ZeroOutputTokens,
    /// The shared system prefix leaves no room for the first user message.
    #[error("system_prefix_tokens ({system_prefix_tokens}) must be below first_turn_tokens ({first_turn_tokens}); try {}", first_turn_tokens.saturating_sub(1))]
    SystemPrefixTooLong {
        /// The shared prefix.
        system_prefix_tokens: u32,
        /// The first turn's prompt.
        first_turn_tokens: u32,
    },
    /// `documents` and `document_tokens` disagree on whether there are documents.
    #[error("documents ({documents}) and document_tokens ({document_tokens}) must both be 0 (no documents) or both at least 1")]
    DocumentsWithoutTokens {
        /// Documents asked for.
        documents: u32,
        /// Tokens per document.
        document_tokens: u32,
    },
    /// The system prefix and a document leave no room for the first user message.
    #[error("system_prefix_tokens ({system_prefix_tokens}) + document_tokens ({document_tokens}) must be below first_turn_tokens ({first_turn_tokens}); lower document_tokens or raise first_turn_tokens")]
    DocumentTooLong {
        /// The shared system prefix.
        system_prefix_tokens: u32,
        /// Tokens per document.
        document_tokens: u32,
        /// The first turn's prompt.
        first_turn_tokens: u32,
    },
    /// The last turn is shorter than the first.
    #[error("last_turn_tokens ({last_turn_tokens}) must be at least first_turn_tokens ({first_turn_tokens})")]
    LastTurnBelowFirst {
        /// The first turn's prompt.
        first_turn_tokens: u32,
        /// The last turn's prompt.
        last_turn_tokens: u32,
    },
    /// A prompt longer than the generator accepts.
    #[error("last_turn_tokens ({last_turn_tokens}) is above the limit {max}")]
    PromptTooLong {
        /// The last turn's prompt.
        last_turn_tokens: u32,
        /// The largest accepted prompt.
        max: u32,
    },
    /// The prompt grows too little per turn to hold the answer and a new user message.
    #[error("prompts grow by {growth_per_turn} tokens per turn, which must exceed output_tokens ({output_tokens}): lower output_tokens to at most {} or turns_per_session", growth_per_turn.saturating_sub(1))]
    GrowthTooSmall {
        /// `(last_turn_tokens - first_turn_tokens) / (turns_per_session - 1)`, rounded down.
        growth_per_turn: u64,
        /// Answer tokens per turn.
        output_tokens: u32,
    },
    /// More requests than the generator builds at once.
    #[error("sessions x turns_per_session = {requests} requests, above the limit {max}; lower sessions or turns_per_session")]
    TooManyRequests {
        /// Requests asked for.
        requests: u64,
        /// The limit.
        max: u64,
    },
    /// The arrival schedule does not fit in 64-bit milliseconds.
    #[error("arrival times overflow: lower session_spacing_ms or think_time_ms")]
    ArrivalOverflow,
}

impl GenerateError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            GenerateError::ZeroSessions
            | GenerateError::ZeroTurns
            | GenerateError::ZeroOutputTokens => "zero_parameter",
            GenerateError::SystemPrefixTooLong { .. }
            | GenerateError::DocumentsWithoutTokens { .. }
            | GenerateError::DocumentTooLong { .. }
            | GenerateError::LastTurnBelowFirst { .. }
            | GenerateError::GrowthTooSmall { .. } => "inconsistent_lengths",
            GenerateError::PromptTooLong { .. }
            | GenerateError::TooManyRequests { .. }
            | GenerateError::ArrivalOverflow => "too_large",
        }
    }
}
