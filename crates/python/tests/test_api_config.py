"""Configuration sources of a connector: none, a TOML path, a dict, and `KVC_*` variables
over them (defaults < TOML/dict < environment, as in the binary); refusals are
ConfigError with the runtime's message and kind."""

import socket
from pathlib import Path

import pytest

import kv_connector as kvc
from api_support import SMALL_STAGING, caches, layout


def connect(config, **kwargs):
    return kvc.Connector(layout=layout(), kv_caches=caches(), config=config, **kwargs)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No KVC_* or legacy variable of the outer environment leaks into these tests."""
    import os

    for name in list(os.environ):
        if name.startswith(("KVC_", "TRTLLM_MOONCAKE_STORE_")):
            monkeypatch.delenv(name)
    # A memory pool takes (touches) its capacity at start: 64 MiB, not the 8 GiB default.
    monkeypatch.setenv("KVC_POOL_CAPACITY_BYTES", "64MiB")


def test_defaults_name_keys_after_the_layout():
    with connect(None, model_key=None) as conn:
        assert conn.namespace == "kvc"
        assert conn.model_key == "tiny-gpt-oss"
        assert conn.pool_backend == "memory"
        assert conn.keys(list(range(16)))[0][0].startswith(f"kvc/tiny-gpt-oss.{layout().fingerprint}/w1r0/lg0/t16b8192/")


def test_dict_and_toml_path_give_the_same_configuration(tmp_path):
    text = '[keys]\nnamespace = "fromfile"\nmodel_key = "m1"\n[loaders]\nstaging_bytes_per_loader = "4MiB"\n'
    path = tmp_path / "kvc.toml"
    path.write_text(text + '[saver]\nstaging_bytes = 4194304\n')
    for source in (path, str(path)):
        with connect(source) as conn:
            assert (conn.namespace, conn.model_key) == ("fromfile", "m1")
    as_dict = {"keys": {"namespace": "fromdict", "model_key": "m1"}, **SMALL_STAGING}
    with connect(as_dict) as conn:
        assert (conn.namespace, conn.model_key) == ("fromdict", "m1")


def test_arguments_win_over_the_configuration():
    config = {"keys": {"namespace": "cfg", "model_key": "cfgmodel"}, **SMALL_STAGING}
    with connect(config, namespace="arg", model_key="argmodel") as conn:
        assert (conn.namespace, conn.model_key) == ("arg", "argmodel")
        assert conn.keys(list(range(32)))[1][0].startswith("arg/argmodel.")


def test_environment_wins_over_dict_and_file(monkeypatch, tmp_path):
    monkeypatch.setenv("KVC_KEYS_NAMESPACE", "fromenv")
    with connect({"keys": {"namespace": "fromdict"}, **SMALL_STAGING}) as conn:
        assert conn.namespace == "fromenv"
    path = tmp_path / "kvc.toml"
    path.write_text('[keys]\nnamespace = "fromfile"\n')
    with connect(path) as conn:
        assert conn.namespace == "fromenv"


def test_a_salt_scopes_every_key():
    plain, salted = connect(SMALL_STAGING), connect(SMALL_STAGING, salt="tenant-a")
    try:
        tokens = list(range(48))
        assert plain.keys(tokens) != salted.keys(tokens)
        assert [len(block) for block in plain.keys(tokens)] == [2, 2, 2], "one key per group and shard"
        assert plain.keys(tokens[:40]) == plain.keys(tokens)[:2], "full blocks only"
    finally:
        plain.shutdown()
        salted.shutdown()


@pytest.mark.parametrize(
    "config, kind, words",
    [
        ({"loaders": {"load_threadz": 2}}, "unknown_key", "loaders.load_threadz"),
        ({"pool": {"backend": "redis"}}, "invalid_value", "redis"),
        ({"keys": {"namespace": "a/b"}}, None, "namespace"),
        ({"loaders": {"load_threads": 0}}, None, "load_threads"),
    ],
)
def test_refused_dicts_raise_config_error(config, kind, words):
    with pytest.raises(kvc.KvConnectorError) as refused:
        connect({**SMALL_STAGING, **config})
    assert isinstance(refused.value, kvc.ConfigError)
    assert words in str(refused.value)
    assert kind is None or refused.value.kind == kind


def test_refused_environment_and_files(monkeypatch, tmp_path):
    monkeypatch.setenv("KVC_LOADERS_LOAD_THREADS", "many")
    with pytest.raises(kvc.ConfigError) as bad_value:
        connect(SMALL_STAGING)
    assert bad_value.value.kind == "invalid_value" and "KVC_LOADERS_LOAD_THREADS" in str(bad_value.value)
    monkeypatch.delenv("KVC_LOADERS_LOAD_THREADS")
    monkeypatch.setenv("KVC_NO_SUCH_KEY", "1")
    with pytest.raises(kvc.ConfigError, match="KVC_NO_SUCH_KEY"):
        connect(SMALL_STAGING)
    monkeypatch.delenv("KVC_NO_SUCH_KEY")
    with pytest.raises(kvc.ConfigError) as missing:
        connect(tmp_path / "missing.toml")
    assert missing.value.kind == "io" and "missing.toml" in str(missing.value)
    broken = tmp_path / "broken.toml"
    broken.write_text("[keys\n")
    with pytest.raises(kvc.ConfigError) as malformed:
        connect(broken)
    assert malformed.value.kind == "toml"


def test_python_misuse_of_config_is_a_python_error():
    with pytest.raises(ValueError, match="None has no TOML form"):
        connect({"keys": {"namespace": None}})
    with pytest.raises(TypeError):
        connect(42)


def test_a_legacy_variable_overridden_by_its_new_name_warns(monkeypatch):
    monkeypatch.setenv("TRTLLM_MOONCAKE_STORE_LOAD_THREADS", "3")
    monkeypatch.setenv("KVC_LOADERS_LOAD_THREADS", "2")
    with pytest.warns(UserWarning, match="TRTLLM_MOONCAKE_STORE_LOAD_THREADS"):
        connect(SMALL_STAGING).shutdown()


def test_device_kind_must_agree_with_the_tensors():
    with pytest.raises(kvc.ConfigError) as refused:
        connect({"device": {"kind": "cuda"}, **SMALL_STAGING})
    assert refused.value.kind == "device_kind" and "cpu tensors" in str(refused.value)
    connect({"device": {"kind": "host"}, **SMALL_STAGING}).shutdown()


def test_a_mooncake_backend_without_a_master_fails_fast_naming_the_setting():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {"pool": {"backend": "mooncake"}, "mooncake": {"master_address": f"127.0.0.1:{port}"}, **SMALL_STAGING}
    with pytest.raises(kvc.PoolError) as refused:
        connect(config)
    assert refused.value.kind == "unreachable"
    assert "master_address" in str(refused.value) and str(port) in str(refused.value)


def test_paths_may_be_pathlike(tmp_path):
    path = Path(tmp_path) / "kvc.toml"
    path.write_text('[keys]\nnamespace = "p"\n[loaders]\nstaging_bytes_per_loader = 4194304\n')
    with connect(path) as conn:
        assert conn.namespace == "p"
