"""Benchmark (not a test): what the connector's scheduler-side hooks cost vLLM's scheduler
thread at tensor-parallel size 4, the ranks in their own processes (the scheduler's own
lookup-only connector, through a real `mooncake_master` on loopback).

  python crates/python/bench/bench_scheduler.py [--waiting N] [--repeat N] [--step-ms MS]

vLLM 0.33's real `Scheduler` with the connector's scheduler side, the four ranks' layouts
handed over as EngineCore does (handshake metadata), the GPT-OSS hybrid tiny model's
groups. No model runs: each step waits `--step-ms` with the GIL released (EngineCore
waiting for the ranks' forward pass), then its output samples a token for every request
whose prompt is done, and reports finished saves a step after a request ends, as the
ranks would.
Every scheduler-side hook (`get_num_new_matched_tokens`, `update_state_after_alloc`,
`build_connector_meta`, `update_connector_output`, `request_finished*`) is timed.

- per step: `--waiting` requests of 2,048 tokens arrive at once (half of them sharing a
  prefix saved beforehand, so they are offered a load), 16 run at a time and generate 32
  tokens each, the others wait: the connector's time in the first step (every request's
  lookup starts), and p50/p99/max over the steps after it;
- per request: one request of 8k, 32k and 128k tokens alone: the connector's time
  summed over all its steps (the first lookup reads the prompt list), median of 5.

As EngineCore does after start-up, the garbage collector's heap is frozen once the
scheduler is built. `--null-hooks` measures the same with hooks that do nothing (no
lookup, no load, no save): what timing a hook costs on the machine, the figures' floor.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

import api_support  # noqa: E402
import vllm_support as vs  # noqa: E402
from models import tiny  # noqa: E402

TP = 4
MODEL_KEY = "bench-tiny-gpt-oss"
RUNNING = 16  # max_num_seqs of the per-step run: the rest wait
DECODE = 32  # tokens each request generates in it
MAX_LEN = 140_000
BUDGET = 8192
HOOKS = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
    "request_finished_all_groups",
)


def config(model_dir: str, extra: dict, max_seqs: int):
    import vllm.config as vc

    model = vc.ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_LEN)
    kt = vc.KVTransferConfig(
        kv_connector="KvcConnector",
        kv_connector_module_path="kv_connector.vllm",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        engine_id=str(uuid.uuid4()),
        kv_connector_extra_config=extra,
    )
    sched = vc.SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=BUDGET, max_model_len=MAX_LEN,
                               enable_chunked_prefill=True, is_encoder_decoder=False)
    parallel = vc.ParallelConfig(tensor_parallel_size=TP, distributed_executor_backend="mp")
    cache = vc.CacheConfig(block_size=vs.T, cache_dtype="auto", enable_prefix_caching=False)
    out = vc.VllmConfig(model_config=model, cache_config=cache, scheduler_config=sched, parallel_config=parallel,
                        kv_transfer_config=kt, device_config=vc.DeviceConfig("cpu"))
    out.cache_config.kv_cache_layout = "BLHNC"
    return out


def model_dir(spec) -> str:
    path = vs.write_model_dir(spec, tempfile.mkdtemp())
    cfg = Path(path) / "config.json"
    data = json.loads(cfg.read_text())
    data["max_position_embeddings"] = 1 << 18
    cfg.write_text(json.dumps(data))
    return path


class Timed:
    """The scheduler-side hooks of one connector, each call timed into `spent`."""

    def __init__(self, connector):
        self.spent = 0.0
        self.by_hook = dict.fromkeys(HOOKS, 0.0)
        for name in HOOKS:
            original = getattr(connector, name)
            setattr(connector, name, self._wrap(name, original))

    def _wrap(self, name, original):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                self.spent += spent
                self.by_hook[name] += spent

        return timed

    def hooks_ms(self) -> str:
        """Each hook's share of the time taken so far, in ms (then reset)."""
        text = ", ".join(f"{name} {spent * 1e3:.3f}" for name, spent in self.by_hook.items() if spent)
        self.by_hook = dict.fromkeys(HOOKS, 0.0)
        return text

    def take(self) -> float:
        spent, self.spent = self.spent, 0.0
        return spent


class Engine:
    """vLLM's scheduler with the connector's scheduler side at TP = 4 (module doc)."""

    def __init__(self, spec, directory: str, extra: dict, max_seqs: int, num_blocks: int):
        from vllm.utils.gc_utils import freeze_gc_heap
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        from kv_connector.vllm._layout import plan_layout
        from kv_connector.vllm._ranks import KvcHandshake

        self.config = config(directory, extra, max_seqs)
        import vllm_ranks

        kv_config = vllm_ranks.rank_kv_config(self.config, spec, num_blocks, 0)
        self.config.cache_config.num_gpu_blocks = kv_config.num_blocks
        self.sched = Scheduler(self.config, kv_config, StructuredOutputManager(self.config), block_size=vs.T,
                               log_stats=False)
        self.layout = plan_layout(kv_config, "bench", tp=TP, stage=0, total_kv_heads=spec.kv_heads).layout
        handshakes = {(0, t): KvcHandshake(0, t, self.layout, MODEL_KEY) for t in range(TP)}
        self.sched.connector.set_xfer_handshake_metadata_pp_aware(handshakes)
        self.timed = Timed(self.sched.connector)
        # EngineCore's start-up heap is left out of every collection while it serves.
        freeze_gc_heap()
        self.finished: list[str] = []
        self.loading: list[str] = []
        self.step_s = 0.0

    def add(self, req_id: str, tokens: list[int], max_tokens: int = 1) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.sched.add_request(Request(req_id, tokens, params, None))

    def step(self) -> float:
        """One step; the connector's seconds in it."""
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        so = self.sched.schedule()
        time.sleep(self.step_s)  # the ranks' forward pass; the scheduler thread waits
        ids, sampled = [], []
        for req_id, n in so.num_scheduled_tokens.items():
            request = self.sched.requests[req_id]
            ids.append(req_id)
            done = request.num_computed_tokens + n >= request.num_tokens
            sampled.append([1 + len(request.output_token_ids)] if done else [])
        # The ranks report the saves of the requests that ended a step ago as settled, and
        # the loads started a step ago as filled.
        out = KVConnectorOutput(finished_sending=set(self.finished) or None,
                                finished_recving=set(self.loading) or None)
        self.finished = list(so.finished_req_ids)
        self.loading = [load.req_id for load in so.kv_connector_metadata.loads]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled, kv_connector_output=out)
        self.sched.update_from_output(so, mro)
        return self.timed.take()

    def drain(self, limit: int = 10_000) -> list[float]:
        spent = []
        for _ in range(limit):
            if not self.sched.requests:
                return spent
            spent.append(self.step())
            if not self.sched.has_unfinished_requests():
                time.sleep(0.001)
        raise RuntimeError("requests did not finish")

    def close(self) -> None:
        self.sched.connector.shutdown()
        gc.unfreeze()


def null_hooks() -> None:
    """Every scheduler-side hook of the connector does nothing (`--null-hooks`)."""
    from kv_connector.vllm import KvcConnector, KvcMetadata

    def matched(self, request, num_computed):
        return 0, False

    def nothing(self, *args):
        return None

    def meta(self, scheduler_output):
        return KvcMetadata()

    def finished(self, request, block_ids):
        return True, None

    KvcConnector.get_num_new_matched_tokens = matched  # type: ignore[method-assign]
    KvcConnector.update_state_after_alloc = nothing  # type: ignore[method-assign]
    KvcConnector.build_connector_meta = meta  # type: ignore[method-assign]
    KvcConnector.update_connector_output = nothing  # type: ignore[method-assign]
    KvcConnector.request_finished = finished  # type: ignore[method-assign]
    KvcConnector.request_finished_all_groups = finished  # type: ignore[method-assign]


def save_prefix(master, layout: dict, tokens: list[int]):
    """A connector holding all four ranks' host tensors (one Mooncake client) saves
    `tokens` under every rank's shard, as the ranks of an engine that served it would; it
    stays up (its Mooncake segment holds the objects)."""
    import torch

    import kv_connector as kvc

    lay = kvc.Layout.from_dict(layout)
    blocks = len(tokens) // vs.T + 1
    kv = [[torch.zeros((blocks, lay.page_bytes(g["id"])), dtype=torch.uint8) for g in layout["groups"]]
          for _ in range(TP)]
    conn = kvc.Connector(lay, kv, config=master.config(), model_key=MODEL_KEY)
    conn.lookup(1, tokens)
    api_support.wait_until(lambda: conn.reserve(1, 0, 1), conn, "the lookup")
    tables = [list(range(blocks))] * len(layout["groups"])
    conn.on_step([kvc.StepRequest(1, len(tokens), 0, len(tokens), page_tables=tables)])
    if conn.request_finished(1):
        api_support.wait_until(lambda: 1 in conn.finished_saves(), conn, "the saves")
    return conn


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--null-hooks", action="store_true", help="hooks that do nothing: the floor")
    args = parser.parse_args()
    if args.null_hooks:
        null_hooks()
    spec = tiny.SPECS["gpt-oss"]
    directory = model_dir(spec)
    master = api_support.start_master(Path(tempfile.mkdtemp()) / "master.log")
    try:
        extra = {"kvc": master.config(), "model_key": MODEL_KEY}
        shared = [7 + i % 97 for i in range(1024)]
        # Per step: the waiting queue of --waiting requests.
        engine = Engine(spec, directory, extra, max_seqs=RUNNING, num_blocks=args.waiting * 160)
        engine.step_s = args.step_ms / 1e3
        saver = save_prefix(master, engine.layout, [*shared, 3])
        for i in range(args.waiting):
            head = shared if i % 2 == 0 else [50_000 + i] * 1024
            engine.add(f"w{i}", head + [1000 + i * 7 + j % 5 for j in range(1024)], max_tokens=DECODE)
        per_step = engine.drain()
        by_hook = engine.timed.hooks_ms()
        offered = "none (null hooks)" if args.null_hooks else \
            engine.sched.connector._sched.engine.conn.stats()["lookups"]["tokens_offered"]
        engine.close()
        saver.shutdown()
        first, rest = per_step[0] * 1e6, [s * 1e6 for s in per_step[1:] if s > 0]
        print(f"TP={TP}, {args.waiting} requests of 2048 tokens ({RUNNING} running, {DECODE} tokens each): "
              "first step (every lookup starts) "
              f"{first:.1f} us; the {len(rest)} steps after it: p50 {percentile(rest, 0.5):.1f} us, "
              f"p99 {percentile(rest, 0.99):.1f} us, max {max(rest):.1f} us; tokens offered {offered}")
        print(f"  by hook over all steps, ms: {by_hook}")
        # Per request.
        for n in (8192, 32768, 131072):
            totals = []
            engine = Engine(spec, directory, extra, max_seqs=4, num_blocks=2 * (n // vs.T) + 128)
            engine.step_s = args.step_ms / 1e3
            for r in range(args.repeat):
                engine.add(f"r{n}-{r}", [(r * 131 + j * 7) % 200_000 for j in range(n)])
                totals.append(sum(engine.drain()) * 1e3)
            by_hook = engine.timed.hooks_ms()
            engine.close()
            print(f"TP={TP}, one request of {n} tokens: connector time {statistics.median(totals):.3f} ms "
                  f"(min {min(totals):.3f}) over {args.repeat}; by hook over all {args.repeat}, ms: {by_hook}")
    finally:
        api_support.stop_master(master.process)


if __name__ == "__main__":
    main()
