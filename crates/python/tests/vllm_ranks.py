"""vLLM's tensor- and pipeline-parallel ranks on CPU, each rank's worker side of
`kv_connector.vllm.KvcConnector` in its own process, with the KV of the tiny real
transformers models (tests/models) in every rank's own KV memory.

`RankedInstance` is `vllm_support.VllmInstance`'s engine with `tp * pp` ranks (global
rank = pp_rank * tp + tp_rank, vLLM's order). Real vLLM: the `Scheduler` in the test
process with the connector's scheduler side (vLLM's connector factory, rank 0's
KVCacheConfig, as EngineCore gives it); the handshake (every rank's
`get_handshake_metadata` into `set_xfer_handshake_metadata_pp_aware`, keyed by (pp_rank,
tp_rank), as EngineCore does); each rank's KVCacheConfig from vLLM's planner (its stage's
layers, `get_pp_indices`; its KV heads, replicated when tp > kv_heads: rank t holds head
t * kv_heads // tp) and its views (`create_kv_cache_views`, BLHNC); the connector in every
rank's process (vLLM's connector factory, the pickled metadata of every step, the hooks in
the model runner's order); `KVOutputAggregator`, merging the ranks' outputs.

The test's own: the model runner, in the test process. It computes each scheduled chunk
with the tiny model, reading and writing K/V directly in the ranks' memory (one
NaN-filled shared-memory allocation per rank): head h of a layer lives on the ranks of
the layer's stage whose shard holds h. Replicas are all written, and all read, and must
agree bit for bit, so a load gone wrong on one rank cannot hide behind another's copy.
Steps are synchronous: one batch in flight, even where PP would let vLLM run two.

Rank processes come from a forkserver (torch, vLLM and the connector imported, never a
Connector), so nothing of the parent's connectors is forked.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
import time
import traceback
import uuid
from collections import Counter

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch

import vllm_support as vs
from models.tiny import ModelSpec
from vllm_support import STEP_LIMIT, Served, T, layer_name

# Generous bound for a rank's answer; never a timing check.
PATIENCE_S = 120.0
IDLE_SLEEP_S = 0.01

_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["vllm_ranks", "kv_connector.vllm", "vllm.v1.outputs"])


def ranked_config(model_dir: str, *, extra: dict, tp: int, pp: int, engine_id=None, budget=40, max_seqs=4):
    """vllm_support's configuration with `tp` x `pp` ranks on the multiprocessing backend."""
    import vllm.config as vc

    model = vc.ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=1024, seed=0)
    connector = dict(kv_connector="KvcConnector", kv_connector_module_path="kv_connector.vllm", kv_role="kv_both")
    connector.update(kv_load_failure_policy="recompute", engine_id=engine_id or str(uuid.uuid4()))
    kt = vc.KVTransferConfig(**connector, kv_connector_extra_config=extra)
    limits = dict(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=1024)
    scheduler = vc.SchedulerConfig(**limits, enable_chunked_prefill=True, is_encoder_decoder=False)
    parallel = vc.ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp, distributed_executor_backend="mp")
    cache = vc.CacheConfig(block_size=T, cache_dtype="auto", enable_prefix_caching=False)
    parts = dict(model_config=model, cache_config=cache, scheduler_config=scheduler, parallel_config=parallel)
    config = vc.VllmConfig(**parts, kv_transfer_config=kt, device_config=vc.DeviceConfig("cpu"))
    config.cache_config.kv_cache_layout = "BLHNC"
    return config


def stage_layers(spec: ModelSpec, pp: int, pp_rank: int) -> range:
    from vllm.distributed.utils import get_pp_indices

    return range(*get_pp_indices(len(spec.layer_types), pp_rank, pp))


def head_shard(kv_heads: int, tp: int, tp_rank: int) -> list[int]:
    """The KV heads of TP rank `tp_rank` (vLLM replicates heads when tp > kv_heads)."""
    if tp > kv_heads:
        return [tp_rank * kv_heads // tp]
    per = kv_heads // tp
    return list(range(tp_rank * per, (tp_rank + 1) * per))


def rank_kv_config(config, spec: ModelSpec, num_blocks: int, pp_rank: int):
    """vLLM's KVCacheConfig of one rank: its stage's layers (global names), its heads."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec

    p = config.parallel_config
    layers = stage_layers(spec, p.pipeline_parallel_size, pp_rank)
    heads = max(1, spec.kv_heads // p.tensor_parallel_size)
    common = dict(block_size=T, num_kv_heads=heads, head_size=spec.head_dim, dtype=torch.float32)
    full = [layer_name(i) for i in spec.full_layers() if i in layers]
    groups = [KVCacheGroupSpec(full, FullAttentionSpec(**common))]
    if spec.window_layers():
        window = [layer_name(i) for i in spec.window_layers() if i in layers]
        groups.append(KVCacheGroupSpec(window, SlidingWindowSpec(**common, sliding_window=spec.sliding_window)))
    per_block = max(len(g.layer_names) for g in groups) * groups[0].kv_cache_spec.page_size_bytes
    return get_kv_cache_config_from_groups(config, groups, per_block * num_blocks)


def shared_raw(kv_config) -> torch.Tensor:
    """A rank's KV memory: one NaN-filled allocation in shared memory, as bytes."""
    size = kv_config.kv_cache_tensors[0].size
    return torch.full((size // 4,), float("nan"), dtype=torch.float32).share_memory_().view(torch.uint8)


def views_of(config, kv_config, raw: torch.Tensor) -> dict[str, torch.Tensor]:
    """vLLM's [B, H, N, C] float32 view of every layer over `raw` (vllm_support.kv_views)."""
    from vllm.v1.kv_cache_interface import create_kv_cache_views

    layout = config.cache_config.get_resolved_kv_cache_layout()
    spec_of = {n: g.kv_cache_spec for g in kv_config.kv_cache_groups for n in g.layer_names}
    views = {}
    for tensor in kv_config.kv_cache_tensors:
        spec = spec_of[tensor.layers[0]]
        views.update(zip(tensor.layers, create_kv_cache_views(raw, spec, kv_config.num_blocks, layout, tensor)))
    return views


# ---- the rank process --------------------------------------------------------------


def _end_step(w, finished_req_ids: set[str]):
    """The model runner's hooks after the forward, its KVConnectorOutput in a ModelRunnerOutput."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    w.start_load_kv(None)
    w.wait_for_save()
    results = w.get_transfer_results(finished_req_ids)
    out = KVConnectorOutput(
        finished_sending=results.finished_sending,
        finished_recving=results.finished_recving,
        failed_recving=results.failed_recving,
        invalid_block_ids=w.get_block_ids_with_load_errors(),
        kv_connector_stats=w.get_kv_connector_stats(),
        kv_cache_events=w.get_kv_connector_kv_cache_events(),
        kv_connector_worker_meta=w.build_connector_worker_meta(),
    )
    w.clear_connector_metadata()
    return ModelRunnerOutput(req_ids=[], req_id_to_index={}, kv_connector_output=out)


def _commands(w) -> dict:
    """What the test process can ask of a rank's worker side."""
    from kv_connector.vllm._stats import flat_counters

    def begin(meta) -> None:
        w.handle_preemptions(meta)  # the model runner's order: before the batch update
        w.bind_connector_metadata(meta)

    return {
        "begin": lambda blob: begin(pickle.loads(blob)),
        "end": lambda finished: _end_step(w, finished),
        "counters": lambda _: flat_counters(w._worker.conn.stats(), {"bounce_exhausted": w._worker.bounce_exhausted}),
        "keys": lambda tokens: w._worker.conn.keys(tokens),
        "settle": lambda _: w._worker.conn.settle_saves(),
        "events": lambda _: list(w._worker.conn.events),
        "shutdown": lambda _: w.shutdown() or {},
    }


def _rank_main(pipe, config, kv_config, raw: torch.Tensor, record: bool) -> None:
    """One rank's process: its connector on its views of `raw`, then commands until shutdown."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    torch.set_num_threads(1)
    try:
        w = KVConnectorFactory.create_connector(config=config, role=KVConnectorRole.WORKER, kv_cache_config=kv_config)
        w.stats_interval_s = 0.0  # every step, so the per-step stats add up exactly
        w.register_kv_caches(views_of(config, kv_config, raw))
        if record:
            w._worker.conn = vs.Recorder(w._worker.conn)
        pipe.send(("ok", w.get_handshake_metadata()))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
        return
    commands = _commands(w)
    while True:
        command, arg = pipe.recv()
        try:
            pipe.send(("ok", commands[command](arg)))
        except BaseException:
            pipe.send(("error", traceback.format_exc()))
        if command == "shutdown":
            return


# ---- the engine --------------------------------------------------------------------


class RankedInstance(vs.VllmInstance):
    """One engine of tp x pp rank processes (see the module doc): VllmInstance's `add`,
    `serve`, `idle`, `build_cache` and model runner (`_forward`, `_finish`) over the
    ranks' KV (`gather`, `write`)."""

    def __init__(
        self, spec: ModelSpec, model, model_dir: str, *, extra: dict, tp=1, pp=1, num_blocks=192, record=False, **kw
    ):
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        self.spec, self.model, self.tp, self.pp = spec, model, tp, pp
        self.ranks = tp * pp
        self.config = ranked_config(model_dir, extra=extra, tp=tp, pp=pp, **kw)
        self.kv_configs = [rank_kv_config(self.config, spec, num_blocks, r // tp) for r in range(self.ranks)]
        assert len({c.num_blocks for c in self.kv_configs}) == 1, "every rank has the same number of blocks"
        self.config.cache_config.num_gpu_blocks = self.kv_configs[0].num_blocks
        self.raws = [shared_raw(c) for c in self.kv_configs]
        self.views = [views_of(self.config, c, raw) for c, raw in zip(self.kv_configs, self.raws)]
        # layer -> [(rank, its heads)]: the ranks of the layer's stage, with their shards.
        self.sources: dict[int, list] = {layer: [] for layer in range(len(spec.layer_types))}
        for r in range(self.ranks):
            for layer in stage_layers(spec, pp, r // tp):
                self.sources[layer].append((r, head_shard(spec.kv_heads, tp, r % tp)))
        self.group_of = {  # (rank, layer name) -> its KV cache group on that rank
            (r, name): gi
            for r, c in enumerate(self.kv_configs)
            for gi, g in enumerate(c.kv_cache_groups)
            for name in g.layer_names
        }
        self.procs, self.pipes = [], []
        self.closed = False
        try:
            handshakes = self._start(record)
            self.sched = Scheduler(
                self.config, self.kv_configs[0], StructuredOutputManager(self.config), block_size=T, log_stats=True
            )
        except BaseException:
            self.kill()
            raise
        # EngineCore._set_kv_connector_handshake_metadata, with every rank's metadata.
        content = {(r // tp, r % tp): m for r, m in enumerate(handshakes) if m is not None}
        self.sched.get_kv_connector().set_xfer_handshake_metadata_pp_aware(content)
        self.aggregator = KVOutputAggregator.from_connector(self.sched.get_kv_connector(), self.ranks)
        self.output_rank = self.ranks - tp  # the first TP rank of the last stage, as vLLM's executor
        self.served: dict[str, Served] = {}
        self.block_hasher = None  # no prefix caching
        self.outputs: list = []
        self.stats: list = []
        self.steps = 0

    def _start(self, record: bool) -> list:
        """Starts every rank (all at once; each registers its KV memory) and returns their
        handshake metadata."""
        for r in range(self.ranks):
            config = copy.deepcopy(self.config)
            config.parallel_config.rank = r
            mine, theirs = _CTX.Pipe()
            args = (theirs, config, self.kv_configs[r], self.raws[r], record)
            proc = _CTX.Process(target=_rank_main, args=args, name=f"kvc-rank-{r}", daemon=True)
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.pipes.append(mine)
        return [self._answer(r, "start") for r in range(self.ranks)]

    def _answer(self, r: int, command: str):
        pipe = self.pipes[r]
        if not pipe.poll(PATIENCE_S):
            raise AssertionError(f"rank {r} did not answer {command!r} within {PATIENCE_S} s")
        try:
            status, value = pipe.recv()
        except EOFError:
            raise AssertionError(f"rank {r} ended (exit code {self.procs[r].exitcode}) during {command!r}") from None
        if status != "ok":
            raise AssertionError(f"rank {r} failed {command!r}:\n{value}")
        return value

    def call_all(self, command: str, arg=None) -> list:
        """`command` on every rank at once; their answers in rank order."""
        for pipe in self.pipes:
            pipe.send((command, arg))
        return [self._answer(r, command) for r in range(self.ranks)]

    # -- KV in the ranks' blocks -------------------------------------------------------

    def gather(self, tables, layer: int, lo: int, hi: int):
        """K and V of `layer` for tokens [lo, hi), every head from every rank holding it."""
        heads: list = [None] * self.spec.kv_heads
        for rank, shard in self.sources[layer]:
            name, parts = layer_name(layer), []
            gi, view = self.group_of[(rank, name)], self.views[rank][name]
            for block in range(lo // T, (hi - 1) // T + 1):
                a, b = max(lo, block * T) - block * T, min(hi, (block + 1) * T) - block * T
                bid = tables[gi][block]
                assert bid != 0, f"layer {layer}: block {block} is read but vLLM holds no block for it"
                parts.append(view[bid, :, a:b])
            kv = torch.cat(parts, dim=1)  # [heads of this rank, n, 2D]
            for local, h in enumerate(shard):
                if heads[h] is None:
                    heads[h] = (rank, kv[local])
                else:
                    first, want = heads[h]
                    assert torch.equal(kv[local].view(torch.int32), want.view(torch.int32)), (
                        f"layer {layer} head {h} tokens [{lo}, {hi}): rank {rank}'s replica differs from rank {first}'s"
                    )
        kv = torch.stack([entry[1] for entry in heads]).unsqueeze(0)  # [1, H, n, 2D]
        d = self.spec.head_dim
        return kv[..., :d].contiguous(), kv[..., d:].contiguous()

    def write(self, tables, start: int, added: dict) -> None:
        """The K/V a forward added, into every rank that holds the layer and head."""
        n = next(iter(added.values()))[0].shape[2]
        for layer, (k, v) in added.items():
            kv = torch.cat([k[0], v[0]], dim=-1)  # [H, n, 2D]
            for rank, shard in self.sources[layer]:
                name = layer_name(layer)
                gi, view = self.group_of[(rank, name)], self.views[rank][name]
                for block in range(start // T, (start + n - 1) // T + 1):
                    lo, hi = max(start, block * T), min(start + n, (block + 1) * T)
                    view[tables[gi][block], :, lo - block * T : hi - block * T] = kv[shard, lo - start : hi - start]

    # -- the engine loop ---------------------------------------------------------------

    @torch.no_grad()
    def step(self, on_forward=None):
        self.steps += 1
        so = self.sched.schedule()
        self.call_all("begin", pickle.dumps(so.kv_connector_metadata))
        req_ids, sampled = self._forward(so, on_forward)
        merged = self.aggregator.aggregate(self.call_all("end", so.finished_req_ids), self.output_rank)
        self._finish(so, req_ids, sampled, merged.kv_connector_output if merged is not None else None)
        return so

    def run(self, until, what: str, on_forward=None) -> None:
        for _ in range(STEP_LIMIT):
            if until():
                return
            self.step(on_forward)
            if not self.sched.has_unfinished_requests():
                time.sleep(IDLE_SLEEP_S)  # blocks held for saves only: let them settle
        raise AssertionError(f"gave up after {STEP_LIMIT} steps waiting for {what}")

    def settle_saves(self) -> None:
        self.call_all("settle")

    def aggregated_stats(self) -> dict[str, int]:
        """The stats vLLM received over the run (KvcStats.data), summed."""
        return dict(sum((Counter(stats.data) for stats in self.stats), Counter()))

    def close(self) -> list[dict]:
        """Shuts every rank down (their final counters, in rank order), then the scheduler."""
        if self.closed:
            return []
        try:
            finals = self.call_all("shutdown")
            for proc in self.procs:
                proc.join(PATIENCE_S)
        except BaseException:
            self.kill()
            raise
        self.closed = True
        self.sched.shutdown()
        return finals

    def kill(self) -> None:
        """Ends the rank processes without their shutdown (after a failure)."""
        self.closed = True
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(10)
        if getattr(self, "sched", None) is not None:
            self.sched.shutdown()
