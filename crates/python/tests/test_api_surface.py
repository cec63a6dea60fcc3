"""The package's surface: what it exports, the exception hierarchy, type stubs that match
the native module, layouts from every source, and StepRequest's own checks."""

import ast
import inspect
from pathlib import Path

import pytest

import kv_connector as kvc
from api_support import LAYOUT, T

STUB = Path(kvc.__file__).with_name("__init__.pyi")


def test_counters_and_metric_families_are_the_runtimes():
    families = {family["metric"]: family for family in kvc.METRIC_FAMILIES}
    assert len(families) == len(kvc.METRIC_FAMILIES), "metric names are unique"
    assert all(name.startswith("kv_connector_") for name in families)
    exposed = [c for c in kvc.COUNTERS if c["metric"] is not None]
    for counter in exposed:
        family = families[counter["metric"]]
        assert (counter["family"], counter["type"], counter["label"]) == (
            family["name"], family["type"], family["label"]), counter
        assert (counter["label_value"] is None) == (family["label"] is None), counter
        assert counter["help"] and counter["kind"] in {"sum", "max", "derived"}
    series = [(c["metric"], c["label_value"]) for c in exposed]
    assert len(series) == len(set(series)), "no two counters write one series"
    used = {c["metric"] for c in exposed}
    assert {m for m, f in families.items() if f["type"] != "histogram"} == used, "no family is empty"
    sections = {c["section"] for c in kvc.COUNTERS}
    assert sections == {"lookups", "loads", "saves", "pool"}


def test_exports_and_exception_hierarchy():
    assert set(kvc.__all__) <= set(dir(kvc))
    for name in ("ConfigError", "LayoutError", "PoolError", "DeviceError"):
        cls = getattr(kvc, name)
        assert issubclass(cls, kvc.KvConnectorError), name
        assert cls.__module__ == "kv_connector"
    assert issubclass(kvc.KvConnectorError, Exception)
    assert not issubclass(kvc.KvConnectorError, (TypeError, ValueError))
    assert {"mooncake", "cuda"} <= set(kvc.FEATURES), "the default build carries both backends"
    assert kvc.__version__.count(".") == 2


def test_the_package_ships_its_stubs_and_marker():
    assert STUB.is_file()
    assert STUB.with_name("py.typed").is_file()


def _stub_names() -> tuple[set[str], dict[str, set[str]]]:
    tree = ast.parse(STUB.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members[node.name] = {
                item.name if isinstance(item, ast.FunctionDef) else item.target.id
                for item in node.body
                if isinstance(item, ast.FunctionDef) or (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name))
            }
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
    return top, members


def test_stubs_describe_the_native_module():
    top, members = _stub_names()
    assert set(kvc.__all__) <= top, "every export is stubbed"
    # The test hook exists only in wheels built with `faults`; the stub always lists it.
    build_only = set() if "faults" in kvc.FEATURES else {"corrupt"}
    for cls_name in ("Layout", "MemoryPool", "StepRequest", "Connector"):
        cls = getattr(kvc, cls_name)
        public = {name for name in dir(cls) if not name.startswith("_")}
        stubbed = {m for m in members[cls_name] if not m.startswith("_")}
        assert public == stubbed - build_only, cls_name
    assert kvc.KvConnectorError.__doc__


def test_layout_from_dict_preset_and_toml_agree(tmp_path):
    layout = kvc.Layout.from_dict(LAYOUT)
    assert (layout.name, layout.tokens_per_block, layout.world_size) == ("tiny-gpt-oss", T, 1)
    # 2 layers x K,V x 16 tokens x 2 heads x 16 dims x 4 bytes
    assert [layout.page_bytes(g) for g in (0, 1)] == [8192, 8192]
    groups = layout.groups
    assert [g["kind"] for g in groups] == ["full", "window"]
    assert groups[0]["sink_tokens"] == 0 and groups[0]["role"] == "target"
    assert groups[1]["window_tokens"] == 32
    assert kvc.Layout.from_dict(layout.to_dict()) == layout
    assert len(layout.fingerprint) == 16 and hash(layout) == hash(kvc.Layout.from_dict(LAYOUT))

    toml = tmp_path / "layout.toml"
    toml.write_text(
        'name = "tiny-gpt-oss"\ntokens_per_block = 16\n'
        + "".join(
            "\n[[groups]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in g.items()) for g in LAYOUT["groups"]
        )
    )
    assert kvc.Layout.from_toml(toml) == layout
    assert kvc.Layout.from_toml(str(toml)) == layout

    assert "tiny-hybrid" in kvc.Layout.preset_names()
    hybrid = kvc.Layout.preset("tiny-hybrid")
    assert [g["kind"] for g in hybrid.groups] == ["full", "window"]
    assert hybrid.fingerprint != layout.fingerprint


def _toml(value):
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


@pytest.mark.parametrize(
    "change, kind, words",
    [
        (lambda d: d["groups"][1].update(sink_tokens=32), "invalid_layout", "sink_tokens (32)"),
        (lambda d: d["groups"][1].update(window_tokens=0), "invalid_layout", "group 1"),
        (lambda d: d.update(groups=[]), "invalid_layout", "no groups"),
        (lambda d: d["groups"][0].update(layers=[0, 2]), "invalid_layout", "listed twice"),
        (lambda d: d["groups"][0].update(colour="red"), "toml", "colour"),
    ],
)
def test_refused_layouts_raise_layout_error_naming_the_problem(change, kind, words):
    data = {**LAYOUT, "groups": [dict(g) for g in LAYOUT["groups"]]}
    change(data)
    with pytest.raises(kvc.LayoutError) as refused:
        kvc.Layout.from_dict(data)
    assert words in str(refused.value)
    assert refused.value.kind == kind


def test_layout_misuse_is_a_python_error():
    with pytest.raises(kvc.LayoutError) as unknown:
        kvc.Layout.preset("no-such-model")
    assert "tiny-hybrid" in str(unknown.value), "names the known presets"
    with pytest.raises(kvc.LayoutError):
        kvc.Layout.from_toml("/nonexistent/layout.toml")
    with pytest.raises(TypeError):
        kvc.Layout.from_dict(["not", "a", "dict"])
    with pytest.raises(ValueError):
        kvc.Layout.from_dict({**LAYOUT, "world_size": None})
    with pytest.raises(ValueError, match="no group 7"):
        kvc.Layout.from_dict(LAYOUT).page_bytes(7)


def test_load_blocks_are_what_a_plan_loads():
    """The runtime's answer to which blocks a load fills (R15), so an engine that bounces
    window pages (the vLLM worker) allocates exactly those."""
    lay = kvc.Layout.from_dict(LAYOUT)  # group 0 full, group 1 a 32-token window
    assert lay.load_blocks(0, 0, 8 * T) == list(range(8))
    assert lay.load_blocks(0, 2 * T, 8 * T) == list(range(2, 8)), "the engine holds what it computed"
    assert lay.load_blocks(1, 0, 8 * T) == [6, 7], "the window of e = 8 blocks"
    sinks = {**LAYOUT, "name": "sinks", "groups": [LAYOUT["groups"][0], {**LAYOUT["groups"][1], "sink_tokens": 4}]}
    assert kvc.Layout.from_dict(sinks).load_blocks(1, 0, 8 * T) == [0, 6, 7], "sink blocks too"
    with pytest.raises(ValueError, match="no group 9"):
        lay.load_blocks(9, 0, T)


def test_step_request_converts_and_checks_page_tables():
    import numpy as np
    import torch

    step = kvc.StepRequest(
        3, 100, 16, 48, new_reservation=9, page_tables=[[0, 1, 2], np.array([4, -1, 6]), torch.tensor([7, 8, 9])]
    )
    assert step.page_tables == [[0, 1, 2], [4, -1, 6], [7, 8, 9]]
    assert (step.request_id, step.new_reservation) == (3, 9)
    assert "request_id=3" in repr(step)
    with pytest.raises(ValueError, match="not a page index"):
        kvc.StepRequest(1, 10, 0, 10, page_tables=[[0, -2]])
    with pytest.raises(ValueError, match="below computed_before"):
        kvc.StepRequest(1, 10, 5, 4)
    with pytest.raises(ValueError, match="one-dimensional"):
        kvc.StepRequest(1, 10, 0, 10, page_tables=[np.zeros((2, 2), dtype=np.int64)])
    with pytest.raises(TypeError):
        kvc.StepRequest(1, 10, 0, 10, page_tables=[["a"]])


def test_docstrings_are_present():
    for obj in (kvc.Connector, kvc.Connector.reserve, kvc.Connector.on_step, kvc.Layout.from_dict, kvc.MemoryPool):
        assert inspect.getdoc(obj), obj
