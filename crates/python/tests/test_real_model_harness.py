"""Self-tests of the real-model harness (tests/models), without the package: the paged
instance against transformers' own cache, and the whole harness against
`fake_connector`, a pure-Python stand-in with the package's load and save rules."""

import pytest
import torch

from models import fake_connector as fake
from models import scenarios
from models.engine import Instance, native_run
from models.tiny import SPECS, build_model, layout

MODELS = list(SPECS)
HYBRID = [name for name in MODELS if SPECS[name].sliding_window]


@pytest.mark.parametrize("name", MODELS)
def test_paged_instance_equals_native_cache(name):
    """Without a connector, computing from pages gives transformers' own results, bit for
    bit: the page writes, the cache built from pages (sliding layers included) and the
    chunking are exact."""
    spec = SPECS[name]
    model = build_model(spec, scenarios.device())
    inst = Instance(spec, model, layout(spec), chunk=scenarios.CHUNK)
    tokens = scenarios.random_tokens(7, 203)
    served = inst.serve(tokens, decode=scenarios.DECODE)
    logits, generated, _ = native_run(model, tokens, chunk=scenarios.CHUNK, decode=scenarios.DECODE)
    assert torch.equal(served.logits, logits)
    assert served.generated == generated


@pytest.mark.parametrize("name", MODELS)
def test_fake_conversation_and_shared_prefix(name):
    for scenario in (scenarios.conversation, scenarios.shared_prefix):
        pair = scenarios.make_pair(fake, SPECS[name])
        checked, live, final = scenarios.run_and_close(pair, scenario)
        for c in checked:
            scenarios.assert_matches(c)
        scenarios.assert_loads_and_saves(pair, live, final)


@pytest.mark.parametrize("name", HYBRID)
def test_fake_walk_back(name):
    pair = scenarios.make_pair(fake, SPECS[name])
    checked, live, _final = scenarios.run_and_close(pair, scenarios.walk_back)
    for c in checked:
        scenarios.assert_matches(c)
    assert [scenarios.stat(live[1], o) for o in ("full", "rewound", "recovered")] == [0, 1, 1]


@pytest.mark.parametrize("name", HYBRID)
def test_fake_window_short_is_caught(name):
    checked = scenarios.control_window_short(fake, SPECS[name])
    assert checked.served.filled and checked.served.offer == scenarios.SYSTEM_TOKENS
    assert checked.max_abs_diff() > scenarios.CONTROL_MIN_DIFF


@pytest.mark.parametrize("name", MODELS)
def test_fake_foreign_page_is_caught(name):
    checked = scenarios.control_foreign_page(fake, SPECS[name])
    assert checked.served.filled
    assert checked.max_abs_diff() > scenarios.CONTROL_MIN_DIFF


@pytest.mark.parametrize("name", MODELS)
def test_fake_corrupt_object_is_refused_and_recomputed(name):
    checked, corrupted, key, stats_b = scenarios.control_corrupt(fake, SPECS[name])
    assert corrupted == [key]
    assert scenarios.stat(stats_b, "failed_corrupt") == 1
    assert checked.served.filled is False and checked.served.start == 0
    assert checked.exact() and checked.served.generated == checked.baseline_generated
