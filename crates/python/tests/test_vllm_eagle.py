"""`kv_connector.vllm` under vLLM's EAGLE speculative config (vLLM 0.33 on CPU): the KV
cache groups vLLM makes of an EAGLE head's layer, and what the connector makes of them.

vLLM gives the head's layer no KV cache group of its own. Its `FullAttentionSpec` equals
the target's (`is_draft` is not compared), so vLLM's planner (`get_global_kv_cache_groups`)
groups it with target full-attention layers, and, EAGLE's block drop being on
(`SpeculativeConfig.use_eagle_block_drop()`: draft KV at a position depends on the next
token), flags the group holding it `is_eagle_group`; the connector's layout gives that
whole group role "draft" (R6): every page of it carries draft rows.

- tiny Llama: one group of all four layers (the head's is layer 3), role "draft"; the
  connector starts, and a load through it resumes bit-exact.
- tiny GPT-OSS: the head's layer makes full layers outnumber sliding ones, so vLLM splits
  them: [1, 4] (the head's layer 4 among them, role "draft"), [3] (padded to two layers'
  memory) and [0, 2] (sliding). The connector maps one full-attention group onto vLLM's
  memory and refuses this at `register_kv_caches`, naming the two groups. (The split
  depends on the layer counts: 18 full + 1 head and 18 sliding layers, gpt-oss-120b's,
  make one full group of 19 and one sliding group.)

The engines run vLLM's real Scheduler with the speculative config (lookahead slots
included); the test's model runner computes the target only and proposes no drafts (the
head's slots are never written), so this checks the groups, the layout and a load through
them, not drafting, which test_real_model_drafter.py proves on the harness's own engine.
"""

import tempfile

import pytest
import torch

from api_support import import_vllm

vllm = import_vllm()

import vllm_support as vs  # noqa: E402
from kv_connector.vllm._layout import UnsupportedVllmSetup, layer_index, plan_layout  # noqa: E402
from models import scenarios, tiny  # noqa: E402


def engines(name: str, model, count: int) -> list:
    """`count` engines of `name` with the EAGLE head on one memory pool (one model dir: it
    names the model in the pool's keys)."""
    spec = tiny.SPECS[name]
    model_dir, eagle_dir = vs.write_model_dir(spec, tempfile.mkdtemp()), vs.write_eagle_dir(tempfile.mkdtemp())
    extra = {"shared_pool": f"eagle-{name}", "kvc": scenarios.config()}
    return [vs.VllmInstance(spec, model, model_dir, extra=extra, eagle_dir=eagle_dir) for _ in range(count)]


def eagle_groups(name: str):
    """vLLM's KV cache config of `name` with the EAGLE head, and its groups' layer indices."""
    spec = tiny.SPECS[name]
    config = vs.vllm_config(vs.write_model_dir(spec, tempfile.mkdtemp()), extra={},
                            eagle_dir=vs.write_eagle_dir(tempfile.mkdtemp()))
    assert config.speculative_config.use_eagle_block_drop()
    kv_config = vs.kv_cache_config(config, spec, 64)
    return kv_config, sorted(sorted(layer_index(n) for n in g.layer_names) for g in kv_config.kv_cache_groups)


def draft_layers(kv_config) -> list[list[int]]:
    return [g["layers"] for g in plan_layout(kv_config, "tiny").layout["groups"] if g["role"] == "draft"]


def test_llama_eagle_group_reaches_the_connector_as_draft_and_loads():
    kv_config, groups = eagle_groups("llama")
    assert groups == [[0, 1, 2, 3]] and draft_layers(kv_config) == [[0, 1, 2, 3]]
    model = tiny.build_model(tiny.SPECS["llama"])
    a, b = engines("llama", model, 2)
    try:
        prompt = scenarios.random_tokens(1, scenarios.FIRST_TURN_TOKENS)
        first = a.serve("turn1", prompt)
        a.conn.settle_saves()
        second = b.serve("turn2", prompt + first.generated[:16] + scenarios.random_tokens(101, 64))
        assert second.parked and second.start == 160
        chunks = vs.baseline_chunks(len(second.tokens), second.start, second.chunks, scenarios.CHUNK)
        rows, generated = vs.native_rows(model, second.tokens, chunks, scenarios.DECODE)
        assert torch.equal(second.logits, rows[second.start :]) and second.generated == generated
    finally:
        stats = [a.close(), b.close()]
    assert stats[1]["loads"]["loads_failed"] == 0 and stats[1]["loads"]["pages_loaded"] > 0


def test_gpt_oss_eagle_groups_are_refused_by_the_vllm_connector():
    kv_config, groups = eagle_groups("gpt-oss")
    assert groups == [[0, 2], [1, 4], [3]] and draft_layers(kv_config) == [[1, 4]]
    with pytest.raises(UnsupportedVllmSetup, match="2 full-attention KV cache groups"):
        engines("gpt-oss", tiny.build_model(tiny.SPECS["gpt-oss"]), 1)
