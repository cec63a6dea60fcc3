"""The connector on a real Mooncake Store (`mooncake_master` on loopback, started by the
fixture; nothing mocked): each connector makes its own client in this interpreter, and a
prompt saved through one is loaded byte-identical into the other's tensors."""

import os
import sys

import pytest
import torch

import kv_connector as kvc
from api_support import (  # noqa: F401 (fixture)
    T,
    caches,
    layout,
    mooncake_master,
    needs_mooncake,
    prompt,
    serve,
    start_master,
    start_real_client,
    stop_master,
)

pytestmark = needs_mooncake


def test_save_then_load_through_mooncake_is_byte_identical(mooncake_master):  # noqa: F811 (fixture)
    lay = layout()
    kv_a, kv_b = caches(), caches()
    a = kvc.Connector(layout=lay, kv_caches=kv_a, config=mooncake_master.config(), model_key="mc")
    b = kvc.Connector(layout=lay, kv_caches=kv_b, config=mooncake_master.config(), model_key="mc")
    with a, b:
        assert a.pool_backend == b.pool_backend == "mooncake"
        tokens = prompt(12 * T + 7, start=5000)
        serve(a, kv_a, 1, tokens, pages=list(range(13)))
        a.settle_saves()
        assert a.stats()["saves"]["saves_done"] > 0
        served = serve(b, kv_b, 2, tokens, pages=list(range(40, 53)))
        assert served.offer == 12 * T and served.filled
        for block in range(12):
            assert torch.equal(kv_b[0][40 + block], kv_a[0][block]), block
        for block in (10, 11):  # the window of e = 192 with W = 32
            assert torch.equal(kv_b[1][40 + block], kv_a[1][block]), block
        loads = b.stats()["loads"]
        assert (loads["loads_done"], loads["pages_loaded"]) == (1, 14)
    assert a.closed and b.closed


def test_through_the_nodes_real_client_pages_load_byte_identical(tmp_path):
    """Mooncake's one-node layout: both connectors are dummy clients of one node-local
    `mooncake_client`, their staging pools in the shared memory it maps. A master of its
    own: the real client's segment stays mounted there after the client is killed."""
    master = start_master(tmp_path / "master.log")
    process, port = start_real_client(master, 64 << 20, 2, tmp_path / "real_client.log")
    try:
        config = master.config()
        config["mooncake"]["real_client_address"] = f"127.0.0.1:{port}"
        lay = layout()
        kv_a, kv_b = caches(), caches()
        a = kvc.Connector(layout=lay, kv_caches=kv_a, config=config, model_key="dummy")
        b = kvc.Connector(layout=lay, kv_caches=kv_b, config=config, model_key="dummy")
        with a, b:
            tokens = prompt(8 * T + 3, start=7000)
            serve(a, kv_a, 1, tokens, pages=list(range(9)))
            a.settle_saves()
            saves = a.stats()["saves"]
            assert saves["saves_done"] > 0 and saves["saves_failed"] == 0, saves
            served = serve(b, kv_b, 2, tokens, pages=list(range(20, 29)))
            assert served.offer == 8 * T and served.filled
            for block in range(8):
                assert torch.equal(kv_b[0][20 + block], kv_a[0][block]), block
            assert b.stats()["loads"]["loads_failed"] == 0
    finally:
        stop_master(process)
        stop_master(master.process)


def test_a_namespace_keeps_deployments_apart_on_one_master(mooncake_master):  # noqa: F811 (fixture)
    lay = layout(full_only=True)
    kv_a, kv_b = caches(1), caches(1)
    config = mooncake_master.config()
    with (
        kvc.Connector(layout=lay, kv_caches=kv_a, config=config, namespace="one") as a,
        kvc.Connector(layout=lay, kv_caches=kv_b, config=config, namespace="two") as b,
    ):
        tokens = prompt(4 * T + 1, start=9000)
        serve(a, kv_a, 1, tokens, pages=list(range(5)))
        a.settle_saves()
        served = serve(b, kv_b, 2, tokens, pages=list(range(5)))
        assert served.offer == 0, "another namespace's objects are never offered (R4)"


def test_tcp_lanes_and_slice_size_reach_the_transfer_engine(mooncake_master):  # noqa: F811 (fixture)
    names = ("MC_TCP_ENABLE_CONNECTION_POOL", "MC_TCP_LANES_PER_PEER", "MC_TCP_SLICE_SIZE")
    before = {name: os.environ.get(name) for name in names}
    config = mooncake_master.config()
    config["mooncake"] = {**config["mooncake"], "tcp_lanes_per_peer": 4,
                          "tcp_slice_size_bytes": 256 << 10}
    lay = layout(full_only=True)
    kv_a, kv_b = caches(1), caches(1)
    try:
        with (
            kvc.Connector(layout=lay, kv_caches=kv_a, config=config, model_key="lanes") as a,
            kvc.Connector(layout=lay, kv_caches=kv_b, config=config, model_key="lanes") as b,
        ):
            assert [os.environ.get(name) for name in names] == ["1", "4", "262144"]
            tokens = prompt(8 * T + 3, start=12000)
            serve(a, kv_a, 1, tokens, pages=list(range(9)))
            a.settle_saves()
            served = serve(b, kv_b, 2, tokens, pages=list(range(20, 29)))
            assert served.offer == 8 * T and served.filled
            for block in range(8):
                assert torch.equal(kv_b[0][20 + block], kv_a[0][block]), block
    finally:
        # Later clients in this interpreter keep Mooncake's own transport defaults.
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_a_gil_switch_interval_is_set_only_where_it_shortens_the_interpreters(mooncake_master):  # noqa: F811 (fixture)
    before = sys.getswitchinterval()
    config = mooncake_master.config()
    lay = layout(full_only=True)
    try:
        for interval_us, current, expected in ((500, 0.005, 0.0005), (2000, 0.0001, 0.0001), (0, 0.005, 0.005)):
            sys.setswitchinterval(current)
            config["mooncake"] = {**config["mooncake"], "gil_switch_interval_us": interval_us}
            kv = caches(1)
            with kvc.Connector(layout=lay, kv_caches=kv, config=config, model_key="switch") as conn:
                assert sys.getswitchinterval() == pytest.approx(expected), interval_us
                tokens = prompt(4 * T + 1, start=15000)
                serve(conn, kv, 1, tokens, pages=list(range(5)))
                conn.settle_saves()
    finally:
        sys.setswitchinterval(before)
