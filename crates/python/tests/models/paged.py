"""Paged KV memory of one serving instance, and transformers caches built from it.

`PagedKv` owns one tensor per layout group, page-major, shaped
`[num_pages, layers_in_group, 2 (K, V), T, kv_heads, head_dim]` (the tensors the connector
registers), and a page allocator per group. A group's `role` (layout R6: "target", the
default, or "draft") says which model its layers belong to; layers are numbered within
their model, so the target's layer 0 and a drafter's layer 0 live in different groups
(`models.drafter` pages the drafter's KV exactly as the target's). The pages are the
instance's only KV store: before every forward pass `build_cache` assembles a transformers
`DynamicCache` from them, and `write` stores the K/V the forward pass produced (captured by `RecordingCache`) back
into them. A sliding layer's cache holds only the keys its next query reads,
`[c - W + 1, c)` for a chunk starting at `c` (what transformers' own
`DynamicSlidingWindowLayer` keeps), with `cumulative_length = c`.

Invariants:
- a page is in at most one request's table, or on the free list;
- a free page is NaN (fresh tensors are, and a released page is filled again), so a
  page read before this request (or a load) wrote it poisons the logits;
- a block whose page index is -1 reads as zeros (the "null page" of a paged engine)
  only where the instance was told to allow it (`missing_pages="zeros"`, negative
  controls); otherwise reading it is an error.
"""

from __future__ import annotations

from collections import deque

import torch
from transformers import DynamicCache

from .tiny import ModelSpec


def role(group: dict) -> str:
    """The model a layout group's layers belong to: "target" (the default) or "draft"."""
    return group.get("role", "target")


class RecordingCache(DynamicCache):
    """A `DynamicCache` that keeps a copy of the K/V every layer adds (post-RoPE), so the
    instance can page them: a sliding layer's own cache would already have dropped part
    of a chunk longer than its window."""

    def __init__(self, config):
        super().__init__(config=config)
        self.added: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.added[layer_idx] = (key_states, value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class PagedKv:
    """Page tensors and allocators of one instance (see the module doc)."""

    def __init__(self, spec: ModelSpec, layout: dict, num_pages: int, device):
        self.spec = spec
        self.t = layout["tokens_per_block"]
        self.groups = layout["groups"]
        self.tensors = [
            torch.full(
                (num_pages, len(g["layers"]), 2, self.t, g["kv_heads"], g["head_dim"]),
                float("nan"),
                dtype=torch.float32,
                device=device,
            )
            for g in self.groups
        ]
        self.free = [deque(range(num_pages)) for _ in self.groups]
        # (role, layer) -> (group position, index of the layer inside its group)
        self.where = {
            (role(g), layer): (gi, li) for gi, g in enumerate(self.groups) for li, layer in enumerate(g["layers"])
        }
        # The attention type of every layer of each model: the drafter's layers are full.
        draft_layers = 1 + max((layer for r, layer in self.where if r == "draft"), default=-1)
        self.layer_types = {"target": spec.layer_types, "draft": ("full_attention",) * draft_layers}

    def allocate(self, group: int) -> int:
        if not self.free[group]:
            raise RuntimeError(f"group {group}: out of pages")
        return self.free[group].popleft()

    def release(self, group: int, page: int) -> None:
        self.tensors[group][page].fill_(float("nan"))
        self.free[group].append(page)

    def write(self, tables: list[list[int]], start: int, added: dict, model: str = "target") -> None:
        """Stores the K/V of tokens `[start, start + n)` of every layer of `model` (`added`:
        layer -> (K, V), each `[1, kv_heads, n, head_dim]`) into the request's pages."""
        n = next(iter(added.values()))[0].shape[2]
        for gi, group in enumerate(self.groups):
            if role(group) != model:
                continue
            # [layers, 2, n, kv_heads, head_dim]
            kv = torch.stack(
                [torch.stack([added[layer][0][0], added[layer][1][0]]).transpose(1, 2) for layer in group["layers"]]
            )
            for block in range(start // self.t, (start + n - 1) // self.t + 1):
                page = tables[gi][block]
                if page < 0:
                    raise RuntimeError(f"group {gi} block {block}: written without a page")
                lo, hi = max(start, block * self.t), min(start + n, (block + 1) * self.t)
                self.tensors[gi][page, :, :, lo - block * self.t : hi - block * self.t] = kv[
                    :, :, lo - start : hi - start
                ]

    def gather(self, tables, layer: int, lo: int, hi: int, zeros_for_missing: bool, model: str = "target"):
        """K and V of `model`'s `layer` for tokens `[lo, hi)`, each `[1, kv_heads, hi - lo,
        head_dim]`."""
        gi, li = self.where[(model, layer)]
        parts = []
        for block in range(lo // self.t, (hi - 1) // self.t + 1):
            a, b = max(lo, block * self.t) - block * self.t, min(hi, (block + 1) * self.t) - block * self.t
            page = tables[gi][block] if block < len(tables[gi]) else -1
            if page >= 0:
                parts.append(self.tensors[gi][page, li, :, a:b])
            elif zeros_for_missing:
                parts.append(torch.zeros_like(self.tensors[gi][0, li, :, a:b]))
            else:
                raise RuntimeError(f"layer {layer}: block {block} is needed but has no page")
        kv = torch.cat(parts, dim=1)  # [2, n, kv_heads, head_dim]
        kv = kv.transpose(1, 2).unsqueeze(1).contiguous()  # [2, 1, kv_heads, n, head_dim]
        return kv[0], kv[1]

    def build_cache(
        self, config, tables, computed: int, zeros_for_missing: bool, model: str = "target"
    ) -> RecordingCache:
        """The cache a forward pass of `model` (its `config`) starting at token `computed`
        reads: full layers hold `[0, computed)`, sliding layers `[computed - W + 1,
        computed)`."""
        cache = RecordingCache(config)
        if computed == 0:
            return cache
        for layer, kind in enumerate(self.layer_types[model]):
            lo = 0
            if kind == "sliding_attention":
                lo = max(0, computed - self.spec.sliding_window + 1)
            keys, values = self.gather(tables, layer, lo, computed, zeros_for_missing, model)
            entry = cache.layers[layer]
            entry.lazy_initialization(keys, values)
            entry.keys, entry.values = keys, values
            if kind == "sliding_attention":
                entry.cumulative_length = computed
        return cache
