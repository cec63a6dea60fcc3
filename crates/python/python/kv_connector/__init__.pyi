"""Type stubs of kv_connector (the classes live in the native module kv_connector._native)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final, TypeAlias

__version__: Final[str]
FEATURES: Final[list[str]]
"""Cargo features of this build: "mooncake", "cuda", "faults" (test hooks)."""
COUNTERS: Final[list[dict[str, Any]]]
"""Every counter the runtime declares, in `Connector.stats()` order: "section", "name",
"kind" ("sum", "max", "derived"), "help", and the metric it is exposed as ("family",
"metric", "type", "label", "label_value"; None where it is not exposed)."""
METRIC_FAMILIES: Final[list[dict[str, Any]]]
"""Every metric family the runtime exposes: "name", "metric" (as a scraper sees it),
"help", "unit", "label" and "type" ("counter", "gauge", "histogram")."""

Tokens: TypeAlias = Sequence[int] | Any
"""A list of ints, or a 1-D integer numpy array or torch tensor."""

PathLike: TypeAlias = str | os.PathLike[str]

class KvConnectorError(Exception):
    """Base class of every error kv_connector raises."""

    kind: str
    """The runtime's stable label of the error ("unknown_key", "borrowed_overlap", ...)."""

class ConfigError(KvConnectorError):
    """A configuration source, key segment or value was refused."""

class LayoutError(KvConnectorError):
    """A layout, or a KV cache tensor registered against it, was refused."""

class PoolError(KvConnectorError):
    """The pool (memory or Mooncake) refused or failed."""

class DeviceError(KvConnectorError):
    """The device layer (CUDA driver, borrowed pages, staging memory) refused or failed."""

class Layout:
    """A validated KV layout: tokens per block, world size and layer groups (R6, R7)."""

    @staticmethod
    def from_dict(layout: dict[str, Any]) -> Layout:
        """A layout from a dict with the keys of a layout TOML file."""
    @staticmethod
    def from_toml(path: PathLike) -> Layout:
        """A layout from a TOML file."""
    @staticmethod
    def preset(name: str) -> Layout:
        """A compiled-in preset ("tiny-hybrid", "gpt-oss-120b", ...)."""
    @staticmethod
    def preset_names() -> list[str]:
        """The names of the compiled-in presets."""
    def load_blocks(self, group_id: int, start: int, end: int) -> list[int]:
        """Blocks of a group a load resuming at token `end` fills, from token `start` (R15)."""
    def page_bytes(self, group_id: int) -> int:
        """Bytes of one page of a group on one rank: all its layers, K and V, one block."""
    @property
    def name(self) -> str: ...
    @property
    def tokens_per_block(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def groups(self) -> list[dict[str, Any]]:
        """The groups in layout order, every field filled in."""
    @property
    def fingerprint(self) -> str:
        """The 16-hex-digit layout fingerprint appended to the model key (R4)."""
    def to_dict(self) -> dict[str, Any]:
        """The layout as a dict that Layout.from_dict accepts."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class MemoryPool:
    """The embedded in-process pool; connectors given the same pool share its objects."""

    def __init__(
        self,
        capacity_bytes: int = 1 << 30,
        *,
        eviction_high_watermark_ratio: float = 0.95,
        eviction_ratio: float = 0.05,
        kv_lease_ttl_ms: int = 5000,
    ) -> None:
        """Raises PoolError for a zero capacity or a ratio outside (0, 1], ValueError for a
        negative capacity or lease. The capacity is taken (and touched) when the first
        connector starts; a capacity the host cannot give is a PoolError then."""
    @staticmethod
    def from_config(config: PathLike | dict[str, Any] | None = None) -> MemoryPool:
        """A pool with the [pool] settings (capacity_bytes, eviction ratios, kv_lease_ttl_ms)
        of a configuration loaded exactly as Connector(config=...) loads it (defaults <
        config < KVC_* environment); ConfigError for what that connector would refuse and
        for pool.backend = "mooncake"."""
    @property
    def capacity_bytes(self) -> int: ...
    def counters(self) -> dict[str, int]:
        """Hits, misses, puts, evictions, bytes written and read, objects and bytes held."""
    def corrupt(self, key_substring: str | None = None, count: int = 1) -> list[str]:
        """Test aid, only in wheels built with the `faults` feature ("faults" in FEATURES):
        flips one payload byte of up to `count` stored objects whose key contains
        `key_substring`, in key order; their next load fails its integrity check and is
        reported filled=False. Returns the keys damaged."""

class StepRequest:
    """One request in one engine step, for Connector.on_step."""

    request_id: int
    prompt_len: int
    computed_before: int
    computed_after: int
    new_reservation: int | None
    page_tables: list[list[int]]
    """One page table per layer group, layout order; -1 where a window group has no page."""

    def __init__(
        self,
        request_id: int,
        prompt_len: int,
        computed_before: int,
        computed_after: int,
        new_reservation: int | None = None,
        page_tables: Sequence[Tokens] | None = None,
    ) -> None: ...

class Connector:
    """The connector of one serving instance, on the engine's own KV cache tensors.

    Hooks are called from one thread (the engine's scheduler thread); the ones that wait
    release the GIL. Use it as a context manager, or call shutdown().
    """

    def __init__(
        self,
        layout: Layout | str,
        kv_caches: Sequence[Any] | Sequence[Sequence[Any]] | None,
        pool: MemoryPool | None = None,
        config: PathLike | dict[str, Any] | None = None,
        model_key: str | None = None,
        namespace: str | None = None,
        salt: str | None = None,
        *,
        rank: int | None = None,
        stages: Sequence[Layout | str] | None = None,
    ) -> None:
        """kv_caches: one page-major, C-contiguous tensor per layer group in layout order
        (tensor[i] is page i; tensor[0] holds layout.page_bytes(group) bytes), all on the
        CPU or all on one CUDA device; with world size > 1, one such list per rank. Ranks in
        separate processes (R33): `rank` is the first list's rank and `layout` the
        process's pipeline stage's; `kv_caches=None` makes a lookup-only connector (no loads
        or saves) on the union of the `stages`' layouts, whose `lookup_record`s the ranks
        adopt."""
    def lookup_record(self, request_id: int) -> bytes | None:
        """A finished lookup as bytes for the ranks' connectors; None while it runs."""
    def adopt_lookup(self, request_id: int, record: bytes) -> None:
        """Takes another connector's lookup_record as this request's finished lookup (in
        place of lookup). ValueError for a live request or another deployment's record."""
    def lookup(
        self,
        request_id: int,
        tokens: Tokens,
        local_match_tokens: int = 0,
        cache_salt: str | None = None,
        adapter: str | None = None,
        *,
        read_later: bool = False,
        append_only: bool = False,
    ) -> None:
        """Starts the lookup of a new request's prompt; never blocks. ValueError for a live
        request id (looked up and not ended, or ended with saves pending). `cache_salt` and
        `adapter` scope the request (R34). `read_later`: a list is copied now and read on
        the runtime's thread (a non-int item then ends the lookup with nothing offered or
        saved, logged, instead of raising). `append_only` (with `read_later`): the caller
        guarantees the list's first len(tokens) items never change until the request ends
        (it may only grow), so the list is read as it is, not copied."""
    def flush(self) -> None:
        """Sends queued lookups now (optional)."""
    def reserve(self, request_id: int, num_computed: int, reservation_id: int) -> tuple[int, bool] | None:
        """None while the lookup runs; else (extra_tokens, is_async). Starts no transfer."""
    def window_save_blocks(
        self, request_id: int, prompt_len: int, computed_before: int, computed_after: int
    ) -> list[list[int]]:
        """Per layout group, the window blocks on_step would save for this chunk (R17, R28);
        empty for full groups."""
    def window_save_schedule(self, request_id: int, prompt_len: int) -> list[tuple[int, list[list[int]]]]:
        """window_save_blocks for every chunk at once: each save point (a checkpoint, the
        prompt end while the window is unsaved), ascending, with per layout group the blocks
        a chunk passing it saves. A chunk saves a subset of the union over the points p with
        computed_before < p <= computed_after; the union adds only sink blocks not computed yet."""
    def release(self, request_id: int, reservation_id: int, start: int, end: int) -> None:
        """The engine trims or gives up tokens [start, end) of a reservation."""
    def on_step(self, requests: Sequence[StepRequest]) -> None:
        """Plans saves and starts loads for what the engine scheduled this step. ValueError,
        and nothing done, for a page outside its group's tensor or a new_reservation that is
        not the request's latest offer or was reported before."""
    def finished_loads(self) -> list[tuple[int, int, bool]]:
        """(reservation_id, request_id, filled) of loads that ended since the last call."""
    def request_finished(self, request_id: int) -> bool:
        """True: keep the request's pages until finished_saves lists it."""
    def finished_saves(self) -> list[int]:
        """Requests whose saves are done or dropped: their pages may be freed."""
    def wait_for_progress(self, timeout_s: float) -> None:
        """Blocks (GIL and lock released; signals checked) until something completes or
        timeout_s passes."""
    def settle_saves(self) -> None:
        """Blocks (GIL released) until every enqueued save is stored, skipped or dropped."""
    def stats(self) -> dict[str, dict[str, Any]]:
        """Counters so far: {"lookups": {...}, "loads": {...}, "saves": {...}, "pool": {...}},
        each keyed by the names in COUNTERS (latencies as "<name>_us" summaries)."""
    def shutdown(self) -> dict[str, dict[str, Any]]:
        """Drains and returns the final counters; idempotent; releases the tensors."""
    def keys(self, tokens: Tokens) -> list[list[str]]:
        """Per full block of tokens, the pool keys of every group and shard. A draft group's
        key names the block with the token after it (R37): a block whose next token is not
        in `tokens` has no draft key."""
    @property
    def layout(self) -> Layout: ...
    @property
    def devices(self) -> list[str]:
        """Each rank's device as torch names it ("cpu", "cuda:0")."""
    @property
    def pool_backend(self) -> str:
        """The pool backend: "memory" or "mooncake"."""
    @property
    def model_key(self) -> str: ...
    @property
    def pool_model_key(self) -> str:
        """{model_key}.{layout fingerprint}: the model key segment of pool keys."""
    @property
    def namespace(self) -> str: ...
    @property
    def closed(self) -> bool:
        """Whether shutdown() has run."""
    def __enter__(self) -> Connector: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

def init_logging(json: bool = False) -> None:
    """Sends the runtime's logs (filtered by RUST_LOG) to stderr; call once, and not
    together with forward_logs (one subscriber per process)."""

def forward_logs(logger: logging.Logger | str | None, level: int | str | None = None) -> None:
    """Emits the runtime's log records to a Python logger (a daemon thread; the runtime's
    threads never take the GIL), at `level` and above (default: the logger's effective
    level); `None` emits what is queued and stops. Not together with init_logging."""

def load_config(
    config: PathLike | dict[str, Any] | None = None,
    *,
    model_key: str | None = None,
    namespace: str | None = None,
) -> dict[str, dict[str, Any]]:
    """The effective configuration a Connector with these arguments would start with
    (defaults < config < KVC_* environment), validated as it would be; raises its ConfigError."""

def shutdown_all() -> None:
    """Shuts down every connector still running (registered with atexit on import)."""
