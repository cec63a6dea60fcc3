"""`kv_connector.vllm` under vLLM's EAGLE speculative config (vLLM 0.33 on CPU): the KV
cache groups vLLM makes of an EAGLE head's layer, and the connector's layout of them.

vLLM gives the head's layer no KV cache group of its own. Its `FullAttentionSpec` equals
the target's (`is_draft` is not compared), so vLLM's planner (`get_global_kv_cache_groups`)
groups it with target full-attention layers: tiny Llama, one group of all four layers;
tiny GPT-OSS, [1, 4] (full, the head's layer 4 among them), [3] (full, padded to two
layers' memory) and [0, 2] (sliding).
EAGLE's block drop being on (`SpeculativeConfig.use_eagle_block_drop()`: draft KV at a
position depends on the next token), vLLM flags the group holding the head's layer
`is_eagle_group`, and the connector gives that whole group role "draft" (R6): every page
of it carries draft rows. The engines here run vLLM's real Scheduler with the speculative
config (lookahead slots included); the test's model runner computes the target only and
proposes no drafts (the head's slots are never written), so this checks the groups, the
layout and a load through them, not drafting, which test_real_model_drafter.py proves on
the harness's own engine.
"""

import tempfile

import pytest
import torch

from api_support import import_vllm

vllm = import_vllm()

import vllm_support as vs  # noqa: E402
from kv_connector.vllm._layout import layer_index, plan_layout  # noqa: E402
from models import scenarios, tiny  # noqa: E402

# The groups vLLM makes (layer indices; the head's layer is the target's layer count).
EAGLE_GROUPS = {"llama": [[0, 1, 2, 3]], "gpt-oss": [[0, 2], [1, 4], [3]]}
DRAFT_GROUP = {"llama": [0, 1, 2, 3], "gpt-oss": [1, 4]}


def engines(name: str):
    spec = tiny.SPECS[name]
    model = tiny.build_model(spec)
    model_dir = vs.write_model_dir(spec, tempfile.mkdtemp())
    eagle_dir = vs.write_eagle_dir(tempfile.mkdtemp())
    extra = {"shared_pool": f"eagle-{name}", "kvc": scenarios.config()}
    a, b = (vs.VllmInstance(spec, model, model_dir, extra=extra, eagle_dir=eagle_dir) for _ in range(2))
    return model, a, b


@pytest.mark.parametrize("name", ["gpt-oss", "llama"])
def test_eagle_groups_reach_the_connector_as_draft_and_load(name):
    model, a, b = engines(name)
    try:
        assert a.config.speculative_config.use_eagle_block_drop()
        groups = a.kv_config.kv_cache_groups
        assert sorted(sorted(layer_index(n) for n in g.layer_names) for g in groups) == EAGLE_GROUPS[name]
        layout = plan_layout(a.kv_config, "tiny").layout
        roles = {tuple(g["layers"]): g.get("role") for g in layout["groups"]}
        assert {k: v for k, v in roles.items() if v == "draft"} == {tuple(DRAFT_GROUP[name]): "draft"}
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
