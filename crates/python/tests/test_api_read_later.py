"""`Connector.lookup(read_later=True)`: the list is copied at the call and read on the
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
