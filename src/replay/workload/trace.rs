//! The Mooncake trace reader: one JSON object per line (`../shared/traces/README.md`).
//!
//! ```text
//! {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}
//! ```
//!
//! Workflow: [`TraceReader`] reads the file line by line (a line is at most
//! [`MAX_LINE_BYTES`]), validates the line, and yields one [`WorkloadRequest`] holding only
//! the hash ids; [`read_mooncake_trace`] collects the first `limit` of them. The shared trace
//! (3,993 requests, 61 M prompt tokens) takes about 1 MB this way.
//!
//! Rules for a line (each breach is a [`TraceError`] naming the file, the 1-based line, the
//! field and the value):
//! - `trace::V1`. a JSON object with exactly the fields `timestamp`, `input_length`,
//!   `output_length`, `hash_ids`; unknown fields are refused, since a misspelt field would
//!   otherwise vanish;
//! - `trace::V2`. `timestamp` is an integer in `0..=MAX_TIMESTAMP_MS`, and never earlier than the
//!   previous request's (traces are sorted by arrival; equal timestamps are fine);
//! - `trace::V3`. `input_length` is in `1..=MAX_INPUT_LENGTH`, `output_length` in
//!   `1..=MAX_OUTPUT_LENGTH`;
//! - `trace::V4`. `hash_ids` is an array of non-negative 64-bit integers, one per 512-token block:
//!   with `n` ids, `(n - 1) * 512 < input_length <= n * 512`;
//! - `trace::V5`. blank lines are skipped (they still count for line numbers).
//!
//! Request ids count the requests from 0 in file order; `session` is `None` (the format
//! has no sessions).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{PromptSource, TraceError, WorkloadRequest, MOONCAKE_BLOCK_TOKENS};

/// Longest line accepted, in bytes (a 4 M-token prompt needs about 200 KB).
pub const MAX_LINE_BYTES: u64 = 1 << 20;
/// Largest `timestamp` accepted, in milliseconds (about 31 years).
pub const MAX_TIMESTAMP_MS: u64 = 1_000_000_000_000;
/// Largest `input_length` accepted, in tokens.
pub const MAX_INPUT_LENGTH: u32 = 1 << 22;
/// Largest `output_length` accepted, in tokens.
pub const MAX_OUTPUT_LENGTH: u32 = 1 << 20;

/// The fields of a line (`trace::V1`).
const FIELDS: [&str; 4] = ["timestamp", "input_length", "output_length", "hash_ids"];

/// Longest rendering of an offending value kept in an error.
const MAX_VALUE_CHARS: usize = 64;

/// Reads a Mooncake trace line by line, yielding validated requests in file order.
///
/// The iterator ends after the first error.
#[derive(Debug)]
pub struct TraceReader<R> {
    /// The source of lines.
    reader: R,
    /// The file name, for errors.
    path: PathBuf,
    /// 1-based number of the line last read.
    line: u64,
    /// Timestamp of the previous request (`trace::V2`).
    previous_timestamp: Option<u64>,
    /// Id of the next request.
    next_id: u64,
    /// The current line's bytes, reused across lines.
    buffer: Vec<u8>,
    /// Set after the end of the file or an error.
    finished: bool,
}

impl TraceReader<BufReader<File>> {
    /// Opens a trace file.
    ///
    /// # Errors
    ///
    /// [`TraceError::Open`] when the file cannot be opened.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let file = File::open(path).map_err(|source| TraceError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(TraceReader::new(BufReader::new(file), path))
    }
}

impl<R: BufRead> TraceReader<R> {
    /// Reads a trace from any buffered reader; `path` only names it in errors.
    pub fn new(reader: R, path: impl Into<PathBuf>) -> Self {
        TraceReader {
            reader,
            path: path.into(),
            line: 0,
            previous_timestamp: None,
            next_id: 0,
            buffer: Vec::new(),
            finished: false,
        }
    }

    /// Reads the next line into `buffer` without its line ending; `false` at the end.
    fn read_line(&mut self) -> Result<bool, TraceError> {
        self.buffer.clear();
        self.line += 1;
        let read = (&mut self.reader)
            .take(MAX_LINE_BYTES + 2)
            .read_until(b'\n', &mut self.buffer)
            .map_err(|source| TraceError::Read {
                path: self.path.clone(),
                line: self.line,
                source,
            })?;
        if read == 0 {
            return Ok(false);
        }
        if self.buffer.last() == Some(&b'\n') {
            self.buffer.pop();
        }
        if self.buffer.last() == Some(&b'\r') {
            self.buffer.pop();
        }
        if u64::try_from(self.buffer.len()).unwrap_or(u64::MAX) > MAX_LINE_BYTES {
            return Err(TraceError::LineTooLong {
                path: self.path.clone(),
                line: self.line,
                max_bytes: MAX_LINE_BYTES,
            });
        }
        Ok(true)
    }

    /// Reads lines until a request, the end of the file, or an error.
    fn next_request(&mut self) -> Result<Option<WorkloadRequest>, TraceError> {
        loop {
            if !self.read_line()? {
                return Ok(None);
            }
            if self.buffer.iter().all(u8::is_ascii_whitespace) {
                continue; // `trace::V5`
            }
            let context = LineContext {
                path: &self.path,
                line: self.line,
            };
            let parsed = context.parse(&self.buffer)?;
            if let Some(previous) = self.previous_timestamp {
                if parsed.timestamp < previous {
                    return Err(TraceError::TimestampBackwards {
                        path: self.path.clone(),
                        line: self.line,
                        timestamp: parsed.timestamp,
                        previous,
                    });
                }
            }
            self.previous_timestamp = Some(parsed.timestamp);
            let id = self.next_id;
            self.next_id += 1;
            return Ok(Some(WorkloadRequest {
                id,
                arrival_ms: parsed.timestamp,
                session: None,
                prompt: PromptSource::MooncakeBlocks {
                    hash_ids: parsed.hash_ids,
                    prompt_len: parsed.input_length,
                },
                output_tokens: parsed.output_length,
            }));
        }
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<WorkloadRequest, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        let next = self.next_request();
        if !matches!(next, Ok(Some(_))) {
            self.finished = true;
        }
        next.transpose()
    }
}

/// Reads the first `limit` requests of a trace file (all of them with `None`); lines after
/// the limit are not read.
///
/// # Errors
///
/// The first [`TraceError`] of the lines read; [`TraceError::Empty`] when the file holds no
/// request and `limit` is not `Some(0)`.
pub fn read_mooncake_trace(
    path: &Path,
    limit: Option<usize>,
) -> Result<Vec<WorkloadRequest>, TraceError> {
    let reader = TraceReader::open(path)?;
    let limit = limit.unwrap_or(usize::MAX);
    let mut requests = Vec::new();
    for request in reader.take(limit) {
        requests.push(request?);
    }
    if requests.is_empty() && limit > 0 {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(requests)
}

/// The fields of one valid line.
struct ParsedLine {
    timestamp: u64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// Where a line is, for errors.
struct LineContext<'a> {
    path: &'a Path,
    line: u64,
}

impl LineContext<'_> {
    /// Parses and validates one non-blank line (`trace::V1`..V4).
    fn parse(&self, bytes: &[u8]) -> Result<ParsedLine, TraceError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|source| TraceError::NotJson {
            path: self.path.to_path_buf(),
            line: self.line,
            source,
        })?;
        let Value::Object(fields) = value else {
            return Err(TraceError::NotAnObject {
                path: self.path.to_path_buf(),
                line: self.line,
                value: shorten(&value),
            });
        };
        if let Some(unknown) = fields.keys().find(|key| !FIELDS.contains(&key.as_str())) {
            return Err(TraceError::UnknownField {
                path: self.path.to_path_buf(),
                line: self.line,
                field: unknown.clone(),
            });
        }
        let timestamp = self.bounded(&fields, "timestamp", MAX_TIMESTAMP_MS)?;
        let input_length = self.length(&fields, "input_length", MAX_INPUT_LENGTH)?;
        let output_length = self.length(&fields, "output_length", MAX_OUTPUT_LENGTH)?;
        let hash_ids = self.hash_ids(&fields)?;
        let needed = u64::from(input_length).div_ceil(MOONCAKE_BLOCK_TOKENS as u64);
        let found = u64::try_from(hash_ids.len()).unwrap_or(u64::MAX);
        if found != needed {
            return Err(TraceError::HashIdCountMismatch {
                path: self.path.to_path_buf(),
                line: self.line,
                input_length: u64::from(input_length),
                needed_hash_ids: needed,
                hash_ids: found,
            });
        }
        Ok(ParsedLine {
            timestamp,
            input_length,
            output_length,
            hash_ids,
        })
    }

    /// A present field.
    fn field<'v>(
        &self,
        fields: &'v Map<String, Value>,
        name: &'static str,
    ) -> Result<&'v Value, TraceError> {
        fields.get(name).ok_or_else(|| TraceError::MissingField {
            path: self.path.to_path_buf(),
            line: self.line,
            field: name,
        })
    }

    /// A non-negative 64-bit integer; `field` names it in errors.
    fn unsigned(&self, value: &Value, field: &dyn Fn() -> String) -> Result<u64, TraceError> {
        if let Some(unsigned) = value.as_u64() {
            return Ok(unsigned);
        }
        if let Some(negative) = value.as_i64() {
            return Err(TraceError::Negative {
                path: self.path.to_path_buf(),
                line: self.line,
                field: field(),
                value: negative,
            });
        }
        Err(TraceError::WrongType {
            path: self.path.to_path_buf(),
            line: self.line,
            field: field(),
            expected: "a non-negative integer",
            value: shorten(value),
        })
    }

    /// A non-negative integer field at most `max`.
    fn bounded(
        &self,
        fields: &Map<String, Value>,
        name: &'static str,
        max: u64,
    ) -> Result<u64, TraceError> {
        let value = self.unsigned(self.field(fields, name)?, &|| name.to_owned())?;
        if value > max {
            return Err(TraceError::TooLarge {
                path: self.path.to_path_buf(),
                line: self.line,
                field: name,
                value,
                max,
            });
        }
        Ok(value)
    }

    /// A length field in `1..=max`.
    fn length(
        &self,
        fields: &Map<String, Value>,
        name: &'static str,
        max: u32,
    ) -> Result<u32, TraceError> {
        let value = self.bounded(fields, name, u64::from(max))?;
        if value == 0 {
            return Err(TraceError::ZeroLength {
                path: self.path.to_path_buf(),
                line: self.line,
                field: name,
            });
        }
        Ok(u32::try_from(value).unwrap_or(max))
    }

    /// The `hash_ids` array (`trace::V4`, element types only).
    fn hash_ids(&self, fields: &Map<String, Value>) -> Result<Vec<u64>, TraceError> {
        let value = self.field(fields, "hash_ids")?;
        let Value::Array(elements) = value else {
            return Err(TraceError::WrongType {
                path: self.path.to_path_buf(),
                line: self.line,
                field: "hash_ids".to_owned(),
                expected: "an array of non-negative integers",
                value: shorten(value),
            });
        };
        elements
            .iter()
            .enumerate()
            .map(|(index, element)| self.unsigned(element, &|| format!("hash_ids[{index}]")))
            .collect()
    }
}

/// A JSON value as text, cut to [`MAX_VALUE_CHARS`] characters.
fn shorten(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(MAX_VALUE_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(text: &str) -> Result<Vec<WorkloadRequest>, TraceError> {
        TraceReader::new(text.as_bytes(), "mem.jsonl").collect()
    }

    fn line(timestamp: u64, input_length: u64, ids: &[u64]) -> String {
        format!(
            "{{\"timestamp\": {timestamp}, \"input_length\": {input_length}, \"output_length\": 3, \"hash_ids\": {ids:?}}}\n"
        )
    }

    #[test]
    fn v4_hash_id_count_boundaries() -> Result<(), TraceError> {
        // n ids cover (n - 1) * 512 + 1 ..= n * 512 tokens.
        let ok = [line(0, 1, &[1]), line(0, 512, &[1]), line(0, 513, &[1, 2])].concat();
        let requests = read_all(&ok)?;
        let lens: Vec<usize> = requests.iter().map(WorkloadRequest::prompt_len).collect();
        assert_eq!(lens, [1, 512, 513]);
        for (input_length, ids) in [(513, &[1][..]), (512, &[1, 2][..]), (1, &[][..])] {
            let err = read_all(&line(0, input_length, ids)).err();
            assert!(
                matches!(err, Some(TraceError::HashIdCountMismatch { line: 1, .. })),
                "{input_length} {ids:?}: {err:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn v5_blank_lines_are_skipped_but_counted() {
        let text = ["\n", "  \r\n", &line(4, 10, &[1]), "\n", "{}\n"].concat();
        let mut reader = TraceReader::new(text.as_bytes(), "mem.jsonl");
        let first = reader.next();
        assert!(matches!(
            first,
            Some(Ok(WorkloadRequest {
                id: 0,
                arrival_ms: 4,
                ..
            }))
        ));
        let second = reader.next();
        assert!(matches!(
            second,
            Some(Err(TraceError::MissingField {
                line: 5,
                field: "timestamp",
                ..
            }))
        ));
        assert!(reader.next().is_none(), "the reader stops after an error");
    }

    #[test]
    fn crlf_lines_and_a_missing_final_newline_are_read() -> Result<(), TraceError> {
        let text = line(1, 10, &[1]).replace('\n', "\r\n") + line(2, 20, &[3]).trim_end();
        let requests = read_all(&text)?;
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[1].id, 1);
        assert_eq!(requests[1].prompt_len(), 20);
        Ok(())
    }

    #[test]
    fn v2_equal_timestamps_are_accepted() -> Result<(), TraceError> {
        let requests = read_all(&[line(7, 10, &[1]), line(7, 10, &[1])].concat())?;
        assert_eq!(requests.len(), 2);
        Ok(())
    }

    #[test]
    fn long_values_are_shortened_in_errors() {
        let long = format!("\"{}\"", "x".repeat(500));
        let text = format!(
            "{{\"timestamp\": {long}, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}}"
        );
        match read_all(&text) {
            Err(TraceError::WrongType { value, field, .. }) => {
                assert_eq!(field, "timestamp");
                assert_eq!(value.chars().count(), MAX_VALUE_CHARS + 3);
                assert!(value.ends_with("..."));
            }
            other => panic!("expected WrongType, got {other:?}"),
        }
    }

    #[test]
    fn a_line_over_the_limit_is_refused() {
        let text = format!(
            "{}\n",
            " ".repeat(usize::try_from(MAX_LINE_BYTES).unwrap() + 1)
        );
        let err = read_all(&text).err();
        assert!(
            matches!(err, Some(TraceError::LineTooLong { line: 1, .. })),
            "{err:?}"
        );
    }
}
