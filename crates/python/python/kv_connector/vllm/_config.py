"""The connector's settings from `kv_transfer_config`, checked when vLLM constructs the
connector (before the weights load), every refusal naming its key and a value that works.

`kv_connector_extra_config` keys (every one optional; unknown keys are refused):

- `config`: path of a kv_connector TOML file (a `str` or `os.PathLike`);
- `kvc`: a dict with the TOML tree (it wins over the file, key by key);
- `model_key`, `namespace`, `salt`: the key segments and the cache salt of
  `kv_connector.Connector` (strings);
- `bounce_pages`: pages per sliding-window group for window loads and saves (an int in
  1..MAX_BOUNCE_PAGES); by default sized at start from the model's window, its
  `max_model_len` and the runtime's rewind and checkpoint interval
  (`_pages.bounce_pages_needed`), at least DEFAULT_BOUNCE_PAGES;
- `shared_pool`: a name; engines of one process that give the same name share one
  embedded `MemoryPool` (capacity `pool.capacity_bytes` of the configuration);
- `log_to_vllm`: `true` (default) emits the runtime's log records through vLLM's logger
  `vllm.kv_connector`; `false` leaves them alone.

The runtime's own environment variables (`KVC_<SECTION>_<KEY>`) override both sources,
as everywhere in kv_connector. The whole runtime tree is loaded and validated here
(`kv_connector.load_config`): its refusals are the runtime's `ConfigError`, the message
prefixed with the extra-config key it came from. Everything else is `UnsupportedVllmSetup`.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

import kv_connector as kvc

from ._layout import UnsupportedVllmSetup

KEYS = ("config", "kvc", "model_key", "namespace", "salt", "bounce_pages", "shared_pool", "log_to_vllm")
DEFAULT_BOUNCE_PAGES = 256
# A window load or save holds ceil(window / block_size) + 1 pages of its group only while
# it moves, one window per prompt (R15, R17): 65,536 pages carry over 7,000 moves of a
# 128-token window in 16-token blocks at once, beyond any max_num_seqs, and at
# gpt-oss-120b's 576 KiB window pages they are already 36 GiB of the KV cache's device.
MAX_BOUNCE_PAGES = 1 << 16
EXTRA = "kv_connector_extra_config"


@dataclass(frozen=True)
class Settings:
    config: dict[str, Any] | str | None
    model_key: str | None = None
    namespace: str | None = None
    salt: str | None = None
    bounce_pages: int | None = None  # None: sized at start (`_pages.bounce_pages_needed`)
    shared_pool: str | None = None
    log_to_vllm: bool = True
    runtime: dict[str, Any] = field(default_factory=dict)  # the effective runtime configuration


def check_transfer(kv_transfer_config) -> None:
    """The transfer settings the connector serves: a prefix cache (`kv_both`) whose failed
    loads vLLM computes (`recompute`)."""
    role = kv_transfer_config.kv_role
    if role != "kv_both":
        raise UnsupportedVllmSetup(
            f"kv_role={role!r}: the connector is a prefix cache that saves and loads on every "
            'engine, not a disaggregated prefill/decode hand-off; use "kv_role": "kv_both"'
        )
    policy = getattr(kv_transfer_config, "kv_load_failure_policy", "fail")
    if policy != "recompute":
        raise UnsupportedVllmSetup(
            f"kv_load_failure_policy={policy!r}: a load the connector refuses (an evicted or "
            'corrupt object) would fail the request; use "kv_load_failure_policy": "recompute"'
        )


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _optional_str(extra: dict, key: str, example: str) -> str | None:
    value = extra.get(key)
    if value is not None and not isinstance(value, str):
        raise UnsupportedVllmSetup(f"{EXTRA}.{key}={value!r}: give a string, e.g. {example!r}")
    return value


def _bounce_pages(extra: dict) -> int | None:
    if "bounce_pages" not in extra:
        return None
    value = extra["bounce_pages"]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BOUNCE_PAGES:
        raise UnsupportedVllmSetup(
            f"{EXTRA}.bounce_pages={value!r}: give an integer from 1 to {MAX_BOUNCE_PAGES} "
            f"(pages per sliding-window group), e.g. {DEFAULT_BOUNCE_PAGES}"
        )
    return value


def _path(extra: dict) -> str | None:
    value = extra.get("config")
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise UnsupportedVllmSetup(
            f"{EXTRA}.config={value!r}: give the path of a kv_connector TOML file as a string, "
            'e.g. "/etc/kv_connector.toml"'
        )
    return os.fspath(value)


def _refusal(key: str | None, message: str, kind: str) -> kvc.ConfigError:
    """A `ConfigError` of `kind` whose message starts with the extra-config key (`None`:
    none was given, the defaults or a `KVC_*` variable are refused)."""
    where = f"{EXTRA}.{key}" if key else "the kv_connector configuration (defaults < KVC_* environment)"
    refused = kvc.ConfigError(f"{where}: {message}")
    refused.kind = kind
    return refused


def _read_toml(path: str) -> dict[str, Any]:
    """The file's tree, for merging `kvc` over it (the runtime validates the result); its
    refusals are those the runtime gives for a file (`io`, `toml`)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as error:
        raise _refusal(
            "config",
            f"cannot read {path} ({error.strerror or error}); give the path of a readable "
            "kv_connector TOML file (config/default.toml lists every key)",
            "io",
        ) from error
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise _refusal("config", f"{path} is not valid TOML: {error}", "toml") from error


def _runtime(config: dict[str, Any] | str | None, key: str | None, **segments: str) -> dict[str, Any]:
    """The runtime's effective configuration; its `ConfigError` names the extra-config key."""
    try:
        return kvc.load_config(config, **segments)
    except kvc.ConfigError as error:
        raise _refusal(key, str(error), error.kind) from error


def settings(extra: dict[str, Any] | None) -> Settings:
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(KEYS))
    if unknown:
        raise UnsupportedVllmSetup(f"unknown {EXTRA} keys {unknown}; known: {list(KEYS)}")
    path, tree = _path(extra), extra.get("kvc")
    if tree is not None and not isinstance(tree, dict):
        raise UnsupportedVllmSetup(
            f'{EXTRA}.kvc={tree!r}: give a dict with the TOML tree, e.g. {{"pool": {{"capacity_bytes": 8589934592}}}}'
        )
    log_to_vllm = extra.get("log_to_vllm", True)
    if not isinstance(log_to_vllm, bool):
        raise UnsupportedVllmSetup(f"{EXTRA}.log_to_vllm={log_to_vllm!r}: give true or false")
    model_key = _optional_str(extra, "model_key", "llama-3.1-8b")
    namespace = _optional_str(extra, "namespace", "kvc")
    salt = _optional_str(extra, "salt", "tenant-a")
    shared_pool = _optional_str(extra, "shared_pool", "node")
    bounce = _bounce_pages(extra)
    file_tree = _read_toml(path) if path is not None and tree else {}
    merged = _merge(file_tree, tree or {})
    # The runtime reads a path itself (its messages then name the file); a dict when
    # keys are given inline.
    config: dict[str, Any] | str | None = merged if tree else path
    runtime = _runtime(config, "kvc" if tree else ("config" if path is not None else None))
    if model_key is not None:
        _runtime(config, "model_key", model_key=model_key)
    if namespace is not None:
        _runtime(config, "namespace", namespace=namespace)
    return Settings(
        config=config,
        model_key=model_key,
        namespace=namespace,
        salt=salt,
        bounce_pages=bounce,
        shared_pool=shared_pool,
        log_to_vllm=log_to_vllm,
        runtime=runtime,
    )
