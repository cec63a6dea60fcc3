"""vLLM's KV cache configuration mapped onto a kv_connector layout.

vLLM describes its KV cache as groups of layers sharing a block table
(`KVCacheConfig.kv_cache_groups`), each with a spec (`FullAttentionSpec`,
`SlidingWindowSpec`, ...). Every transferable group becomes one layout group in the same
order: full attention -> `full`, sliding window -> `window` with `window_tokens` = the
spec's `sliding_window`, draft layers (`spec.is_draft`, EAGLE/MTP) keep their kind with
role `draft`. A group's page is all its layers' pages of one block, in layer order, each
layer's page the bytes vLLM keeps for it (`spec.page_size_bytes`), so page bytes are
`len(layers) * spec.page_size_bytes` = `layers * 2 * T * kv_heads * head_dim * dtype`.

Anything else is refused with `UnsupportedVllmSetup`, naming the setting that would work.
"""

from __future__ import annotations

from dataclasses import dataclass

# Layouts whose blocks are one contiguous run of all layers' pages (block outermost).
BLOCK_OUTERMOST_LAYOUTS = ("BLHNC", "BLNHC")


class UnsupportedVllmSetup(ValueError):
    """A vLLM configuration the connector cannot serve; the message names the setting."""


@dataclass(frozen=True)
class GroupPlan:
    """One vLLM KV cache group as the connector sees it."""

    vllm_index: int  # index in KVCacheConfig.kv_cache_groups
    kind: str  # "full" or "window"
    window_tokens: int | None
    layer_names: tuple[str, ...]
    layer_page_bytes: int

    @property
    def page_bytes(self) -> int:
        return self.layer_page_bytes * len(self.layer_names)


@dataclass(frozen=True)
class LayoutPlan:
    """The layout dict for `kv_connector.Layout.from_dict` and the group mapping."""

    layout: dict
    groups: tuple[GroupPlan, ...]
    tokens_per_block: int
    num_vllm_groups: int


def layer_index(name: str) -> int:
    """The layer number in a vLLM layer name ("model.layers.7.self_attn.attn" -> 7)."""
    numbers = [int(part) for part in name.split(".") if part.isdigit()]
    if len(numbers) != 1:
        raise UnsupportedVllmSetup(f"layer name {name!r} does not carry exactly one layer number")
    return numbers[0]


def _spec_kind(spec, index: int) -> tuple[str, int | None]:
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    name = type(spec).__name__
    if isinstance(spec, MLAAttentionSpec):
        raise UnsupportedVllmSetup(
            f"KV cache group {index} uses {name} (MLA): its latent pages have no separate "
            "K and V; serve an attention model with separate K/V heads"
        )
    if isinstance(spec, SlidingWindowSpec):
        if type(spec) is not SlidingWindowSpec:
            raise UnsupportedVllmSetup(f"KV cache group {index}: {name} is not supported")
        if spec.extra_retained_tokens:
            raise UnsupportedVllmSetup(
                f"KV cache group {index}: sliding window with extra_retained_tokens="
                f"{spec.extra_retained_tokens} (multi-token speculative prefill) is not supported"
            )
        return "window", spec.sliding_window
    if isinstance(spec, ChunkedLocalAttentionSpec):
        raise UnsupportedVllmSetup(
            f"KV cache group {index}: chunked local attention (attention_chunk_size="
            f"{spec.attention_chunk_size}) is not supported"
        )
    if isinstance(spec, FullAttentionSpec):
        if spec.sliding_window is not None or spec.attention_chunk_size is not None:
            raise UnsupportedVllmSetup(
                f"KV cache group {index} holds sliding-window layers as full attention "
                "(the hybrid KV cache manager is off); leave "
                "--disable-hybrid-kv-cache-manager unset so window layers form their own groups"
            )
        return "full", None
    raise UnsupportedVllmSetup(
        f"KV cache group {index} uses {name}; only full-attention and sliding-window "
        "attention groups are supported (no Mamba, encoder or cross-attention caches)"
    )


def _check_spec(spec, index: int, block_size: int) -> None:
    from vllm.v1.kv_cache_interface import KVQuantMode

    if spec.block_size != block_size:
        raise UnsupportedVllmSetup(
            f"KV cache group {index} has block_size {spec.block_size}, group 0 {block_size}; "
            "one --block-size for every group is needed"
        )
    if spec.kv_quant_mode != KVQuantMode.NONE:
        raise UnsupportedVllmSetup(
            f"KV cache group {index} is quantized ({spec.kv_quant_mode.name}); use --kv-cache-dtype auto"
        )
    if spec.head_size_v != spec.head_size:
        raise UnsupportedVllmSetup(
            f"KV cache group {index}: K and V head sizes differ ({spec.head_size} and {spec.head_size_v})"
        )
    if spec.page_size_padded is not None or spec.num_head_slots is not None:
        raise UnsupportedVllmSetup(f"KV cache group {index}: padded or packed pages are not supported")
    if spec.tokens_per_state != 1:
        raise UnsupportedVllmSetup(f"KV cache group {index}: compressed KV states are not supported")
    expected = 2 * spec.block_size * spec.num_kv_heads * spec.head_size * spec.dtype.itemsize
    if spec.page_size_bytes != expected:
        raise UnsupportedVllmSetup(
            f"KV cache group {index}: pages of {spec.page_size_bytes} bytes, expected {expected} "
            "(2 x block_size x kv_heads x head_size x dtype bytes)"
        )


def check_parallelism(vllm_config, pool_backend: str) -> None:
    """Tensor and pipeline parallel ranks run in their own processes (`_ranks`); context
    parallelism is refused, and so is the embedded pool where the scheduler and a worker
    live in different processes (one process's memory cannot be shared by others)."""
    parallel = vllm_config.parallel_config
    for setting, value in (
        ("decode_context_parallel_size", getattr(parallel, "decode_context_parallel_size", 1)),
        ("prefill_context_parallel_size", getattr(parallel, "prefill_context_parallel_size", 1)),
    ):
        if value != 1:
            raise UnsupportedVllmSetup(
                f"{setting}={value}: context-parallel KV shards are not supported; use {setting}=1 "
                "(tensor, pipeline and data parallelism work)"
            )
    one_rank = parallel.tensor_parallel_size == 1 and parallel.pipeline_parallel_size == 1
    backend = parallel.distributed_executor_backend
    if pool_backend != "mooncake" and not (one_rank and backend in (None, "uni")):
        raise UnsupportedVllmSetup(
            f"tensor_parallel_size={parallel.tensor_parallel_size}, pipeline_parallel_size="
            f"{parallel.pipeline_parallel_size}, distributed_executor_backend={backend!r}: the "
            "scheduler and the workers run in separate processes, which the embedded memory pool "
            'cannot span; set pool.backend = "mooncake" (kvc: {"pool": {"backend": "mooncake"}}), '
            "or serve one rank with --distributed-executor-backend uni"
        )


def layout_kv_heads(per_rank: int, tp: int, total: int | None, index: int) -> int:
    """The model's KV heads for the layout (it keys shards by rank, R3), given vLLM's heads
    per rank: `total` when it splits into `per_rank` a rank (or replicates, tp > total)."""
    for heads in (total, per_rank * tp):
        if not heads:
            continue
        if heads % tp == 0 and heads // tp == per_rank:
            return heads
        if heads < tp and tp % heads == 0 and per_rank == 1:
            return heads
    raise UnsupportedVllmSetup(
        f"KV cache group {index}: {per_rank} KV heads per rank do not split the model's "
        f"{total} heads over tensor_parallel_size={tp}"
    )


def plan_layout(
    kv_cache_config, name: str, *, tp: int = 1, stage: int = 0, total_kv_heads: int | None = None
) -> LayoutPlan:
    """The layout of vLLM's KV cache groups on one rank of pipeline stage `stage` (see the
    module doc); refuses what has no layout equivalent. Group ids are
    `stage * len(groups) + index`: every stage has the same groups of its own layers."""
    groups = list(kv_cache_config.kv_cache_groups)
    if not groups:
        raise UnsupportedVllmSetup("the model has no KV cache (attention-free models have nothing to share)")
    transfer = set(getattr(kv_cache_config, "transfer_group_ids", range(len(groups))))
    block_size = groups[0].kv_cache_spec.block_size
    plans: list[GroupPlan] = []
    layout_groups: list[dict] = []
    for index, group in enumerate(groups):
        if index not in transfer:
            raise UnsupportedVllmSetup(f"KV cache group {index} is not transferable (enable_kv_transfer=False)")
        spec = group.kv_cache_spec
        kind, window = _spec_kind(spec, index)
        _check_spec(spec, index, block_size)
        if not group.layer_names:
            raise UnsupportedVllmSetup(f"KV cache group {index} has no layers")
        plans.append(GroupPlan(index, kind, window, tuple(group.layer_names), spec.page_size_bytes))
        entry = {
            "id": stage * len(groups) + index,
            "kind": kind,
            "layers": [layer_index(n) for n in group.layer_names],
            "kv_heads": layout_kv_heads(spec.num_kv_heads, tp, total_kv_heads, index),
            "head_dim": spec.head_size,
            "dtype_bytes": spec.dtype.itemsize,
            "role": "draft" if spec.is_draft or group.is_eagle_group else "target",
        }
        if kind == "window":
            entry["window_tokens"] = window
            entry["sink_tokens"] = 0
        layout_groups.append(entry)
    if not any(p.kind == "full" for p in plans):
        raise UnsupportedVllmSetup("no full-attention KV cache group: a prefix needs one to be found")
    layout = {"name": name, "tokens_per_block": block_size, "world_size": tp, "groups": layout_groups}
    return LayoutPlan(layout, tuple(plans), block_size, len(groups))
