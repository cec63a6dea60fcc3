"""A tiny serving instance on paged KV, driving a connector through its hooks, and the
no-reuse baseline it is compared with.

Chunking: a prompt is computed in chunks that end at multiples of `chunk` tokens
(absolute positions) or at the prompt end. On CPU the bits of a token's K/V depend on the
shape of the forward pass that produced it (oneDNN/MKL GEMM kernels change with the row
count; GPT-OSS routes each chunk's tokens to experts in groups whose size varies), so
two instances compute a prefix to the same bits only with the same chunk boundaries. With
boundaries at fixed absolute positions every instance splits a shared prefix the same
way, and a resume point that is a multiple of `chunk` is a chunk boundary for all of
them: the scenarios place their resume points there, so comparisons are bit for bit.

Per request (`Instance.serve`):
1. `lookup`, then `reserve` until it answers (ask again while it says None);
2. an offer of `extra` tokens: allocate the pages the load fills (R15: full groups every
   block below `e = computed + extra`, window groups their sinks and the blocks
   overlapping `[e - W, e)`; -1 elsewhere), report them with `new_reservation`, wait
   for `finished_loads`; filled: resume at `e`; not filled: release the reservation,
   give the window pages back and compute from where the load started (R25);
3. compute the chunks; after each forward pass write its K/V into the pages, report the
   chunk with `on_step`, then drop window pages no later token reads (the group keeps
   its sinks and `[computed - W - R, computed)`, R being the connector's rewind, as the
   engine must hold a prompt end's rewind range for R17's window saves);
4. decode greedily, one token a step, reported like chunks (`models.drafter.DraftingInstance`
   instead drafts k tokens a step and verifies them);
5. `request_finished`; pages (dropped ones included) go back to the free lists only once
   the connector no longer reads them (`finished_saves`, R22).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .paged import PagedKv
from .tiny import ModelSpec

# How long a hook may keep the instance waiting for an answer before the test fails.
WAIT_S = 60.0


def chunk_bounds(start: int, end: int, chunk: int) -> list[tuple[int, int]]:
    """Chunks of `[start, end)` ending at multiples of `chunk` or at `end`."""
    out, at = [], start
    while at < end:
        nxt = min(end, (at // chunk + 1) * chunk)
        out.append((at, nxt))
        at = nxt
    return out


def sync(device) -> None:
    """Waits for the device's queued work (pages the connector reads must be written)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def cache_argument(model) -> str:
    """The name `model.forward` takes its cache by: `cache`, or `past_key_values` where
    the installed transformers predates that name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def forward(model, tokens: list[int], start: int, cache, device, *, hidden: bool = False):
    """Logits of tokens `[start, start + len(tokens))`, the cache holding `[0, start)`;
    with `hidden`, also the last hidden states (`[len(tokens), hidden_size]`, what a
    drafter reads). Positions are explicit."""
    ids = torch.tensor([tokens], device=device)
    positions = torch.arange(start, start + len(tokens), device=device).unsqueeze(0)
    out = model(
        input_ids=ids,
        position_ids=positions,
        use_cache=True,
        output_hidden_states=hidden,
        **{cache_argument(model): cache},
    )
    return (out.logits[0], out.hidden_states[-1][0]) if hidden else out.logits[0]


@dataclass
class Served:
    """What serving one prompt gave."""

    request_id: int
    start: int  # first token computed here (the resume point after a filled load)
    offer: int  # extra tokens `reserve` offered (0 without a connector)
    filled: bool | None  # the load's report; None when nothing was loaded
    logits: torch.Tensor  # rows for positions start .. P + decode - 1
    generated: list[int]  # greedy tokens: argmax of the last prompt row, then each decode row
    first_cache: list | None = None  # (keys, values) per layer of the first forward pass's cache
    trace: list | None = None  # a drafting instance's record of every step (`models.drafter`)


@dataclass
class Request:
    rid: int
    tokens: list[int]  # the prompt, then the decoded tokens as they are fed back
    prompt_len: int
    tables: list[list[int]]
    dropped: list[tuple[int, int]] = field(default_factory=list)


class Instance:
    """One serving instance: a model, its paged KV and optionally a connector."""

    def __init__(
        self,
        spec: ModelSpec,
        model,
        layout: dict,
        *,
        api=None,
        pool=None,
        config: dict | None = None,
        num_pages: int = 256,
        chunk: int = 40,
        missing_pages: str = "error",
    ):
        self.spec, self.model, self.layout = spec, model, layout
        self.device = next(model.parameters()).device
        self.t = layout["tokens_per_block"]
        self.chunk = chunk
        self.zeros_for_missing = missing_pages == "zeros"
        self.paged = PagedKv(spec, layout, num_pages, self.device)
        # R as configured; without it (or without a connector) window pages are given up
        # as soon as no later token reads them.
        self.rewind = (config or {}).get("planner", {}).get("swa_endpoint_rewind_tokens", 0)
        self.api = api
        self.conn = None
        if api is not None:
            self.conn = api.Connector(
                layout=api.Layout.from_dict(layout),
                kv_caches=self.paged.tensors,
                pool=pool,
                config=config,
                model_key=layout["name"],
            )
        self.next_rid = 1
        self.next_reservation = 1
        # Pages that loads reported filled were asked to fill (R15's blocks, all groups).
        self.pages_filled = 0
        self.unfreed: dict[int, Request] = {}  # finished requests whose saves are pending
        self.kept: dict[int, Request] = {}  # finished requests served with `keep_pages`

    # -- pages -------------------------------------------------------------------------

    def _ensure(self, req: Request, group: int, block: int) -> None:
        table = req.tables[group]
        while len(table) <= block:
            table.append(-1)
        if table[block] < 0:
            table[block] = self.paged.allocate(group)

    def _drop(self, req: Request, group: int, block: int) -> None:
        page = req.tables[group][block]
        if page >= 0:
            req.dropped.append((group, page))
            req.tables[group][block] = -1

    def _drop_out_of_window(self, req: Request, computed: int) -> None:
        for gi, g in enumerate(self.layout["groups"]):
            if g["kind"] != "window":
                continue
            keep_from = max(0, computed - g["window_tokens"] - self.rewind)
            sink_blocks = -(-g["sink_tokens"] // self.t)
            for block in range(sink_blocks, min(keep_from // self.t, len(req.tables[gi]))):
                self._drop(req, gi, block)

    def load_blocks(self, group: dict, start: int, end: int) -> list[int]:
        """Blocks a load resuming at `end` fills (R15), from `start` on."""
        first = start // self.t
        if group["kind"] == "full":
            return list(range(first, end // self.t))
        sinks = range(-(-group["sink_tokens"] // self.t))
        tail = range(max(0, end - group["window_tokens"]) // self.t, end // self.t)
        return sorted({b for b in (*sinks, *tail) if b >= first})

    # -- hooks -------------------------------------------------------------------------

    def _step(self, req: Request, before: int, after: int, reservation=None) -> None:
        if self.conn is None:
            return
        sync(self.device)
        self.conn.on_step(
            [
                self.api.StepRequest(
                    req.rid,
                    req.prompt_len,
                    before,
                    after,
                    new_reservation=reservation,
                    page_tables=[list(t) for t in req.tables],
                )
            ]
        )

    def _reserve(self, req: Request, computed: int, reservation: int) -> int:
        deadline = time.monotonic() + WAIT_S
        while True:
            answer = self.conn.reserve(req.rid, computed, reservation)
            if answer is not None:
                return answer[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"reserve({req.rid}) still pending after {WAIT_S} s")
            self.conn.wait_for_progress(0.01)

    def _wait_load(self, reservation: int) -> bool:
        deadline = time.monotonic() + WAIT_S
        while True:
            for rid, _request, filled in self.conn.finished_loads():
                if rid == reservation:
                    return filled
            if time.monotonic() > deadline:
                raise TimeoutError(f"load {reservation} not reported after {WAIT_S} s")
            self.conn.wait_for_progress(0.01)

    def _load(self, req: Request, extra: int) -> tuple[int, bool]:
        """Loads `[0, extra)` into fresh pages; returns (resume point, filled)."""
        reservation = self.next_reservation
        self.next_reservation += 1
        pages = 0
        for gi, g in enumerate(self.layout["groups"]):
            for block in self.load_blocks(g, 0, extra):
                self._ensure(req, gi, block)
                pages += 1
            while len(req.tables[gi]) < extra // self.t:
                req.tables[gi].append(-1)
        self._step(req, 0, 0, reservation)
        filled = self._wait_load(reservation)
        if filled:
            self.pages_filled += pages
            return extra, True
        self.conn.release(req.rid, reservation, 0, extra)
        for gi, g in enumerate(self.layout["groups"]):
            if g["kind"] == "window":
                for block in range(len(req.tables[gi])):
                    self._drop(req, gi, block)
        return 0, False

    def reap(self) -> None:
        """Frees the pages of finished requests whose saves are done."""
        done = set(self.conn.finished_saves()) if self.conn is not None else set()
        for rid in [r for r in self.unfreed if r in done]:
            self._free(self.unfreed.pop(rid))

    def _free(self, req: Request) -> None:
        for gi, table in enumerate(req.tables):
            for page in table:
                if page >= 0:
                    self.paged.release(gi, page)
        for gi, page in req.dropped:
            self.paged.release(gi, page)

    def _reuse_local(self, req: Request, source: Request, end: int) -> None:
        """Local prefix reuse (an engine's own prefix cache, no connector): copies the pages
        of `source`, a request kept with `keep_pages`, that a resume at `end` reads (R15's
        blocks of every group) into fresh pages of `req`."""
        assert self.conn is None, "local reuse is for instances without a connector"
        for gi, g in enumerate(self.layout["groups"]):
            for block in self.load_blocks(g, 0, end):
                self._ensure(req, gi, block)
                self.paged.tensors[gi][req.tables[gi][block]] = self.paged.tensors[gi][source.tables[gi][block]]
            while len(req.tables[gi]) < end // self.t:
                req.tables[gi].append(-1)

    # -- serving -----------------------------------------------------------------------

    def _target_pass(self, req: Request, start: int, tokens: list[int], first_cache: list | None, hidden=False):
        """One forward pass of the target over `tokens` at `start`, its K/V paged; the
        logits (and with `hidden` the last hidden states). Pages of every group are
        allocated for the tokens' blocks."""
        end = start + len(tokens)
        for gi in range(len(req.tables)):
            for block in range(start // self.t, (end - 1) // self.t + 1):
                self._ensure(req, gi, block)
        cache = self.paged.build_cache(self.model.config, req.tables, start, self.zeros_for_missing)
        if first_cache is not None and not first_cache:
            first_cache.extend((layer.keys, layer.values) for layer in cache.layers)
        out = forward(self.model, tokens, start, cache, self.device, hidden=hidden)
        self.paged.write(req.tables, start, cache.added)
        return out

    def _report(self, req: Request, start: int, end: int) -> None:
        """Tells the connector `[start, end)` is computed (and paged), then drops the window
        pages no later token reads."""
        self._step(req, start, end)
        self._drop_out_of_window(req, end)

    def _compute(self, req: Request, start: int, tokens: list[int], first_cache: list | None):
        """One forward pass over `tokens` at `start`; pages its K/V, reports the step."""
        logits = self._target_pass(req, start, tokens, first_cache)
        self._report(req, start, start + len(tokens))
        return logits

    def _generate(self, req: Request, start: int, decode: int, first_cache: list):
        """Computes the prompt from `start` in chunks, then decodes `decode` tokens greedily.
        Returns (logits rows, greedy tokens, trace: None here)."""
        rows = []
        for lo, hi in chunk_bounds(start, len(req.tokens), self.chunk):
            rows.append(self._compute(req, lo, req.tokens[lo:hi], first_cache))
        generated = [int(rows[-1][-1].argmax())]
        for _ in range(decode):
            position = len(req.tokens)
            req.tokens.append(generated[-1])
            rows.append(self._compute(req, position, [generated[-1]], first_cache))
            generated.append(int(rows[-1][-1].argmax()))
        return rows, generated, None

    @torch.no_grad()
    def serve(
        self,
        tokens: list[int],
        *,
        decode: int = 16,
        after_load=None,
        keep_pages: bool = False,
        reuse: tuple[int, int] | None = None,
    ) -> Served:
        """Serves one prompt: lookup, load what the pool offers, compute the rest in
        chunks, decode `decode` tokens greedily. `after_load(request)` runs once the load
        is settled (negative controls tamper there). `keep_pages`: the request's pages
        stay allocated after it ends (another test reads them, or `reuse` does).
        `reuse=(request_id, end)`: without a connector, resume at `end` from the pages of
        that kept request (local prefix reuse)."""
        req = Request(self.next_rid, list(tokens), len(tokens), [[] for _ in self.layout["groups"]])
        self.next_rid += 1
        start, offer, filled = 0, 0, None
        if self.conn is not None:
            self.conn.lookup(req.rid, req.tokens)
            self.conn.flush()
            offer = self._reserve(req, 0, self.next_reservation)
            if offer > 0:
                start, filled = self._load(req, offer)
        elif reuse is not None:
            self._reuse_local(req, self.kept[reuse[0]], reuse[1])
            start = reuse[1]
        if after_load is not None:
            after_load(req)
        first_cache: list = []
        rows, generated, trace = self._generate(req, start, decode, first_cache)
        self._finish(req, keep_pages)
        return Served(req.rid, start, offer, filled, torch.cat(rows), generated, first_cache, trace)

    def _finish(self, req: Request, keep_pages: bool) -> None:
        keep_for_saves = self.conn.request_finished(req.rid) if self.conn is not None else False
        if keep_pages:
            self.kept[req.rid] = req
            return
        if keep_for_saves:
            self.unfreed[req.rid] = req
        else:
            self._free(req)
        if self.conn is not None:
            self.reap()

    def settle(self) -> None:
        """Waits until every save the connector took is settled, then frees pages."""
        if self.conn is not None:
            self.conn.settle_saves()
            self.reap()

    def close(self) -> dict:
        return self.conn.shutdown() if self.conn is not None else {}


@torch.no_grad()
def native_run(model, tokens: list[int], *, chunk: int, decode: int = 16, snapshot_at: int | None = None):
    """The baseline: transformers' own `DynamicCache`, carried from chunk to chunk, the
    same chunk boundaries, no reuse. Returns (logits of every position, greedy tokens,
    the cache's (keys, values) per layer when `snapshot_at` tokens were computed)."""
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    rows, snapshot = [], None
    for lo, hi in chunk_bounds(0, len(tokens), chunk):
        if lo == snapshot_at:
            snapshot = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        rows.append(forward(model, tokens[lo:hi], lo, cache, device))
    generated = [int(rows[-1][-1].argmax())]
    for i in range(decode):
        rows.append(forward(model, [generated[-1]], len(tokens) + i, cache, device))
        generated.append(int(rows[-1][-1].argmax()))
    return torch.cat(rows), generated, snapshot
