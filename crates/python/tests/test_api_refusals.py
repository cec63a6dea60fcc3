"""What the package refuses because it cannot honour it, and how: a pool larger than the
host (a PoolError at start, before any of it is touched) and the memory of a pool that
starts (resident at start), a node budget checked against the pool actually used, a
MemoryPool under a Mooncake configuration, keys the package never reads, and integers
out of range (a ValueError naming the argument, or the token's index and value). Also
the one configuration path of `MemoryPool.from_config`, which vLLM's `shared_pool` uses."""

import os
import re

import numpy as np
import pytest
import torch

import kv_connector as kvc
from api_support import SMALL_STAGING, caches, import_vllm, layout

MIB = 1 << 20
GIB = 1 << 30


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No KVC_* or legacy variable of the outer environment leaks into these tests."""
    for name in list(os.environ):
        if name.startswith(("KVC_", "TRTLLM_MOONCAKE_STORE_")):
            monkeypatch.delenv(name)


def meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/meminfo")


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def connect(pool=None, config=None, **kwargs):
    return kvc.Connector(layout=layout(), kv_caches=caches(), pool=pool, config={**SMALL_STAGING, **(config or {})}, **kwargs)


# ---- the pool's memory ----


def test_a_pool_larger_than_the_host_fails_at_start_naming_a_capacity_that_fits():
    if meminfo("MemTotal") >= 1 << 40:
        pytest.skip("this host holds 1 TiB")
    pool = kvc.MemoryPool(capacity_bytes=1 << 40)
    with pytest.raises(kvc.PoolError) as refused:
        connect(pool)
    text = str(refused.value)
    fits = re.search(r"pool\.capacity_bytes=(\d+)MiB", text)
    assert fits, text
    assert 0 < int(fits.group(1)) * MIB < meminfo("MemTotal"), text
    assert "MemoryPool(capacity_bytes=1099511627776)" in text, "names the pool given"
    # The configured backend refuses the same capacity the same way.
    with pytest.raises(kvc.PoolError, match=r"pool\.capacity_bytes=\d+MiB"):
        connect(config={"pool": {"capacity_bytes": 1 << 40}})


def test_the_capacity_is_resident_once_the_first_connector_started():
    capacity = 256 * MIB
    if meminfo("MemAvailable") < 4 * capacity:
        pytest.skip("not enough free memory on this host")
    kv = caches()
    pool = kvc.MemoryPool(capacity_bytes=capacity)
    before = resident_bytes()
    with kvc.Connector(layout=layout(), kv_caches=kv, pool=pool, config=SMALL_STAGING):
        grown = resident_bytes() - before
    assert grown >= capacity * 9 // 10, f"{grown} bytes became resident for a {capacity}-byte pool"


# ---- the node budget counts the pool actually used ----


def test_the_node_budget_counts_the_pool_given_not_the_configured_capacity():
    with pytest.raises(kvc.ConfigError) as refused:
        connect(kvc.MemoryPool(capacity_bytes=64 * GIB), {"node": {"memory_budget_bytes": 16 * GIB}})
    assert refused.value.kind == "budget"
    text = str(refused.value)
    assert "node.memory_budget_bytes" in text and "MemoryPool(capacity_bytes=68719476736)" in text, text
    # A pool within the budget starts, though the configured capacity (8 GiB) is not.
    with connect(kvc.MemoryPool(capacity_bytes=64 * MIB), {"node": {"memory_budget_bytes": GIB}}) as conn:
        assert conn.pool_backend == "memory"


# ---- one pool backend ----


def test_a_memory_pool_under_a_mooncake_configuration_is_refused():
    with pytest.raises(kvc.ConfigError) as refused:
        connect(kvc.MemoryPool(capacity_bytes=16 * MIB), {"pool": {"backend": "mooncake"}})
    text = str(refused.value)
    assert "pool.backend" in text and "pool=None" in text, text


def test_from_config_takes_the_pool_settings_of_the_configuration(monkeypatch, tmp_path):
    pool = kvc.MemoryPool.from_config({"pool": {"capacity_bytes": "64MiB", "eviction_ratio": 0.1}})
    assert pool.capacity_bytes == 64 * MIB
    assert kvc.MemoryPool.from_config().capacity_bytes == 8 * GIB, "the runtime's default"
    path = tmp_path / "kvc.toml"
    path.write_text('[pool]\ncapacity_bytes = "48MiB"\n')
    assert kvc.MemoryPool.from_config(path).capacity_bytes == 48 * MIB
    monkeypatch.setenv("KVC_POOL_CAPACITY_BYTES", "32MiB")
    assert kvc.MemoryPool.from_config({"pool": {"capacity_bytes": "64MiB"}}).capacity_bytes == 32 * MIB
    assert kvc.MemoryPool.from_config(None).capacity_bytes == 32 * MIB
    with pytest.raises(kvc.ConfigError) as refused:
        kvc.MemoryPool.from_config({"pool": {"capacity_bytes": "64 apples"}})
    assert "pool.capacity_bytes" in str(refused.value)
    with pytest.raises(kvc.ConfigError) as mooncake:
        kvc.MemoryPool.from_config({"pool": {"backend": "mooncake"}})
    assert "pool.backend" in str(mooncake.value)


def test_vllm_shared_pool_reads_the_configuration_as_the_connector_does(monkeypatch):
    import_vllm()
    from kv_connector.vllm import _config, _engine

    settings = _config.settings({"shared_pool": "refusals-a", "kvc": {"pool": {"capacity_bytes": "64MiB"}}})
    assert _engine.shared_pool(settings.shared_pool, settings.config).capacity_bytes == 64 * MIB
    monkeypatch.setenv("KVC_POOL_CAPACITY_BYTES", "32MiB")
    settings = _config.settings({"shared_pool": "refusals-b"})
    assert _engine.shared_pool(settings.shared_pool, settings.config).capacity_bytes == 32 * MIB
    monkeypatch.delenv("KVC_POOL_CAPACITY_BYTES")
    settings = _config.settings({"shared_pool": "refusals-c", "kvc": {"pool": {"backend": "mooncake"}}})
    with pytest.raises(kvc.ConfigError, match="pool.backend"):
        _engine.shared_pool(settings.shared_pool, settings.config)


# ---- keys the package does not read ----


@pytest.mark.parametrize(
    "config, key, instead",
    [
        ({"stats": {"metrics_addr": "127.0.0.1:9464"}}, "stats.metrics_addr", "conn.stats()"),
        ({"model": {"preset": "llama-3.1-8b"}}, "model.preset", "layout"),
        ({"model": {"layout_file": "/tmp/layout.toml"}}, "model.layout_file", "Layout.from_toml"),
    ],
)
def test_keys_the_package_does_not_read_are_refused(config, key, instead):
    with pytest.raises(kvc.ConfigError) as refused:
        connect(config=config)
    text = str(refused.value)
    assert key in text and instead in text, text
    with pytest.raises(kvc.ConfigError, match=re.escape(key)):
        kvc.MemoryPool.from_config(config)


def test_keys_the_package_does_not_read_are_refused_from_the_environment(monkeypatch):
    monkeypatch.setenv("KVC_MODEL_PRESET", "gpt-oss-120b")
    with pytest.raises(kvc.ConfigError, match="model.preset"):
        connect()


# ---- integers ----


def test_negative_ids_and_counts_are_value_errors_naming_the_argument():
    pool = kvc.MemoryPool(capacity_bytes=16 * MIB)
    with connect(pool) as conn:
        for call, name in [
            (lambda: conn.lookup(-1, [1, 2]), "request_id"),
            (lambda: conn.lookup(1, [1, 2], local_match_tokens=-16), "local_match_tokens"),
            (lambda: conn.reserve(-1, 0, 1), "request_id"),
            (lambda: conn.reserve(1, -1, 1), "num_computed"),
            (lambda: conn.reserve(1, 0, -1), "reservation_id"),
            (lambda: conn.release(1, 1, -1, 0), "start"),
            (lambda: conn.request_finished(-1), "request_id"),
        ]:
            with pytest.raises(ValueError, match=name) as refused:
                call()
            assert not isinstance(refused.value, OverflowError), refused.value
        with pytest.raises(TypeError, match="request_id"):
            conn.lookup("one", [1, 2])
        conn.lookup(2**64 - 1, [1, 2])  # the largest id is accepted
    for build, name in [
        (lambda: kvc.MemoryPool(capacity_bytes=-1), "capacity_bytes"),
        (lambda: kvc.MemoryPool(16 * MIB, kv_lease_ttl_ms=-5), "kv_lease_ttl_ms"),
        (lambda: kvc.StepRequest(request_id=-1, prompt_len=16, computed_before=0, computed_after=16), "request_id"),
        (lambda: kvc.StepRequest(1, -16, 0, 16), "prompt_len"),
        (lambda: kvc.StepRequest(1, 16, 0, 16, new_reservation=-2), "new_reservation"),
    ]:
        with pytest.raises(ValueError, match=name) as refused:
            build()
        assert not isinstance(refused.value, OverflowError), refused.value
    assert kvc.StepRequest(1, 16, 0, 16, new_reservation=None).new_reservation is None
    if "faults" in kvc.FEATURES:
        with pytest.raises(ValueError, match="count"):
            pool.corrupt(None, -1)


def test_a_token_out_of_range_is_named_with_its_index_and_value():
    with connect(kvc.MemoryPool(capacity_bytes=16 * MIB)) as conn:
        with pytest.raises(ValueError, match=r"tokens\[2\] = 9223372036854775808") as refused:
            conn.lookup(1, [5, 6, 2**63])
        assert "out of range" in str(refused.value)
        with pytest.raises(ValueError, match=r"tokens\[1\] = 18446744073709551615"):
            conn.keys(np.array([1, 2**64 - 1], dtype=np.uint64))
        with pytest.raises(TypeError, match=r"tokens\[1\]"):
            conn.lookup(1, [5, "six"])


def test_integer_arrays_of_every_width_give_the_keys_of_the_list():
    tokens = list(range(100, 164))
    with connect(kvc.MemoryPool(capacity_bytes=16 * MIB)) as conn:
        want = conn.keys(tokens)
        for dtype in (np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64):
            assert conn.keys(np.array(tokens, dtype=dtype)) == want, dtype
        assert conn.keys(np.repeat(np.array(tokens, dtype=np.int32), 2)[::2]) == want, "a strided view"
        for dtype in (torch.int16, torch.int32, torch.int64):
            assert conn.keys(torch.tensor(tokens, dtype=dtype)) == want, dtype
        assert conn.keys(torch.tensor(tokens, dtype=torch.int32).repeat_interleave(2)[::2]) == want
        small = [t % 200 for t in tokens]
        assert conn.keys(np.array(small, dtype=np.uint8)) == conn.keys(small)
        assert conn.keys(np.array([-5] * 16, dtype=np.int8)) == conn.keys([-5] * 16)
