"""Ranks in their own processes (R33): which rank a worker is, what it tells the scheduler,
and the scheduler's own lookup-only connector over every rank and pipeline stage.

With tensor or pipeline parallelism, or vLLM's `mp` executor, the scheduler runs in the
EngineCore process and each rank's worker in a process of its own. Every worker starts a
runtime `Connector` on its rank's KV memory: its shard of the heads (keys `w{tp}r{rank}`,
R3), its stage's layers (layout groups numbered `stage * groups + index`, so stages never
share a group id). Each reports its stage's layout through vLLM's handshake metadata
(`get_handshake_metadata` -> `set_xfer_handshake_metadata_pp_aware`, collected by
EngineCore before the first step), and the scheduler starts a lookup-only `Connector` on
the union of the stages' layouts: it probes every shard of every group of every stage, so
it offers only what all of them hold. Its Mooncake client contributes no segment (it
stores nothing, and memory it lent would vanish with the scheduler).

The scheduler looks each request up once; the metadata carries the finished lookup as a
record (`Connector.lookup_record`, a few bytes per block) the first time a request reaches
the workers, and every rank adopts it (`adopt_lookup`) instead of hashing the prompt and
probing the pool itself. So every rank loads what the one offer promised, saves under the
same names, and reports each load and save itself; vLLM's `KVOutputAggregator` finishes a
request when all ranks have, and merges the failures (a failed load on one rank makes
vLLM compute the tokens on all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata

from ._layout import UnsupportedVllmSetup


@dataclass
class KvcHandshake(KVConnectorHandshakeMetadata):
    """What one rank's worker tells the scheduler: its stage's layout and key segments."""

    pp_rank: int
    tp_rank: int
    layout: dict[str, Any]
    model_key: str


def rank_of(vllm_config) -> tuple[int, int]:
    """(pipeline stage, tensor-parallel rank) of this worker: from vLLM's parallel groups
    once initialized, else from its global rank (`pp * tp_size + tp`, vLLM's order)."""
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return parallel_state.get_pp_group().rank_in_group, parallel_state.get_tp_group().rank_in_group
    parallel = vllm_config.parallel_config
    rank = int(getattr(parallel, "rank", 0) or 0)
    return rank // parallel.tensor_parallel_size, rank % parallel.tensor_parallel_size


def separate_processes(vllm_config) -> bool:
    """Whether the scheduler and the workers live in different processes."""
    parallel = vllm_config.parallel_config
    one_rank = parallel.tensor_parallel_size == 1 and parallel.pipeline_parallel_size == 1
    return not (one_rank and parallel.distributed_executor_backend in (None, "uni"))


def stage_layouts(handshakes: dict[tuple[int, int], Any], tp: int, pp: int) -> list[dict[str, Any]]:
    """Each stage's layout from every rank's handshake; all ranks of a stage must agree."""
    missing = [(p, t) for p in range(pp) for t in range(tp) if (p, t) not in handshakes]
    if missing:
        raise UnsupportedVllmSetup(
            f"no kv_connector handshake from ranks (pp, tp) {missing}: every worker must run "
            "KvcConnector (one kv_transfer_config for the whole engine)"
        )
    stages = []
    for p in range(pp):
        first = handshakes[(p, 0)]
        for t in range(1, tp):
            if handshakes[(p, t)].layout != first.layout:
                raise UnsupportedVllmSetup(f"ranks 0 and {t} of pipeline stage {p} report different KV layouts")
        stages.append(first.layout)
    return stages


def union_layout(stages: list[dict[str, Any]]) -> dict[str, Any]:
    """The layout of every stage's groups, for the scheduler's lookups."""
    first = stages[0]
    groups = sorted((g for stage in stages for g in stage["groups"]), key=lambda g: g["id"])
    return {
        "name": first["name"],
        "tokens_per_block": first["tokens_per_block"],
        "world_size": first["world_size"],
        "groups": groups,
    }


def lookup_connector(handshakes: dict[tuple[int, int], Any], vllm_config, settings):
    """The scheduler's lookup-only connector over every rank's shard and stage (module doc)."""
    import kv_connector as kvc

    parallel = vllm_config.parallel_config
    stages = stage_layouts(handshakes, parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
    model_keys = {h.model_key for h in handshakes.values()}
    if len(model_keys) != 1:
        raise UnsupportedVllmSetup(f"the ranks report different model keys {sorted(model_keys)}")
    return kvc.Connector(
        layout=kvc.Layout.from_dict(union_layout(stages)),
        kv_caches=None,
        config=settings.config,
        model_key=model_keys.pop(),
        namespace=settings.namespace,
        salt=settings.salt,
        stages=[kvc.Layout.from_dict(stage) for stage in stages],
    )
