"""Benchmark (not a test): whether a loader could hide its copy behind Mooncake's get, on
this host's CPUs.

  python crates/python/bench/bench_mooncake_overlap.py [--rounds N] [--batches N]

A loader on the host device gets a batch of objects into its staging (Mooncake's
`batch_get_into` over loopback TCP), then copies and checksums each page into the device
pages: the get, then the copy, one after the other. This measures Mooncake's own client
moving the same bytes three ways, each round in the same process:

- `get_gbps`: the gets alone, one batch of 226 objects of 1.125 MiB (256 MiB) a call;
- `serial_gbps`: each get, then a copy of the batch into other memory and a sum over the
  copy (numpy, GIL released), as the loader does now;
- `pipelined_gbps`: half batches into two halves of the staging, each half's get running
  on a second thread while this thread copies and sums the half before: the best an
  overlapped loader could do.

Where the pipelined rate is no better than the serial one, the get needs the CPUs the copy
would overlap it with, and a loader gains nothing by overlapping them.

A `mooncake_master` on free loopback ports, one client holding the objects in its
segment and one without a segment reading them (the connector's TCP layout). Prints one
JSON object per round.
"""

from __future__ import annotations

import argparse
import json
import mmap
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

import api_support  # noqa: E402

OBJECT_BYTES = 1_179_648 + 64  # a gpt-oss-120b page and its header
PER_CALL = 226


class Bench:
    """The two clients, the registered staging and the destination memory."""

    def __init__(self, master: api_support.Master, batches: int) -> None:
        from mooncake.store import MooncakeDistributedStore

        self.total = PER_CALL * batches
        metadata = f"http://127.0.0.1:{master.metadata}/metadata"
        address = f"127.0.0.1:{master.rpc}"
        self.holder, self.reader = MooncakeDistributedStore(), MooncakeDistributedStore()
        segment = self.total * OBJECT_BYTES * 2
        assert self.holder.setup("127.0.0.1", metadata, segment, 64 << 20, "tcp", "", address) == 0
        assert self.reader.setup("127.0.0.1", metadata, 0, 64 << 20, "tcp", "", address) == 0
        self.memory: list[mmap.mmap] = []
        source, _ = self.registered(self.holder, PER_CALL * OBJECT_BYTES)
        for first in range(0, self.total, PER_CALL):
            keys = [f"page-{first + j}" for j in range(PER_CALL)]
            addresses = [source + j * OBJECT_BYTES for j in range(PER_CALL)]
            assert all(a == 0 for a in self.holder.batch_put_from(keys, addresses, [OBJECT_BYTES] * PER_CALL))
        self.staging, self.staging_view = self.registered(self.reader, PER_CALL * OBJECT_BYTES)
        self.pages = np.ones(PER_CALL * OBJECT_BYTES, dtype=np.uint8)

    def registered(self, store, nbytes: int) -> tuple[int, np.ndarray]:
        # Written before, as a loader's staging is.
        memory, address = api_support.registered_buffer(store, nbytes)
        self.memory.append(memory)
        return address, np.frombuffer(memory, dtype=np.uint8)

    def get(self, first: int, count: int, offset: int) -> None:
        keys = [f"page-{first + j}" for j in range(count)]
        base = self.staging + offset
        answers = self.reader.batch_get_into(keys, [base + j * OBJECT_BYTES for j in range(count)],
                                             [OBJECT_BYTES] * count)
        assert all(a == OBJECT_BYTES for a in answers), answers[:4]

    def copy(self, start: int, end: int) -> None:
        np.copyto(self.pages[start:end], self.staging_view[start:end])
        int(self.pages[start:end].view(np.uint64).sum())

    def rate(self, started: float) -> float:
        return self.total * OBJECT_BYTES / (time.perf_counter() - started) / 1e9

    def gets(self) -> float:
        started = time.perf_counter()
        for first in range(0, self.total, PER_CALL):
            self.get(first, PER_CALL, 0)
        return self.rate(started)

    def serial(self) -> float:
        started = time.perf_counter()
        for first in range(0, self.total, PER_CALL):
            self.get(first, PER_CALL, 0)
            self.copy(0, PER_CALL * OBJECT_BYTES)
        return self.rate(started)

    def pipelined(self) -> float:
        half = PER_CALL // 2
        span = half * OBJECT_BYTES
        started = time.perf_counter()
        self.get(0, half, 0)
        for index in range(1, self.total // half):
            side = index % 2
            getter = threading.Thread(target=self.get, args=(index * half, half, side * span))
            getter.start()
            self.copy((1 - side) * span, (2 - side) * span)
            getter.join()
        last = (self.total // half - 1) % 2
        self.copy(last * span, (last + 1) * span)
        return self.rate(started)

    def close(self) -> None:
        self.reader.close()
        self.holder.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4, help="batches of 226 objects a round")
    args = parser.parse_args()
    master = api_support.start_master(Path(tempfile.mkdtemp()) / "master.log")
    try:
        bench = Bench(master, args.batches)
        for _ in range(args.rounds):
            figures = {"get_gbps": bench.gets(), "serial_gbps": bench.serial(),
                       "pipelined_gbps": bench.pipelined()}
            print(json.dumps({key: round(value, 3) for key, value in figures.items()}), flush=True)
        bench.close()
    finally:
        api_support.stop_master(master.process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
