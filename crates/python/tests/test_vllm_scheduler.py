"""`kv_connector.vllm.KvcConnector` under vLLM's real `Scheduler` on CPU, two engines of
one process sharing an embedded MemoryPool; KV from the tiny real models (vllm_support).

Bit-exact checks follow tests/models: resume points are multiples of 80 and each engine
runs one request at a time with a 40-token budget, so every instance chunks a shared
prefix the same way and the logits after a load equal a no-reuse baseline's bit for bit.
"""

import tempfile

import pytest
import torch

from api_support import import_vllm

vllm = import_vllm()

import kv_connector as kvc  # noqa: E402
import vllm_support as vs  # noqa: E402
from models import scenarios, tiny  # noqa: E402

DECODE = scenarios.DECODE


def make(spec_name: str, pool: str, **kw):
    spec = tiny.SPECS[spec_name]
    model = tiny.build_model(spec)
    model_dir = vs.write_model_dir(spec, tempfile.mkdtemp())
    extra = {"shared_pool": pool, "kvc": scenarios.config()}
    return spec, model, model_dir, extra


def assert_bit_exact(model, s: vs.Served, expected_start: int):
    assert s.start == expected_start, f"{s.req_id}: resumed at {s.start}, expected {expected_start}"
    chunks = vs.baseline_chunks(len(s.tokens), s.start, s.chunks, scenarios.CHUNK)
    rows, generated = vs.native_rows(model, s.tokens, chunks, DECODE)
    assert torch.equal(s.logits, rows[s.start :]), f"{s.req_id}: logits differ"
    assert s.generated == generated, f"{s.req_id}: greedy tokens differ"


@pytest.mark.parametrize("name", ["gpt-oss", "llama"])
def test_conversation_turns_load_park_and_resume_bit_exact(name):
    """A serves turns 1-2, B turns 3-4: each later turn's offer is the planner's resume
    point, the request waits in WAITING_FOR_REMOTE_KVS, and resumes bit-exact."""
    spec, model, model_dir, extra = make(name, f"conv-{name}")
    a = vs.VllmInstance(spec, model, model_dir, extra=extra)
    b = vs.VllmInstance(spec, model, model_dir, extra=extra)
    b.worker.stats_interval_s = 0.0  # every step, so the sum below is exact
    prompt = scenarios.random_tokens(1, scenarios.FIRST_TURN_TOKENS)
    expected = [0, 160, 240, 320]
    for turn, inst in enumerate((a, a, b, b)):
        s = inst.serve(f"turn{turn}", prompt)
        inst.conn.settle_saves()
        assert s.parked == (expected[turn] > 0)
        assert_bit_exact(model, s, expected[turn])
        prompt = prompt + s.generated[:DECODE] + scenarios.random_tokens(100 + turn, scenarios.USER_TOKENS)
    stats_a, stats_b = a.close(), b.close()
    assert stats_a["lookups"]["tokens_offered"] == 160 and stats_b["lookups"]["tokens_offered"] == 560
    for stats in (stats_a, stats_b):
        assert stats["loads"]["loads_failed"] == 0 and stats["saves"]["saves_failed"] == 0
        assert stats["saves"]["published_past_chunk_end"] == 0
    # The stats hook carried the runtime's counters to vLLM.
    offered = sum(s.data.get("lookups.tokens_offered", 0) for s in b.stats)
    assert offered == 560


def test_shared_prefix_concurrent_loads_and_local_hits():
    """Three requests sharing a system prefix arrive at B together: each is offered the
    prefix, parks while its load runs and resumes with A's bytes in its blocks. A fourth
    finds the prefix in vLLM's own prefix cache: the planner offers nothing beyond it."""
    spec, model, model_dir, extra = make("gpt-oss", "shared")
    a = vs.VllmInstance(spec, model, model_dir, extra=extra)
    b = vs.VllmInstance(spec, model, model_dir, extra=extra, prefix_caching=True, budget=64)
    system = scenarios.random_tokens(2, scenarios.SYSTEM_TOKENS)
    a_served = a.serve("a", system + scenarios.random_tokens(200, 37))
    a.conn.settle_saves()
    prompts = [system + scenarios.random_tokens(300 + i, 50) for i in range(3)]
    served = [b.add(f"b{i}", p) for i, p in enumerate(prompts)]
    loaded = {}

    def on_forward(req_id, before, after):
        if before == scenarios.SYSTEM_TOKENS and req_id not in loaded:
            tables = b.sched.kv_cache_manager.get_block_ids(req_id)
            loaded[req_id] = [b.views[vs.layer_name(1)][tables[0][i]].clone() for i in range(10)]

    b.run(b.idle, "three requests", on_forward)
    assert all(s.parked and s.start == scenarios.SYSTEM_TOKENS for s in served)
    assert sorted(loaded) == ["b0", "b1", "b2"]
    # A's request is gone, but the pool's bytes came from its forward: recompute A's
    # prefix into fresh caches and compare layer 1's blocks with what B loaded.
    _, _, snapshot = scenarios.native_run(model, a_served.tokens, chunk=scenarios.CHUNK, decode=0,
                                          snapshot_at=scenarios.SYSTEM_TOKENS)
    keys, values = snapshot[1]
    for req_id, blocks in loaded.items():
        for i, block in enumerate(blocks):
            want = torch.cat([keys[0, :, i * 16 : (i + 1) * 16], values[0, :, i * 16 : (i + 1) * 16]], dim=-1)
            assert torch.equal(block, want), f"{req_id} block {i}"
    asked = []
    matched = b.sched.connector.get_num_new_matched_tokens
    b.sched.connector.get_num_new_matched_tokens = lambda r, n: asked.append((n, matched(r, n))) or asked[-1][1]
    fourth = b.serve("b3", system + scenarios.random_tokens(400, 45))
    local, (extra, _) = asked[-1]
    # vLLM's local hit (the hybrid manager needs the window blocks cached too) plus the
    # planner's offer beyond it is the system prefix.
    assert local + extra == scenarios.SYSTEM_TOKENS and fourth.start == scenarios.SYSTEM_TOKENS
    assert fourth.parked == (extra > 0)
    stats = b.close()
    a.close()
    assert stats["loads"]["loads_done"] == 3 + (extra > 0)
    assert stats["lookups"]["tokens_offered"] == 3 * 160 + extra


def test_finished_requests_keep_their_blocks_until_saves_settle():
    spec, model, model_dir, extra = make("gpt-oss", "settle")
    a = vs.VllmInstance(spec, model, model_dir, extra=extra)
    rec = vs.Recorder(a.conn)
    a.worker._worker.conn = rec
    s = a.add("r", scenarios.random_tokens(5, 170))
    finished_at = None
    while "r" in a.sched.requests:
        a.step()
        request = a.sched.requests.get("r")
        if finished_at is None and request is not None and request.is_finished():
            finished_at = a.steps
    assert finished_at is not None, "vLLM held the finished request's blocks for the connector"
    # The runtime heard of the end only after vLLM finished the request, and vLLM freed
    # the blocks only after the runtime said its saves were settled: at once (False) or
    # through finished_saves.
    (_, rid, keep), *rest = [e for e in rec.events if e[0] == "request_finished"]
    assert not rest
    if keep:
        assert ("saves_settled", rid, None) in rec.events
    assert len(s.generated) == DECODE + 1
    a.close()


@pytest.mark.skipif("faults" not in kvc.FEATURES, reason="needs a wheel built with the faults feature")
@pytest.mark.parametrize("name", ["gpt-oss", "llama"])
def test_a_corrupt_object_fails_the_load_and_vllm_recomputes(name):
    """Hybrid layouts report the request in failed_recving, one-group layouts its blocks
    through get_block_ids_with_load_errors; either way vLLM computes the prefix itself
    and the result is bit-exact."""
    spec, model, model_dir, extra = make(name, f"corrupt-{name}")
    a = vs.VllmInstance(spec, model, model_dir, extra=extra)
    b = vs.VllmInstance(spec, model, model_dir, extra=extra)
    a_prompt, b_prompt = scenarios.system_prompts()
    a.serve("a", a_prompt, max_tokens=1)
    a.conn.settle_saves()
    key = a.conn.keys(a_prompt)[2][0]
    from kv_connector.vllm import _engine

    assert _engine.shared_pool(f"corrupt-{name}", 0).corrupt(key, 1) == [key]
    errors = []
    original = b.worker.get_block_ids_with_load_errors
    b.worker.get_block_ids_with_load_errors = lambda: errors.append(original()) or errors[-1]
    s = b.serve("b", b_prompt)
    assert s.parked and s.start == 0, "the load failed; vLLM computed from the start"
    assert_bit_exact(model, s, 0)
    stats = b.close()
    a.close()
    assert stats["loads"]["failed_corrupt"] == 1
    reported = set().union(*errors)
    assert bool(reported) == (len(spec.window_layers()) == 0)


def test_abort_with_a_load_in_flight_frees_blocks_only_after_the_load_settles():
    spec, model, model_dir, extra = make("gpt-oss", "abort")
    a = vs.VllmInstance(spec, model, model_dir, extra=extra)
    b = vs.VllmInstance(spec, model, model_dir, extra=extra)
    prompt = scenarios.random_tokens(9, 200)
    a.serve("a", prompt, max_tokens=1)
    a.conn.settle_saves()
    rec = vs.Recorder(b.conn)
    b.worker._worker.conn = rec
    b.add("b", prompt)
    b.run(lambda: b.served["b"].parked, "the load to start")
    from vllm.v1.request import RequestStatus

    free_before = b.sched.kv_cache_manager.block_pool.get_num_free_blocks()
    b.sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert "b" in b.sched.requests, "vLLM holds the blocks while the load may run"
    assert b.sched.kv_cache_manager.block_pool.get_num_free_blocks() == free_before
    b.run(b.idle, "the aborted request's blocks")
    assert any(e[0] == "request_finished" for e in rec.events)
    # The next request reuses the freed blocks and computes bit-exact: nothing from the
    # aborted load landed in them afterwards.
    s = b.serve("c", scenarios.random_tokens(10, 120))
    assert_bit_exact(model, s, 0)
    stats = b.close()
    a.close()
    assert stats["loads"]["loads_started"] == 1


def test_preemption_waits_for_saves_then_resumes_from_the_pool():
    """Too few blocks for two long requests: vLLM preempts one; the worker waits for its
    saves before the blocks are reused, and the request later resumes by loading what it
    had saved."""
    spec, model, model_dir, extra = make("llama", "preempt")
    a = vs.VllmInstance(spec, model, model_dir, extra=extra, num_blocks=30, budget=64)
    rec = vs.Recorder(a.conn)
    a.worker._worker.conn = rec
    a.add("x", scenarios.random_tokens(11, 180), max_tokens=100)
    a.add("y", scenarios.random_tokens(12, 180), max_tokens=100)
    preempted = []
    while a.sched.requests:
        so = a.step()
        preempted += list(so.preempted_req_ids or ())
        assert a.steps < vs.STEP_LIMIT
    assert preempted, "the scenario must preempt"
    victim = a.served[preempted[0]]
    assert victim.parked, "the preempted request loaded its own saved prefix"
    kept = [e for e in rec.events if e[0] == "request_finished" and e[2]]
    for _, rid, _ in kept:
        assert ("saves_settled", rid, None) in rec.events
    stats = a.close()
    assert stats["saves"]["saves_failed"] == 0 and stats["loads"]["loads_failed"] == 0
    assert stats["saves"]["published_past_chunk_end"] == 0


def test_cache_salt_and_lora_adapter_scope_the_keys():
    """R34 under vLLM's scheduler: a request's `cache_salt` and LoRA adapter (by name and
    path) seed its chain. B is offered A's prefix only for the same scope, and then resumes
    bit-exact; another salt, another adapter's path or no scope at all finds nothing."""
    from vllm.lora.request import LoRARequest

    spec, model, model_dir, extra = make("llama", "scopes")
    a = vs.VllmInstance(spec, model, model_dir, extra=extra)
    b = vs.VllmInstance(spec, model, model_dir, extra=extra)
    prompt = scenarios.random_tokens(7, scenarios.FIRST_TURN_TOKENS)
    adapter = LoRARequest("tenant-lora", 1, "/adapters/tenant-lora")
    # Same name, other weights, and vLLM's number for it differs on the other engine.
    same_name = LoRARequest("tenant-lora", 1, "/adapters/other")
    renumbered = LoRARequest("tenant-lora", 7, "/adapters/tenant-lora")
    for n, scope in enumerate(({"cache_salt": "tenant-a"}, {"lora_request": adapter})):
        a.serve(f"a{n}", prompt, **scope)
        a.conn.settle_saves()
    misses = [
        {"cache_salt": "tenant-b"},
        {"lora_request": same_name},
        {"cache_salt": "tenant-a", "lora_request": adapter},
        {},
    ]
    for n, scope in enumerate(misses):
        s = b.serve(f"miss{n}", prompt, **scope)
        assert s.start == 0 and not s.parked, f"{scope}: resumed at {s.start}"
        b.conn.settle_saves()
    for n, scope in enumerate(({"cache_salt": "tenant-a"}, {"lora_request": renumbered})):
        c = vs.VllmInstance(spec, model, model_dir, extra=extra)  # no local prefix cache hit
        s = c.serve(f"hit{n}", prompt, **scope)
        assert s.parked, scope
        assert_bit_exact(model, s, 160)
        c.close()
    a.close(), b.close()


def test_a_last_chunk_of_the_whole_budget_bounces_only_the_saved_window():
    """A prompt computed in one chunk of `max_num_batched_tokens` (16 blocks) with 8 bounce
    pages: the worker copies aside only the window blocks the runtime saves (R17: the tail
    `W + R` back), so the save succeeds and the next turn resumes at its full hit."""
    spec, model, model_dir, extra = make("gpt-oss", "long-chunk")
    extra = {**extra, "bounce_pages": 8}
    a = vs.VllmInstance(spec, model, model_dir, extra=extra, budget=256)
    b = vs.VllmInstance(spec, model, model_dir, extra=extra, budget=256)
    prompt = scenarios.random_tokens(11, 250)
    a.serve("first", prompt)
    a.conn.settle_saves()
    assert a.worker._worker.bounce_exhausted == 0
    s = b.serve("next", prompt + scenarios.random_tokens(12, 30))
    assert s.parked and s.start == 240, f"resumed at {s.start}"
    stats_a, stats_b = a.close(), b.close()
    assert stats_a["saves"]["saves_failed"] == 0 and stats_a["saves"]["saves_dropped"] == 0
    assert stats_b["lookups"]["full"] == 1 and stats_b["lookups"]["window_miss"] == 0


def test_window_blocks_of_earlier_steps_are_bounced_only_as_the_scheduler_read_them():
    """A window group drops blocks in place (vLLM's null block) and hands them to other
    requests, so the worker's kept table may name a block vLLM reused. The worker bounces
    a block the step added (or any block of a new request's whole table) from the step's
    table, and a block of an earlier step only by the id the scheduler read this step."""
    from kv_connector.vllm._engine import ChunkPlan, step_blocks_start

    spec, model, model_dir, extra = make("gpt-oss", "kept-table")
    a = vs.VllmInstance(spec, model, model_dir, extra=extra)
    worker = a.worker._worker
    gi = next(i for i in range(len(worker.plan.groups)) if worker.pages.bounced(i))
    g = worker.plan.groups[gi].vllm_index
    bounced: list[int] = []
    worker.pages.to_bounce = lambda _group, block, _page: bounced.append(block)

    def step_table(ids):
        return tuple(ids if i == g else [] for i in range(worker.plan.num_vllm_groups))

    kept = [10, 11, 12, 13, 14, 15]  # blocks 0-3 from earlier steps, 4-5 added now
    # The scheduler read block 2 as dropped (vLLM's null block) and 3 as still held.
    ids = {2: 0, 3: 13}
    later = ChunkPlan("r", 1, 96, 64, 96, step_table([14, 15]), False, ())
    worker._bounce_window(gi, later, ids, [2, 3, 4, 5], kept, step_blocks_start(later.table, False, g, len(kept)))
    assert bounced == [13, 14, 15], "a block of an earlier step bounced by the kept table's id"
    bounced.clear()
    new = ChunkPlan("r2", 2, 96, 0, 96, step_table(kept), True, ())
    worker._bounce_window(gi, new, {}, [2, 3, 4, 5], kept, step_blocks_start(new.table, True, g, len(kept)))
    assert bounced == [12, 13, 14, 15], "a new request's window blocks are its step table's"
    a.close()


def test_default_bounce_pages_hold_two_long_prompts_windows():
    """Sized from the model: two prompts of max_model_len tokens, each with its checkpoint
    windows (R28) and its tail (R17) bounced at once."""
    from kv_connector.vllm._layout import GroupPlan, LayoutPlan
    from kv_connector.vllm._pages import bounce_pages_needed

    window = GroupPlan(1, "window", 128, ("l0",), 1)
    plan = LayoutPlan(groups=(GroupPlan(0, "full", None, ("l1",), 1), window), tokens_per_block=16,
                      layout={}, num_vllm_groups=2)
    runtime = {"planner": {"swa_endpoint_rewind_tokens": 2048}, "saver": {"window_checkpoint_tokens": 8192}}
    # Tail: ceil((128 + 2048) / 16) + 1 = 137; 16 checkpoints of ceil(128 / 16) + 1 = 9.
    assert bounce_pages_needed(plan, 131072, runtime) == 2 * (137 + 16 * 9)
    # A short model still gets the floor.
    assert bounce_pages_needed(plan, 1024, {**runtime, "planner": {"swa_endpoint_rewind_tokens": 0}}) == 256


def test_a_shared_document_resumes_at_a_window_checkpoint_bit_exact():
    """R28 under vLLM: A's prompt is a 400-token document and a question longer than the
    rewind and window, so A's prompt-end window (R17) lies past the document; the worker
    bounces the window of each checkpoint (every 80 tokens) the chunks pass. B's prompt
    shares only the document: it is offered the checkpoint at 400, parks while the load
    runs and resumes bit-exact."""
    spec, model, model_dir, extra = make("gpt-oss", "checkpoints")
    config = scenarios.config()
    config["saver"] = {**config.get("saver", {}), "window_checkpoint_tokens": 80}
    extra = {**extra, "kvc": config}
    a = vs.VllmInstance(spec, model, model_dir, extra=extra)
    b = vs.VllmInstance(spec, model, model_dir, extra=extra)
    document = scenarios.random_tokens(21, 400)
    a.serve("a", document + scenarios.random_tokens(22, 120))
    a.conn.settle_saves()
    s = b.serve("b", document + scenarios.random_tokens(23, 45))
    assert s.parked
    assert_bit_exact(model, s, 400)
    assert a.worker._worker.bounce_exhausted == 0
    stats_a, stats_b = a.close(), b.close()
    assert stats_a["saves"]["checkpoint_pages_planned"] > 0
    # The walk's own end (R12) finds the checkpoint's window: outcome `full`, not
    # `window_miss` as when checkpoint windows were not bounced.
    assert stats_b["lookups"]["full"] == 1 and stats_b["lookups"]["window_miss"] == 0
