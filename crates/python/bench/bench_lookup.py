"""Benchmark of the Python package (not a test): what `Connector.lookup` costs the engine's
scheduler thread for a prompt handed over as a Python list of ints (as vLLM's own prompt
list is), read at the call, (`read_later=True`) copied and read on the runtime's planner
thread, or (`append_only=True` too) read there uncopied, against a plain Python copy of the
same list.

  python crates/python/bench/bench_lookup.py [--repeat N]

A small full-attention layout on CPU tensors and an embedded MemoryPool; for each prompt
length, `lookup` is timed alone (the planner hashes and probes on its own threads, so
what the call costs is reading the tokens), then the lookup is answered and the request
ended. Medians and minima over `--repeat` requests.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

import kv_connector as kvc

LENGTHS = (8192, 32768, 131072)


def connector() -> kvc.Connector:
    layout = kvc.Layout.from_dict(
        {
            "name": "bench-lookup",
            "tokens_per_block": 16,
            "world_size": 1,
            "groups": [{"id": 0, "kind": "full", "layers": [0], "kv_heads": 1, "head_dim": 8, "dtype_bytes": 2}],
        }
    )
    kv = [torch.zeros((64, layout.page_bytes(0)), dtype=torch.uint8)]
    config = {
        "pool": {"capacity_bytes": 64 << 20},
        "loaders": {"staging_bytes_per_loader": 4 << 20},
        "saver": {"staging_bytes": 4 << 20},
    }
    return kvc.Connector(layout=layout, kv_caches=kv, pool=kvc.MemoryPool(64 << 20), config=config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    conn = connector()
    rng = random.Random(7)
    rid = 0
    for n in LENGTHS:
        tokens = [rng.randrange(200_000) for _ in range(n)]
        times: dict[str, list[float]] = {"eager": [], "read_later": [], "append_only": [], "copy": []}
        for _ in range(args.repeat):
            started = time.perf_counter()
            list(tokens)
            times["copy"].append(time.perf_counter() - started)
            for mode in ("eager", "read_later", "append_only"):
                rid += 1
                started = time.perf_counter()
                conn.lookup(rid, tokens, read_later=mode != "eager", append_only=mode == "append_only")
                times[mode].append(time.perf_counter() - started)
                # Answered with the GIL let go, as a scheduler waiting for its ranks.
                conn.flush()
                while conn.reserve(rid, 0, rid) is None:
                    conn.wait_for_progress(0.01)
                conn.request_finished(rid)
        median = {mode: 1e3 * statistics.median(spent) for mode, spent in times.items()}
        print(
            f"{n:>7} tokens: lookup {median['eager']:.3f} ms, lookup(read_later=True) "
            f"{median['read_later']:.3f} ms, lookup(read_later=True, append_only=True) "
            f"{median['append_only']:.3f} ms; a Python copy of the list {median['copy']:.3f} ms (medians)"
        )
    conn.shutdown()


if __name__ == "__main__":
    main()
