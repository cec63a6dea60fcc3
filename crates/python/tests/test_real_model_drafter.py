"""A real drafter's KV through the pool: a request served from the pool drafts exactly as
a locally reused one (R16, R18; docs/HYBRID.md, "Drafters").

Instances A and B run the tiny GPT-OSS (hybrid) and Llama models with an EAGLE-style
draft head (`models.drafter`): its KV is the layout's draft group, saved with the
prompt's blocks and loaded with them. Pass: every step B serves from A's pool objects (and
from its own) records what a reference instance records reusing the same prefix from its
own pages, and what computing the prompt from token 0 records from the resume point on:
target logits and draft logits bit for bit, the same drafts, the same accepted counts
(`draft_scenarios`). Negative controls: draft pages zeroed after the load, or one draft
element nudged, change the draft logits (and never the target's first step). A draft
row depends on the token after it (`drafter::D1`): a prompt diverging from A's at a
block boundary must not load A's last draft row there (the next-token keying, R37), and
resumes a block earlier. The harness self-tests run the same proof against
`fake_connector`, without the package, and show the next-token test failing where draft
pages are named by the chain alone.
"""

import pytest
import torch
from transformers import DynamicCache

from models import draft_scenarios as ds
from models import fake_connector as fake
from models import scenarios
from models.engine import chunk_bounds, forward
from models.tiny import SPECS, build_model

try:
    import kv_connector as kvc
except ImportError:  # the harness self-tests run without the package
    kvc = None

needs_package = pytest.mark.skipif(kvc is None, reason="kv_connector is not installed")
MODELS = ["gpt-oss", "llama"]


def run(api, name: str, scenario: scenarios.Scenario, *, chunk: int = scenarios.CHUNK):
    """Both parts of `scenario` on a drafting pair; (pair, head, steps, live stats, final stats)."""
    pair, head = ds.make_pair(api, SPECS[name], chunk=chunk)
    steps, live, final = scenarios.run_parts(pair, scenario)
    return pair, head, steps, live, final


# -- the harness, without the package ----------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_draft_cache_from_pages_equals_native_cache(name):
    """A prompt's prefill on a drafting instance (no connector) against the target and the
    head each carrying transformers' own cache over the same chunks: the target's and the
    head's logits are bit-identical, so the draft group's pages hold the head's KV."""
    spec = SPECS[name]
    model = build_model(spec, scenarios.device())
    head = ds.make_head(spec, model)
    tokens = scenarios.random_tokens(7, 203)
    trace = ds.make_instance(None, spec, model, head).serve(tokens, decode=0).trace
    target, draft = DynamicCache(config=model.config), DynamicCache(config=head.config)
    with torch.no_grad():
        for step, (lo, hi) in zip(trace, chunk_bounds(0, len(tokens), scenarios.CHUNK)):
            logits, hidden = forward(model, tokens[lo:hi], lo, target, scenarios.device(), hidden=True)
            following = tokens[lo + 1 : hi + 1] + ([int(logits[-1].argmax())] if hi == len(tokens) else [])
            draft_logits, _ = head(hidden, following, lo, draft)
            assert torch.equal(step.logits, logits) and torch.equal(step.draft_logits[: hi - lo], draft_logits)


@pytest.mark.parametrize("name", ["gpt-oss"])
def test_fake_drafted_conversation(name):
    pair, head, steps, live, final = run(fake, name, ds.conversation)
    ds.assert_conversation(pair.spec, pair.model, head, steps)
    scenarios.assert_loads_and_saves(pair, live, final)


@pytest.mark.parametrize("name", MODELS)
def test_fake_zeroed_draft_pages_are_caught(name):
    """The control's comparison fails when it must, on the harness alone."""
    pair, head, [_, step], _live, _final = run(fake, name, ds.control("zeroed", 22, ds.zero_draft_pages))
    [reference] = ds.local_references(pair.spec, pair.model, head, [(step.tokens, 0)])
    assert ds.differences(step.served.trace, [s for s in reference if s.start >= step.served.start])


@pytest.mark.parametrize("name", MODELS)
def test_fake_next_token_keys(name):
    """The next-token scenario on the harness: with draft pages named by the next token
    (R37) B resumes a block early and drafts as the local reference does; named by the
    chain alone, B resumes on A's draft row at 159 and its drafts differ (the package's
    test below can fail)."""
    for api, offer in ((fake, ds.NEXT_TOKEN_OFFER), (ds.CHAIN_KEYED, ds.SHARED_TOKENS)):
        pair, head, [_a, step], _live, _final = run(api, name, ds.next_token, chunk=ds.NEXT_TOKEN_CHUNK)
        prompts = [(step.tokens, 0), (step.tokens, offer)]
        reference = ds.local_references(pair.spec, pair.model, head, prompts, chunk=ds.NEXT_TOKEN_CHUNK)[-1]
        assert step.served.offer == offer
        assert bool(ds.differences(step.served.trace, reference)) == (api is ds.CHAIN_KEYED)


# -- through the memory pool -----------------------------------------------------------------


@needs_package
@pytest.mark.parametrize("name", MODELS)
def test_drafted_conversation_resumes_identically(name):
    """A serves turns 1-2 (turn 2 from the pool), B turns 3-4 (turn 3 from A's objects,
    turn 4 from its own), drafting at every step."""
    pair, head, steps, live, final = run(kvc, name, ds.conversation)
    ds.assert_conversation(pair.spec, pair.model, head, steps)
    scenarios.assert_loads_and_saves(pair, live, final)


def control(name: str, seed: int, tamper=None):
    """B's step of a control and its local reference (B's prompt after A's question,
    resuming at CONTROL_OFFER from the question's pages)."""
    pair, head, [a_step, step], _live, _final = run(kvc, name, ds.control("B prompt", seed, tamper))
    prompts = [(a_step.tokens, 0), (step.tokens, ds.CONTROL_OFFER)]
    reference = ds.local_references(pair.spec, pair.model, head, prompts)[-1]
    assert step.served.offer == ds.CONTROL_OFFER and step.served.filled
    return step.served.trace, reference


@needs_package
@pytest.mark.parametrize("name", MODELS)
def test_control_prompts_draft_identically_untouched(name):
    """The controls' setting with nothing tampered passes: what they change is the tamper."""
    got, reference = control(name, 21)
    ds.assert_drafts_identically("untouched", got, reference)


@needs_package
@pytest.mark.parametrize("name", MODELS)
def test_draft_kv_not_loaded_is_caught(name):
    """B's draft pages zeroed after the load: its first step's draft logits miss the local
    reference by far more than rounding and the drafts it proposes change; the target's
    logits of that step do not move (the target never reads the draft group)."""
    got, reference = control(name, 22, ds.zero_draft_pages)
    assert torch.equal(got[0].logits, reference[0].logits)
    assert ds.max_diff(got[0].draft_logits, reference[0].draft_logits) > scenarios.CONTROL_MIN_DIFF
    assert any("drafts" in d for d in ds.differences(got, reference)), "the proposed drafts changed"


@needs_package
@pytest.mark.parametrize("name", MODELS)
def test_nudged_draft_page_is_caught(name):
    """One element of the draft row before the resume point moved by 1e-3 after the load:
    the draft logits are no longer bit-identical."""
    got, reference = control(name, 23, ds.nudge_draft_page)
    assert torch.equal(got[0].logits, reference[0].logits)
    assert not torch.equal(got[0].draft_logits, reference[0].draft_logits)


@needs_package
@pytest.mark.parametrize("name", MODELS)
def test_draft_row_of_another_next_token_is_not_served(name):
    """A's prompt and B's diverge at 160, a block boundary: A's draft row at 159 was
    computed with A's token 160 (`drafter::D1`). B must draft as it does computing its own prompt:
    the draft page of block 9 saved by A is not B's (keyed by the next token), so B
    resumes a block earlier, at NEXT_TOKEN_OFFER, and drafts identically from there."""
    pair, head, [_a, step], _live, _final = run(kvc, name, ds.next_token, chunk=ds.NEXT_TOKEN_CHUNK)
    start = step.served.start
    prompts = [(step.tokens, 0), (step.tokens, start)]
    reference = ds.local_references(pair.spec, pair.model, head, prompts, chunk=ds.NEXT_TOKEN_CHUNK)[-1]
    ds.assert_drafts_identically(f"resumed at {start}, against local reuse", step.served.trace, reference)
    fresh = ds.fresh_reference(pair.spec, pair.model, head, step, chunk=ds.NEXT_TOKEN_CHUNK)
    ds.assert_drafts_identically(f"resumed at {start}, against no reuse", step.served.trace, fresh)
    assert step.served.offer == ds.NEXT_TOKEN_OFFER
