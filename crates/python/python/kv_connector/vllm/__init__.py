"""kv_connector for vLLM: `KvcConnector`, a `KVConnectorBase_V1` with `SupportsHMA`.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvcConnector",
        "kv_connector_module_path": "kv_connector.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {...}}'

One runtime `Connector` per rank, on vLLM's own KV memory (`_pages`). With one rank in
the engine's process (`uni`), the connector's scheduler side (`_scheduler`: lookups and
reservations at admission) and its worker side (`_worker`: loads, saves, completions)
share it; with tensor or pipeline parallel ranks in their own processes the scheduler
looks up through a lookup-only connector of its own and the ranks adopt its lookups
(`_ranks`). vLLM's KV cache groups become the layout's groups (`_layout`); settings come from
`kv_connector_extra_config` and the `KVC_*` environment (`_config`); the runtime's
counters reach vLLM's stats log and Prometheus (`_stats`), its log records vLLM's logger
`vllm.kv_connector` (`kv_connector.forward_logs`; `log_to_vllm`). docs/VLLM.md is the guide.
"""

from __future__ import annotations

import time
from typing import Any, cast

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.logger import init_logger

import kv_connector as kvc

from . import _engine
from ._config import check_transfer, settings
from ._engine import Engine, KvcMetadata
from ._layout import BLOCK_OUTERMOST_LAYOUTS, UnsupportedVllmSetup, check_parallelism, plan_layout
from ._pages import WorkerPages, bounce_pages_needed
from ._ranks import KvcHandshake, rank_of, separate_processes
from ._scheduler import SchedulerSide
from ._stats import KvcPromMetrics, KvcStats, flat_counters
from ._worker import WorkerSide

__all__ = ["KvcConnector", "KvcMetadata", "KvcStats", "UnsupportedVllmSetup"]

# How long shutdown waits for loads in flight before closing the runtime.
SHUTDOWN_LOAD_WAIT_S = 30.0
# The logger in vLLM's tree that receives the runtime's log records (its handlers print them).
LOGGER_NAME = "vllm.kv_connector"
logger = init_logger(LOGGER_NAME)


def _forward_runtime_logs() -> None:
    """The runtime's records (outages, refused batches, the stats reports) through
    vLLM's logging, at the level vLLM logs at (VLLM_LOGGING_LEVEL)."""
    try:
        kvc.forward_logs(logger)
    except kvc.KvConnectorError as error:
        # kvc.init_logging() took them first: they already go to stderr.
        logger.info("the runtime's logs stay where kv_connector.init_logging sent them (%s)", error)


def _segment(text: str) -> str:
    """`text` as a key segment: no '/', whitespace or control characters."""
    return "".join("-" if c == "/" or c.isspace() or not c.isprintable() else c for c in text)


class KvcConnector(KVConnectorBase_V1, SupportsHMA):
    """Shares prompt KV through a kv_connector pool (see the module doc)."""

    # Reading the runtime's counters asks its actors, so the worker reports them at most
    # this often rather than every step.
    stats_interval_s = 1.0

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        check_transfer(self._kv_transfer_config)
        self._settings = settings(self._kv_transfer_config.kv_connector_extra_config)
        check_parallelism(vllm_config, self._settings.runtime["pool"]["backend"])
        if self._settings.log_to_vllm:
            _forward_runtime_logs()
        # vLLM fills the id in (a uuid unless the configuration gives one).
        self._engine_id = cast(str, self._kv_transfer_config.engine_id)
        self._sched: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        self._handshake: KvcHandshake | None = None
        self._reported: dict[str, int] = {}
        self._reported_at = float("-inf")
        if role == KVConnectorRole.SCHEDULER:
            self._sched = SchedulerSide(self._engine_id, vllm_config, self._settings)

    # ---- configuration -------------------------------------------------------------

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> str | None:
        # A block of a group must be one contiguous run of its layers' pages (_pages).
        return BLOCK_OUTERMOST_LAYOUTS[0]

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped save is a later cache miss, never an error

    # ---- worker side ---------------------------------------------------------------

    def _metadata(self) -> KvcMetadata:
        # The scheduler side builds every step's metadata (`build_connector_meta`).
        return cast(KvcMetadata, self._get_connector_metadata())

    def register_kv_caches(self, kv_caches: dict[str, Any]):
        if self._kv_cache_config is None:
            raise UnsupportedVllmSetup("the worker side needs vLLM's KVCacheConfig")
        model = self._vllm_config.model_config.served_model_name
        model = model[0] if isinstance(model, (list, tuple)) else model
        name = _segment(str(model or self._vllm_config.model_config.model))
        parallel, separate = self._vllm_config.parallel_config, separate_processes(self._vllm_config)
        stage, rank = rank_of(self._vllm_config) if separate else (0, 0)
        total_heads = self._vllm_config.model_config.get_total_num_kv_heads()
        plan = plan_layout(
            self._kv_cache_config, name, tp=parallel.tensor_parallel_size, stage=stage, total_kv_heads=total_heads
        )
        s = self._settings
        bounce = s.bounce_pages or bounce_pages_needed(plan, self._vllm_config.model_config.max_model_len, s.runtime)
        pages = WorkerPages(plan, kv_caches, self._kv_cache_config.num_blocks, bounce)
        pool = None
        if s.shared_pool is not None:
            pool = _engine.shared_pool(s.shared_pool, s.config)
        layout_name = self._vllm_config.cache_config.kv_cache_layout or BLOCK_OUTERMOST_LAYOUTS[0]
        # The page format (vLLM's layout of a block) is part of the key: engines with
        # another byte order never read these objects.
        model_key = s.model_key or f"{name}.vllm-{layout_name}"
        conn = kvc.Connector(
            layout=kvc.Layout.from_dict(plan.layout),
            kv_caches=pages.tensors,
            pool=pool,
            config=s.config,
            model_key=model_key,
            namespace=s.namespace,
            salt=s.salt,
            rank=rank,
        )
        engine = Engine(conn, pages)
        if separate:
            self._handshake = KvcHandshake(stage, rank, plan.layout, model_key)
        else:
            _engine.register(self._engine_id, engine)
        self._worker = WorkerSide(engine, adopts=separate)

    def get_handshake_metadata(self) -> KvcHandshake | None:
        return self._handshake

    def set_xfer_handshake_metadata_pp_aware(self, metadata) -> None:
        if self._sched is not None:
            self._sched.ranks_reported(dict(metadata))

    def handle_preemptions(self, kv_connector_metadata):
        if self._worker is not None and kv_connector_metadata.preempted:
            self._worker.preempted(kv_connector_metadata.preempted)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        if self._worker is not None:
            meta = self._metadata()
            self._worker.adopt(meta)
            self._worker.start_loads(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads fill blocks of parked requests only; no layer waits on them

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return  # saves are planned per step in wait_for_save, off the forward pass

    def wait_for_save(self):
        if self._worker is not None:
            meta = self._metadata()
            self._worker.adopt(meta)
            self._worker.report_chunks(meta.chunks)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        if self._worker is None:
            return KVConnectorTransferResults()
        meta = self._connector_metadata
        ended = meta.ended if isinstance(meta, KvcMetadata) else []
        sending, recving, failed = self._worker.transfer_results(ended)
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving, failed_recving=failed)

    def get_finished(self, finished_req_ids: set[str]):
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending, results.finished_recving

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_errors() if self._worker is not None else set()

    def get_kv_connector_stats(self) -> KvcStats | None:
        """Every rank's counters since its last report (vLLM sums them over ranks with
        `KvcStats.aggregate`); with ranks in their own processes, also the scheduler's
        lookup-only connector's (the lookups)."""
        if self._worker is not None:
            conn, extra = self._worker.conn, {"bounce_exhausted": self._worker.bounce_exhausted}
        elif self._sched is not None and self._sched.remote:
            conn, extra = self._sched.engine.conn, {}
        else:
            return None
        if time.monotonic() - self._reported_at < self.stats_interval_s:
            return None
        self._reported_at = time.monotonic()
        now = flat_counters(conn.stats(), extra)
        delta = {k: v - self._reported.get(k, 0) for k, v in now.items()}
        self._reported = now
        stats = KvcStats(data={k: v for k, v in delta.items() if v})
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KvcStats:
        return KvcStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvcPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self):
        if self._worker is not None:
            worker, self._worker = self._worker, None
            worker.drain(SHUTDOWN_LOAD_WAIT_S)
            _engine.unregister(self._engine_id)
            return worker.conn.shutdown()
        if self._sched is not None:
            return self._sched.shutdown()
        return None

    # ---- scheduler side ------------------------------------------------------------

    @property
    def _scheduler(self) -> SchedulerSide:
        # vLLM calls the scheduler-side hooks only on the scheduler's connector, which has one.
        return cast(SchedulerSide, self._sched)

    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self._sched is not None:
            self._sched.kv_cache_manager = kv_cache_manager

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self._scheduler.matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self._scheduler.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KvcMetadata:
        return self._scheduler.build_meta(scheduler_output)

    def update_connector_output(self, connector_output):
        self._scheduler.connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self._scheduler.finished(request)

    def request_finished_all_groups(self, request, block_ids):
        return self._scheduler.finished(request)
