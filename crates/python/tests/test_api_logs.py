"""`kv_connector.forward_logs`: the runtime's log records (Rust `tracing`) reach a Python
`logging.Logger`, at their level, from a daemon thread; the threads that log never take
the GIL (they queue formatted records). Records are waited for with a hang guard, never
timed."""

import logging
import threading
import uuid

import pytest

import kv_connector as kvc
from api_support import PATIENCE_S, SMALL_STAGING, T, caches, layout, prompt, serve

# A stats report every second instead of every 30 s, under a name to find it by.
REPORTING = {**SMALL_STAGING, "stats": {"interval_s": 1, "instance": "logs-test"}}
CHECKSUM_WARNING = "loaded page does not match its checksum"


class Collect(logging.Handler):
    """Keeps every record it is given, and lets a test wait for one."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._changed = threading.Condition()

    def emit(self, record):
        with self._changed:
            self.records.append(record)
            self._changed.notify_all()

    def matching(self, predicate) -> list[logging.LogRecord]:
        with self._changed:
            return [r for r in self.records if predicate(r)]

    def wait_for(self, predicate, what: str) -> logging.LogRecord:
        with self._changed:
            if not self._changed.wait_for(lambda: any(predicate(r) for r in self.records), PATIENCE_S):
                pytest.fail(f"gave up waiting for a log record: {what}")
            return next(r for r in self.records if predicate(r))


@pytest.fixture
def target():
    """A logger of its own with a collecting handler; forwarding stops after the test."""
    logger = logging.getLogger(f"kvc-test-logs.{uuid.uuid4().hex}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = Collect()
    logger.addHandler(handler)
    yield logger, handler
    kvc.forward_logs(None)


def corrupt_load(config, inside=lambda: None) -> dict:
    """A saves a prompt, one of its objects is corrupted, B's load of it is refused (the
    runtime logs a warning); `inside()` runs while both connectors still run. Returns B's
    load counters."""
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    lay = layout(full_only=True)
    kv_a, kv_b = caches(1), caches(1)
    a = kvc.Connector(layout=lay, kv_caches=kv_a, pool=pool, config=config, model_key="logs")
    b = kvc.Connector(layout=lay, kv_caches=kv_b, pool=pool, config=config, model_key="logs")
    with a, b:
        tokens = prompt(6 * T + 1)
        serve(a, kv_a, 1, tokens, pages=list(range(7)))
        a.settle_saves()
        victim = a.keys(tokens)[3][0]
        assert pool.corrupt(victim, 1) == [victim]
        assert serve(b, kv_b, 2, tokens, pages=list(range(40, 47))).filled is False
        inside()
        return b.stats()["loads"]


def checksum_warning(record: logging.LogRecord) -> bool:
    return CHECKSUM_WARNING in record.getMessage()


def stats_report(record: logging.LogRecord) -> bool:
    return record.getMessage().startswith("lookups") and 'instance="logs-test"' in record.getMessage()


@pytest.mark.skipif("faults" not in kvc.FEATURES, reason="needs a wheel built with the faults feature")
def test_a_refused_load_warns_and_the_stats_report_is_logged_through_python_logging(target):
    logger, handler = target
    logger.setLevel(logging.WARNING)
    kvc.forward_logs(logger)  # at the logger's level, following it
    seen = {}

    def while_running():
        seen["warning"] = handler.wait_for(checksum_warning, CHECKSUM_WARNING)
        logger.setLevel(logging.INFO)  # the stats reports (INFO) now pass too
        seen["report"] = handler.wait_for(stats_report, "the stats report")

    assert corrupt_load(REPORTING, while_running)["failed_corrupt"] == 1
    warning, report = seen["warning"], seen["report"]
    assert warning.levelno == logging.WARNING and warning.name == logger.name
    assert warning.kvc_target.startswith("kv_connector::"), warning.kvc_target
    assert warning.pathname.endswith(".rs") and warning.lineno > 0, (warning.pathname, warning.lineno)
    assert "key=" in warning.getMessage(), "the event's fields follow its message"
    assert report.levelno == logging.INFO
    assert report.kvc_target == "kv_connector::actors::stats_reporter"
    assert " full_miss=" in report.getMessage(), report.getMessage()
    assert not handler.matching(lambda r: r.levelno < logging.INFO), "nothing below the level"


@pytest.mark.skipif("faults" not in kvc.FEATURES, reason="needs a wheel built with the faults feature")
def test_forward_logs_none_stops_queueing(target):
    logger, handler = target
    kvc.forward_logs(logger, "WARNING")
    kvc.forward_logs(None)
    assert corrupt_load(SMALL_STAGING)["failed_corrupt"] == 1  # the warning was logged
    # Forwarding again, then stopping, emits whatever was queued meanwhile: nothing.
    kvc.forward_logs(logger, "WARNING")
    kvc.forward_logs(None)
    assert not handler.matching(checksum_warning)


def test_one_subscriber_per_process_and_argument_checks(target):
    logger, _ = target
    kvc.forward_logs(logger.name, logging.ERROR)  # by name, at a level number
    with pytest.raises(kvc.KvConnectorError) as refused:
        kvc.init_logging()
    assert refused.value.kind == "already_set"
    with pytest.raises(TypeError, match="logging.Logger"):
        kvc.forward_logs(42)
    with pytest.raises(TypeError, match="logging level"):
        kvc.forward_logs(logger, True)
    with pytest.raises(ValueError, match="'LOUD'"):
        kvc.forward_logs(logger, "LOUD")
