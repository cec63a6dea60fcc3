"""`Connector.lookup(read_later=True)`: the list is copied at the call (or, with
`append_only=True`, read as the caller keeps it) and read on the
runtime's thread (`prompt::P1`, `prompt::P2`). The lookup offers and loads exactly what an
eager one does; changing the list after the call changes nothing; a list with an item that
is not an int offers nothing and saves nothing, where the eager lookup raises."""

import pytest
import torch

import kv_connector as kvc
from api_support import SMALL_STAGING, T, caches, layout, prompt, serve, wait_until


def connector(pool):
    kv = caches(1)
    return kvc.Connector(layout=layout(True), kv_caches=kv, pool=pool, config=SMALL_STAGING, model_key="m"), kv


def offer(conn: kvc.Connector, rid: int, tokens, **kw) -> int:
    conn.lookup(rid, tokens, **kw)
    extra, _ = wait_until(lambda: conn.reserve(rid, 0, rid), conn, f"the lookup of {rid}")
    return extra


def test_a_list_read_later_is_looked_up_as_read_at_the_call():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    (a, kv_a), (b, _) = connector(pool), connector(pool)
    with a, b:
        tokens = prompt(8 * T + 3)
        serve(a, kv_a, 1, tokens, pages=list(range(9)))
        a.settle_saves()
        assert offer(b, 1, list(tokens), read_later=True) == 8 * T
        # The caller's list changes after the call: the lookup keeps what it was given.
        changing = list(tokens)
        b.lookup(2, changing, read_later=True)
        changing[:] = prompt(8 * T + 3, start=50_000)
        assert wait_until(lambda: b.reserve(2, 0, 2), b, "the lookup of 2")[0] == 8 * T
        assert b.keys(tokens) == a.keys(tokens)


def test_an_item_that_is_not_an_int_offers_and_saves_nothing_when_read_later():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    (a, kv_a), (b, _) = connector(pool), connector(pool)
    with a, b:
        tokens = prompt(6 * T + 1)
        serve(a, kv_a, 1, tokens, pages=list(range(7)))
        a.settle_saves()
        bad = list(tokens)
        bad[40] = "forty"
        with pytest.raises(TypeError):
            b.lookup(1, bad)
        assert offer(b, 2, bad, read_later=True) == 0
        # Computed anyway, nothing of it is saved: its tokens were never read.
        objects = pool.counters()["objects"]
        b.on_step([kvc.StepRequest(2, len(bad), 0, len(bad), page_tables=[list(range(7))])])
        if b.request_finished(2):
            wait_until(lambda: 2 in b.finished_saves(), b, "the saves of 2")
        assert pool.counters()["objects"] == objects
        assert b.stats()["saves"]["saves_enqueued"] == 0
        assert torch.count_nonzero(kv_a[0][:6]) > 0


def test_an_append_only_list_is_read_as_it_was_at_the_call():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    (a, kv_a), (b, _) = connector(pool), connector(pool)
    with a, b:
        tokens = prompt(8 * T + 3)
        serve(a, kv_a, 1, tokens, pages=list(range(9)))
        a.settle_saves()
        # Items appended after the call are not the prompt's: the lookup reads the first
        # len(tokens) items, and offers what an eager lookup of them offers.
        growing = list(tokens)
        b.lookup(1, growing, read_later=True, append_only=True)
        growing.extend(prompt(4 * T, start=70_000))
        assert wait_until(lambda: b.reserve(1, 0, 1), b, "the lookup of 1")[0] == 8 * T
        with pytest.raises(ValueError, match="read_later=True"):
            b.lookup(2, list(tokens), append_only=True)


def test_an_append_only_list_that_shrank_offers_and_saves_nothing():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    (a, kv_a), (b, _) = connector(pool), connector(pool)
    with a, b:
        tokens = prompt(8 * T + 3)
        serve(a, kv_a, 1, tokens, pages=list(range(9)))
        a.settle_saves()
        # The promise is broken before the planner reads the list (a lookup is queued until
        # the next hook sends it): the lookup reads nothing of it.
        shrinking = list(tokens)
        b.lookup(1, shrinking, read_later=True, append_only=True)
        del shrinking[T:]
        assert wait_until(lambda: b.reserve(1, 0, 1), b, "the lookup of 1")[0] == 0
        b.on_step([kvc.StepRequest(1, len(tokens), 0, len(tokens), page_tables=[list(range(9))])])
        if b.request_finished(1):
            wait_until(lambda: 1 in b.finished_saves(), b, "the saves of 1")
        assert b.stats()["saves"]["saves_enqueued"] == 0
