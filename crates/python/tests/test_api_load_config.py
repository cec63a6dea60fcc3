"""`kv_connector.load_config`: the effective configuration a Connector would start with,
from the same layers (defaults < path or dict < KVC_* environment), refused with the same
ConfigError, without starting one."""

import pytest

import kv_connector as kvc
from api_support import caches, layout


def test_layers_apply_in_order(tmp_path, monkeypatch):
    defaults = kvc.load_config()
    assert {"pool", "loaders", "saver", "stats", "keys"} <= set(defaults)
    assert defaults["stats"]["interval_s"] == 30
    path = tmp_path / "kvc.toml"
    path.write_text("[stats]\ninterval_s = 5\n")
    assert kvc.load_config(path)["stats"]["interval_s"] == 5
    assert kvc.load_config(str(path))["stats"]["interval_s"] == 5
    assert kvc.load_config({"stats": {"interval_s": 6}})["stats"]["interval_s"] == 6
    monkeypatch.setenv("KVC_STATS_INTERVAL_S", "7")
    assert kvc.load_config({"stats": {"interval_s": 6}})["stats"]["interval_s"] == 7
    given = kvc.load_config(model_key="llama-3.1-8b", namespace="tenant-a")["keys"]
    assert (given["model_key"], given["namespace"]) == ("llama-3.1-8b", "tenant-a")


@pytest.mark.parametrize(
    "config, words",
    [
        ({"stats": {"interval_s": 0}}, "stats.interval_s"),
        ({"pool": {"capacity_bytes": 0}}, "pool.capacity_bytes"),
        ({"stats": {"interval_sec": 1}}, "interval_sec"),
    ],
)
def test_refusals_are_the_connectors_own(config, words):
    with pytest.raises(kvc.ConfigError) as checked:
        kvc.load_config(config)
    with pytest.raises(kvc.ConfigError) as started:
        kvc.Connector(layout=layout(), kv_caches=caches(), config=config)
    assert words in str(checked.value)
    assert (checked.value.kind, str(checked.value)) == (started.value.kind, str(started.value))


def test_files_and_key_segments_are_named(tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(kvc.ConfigError, match="missing.toml"):
        kvc.load_config(missing)
    bad = tmp_path / "bad.toml"
    bad.write_text("[stats\n")
    with pytest.raises(kvc.ConfigError, match="bad.toml"):
        kvc.load_config(bad)
    with pytest.raises(kvc.ConfigError, match="keys.model_key"):
        kvc.load_config(model_key="llama/8b")
    with pytest.raises(kvc.ConfigError, match="keys.namespace"):
        kvc.load_config(namespace="")
