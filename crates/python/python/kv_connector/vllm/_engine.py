"""One engine's runtime connector, shared by the scheduler and worker sides of the vLLM
connector in one process (ranks in their own processes: `_ranks`), and the plans the
scheduler side hands the worker.

The worker side starts the runtime `Connector` on vLLM's tensors in
`register_kv_caches` and records it here under the engine id; vLLM builds the scheduler
(and its side of the connector) afterwards, in the same process when
`distributed_executor_backend` is `uni`. The scheduler side calls the admission hooks
(`lookup`, `reserve`); the worker side every hook that touches pages (`on_step`,
`finished_loads`, `release`, `request_finished`, `finished_saves`), in step order.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from ._layout import UnsupportedVllmSetup

_ENGINES: dict[str, Engine] = {}
_POOLS: dict[str, object] = {}
_LOCK = threading.Lock()


@dataclass
class Engine:
    conn: object  # kv_connector.Connector
    pages: object  # WorkerPages; None for the scheduler's lookup-only connector
    rids: itertools.count = field(default_factory=lambda: itertools.count(1))
    reservations: itertools.count = field(default_factory=lambda: itertools.count(1))

    def new_rid(self) -> int:
        return next(self.rids)

    def new_reservation(self) -> int:
        return next(self.reservations)


def register(engine_id: str, engine: Engine) -> None:
    with _LOCK:
        if engine_id in _ENGINES:
            raise UnsupportedVllmSetup(f"engine {engine_id!r} registered its KV caches twice")
        _ENGINES[engine_id] = engine


def unregister(engine_id: str) -> None:
    with _LOCK:
        _ENGINES.pop(engine_id, None)


def lookup(engine_id: str) -> Engine:
    with _LOCK:
        engine = _ENGINES.get(engine_id)
    if engine is None:
        raise UnsupportedVllmSetup(
            f"no worker of engine {engine_id!r} registered its KV caches in this process: the "
            "connector's scheduler and worker sides must share one process "
            "(--distributed-executor-backend uni, tensor_parallel_size=1)"
        )
    return engine


def shared_pool(name: str, config):
    """The process's embedded MemoryPool called `name`, made on first use from `config`
    (the connector's: a TOML path, a dict or None) as the runtime loads it, `KVC_*`
    environment included (`MemoryPool.from_config`); later engines share the first's."""
    import kv_connector as kvc

    with _LOCK:
        if name not in _POOLS:
            _POOLS[name] = kvc.MemoryPool.from_config(config)
        return _POOLS[name]


# ---- what the scheduler side hands the worker side, per step ----


@dataclass(frozen=True)
class LoadPlan:
    """Load tokens [start, end) of a request into the blocks vLLM allocated."""

    req_id: str
    rid: int
    reservation: int
    prompt_len: int
    start: int
    end: int
    block_ids: tuple[list[int], ...]
    # vLLM took another number of tokens than offered: the load is reported failed
    # without being started, and vLLM computes the tokens.
    refused: bool = False


@dataclass(frozen=True)
class ChunkPlan:
    """Tokens [before, after) of a request's prompt computed in this step (decode steps
    have none: nothing past the prompt is saved). `table`: vLLM's block ids of the step, per group, as its scheduler
    output gives them: the whole table when `replace` (a new or resumed request), else the
    blocks added this step (None: none). The worker keeps each request's table; it reads
    the full-attention groups' from it. `window_ids`: per group, the window blocks the
    runtime saves for this chunk that precede the step's own, and their ids now (window
    groups drop blocks in place, so a kept table would name blocks vLLM reused); the step's
    own blocks are current in `table`."""

    req_id: str
    rid: int
    prompt_len: int
    before: int
    after: int
    table: tuple[list[int], ...] | None
    replace: bool
    window_ids: tuple[dict[int, int], ...] = ()


def step_blocks_start(table: tuple[list[int], ...] | None, replace: bool, group: int, length: int) -> int:
    """Where the blocks of a step's `table` (`ChunkPlan.table`) start in vLLM group
    `group`'s block table of `length` blocks after the step: blocks from there on are the
    step's own, current in `table`; those before it a window group may have dropped since.
    A new or resumed request's step table is its whole table."""
    if replace:
        return 0
    return length - (len(table[group]) if table is not None else 0)


@dataclass(frozen=True)
class Ended:
    """A request vLLM finished (or aborted); `loading`: its load may still run."""

    req_id: str
    rid: int
    loading: bool


@dataclass
class KvcMetadata(KVConnectorMetadata):
    loads: list[LoadPlan] = field(default_factory=list)
    chunks: list[ChunkPlan] = field(default_factory=list)
    preempted: list[tuple[str, int]] = field(default_factory=list)
    ended: list[Ended] = field(default_factory=list)
    # Ranks in their own processes: runtime request id -> its finished lookup
    # (`Connector.lookup_record`), for every rank to adopt before its first load or chunk.
    records: dict[int, bytes] = field(default_factory=dict)
