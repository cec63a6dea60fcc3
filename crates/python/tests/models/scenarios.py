"""The workloads of the real-model tests, for any connector module (`kv_connector`, or
`fake_connector` in the harness self-tests).

Two instances share one pool: A computes a conversation's first turns and a set of
prompts sharing a long system prefix, B serves what comes next. Every resume point the
scenarios expect is a multiple of 80 tokens, lcm(CHUNK, T), hence a chunk boundary of
every instance (see `engine`), so B's logits can be compared bit for bit with a
no-reuse baseline.
"""

from __future__ import annotations

import math
import os
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


def config() -> dict:
    """Connector configuration of both instances: small staging pools, rewind R."""
    return {
        "planner": {"swa_endpoint_rewind_tokens": REWIND},
        "loaders": {"staging_bytes_per_loader": 4 << 20},
        "saver": {"staging_bytes": 4 << 20},
    }


def random_tokens(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


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
    lay = layout(spec, window_tokens=window_tokens)
    pool = api.MemoryPool(capacity_bytes=64 << 20)
    a = Instance(spec, model, lay, api=api, pool=pool, config=config(), chunk=CHUNK)
    b = Instance(
        spec, model, lay, api=api, pool=pool, config=config(), chunk=CHUNK, missing_pages=missing_pages
    )
    return Pair(spec, model, a, b, pool)


@dataclass
class Checked:
    """One served prompt next to its baseline."""

    name: str
    tokens: list[int]
    served: Served
    expected_offer: int
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


def check(name: str, model, tokens, served: Served, expected_offer: int) -> Checked:
    logits, generated, cache = native_run(
        model, tokens, chunk=CHUNK, decode=DECODE, snapshot_at=served.start or None
    )
    return Checked(name, list(tokens), served, expected_offer, logits, generated, cache)


def block_floor(n: int) -> int:
    return n // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK


def conversation(pair: Pair) -> list[Checked]:
    """A serves turns 1 and 2 (turn 2 loads turn 1's prefix), B turns 3 and 4."""
    out, prompt = [], random_tokens(1, FIRST_TURN_TOKENS)
    expected = 0
    for turn, inst in enumerate((pair.a, pair.a, pair.b, pair.b), start=1):
        served = inst.serve(prompt, decode=DECODE)
        inst.settle()
        out.append(check(f"turn {turn}", pair.model, prompt, served, expected))
        expected = block_floor(len(prompt))
        prompt = prompt + served.generated[:DECODE] + random_tokens(100 + turn, USER_TOKENS)
    return out


def shared_prefix(pair: Pair) -> list[Checked]:
    """A serves three prompts after one system prefix, B a fourth."""
    system = random_tokens(2, SYSTEM_TOKENS)
    out = []
    for i, n in enumerate(QUESTION_TOKENS):
        prompt = system + random_tokens(200 + i, n)
        served = pair.a.serve(prompt, decode=DECODE)
        pair.a.settle()
        out.append(check(f"A prompt {i}", pair.model, prompt, served, SYSTEM_TOKENS if i else 0))
    prompt = system + random_tokens(300, 70)
    served = pair.b.serve(prompt, decode=DECODE)
    out.append(check("B prompt", pair.model, prompt, served, SYSTEM_TOKENS))
    return out


def walk_back(pair: Pair) -> list[Checked]:
    """Window groups' walk-back (R12, R13): A serves a prompt's first 165 tokens, then the
    whole 330-token prompt (its window saves start near its end, past block 13). B then
    asks for the first 250 tokens plus new ones: the window of 240 is missing, and so is
    every one down to 240 - R, so the lookup falls back to the earlier prompt end at 160
    (`recovered`). Then the first 200 plus new ones: 192 and 176 are incomplete, 160 is
    within R (`rewound`)."""
    prompt = random_tokens(3, 330)
    out = []
    for name, tokens, inst, expected in (
        ("A first part", prompt[:165], pair.a, 0),
        ("A whole prompt", prompt, pair.a, 160),
        ("B recovered", prompt[:250] + random_tokens(301, 40), pair.b, 160),
        ("B rewound", prompt[:200] + random_tokens(302, 40), pair.b, 160),
    ):
        served = inst.serve(tokens, decode=DECODE)
        inst.settle()
        out.append(check(name, pair.model, tokens, served, expected))
    return out


def system_prompts() -> tuple[list[int], list[int]]:
    """A's prompt and B's prompt of the negative controls: one system prefix, different
    questions (B resumes at SYSTEM_TOKENS)."""
    system = random_tokens(2, SYSTEM_TOKENS)
    return system + random_tokens(200, QUESTION_TOKENS[0]), system + random_tokens(300, 70)




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


def control_window_short(api, spec: ModelSpec) -> Checked:
    """Both connectors are given a window one block shorter than the model's: the load
    fills one window block fewer than the model reads (the instance reads zeros there)."""
    pair = make_pair(api, spec, window_tokens=spec.sliding_window - TOKENS_PER_BLOCK, missing_pages="zeros")
    try:
        a_prompt, b_prompt = system_prompts()
        pair.a.serve(a_prompt, decode=0)
        pair.a.settle()
        served = pair.b.serve(b_prompt, decode=DECODE)
        return check("window one block short", pair.model, b_prompt, served, SYSTEM_TOKENS)
    finally:
        pair.close()


def control_foreign_page(api, spec: ModelSpec) -> Checked:
    """After the load, one full-attention page of B's table is replaced by the page of the
    same block of another prompt B holds."""
    pair = make_pair(api, spec)
    try:
        a_prompt, b_prompt = system_prompts()
        pair.a.serve(a_prompt, decode=0)
        pair.a.settle()
        holder = {}
        other = random_tokens(400, 120)
        pair.b.serve(other, decode=0, keep_pages=True, after_load=lambda req: holder.update(req=req))

        def swap(req):
            req.tables[0][3] = holder["req"].tables[0][3]

        served = pair.b.serve(b_prompt, decode=DECODE, after_load=swap)
        return check("page of another prompt", pair.model, b_prompt, served, SYSTEM_TOKENS)
    finally:
        pair.close()


def control_corrupt(api, spec: ModelSpec) -> tuple[Checked, list[str], str, dict]:
    """One stored object of the prefix (block 2 of the full-attention group) has a flipped
    byte: the load must be refused and B computes the prefix itself. Returns the check,
    the keys the pool corrupted, the key asked for and B's final stats."""
    pair = make_pair(api, spec)
    stats_b = {}
    try:
        a_prompt, b_prompt = system_prompts()
        pair.a.serve(a_prompt, decode=0)
        pair.a.settle()
        key = pair.a.conn.keys(a_prompt)[2][0]
        corrupted = pair.pool.corrupt(key, 1)
        served = pair.b.serve(b_prompt, decode=DECODE)
        return check("corrupt object", pair.model, b_prompt, served, SYSTEM_TOKENS), corrupted, key, stats_b
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


def run_and_close(pair: Pair, scenario) -> tuple[list[Checked], tuple[dict, dict], tuple[dict, dict]]:
    """Runs `scenario(pair)`; returns its checks, both connectors' stats at its end and
    their final reports."""
    try:
        checked = scenario(pair)
        live = pair.a.conn.stats(), pair.b.conn.stats()
    finally:
        final = pair.close()
    return checked, live, final


def assert_loads_and_saves(pair: Pair, live, final) -> None:
    """Every filled load moved exactly the pages R15 names, no load failed, no save
    failed or went past a chunk end (R16)."""
    for inst, stats in zip((pair.a, pair.b), live):
        assert stat(stats, "pages_loaded") == inst.pages_filled
        assert stat(stats, "loads_failed") == 0
    for stats in final:
        assert stat(stats, "published_past_chunk_end") == 0
        assert stat(stats, "saves_failed") == 0
