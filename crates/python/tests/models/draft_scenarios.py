"""The drafting workloads of the real-model tests, and their references.

Instances A and B are `DraftingInstance`s of one model (layout with a draft group, R6) on
one pool. What B serves from the pool is compared with what B would have done reusing
the same prefix locally: a reference instance without a connector (`local_references`)
serves the same prompts in order, each resuming at the same point from the pages of the
previous one (copied, as an engine's own prefix cache holds them). Each also gets a
no-reuse reference (`fresh_reference`: the prompt from token 0, its steps from the resume
point on). Pass (`assert_drafts_identically`): the two records are equal, step by step
(`drafter::D3`: the target's logits and the head's logits bit for bit, the drafts, the accepted
counts).

Resume points are chunk boundaries of every instance (`engine`'s chunking), so the
forward shapes of a pool-served and a locally reused prompt are the same from the resume
point on: the conversation resumes on `scenarios.RESUME_GRID`; the next-token scenario
(`next_token`) computes in chunks of one block, so that any block boundary is one.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from . import fake_connector, scenarios
from .drafter import DraftHead, DraftingInstance, DraftStep
from .scenarios import CHUNK, Pair, Scenario, Step, random_tokens, serve
from .tiny import TOKENS_PER_BLOCK, ModelSpec, build_model, layout

# The reference instance keeps every window page (its rewind covers any prompt here), so
# a later prompt can resume from any block boundary of an earlier one.
LOCAL_REWIND = 4096


def make_instance(
    api, spec: ModelSpec, model, head: DraftHead, *, pool=None, base_config=None, chunk: int = CHUNK
) -> DraftingInstance:
    """A drafting instance of `model` with a connector of `api` (on `pool`, or on the pool
    `base_config` configures); `api=None`: a reference instance, no connector."""
    config = scenarios.config(base_config)
    if api is None:
        config = {"planner": {"swa_endpoint_rewind_tokens": LOCAL_REWIND}}
    return DraftingInstance(
        spec, model, layout(spec, drafter=True), api=api, pool=pool, config=config, chunk=chunk, head=head
    )


def make_pair(api, spec: ModelSpec, *, chunk: int = CHUNK) -> tuple[Pair, DraftHead]:
    """Drafting instances A and B of one model and head on one memory pool."""
    model = build_model(spec, scenarios.device())
    head = make_head(spec, model)
    pool = api.MemoryPool(capacity_bytes=64 << 20)
    a, b = (make_instance(api, spec, model, head, pool=pool, chunk=chunk) for _ in range(2))
    return Pair(spec, model, a, b, pool), head


def local_references(spec, model, head, prompts: list[tuple[list[int], int]], *, chunk: int = CHUNK):
    """The records of a reference instance serving `prompts` (tokens, resume point) in
    order, each resuming at its point from the pages of the previous one (from token 0
    where the point is 0)."""
    ref = make_instance(None, spec, model, head, chunk=chunk)
    out, previous = [], None
    for tokens, start in prompts:
        reuse = (previous, start) if start else None
        served = ref.serve(tokens, decode=scenarios.DECODE, keep_pages=True, reuse=reuse)
        out.append(served.trace)
        previous = served.request_id
    return out


def fresh_reference(spec, model, head, step: Step, *, chunk: int = CHUNK) -> list[DraftStep]:
    """The record of the step's prompt computed from token 0, from its resume point on."""
    served = make_instance(None, spec, model, head, chunk=chunk).serve(step.tokens, decode=scenarios.DECODE)
    return [s for s in served.trace if s.start >= step.served.start]


def differences(got: list[DraftStep], want: list[DraftStep]) -> list[str]:
    """Where two records differ (empty when they draft identically, `drafter::D3`)."""
    if [(s.kind, s.start) for s in got] != [(s.kind, s.start) for s in want]:
        return [f"steps {[(s.kind, s.start) for s in got]} != {[(s.kind, s.start) for s in want]}"]
    out = []
    for s, w in zip(got, want):
        at = f"{s.kind} step at {s.start}"
        if not torch.equal(s.logits, w.logits):
            out.append(f"{at}: target logits differ by up to {max_diff(s.logits, w.logits):.3e}")
        if not torch.equal(s.draft_logits, w.draft_logits):
            out.append(f"{at}: draft logits differ by up to {max_diff(s.draft_logits, w.draft_logits):.3e}")
        if s.drafts != w.drafts:
            out.append(f"{at}: drafts {s.drafts} != {w.drafts}")
        if s.accepted != w.accepted:
            out.append(f"{at}: accepted {s.accepted} != {w.accepted}")
    return out


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    d = (a - b).abs()
    return float("inf") if not torch.isfinite(d).all() else float(d.max())


def assert_drafts_identically(name: str, got: list[DraftStep], want: list[DraftStep]) -> None:
    diffs = differences(got, want)
    assert not diffs, f"{name}: " + "; ".join(diffs[:4])


def accepted_counts(trace: list[DraftStep]) -> list[int]:
    return [s.accepted for s in trace if s.accepted is not None]


# -- the conversation ------------------------------------------------------------------

# `scenarios.conversation` as it is: A serves turns 1-2 (turn 2 from the pool), B turns
# 3-4 (turn 3 from A's objects, turn 4 from its own); offers 0, 160, 240, 320. Every
# draft page B loads was saved with the same next token B has (each turn extends the
# previous prompt past the resume point), so the next-token keying changes no offer.
conversation = scenarios.conversation


def assert_conversation(spec, model, head, steps: list[Step]) -> None:
    """The conversation's offers, and every turn drafting as the local reference does and
    as no reuse does from its resume point on."""
    assert [s.served.offer for s in steps] == [0, 160, 240, 320]
    assert all(s.served.filled for s in steps[1:])
    local = local_references(spec, model, head, [(s.tokens, s.served.start) for s in steps])
    for step, reference in zip(steps, local):
        assert_drafts_identically(f"{step.name} against local reuse", step.served.trace, reference)
        if step.served.start:  # from token 0 the local reference is the no-reuse run
            fresh = fresh_reference(spec, model, head, step)
            assert_drafts_identically(f"{step.name} against no reuse", step.served.trace, fresh)


def make_head(spec: ModelSpec, model) -> DraftHead:
    return DraftHead(model, kv_heads=spec.kv_heads, head_dim=spec.head_dim)


# -- negative controls ------------------------------------------------------------------

# A serves QUESTION; B serves QUESTION plus tokens of its own and resumes at 160: block
# 10 starts with QUESTION's tokens 160-164, so the draft row at 159 was computed with the
# next token B has too.
QUESTION_TOKENS = 165
CONTROL_OFFER = 160


def control_prompts(seed: int) -> tuple[list[int], list[int]]:
    """A's prompt and B's prompt of a control (or of its positive twin)."""
    question = random_tokens(11, QUESTION_TOKENS)
    return question, question + random_tokens(seed, 70)


def zero_draft_pages(inst: DraftingInstance):
    """The tamper of "draft KV not loaded": B's draft pages below the resume point, filled
    by the load, are zeroed (a drafter starting from no KV)."""

    def tamper(req) -> None:
        for gi in inst.draft_groups:
            for page in req.tables[gi][: CONTROL_OFFER // TOKENS_PER_BLOCK]:
                inst.paged.tensors[gi][page].zero_()

    return tamper


def nudge_draft_page(inst: DraftingInstance, delta: float = 1e-3):
    """The tamper of "a draft page nudged": one K element of the draft row at 159, the
    last row before the resume point, moves by `delta`."""

    def tamper(req) -> None:
        gi = inst.draft_groups[0]
        page = req.tables[gi][CONTROL_OFFER // TOKENS_PER_BLOCK - 1]
        inst.paged.tensors[gi][page, 0, 0, TOKENS_PER_BLOCK - 1, 0, 0] += delta

    return tamper


def control(name: str, seed: int, tamper=None) -> Scenario:
    """A serves the question; B its prompt of `seed`, `tamper(b_instance)` giving what runs
    once B's load is settled."""
    a_prompt, b_prompt = control_prompts(seed)

    def b(inst, _a: list[Step]) -> list[Step]:
        after_load = tamper(inst) if tamper is not None else None
        return [serve(inst, name, b_prompt, CONTROL_OFFER, after_load=after_load)]

    return Scenario(a=lambda inst: [serve(inst, "A question", a_prompt, 0, decode=0)], b=b)


# -- the next token ------------------------------------------------------------------------

# A serves SHARED + its own tokens; B SHARED + other tokens: they diverge at 160, a block
# boundary and a resume grid point, so A's draft row at 159 was computed with A's token
# 160, not B's. Chunks of one block (every block boundary is a resume point there).
NEXT_TOKEN_CHUNK = TOKENS_PER_BLOCK
SHARED_TOKENS = 160
# The runtime keys a draft page of block b by its chain hash and token (b + 1) T: B finds
# no draft page of block 9 under its own token 160, so the lookup's H stops a block
# earlier and B resumes at 144 (before that keying, at 160 on A's draft row 159).
NEXT_TOKEN_OFFER = SHARED_TOKENS - TOKENS_PER_BLOCK


def next_token_prompts() -> tuple[list[int], list[int]]:
    shared = random_tokens(12, SHARED_TOKENS)
    return shared + random_tokens(13, 37), shared + random_tokens(14, 70)


next_token = Scenario(
    a=lambda inst: [serve(inst, "A prompt", next_token_prompts()[0], 0, decode=0)],
    b=lambda inst, _a: [serve(inst, "B prompt", next_token_prompts()[1], NEXT_TOKEN_OFFER)],
)

# The fake connector with draft pages named by the chain alone (before R37): the harness's
# control that the next-token scenario fails without the next-token keying.
CHAIN_KEYED = SimpleNamespace(
    Connector=fake_connector.ChainKeyedConnector,
    Layout=fake_connector.Layout,
    MemoryPool=fake_connector.MemoryPool,
    StepRequest=fake_connector.StepRequest,
)
