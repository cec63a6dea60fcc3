"""The worker's KV memory as the connector's page tensors.

vLLM keeps all KV cache groups in one allocation: the groups overlay each other from byte
0, and a block id belongs to one group at a time. The runtime needs one page-major
tensor per layout group, and no two of them may overlap. So:

- the **primary group** (the first full-attention group, where almost all the bytes
  are) is registered in place: with a block-outermost layout (`BLHNC` / `BLNHC`) block
  `b` of the group is one contiguous run of all its layers' pages, so the whole
  allocation is a C-contiguous `[num_blocks, page_bytes]` uint8 tensor. Loads write
  vLLM's blocks directly and saves read them;
- every other group (sliding windows) gets **bounce pages** of its own, a small
  page-major tensor on the same device: a window save copies the block's pages of the
  group's layers there first, and a window load lands there and is copied into vLLM's
  blocks when it is reported filled. Window groups move only the pages of one window
  per prompt (R15, R17), so the bounce pool stays small.

Invariants:

- `vllm::pages::P1`. A bounce page is in at most one owner's list, or free.
- `vllm::pages::P2`. A bounce page handed to the runtime (a load or a save) is not reused
  before that load is reported or that request's saves settle.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from ._config import DEFAULT_BOUNCE_PAGES, MAX_BOUNCE_PAGES
from ._layout import BLOCK_OUTERMOST_LAYOUTS, LayoutPlan, UnsupportedVllmSetup


def _storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage under `tensor` as a 1-D uint8 tensor."""
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return raw.set_(tensor.untyped_storage())


def _layer_block_bytes(view: torch.Tensor, num_blocks: int, page_bytes: int, name: str):
    """`[num_blocks, page_bytes]` uint8 over one layer's cache: row b holds block b's
    bytes in memory order. Refuses a layer whose page is not one dense run."""
    if view.dim() < 2 or view.shape[0] != num_blocks:
        raise UnsupportedVllmSetup(
            f"layer {name}: KV cache of shape {tuple(view.shape)}, expected {num_blocks} blocks in dim 0"
        )
    elt = view.element_size()
    span = 1 + sum(s * (n - 1) for s, n in zip(view.stride()[1:], view.shape[1:]))
    if span * elt != page_bytes or math.prod(view.shape[1:]) * elt != page_bytes:
        raise UnsupportedVllmSetup(
            f"layer {name}: a block's KV is not one contiguous run of {page_bytes} bytes "
            f"(strides {view.stride()}); set VLLM_KV_CACHE_LAYOUT to {BLOCK_OUTERMOST_LAYOUTS[0]}"
        )
    raw = _storage_bytes(view)
    start = view.data_ptr() - raw.data_ptr()
    return raw.as_strided((num_blocks, page_bytes), (view.stride(0) * elt, 1), start), start


def bounce_pages_needed(plan: LayoutPlan, max_model_len: int, runtime: dict) -> int:
    """Bounce pages per window group when the extra config sets none: room for two prompts
    of `max_model_len` tokens at once, each holding the windows of every checkpoint it
    passes (R28, held until its saves settle) and its tail at the prompt end (`W + R`
    back, R17), and never fewer than DEFAULT_BOUNCE_PAGES. Only what the runtime saves
    is bounced, so no chunk size enters (a long last chunk bounces one tail)."""
    t = plan.tokens_per_block
    rewind = int(runtime["planner"]["swa_endpoint_rewind_tokens"])
    interval = int(runtime["saver"]["window_checkpoint_tokens"])
    checkpoints = max_model_len // interval if interval > 0 else 0
    needed = 0
    for g in plan.groups:
        if g.kind != "window" or g.window_tokens is None:
            continue
        tail = -(-(g.window_tokens + rewind) // t) + 1
        window = -(-g.window_tokens // t) + 1
        needed = max(needed, 2 * (tail + checkpoints * window))
    return min(MAX_BOUNCE_PAGES, max(DEFAULT_BOUNCE_PAGES, needed))


class WorkerPages:
    """Page tensors of one worker (see the module doc)."""

    def __init__(self, plan: LayoutPlan, kv_caches: dict, num_blocks: int, bounce_pages: int):
        self.plan = plan
        self.num_blocks = num_blocks
        fulls = [i for i, g in enumerate(plan.groups) if g.kind == "full"]
        if len(fulls) > 1:
            raise UnsupportedVllmSetup(
                f"{len(fulls)} full-attention KV cache groups; the connector maps one onto "
                "vLLM's memory (models with more full than sliding layers are split by vLLM "
                "into several; serve them with one group per attention type)"
            )
        self.primary = fulls[0]
        # Per group, per layer: [num_blocks, layer_page_bytes] byte rows in vLLM's memory.
        self.layer_rows: list[list[torch.Tensor]] = []
        starts: list[list[int]] = []
        for g in plan.groups:
            missing = [n for n in g.layer_names if n not in kv_caches]
            if missing:
                raise UnsupportedVllmSetup(f"register_kv_caches got no tensor for layers {missing}")
            rows, group_starts = [], []
            for name in g.layer_names:
                view, start = _layer_block_bytes(kv_caches[name], num_blocks, g.layer_page_bytes, name)
                rows.append(view)
                group_starts.append(start)
            self.layer_rows.append(rows)
            starts.append(group_starts)
        self.device = self.layer_rows[0][0].device
        self.tensors: list[torch.Tensor] = []
        self.free: list[deque[int]] = []
        for index, g in enumerate(plan.groups):
            if index == self.primary:
                self.tensors.append(self._in_place(index, starts[index]))
                self.free.append(deque())
            else:
                self.tensors.append(torch.zeros((bounce_pages, g.page_bytes), dtype=torch.uint8, device=self.device))
                self.free.append(deque(range(bounce_pages)))

    def _in_place(self, index: int, starts: list[int]) -> torch.Tensor:
        g = self.plan.groups[index]
        rows = self.layer_rows[index]
        first = starts[0]
        dense = all(s == first + i * g.layer_page_bytes for i, s in enumerate(starts)) and all(
            r.stride(0) == g.page_bytes for r in rows
        )
        if not dense:
            raise UnsupportedVllmSetup(
                f"KV cache group {g.vllm_index}: a block's pages of its {len(rows)} layers are not "
                f"one contiguous run (block stride {rows[0].stride(0)} bytes, page {g.page_bytes}); "
                f"set VLLM_KV_CACHE_LAYOUT={BLOCK_OUTERMOST_LAYOUTS[0]}"
            )
        raw = _storage_bytes(rows[0])
        return raw.as_strided((self.num_blocks, g.page_bytes), (g.page_bytes, 1), first)

    # -- bounce pages ------------------------------------------------------------------

    def bounced(self, index: int) -> bool:
        return index != self.primary

    def take(self, index: int) -> int | None:
        """A free bounce page of group `index`, or None when the pool is exhausted."""
        return self.free[index].popleft() if self.free[index] else None

    def give_back(self, index: int, pages) -> None:
        self.free[index].extend(pages)

    def to_bounce(self, index: int, block: int, page: int) -> None:
        """Copies vLLM block `block` of group `index` into bounce page `page`."""
        parts = self.tensors[index][page].view(len(self.layer_rows[index]), -1)
        for layer, rows in enumerate(self.layer_rows[index]):
            parts[layer].copy_(rows[block])

    def from_bounce(self, index: int, page: int, block: int) -> None:
        """Copies bounce page `page` of group `index` into vLLM block `block`."""
        parts = self.tensors[index][page].view(len(self.layer_rows[index]), -1)
        for layer, rows in enumerate(self.layer_rows[index]):
            rows[block].copy_(parts[layer])
