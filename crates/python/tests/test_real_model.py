"""The connector on the KV of real model implementations (transformers' GPT-OSS, Gemma 3
and Llama, tiny and seeded; tests/models describes the harness).

Two serving instances with their own connectors and page tensors share one memory pool.
A computes and saves, B looks up, reserves, loads, builds the model's cache from exactly
the loaded pages and computes the rest of the prompt and 16 greedy tokens. Pass: the
offer is the expected resume point, the connector filled exactly the pages R15 names, and
B's cache, logits (every computed position) and tokens equal a no-reuse baseline's (the
model with transformers' own cache, same chunk boundaries) bit for bit. The negative
controls show the comparison catches a short window, a wrong page and a corrupt object.

`KV_CONNECTOR_TEST_DEVICE=cuda` runs the models and page tensors on the GPU.
"""

import pytest

import kv_connector as kvc
from models import scenarios
from models.tiny import SPECS

MODELS = list(SPECS)
HYBRID = [name for name in MODELS if SPECS[name].sliding_window]


@pytest.mark.parametrize("name", MODELS)
def test_conversation_turns_resume_bit_exact(name):
    """A serves turns 1-2 (turn 2 loads turn 1), B serves turns 3-4 from the pool."""
    pair = scenarios.make_pair(kvc, SPECS[name])
    checked, live, final = scenarios.run_and_close(pair, scenarios.conversation)
    for c in checked:
        scenarios.assert_matches(c)
    assert [c.served.offer for c in checked] == [0, 160, 240, 320]
    scenarios.assert_loads_and_saves(pair, live, final)


@pytest.mark.parametrize("name", MODELS)
def test_shared_system_prefix_resumes_bit_exact(name):
    """A serves three prompts after one system prefix, B a fourth: each later prompt
    loads the prefix."""
    pair = scenarios.make_pair(kvc, SPECS[name])
    checked, live, final = scenarios.run_and_close(pair, scenarios.shared_prefix)
    for c in checked:
        scenarios.assert_matches(c)
    scenarios.assert_loads_and_saves(pair, live, final)


@pytest.mark.parametrize("name", HYBRID)
def test_window_walk_back_resumes_bit_exact(name):
    """B resumes at an earlier prompt end whose window is in the pool: once past R
    (`recovered`, R13), once within it (`rewound`, R12)."""
    pair = scenarios.make_pair(kvc, SPECS[name])
    checked, live, final = scenarios.run_and_close(pair, scenarios.walk_back)
    for c in checked:
        scenarios.assert_matches(c)
    scenarios.assert_loads_and_saves(pair, live, final)
    assert [scenarios.stat(live[1], o) for o in ("full", "rewound", "recovered")] == [0, 1, 1]


@pytest.mark.parametrize("name", HYBRID)
def test_window_tail_one_block_short_is_caught(name):
    c = scenarios.control_window_short(kvc, SPECS[name])
    assert c.served.filled and c.served.offer == scenarios.SYSTEM_TOKENS
    assert c.max_abs_diff() > scenarios.CONTROL_MIN_DIFF


@pytest.mark.parametrize("name", MODELS)
def test_page_of_another_prompt_is_caught(name):
    c = scenarios.control_foreign_page(kvc, SPECS[name])
    assert c.served.filled and c.served.offer == scenarios.SYSTEM_TOKENS
    assert c.max_abs_diff() > scenarios.CONTROL_MIN_DIFF


@pytest.mark.parametrize("name", MODELS)
def test_corrupt_object_is_refused_and_recomputed(name):
    """The connector refuses the load (R5, R25); B computes the prefix itself and then
    matches the baseline bit for bit."""
    c, corrupted, key, stats_b = scenarios.control_corrupt(kvc, SPECS[name])
    assert corrupted == [key]
    assert scenarios.stat(stats_b, "failed_corrupt") == 1
    assert c.served.offer == scenarios.SYSTEM_TOKENS
    assert c.served.filled is False and c.served.start == 0
    assert c.exact(), f"max abs diff {c.max_abs_diff():.3e}"
    assert c.served.generated == c.baseline_generated
