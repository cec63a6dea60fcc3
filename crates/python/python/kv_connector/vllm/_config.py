"""The connector's settings from `kv_transfer_config.kv_connector_extra_config`.

Keys (every one optional; unknown keys are refused):

- `config`: path of a kv_connector TOML file;
- `kvc`: a dict with the TOML tree (it wins over the file, key by key);
- `model_key`, `namespace`, `salt`: the key segments and the cache salt of
  `kv_connector.Connector`;
- `bounce_pages`: pages per sliding-window group for window loads and saves (default 256);
- `shared_pool`: a name; engines of one process that give the same name share one
  embedded `MemoryPool` (capacity `pool.capacity_bytes` of the configuration).

The runtime's own environment variables (`KVC_<SECTION>_<KEY>`) override both sources,
as everywhere in kv_connector.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

from ._layout import UnsupportedVllmSetup

KEYS = ("config", "kvc", "model_key", "namespace", "salt", "bounce_pages", "shared_pool")
DEFAULT_BOUNCE_PAGES = 256


@dataclass(frozen=True)
class Settings:
    config: dict[str, Any] | str | None
    model_key: str | None = None
    namespace: str | None = None
    salt: str | None = None
    bounce_pages: int = DEFAULT_BOUNCE_PAGES
    shared_pool: str | None = None
    tree: dict[str, Any] = field(default_factory=dict)  # the merged tree, for reading values


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def settings(extra: dict[str, Any] | None) -> Settings:
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(KEYS))
    if unknown:
        raise UnsupportedVllmSetup(
            f"unknown kv_connector_extra_config keys {unknown}; known: {list(KEYS)}"
        )
    path, tree = extra.get("config"), extra.get("kvc")
    if tree is not None and not isinstance(tree, dict):
        raise UnsupportedVllmSetup("kv_connector_extra_config.kvc must be a dict (the TOML tree)")
    file_tree: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            file_tree = tomllib.load(f)
    merged = _merge(file_tree, tree or {})
    # The runtime reads a path itself (its messages then name the file); a dict when
    # keys are given inline.
    config: dict[str, Any] | str | None = merged if tree else (str(path) if path is not None else None)
    bounce = extra.get("bounce_pages", DEFAULT_BOUNCE_PAGES)
    if not isinstance(bounce, int) or bounce < 1:
        raise UnsupportedVllmSetup(f"kv_connector_extra_config.bounce_pages={bounce!r}: give a positive integer")
    return Settings(
        config=config,
        model_key=extra.get("model_key"),
        namespace=extra.get("namespace"),
        salt=extra.get("salt"),
        bounce_pages=bounce,
        shared_pool=extra.get("shared_pool"),
        tree=merged,
    )
