"""An engine-agnostic serving loop that embeds kv_connector (docs/PYTHON.md walks through it).

A toy engine with a paged KV cache (one page-major torch tensor per layer group), a page
allocator and a step loop with chunked prefill. Two instances share one MemoryPool: the
first serves a batch of prompts that share a system prefix; the second serves prompts with
the same prefix, finds it in the pool and loads it into its own tensors while it keeps
computing the other requests. "Computing" a block writes deterministic KV, so every
loaded page is checked against what computing it would give.

Run: python crates/python/examples/engine_loop.py   (tests/test_api_example.py runs main())
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

import kv_connector as kvc

LAYOUT = {
    "name": "example-hybrid",
    "tokens_per_block": 16,
    "groups": [
        {"id": 0, "kind": "full", "layers": [0, 2], "kv_heads": 2, "head_dim": 16, "dtype_bytes": 4},
        {"id": 1, "kind": "window", "window_tokens": 64, "sink_tokens": 0,
         "layers": [1, 3], "kv_heads": 2, "head_dim": 16, "dtype_bytes": 4},
    ],
}
T = LAYOUT["tokens_per_block"]
PAGES = 256          # pages per group
CHUNK = 64           # prompt tokens one step computes per request (chunked prefill)
STEP_TOKENS = 128    # prompt tokens one step computes in all
# Small staging pools: this toy moves a few hundred KiB.
CONFIG = {"loaders": {"staging_bytes_per_loader": 4 << 20}, "saver": {"staging_bytes": 4 << 20}}


@dataclass
class Request:
    rid: int
    tokens: list[int]
    pages: list[int] = field(default_factory=list)
    computed: int = 0
    reservation: int | None = None   # a load in flight
    loaded: int = 0                  # tokens that came from the pool
    state: str = "waiting"           # waiting -> loading? -> running -> finishing -> done


class Engine:
    """One serving instance: KV cache tensors, a page allocator, the connector."""

    def __init__(self, name: str, pool: kvc.MemoryPool):
        layout = kvc.Layout.from_dict(LAYOUT)
        self.name = name
        # One page-major tensor per group: [pages, layers, K/V, T, kv_heads, head_dim].
        self.kv = [torch.zeros((PAGES, 2, 2, T, 2, 16)) for _ in layout.groups]
        self.free = list(range(PAGES - 1, -1, -1))
        self.conn = kvc.Connector(layout=layout, kv_caches=self.kv, pool=pool, config=CONFIG,
                                  model_key="example-model")
        self.requests: dict[int, Request] = {}
        self.next_reservation = 1
        self.pages_checked = 0

    # -- the model --------------------------------------------------------------------
    @staticmethod
    def kv_of(tokens: list[int], block: int, group: int, shape) -> torch.Tensor:
        """What computing `block` gives: a function of every token up to its end."""
        seed = hash((group, tuple(tokens[: (block + 1) * T]))) % 1_000_003
        n = int(torch.Size(shape).numel())
        return (torch.arange(n, dtype=torch.float32) + seed).reshape(shape)

    def compute(self, req: Request, end: int) -> None:
        for block in range(req.computed // T, end // T):
            for group, cache in enumerate(self.kv):
                cache[req.pages[block]] = self.kv_of(req.tokens, block, group, cache[0].shape)
        req.computed = end

    # -- the scheduler ----------------------------------------------------------------
    def submit(self, rid: int, tokens: list[int]) -> None:
        self.requests[rid] = Request(rid, tokens)
        self.conn.lookup(rid, tokens)            # starts probing the pool; never blocks

    def step(self) -> None:
        self.conn.flush()                         # one planner message per admission pass
        steps: list[kvc.StepRequest] = []
        for req in self.requests.values():
            if req.state == "waiting":
                self.admit(req, steps)
        budget = STEP_TOKENS
        for req in self.requests.values():
            if req.state == "running" and budget > 0:
                end = min(req.computed + CHUNK, len(req.tokens), req.computed + budget)
                before = req.computed
                self.compute(req, end)
                budget -= end - before
                steps.append(self.step_record(req, before, end))
        # Every step reports what was scheduled: saves of completed blocks, new loads.
        self.conn.on_step(steps)
        for reservation, rid, filled in self.conn.finished_loads():
            self.load_finished(self.requests[rid], reservation, filled)
        for req in list(self.requests.values()):
            if req.state == "running" and req.computed == len(req.tokens):
                keep = self.conn.request_finished(req.rid)
                req.state = "finishing" if keep else self.release_pages(req)
        for rid in self.conn.finished_saves():   # saves done: the pages may go
            self.release_pages(self.requests[rid])

    def admit(self, req: Request, steps: list[kvc.StepRequest]) -> None:
        reservation = self.next_reservation
        answer = self.conn.reserve(req.rid, 0, reservation)
        if answer is None:
            return                                # lookup still running: ask next step
        extra, _is_async = answer
        blocks = -(-len(req.tokens) // T)
        if len(self.free) < blocks:
            return
        req.pages = [self.free.pop() for _ in range(blocks)]
        if extra == 0:
            req.state = "running"
            return
        self.next_reservation += 1
        req.reservation, req.loaded, req.state = reservation, extra, "loading"
        steps.append(self.step_record(req, 0, 0, new_reservation=reservation))

    def load_finished(self, req: Request, reservation: int, filled: bool) -> None:
        if reservation != req.reservation:
            return                                # a stale completion (R26)
        if filled:
            req.computed = req.loaded             # the loaded tokens count as computed
            self.check_loaded(req)
        else:
            self.conn.release(req.rid, reservation, 0, req.loaded)
            req.loaded = 0                        # compute the prefix itself (R25)
        req.reservation, req.state = None, "running"

    def step_record(self, req: Request, before: int, after: int, new_reservation=None):
        tables = [req.pages for _ in self.kv]     # the same pages in every group here
        return kvc.StepRequest(req.rid, len(req.tokens), before, after,
                               new_reservation=new_reservation, page_tables=tables)

    def release_pages(self, req: Request) -> str:
        self.free.extend(req.pages)
        req.pages, req.state = [], "done"
        return "done"

    def check_loaded(self, req: Request) -> None:
        """The loaded pages hold what computing them would give: every block of the full
        group, the blocks of the window before the resume point in the window group."""
        window = LAYOUT["groups"][1]["window_tokens"]
        for block in range(req.loaded // T):
            groups = [0] if (block + 1) * T <= req.loaded - window else [0, 1]
            for group in groups:
                cache = self.kv[group]
                expected = self.kv_of(req.tokens, block, group, cache[0].shape)
                assert torch.equal(cache[req.pages[block]], expected), (self.name, req.rid, block, group)
                self.pages_checked += 1

    def run(self) -> None:
        while any(req.state != "done" for req in self.requests.values()):
            self.step()
            if not any(req.state == "running" for req in self.requests.values()):
                self.conn.wait_for_progress(0.01)   # idle: wait without spinning (GIL released)


def prompts(first_rid: int, system: list[int], count: int, own: int) -> list[tuple[int, list[int]]]:
    return [(first_rid + i, system + list(range(10_000 * (first_rid + i), 10_000 * (first_rid + i) + own)))
            for i in range(count)]


def main() -> dict:
    pool = kvc.MemoryPool(capacity_bytes=256 << 20)
    system = list(range(7, 7 + 20 * T))           # a 320-token shared system prompt
    first = Engine("first", pool)
    for rid, tokens in prompts(1, system, 3, 45):
        first.submit(rid, tokens)
    first.run()
    first.conn.settle_saves()

    second = Engine("second", pool)
    for rid, tokens in prompts(100, system, 3, 70):
        second.submit(rid, tokens)
    second.run()
    loaded = {rid: req.loaded for rid, req in second.requests.items()}
    stats = [first.conn.shutdown(), second.conn.shutdown()]
    summary = {
        "tokens_loaded": loaded,
        "pages_checked": second.pages_checked,
        "lookups": [s["lookups"]["lookups"] for s in stats],
        "pages_saved": [s["saves"]["saves_done"] for s in stats],
        "pages_loaded": [s["loads"]["pages_loaded"] for s in stats],
    }
    print(summary)
    return summary


if __name__ == "__main__":
    sys.exit(0 if all(main()["tokens_loaded"].values()) else 1)
