"""Shared pieces of the API tests (test_api_*.py): a small hybrid layout, page-major CPU
caches with recognisable contents, a minimal serving loop over the hooks, and a real
`mooncake_master` on loopback for the Mooncake tests."""

from __future__ import annotations

import ctypes
import importlib.util
import mmap
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import kv_connector as kvc

T = 16  # tokens per block
PAGES = 64  # pages per group
# Page shape of the layout below: [layers, K/V, T, kv_heads, head_dim], float32.
PAGE_SHAPE = (2, 2, T, 2, 16)
SMALL_STAGING = {"loaders": {"staging_bytes_per_loader": 4 << 20}, "saver": {"staging_bytes": 4 << 20}}
# Generous bound for anything that waits on the runtime; never a timing assertion.
PATIENCE_S = 120.0

LAYOUT = {
    "name": "tiny-gpt-oss",
    "tokens_per_block": T,
    "world_size": 1,
    "groups": [
        {"id": 0, "kind": "full", "layers": [1, 3], "kv_heads": 2, "head_dim": 16, "dtype_bytes": 4},
        {
            "id": 1,
            "kind": "window",
            "window_tokens": 32,
            "sink_tokens": 0,
            "layers": [0, 2],
            "kv_heads": 2,
            "head_dim": 16,
            "dtype_bytes": 4,
        },
    ],
}
FULL_LAYOUT = {**LAYOUT, "name": "tiny-full-f32", "groups": [LAYOUT["groups"][0]]}


def layout(full_only: bool = False) -> kvc.Layout:
    return kvc.Layout.from_dict(FULL_LAYOUT if full_only else LAYOUT)


def caches(groups: int = 2, pages: int = PAGES, device: str = "cpu") -> list[torch.Tensor]:
    """Zeroed page-major caches, one per group."""
    return [torch.zeros((pages, *PAGE_SHAPE), dtype=torch.float32, device=device) for _ in range(groups)]


def prompt(length: int, start: int = 1000) -> list[int]:
    return list(range(start, start + length))


def fill(cache: torch.Tensor, page: int, group: int, block: int, salt: int = 0) -> None:
    """The KV the engine 'computes' for `block` of `group`: distinct per block and group."""
    n = cache[page].numel()
    values = torch.arange(n, dtype=torch.float32, device=cache.device) + float(1_000_000 * (group + 1) + 1000 * block + salt)
    cache[page].copy_(values.reshape(cache[page].shape))


def wait_until(condition, conn: kvc.Connector, what: str):
    """Polls `condition()` with wait_for_progress until it is truthy; fails after
    PATIENCE_S (a hang guard, not a timing check)."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        conn.wait_for_progress(0.01)


@dataclass
class Served:
    offer: int
    is_async: bool
    filled: bool | None
    pages: list[int]


def serve(conn: kvc.Connector, kv: list[torch.Tensor], rid: int, tokens: list[int], pages: list[int], chunk: int = 64) -> Served:
    """One request through the hooks, the way an engine drives them: lookup, reserve until
    answered, load the offer (or compute it when the load fails), compute the rest in
    chunks (writing each completed block's KV, on the GPU finished before the chunk is
    reported), finish, wait for its saves."""
    groups = len(kv)
    conn.lookup(rid, tokens)
    conn.flush()
    extra, is_async = wait_until(lambda: conn.reserve(rid, 0, rid), conn, f"the lookup of {rid}")
    tables = [pages] * groups
    filled = None
    computed = 0
    if extra > 0:
        conn.on_step([kvc.StepRequest(rid, len(tokens), 0, 0, new_reservation=rid, page_tables=tables)])
        loads = wait_until(lambda: [ld for ld in conn.finished_loads() if ld[0] == rid], conn, f"the load of {rid}")
        assert loads[0][1] == rid
        filled = loads[0][2]
        if filled:
            computed = extra
        else:
            conn.release(rid, rid, 0, extra)
    while computed < len(tokens):
        end = min(computed + chunk, len(tokens))
        for block in range(computed // T, end // T):
            for group in range(groups):
                fill(kv[group], pages[block], group, block)
        if kv[0].is_cuda:
            torch.cuda.synchronize(kv[0].device)  # saves read what is on the device
        conn.on_step([kvc.StepRequest(rid, len(tokens), computed, end, page_tables=tables)])
        computed = end
    if conn.request_finished(rid):
        wait_until(lambda: rid in conn.finished_saves(), conn, f"the saves of {rid}")
    return Served(extra, is_async, filled, pages)


# ---- Mooncake ----

# Set by the test scripts that install Mooncake (scripts/test, scripts/test-python): a
# missing wheel or a build without the `mooncake` feature then fails the Mooncake tests
# instead of skipping them.
MOONCAKE_REQUIRED = os.environ.get("KV_CONNECTOR_REQUIRE_MOONCAKE") == "1"

# The mark of tests that need the `mooncake` feature: they skip without it, unless Mooncake
# is required (the `mooncake_master` fixture then fails them, naming what is missing).
needs_mooncake = pytest.mark.skipif(
    not MOONCAKE_REQUIRED and "mooncake" not in kvc.FEATURES, reason="needs the mooncake feature"
)


# Set by scripts/test-python, whose venv has vLLM: the vLLM tests then fail without it
# instead of skipping.
VLLM_REQUIRED = os.environ.get("KV_CONNECTOR_REQUIRE_VLLM") == "1"


def import_vllm():
    """The `vllm` module; without it the calling test module skips, or fails when vLLM is
    required."""
    if VLLM_REQUIRED:
        return importlib.import_module("vllm")
    return pytest.importorskip("vllm")


def skip_or_fail(reason: str) -> None:
    """Skips the test, or fails it when Mooncake is required."""
    if MOONCAKE_REQUIRED:
        pytest.fail(f"{reason}, but Mooncake is required (KV_CONNECTOR_REQUIRE_MOONCAKE=1)", pytrace=False)
    pytest.skip(reason)


def mooncake_master_binary() -> Path | None:
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(next(iter(spec.submodule_search_locations))) / "mooncake_master"
    return binary if binary.is_file() else None


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Master:
    rpc: int
    metadata: int
    process: subprocess.Popen

    def config(self, **extra: dict) -> dict:
        """A connector config with its own Mooncake client of this master."""
        config = {
            "pool": {"backend": "mooncake"},
            "mooncake": {
                "master_address": f"127.0.0.1:{self.rpc}",
                "metadata_server": f"http://127.0.0.1:{self.metadata}/metadata",
                "global_segment_size_bytes": 64 << 20,
                "local_buffer_size_bytes": 16 << 20,
            },
            **SMALL_STAGING,
        }
        config.update(extra)
        return config


def start_master(log: Path) -> Master:
    """A `mooncake_master` on free loopback ports with its HTTP metadata server, as the
    Rust tests start it; stopped by its PID."""
    if "mooncake" not in kvc.FEATURES:
        skip_or_fail("this kv_connector wheel was built without the mooncake feature")
    binary = mooncake_master_binary()
    if binary is None:
        skip_or_fail("the mooncake wheel is not installed in this interpreter")
    for _attempt in range(3):
        rpc, metadata, metrics = free_ports(3)
        args = [
            str(binary),
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={metadata}",
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics}",
            "--enable_metric_reporting=false",
            "--logtostderr=true",
        ]
        env = {**os.environ, "MC_TCP_BIND_ADDRESS": "127.0.0.1"}
        with open(log, "ab") as sink:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink, env=env)
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            if all(listening(port) for port in (rpc, metadata, metrics)):
                return Master(rpc, metadata, process)
            time.sleep(0.05)
        stop_master(process)
    pytest.fail(f"mooncake_master did not start; see {log}")


def start_real_client(master: Master, segment_bytes: int, threads: int, log: Path) -> tuple[subprocess.Popen, int]:
    """A node-local `mooncake_client` (the "real client" of Mooncake's one-node layout)
    holding `segment_bytes` for `master`, on a free loopback port; (process, port). Stop
    it with `stop_master`."""
    binary = mooncake_master_binary()
    if binary is None:
        skip_or_fail("the mooncake wheel is not installed in this interpreter")
    (port,) = free_ports(1)
    args = [
        str(binary.with_name("mooncake_client")),
        "--host=127.0.0.1",
        f"--port={port}",
        f"--metadata_server=http://127.0.0.1:{master.metadata}/metadata",
        f"--master_server_address=127.0.0.1:{master.rpc}",
        f"--global_segment_size={segment_bytes}",
        "--local_buffer_size=16777216",
        f"--threads={threads}",
    ]
    with open(log, "ab") as sink:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        if listening(port):
            return process, port
        time.sleep(0.05)
    stop_master(process)
    raise RuntimeError(f"mooncake_client did not start; see {log}")


def registered_buffer(store, nbytes: int) -> tuple[mmap.mmap, int]:
    """`nbytes` of anonymous memory, written once (resident, as a buffer in use is) and
    registered with the Mooncake client `store`: (memory, address). Keep the memory alive
    while the client may use the address."""
    memory = mmap.mmap(-1, nbytes)
    memory.write(bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256))
    address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    assert store.register_buffer(address, nbytes) == 0
    return memory, address


def stop_master(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def mooncake_master(tmp_path_factory):
    """A master for the tests of one module; killed by its PID afterwards."""
    master = start_master(tmp_path_factory.mktemp("mooncake") / "master.log")
    yield master
    stop_master(master.process)
