"""Two connectors on one embedded MemoryPool: A computes and saves a prompt, B looks it up,
loads the pages into its own tensors in place, and they hold exactly A's bytes (R5, R24);
a corrupted object is refused (filled=False, R25); the hooks accept lists, numpy arrays
and torch tensors; the statistics close (A1, A2); shutdown is idempotent."""

import numpy as np
import pytest
import torch

import kv_connector as kvc
from api_support import LAYOUT, SMALL_STAGING, T, caches, layout, prompt, serve, wait_until

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def pair(pool, full_only=False, device="cpu"):
    groups = 1 if full_only else 2
    lay = layout(full_only)
    kv_a, kv_b = caches(groups, device=device), caches(groups, device=device)
    a = kvc.Connector(layout=lay, kv_caches=kv_a, pool=pool, config=SMALL_STAGING, model_key="m")
    b = kvc.Connector(layout=lay, kv_caches=kv_b, pool=pool, config=SMALL_STAGING, model_key="m")
    return a, kv_a, b, kv_b


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_save_then_load_fills_the_other_connectors_tensors_byte_identical(device):
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, kv_a, b, kv_b = pair(pool, full_only=True, device=device)
    with a, b:
        tokens = prompt(10 * T + 5)
        first = serve(a, kv_a, 1, tokens, pages=list(range(11)))
        assert (first.offer, first.filled) == (0, None)
        a.settle_saves()
        # B's pages for the same prompt are elsewhere in its cache.
        second = serve(b, kv_b, 2, tokens, pages=list(range(20, 31)))
        assert second.offer == 10 * T, "every full block but none holding the last token"
        assert second.filled and second.is_async
        for block in range(10):
            assert torch.equal(kv_b[0][20 + block], kv_a[0][block]), block
        assert torch.count_nonzero(kv_b[0][:20]) == 0, "nothing outside the reservation was written"
        stats_b = b.stats()
        assert stats_b["loads"]["pages_loaded"] == 10
        assert stats_b["lookups"]["full"] == 1 and stats_b["lookups"]["tokens_offered"] == 10 * T
    assert pool.counters()["objects"] == 10, "A's ten full blocks; B saved none again (R19)"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_a_hybrid_layout_loads_the_window_and_the_full_prefix(device):
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, kv_a, b, kv_b = pair(pool, device=device)
    with a, b:
        tokens = prompt(8 * T + 3)
        serve(a, kv_a, 1, tokens, pages=list(range(9)))
        a.settle_saves()
        second = serve(b, kv_b, 2, tokens, pages=list(range(32, 41)))
        assert second.offer == 8 * T and second.filled
        for block in range(8):
            assert torch.equal(kv_b[0][32 + block], kv_a[0][block])
        # The window group (W = 32 tokens) gets only the blocks of the window of e (R15).
        window = [torch.equal(kv_b[1][32 + block], kv_a[1][block]) for block in range(8)]
        assert window == [False] * 6 + [True] * 2


@pytest.mark.skipif("faults" not in kvc.FEATURES, reason="needs a wheel built with the faults feature")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_a_corrupted_object_is_refused_and_the_prefix_recomputed(device):
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, kv_a, b, kv_b = pair(pool, full_only=True, device=device)
    with a, b:
        tokens = prompt(6 * T + 1)
        serve(a, kv_a, 1, tokens, pages=list(range(7)))
        a.settle_saves()
        victim = a.keys(tokens)[3][0]
        assert pool.corrupt(victim, 1) == [victim]
        second = serve(b, kv_b, 2, tokens, pages=list(range(40, 47)))
        assert second.offer == 6 * T and second.filled is False
        stats = b.stats()["loads"]
        assert (stats["loads_failed"], stats["failed_corrupt"], stats["loads_done"]) == (1, 1, 0)
        # serve() recomputed the prefix after the failed load: B's pages are its own KV.
        for block in range(6):
            assert torch.equal(kv_b[0][40 + block], kv_a[0][block])
    assert pool.corrupt("no-such-key", 1) == []


def test_tokens_may_be_lists_numpy_arrays_or_tensors():
    pool = kvc.MemoryPool(capacity_bytes=16 << 20)
    with kvc.Connector(layout=layout(), kv_caches=caches(), pool=pool, config=SMALL_STAGING) as conn:
        tokens = prompt(3 * T)
        as_list = conn.keys(tokens)
        assert conn.keys(np.array(tokens, dtype=np.int64)) == as_list
        assert conn.keys(np.array(tokens, dtype=np.int32)) == as_list
        assert conn.keys(torch.tensor(tokens)) == as_list
        assert conn.keys(torch.tensor(tokens, dtype=torch.int32)) == as_list
        assert conn.keys(tuple(tokens)) == as_list
        with pytest.raises(ValueError, match="one-dimensional"):
            conn.keys(torch.tensor([tokens]))
        with pytest.raises(TypeError):
            conn.keys([1.5, 2.5])
        with pytest.raises(TypeError):
            conn.keys("tokens")
        conn.lookup(1, torch.tensor(tokens), local_match_tokens=0)
        assert wait_until(lambda: conn.reserve(1, 0, 1), conn, "a lookup of tensor tokens") == (0, False)


def test_hook_misuse_is_refused_and_shutdown_is_idempotent():
    pool = kvc.MemoryPool(capacity_bytes=16 << 20)
    conn = kvc.Connector(layout=layout(), kv_caches=caches(), pool=pool, config=SMALL_STAGING)
    with pytest.raises(ValueError, match="2 groups"):
        conn.on_step([kvc.StepRequest(1, 32, 0, 16, page_tables=[[0, 1]])])
    with pytest.raises(ValueError, match="timeout_s"):
        conn.wait_for_progress(-1.0)
    assert conn.reserve(99, 0, 99) == (0, False), "an unknown request is offered nothing"
    assert conn.finished_loads() == [] and conn.finished_saves() == []
    assert not conn.closed
    final = conn.shutdown()
    assert conn.closed
    assert conn.shutdown() == final
    assert conn.stats() == final
    assert set(final) == {"lookups", "loads", "saves", "pool"}
    assert all(isinstance(counters, dict) for counters in final.values())
    assert final["pool"]["state"] == "healthy", "an embedded pool never has an outage"
    # The dict is the runtime's declarations, every counter under its section and name.
    for counter in kvc.COUNTERS:
        value = final[counter["section"]][counter["name"]]
        assert isinstance(value, int) and value >= 0, counter
    declared = {(c["section"], c["name"]) for c in kvc.COUNTERS}
    plain = {(s, k) for s, counters in final.items() for k in counters if not k.endswith("_us")}
    assert plain - declared == {("pool", "state")}, "every counter in the dict is declared"
    # Hooks after shutdown answer nothing and do not raise.
    conn.lookup(5, prompt(40))
    assert conn.reserve(5, 0, 5) in (None, (0, False))
    conn.on_step([])
    assert conn.keys(prompt(16))  # keys still work: they need no pool


def test_statistics_close_after_many_requests():
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    a, kv_a, b, kv_b = pair(pool)
    with a, b:
        for rid in range(1, 6):
            tokens = prompt(4 * T + rid, start=100 * (rid % 2))
            serve(a if rid % 2 else b, kv_a if rid % 2 else kv_b, rid, tokens, pages=list(range(5 * rid, 5 * rid + 5)))
        a.settle_saves()
        b.settle_saves()
    for conn in (a, b):
        final = conn.shutdown()
        saves, loads = final["saves"], final["loads"]
        assert saves["saves_enqueued"] == saves["saves_done"] + saves["saves_skipped_present"] + saves["saves_dropped"] + saves["saves_failed"]
        assert loads["loads_started"] == loads["loads_done"] + loads["loads_failed"] + loads["stale_completions"]
        assert final["saves"]["published_past_chunk_end"] == 0
    assert a.stats()["loads"]["loads_done"] + b.stats()["loads"]["loads_done"] == 3


def test_the_window_save_schedule_lists_what_every_chunk_saves():
    """R17/R28 point by point: each checkpoint and the prompt end, and for any chunk the
    blocks window_save_blocks gives lie in the union of the points it passes, which adds
    only sink blocks the chunk has not computed."""
    sinks = {**LAYOUT["groups"][1], "window_tokens": 40, "sink_tokens": 20}  # sinks: blocks 0-1
    lay = kvc.Layout.from_dict({**LAYOUT, "groups": [LAYOUT["groups"][0], sinks]})
    config = {**SMALL_STAGING, "saver": {**SMALL_STAGING["saver"], "window_checkpoint_tokens": 2 * T}}
    pool = kvc.MemoryPool(capacity_bytes=64 << 20)
    with kvc.Connector(layout=lay, kv_caches=caches(2), pool=pool, config=config, model_key="m") as conn:
        length = 10 * T + 5
        assert conn.window_save_schedule(1, length) == [], "an unknown request saves nothing"
        conn.lookup(1, prompt(length))
        wait_until(lambda: conn.reserve(1, 0, 1), conn, "the lookup")
        schedule = conn.window_save_schedule(1, length)
        assert [point for point, _ in schedule] == [32, 64, 96, 128, 160, length]
        assert all(blocks[0] == [] for _, blocks in schedule), "a full group saves no window"
        assert schedule[1][1][1] == [0, 1, 2, 3], "checkpoint 64: window [24, 64) and the sinks"
        for before in range(0, length, 7):
            for after in range(before + 1, length + 4, 5):
                saved = set(conn.window_save_blocks(1, length, before, after)[1])
                listed = {b for point, blocks in schedule if before < point <= after for b in blocks[1]}
                assert saved <= listed, (before, after)
                assert listed - saved <= {0, 1}, (before, after)
                if not listed:
                    assert not saved
        conn.request_finished(1)
