"""`Connector.lookup(read_later=True)`: the list is copied at the call (or, with
`append_only=True`, read as the caller keeps it) and read on the
runtime's thread (`prompt::P1`, `prompt::P2`). The lookup offers and loads exactly what an
eager one does; changing the list after the call changes nothing; a list with an item that
is not an int offers nothing and saves nothing, where the eager lookup raises."""

from contextlib import contextmanager

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


@contextmanager
def served(blocks: int, extra_tokens: int):
    """Connector `a` serves a prompt of `blocks` full blocks and `extra_tokens` more and
    settles its saves; yields (a's pool, a, a's tensors, b, the prompt)."""
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    (a, kv_a), (b, _) = connector(pool), connector(pool)
    with a, b:
        tokens = prompt(blocks * T + extra_tokens)
        serve(a, kv_a, 1, tokens, pages=list(range(blocks + 1)))
        a.settle_saves()
        yield pool, a, kv_a, b, tokens


def computed_without_saves(conn: kvc.Connector, rid: int, tokens: list, pages: int) -> None:
    """`rid`'s prompt is computed and ends; asserts that nothing of it was saved."""
    conn.on_step([kvc.StepRequest(rid, len(tokens), 0, len(tokens), page_tables=[list(range(pages))])])
    if conn.request_finished(rid):
        wait_until(lambda: rid in conn.finished_saves(), conn, f"the saves of {rid}")
    assert conn.stats()["saves"]["saves_enqueued"] == 0


def test_a_list_read_later_is_looked_up_as_read_at_the_call():
    with served(8, 3) as (_, a, _, b, tokens):
        assert offer(b, 1, list(tokens), read_later=True) == 8 * T
        # The caller's list changes after the call: the lookup keeps what it was given.
        changing = list(tokens)
        b.lookup(2, changing, read_later=True)
        changing[:] = prompt(8 * T + 3, start=50_000)
        assert wait_until(lambda: b.reserve(2, 0, 2), b, "the lookup of 2")[0] == 8 * T
        assert b.keys(tokens) == a.keys(tokens)


def test_an_item_that_is_not_an_int_offers_and_saves_nothing_when_read_later():
    with served(6, 1) as (pool, _, kv_a, b, tokens):
        bad = list(tokens)
        bad[40] = "forty"
        with pytest.raises(TypeError):
            b.lookup(1, bad)
        assert offer(b, 2, bad, read_later=True) == 0
        # Computed anyway, nothing of it is saved: its tokens were never read.
        objects = pool.counters()["objects"]
        computed_without_saves(b, 2, bad, pages=7)
        assert pool.counters()["objects"] == objects
        assert torch.count_nonzero(kv_a[0][:6]) > 0


def test_an_append_only_list_is_read_as_it_was_at_the_call():
    with served(8, 3) as (_, _, _, b, tokens):
        # Items appended after the call are not the prompt's: the lookup reads the first
        # len(tokens) items, and offers what an eager lookup of them offers.
        growing = list(tokens)
        b.lookup(1, growing, read_later=True, append_only=True)
        growing.extend(prompt(4 * T, start=70_000))
        assert wait_until(lambda: b.reserve(1, 0, 1), b, "the lookup of 1")[0] == 8 * T
        with pytest.raises(ValueError, match="read_later=True"):
            b.lookup(2, list(tokens), append_only=True)


def test_an_append_only_list_that_shrank_offers_and_saves_nothing():
    with served(8, 3) as (_, _, _, b, tokens):
        # The promise is broken before the planner reads the list (a lookup is queued until
        # the next hook sends it): the lookup reads nothing of it.
        shrinking = list(tokens)
        b.lookup(1, shrinking, read_later=True, append_only=True)
        del shrinking[T:]
        assert wait_until(lambda: b.reserve(1, 0, 1), b, "the lookup of 1")[0] == 0
        computed_without_saves(b, 1, tokens, pages=9)
