"""Benchmark (not a test): how many small objects Mooncake's own client stores a second,
the floor under any saver that stores pages of that size through it.

  python crates/python/bench/bench_mooncake_objects.py [--object-bytes N] [--objects N]
      [--threads 1,2,4]

A `mooncake_master` on free loopback ports and two clients over loopback TCP, each with a
segment (the replay's TCP layout). Each of `--threads` Python threads (each call lets the
GIL go) stores its own fresh keys from a registered buffer, as the saver does: per call of
256 objects (one save batch of 8 MiB of saver staging), `batch_is_exist` of the keys, then
`batch_put_from`. Threads alternate between the two clients. After one warm-up call per
thread, all threads start together; the rate is every object over the wall time of all.

Prints one JSON object per thread count: objects a second, and the median probe and put
call in ms.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

import api_support  # noqa: E402

PER_CALL = 256


class Writer:
    """One thread's keys and registered buffer on one client."""

    def __init__(self, store, name: str, object_bytes: int, objects: int):
        self.store = store
        self.object_bytes = object_bytes
        self.keys = [f"{name}-{i}" for i in range(objects)]
        self.memory = mmap.mmap(-1, PER_CALL * object_bytes)
        self.memory.write(b"\1" * len(self.memory))
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.memory))
        if store.register_buffer(self.address, len(self.memory)) != 0:
            raise RuntimeError("register_buffer refused the writer's buffer")
        self.probe_ms: list[float] = []
        self.put_ms: list[float] = []
        self.stored = 0

    def call(self, keys: list[str]) -> None:
        started = time.perf_counter()
        self.store.batch_is_exist(keys)
        probed = time.perf_counter()
        addresses = [self.address + i * self.object_bytes for i in range(len(keys))]
        results = self.store.batch_put_from(keys, addresses, [self.object_bytes] * len(keys))
        done = time.perf_counter()
        if any(result != 0 for result in results):
            raise RuntimeError(f"batch_put_from failed: {results[:4]}")
        self.probe_ms.append((probed - started) * 1e3)
        self.put_ms.append((done - probed) * 1e3)
        self.stored += len(keys)

    def run(self) -> None:
        for first in range(PER_CALL, len(self.keys), PER_CALL):
            self.call(self.keys[first : first + PER_CALL])


def rate(writers: list[Writer]) -> dict:
    """All `writers` at once (module docs)."""
    threads = len(writers)
    objects = len(writers[0].keys)
    for writer in writers:
        writer.call(writer.keys[:PER_CALL])  # warm-up, not timed
        writer.probe_ms.clear()
        writer.put_ms.clear()
        writer.stored = 0
    workers = [threading.Thread(target=writer.run) for writer in writers]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    timed = sum(writer.stored for writer in writers)
    if timed != threads * (objects - PER_CALL):
        raise RuntimeError("a writer thread stopped early; see its traceback above")
    return {
        "threads": threads,
        "objects_per_s": round(timed / elapsed),
        "probe_ms_median": round(statistics.median(ms for w in writers for ms in w.probe_ms), 3),
        "put_ms_median": round(statistics.median(ms for w in writers for ms in w.put_ms), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--object-bytes", type=int, default=832, help="default: the replay's scaled page")
    parser.add_argument("--objects", type=int, default=PER_CALL * 40, help="per thread")
    parser.add_argument("--threads", default="1,2,4")
    args = parser.parse_args()
    from mooncake.store import MooncakeDistributedStore

    counts = [int(count) for count in args.threads.split(",")]
    master = api_support.start_master(Path(tempfile.mkdtemp()) / "master.log")
    stores = []
    try:
        segment_bytes = max(64 << 20, 2 * sum(counts) * args.objects * args.object_bytes)
        for _ in range(2):
            store = MooncakeDistributedStore()
            code = store.setup(
                "127.0.0.1",
                f"http://127.0.0.1:{master.metadata}/metadata",
                segment_bytes,
                64 << 20,
                "tcp",
                "",
                f"127.0.0.1:{master.rpc}",
            )
            if code != 0:
                raise RuntimeError(f"setup returned {code}")
            stores.append(store)
            # Every writer's buffer stays registered to the end: Mooncake refuses a region that
        # overlaps one registered before, as a freed buffer's successor may.
        kept: list[Writer] = []
        for threads in counts:
            writers = [
                Writer(stores[i % len(stores)], f"t{threads}-{i}", args.object_bytes, args.objects)
                for i in range(threads)
            ]
            kept.extend(writers)
            print(json.dumps({"object_bytes": args.object_bytes, **rate(writers)}))
    finally:
        for store in stores:
            store.close()
        api_support.stop_master(master.process)


if __name__ == "__main__":
    main()
