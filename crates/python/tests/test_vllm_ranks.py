"""`kv_connector.vllm.KvcConnector` under vLLM's real `Scheduler` with tensor- and
pipeline-parallel ranks, each rank's worker side in its own process (vllm_ranks), two
engines sharing one pool through a real `mooncake_master` on loopback.

Bit-exact checks follow test_vllm_scheduler: resume points are multiples of 80 and each
engine runs one request at a time with a 40-token budget, so the logits after a load
equal a no-reuse baseline's bit for bit. The test's model runner reads every replica of a
replicated KV head and requires them equal, so a load gone wrong on one rank shows.
"""

import functools
import random
import tempfile
import time

import pytest
import torch

from api_support import import_vllm, mooncake_master, needs_mooncake  # noqa: F401 (fixture)

import_vllm()

import vllm_ranks as vr  # noqa: E402
import vllm_support as vs  # noqa: E402
from models import peer, scenarios, tiny  # noqa: E402

pytestmark = needs_mooncake

DECODE = scenarios.DECODE
RESUME = 160  # the first turn's 165 tokens, floored to blocks (a multiple of 80)


@functools.cache
def model_of(name: str):
    return tiny.build_model(tiny.SPECS[name])


@functools.cache
def model_dir_of(name: str) -> str:
    return vs.write_model_dir(tiny.SPECS[name], tempfile.mkdtemp())


@pytest.fixture
def engines(mooncake_master):  # noqa: F811 (fixture)
    """Opens engines on the module's master; kills what a failing test left running."""
    opened = []

    def open_engine(name: str, model_key: str, **kw) -> vr.RankedInstance:
        config = {**mooncake_master.config(), "planner": {"swa_endpoint_rewind_tokens": scenarios.REWIND}}
        inst = vr.RankedInstance(
            tiny.SPECS[name], model_of(name), model_dir_of(name), extra={"kvc": config, "model_key": model_key}, **kw
        )
        opened.append(inst)
        return inst

    yield open_engine
    for inst in reversed(opened):
        if not inst.closed:
            inst.kill()


def assert_bit_exact(model, s: vs.Served, expected_start: int):
    assert s.start == expected_start, f"{s.req_id}: resumed at {s.start}, expected {expected_start}"
    chunks = vs.baseline_chunks(len(s.tokens), s.start, s.chunks, scenarios.CHUNK)
    rows, generated = vs.native_rows(model, s.tokens, chunks, DECODE)
    assert torch.equal(s.logits, rows[s.start :]), f"{s.req_id}: logits differ"
    assert s.generated == generated, f"{s.req_id}: greedy tokens differ"


def assert_stats_add_up(inst: vr.RankedInstance) -> None:
    """What vLLM received through the aggregated per-step stats is the sum of every rank's
    own counters."""
    inst.step()  # an idle step reports what changed since the last one
    ranks: dict[str, int] = {}
    for counters in inst.call_all("counters"):
        for key, value in counters.items():
            ranks[key] = ranks.get(key, 0) + value
    nonzero = {k: v for k, v in ranks.items() if v}
    assert nonzero, "the ranks counted nothing"
    assert {k: v for k, v in inst.aggregated_stats().items() if v} == nonzero


def assert_clean(finals: list[dict]) -> None:
    for rank, stats in enumerate(finals):
        assert stats["loads"]["loads_failed"] == 0, (rank, stats["loads"])
        assert stats["saves"]["saves_failed"] == 0, (rank, stats["saves"])
        assert stats["saves"]["published_past_chunk_end"] == 0, (rank, stats["saves"])


def two_turns(engines, name: str, **parallel) -> None:
    """Engine A serves a conversation's first turn, engine B (same ranks, same model key)
    the second: B's request parks while every rank loads its shard of A's prefix, then
    resumes bit-exact."""
    model_key = f"tiny-{name}-" + "-".join(f"{k}{v}" for k, v in sorted(parallel.items()))
    a = engines(name, model_key, **parallel)
    prompt = scenarios.random_tokens(1, scenarios.FIRST_TURN_TOKENS)
    first = a.serve("turn1", prompt)
    a.settle_saves()
    assert not first.parked
    assert_bit_exact(a.model, first, 0)
    b = engines(name, model_key, **parallel)
    second = b.serve("turn2", prompt + first.generated[:DECODE] + scenarios.random_tokens(101, scenarios.USER_TOKENS))
    assert second.parked, "the request waited in WAITING_FOR_REMOTE_KVS"
    assert_bit_exact(b.model, second, RESUME)
    for inst in (a, b):
        assert_stats_add_up(inst)
    finals_b, finals_a = b.close(), a.close()
    assert len(finals_a) == len(finals_b) == a.ranks
    assert_clean(finals_a + finals_b)
    assert all(stats["saves"]["saves_done"] > 0 for stats in finals_a), "every rank saved its shard"
    assert all(stats["loads"]["loads_done"] == 1 for stats in finals_b), "every rank loaded its shard"


@pytest.mark.parametrize("name", ["gpt-oss", "llama"])
def test_tp2_second_turn_loads_every_ranks_shard_bit_exact_and_stats_add_up(engines, name):
    two_turns(engines, name, tp=2)


def test_tp4_replicated_heads_load_bit_exact(engines):
    """Two KV heads on four ranks: each head on two ranks, each replica loaded and read."""
    two_turns(engines, "gpt-oss", tp=4)


@pytest.mark.parametrize("name", ["llama", "gpt-oss"])
def test_pp2_stages_load_their_layers_bit_exact(engines, name):
    two_turns(engines, name, pp=2)


def garble_one_object(store, keys: list[str]) -> str:
    """Replaces the first of `keys` the pool holds with random bytes of the same size."""
    for key in keys:
        if store.is_exist(key) != 1:
            continue
        size = len(store.get(key))
        assert store.remove(key, True) == 0, key  # force: past any lease of A's saves
        assert store.put(key, random.Random(7).randbytes(size)) == 0, key
        return key
    raise AssertionError(f"none of {keys} is in the pool")


@pytest.mark.parametrize("name", ["llama", "gpt-oss"])
def test_a_garbled_object_of_one_rank_fails_the_load_and_vllm_recomputes(engines, mooncake_master, name):  # noqa: F811
    """One object of rank 1's shard, in the middle of the prefix, is replaced with garbage
    of its size (through the test's own Mooncake client). Rank 1's load fails its
    integrity check, rank 0's succeeds; the aggregated output makes vLLM compute the
    prompt on every rank, bit-exact, and the stats vLLM received show the failure."""
    a = engines(name, f"tiny-{name}-garbled", tp=2)
    a_prompt, b_prompt = scenarios.system_prompts()
    a.serve("a", a_prompt, max_tokens=1)
    a.settle_saves()
    # The keys of block 5 as the ranks' own connectors name them, rank 1's shard only.
    keys = sorted({k for per_rank in a.call_all("keys", a_prompt) for k in per_rank[5] if "/w2r1/" in k})
    store = peer.raw_client(mooncake_master.config())
    try:
        garble_one_object(store, keys)
        b = engines(name, f"tiny-{name}-garbled", tp=2)
        s = b.serve("b", b_prompt)
    finally:
        store.close()
    assert s.parked and s.start == 0, "the load failed; vLLM computed from the start"
    assert_bit_exact(b.model, s, 0)
    assert b.aggregated_stats().get("loads.failed_corrupt") == 1, "vLLM heard of the failure"
    assert_stats_add_up(b)
    finals_b, _ = b.close(), a.close()
    assert [stats["loads"]["failed_corrupt"] for stats in finals_b] == [0, 1]


def test_abort_with_loads_in_flight_on_every_rank_frees_blocks_only_after_they_settle(engines):
    a = engines("gpt-oss", "tiny-gpt-oss-abort", tp=2)
    prompt = scenarios.random_tokens(9, 200)
    a.serve("a", prompt, max_tokens=1)
    a.settle_saves()
    b = engines("gpt-oss", "tiny-gpt-oss-abort", tp=2, record=True)
    b.add("b", prompt)
    b.run(lambda: b.served["b"].parked, "the load to start")
    from vllm.v1.request import RequestStatus

    free_before = b.sched.kv_cache_manager.block_pool.get_num_free_blocks()
    b.sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert "b" in b.sched.requests, "vLLM holds the blocks while the loads may run"
    assert b.sched.kv_cache_manager.block_pool.get_num_free_blocks() == free_before
    b.run(b.idle, "the aborted request's blocks")
    for rank, events in enumerate(b.call_all("events")):
        assert any(e[0] == "request_finished" for e in events), f"rank {rank}: {events}"
    # The next request reuses the freed blocks and computes bit-exact: nothing from the
    # aborted loads landed in them afterwards, on any rank.
    s = b.serve("c", scenarios.random_tokens(10, 120))
    assert_bit_exact(b.model, s, 0)
    finals, _ = b.close(), a.close()
    assert [stats["loads"]["loads_started"] for stats in finals] == [1, 1]


def test_preemption_waits_for_every_ranks_saves_then_resumes_from_the_pool(engines):
    """Too few blocks for two long requests: vLLM preempts one; every rank waits for its
    saves before the blocks are reused, and the request later resumes by loading what the
    ranks had saved."""
    a = engines("llama", "tiny-llama-preempt", tp=2, num_blocks=30, budget=64, record=True)
    a.add("x", scenarios.random_tokens(11, 180), max_tokens=100)
    a.add("y", scenarios.random_tokens(12, 180), max_tokens=100)
    preempted: list[str] = []
    while a.sched.requests:
        so = a.step()
        preempted += list(so.preempted_req_ids or ())
        if not a.sched.has_unfinished_requests():
            time.sleep(vr.IDLE_SLEEP_S)
        assert a.steps < vs.STEP_LIMIT
    assert preempted, "the scenario must preempt"
    assert a.served[preempted[0]].parked, "the preempted request loaded its own saved prefix"
    ended = []
    for rank, events in enumerate(a.call_all("events")):
        ended.append(sorted(rid for name, rid, _ in events if name == "request_finished"))
        # A request the runtime kept (saves pending) was freed only after they settled.
        for _, rid, _ in [e for e in events if e[0] == "request_finished" and e[2]]:
            assert ("saves_settled", rid, None) in events, f"rank {rank}: request {rid}"
    # Each rank heard of every end: both requests, and each preemption's (a new id after it).
    assert all(rids == ended[0] for rids in ended) and len(ended[0]) == 2 + len(preempted), ended
    assert_clean(a.close())
