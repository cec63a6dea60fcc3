"""`forward_logs`: the runtime's log records (Rust `tracing`) emitted to a Python
`logging.Logger`.

The threads that log (the runtime's actors, loaders and savers) never take the GIL: they
format each record and put it in a bounded queue of the native module (`logs.rs`; a
full queue drops new records and counts them). One daemon thread here waits on that
queue with the GIL released and emits each record to the logger, at the record's level
(ERROR, WARNING, INFO, DEBUG; TRACE as level 5), with the Rust source file and line as
the record's `pathname` / `lineno` and the `tracing` target as `record.kvc_target`.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import traceback

import kv_connector._native as _native

# How long one wait for records lasts (with the GIL released) before the thread looks
# again: how soon a change of the logger's level applies (a stop wakes it at once).
WAIT_S = 1.0
# How long a stop waits for the thread to emit what is queued.
STOP_WAIT_S = 10.0


def _level_number(level: int | str) -> int:
    if isinstance(level, bool) or not isinstance(level, (int, str)):
        raise TypeError(f"level must be a logging level (an int or a name such as 'INFO'), got {level!r}")
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise ValueError(f"level {level!r} is not a logging level name; use 'DEBUG', 'INFO', 'WARNING' or 'ERROR'")
        return number
    return level


class _Forwarder:
    """The process's one reader of the native queue (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None  # the running thread's own stop signal
        self._dropped = 0
        self.logger: logging.Logger | None = None
        self._follow = False  # the level follows the logger's effective level
        self._applied: int | None = None  # the level the native filter has

    def start(self, logger: logging.Logger, level: int | None) -> None:
        with self._lock:
            applied = logger.getEffectiveLevel() if level is None else level
            _native._forward_log_level(applied)
            self.logger, self._follow, self._applied = logger, level is None, applied
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(self._stop,), name="kv_connector-logs", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        """Queues nothing more, emits what is queued, then ends the thread."""
        with self._lock:
            _native._forward_log_level(None)
            thread, self._thread = self._thread, None
            if thread is None or self._stop is None:
                return
            self._stop.set()
            _native._wake_log_reader()
            thread.join(STOP_WAIT_S)
            self.logger, self._applied = None, None

    def _follow_level(self, logger: logging.Logger, stop: threading.Event) -> None:
        """Applies the logger's effective level when it changed (vLLM configures its
        loggers after importing them). Skipped while start or stop holds the lock (stop
        joins this thread while it holds it)."""
        level = logger.getEffectiveLevel()
        if not self._follow or level == self._applied or not self._lock.acquire(blocking=False):
            return
        try:
            if not stop.is_set() and self._follow and self.logger is logger:
                _native._forward_log_level(level)
                self._applied = level
        finally:
            self._lock.release()

    def _run(self, stop: threading.Event) -> None:
        while True:
            stopping = stop.is_set()
            records = _native._next_log_records(0.0 if stopping else WAIT_S)
            logger = self.logger
            if logger is not None:
                for record in records:
                    self._emit(logger, *record)
                self._report_drops(logger)
                self._follow_level(logger, stop)
            if stopping and not records:
                return

    @staticmethod
    def _emit(logger: logging.Logger, level: int, target: str, file: str, line: int, text: str) -> None:
        if not logger.isEnabledFor(level):
            return
        try:
            record = logger.makeRecord(logger.name, level, file, line, text, (), None, extra={"kvc_target": target})
            logger.handle(record)
        except Exception:  # a failing filter or handler must not end the forwarding
            traceback.print_exc(file=sys.stderr)

    def _report_drops(self, logger: logging.Logger) -> None:
        dropped = _native._log_records_dropped()
        if dropped > self._dropped:
            logger.warning(
                "kv_connector dropped %d runtime log records: its log queue (%d records) was full",
                dropped - self._dropped,
                _native._LOG_QUEUE_CAPACITY,
            )
            self._dropped = dropped


_FORWARDER = _Forwarder()


def forward_logs(logger: logging.Logger | str | None, level: int | str | None = None) -> None:
    """Emits the runtime's log records to `logger` (a `logging.Logger` or its name) from
    now on, at `level` and above (default: the logger's effective level, followed when it
    changes, within a second). Call it again to change the logger or the level; `None`
    emits what is queued and stops. Raises `KvConnectorError` when `init_logging` already
    took the runtime's logs (one per process)."""
    if logger is None:
        _FORWARDER.stop()
        return
    if isinstance(logger, str):
        logger = logging.getLogger(logger)
    if not isinstance(logger, logging.Logger):
        raise TypeError(f"logger must be a logging.Logger, its name or None, got {type(logger).__name__}")
    _FORWARDER.start(logger, None if level is None else _level_number(level))


# Registered when the package is imported, before its `shutdown_all` hook, so it runs
# after that hook (atexit runs last-registered first): the records of the final shutdown
# are emitted too.
atexit.register(_FORWARDER.stop)
