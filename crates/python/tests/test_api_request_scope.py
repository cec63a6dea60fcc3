"""What the hooks refuse so that no call sequence serves wrong KV (R32): a second lookup of
a live request, a reservation `reserve` never offered or one reported twice, a page table
outside its tensor; `wait_for_progress` waits without the connector's lock and is
interrupted by signals; `pool_model_key` is the key segment `kv-connector keys` takes."""

import faulthandler
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

import kv_connector as kvc
from api_support import PAGES, PATIENCE_S, SMALL_STAGING, T, caches, fill, layout, prompt, serve, wait_until


def pair(pool):
    lay = layout(full_only=True)
    kv_a, kv_b = caches(1), caches(1)
    a = kvc.Connector(layout=lay, kv_caches=kv_a, pool=pool, config=SMALL_STAGING, model_key="m")
    b = kvc.Connector(layout=lay, kv_caches=kv_b, pool=pool, config=SMALL_STAGING, model_key="m")
    return a, kv_a, b, kv_b


def test_a_second_lookup_of_a_live_request_is_refused_and_publishes_nothing():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, kv_a, b, kv_b = pair(pool)
    with a, b:
        tok_a, tok_b = prompt(6 * T + 1, start=1000), prompt(6 * T + 1, start=90_000)
        a.lookup(1, tok_a)
        with pytest.raises(ValueError, match="request 1 is live"):
            a.lookup(1, tok_b)
        # An engine that goes on computing tok_b under id 1 publishes none of it.
        wait_until(lambda: a.reserve(1, 0, 1), a, "the lookup of 1")
        pages = list(range(7))
        for block in range(6):
            fill(kv_a[0], pages[block], 0, block, salt=7)  # tok_b's KV
        a.on_step([kvc.StepRequest(1, len(tok_b), 0, len(tok_b), page_tables=[pages])])
        if a.request_finished(1):
            wait_until(lambda: 1 in a.finished_saves(), a, "the saves of 1")
        assert pool.counters()["objects"] == 0, "tok_b's KV was published under tok_a's keys"
        # B finds nothing of tok_a, so it computes it itself.
        assert serve(b, kv_b, 2, tok_a, pages=list(range(20, 27))).offer == 0
        # Ended, the id is new again.
        a.lookup(1, tok_b)


def test_only_the_latest_offer_is_loaded_and_only_once():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, kv_a, b, _kv_b = pair(pool)
    with a, b:
        tokens = prompt(6 * T + 1)
        serve(a, kv_a, 1, tokens, pages=list(range(7)))
        a.settle_saves()
        b.lookup(2, tokens)
        extra, _ = wait_until(lambda: b.reserve(2, 0, 7), b, "the lookup of 2")
        assert extra == 6 * T
        table = [list(range(30, 37))]
        with pytest.raises(ValueError, match="reservation 99 was not offered"):
            b.on_step([kvc.StepRequest(2, len(tokens), 0, 0, new_reservation=99, page_tables=table)])
        b.on_step([kvc.StepRequest(2, len(tokens), 0, 0, new_reservation=7, page_tables=table)])
        with pytest.raises(ValueError, match="reservation 7 was already reported"):
            b.on_step([kvc.StepRequest(2, len(tokens), 0, 0, new_reservation=7, page_tables=table)])
        loads = wait_until(lambda: b.finished_loads(), b, "the load of 2")
        b.wait_for_progress(0.2)
        loads += b.finished_loads()
        assert loads == [(7, 2, True)], "one report, for the offered reservation"


def test_a_page_table_outside_its_tensor_refuses_the_whole_step():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, _kv_a, _b, _kv_b = pair(pool)
    with a:
        good, bad = prompt(2 * T + 1, start=10), prompt(2 * T + 1, start=50_000)
        for rid, tokens in ((1, good), (2, bad)):
            a.lookup(rid, tokens)
            wait_until(lambda rid=rid: a.reserve(rid, 0, rid), a, f"the lookup of {rid}")
        step = [
            kvc.StepRequest(1, len(good), 0, len(good), page_tables=[[0, 1, 2]]),
            kvc.StepRequest(2, len(bad), 0, len(bad), page_tables=[[3, PAGES, 5]]),
        ]
        with pytest.raises(ValueError, match=rf"request 2: page_tables\[0\]\[1\] = {PAGES} is out of range"):
            a.on_step(step)
        a.settle_saves()
        assert a.stats()["saves"]["saves_enqueued"] == 0, "nothing of the refused step was done"
        # The valid request alone goes through.
        a.on_step(step[:1])
        a.settle_saves()
        assert a.stats()["saves"]["saves_done"] == 2


def test_step_request_attributes_are_checked_like_the_constructor():
    request = kvc.StepRequest(1, 40, 0, 16, page_tables=[[0, 1, 2]])
    with pytest.raises(ValueError, match="not a page index"):
        request.page_tables = [[0, -5]]
    assert request.page_tables == [[0, 1, 2]]
    for name in ("request_id", "prompt_len", "computed_before", "computed_after", "new_reservation"):
        with pytest.raises(ValueError, match=name):
            setattr(request, name, -1)
    with pytest.raises(ValueError, match="group_id"):
        layout().load_blocks(-1, 0, T)
    request.computed_before = 32  # above computed_after now
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, _kv_a, _b, _kv_b = pair(pool)
    with a:
        a.lookup(1, prompt(40))
        with pytest.raises(ValueError, match="computed_after"):
            a.on_step([request])


@pytest.fixture
def hang_guard():
    """Ends the test run with a traceback if a wait below never returns (a hang); the
    tests make no timing assertion."""
    faulthandler.dump_traceback_later(PATIENCE_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def test_wait_for_progress_leaves_the_lock_to_other_threads(hang_guard):
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, _kv_a, _b, _kv_b = pair(pool)
    waiting = threading.Event()

    def idle():
        waiting.set()
        a.wait_for_progress(1e6)  # nothing is in flight: only shutdown ends it

    waiter = threading.Thread(target=idle)
    waiter.start()
    waiting.wait()
    waiter.join(0.2)  # let it reach the wait
    a.lookup(1, prompt(3 * T))  # returns at once: the waiter holds no lock
    a.flush()
    assert waiter.is_alive(), "the lookup's answer ended the wait, or the wait never began"
    a.shutdown()  # the actors are gone: the wait ends
    waiter.join()


def test_wait_for_progress_is_interrupted_by_sigint(hang_guard):
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, _kv_a, _b, _kv_b = pair(pool)
    with a:
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            a.wait_for_progress(1e6)  # nothing is in flight: only the signal ends it
        timer.join()


def kv_connector_binary() -> Path | None:
    root = Path(__file__).resolve().parents[3]
    binary = root / "target" / "release" / "kv-connector"
    return binary if binary.exists() else None


@pytest.mark.skipif(kv_connector_binary() is None, reason="build the binary first (cargo build --release)")
def test_pool_model_key_is_what_the_keys_command_takes():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, _kv_a, _b, _kv_b = pair(pool)
    with a:
        tokens = prompt(3 * T + 5)
        assert a.pool_model_key.startswith(a.model_key + ".")
        page_bytes = caches(1)[0][0].numel() * 4
        printed = subprocess.run(
            [
                str(kv_connector_binary()), "keys", "--json", "-t", str(T), "--namespace", a.namespace,
                "--model-key", a.pool_model_key, "--group", "0", "--bytes-per-page", str(page_bytes),
            ],
            input=json.dumps(tokens), capture_output=True, text=True, check=True,
        ).stdout
        assert [row["keys"] for row in json.loads(printed)] == a.keys(tokens)
