"""Ranks and pipeline stages in separate connectors (R33), as a deployment runs them in
separate processes: a lookup-only connector looks each request up once over every shard
and stage, and each rank's connector adopts that lookup (`lookup_record`, `adopt_lookup`),
saves its own shard or stage, and loads exactly its own bytes. A block is offered only when
every rank and every stage holds it. Misuse is refused with the setting named."""

from contextlib import ExitStack

import pytest
import torch

import kv_connector as kvc
from api_support import FULL_LAYOUT, PAGES, SMALL_STAGING, T, fill, prompt, wait_until

# Two tensor-parallel ranks: one of the two KV heads each.
TP2 = {**FULL_LAYOUT, "name": "tiny-tp2", "world_size": 2}
RANK_PAGE = (2, 2, T, 1, 16)
# Two pipeline stages of a four-layer model: group 0 on stage 0, group 1 on stage 1.
GROUP = FULL_LAYOUT["groups"][0]
STAGES = [
    {**FULL_LAYOUT, "name": "tiny-pp2", "groups": [{**GROUP, "id": 0, "layers": [0, 1]}]},
    {**FULL_LAYOUT, "name": "tiny-pp2", "groups": [{**GROUP, "id": 1, "layers": [2, 3]}]},
]
UNION = {**STAGES[0], "groups": [g for stage in STAGES for g in stage["groups"]]}


def cache(page_shape=RANK_PAGE) -> list[torch.Tensor]:
    return [torch.zeros((PAGES, *page_shape), dtype=torch.float32)]


def rank(layout: dict, kv, pool, **kw) -> kvc.Connector:
    return kvc.Connector(kvc.Layout.from_dict(layout), kv, pool=pool, config=SMALL_STAGING, model_key="m", **kw)


def looked_up(sched: kvc.Connector, rid: int, tokens: list[int]) -> tuple[int, bytes]:
    """The scheduler's lookup: its offer and the record the ranks adopt."""
    sched.lookup(rid, tokens)
    offer, _ = wait_until(lambda: sched.reserve(rid, 0, rid), sched, f"the lookup of {rid}")
    record = sched.lookup_record(rid)
    assert record is not None
    sched.request_finished(rid)
    return offer, record


def compute(conn: kvc.Connector, kv, rid: int, tokens: list[int], record: bytes, salt: int) -> None:
    """A rank computes the whole prompt into pages 0.. (its own bytes: `salt`) and saves."""
    conn.adopt_lookup(rid, record)
    pages = list(range(len(tokens) // T + 1))
    for block in range(len(tokens) // T):
        fill(kv[0], pages[block], 0, block, salt=salt)
    conn.on_step([kvc.StepRequest(rid, len(tokens), 0, len(tokens), page_tables=[pages])])
    if conn.request_finished(rid):
        wait_until(lambda: rid in conn.finished_saves(), conn, f"the saves of {rid}")


def load(conn: kvc.Connector, rid: int, record: bytes, offer: int, first_page: int) -> bool:
    """A rank loads the scheduler's offer into pages first_page..; whether it filled."""
    conn.adopt_lookup(rid, record)
    assert conn.reserve(rid, 0, rid) == (offer, True), "the rank offers what the scheduler offered"
    pages = list(range(first_page, first_page + offer // T + 1))
    conn.on_step([kvc.StepRequest(rid, offer + 1, 0, 0, new_reservation=rid, page_tables=[pages])])
    done = wait_until(lambda: [ld for ld in conn.finished_loads() if ld[0] == rid], conn, f"the load of {rid}")
    return done[0][2]


def test_tensor_parallel_ranks_save_their_shards_and_load_them_byte_exact():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    sched = rank(TP2, None, pool)
    a = [cache(), cache()]
    b = [cache(), cache()]
    conns = [rank(TP2, a[r], pool, rank=r) for r in range(2)] + [rank(TP2, b[r], pool, rank=r) for r in range(2)]
    with ExitStack() as stack:
        for conn in (sched, *conns):
            stack.enter_context(conn)
        tokens = prompt(6 * T + 1)
        offer, record = looked_up(sched, 1, tokens)
        assert offer == 0
        for r in range(2):
            compute(conns[r], a[r], 1, tokens, record, salt=r)
        assert pool.counters()["objects"] == 12, "six blocks, one object per rank each"
        offer, record = looked_up(sched, 2, tokens)
        assert offer == 6 * T
        for r in range(2):
            assert load(conns[2 + r], 2, record, offer, first_page=10), f"rank {r}"
            for block in range(6):
                assert torch.equal(b[r][0][10 + block], a[r][0][block]), (r, block)
        assert not torch.equal(a[0][0][0], a[1][0][0]), "each rank stored its own shard"
        # A prompt only rank 0 computed is not offered: rank 1's shard is missing.
        other = prompt(4 * T + 1, start=5000)
        _, record = looked_up(sched, 3, other)
        compute(conns[0], a[0], 3, other, record, salt=0)
        assert looked_up(sched, 4, other)[0] == 0
        assert sched.stats()["lookups"]["full_miss"] >= 2


def test_pipeline_stages_are_looked_up_together_and_each_loads_its_own_layers():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    stages = [kvc.Layout.from_dict(stage) for stage in STAGES]
    sched = rank(UNION, None, pool, stages=stages)
    page = (2, 2, T, 2, 16)
    a, b = [cache(page), cache(page)], [cache(page), cache(page)]
    conns = [rank(STAGES[s], a[s], pool) for s in range(2)] + [rank(STAGES[s], b[s], pool) for s in range(2)]
    with ExitStack() as stack:
        for conn in (sched, *conns):
            stack.enter_context(conn)
        tokens = prompt(5 * T + 3)
        _, record = looked_up(sched, 1, tokens)
        for s in range(2):
            compute(conns[s], a[s], 1, tokens, record, salt=7 * s)
        offer, record = looked_up(sched, 2, tokens)
        assert offer == 5 * T
        for s in range(2):
            assert load(conns[2 + s], 2, record, offer, first_page=20), f"stage {s}"
            for block in range(5):
                assert torch.equal(b[s][0][20 + block], a[s][0][block]), (s, block)
        # Stage 1 never computed this one: nothing is offered.
        other = prompt(3 * T + 1, start=9000)
        _, record = looked_up(sched, 3, other)
        compute(conns[0], a[0], 3, other, record, salt=0)
        assert looked_up(sched, 4, other)[0] == 0


def test_misuse_is_refused_naming_the_setting():
    pool = kvc.MemoryPool(capacity_bytes=16 << 20)
    sched = rank(TP2, None, pool)
    with sched:
        _, record = looked_up(sched, 1, prompt(2 * T + 1))
        with pytest.raises(ValueError, match="looks requests up only"):
            sched.on_step([kvc.StepRequest(1, 2 * T + 1, 0, 2 * T + 1, page_tables=[[0, 1, 2]])])
        stranger = rank({**TP2, "world_size": 1}, [torch.zeros((PAGES, 2, 2, T, 2, 16))], pool)
        with stranger, pytest.raises(ValueError, match="layout"):
            stranger.adopt_lookup(1, record)
        with pytest.raises(ValueError, match="not a lookup record"):
            sched.adopt_lookup(9, b"garbage")
    with pytest.raises(kvc.LayoutError, match="world size 2"):
        rank(TP2, cache(), pool, rank=2)
    with pytest.raises(kvc.LayoutError, match="union"):
        rank(UNION, None, pool, stages=[kvc.Layout.from_dict(STAGES[0])])
