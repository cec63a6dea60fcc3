"""Benchmarks of the Python package (not tests): what the hooks cost the engine's step, and
how fast loads and saves move pages into and out of torch-allocated KV tensors.

  python crates/python/bench/bench_connector.py [--device cuda|cpu] [--json FILE]
      [--mooncake MASTER METADATA [--mooncake-only] [--gil-busy N] [--mooncake-set KEY=INT]
       [--real-client THREADS]]

1. Bandwidth: the gpt-oss-120b layout (1.125 MiB pages), KV tensors allocated by torch on
   the device. Instance A computes one long prompt (pages filled with random bytes on the
   device) and saves it; instance B, on its own tensors and the same MemoryPool, loads it
   back and checks every loaded page against A's. Load and save rates are the bytes the
   connector moved over the wall time from the hook that started them to the hook that saw
   them finished; three prompts are saved in a row (the first into the memory the pool
   reserved at start, the later ones evicting) and each is timed. With `--mooncake` the
   same again through a Mooncake master (objects in the saving client's segment, loads
   through the loaders' registered staging; B's two loaders each load one of the earlier
   prompts before the timed load, so its staging has been written, as an engine's has).
   The same run measures a raw pinned host <-> device copy of the same bytes with torch,
   the ceiling the connector's share is given against, and, with `--mooncake`,
   Mooncake's own client moving the same bytes the same way (`mooncake_own`): one client
   `batch_put_from`s objects of the connector's object size, as many per call as a save
   batch holds, from registered memory into its own segment, never written before (as
   instance A's saves land in A's), and a second client without a segment
   `batch_get_into`s them into registered memory (as B's loads do); run first, before this
   process has written any segment memory. The connector's rates are also given as a share
   of those, and `put_written_before_gbps` is the same put into segment memory written once;
   `get_two_threads_gbps` is the same gets from two threads, one call in two each (what
   two loaders reading at once could reach).
2. Hook cost: an engine step with 64 waiting requests (each asked `reserve` every step),
   a few running ones computing chunks (saves), and the polling hooks; the time spent
   inside the connector's hooks per step, p50 / p99 / max over the steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch

import kv_connector as kvc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import api_support  # the tests' Mooncake process starters

LAYOUT = "gpt-oss-120b"
MIB = 1 << 20


def kv_tensors(layout: kvc.Layout, pages: int, device: str) -> list[torch.Tensor]:
    """One page-major uint8 tensor per group: [pages, page_bytes]."""
    return [
        torch.zeros((pages, layout.page_bytes(g["id"])), dtype=torch.uint8, device=device)
        for g in layout.groups
    ]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def raw_copy_gbps(nbytes: int, device: str) -> tuple[float, float]:
    """Pinned host -> device and device -> host copy rates of `nbytes`, best of 5."""
    if device != "cuda":
        return float("nan"), float("nan")
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    rates = []
    for src, dst in ((host, dev), (dev, host)):
        best = 0.0
        for _ in range(5):
            sync(device)
            start = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            sync(device)
            best = max(best, nbytes / (time.perf_counter() - start) / 1e9)
        rates.append(best)
    return rates[0], rates[1]


def save_prompt(conn, layout, rid: int, tokens: list[int], table: list[int]) -> float:
    """Computes nothing (the pages hold the bytes already), reports the whole prompt as one
    chunk and waits until its saves settled; the seconds from the hook to settlement."""
    conn.lookup(rid, tokens)
    conn.flush()
    while conn.reserve(rid, 0, rid) is None:
        conn.wait_for_progress(0.01)
    start = time.perf_counter()
    conn.on_step([kvc.StepRequest(rid, len(tokens), 0, len(tokens), None,
                                  [table for _ in layout.groups])])
    conn.request_finished(rid)
    conn.settle_saves()
    return time.perf_counter() - start


def load_prompt(conn, layout, rid: int, tokens: list[int], table: list[int]) -> tuple:
    """Looks up, reserves and loads `tokens` into pages `table`; returns the offer, whether
    the load filled its pages and the seconds from the hook that started it to the hook
    that saw it finished."""
    conn.lookup(rid, tokens)
    conn.flush()
    offer = None
    while offer is None:
        offer = conn.reserve(rid, 0, rid)
        if offer is None:
            conn.wait_for_progress(0.01)
    start = time.perf_counter()
    conn.on_step([kvc.StepRequest(rid, len(tokens), 0, 0, rid,
                                  [table for _ in layout.groups])])
    finished = []
    while not finished:
        conn.wait_for_progress(0.01)
        finished = conn.finished_loads()
    return offer[0], finished[0][2], time.perf_counter() - start


def bandwidth(device: str, prompt_tokens: int, mooncake: list[str] | None,
              saver_staging_mib: int = 256, mooncake_settings: dict | None = None) -> dict:
    layout = kvc.Layout.preset(LAYOUT)
    t = layout.tokens_per_block
    blocks = prompt_tokens // t
    pages = blocks + 8
    page_bytes = [layout.page_bytes(g["id"]) for g in layout.groups]
    stored = sum(blocks * b for b in page_bytes)
    config: dict = {
        "loaders": {"staging_bytes_per_loader": 256 * MIB},
        "saver": {"staging_bytes": saver_staging_mib * MIB, "queue_capacity_pages": 4 * pages},
    }
    # A memory pool holds about one prompt: the first save fills it, later ones evict, as
    # a full pool does; it reserves its capacity (pinned memory for CUDA tensors) when A
    # starts. With Mooncake, A and B are clients of one master, each with a segment that
    # holds every prompt (the master evicts in the background, so a full segment refuses
    # puts instead).
    pool = None
    if mooncake:
        config["pool"] = {"backend": "mooncake"}
        config["mooncake"] = {"master_address": mooncake[0], "metadata_server": mooncake[1],
                              "global_segment_size_bytes": stored * 4,
                              "local_buffer_size_bytes": 64 * MIB, **(mooncake_settings or {})}
    else:
        pool = kvc.MemoryPool(capacity_bytes=stored * 5 // 4)
    tokens = list(range(1, prompt_tokens + 1))
    a_kv = kv_tensors(layout, pages, device)
    b_kv = kv_tensors(layout, pages, device)
    for tensor in a_kv:
        tensor.random_(0, 256)
    # Written once, as an engine's KV cache is before anything loads into it: a load is not
    # charged for the first touch of B's pages.
    for tensor in b_kv:
        tensor.fill_(1)
    sync(device)
    table = list(range(blocks + 1))
    result: dict = {"layout": LAYOUT, "prompt_tokens": prompt_tokens, "device": device,
                    "saver_staging_mib": saver_staging_mib,
                    "pool": "mooncake" if mooncake else "memory", "page_bytes": page_bytes,
                    "save_gbps_each": []}
    own = None
    if mooncake:
        # First, while this process has touched no segment memory yet: every arm then writes
        # into a segment that has never been written, as A's saves do.
        own = mooncake_own(mooncake, page_bytes[0], stored // page_bytes[0],
                           config["saver"]["staging_bytes"] // page_bytes[0])
        result["mooncake_own"] = own
    start = time.perf_counter()
    # A stays open while B loads: a Mooncake client's objects leave with it.
    with kvc.Connector(layout=layout, kv_caches=a_kv, pool=pool, config=config,
                       model_key="bench") as a:
        result["start_s"] = time.perf_counter() - start
        # Three saves in a row, each timed; the figure is the last (steady state).
        for rid, shift in ((97, 7), (98, 11), (1, 0)):
            saved_before = a.stats()["saves"]["bytes_saved"]
            elapsed = save_prompt(a, layout, rid, [t + shift * prompt_tokens for t in tokens],
                                  table)
            saved = a.stats()["saves"]["bytes_saved"] - saved_before
            result["save_gbps_each"].append(saved / elapsed / 1e9)
        result["save_bytes"] = saved
        result["save_gbps"] = result["save_gbps_each"][-1]
        counters = a.stats()["saves"]
        # Puts a full segment refused and retried (R35), and saves that failed: a save arm
        # slowed by them waited for the pool, not for the data path.
        result["saves_retried"] = counters["saves_retried"]
        result["saves_failed"] = counters["saves_failed"]
        with kvc.Connector(layout=layout, kv_caches=b_kv, pool=pool, config=config,
                           model_key="bench") as b:
            if mooncake:
                # B's loaders first load the two earlier prompts, one each (loads go to
                # the loaders in turn), as an engine's loaders have loaded before: the
                # timed load is not charged for the first touch of its staging memory,
                # which Mooncake's own get (into a buffer written before) does not pay.
                for rid, shift in ((3, 7), (4, 11)):
                    load_prompt(b, layout, rid, [t + shift * prompt_tokens for t in tokens], table)
                    b.request_finished(rid)
            loaded_before = b.stats()["loads"]["bytes_loaded"]
            extra, filled, elapsed = load_prompt(b, layout, 2, tokens, table)
            stats = b.stats()["loads"]
            stats["bytes_loaded"] -= loaded_before
    result["load_filled"] = filled
    result["offered_tokens"] = extra
    result["load_bytes"] = stats["bytes_loaded"]
    result["load_gbps"] = stats["bytes_loaded"] / elapsed / 1e9
    sync(device)
    loaded_blocks = extra // t
    full = [i for i, g in enumerate(layout.groups) if g["kind"] == "full"][0]
    result["pages_equal"] = bool(torch.equal(a_kv[full][:loaded_blocks], b_kv[full][:loaded_blocks]))
    h2d, d2h = raw_copy_gbps(result["load_bytes"], device)
    result["raw_h2d_gbps"], result["raw_d2h_gbps"] = h2d, d2h
    result["load_share_of_raw"] = result["load_gbps"] / h2d
    result["save_share_of_raw"] = result["save_gbps"] / d2h
    if own:
        result["save_share_of_mooncake_put"] = result["save_gbps"] / own["put_gbps"]
        result["load_share_of_mooncake_get"] = result["load_gbps"] / own["get_gbps"]
    return result


@contextmanager
def busy_gil(threads: int):
    """`threads` Python threads spinning in pure-Python code meanwhile, as an engine's
    scheduler and model runner keep the GIL busy."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            total = 0
            for i in range(1000):
                total += i

    spinning = [threading.Thread(target=spin, daemon=True) for _ in range(threads)]
    for thread in spinning:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in spinning:
            thread.join()


def mooncake_own(mooncake: list[str], object_bytes: int, total_objects: int,
                 per_call: int) -> dict:
    """Mooncake's own client on the same bytes: puts into a fresh segment, then gets from a
    client that holds no segment, `per_call` objects a call, from and into registered
    memory. A second round of puts after removing the first measures segment memory that
    has been written before."""
    from mooncake.store import MooncakeDistributedStore

    master, metadata = mooncake
    segment = total_objects * object_bytes * 2
    holder, reader = MooncakeDistributedStore(), MooncakeDistributedStore()
    assert holder.setup("127.0.0.1", metadata, segment, 64 * MIB, "tcp", "", master) == 0
    assert reader.setup("127.0.0.1", metadata, 0, 64 * MIB, "tcp", "", master) == 0
    buffers = []

    def registered(store, nbytes: int) -> int:
        memory, address = api_support.registered_buffer(store, nbytes)
        buffers.append(memory)
        return address

    src = registered(holder, per_call * object_bytes)
    dst = registered(reader, per_call * object_bytes)
    calls = [range(first, min(first + per_call, total_objects))
             for first in range(0, total_objects, per_call)]

    def run_calls(store, name: str, base: int, round_: int, share: list) -> None:
        for call in share:
            keys = [f"own-{round_}-{i}" for i in call]
            addrs = [base + j * object_bytes for j in range(len(keys))]
            answers = getattr(store, name)(keys, addrs, [object_bytes] * len(keys))
            expected = 0 if name == "batch_put_from" else object_bytes
            assert all(a == expected for a in answers), (name, answers[:4])

    def timed(store, name: str, base: int, round_: int) -> float:
        start = time.perf_counter()
        run_calls(store, name, base, round_, calls)
        return total_objects * object_bytes / (time.perf_counter() - start) / 1e9

    def timed_two_threads(store, bases: tuple) -> float:
        """The round-0 gets from two threads, one call in two each, into its own buffer."""
        threads = [threading.Thread(target=run_calls, args=(store, "batch_get_into", bases[k], 0, calls[k::2]))
                   for k in range(2)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return total_objects * object_bytes / (time.perf_counter() - start) / 1e9

    result = {"object_bytes": object_bytes, "objects": total_objects, "per_call": per_call}
    result["put_gbps"] = timed(holder, "batch_put_from", src, 0)
    result["get_gbps"] = timed(reader, "batch_get_into", dst, 0)
    # The same gets from two threads: what two loaders reading at once could reach.
    result["get_two_threads_gbps"] = timed_two_threads(reader, (dst, registered(reader, per_call * object_bytes)))
    holder.batch_remove([f"own-0-{i}" for i in range(total_objects)], True)
    result["put_written_before_gbps"] = timed(holder, "batch_put_from", src, 1)
    holder.batch_remove([f"own-1-{i}" for i in range(total_objects)], True)
    reader.close()
    holder.close()
    return result


def hook_cost(device: str, steps: int, waiting: int) -> dict:
    layout = kvc.Layout.preset(LAYOUT)
    t = layout.tokens_per_block
    prompt = 64 * t
    pages = 4096
    kv = kv_tensors(layout, pages, device)
    pool = kvc.MemoryPool(capacity_bytes=64 << 30)
    config: dict = {}
    per_step: list[float] = []
    without_lookups: list[float] = []
    free = list(range(pages))
    with kvc.Connector(layout=layout, kv_caches=kv, pool=pool, config=config,
                       model_key="hooks") as conn:
        next_id = 1
        queue: list[int] = []
        running: dict[int, tuple[list[int], int]] = {}
        finishing: dict[int, list[int]] = {}
        for step in range(steps):
            arrivals = []
            while len(queue) < waiting:
                arrivals.append(next_id)
                queue.append(next_id)
                next_id += 1
            prompts = [[rid * 1_000_000 + i for i in range(prompt)] for rid in arrivals]
            begin = time.perf_counter_ns()
            for rid, tokens in zip(arrivals, prompts):
                conn.lookup(rid, tokens)
            lookup_ns = time.perf_counter_ns() - begin
            begin = time.perf_counter_ns()
            conn.flush()
            answers = [conn.reserve(rid, 0, rid) for rid in queue]
            step_ns = time.perf_counter_ns() - begin
            # Admit up to 4 answered requests a step while pages last.
            admitted = 0
            for rid, answer in zip(list(queue), answers):
                if answer is not None and admitted < 4 and len(free) >= prompt // t + 1:
                    running[rid] = ([free.pop() for _ in range(prompt // t + 1)], 0)
                    queue.remove(rid)
                    admitted += 1
            scheduled = []
            for rid, (table, done) in list(running.items()):
                end = min(prompt, done + 4 * t)
                scheduled.append(kvc.StepRequest(rid, prompt, done, end, None,
                                                 [table for _ in layout.groups]))
                running[rid] = (table, end)
            begin = time.perf_counter_ns()
            conn.on_step(scheduled)
            conn.finished_loads()
            for rid in [rid for rid, (_, done) in running.items() if done == prompt]:
                table, _ = running.pop(rid)
                if conn.request_finished(rid):
                    finishing[rid] = table
                else:
                    free.extend(table)
            released = conn.finished_saves()
            step_ns += time.perf_counter_ns() - begin
            for rid in released:
                free.extend(finishing.pop(rid, []))
            per_step.append((step_ns + lookup_ns) / 1000)
            without_lookups.append(step_ns / 1000)
    def summary(values: list[float]) -> dict:
        values = sorted(values)
        return {"p50": statistics.median(values), "p99": values[int(0.99 * (len(values) - 1))],
                "max": values[-1]}

    return {
        "steps": steps,
        "waiting": waiting,
        "prompt_tokens": prompt,
        # Every hook of the step, the lookups of the requests that arrived included (their
        # 2,048-token lists are converted from Python ints).
        "hook_us": summary(per_step),
        # The same without `lookup` (called once per request, at arrival).
        "hook_us_without_lookups": summary(without_lookups),
    }


def start_real_client(args) -> tuple:
    """The node-local `mooncake_client` of `--real-client`, holding eight prompts' pages
    (the two TCP clients' segments together); (process, port)."""
    rpc = int(args.mooncake[0].rsplit(":", 1)[1])
    metadata = int(args.mooncake[1].split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    layout = kvc.Layout.preset(LAYOUT)
    blocks = args.prompt_tokens // layout.tokens_per_block
    stored = sum(blocks * layout.page_bytes(g["id"]) for g in layout.groups)
    log = Path(tempfile.mkdtemp(prefix="bench-real-client-")) / "client.log"
    return api_support.start_real_client(api_support.Master(rpc, metadata, None), stored * 8,
                                         args.real_client, log)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompt-tokens", type=int, default=65536)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--saver-staging-mib", type=int, default=256,
                        help="saver.staging_bytes in MiB: the most bytes one save batch moves")
    parser.add_argument("--mooncake", nargs=2, metavar=("MASTER", "METADATA"),
                        help="also measure the bandwidth through the Mooncake master at "
                             "MASTER (host:port) with metadata server METADATA (an URL)")
    parser.add_argument("--mooncake-set", action="append", default=[], metavar="KEY=INT",
                        help="a [mooncake] setting of the clients, e.g. tcp_lanes_per_peer=0")
    parser.add_argument("--gil-busy", type=int, default=0, metavar="N",
                        help="measure the Mooncake bandwidth (both arms) while N Python "
                             "threads spin; compare with a run without")
    parser.add_argument("--real-client", type=int, default=0, metavar="THREADS",
                        help="with --mooncake, Mooncake's one-node layout: start a node-local "
                             "mooncake_client with THREADS threads and make the connectors "
                             "dummy clients of it (Mooncake's own arm stays on TCP)")
    parser.add_argument("--mooncake-only", action="store_true",
                        help="with --mooncake, measure only the Mooncake bandwidth")
    args = parser.parse_args()
    figures: dict = {"features": kvc.FEATURES}
    if not args.mooncake_only:
        figures["bandwidth"] = bandwidth(args.device, args.prompt_tokens, None,
                                         args.saver_staging_mib)
    if args.mooncake:
        settings: dict = {k: int(v) for k, v in (item.split("=", 1) for item in args.mooncake_set)}
        real_client = start_real_client(args) if args.real_client else None
        if real_client:
            settings["real_client_address"] = f"127.0.0.1:{real_client[1]}"
        try:
            # Busy or not for the whole measurement: a second run in this process would write
            # segment memory that the first one wrote already, which is faster.
            with busy_gil(args.gil_busy):
                figures["bandwidth_mooncake"] = bandwidth(args.device, args.prompt_tokens, args.mooncake,
                                                          args.saver_staging_mib, settings)
        finally:
            if real_client:
                api_support.stop_master(real_client[0])
        figures["bandwidth_mooncake"]["gil_busy_threads"] = args.gil_busy
        figures["bandwidth_mooncake"]["real_client_threads"] = args.real_client
    if not args.mooncake_only:
        figures["hooks"] = hook_cost(args.device, args.steps, 64)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
