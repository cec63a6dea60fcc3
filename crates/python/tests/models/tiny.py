"""Tiny, seeded transformers models and their kv_connector layouts.

Each model is built from a config written here (nothing is downloaded): fp32, eval mode,
random initialisation under a fixed seed. `layout(spec)` maps its layers to layout groups:
full-attention layers form one "full" group, sliding-window layers one "window" group.

What the window group's numbers mean, per transformers' sliding-window mask
(`masking_utils.sliding_window_overlay`: key k is visible to query q when
`q - W < k <= q`):
- a query at position q reads the keys of the last W positions, itself included, so a
  request resuming at e needs the keys of [e - W + 1, e): transformers'
  `DynamicSlidingWindowLayer` keeps exactly those W - 1 tokens. The layout's
  `window_tokens` is W: the connector loads the blocks overlapping [e - W, e) (R15), a
  superset of what the model reads.
- `sink_tokens` is 0 for every model here. GPT-OSS's "sinks" are learned per-head logits
  (`GptOssAttention.sinks`, one extra softmax column that is dropped after the softmax),
  not token positions every query keeps attending to; Gemma 3 and Llama have no sinks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

TOKENS_PER_BLOCK = 16
VOCAB = 512
# Weights drawn with this standard deviation (transformers' default is 0.02): a larger one
# makes the random models react to a wrong cache entry by more than rounding noise.
INIT_STD = 0.1


@dataclass(frozen=True)
class ModelSpec:
    """One model style: how to build it and how its layers are typed."""

    name: str
    layer_types: tuple[str, ...]
    sliding_window: int | None
    kv_heads: int
    head_dim: int

    def full_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    def window_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "sliding_attention"]


GPT_OSS = ModelSpec(
    name="gpt-oss",
    # GPT-OSS alternates sliding and full attention, sliding first.
    layer_types=("sliding_attention", "full_attention") * 2,
    sliding_window=32,
    kv_heads=2,
    head_dim=16,
)
GEMMA3 = ModelSpec(
    name="gemma3",
    # Gemma 3: five local (sliding) layers per global layer. A window of 40 tokens is not a
    # whole number of blocks, so partial window blocks are exercised.
    layer_types=("sliding_attention",) * 5 + ("full_attention",),
    sliding_window=40,
    kv_heads=2,
    head_dim=16,
)
LLAMA = ModelSpec(
    name="llama",
    layer_types=("full_attention",) * 3,
    sliding_window=None,
    kv_heads=2,
    head_dim=16,
)
SPECS = {spec.name: spec for spec in (GPT_OSS, GEMMA3, LLAMA)}


def build_model(spec: ModelSpec, device: torch.device | str = "cpu") -> torch.nn.Module:
    """The model of `spec`, fp32, eval mode, seeded random weights, eager attention.

    Also makes torch single-threaded: these matrices are too small to gain from threads,
    and on a busy machine OpenMP's waiting threads made a forward pass about ten times
    slower (measured on 2 cores)."""
    torch.set_num_threads(1)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=len(spec.layer_types),
        num_attention_heads=4,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=4096,
        initializer_range=INIT_STD,
        layer_types=list(spec.layer_types),
    )
    torch.manual_seed(1234)
    if spec is GPT_OSS:
        config = GptOssConfig(
            **common,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=spec.sliding_window,
        )
        model = GptOssForCausalLM(config)
    elif spec is GEMMA3:
        config = Gemma3TextConfig(
            **common,
            intermediate_size=128,
            query_pre_attn_scalar=spec.head_dim,
            sliding_window=spec.sliding_window,
        )
        model = Gemma3ForCausalLM(config)
    else:
        common.pop("layer_types")
        model = LlamaForCausalLM(LlamaConfig(**common, intermediate_size=128))
    # Eager attention everywhere: GPT-OSS has no SDPA path (its sinks), and one kernel
    # family for all three keeps the comparison about the cache, not the kernels.
    model.config._attn_implementation = "eager"
    return model.to(device=device, dtype=torch.float32).eval()


def layout(
    spec: ModelSpec, *, window_tokens: int | None = None, name: str | None = None, drafter: bool = False
) -> dict:
    """The kv_connector layout of `spec`: group 0 = full-attention layers, group 1 (hybrid
    models only) = sliding-window layers. `window_tokens` overrides W (negative controls
    only: a layout whose window is shorter than the model's). `drafter`: one more group,
    the draft head's single layer (`models.drafter`), `role = "draft"` (R6), layer 0 of
    the draft model, a full group like the `-eagle` presets' draft group."""
    groups = [
        {
            "id": 0,
            "kind": "full",
            "layers": spec.full_layers(),
            "kv_heads": spec.kv_heads,
            "head_dim": spec.head_dim,
            "dtype_bytes": 4,
        }
    ]
    if spec.window_layers():
        groups.append(
            {
                "id": 1,
                "kind": "window",
                "window_tokens": window_tokens or spec.sliding_window,
                "sink_tokens": 0,
                "layers": spec.window_layers(),
                "kv_heads": spec.kv_heads,
                "head_dim": spec.head_dim,
                "dtype_bytes": 4,
            }
        )
    if drafter:
        groups.append(
            {
                "id": len(groups),
                "kind": "full",
                "role": "draft",
                "layers": [0],
                "kv_heads": spec.kv_heads,
                "head_dim": spec.head_dim,
                "dtype_bytes": 4,
            }
        )
    return {
        "name": name or f"tiny-{spec.name}" + ("-eagle" if drafter else ""),
        "tokens_per_block": TOKENS_PER_BLOCK,
        "world_size": 1,
        "groups": groups,
    }
