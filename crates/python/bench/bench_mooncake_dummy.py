"""Benchmark (not a test): Mooncake's own client in the one-node layout Mooncake
recommends, a node-local `mooncake_client` (the "real client", holding the segment) with
the engine as a "dummy" client over shared memory (the connector's
`mooncake.real_client_address`): what the layout itself gives, the bound on a connector in
it.

  python crates/python/bench/bench_mooncake_dummy.py [--objects N] [--client-threads N]
      [--concurrent N]

A `mooncake_master` and a `mooncake_client` on free loopback ports (the wheel's own
binaries); one dummy client (`setup_dummy`) takes its buffers from its pool
(`alloc_from_mem_pool`, shared memory the real client maps) and registers them
(`register_buffer`; without it the real client refuses the calls). Objects of the
connector's size (1.125 MiB), 227 per call as a save batch holds:

- put into segment memory never written, then again after removing the objects;
- get, then get again into the same (now written) buffers;
- `--concurrent` gets at once from Python threads (each call lets the GIL go), all
  objects split between them: the rate of all together;
- for scale, one core's `memmove` of one call's bytes between two written buffers, and
  into memory never touched.

Prints one JSON object, GB/s.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import sys
import tempfile
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

import api_support  # noqa: E402

OBJECT_BYTES = 1152 << 10
PER_CALL = 227
BUFFER_BYTES = OBJECT_BYTES * PER_CALL


class Dummy:
    """A dummy client with `buffers` registered buffers of one call's objects each."""

    def __init__(self, port: int, buffers: int):
        from mooncake.store import MooncakeDistributedStore

        self.store = MooncakeDistributedStore()
        code = self.store.setup_dummy(buffers * BUFFER_BYTES + (64 << 20), 64 << 20, f"127.0.0.1:{port}")
        if code != 0:
            raise RuntimeError(f"setup_dummy returned {code}")
        self.buffers = []
        for _ in range(buffers):
            address = self.store.alloc_from_mem_pool(BUFFER_BYTES)
            if not address or self.store.register_buffer(address, BUFFER_BYTES) != 0:
                raise RuntimeError("could not take and register a buffer from the dummy's pool")
            self.buffers.append(address)

    def calls(self, name: str, keys: list[str], buffer: int) -> None:
        want = 0 if name == "batch_put_from" else OBJECT_BYTES
        for first in range(0, len(keys), PER_CALL):
            batch = keys[first : first + PER_CALL]
            addresses = [self.buffers[buffer] + i * OBJECT_BYTES for i in range(len(batch))]
            results = getattr(self.store, name)(batch, addresses, [OBJECT_BYTES] * len(batch))
            if any(result != want for result in results):
                raise RuntimeError(f"{name} failed: {results[:4]}")

    def rate(self, name: str, keys: list[str], buffer: int) -> float:
        started = time.perf_counter()
        self.calls(name, keys, buffer)
        return len(keys) * OBJECT_BYTES / (time.perf_counter() - started) / 1e9

    def concurrent_gets(self, keys: list[str], threads: int) -> float:
        """Every key got once, split between `threads` threads, each with its own buffer."""
        errors: list[Exception] = []

        def run(index: int) -> None:
            try:
                self.calls("batch_get_into", keys[index::threads], 2 + index)
            except RuntimeError as error:
                errors.append(error)

        workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if errors:
            raise errors[0]
        return len(keys) * OBJECT_BYTES / (time.perf_counter() - started) / 1e9


def memmove_gbps(destination: int, source: int) -> float:
    started = time.perf_counter()
    ctypes.memmove(destination, source, BUFFER_BYTES)
    return BUFFER_BYTES / (time.perf_counter() - started) / 1e9


def memmove_rates(dummy: Dummy) -> dict[str, float]:
    """One core's copy of one call's bytes: between two of the dummy's written buffers
    (best of three), and into anonymous memory never touched."""
    written = max(memmove_gbps(dummy.buffers[1], dummy.buffers[0]) for _ in range(3))
    fresh = mmap.mmap(-1, BUFFER_BYTES)
    target = ctypes.addressof(ctypes.c_char.from_buffer(fresh))
    untouched = memmove_gbps(target, dummy.buffers[0])
    del target
    fresh.close()
    return {"memmove_gbps": written, "memmove_into_untouched_gbps": untouched}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=2048)
    parser.add_argument("--client-threads", type=int, default=8)
    parser.add_argument("--concurrent", type=int, default=4)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp())
    master = api_support.start_master(logs / "master.log")
    client = None
    try:
        segment_bytes = 2 * args.objects * OBJECT_BYTES  # every object twice
        client, port = api_support.start_real_client(master, segment_bytes, args.client_threads, logs / "client.log")
        dummy = Dummy(port, 2 + args.concurrent)
        first = [f"dummy-{i}" for i in range(args.objects)]
        second = [f"dummy-again-{i}" for i in range(args.objects)]
        out = {"objects": args.objects, "client_threads": args.client_threads}
        out["put_gbps"] = dummy.rate("batch_put_from", first, 0)
        out["get_gbps"] = dummy.rate("batch_get_into", first, 1)
        out["get_into_written_gbps"] = dummy.rate("batch_get_into", first, 1)
        dummy.concurrent_gets(first, args.concurrent)  # writes the threads' buffers once
        out[f"get_{args.concurrent}_at_once_gbps"] = dummy.concurrent_gets(first, args.concurrent)
        dummy.store.batch_remove(first, True)
        out["put_written_before_gbps"] = dummy.rate("batch_put_from", second, 0)
        out.update(memmove_rates(dummy))
        dummy.store.close()
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))
    finally:
        if client is not None:
            client.kill()
            client.wait(timeout=30)
        api_support.stop_master(master.process)


if __name__ == "__main__":
    main()
