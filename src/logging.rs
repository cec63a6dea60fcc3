//! Logging: one `tracing` subscriber for the binary, filtered by `RUST_LOG` and written to
//! stderr as text lines or JSON objects (`--log-format text|json`, env `KVC_LOG_FORMAT`).
//!
//! - Filter: `RUST_LOG` in `tracing-subscriber`'s `EnvFilter` syntax (`info`,
//!   `kv_connector=debug`, `warn,kv_connector::actors::stats_reporter=info`); without it,
//!   warnings and errors only. The 30 s stats reports (R27) are INFO lines from
//!   `kv_connector::actors::stats_reporter`, so `RUST_LOG=info` shows them.
//! - Text: `TIMESTAMP LEVEL target: message key=value ...`, coloured only when stderr is a
//!   terminal. Every structured field is a `key=value` pair, so a report line reads as
//!   prose and splits on spaces and `=`.
//! - JSON: one object per line with `timestamp`, `level`, `target`, `message` and every
//!   field at the top level with its JSON type (numbers stay numbers), ready for a log
//!   pipeline.
//!
//! Logs always go to stderr; stdout carries only a subcommand's output (tables, `--json`).

use std::io::IsTerminal;

use tracing::Subscriber;
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum LogFormat {
    /// Human-readable lines with `key=value` fields.
    #[default]
    Text,
    /// One JSON object per line, fields at the top level.
    Json,
}

impl LogFormat {
    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// A global subscriber was already installed (logging set up twice).
    #[error("a global log subscriber is already installed")]
    AlreadySet(#[source] tracing::subscriber::SetGlobalDefaultError),
}

impl LoggingError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::AlreadySet(_) => "already_set",
        }
    }
}

/// The target of the few lifecycle lines a user must see whatever `RUST_LOG` says (where
/// the metrics endpoint listens, where a helper program's own log goes): [`env_filter`]
/// always lets them through at INFO.
pub const ANNOUNCE: &str = "kvc::announce";

/// The filter from `RUST_LOG`, warnings and errors when it is unset, plus the
/// [`ANNOUNCE`] lines; parts it cannot parse are skipped (as `tracing-subscriber` does),
/// never fatal.
pub fn env_filter() -> EnvFilter {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env_lossy();
    match format!("{ANNOUNCE}=info").parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// A subscriber writing `format` lines through `writer`, filtered by `filter`; `ansi`
/// colours text lines (never JSON).
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).fmt_fields(RoundedFields).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// Text-line fields as `key=value`, with decimal numbers rounded to three significant
/// digits for a human reader (`load_gbps=0.0306`, not `0.030551244800000002`); JSON lines
/// keep full precision.
struct RoundedFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for RoundedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = RoundedVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

/// Writes one event's fields for [`RoundedFields`].
struct RoundedVisitor<'w> {
    writer: tracing_subscriber::fmt::format::Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

impl RoundedVisitor<'_> {
    fn write(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Display) {
        if self.result.is_err() {
            return;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        self.result = if field.name() == "message" {
            write!(self.writer, "{separator}{value}")
        } else {
            write!(self.writer, "{separator}{}={value}", field.name())
        };
    }
}

impl tracing::field::Visit for RoundedVisitor<'_> {
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.write(field, &three_significant(value));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.write(field, &value);
        } else {
            self.write(field, &format_args!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.write(field, &format_args!("{value:?}"));
    }
}

/// `value` with three significant digits, trailing zeros dropped (`0.0306`, `1.5`, `1234`).
fn three_significant(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a digit count between 0 and 20"
    )]
    let decimals = (2.0 - value.abs().log10().floor()).clamp(0.0, 20.0) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// Installs the process-wide subscriber: `RUST_LOG` filter, `format` lines on stderr.
///
/// # Errors
///
/// [`LoggingError::AlreadySet`] when a global subscriber is already installed.
pub fn init(format: LogFormat) -> Result<(), LoggingError> {
    let ansi = std::io::stderr().is_terminal();
    tracing::subscriber::set_global_default(subscriber(format, env_filter(), std::io::stderr, ansi))
        .map_err(LoggingError::AlreadySet)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;

    /// A writer that keeps what is written, for reading log lines back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;

        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    /// Logs one line shaped like the stats reporter's and returns what was written.
    fn report_line(format: LogFormat) -> String {
        let captured = Captured::default();
        let subscriber = subscriber(format, EnvFilter::new("info"), captured.clone(), false);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                instance = "prefill-0",
                full = 3_u64,
                window_miss = 0_u64,
                load_gbps = 1.5_f64,
                save_gbps = 0.030_551_244_8_f64,
                "lookups"
            );
            tracing::debug!("filtered out at info");
        });
        let bytes = captured.0.lock().clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn text_numbers_keep_three_significant_digits() {
        for (value, text) in [
            (0.030_551_244_8, "0.0306"),
            (1.5, "1.5"),
            (1234.567, "1235"),
            (0.0, "0"),
            (12.0, "12"),
            (-0.001_234_5, "-0.00123"),
        ] {
            assert_eq!(three_significant(value), text, "{value}");
        }
    }

    #[test]
    fn text_lines_carry_key_value_fields() {
        let text = report_line(LogFormat::Text);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(" INFO "), "{text}");
        for pair in [
            "instance=\"prefill-0\"",
            "full=3",
            "window_miss=0",
            "load_gbps=1.5",
            "save_gbps=0.0306",
        ] {
            assert!(
                text.split_whitespace().any(|word| word == pair),
                "{pair}: {text}"
            );
        }
    }

    #[test]
    fn json_lines_carry_typed_fields_at_the_top_level() -> Result<(), serde_json::Error> {
        let text = report_line(LogFormat::Json);
        assert_eq!(text.lines().count(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(text.trim())?;
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["message"], "lookups");
        assert_eq!(line["full"], 3);
        assert_eq!(line["load_gbps"], 1.5);
        // JSON keeps full precision; only text lines round for a human reader.
        let save_gbps = line["save_gbps"].as_f64().unwrap_or_default();
        assert!((save_gbps - 0.030_551_244_8).abs() < 1e-15, "{text}");
        assert_eq!(line["instance"], "prefill-0");
        assert!(line["timestamp"].is_string(), "{text}");
        Ok(())
    }

    #[cfg(feature = "cli")]
    #[test]
    fn format_names_are_the_command_line_values() {
        use clap::ValueEnum;
        for format in LogFormat::value_variants() {
            let parsed = LogFormat::from_str(format.as_str(), false);
            assert_eq!(parsed, Ok(*format));
        }
    }
}
