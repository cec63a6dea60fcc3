"""A pure-Python stand-in for `kv_connector`, for the harness self-tests only.

It implements the hooks of the package's API over a dict "pool", synchronously, with the
package's rules where the harness depends on them: chain hashes and keys (R1, R3), the
lookup's resume point (R10-R13), loads of exactly the blocks R15 names, integrity checks
(R5, a corrupt object fails the load), a draft group's pages named by the chain and the
token after their block (R37; none for a block whose next token is not a prompt token),
saves capped at the chunk end (R16), window saves at the prompt's last chunk (R17), no
re-save of loaded blocks (R19). It exists so the
model, cache and chunking parts of the harness are proven against a known connector; the
real-model tests run the real package.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch


def chain_hashes(tokens, t: int, salt: str | None = None) -> list[bytes]:
    """R1: BLAKE2b-16 chain over the full blocks."""
    salt_b = b"" if salt is None else salt.encode()
    framed = struct.pack("<I", len(salt_b)) + salt_b + struct.pack("<I", 0)
    parent = hashlib.blake2b(framed, digest_size=16).digest()
    out = []
    for b in range(len(tokens) // t):
        payload = struct.pack(f"<{t}q", *tokens[b * t : (b + 1) * t])
        parent = hashlib.blake2b(parent + payload, digest_size=16).digest()
        out.append(parent)
    return out


class Layout:
    def __init__(self, d: dict):
        self.d = d
        self.groups = d["groups"]
        self.t = d["tokens_per_block"]

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        return cls(d)

    def page_bytes(self, group_id: int) -> int:
        g = next(g for g in self.groups if g["id"] == group_id)
        return len(g["layers"]) * 2 * self.t * g["kv_heads"] * g["head_dim"] * g["dtype_bytes"]


class MemoryPool:
    def __init__(self, capacity_bytes: int = 1 << 30):
        self.objects: dict[str, tuple[bytes, torch.Tensor]] = {}

    def corrupt(self, key_substring: str | None = None, count: int = 1) -> list[str]:
        """Flips a payload byte of up to `count` objects whose key holds `key_substring`,
        in key order; returns their keys."""
        done = []
        for key in sorted(self.objects):
            if len(done) < count and (key_substring is None or key_substring in key):
                self.objects[key][1].view(torch.uint8).view(-1)[0] ^= 0xFF
                done.append(key)
        return done


@dataclass
class StepRequest:
    request_id: int
    prompt_len: int
    computed_before: int
    computed_after: int
    new_reservation: int | None = None
    page_tables: list | None = None


def _digest(payload: torch.Tensor) -> bytes:
    return hashlib.blake2b(payload.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=16).digest()


class Connector:
    # R37: a draft group's page of block b is named by block b's chain hash and token
    # (b + 1) T. `ChainKeyedConnector` turns it off (harness controls only).
    next_token_keys = True

    def __init__(self, layout, kv_caches, pool=None, config=None, model_key="", namespace=None, salt=None):
        self.layout, self.kv, self.pool = layout, kv_caches, pool
        self.t, self.salt = layout.t, salt
        self.rewind = (config or {}).get("planner", {}).get("swa_endpoint_rewind_tokens", 2048)
        self.prefix = namespace or "kvc"
        self.model_key = model_key
        self.requests: dict[int, dict] = {}
        self.loads: list[tuple[int, int, bool]] = []
        self.counters = {
            "full": 0,
            "rewound": 0,
            "recovered": 0,
            "window_miss": 0,
            "full_miss": 0,
            "pages_loaded": 0,
            "loads_failed": 0,
            "failed_corrupt": 0,
            "pages_saved": 0,
            "saves_failed": 0,
            "published_past_chunk_end": 0,
        }

    def _key(self, gi: int, digest: bytes) -> str:
        g = self.layout.groups[gi]
        return f"{self.prefix}/{self.model_key}/w1r0/lg{g['id']}/t{self.t}b{self.layout.page_bytes(g['id'])}/{digest.hex()}"

    def block_names(self, tokens) -> list[list[bytes | None]]:
        """Per full block, per group, the digest naming its page (None: never saved)."""
        out = []
        for b, chain in enumerate(chain_hashes(tokens, self.t, self.salt)):
            row: list[bytes | None] = []
            for g in self.layout.groups:
                after = (b + 1) * self.t
                if g.get("role") != "draft" or not self.next_token_keys:
                    row.append(chain)
                elif after < len(tokens):
                    row.append(hashlib.blake2b(chain + struct.pack("<q", tokens[after]), digest_size=16).digest())
                else:
                    row.append(None)
            out.append(row)
        return out

    def keys(self, tokens) -> list[list[str | None]]:
        return [[n and self._key(gi, n) for gi, n in enumerate(row)] for row in self.block_names(list(tokens))]

    # -- lookup and reserve ----------------------------------------------------------------

    def lookup(self, request_id, tokens, local_match_tokens=0):
        tokens = list(tokens)
        self.requests[request_id] = {
            "names": self.block_names(tokens),
            "prompt_len": len(tokens),
            "asked": False,
            "resume": None,
            "reused": 0,
            "window_saved": False,
        }

    def flush(self):
        pass

    def _present(self, gi: int, names, block: int) -> bool:
        name = names[block][gi]
        return name is not None and self._key(gi, name) in self.pool.objects

    def _window_complete(self, names, e: int) -> bool:
        for gi, g in enumerate(self.layout.groups):
            if g["kind"] == "window":
                sinks = range(-(-g["sink_tokens"] // self.t))
                tail = range(max(0, e - g["window_tokens"]) // self.t, e // self.t)
                if not all(self._present(gi, names, b) for b in (*sinks, *tail)):
                    return False
        return True

    def _resume_point(self, state) -> int:
        names = state["names"]
        candidates = (state["prompt_len"] - 1) // self.t
        full = [gi for gi, g in enumerate(self.layout.groups) if g["kind"] == "full"]
        h = 0
        while h < candidates and all(self._present(gi, names, h) for gi in full):
            h += 1
        # R12 walks back at most R; R13's fallback (on by default) goes further.
        for e in range(h * self.t, 0, -self.t):
            if self._window_complete(names, e):
                outcome = "full" if e == h * self.t else "rewound" if e >= h * self.t - self.rewind else "recovered"
                self.counters[outcome] += 1
                return e
        self.counters["window_miss" if h else "full_miss"] += 1
        return 0

    def reserve(self, request_id, num_computed, reservation_id):
        state = self.requests[request_id]
        if not state["asked"]:  # the first call answers "pending", as a real lookup may
            state["asked"] = True
            return None
        state["resume"] = self._resume_point(state)
        return (max(0, state["resume"] - num_computed), True)

    def release(self, request_id, reservation_id, start, end):
        pass

    # -- steps: loads and saves -------------------------------------------------------------

    def on_step(self, requests):
        for step in requests:
            state = self.requests[step.request_id]
            if step.new_reservation is not None:
                self._load(step, state)
            self._save(step, state)

    def _load(self, step, state):
        e, first = state["resume"], step.computed_before // self.t
        pages = []
        for gi, g in enumerate(self.layout.groups):
            if g["kind"] == "full":
                blocks = range(first, e // self.t)
            else:
                sinks = range(-(-g["sink_tokens"] // self.t))
                tail = range(max(0, e - g["window_tokens"]) // self.t, e // self.t)
                blocks = sorted({b for b in (*sinks, *tail) if b >= first})
            for b in blocks:
                page = step.page_tables[gi][b] if b < len(step.page_tables[gi]) else -1
                name = state["names"][b][gi]
                digest, payload = self.pool.objects.get(name and self._key(gi, name), (None, None))
                if page < 0 or payload is None or _digest(payload) != digest:
                    self.counters["loads_failed"] += 1
                    self.counters["failed_corrupt"] += payload is not None and page >= 0
                    self.loads.append((step.new_reservation, step.request_id, False))
                    return
                pages.append((gi, page, payload))
        for gi, page, payload in pages:
            self.kv[gi][page].copy_(payload.view(self.kv[gi][page].shape))
        self.counters["pages_loaded"] += len(pages)
        state["reused"] = e
        self.loads.append((step.new_reservation, step.request_id, True))

    def _save(self, step, state):
        t, p = self.t, step.prompt_len
        if step.computed_after <= step.computed_before:
            return
        prompt_blocks = min(p // t, len(state["names"]))
        reused = -(-state["reused"] // t)
        last = step.computed_after >= p and not state["window_saved"]
        state["window_saved"] |= last
        for gi, g in enumerate(self.layout.groups):
            if g["kind"] == "full":
                blocks = range(max(step.computed_before // t, reused), min(step.computed_after, p) // t)
            elif last:
                tail_start = max(0, p - g["window_tokens"] - self.rewind) // t
                sinks = range(min(-(-g["sink_tokens"] // t), tail_start))
                blocks = [b for b in (*sinks, *range(tail_start, prompt_blocks)) if b >= reused]
            else:
                blocks = []
            for b in blocks:
                page = step.page_tables[gi][b] if b < len(step.page_tables[gi]) else -1
                name = state["names"][b][gi] if b < prompt_blocks else None
                key = name and self._key(gi, name)
                if name is None or page < 0 or key in self.pool.objects:
                    continue
                payload = self.kv[gi][page].detach().to("cpu", copy=True).contiguous()
                self.pool.objects[key] = (_digest(payload), payload)
                self.counters["pages_saved"] += 1

    def finished_loads(self):
        out, self.loads = self.loads, []
        return out

    def request_finished(self, request_id) -> bool:
        self.requests.pop(request_id, None)
        return False

    def finished_saves(self):
        return []

    def wait_for_progress(self, timeout_s):
        pass

    def settle_saves(self):
        pass

    def stats(self) -> dict:
        return dict(self.counters)

    def shutdown(self) -> dict:
        return self.stats()


class ChainKeyedConnector(Connector):
    """Draft pages named by the chain alone, as before R37 (harness controls only)."""

    next_token_keys = False
