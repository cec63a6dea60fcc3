"""Threads and the GIL (R31): Python threads keep the GIL busy with pure-Python loops while
one thread drives the hooks through saves and loads, on the embedded pool and on Mooncake
(whose client threads take the GIL for every call). The hooks must complete and the
loaded bytes be right. The saving side settles its saves right after handing them off,
while the saver still needs the GIL for its Mooncake puts: a hook that waited with the GIL
held would deadlock there. A deadlock would hang, so a watchdog ends the process after a
generous bound instead (no timing is asserted)."""

import faulthandler
import threading

import pytest
import torch

import kv_connector as kvc
from api_support import (  # noqa: F401 (fixture)
    SMALL_STAGING,
    T,
    caches,
    fill,
    layout,
    mooncake_master,
    needs_mooncake,
    prompt,
    serve,
    wait_until,
)

WATCHDOG_S = 900
BUSY_THREADS = 3


@pytest.fixture
def busy_gil():
    """Python threads spinning in pure-Python code until the test ends."""
    stop = threading.Event()
    spins = [0] * BUSY_THREADS

    def spin(index):
        while not stop.is_set():
            total = 0
            for i in range(2000):
                total += i * i
            spins[index] += 1

    threads = [threading.Thread(target=spin, args=(i,), daemon=True) for i in range(BUSY_THREADS)]
    for thread in threads:
        thread.start()
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    try:
        yield spins
    finally:
        faulthandler.cancel_dump_traceback_later()
        stop.set()
        for thread in threads:
            thread.join()


def save_at_once(conn, kv, rid, tokens, pages):
    """Computes the whole prompt in one step, then settles its saves and reads the stats
    at once, before the saver had a chance to run (module docs)."""
    conn.lookup(rid, tokens)
    assert wait_until(lambda: conn.reserve(rid, 0, rid), conn, f"the lookup of {rid}") == (0, False)
    for block in range(len(tokens) // T):
        for group, cache in enumerate(kv):
            fill(cache, pages[block], group, block)
    tables = [pages] * len(kv)
    conn.on_step([kvc.StepRequest(rid, len(tokens), 0, len(tokens), page_tables=tables)])
    conn.settle_saves()
    assert conn.stats()["saves"]["saves_enqueued"] > 0
    assert conn.request_finished(rid) is False, "settled: nothing to wait for"


def drive(a, kv_a, b, kv_b, requests=4):
    """A saves `requests` prompts; B loads each of them and checks the bytes."""
    for i in range(requests):
        tokens = prompt(6 * T + 3, start=20_000 + 1000 * i)
        save_at_once(a, kv_a, 10 + i, tokens, pages=list(range(7 * i, 7 * i + 7)))
        served = serve(b, kv_b, 10 + i, tokens, pages=list(range(7 * i, 7 * i + 7)))
        assert served.offer == 6 * T and served.filled, i
        for block in range(6):
            assert torch.equal(kv_b[0][7 * i + block], kv_a[0][block + 7 * i])
        a.stats()
        b.wait_for_progress(0.001)


def test_hooks_complete_while_python_threads_hold_the_gil_memory_pool(busy_gil):
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    kv_a, kv_b = caches(), caches()
    with (
        kvc.Connector(layout=layout(), kv_caches=kv_a, pool=pool, config=SMALL_STAGING) as a,
        kvc.Connector(layout=layout(), kv_caches=kv_b, pool=pool, config=SMALL_STAGING) as b,
    ):
        drive(a, kv_a, b, kv_b)
    assert all(spins > 0 for spins in busy_gil), "the busy threads ran meanwhile"


@needs_mooncake
def test_hooks_complete_while_python_threads_hold_the_gil_mooncake(busy_gil, mooncake_master):  # noqa: F811 (fixture)
    kv_a, kv_b = caches(), caches()
    config = mooncake_master.config()
    with (
        kvc.Connector(layout=layout(), kv_caches=kv_a, config=config, model_key="gil") as a,
        kvc.Connector(layout=layout(), kv_caches=kv_b, config=config, model_key="gil") as b,
    ):
        drive(a, kv_a, b, kv_b)
        saves = a.stats()["saves"]
        assert saves["saves_done"] > 0 and saves["saves_failed"] == 0
    assert all(spins > 0 for spins in busy_gil), "the busy threads ran meanwhile"
