//! The runtime's log records (`tracing`) handed to Python's `logging` without the GIL on
//! the threads that log: the native half of `kv_connector.forward_logs`.
//!
//! Workflow:
//! 1. The first [`forward_log_level`] with a level installs the process-wide subscriber: a
//!    level filter (reloadable, so later calls change it) under `tracing-subscriber`'s text
//!    formatter without time, level or target (Python's formatter adds its own), writing
//!    each formatted event to a [`QueueLine`]. A subscriber installed before (by
//!    `init_logging`) makes it a `KvConnectorError` (`already_set`): there is one per
//!    process.
//! 2. Whatever thread logs (an actor, a loader, a saver, the courier) formats the event and
//!    try-sends one [`LogRecord`] (Python level, target, source file and line, text) into a
//!    flume queue bounded at [`LOG_QUEUE_CAPACITY`] records.
//! 3. One Python daemon thread (`kv_connector/_logs.py`) calls [`next_log_records`] in a
//!    loop: it waits for records with the GIL released, takes a batch and emits each to
//!    its `logging.Logger`.
//! 4. `forward_logs(None)` sets the level to off, wakes the reader ([`wake_log_reader`]),
//!    which drains what is queued and stops.
//!
//! Invariants:
//! - `python::logs::L1`. A thread that logs never takes the GIL and never waits: formatting is
//!   plain Rust and the send is a `try_send` (the loaders and savers never take the GIL,
//!   `python::connector::G2`).
//! - `python::logs::L2`. The queue holds at most [`LOG_QUEUE_CAPACITY`] records. When it is full
//!   the new record is dropped and counted ([`log_records_dropped`]); the reader reports the count
//!   as a warning of its own. Logging never slows the runtime down.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use kv_connector::logging::LoggingError;
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{reload, Registry};

use crate::errors::{self, KvConnectorError};

/// Records the queue holds before it drops new ones (`python::logs::L2`): a stats report is two
/// records per connector per interval and an outage or a refused batch one, so only a storm of
/// warnings (thousands between two reads of the reader, which reads every record as soon as it
/// arrives) fills it; at a few hundred bytes a record it stays under about 2 MiB.
pub const LOG_QUEUE_CAPACITY: usize = 4096;

/// The most records one [`next_log_records`] call returns, so the reader holds the GIL for
/// a bounded batch at a time.
const LOG_BATCH: usize = 256;

/// One formatted event, as the Python reader receives it.
struct LogRecord {
    /// The Python `logging` level (ERROR 40, WARN 30, INFO 20, DEBUG 10, TRACE 5).
    level: u8,
    /// The event's `tracing` target (`kv_connector::actors::stats_reporter`).
    target: String,
    /// The source file that logged, or the target when unknown.
    file: String,
    /// The source line, 0 when unknown.
    line: u32,
    /// `message key=value ...`, with the span context in front when there is one.
    text: String,
}

/// A [`LogRecord`] as Python receives it: `(level, target, file, line, text)`.
type PyLogRecord = (u8, String, String, u32, String);

/// What the queue carries: records, and a wake-up for a reader that is stopping.
enum Item {
    Record(LogRecord),
    Wake,
}

/// The bounded queue between the logging threads and the Python reader (`python::logs::L2`).
struct LogQueue {
    sender: flume::Sender<Item>,
    receiver: flume::Receiver<Item>,
    /// Records refused because the queue was full.
    dropped: AtomicU64,
}

static QUEUE: LazyLock<LogQueue> = LazyLock::new(|| {
    let (sender, receiver) = flume::bounded(LOG_QUEUE_CAPACITY);
    LogQueue {
        sender,
        receiver,
        dropped: AtomicU64::new(0),
    }
});

/// The level filter of the installed subscriber; `None` until the first install.
static FILTER: Mutex<Option<reload::Handle<LevelFilter, Registry>>> = Mutex::new(None);

/// The Python level of a `tracing` level.
fn python_level(level: Level) -> u8 {
    match level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// The filter passing every event whose Python level is at least `level`; `None`: off.
fn level_filter(level: Option<i64>) -> LevelFilter {
    match level {
        Some(level) if level <= 5 => LevelFilter::TRACE,
        Some(level) if level <= 10 => LevelFilter::DEBUG,
        Some(level) if level <= 20 => LevelFilter::INFO,
        Some(level) if level <= 30 => LevelFilter::WARN,
        Some(level) if level <= 40 => LevelFilter::ERROR,
        // Nothing the runtime logs is above ERROR; `None` is off.
        None | Some(_) => LevelFilter::OFF,
    }
}

/// Makes one [`QueueLine`] per event, carrying the event's metadata.
struct QueueWriter;

/// One event's formatted text; queued when the formatter drops it (`python::logs::L1`).
struct QueueLine {
    level: Level,
    target: String,
    file: String,
    line: u32,
    text: Vec<u8>,
}

impl<'a> MakeWriter<'a> for QueueWriter {
    type Writer = QueueLine;

    fn make_writer(&'a self) -> QueueLine {
        QueueLine {
            level: Level::INFO,
            target: String::new(),
            file: String::new(),
            line: 0,
            text: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> QueueLine {
        QueueLine {
            level: *meta.level(),
            target: meta.target().to_owned(),
            file: meta.file().unwrap_or(meta.target()).to_owned(),
            line: meta.line().unwrap_or(0),
            text: Vec::new(),
        }
    }
}

impl Write for QueueLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for QueueLine {
    fn drop(&mut self) {
        if self.text.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.text).trim_end().to_owned();
        let record = LogRecord {
            level: python_level(self.level),
            target: std::mem::take(&mut self.target),
            file: std::mem::take(&mut self.file),
            line: self.line,
            text,
        };
        // Full: the record is dropped and counted (`python::logs::L2`); the receiver lives in the
        // static, so the queue is never disconnected.
        if QUEUE.sender.try_send(Item::Record(record)).is_err() {
            QUEUE.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Installs the subscriber (module workflow, step 1) at `filter`.
fn install(filter: LevelFilter) -> PyResult<reload::Handle<LevelFilter, Registry>> {
    let (filter, handle) = reload::Layer::new(filter);
    let format = tracing_subscriber::fmt::layer()
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_ansi(false)
        .with_writer(QueueWriter);
    let subscriber = tracing_subscriber::registry().with(filter).with(format);
    tracing::subscriber::set_global_default(subscriber).map_err(|error| {
        let error = LoggingError::AlreadySet(error);
        errors::raise::<KvConnectorError>(
            error.kind(),
            format!(
                "{}: kv_connector.init_logging() already sends the runtime's logs to stderr \
                 (one subscriber per process); call forward_logs instead of init_logging",
                errors::message(&error)
            ),
        )
    })?;
    Ok(handle)
}

/// Sets the lowest Python level of the records queued (`None`: none), installing the
/// subscriber on first use (module workflow, steps 1 and 4).
///
/// # Errors
///
/// `KvConnectorError` (`already_set`) when another subscriber (`init_logging`) is installed.
#[pyfunction]
#[pyo3(name = "_forward_log_level", signature = (level))]
pub fn forward_log_level(level: Option<i64>) -> PyResult<()> {
    let filter = level_filter(level);
    let mut installed = FILTER.lock();
    match installed.as_ref() {
        Some(handle) => handle.reload(filter).map_err(|error| {
            errors::raise::<KvConnectorError>("log_filter", format!("log level: {error}"))
        }),
        None if level.is_none() => Ok(()),
        None => {
            *installed = Some(install(filter)?);
            Ok(())
        }
    }
}

/// Waits up to `timeout_s` (GIL released) for a record, then returns up to a batch of
/// `(level, target, file, line, text)`; `[]` after the timeout or a wake-up.
///
/// # Errors
///
/// `ValueError` for a negative or non-finite timeout.
#[pyfunction]
#[pyo3(name = "_next_log_records")]
pub fn next_log_records(py: Python<'_>, timeout_s: f64) -> PyResult<Vec<PyLogRecord>> {
    let timeout = Duration::try_from_secs_f64(timeout_s).map_err(|_| {
        PyValueError::new_err(format!(
            "timeout_s must be a finite number >= 0, got {timeout_s}"
        ))
    })?;
    let receiver = &QUEUE.receiver;
    let first = if timeout.is_zero() {
        receiver.try_recv().ok()
    } else {
        py.detach(|| receiver.recv_timeout(timeout).ok())
    };
    let mut records = Vec::new();
    let mut next = first;
    while let Some(item) = next {
        if let Item::Record(record) = item {
            records.push((
                record.level,
                record.target,
                record.file,
                record.line,
                record.text,
            ));
        }
        if records.len() == LOG_BATCH {
            break;
        }
        next = receiver.try_recv().ok();
    }
    Ok(records)
}

/// Wakes a reader waiting in [`next_log_records`] (a stop). A full queue wakes it anyway,
/// so the wake-up is not queued then.
#[pyfunction]
#[pyo3(name = "_wake_log_reader")]
pub fn wake_log_reader() {
    let _ = QUEUE.sender.try_send(Item::Wake);
}

/// Records dropped so far because the queue was full (`python::logs::L2`).
#[pyfunction]
#[pyo3(name = "_log_records_dropped")]
pub fn log_records_dropped() -> u64 {
    QUEUE.dropped.load(Ordering::Relaxed)
}

/// Adds the functions and the capacity to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(forward_log_level, module)?)?;
    module.add_function(wrap_pyfunction!(next_log_records, module)?)?;
    module.add_function(wrap_pyfunction!(wake_log_reader, module)?)?;
    module.add_function(wrap_pyfunction!(log_records_dropped, module)?)?;
    module.add("_LOG_QUEUE_CAPACITY", LOG_QUEUE_CAPACITY)?;
    Ok(())
}
