"""vLLM's real scheduler on CPU driving `kv_connector.vllm.KvcConnector`, with the KV of
the tiny real transformers models (tests/models) in vLLM's own KV memory.

`VllmInstance` is one engine: vLLM's `Scheduler` (with the scheduler side of the
connector, built by vLLM's connector factory), the worker side of the connector on KV
tensors laid out exactly as vLLM's model runner lays them out (`get_kv_cache_config_
from_groups` + `create_kv_cache_views` over one allocation, groups aliasing from byte 0,
layout BLHNC), and a model runner that calls the worker hooks in vLLM's order and
computes each scheduled chunk with the tiny model, reading and writing the KV in vLLM's
blocks. Nothing of vLLM is imitated but the model runner itself.

A layer's block is `[kv_heads, T, 2 * head_dim]` float32 (vLLM's `[H, N, C]` with
C = K then V). Fresh memory is NaN, so a block read before anything wrote it poisons
the logits.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from transformers import DynamicCache

from models.engine import chunk_bounds, forward
from models.paged import RecordingCache
from models.tiny import TOKENS_PER_BLOCK, ModelSpec

T = TOKENS_PER_BLOCK
STEP_LIMIT = 2000  # a hang guard for loops over scheduler steps, not a timing check


def write_model_dir(spec: ModelSpec, path) -> str:
    """A local config dir of `spec` for vLLM's ModelConfig (no weights: the scheduler
    never loads them; the test's model runner builds the model from tests/models)."""
    from models import tiny

    model = tiny.build_model(spec)
    model.config.save_pretrained(path)
    return str(path)


def write_eagle_dir(path) -> str:
    """A config dir of an EAGLE head for the tiny models (one Llama layer; no weights: the
    test's model runner never drafts through vLLM)."""
    from transformers import LlamaConfig

    from models import tiny

    config = LlamaConfig(vocab_size=tiny.VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=4096)
    config.architectures = ["EagleLlamaForCausalLM"]
    config.save_pretrained(path)
    return str(path)


def vllm_config(model_dir: str, *, extra: dict, engine_id: str | None = None, budget: int = 40,
                max_seqs: int = 4, prefix_caching: bool = False, eagle_dir: str | None = None):
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=1024, seed=0)
    kt = KVTransferConfig(
        kv_connector="KvcConnector",
        kv_connector_module_path="kv_connector.vllm",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        engine_id=engine_id or str(uuid.uuid4()),
        kv_connector_extra_config=extra,
    )
    parallel = ParallelConfig(distributed_executor_backend="uni")
    speculative = None
    if eagle_dir is not None:  # vLLM's EAGLE: k = 3 drafts a step from the head in eagle_dir
        from vllm.config import SpeculativeConfig

        speculative = SpeculativeConfig(method="eagle", model=eagle_dir, num_speculative_tokens=3,
                                        target_model_config=model, target_parallel_config=parallel)
    config = VllmConfig(
        model_config=model,
        speculative_config=speculative,
        cache_config=CacheConfig(block_size=T, cache_dtype="auto", enable_prefix_caching=prefix_caching),
        scheduler_config=SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=1024,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=parallel,
        kv_transfer_config=kt,
        device_config=DeviceConfig("cpu"),
    )
    # vLLM's CPU platform picks the multiprocessing executor; on a GPU a one-rank
    # engine runs its worker in the engine process ("uni"), as the connector needs.
    config.parallel_config.distributed_executor_backend = "uni"
    return config


def layer_name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def kv_cache_config(config, spec: ModelSpec, num_blocks: int):
    """vLLM's KVCacheConfig of `spec`: a full-attention group and, for hybrid models, a
    sliding-window group, from vLLM's own planner (BLHNC layout). With a speculative
    config, the groups are those vLLM's planner makes of the target's layers and the EAGLE
    head's one layer (named after the target's last, `is_draft`, as vLLM's EAGLE models
    register it)."""
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec

    common = dict(block_size=T, num_kv_heads=spec.kv_heads, head_size=spec.head_dim, dtype=torch.float32)
    groups = [KVCacheGroupSpec([layer_name(i) for i in spec.full_layers()], FullAttentionSpec(**common))]
    if spec.window_layers():
        groups.append(KVCacheGroupSpec([layer_name(i) for i in spec.window_layers()],
                                       SlidingWindowSpec(**common, sliding_window=spec.sliding_window)))
    config.cache_config.kv_cache_layout = "BLHNC"
    if config.speculative_config is not None:
        layers = {name: g.kv_cache_spec for g in groups for name in g.layer_names}
        layers[layer_name(len(spec.layer_types))] = FullAttentionSpec(**common, is_draft=True)
        groups = get_global_kv_cache_groups(config, [layers])
    per_block = max(len(g.layer_names) for g in groups) * groups[0].kv_cache_spec.page_size_bytes
    return get_kv_cache_config_from_groups(config, groups, per_block * num_blocks)


def kv_views(config, kv_config) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The KV memory as vLLM's model runner makes it: one NaN-filled allocation, one
    [B, H, N, C] float32 view per layer."""
    from vllm.v1.kv_cache_interface import create_kv_cache_views

    layout = config.cache_config.get_resolved_kv_cache_layout()
    size = kv_config.kv_cache_tensors[0].size
    raw = torch.full((size // 4,), float("nan"), dtype=torch.float32).view(torch.uint8)
    spec_of = {n: g.kv_cache_spec for g in kv_config.kv_cache_groups for n in g.layer_names}
    views = {}
    for tensor in kv_config.kv_cache_tensors:
        spec = spec_of[tensor.layers[0]]
        for name, view in zip(tensor.layers, create_kv_cache_views(raw, spec, kv_config.num_blocks, layout, tensor)):
            views[name] = view
    return raw, views


class Recorder:
    """Wraps a runtime connector and records what the worker side asked of it: request
    ends and settled saves."""

    def __init__(self, conn):
        self._conn, self.events = conn, []

    def request_finished(self, rid):
        keep = self._conn.request_finished(rid)
        self.events.append(("request_finished", rid, keep))
        return keep

    def finished_saves(self):
        rids = self._conn.finished_saves()
        self.events.extend(("saves_settled", rid, None) for rid in rids)
        return rids

    def __getattr__(self, name):
        return getattr(self._conn, name)


@dataclass
class Served:
    """One request through the engine."""

    req_id: str
    tokens: list[int]
    start: int | None = None  # first position this engine computed
    rows: list[torch.Tensor] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    parked: bool = False  # seen in WAITING_FOR_REMOTE_KVS
    chunks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def logits(self) -> torch.Tensor:
        return torch.cat(self.rows)


class VllmInstance:
    """One engine (see the module doc)."""

    def __init__(self, spec: ModelSpec, model, model_dir: str, *, extra: dict, num_blocks: int = 192, **kw):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        from kv_connector.vllm import KvcConnector

        self.spec, self.model = spec, model
        self.config = vllm_config(model_dir, extra=extra, **kw)
        self.kv_config = kv_cache_config(self.config, spec, num_blocks)
        self.config.cache_config.num_gpu_blocks = self.kv_config.num_blocks
        self.raw, self.views = kv_views(self.config, self.kv_config)
        # The worker first (it registers the KV memory), then the scheduler: EngineCore's order.
        self.worker = KvcConnector(self.config, KVConnectorRole.WORKER, self.kv_config)
        self.worker.register_kv_caches(self.views)
        self.sched = Scheduler(self.config, self.kv_config, StructuredOutputManager(self.config), block_size=T,
                               log_stats=True)
        self.served: dict[str, Served] = {}
        self.block_hasher = None
        if self.config.cache_config.enable_prefix_caching:
            from vllm.utils.hashing import sha256
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

            init_none_hash(sha256)
            self.block_hasher = get_request_block_hasher(T, sha256)
        self.outputs: list = []
        self.stats: list = []
        self.steps = 0

    # -- KV in vLLM's blocks -----------------------------------------------------------

    def _group(self, layer: int) -> tuple[int, int]:
        for gi, g in enumerate(self.kv_config.kv_cache_groups):
            if layer_name(layer) in g.layer_names:
                return gi, g.kv_cache_spec.sliding_window if gi else None
        raise KeyError(layer)

    def _kv(self, layer: int) -> torch.Tensor:
        return self.views[layer_name(layer)]  # [B, H, N, 2D]

    def gather(self, tables, layer: int, lo: int, hi: int):
        gi, _ = self._group(layer)
        view, parts = self._kv(layer), []
        for block in range(lo // T, (hi - 1) // T + 1):
            a, b = max(lo, block * T) - block * T, min(hi, (block + 1) * T) - block * T
            bid = tables[gi][block]
            assert bid != 0, f"layer {layer}: block {block} is read but vLLM holds no block for it"
            parts.append(view[bid, :, a:b])
        kv = torch.cat(parts, dim=1)  # [H, n, 2D]
        d = self.spec.head_dim
        return kv[..., :d].unsqueeze(0).contiguous(), kv[..., d:].unsqueeze(0).contiguous()

    def write(self, tables, start: int, added: dict) -> None:
        n = next(iter(added.values()))[0].shape[2]
        for layer, (k, v) in added.items():
            gi, _ = self._group(layer)
            view = self._kv(layer)
            kv = torch.cat([k[0], v[0]], dim=-1)  # [H, n, 2D]
            for block in range(start // T, (start + n - 1) // T + 1):
                lo, hi = max(start, block * T), min(start + n, (block + 1) * T)
                view[tables[gi][block], :, lo - block * T : hi - block * T] = kv[:, lo - start : hi - start]

    def build_cache(self, tables, computed: int) -> RecordingCache:
        cache = RecordingCache(self.model.config)
        if computed == 0:
            return cache
        for layer, kind in enumerate(self.spec.layer_types):
            lo = max(0, computed - self.spec.sliding_window + 1) if kind == "sliding_attention" else 0
            keys, values = self.gather(tables, layer, lo, computed)
            entry = cache.layers[layer]
            entry.lazy_initialization(keys, values)
            entry.keys, entry.values = keys, values
            if kind == "sliding_attention":
                entry.cumulative_length = computed
        return cache

    # -- the engine loop ---------------------------------------------------------------

    def add(self, req_id: str, tokens: list[int], max_tokens: int = 17, **scope) -> Served:
        """Adds a request; `scope` is vLLM's `cache_salt` and `lora_request`, if any."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        request = Request(req_id, list(tokens), params, None, block_hasher=self.block_hasher, **scope)
        self.sched.add_request(request)
        self.served[req_id] = Served(req_id, list(tokens))
        return self.served[req_id]

    def _forward(self, so, on_forward) -> tuple[list[str], list[list[int]]]:
        """Computes every scheduled chunk with the tiny model, reading and writing the KV
        in vLLM's blocks; the requests run and the tokens sampled."""
        req_ids, sampled = [], []
        scheduled = [(n.req_id, n.num_computed_tokens) for n in so.scheduled_new_reqs]
        scheduled += list(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.num_computed_tokens))
        for req_id, before in scheduled:
            request = self.sched.requests[req_id]
            after = before + so.num_scheduled_tokens[req_id]
            tables = self.sched.kv_cache_manager.get_block_ids(req_id)
            tokens = request.all_token_ids[before:after]
            s = self.served[req_id]
            if s.start is None:
                s.start = before
            s.chunks.append((before, after))
            cache = self.build_cache(tables, before)
            logits = forward(self.model, list(tokens), before, cache, "cpu")
            self.write(tables, before, cache.added)
            if on_forward is not None:
                on_forward(req_id, before, after)
            s.rows.append(logits)
            req_ids.append(req_id)
            if after >= request.num_tokens:
                token = int(logits[-1].argmax())
                s.generated.append(token)
                sampled.append([token])
            else:
                sampled.append([])
        return req_ids, sampled

    def _finish(self, so, req_ids: list[str], sampled: list[list[int]], out) -> None:
        """Hands the step's output to the scheduler and notes which requests parked."""
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import RequestStatus

        if out is not None and out.kv_connector_stats is not None:
            self.stats.append(out.kv_connector_stats)
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled, kv_connector_output=out)
        self.outputs.append(self.sched.update_from_output(so, mro))
        for req_id, request in self.sched.requests.items():
            served = self.served.get(req_id)
            if served is None:
                continue
            # The connector reads vLLM's prompt list uncopied (`append_only`): vLLM may
            # only append to it, never change a prompt token.
            assert request.prompt_token_ids[: len(served.tokens)] == served.tokens, req_id
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                served.parked = True

    @torch.no_grad()
    def step(self, on_forward=None):
        from vllm.v1.outputs import KVConnectorOutput

        self.steps += 1
        so = self.sched.schedule()
        meta = so.kv_connector_metadata
        w = self.worker
        w.bind_connector_metadata(meta)
        w.handle_preemptions(meta)
        req_ids, sampled = self._forward(so, on_forward)
        w.start_load_kv(None)
        w.wait_for_save()
        results = w.get_transfer_results(so.finished_req_ids)
        out = KVConnectorOutput(
            finished_sending=results.finished_sending or None,
            finished_recving=results.finished_recving or None,
            failed_recving=results.failed_recving,
            invalid_block_ids=w.get_block_ids_with_load_errors(),
            kv_connector_stats=w.get_kv_connector_stats(),
        )
        w.clear_connector_metadata()
        self._finish(so, req_ids, sampled, out)
        return so

    def run(self, until, what: str, on_forward=None) -> None:
        for _ in range(STEP_LIMIT):
            if until():
                return
            self.step(on_forward)
            if not self.sched.has_unfinished_requests():
                self.worker._worker.conn.wait_for_progress(0.01)
        raise AssertionError(f"gave up after {STEP_LIMIT} steps waiting for {what}")

    def idle(self) -> bool:
        """No request left, no blocks held for pending saves."""
        return not self.sched.requests

    def serve(self, req_id: str, tokens: list[int], max_tokens: int = 17, **scope) -> Served:
        s = self.add(req_id, tokens, max_tokens, **scope)
        self.run(self.idle, f"request {req_id}")
        return s

    @property
    def conn(self):
        return self.worker._worker.conn

    def close(self) -> dict:
        return self.worker.shutdown() or {}


def native_rows(model, tokens: list[int], chunks: list[tuple[int, int]], decode: int):
    """The no-reuse baseline over the same chunk boundaries: transformers' own cache."""
    cache = DynamicCache(config=model.config)
    rows = []
    with torch.no_grad():
        for lo, hi in chunks:
            rows.append(forward(model, tokens[lo:hi], lo, cache, "cpu"))
        generated = [int(rows[-1][-1].argmax())]
        for i in range(decode):
            rows.append(forward(model, [generated[-1]], len(tokens) + i, cache, "cpu"))
            generated.append(int(rows[-1][-1].argmax()))
    return torch.cat(rows), generated


def baseline_chunks(prompt_len: int, start: int, served_chunks, chunk: int):
    """The prompt's chunks as every instance computes them: multiples of `chunk` below
    `start` (the loaded prefix), then the ones this engine ran."""
    prompt = [c for c in served_chunks if c[0] < prompt_len]
    return chunk_bounds(0, start, chunk) + prompt
