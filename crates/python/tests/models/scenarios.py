"""The workloads of the real-model tests, for any connector module (`kv_connector`, or
`fake_connector` in the harness self-tests).

Two instances share one pool: A computes a conversation's first turns and a set of
prompts sharing a long system prefix, B serves what comes next. Every resume point the
scenarios expect is a multiple of 80 tokens, lcm(CHUNK, T), hence a chunk boundary of
every instance (see `engine`), so B's logits can be compared bit for bit with a
no-reuse baseline.

A `Scenario` is A's part and B's part. Each part serves its prompts, settles its saves
and returns its `Step`s (what was served, what the pass criterion expects); baselines are
computed afterwards (`check`). The parts run on a `Pair` in one process, or A's in
another process (`peer`), its `Step`s sent back.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .engine import Instance, Served, native_run
from .tiny import TOKENS_PER_BLOCK, VOCAB, ModelSpec, build_model, layout

CHUNK = 40  # not a multiple of T: chunk ends fall inside blocks (R16's cap matters)
REWIND = 64  # swa_endpoint_rewind_tokens
DECODE = 16
SYSTEM_TOKENS = 160  # the shared system prefix (10 blocks, a multiple of 80)
QUESTION_TOKENS = (37, 52, 45)  # A's prompts after the system prefix
USER_TOKENS = 64  # each later conversation turn adds the answer and this many tokens
FIRST_TURN_TOKENS = 165
# Resume points that are chunk boundaries for every instance.
RESUME_GRID = math.lcm(CHUNK, TOKENS_PER_BLOCK)


def device() -> str:
    """`KV_CONNECTOR_TEST_DEVICE` (cpu by default; cuda on a GPU machine). Not a `KVC_*`
    name: the connector reads every `KVC_*` variable as configuration."""
    return os.environ.get("KV_CONNECTOR_TEST_DEVICE", "cpu")


def config(base: dict | None = None) -> dict:
    """Connector configuration of every instance: small staging pools, rewind R, over
    `base` (a Mooncake client's configuration, say)."""
    base = base or {}
    return {
        **base,
        # A pool made from this configuration (vLLM's shared_pool) takes its capacity at
        # start: 64 MiB, not the runtime's 8 GiB default.
        "pool": {"capacity_bytes": 64 << 20, **base.get("pool", {})},
        "planner": {"swa_endpoint_rewind_tokens": REWIND},
        "loaders": {"staging_bytes_per_loader": 4 << 20},
        "saver": {"staging_bytes": 4 << 20},
    }


def random_tokens(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def make_instance(
    api, spec: ModelSpec, model, *, pool=None, base_config=None, window_tokens=None, missing_pages="error"
) -> Instance:
    """An instance of `model` with a connector of `api`: on `pool`, or on the pool that
    `base_config` configures."""
    lay = layout(spec, window_tokens=window_tokens)
    return Instance(
        spec, model, lay, api=api, pool=pool, config=config(base_config), chunk=CHUNK, missing_pages=missing_pages
    )


@dataclass
class Pair:
    """Instances A and B of one model on one pool."""

    spec: ModelSpec
    model: torch.nn.Module
    a: Instance
    b: Instance
    pool: object

    def close(self) -> tuple[dict, dict]:
        return self.a.close(), self.b.close()


def make_pair(api, spec: ModelSpec, *, window_tokens=None, missing_pages="error") -> Pair:
    model = build_model(spec, device())
    pool = api.MemoryPool(capacity_bytes=64 << 20)
    a = make_instance(api, spec, model, pool=pool, window_tokens=window_tokens)
    b = make_instance(api, spec, model, pool=pool, window_tokens=window_tokens, missing_pages=missing_pages)
    return Pair(spec, model, a, b, pool)


@dataclass
class Step:
    """One prompt an instance served, and the resume point the pass criterion expects."""

    name: str
    tokens: list[int]
    served: Served
    expected_offer: int


@dataclass
class Checked(Step):
    """One served prompt next to its baseline."""

    baseline_logits: torch.Tensor
    baseline_generated: list[int]
    baseline_cache: list | None

    @property
    def rows(self) -> torch.Tensor:
        """The baseline's rows for the positions the instance computed."""
        return self.baseline_logits[self.served.start :]

    def max_abs_diff(self) -> float:
        d = (self.served.logits - self.rows).abs()
        return float("inf") if not torch.isfinite(d).all() else float(d.max())

    def exact(self) -> bool:
        return torch.equal(self.served.logits, self.rows)


def check(model, step: Step) -> Checked:
    """`step` next to the no-reuse baseline of its tokens."""
    logits, generated, cache = native_run(
        model, step.tokens, chunk=CHUNK, decode=DECODE, snapshot_at=step.served.start or None
    )
    return Checked(step.name, step.tokens, step.served, step.expected_offer, logits, generated, cache)


@dataclass(frozen=True)
class Scenario:
    """A workload in two parts: `a(instance)` serves on A; `b(instance, a_steps)` serves
    on B once A's saves are settled. Each returns its steps."""

    a: Callable[[Instance], list[Step]]
    b: Callable[[Instance, list[Step]], list[Step]]


def serve(inst: Instance, name: str, tokens: list[int], expected_offer: int, **kwargs) -> Step:
    """Serves `tokens` (DECODE greedy tokens unless `decode` says otherwise), settles the
    saves."""
    served = inst.serve(tokens, **{"decode": DECODE, **kwargs})
    inst.settle()
    return Step(name, list(tokens), served, expected_offer)


def block_floor(n: int) -> int:
    return n // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK


def _next_turn(step: Step, turn: int) -> list[int]:
    """The prompt after turn `turn`: its prompt, its answer and a new user message."""
    return step.tokens + step.served.generated[:DECODE] + random_tokens(100 + turn, USER_TOKENS)


def _turns(inst: Instance, prompt: list[int], expected: int, turns: range) -> list[Step]:
    out = []
    for turn in turns:
        out.append(serve(inst, f"turn {turn}", prompt, expected))
        expected, prompt = block_floor(len(prompt)), _next_turn(out[-1], turn)
    return out


# A serves turns 1 and 2 (turn 2 loads turn 1's prefix), B turns 3 and 4.
conversation = Scenario(
    a=lambda inst: _turns(inst, random_tokens(1, FIRST_TURN_TOKENS), 0, range(1, 3)),
    b=lambda inst, a: _turns(inst, _next_turn(a[-1], 2), block_floor(len(a[-1].tokens)), range(3, 5)),
)


def _system() -> list[int]:
    return random_tokens(2, SYSTEM_TOKENS)


def system_prompts() -> tuple[list[int], list[int]]:
    """A's prompt and B's prompt of a negative control: one system prefix, different
    questions (B resumes at SYSTEM_TOKENS)."""
    return _system() + random_tokens(200, QUESTION_TOKENS[0]), _system() + random_tokens(300, 70)


# A serves three prompts after one system prefix, B a fourth.
shared_prefix = Scenario(
    a=lambda inst: [
        serve(inst, f"A prompt {i}", _system() + random_tokens(200 + i, n), SYSTEM_TOKENS if i else 0)
        for i, n in enumerate(QUESTION_TOKENS)
    ],
    b=lambda inst, _a: [serve(inst, "B prompt", _system() + random_tokens(300, 70), SYSTEM_TOKENS)],
)


def _walk_back_a(inst: Instance) -> list[Step]:
    prompt = random_tokens(3, 330)
    return [serve(inst, "A first part", prompt[:165], 0), serve(inst, "A whole prompt", prompt, 160)]


def _walk_back_b(inst: Instance, _a: list[Step]) -> list[Step]:
    prompt = random_tokens(3, 330)
    return [
        serve(inst, "B recovered", prompt[:250] + random_tokens(301, 40), 160),
        serve(inst, "B rewound", prompt[:200] + random_tokens(302, 40), 160),
    ]


# Window groups' walk-back (R12, R13): A serves a prompt's first 165 tokens, then the
# whole 330-token prompt (its window saves start near its end, past block 13). B then asks
# for the first 250 tokens plus new ones: the window of 240 is missing, and so is every one
# down to 240 - R, so the lookup falls back to the earlier prompt end at 160
# (`recovered`). Then the first 200 plus new ones: 192 and 176 are incomplete, 160 is
# within R (`rewound`).
walk_back = Scenario(a=_walk_back_a, b=_walk_back_b)


def assert_matches(c: Checked) -> None:
    """The pass criterion: the offer is the expected resume point and every computed
    position's logits, the cache of the first forward pass and the greedy tokens equal
    the baseline's, bit for bit."""
    s = c.served
    assert s.offer == c.expected_offer, f"{c.name}: offered {s.offer}, expected {c.expected_offer}"
    assert s.offer % RESUME_GRID == 0, f"{c.name}: resume point {s.offer} is not a chunk boundary everywhere"
    if s.offer:
        assert s.filled, f"{c.name}: load of {s.offer} tokens not filled"
        assert s.start == s.offer
        assert c.baseline_cache is not None and len(s.first_cache) == len(c.baseline_cache)
        for layer, ((k, v), (bk, bv)) in enumerate(zip(s.first_cache, c.baseline_cache)):
            assert torch.equal(k, bk) and torch.equal(v, bv), f"{c.name}: layer {layer} cache differs"
    assert c.exact(), f"{c.name}: logits differ by up to {c.max_abs_diff():.3e}"
    assert s.generated == c.baseline_generated, f"{c.name}: greedy tokens differ"


# -- negative controls: each must miss the baseline by far more than rounding ------------

# What a control must miss the baseline by: the tolerance a non-exact comparison would
# use (1e-5) times 1000.
CONTROL_MIN_DIFF = 1e-2


def control(name: str, *, system_seed: int = 2, tamper=None) -> Scenario:
    """A negative control's prompts: A serves one prompt after a system prefix (drawn with
    `system_seed`), B another after the same prefix and resumes at SYSTEM_TOKENS.
    `tamper(b_instance)`, run before B's prompt, returns what B runs once its load is
    settled."""
    system = random_tokens(system_seed, SYSTEM_TOKENS)
    a_prompt, b_prompt = system + random_tokens(200, QUESTION_TOKENS[0]), system + random_tokens(300, 70)

    def b(inst: Instance, _a: list[Step]) -> list[Step]:
        after_load = tamper(inst) if tamper is not None else None
        return [serve(inst, name, b_prompt, SYSTEM_TOKENS, after_load=after_load)]

    return Scenario(a=lambda inst: [serve(inst, "A prompt", a_prompt, 0, decode=0)], b=b)


def _swap_in_foreign_page(inst: Instance):
    """Serves another prompt on `inst`, keeping its pages; returns the tamper that puts
    its full-attention page of block 3 in a request's table."""
    holder = {}
    inst.serve(random_tokens(400, 120), decode=0, keep_pages=True, after_load=lambda req: holder.update(req=req))

    def swap(req) -> None:
        req.tables[0][3] = holder["req"].tables[0][3]

    return swap


def foreign_page(system_seed: int = 2) -> Scenario:
    """After the load, one full-attention page of B's table is replaced by the page of the
    same block of another prompt B holds."""
    return control("page of another prompt", system_seed=system_seed, tamper=_swap_in_foreign_page)


def corrupt(system_seed: int = 2) -> Scenario:
    """B's prompt; between the parts one stored object of the prefix (`corrupt_key`) gets
    a flipped byte, so the load must be refused and B computes the prefix itself."""
    return control("corrupt object", system_seed=system_seed)


def corrupt_key(conn, a_steps: list[Step]) -> str:
    """The object a corrupt control damages: block 2 of the full-attention group."""
    return conn.keys(a_steps[0].tokens)[2][0]


def _run_control(pair: Pair, scenario: Scenario, between=None) -> Checked:
    """Both parts of a control on `pair`, `between(a_steps)` after A's; B's step, checked."""
    a_steps = scenario.a(pair.a)
    if between is not None:
        between(a_steps)
    [step] = scenario.b(pair.b, a_steps)
    return check(pair.model, step)


def control_window_short(api, spec: ModelSpec) -> Checked:
    """Both connectors are given a window one block shorter than the model's: the load
    fills one window block fewer than the model reads (the instance reads zeros there)."""
    pair = make_pair(api, spec, window_tokens=spec.sliding_window - TOKENS_PER_BLOCK, missing_pages="zeros")
    try:
        return _run_control(pair, control("window one block short"))
    finally:
        pair.close()


def control_foreign_page(api, spec: ModelSpec) -> Checked:
    pair = make_pair(api, spec)
    try:
        return _run_control(pair, foreign_page())
    finally:
        pair.close()


def control_corrupt(api, spec: ModelSpec) -> tuple[Checked, list[str], str, dict]:
    """The corrupt control on one pool, damaged with its `corrupt` test aid. Returns the
    check, the keys the pool corrupted, the key asked for and B's final stats."""
    pair = make_pair(api, spec)
    damaged: dict = {}
    stats_b: dict = {}

    def damage(a_steps: list[Step]) -> None:
        damaged["key"] = corrupt_key(pair.a.conn, a_steps)
        damaged["done"] = pair.pool.corrupt(damaged["key"], 1)

    try:
        c = _run_control(pair, corrupt(), between=damage)
        return c, damaged["done"], damaged["key"], stats_b
    finally:
        stats_b.update(pair.close()[1])


def stat(stats: dict, name: str) -> int:
    """Counter `name` anywhere in a (nested) stats dict."""
    for key, value in stats.items():
        if key == name and isinstance(value, int):
            return value
        if isinstance(value, dict):
            try:
                return stat(value, name)
            except KeyError:
                pass
    raise KeyError(name)


def run_parts(pair, scenario: Scenario) -> tuple[list, tuple[dict, dict], tuple[dict, dict]]:
    """Runs both parts of `scenario` on `pair` and closes it; returns every step, both
    connectors' stats at its end and their final reports."""
    try:
        a_steps = scenario.a(pair.a)
        steps = a_steps + scenario.b(pair.b, a_steps)
        live = pair.a.conn.stats(), pair.b.conn.stats()
    finally:
        final = pair.close()
    return steps, live, final


def run_and_close(pair: Pair, scenario: Scenario) -> tuple[list[Checked], tuple[dict, dict], tuple[dict, dict]]:
    """Runs both parts of `scenario` on `pair`; returns the checks of every step, both
    connectors' stats at its end and their final reports."""
    steps, live, final = run_parts(pair, scenario)
    return [check(pair.model, s) for s in steps], live, final


def assert_loads(stats: dict, pages_filled: int) -> None:
    """Every filled load moved exactly the pages R15 names; no load failed."""
    assert stat(stats, "pages_loaded") == pages_filled
    assert stat(stats, "loads_failed") == 0


def assert_saves(stats: dict) -> None:
    """No save failed or went past a chunk end (R16)."""
    assert stat(stats, "published_past_chunk_end") == 0
    assert stat(stats, "saves_failed") == 0


def assert_loads_and_saves(pair: Pair, live, final) -> None:
    for inst, stats in zip((pair.a, pair.b), live):
        assert_loads(stats, inst.pages_filled)
    for stats in final:
        assert_saves(stats)
