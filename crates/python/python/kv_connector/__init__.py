"""kv_connector: share prompt KV cache between LLM serving instances (Python bindings).

An engine registers its KV cache tensors once (one page-major tensor per layer group) and
calls the connector's hooks from its scheduler thread: ``lookup`` when a request arrives,
``reserve`` until it answers, ``on_step`` every step, ``finished_loads`` /
``finished_saves`` to learn what completed, ``request_finished`` and ``shutdown``. The
runtime saves prompt pages to a pool (the embedded ``MemoryPool`` or Mooncake Store) and
loads reusable prefixes back into the engine's own tensors, in place, on its own threads.
See docs/PYTHON.md for the hook loop, the tensor rules and the threading model.
"""

from __future__ import annotations

import atexit

from kv_connector._logs import forward_logs
from kv_connector._native import (
    COUNTERS,
    FEATURES,
    METRIC_FAMILIES,
    ConfigError,
    Connector,
    DeviceError,
    KvConnectorError,
    Layout,
    LayoutError,
    MemoryPool,
    PoolError,
    StepRequest,
    __version__,
    init_logging,
    load_config,
    shutdown_all,
)

__all__ = [
    "COUNTERS",
    "FEATURES",
    "METRIC_FAMILIES",
    "ConfigError",
    "Connector",
    "DeviceError",
    "KvConnectorError",
    "Layout",
    "LayoutError",
    "MemoryPool",
    "PoolError",
    "StepRequest",
    "__version__",
    "forward_logs",
    "init_logging",
    "load_config",
    "shutdown_all",
]

# Connectors still running at interpreter exit are shut down before the interpreter
# finalizes, while their threads (a Mooncake client's take the GIL) can still run.
atexit.register(shutdown_all)
