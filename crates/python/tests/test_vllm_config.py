"""`kv_connector.vllm.KvcConnector` checks its whole configuration when vLLM constructs it
(before the weights load): every refusal names its key and a value that works. And the
runtime's log records reach vLLM's logging unless `log_to_vllm` is false."""

import logging
import os

import pytest

from api_support import import_vllm
from test_api_logs import Collect

vllm = import_vllm()

import kv_connector as kvc  # noqa: E402
import vllm_support as vs  # noqa: E402
from models import scenarios, tiny  # noqa: E402

EXTRA = "kv_connector_extra_config"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return vs.write_model_dir(tiny.SPECS["llama"], tmp_path_factory.mktemp("model"))


def construct(model_dir, extra, **transfer):
    """The connector's scheduler side as vLLM's factory constructs it."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from kv_connector.vllm import KvcConnector

    config = vs.vllm_config(model_dir, extra=extra)
    for name, value in transfer.items():
        setattr(config.kv_transfer_config, name, value)
    return KvcConnector(config, KVConnectorRole.SCHEDULER, None)


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"bounce_pages": True}, ["bounce_pages=True", "e.g. 256"]),
        ({"bounce_pages": 10**12}, ["bounce_pages=1000000000000", "1 to 65536"]),
        ({"bounce_pages": 0}, ["bounce_pages=0"]),
        ({"bounce_pages": "256"}, ["bounce_pages='256'"]),
        ({"model_key": 5}, ["model_key=5", "give a string"]),
        ({"namespace": 5}, ["namespace=5"]),
        ({"salt": 5}, ["salt=5"]),
        ({"shared_pool": 5}, ["shared_pool=5"]),
        ({"kvc": "pool"}, ["kvc='pool'", "capacity_bytes"]),
        ({"config": 3.5}, ["config=3.5", "path of a kv_connector TOML file"]),
        ({"log_to_vllm": "no"}, ["log_to_vllm='no'", "true or false"]),
        ({"bounce": 1}, ["unknown", "'bounce'", "bounce_pages"]),
    ],
)
def test_extra_config_values_are_refused_at_construction(model_dir, extra, words):
    with pytest.raises(vllm_setup()) as refused:
        construct(model_dir, extra)
    message = str(refused.value)
    assert EXTRA in message
    for word in words:
        assert word in message, (word, message)


def vllm_setup():
    from kv_connector.vllm import UnsupportedVllmSetup

    return UnsupportedVllmSetup


def test_a_file_descriptor_is_no_config_path(model_dir, tmp_path):
    path = tmp_path / "kvc.toml"
    path.write_text("[stats]\ninterval_s = 5\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(vllm_setup(), match=f"{EXTRA}.config={fd}"):
            construct(model_dir, {"config": fd})
        os.fstat(fd)  # the engine's descriptor is still open
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "extra, key, kind, words",
    [
        ({"kvc": {"pool": {"capacity_bytes": 0}}}, "kvc", "out_of_range", ["pool.capacity_bytes"]),
        ({"kvc": {"stats": {"interval_sec": 1}}}, "kvc", "unknown_key", ["interval_sec"]),
        ({"model_key": "llama/8b"}, "model_key", "out_of_range", ["keys.model_key", "'/'"]),
        ({"namespace": ""}, "namespace", "out_of_range", ["keys.namespace", '"kvc"']),
    ],
)
def test_the_runtime_tree_is_validated_at_construction(model_dir, extra, key, kind, words):
    with pytest.raises(kvc.ConfigError) as refused:
        construct(model_dir, {"shared_pool": "config-check", **extra})
    message = str(refused.value)
    assert message.startswith(f"{EXTRA}.{key}: ") and refused.value.kind == kind, message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("with_kvc", [False, True])
def test_config_files_that_are_missing_or_not_toml_are_named(model_dir, tmp_path, with_kvc):
    inline = {"kvc": {"stats": {"interval_s": 2}}} if with_kvc else {}
    missing = tmp_path / "missing.toml"
    with pytest.raises(kvc.ConfigError) as refused:
        construct(model_dir, {"config": str(missing), **inline})
    assert str(refused.value).startswith(f"{EXTRA}.config: ") and "missing.toml" in str(refused.value)
    assert refused.value.kind == "io"
    bad = tmp_path / "bad.toml"
    bad.write_text("[stats\n")
    with pytest.raises(kvc.ConfigError) as refused:
        construct(model_dir, {"config": bad, **inline})
    assert str(refused.value).startswith(f"{EXTRA}.config: ") and "bad.toml" in str(refused.value)
    assert refused.value.kind == "toml"


def test_kvc_wins_over_the_file_key_by_key(model_dir, tmp_path):
    path = tmp_path / "kvc.toml"
    path.write_text('[stats]\ninterval_s = 5\ninstance = "from-file"\n')
    conn = construct(model_dir, {"config": path, "kvc": {"stats": {"interval_s": 2}}, "log_to_vllm": False})
    stats = conn._settings.runtime["stats"]
    assert (stats["interval_s"], stats["instance"]) == (2, "from-file")


@pytest.mark.parametrize(
    "setting, value, works",
    [
        ("kv_role", "kv_producer", '"kv_role": "kv_both"'),
        ("kv_role", "kv_consumer", '"kv_role": "kv_both"'),
        ("kv_load_failure_policy", "fail", '"kv_load_failure_policy": "recompute"'),
    ],
)
def test_transfer_settings_other_than_a_prefix_cache_are_refused(model_dir, setting, value, works):
    with pytest.raises(vllm_setup()) as refused:
        construct(model_dir, {}, **{setting: value})
    assert f"{setting}={value!r}" in str(refused.value) and works in str(refused.value)


# ---- logs ----


def engine(model_dir, pool: str, instance: str, **extra) -> vs.VllmInstance:
    spec = tiny.SPECS["llama"]
    config = scenarios.config({"stats": {"instance": instance}})
    return vs.VllmInstance(spec, tiny.build_model(spec), model_dir, extra={"shared_pool": pool, "kvc": config, **extra})


@pytest.fixture
def vllm_records():
    """What reaches the logger vLLM's handlers sit on ("vllm", at INFO as `vllm serve`
    configures it), from a clean start."""
    kvc.forward_logs(None)
    handler = Collect()
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    vllm_logger.setLevel(logging.INFO)
    vllm_logger.addHandler(handler)
    yield handler
    vllm_logger.removeHandler(handler)
    vllm_logger.setLevel(level)
    kvc.forward_logs(None)


def stopped(instance: str):
    return lambda r: r.name == "vllm.kv_connector" and f'instance="{instance}"' in r.getMessage()


def test_runtime_records_reach_vllms_logging_by_default(model_dir, vllm_records):
    inst = engine(model_dir, "logs-default", "vllm-logs")
    inst.close()  # the runtime logs "connector stopped" at INFO
    record = vllm_records.wait_for(stopped("vllm-logs"), "the runtime's stop line")
    assert record.levelno == logging.INFO and "connector stopped" in record.getMessage()


def test_log_to_vllm_false_leaves_the_runtime_records_out(model_dir, vllm_records):
    inst = engine(model_dir, "logs-quiet", "vllm-quiet", log_to_vllm=False)
    inst.close()
    # Forwarding then stopping emits whatever was queued: had the connector forwarded,
    # the stop line would be among it.
    kvc.forward_logs(logging.getLogger("vllm.kv_connector"))
    kvc.forward_logs(None)
    assert not vllm_records.matching(stopped("vllm-quiet"))


def test_the_vllm_metrics_are_the_runtimes_counter_families():
    """`kv_connector.vllm` exports every counter the runtime exposes as a counter, under the
    runtime's family, label and help, and reads each from the stats dict by its own name."""
    from kv_connector.vllm import _stats

    runtime = {(c["section"], c["name"]): c for c in kvc.COUNTERS if c["type"] == "counter"}
    assert {key for key in _stats.METRICS if key[0] != "vllm"} == set(runtime)
    for key, (metric, label, value) in _stats.METRICS.items():
        if key[0] == "vllm":
            continue
        assert (metric, label, value) == (runtime[key]["metric"], runtime[key]["label"], runtime[key]["label_value"])
        assert _stats.HELP[metric]
    assert ("lookups", "outage") in _stats.METRICS and ("pool", "outages") in _stats.METRICS
    from api_support import SMALL_STAGING, caches, layout

    conn = kvc.Connector(layout=layout(), kv_caches=caches(), pool=kvc.MemoryPool(capacity_bytes=16 << 20),
                         config=SMALL_STAGING)
    stats = conn.shutdown()
    stats["loads"]["failed_other"] = 3  # a value the flat view must read, not recompute
    stats["pool"]["outages"] = 2
    flat = _stats.flat_counters(stats, {"bounce_exhausted": 5})
    assert set(flat) == {f"{section}.{name}" for section, name in _stats.METRICS}
    assert (flat["loads.failed_other"], flat["pool.outages"], flat["vllm.bounce_exhausted"]) == (3, 2, 5)
    for section, name in runtime:
        assert name in stats[section], f"{section}.{name} is in the stats dict"


@pytest.mark.parametrize(
    "parallel, words",
    [
        ({"tensor_parallel_size": 2}, ["tensor_parallel_size=2", 'pool.backend = "mooncake"']),
        ({"pipeline_parallel_size": 2}, ["pipeline_parallel_size=2", 'pool.backend = "mooncake"']),
        ({"distributed_executor_backend": "mp"}, ["'mp'", "separate processes", "uni"]),
        ({"decode_context_parallel_size": 2}, ["decode_context_parallel_size=2", "use decode_context_parallel_size=1"]),
    ],
)
def test_ranks_in_other_processes_need_a_pool_that_spans_them(model_dir, parallel, words):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from kv_connector.vllm import KvcConnector

    config = vs.vllm_config(model_dir, extra={})
    for name, value in parallel.items():
        setattr(config.parallel_config, name, value)
    with pytest.raises(vllm_setup()) as refused:
        KvcConnector(config, KVConnectorRole.SCHEDULER, None)
    for word in words:
        assert word in str(refused.value), (word, str(refused.value))
