"""The worker side: registers vLLM's KV memory, starts loads, reports computed chunks
for saving, and tells vLLM which loads and saves are done.

Order within a step (vLLM's model runner): `handle_preemptions`, the forward pass,
`start_load_kv` (loads of requests parked in WAITING_FOR_REMOTE_KVS, whose blocks the
forward does not read), `wait_for_save` (the chunks this step computed: on CUDA the
current stream is synchronized first, since the runtime's saver copies on its own
stream), `get_transfer_results`, `get_block_ids_with_load_errors`.

Invariants:

- `vllm::worker::W1`. Blocks handed to the runtime are not freed by vLLM before the runtime is
  done with them: a finished request is reported in finished_sending only once its saves
  settled (`finished_saves`), an aborted request with a load in flight in
  finished_recving only once the load settled, and a preempted request's saves are
  waited for in `handle_preemptions`, before the forward pass can overwrite its blocks.
- `vllm::worker::W2`. A load reported not filled is never reported as computed: with one KV
  cache group its blocks come back through `get_block_ids_with_load_errors`, with
  several the request through `failed_recving` (vLLM's rule for hybrid layouts); vLLM
  computes those tokens.
- `vllm::worker::W3`. With ranks in their own processes, a rank adopts each request's
  lookup once, from the first metadata that carries it, and starts a load only when its
  own connector offers exactly the tokens the scheduler's offered; otherwise it reports
  the load failed, and vLLM computes the tokens on every rank.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from ._engine import Ended, LoadPlan, step_blocks_start

NULL_BLOCK = 0  # vLLM's null block: a window group's dropped block
WAIT_SLICE_S = 0.05


class WorkerSide:
    def __init__(self, engine, adopts: bool = False):
        self.engine = engine
        # Ranks in their own processes: lookups come from the scheduler as records.
        self.adopts = adopts
        self._adopted_from: object = None
        self.conn = engine.conn
        self.pages = engine.pages
        self.plan = engine.pages.plan
        self.t = self.plan.tokens_per_block
        self.layout = self.conn.layout
        self.group_ids = [group["id"] for group in self.layout.groups]
        self.loads: dict[int, LoadPlan] = {}  # reservation -> load in flight
        self.load_pages: dict[int, list[tuple[int, int, int]]] = {}  # reservation -> (group, block, page)
        self.refused: list[LoadPlan] = []
        self.after_load: dict[int, Ended] = {}  # rid -> ended while its load ran
        self.saving: dict[int, str] = {}  # rid -> req_id, finished, saves pending
        self.save_pages: dict[int, list[tuple[int, int]]] = {}  # rid -> (group, page)
        self.saves_settled: set[int] = set()
        self.tables: dict[int, list[list[int]]] = {}  # rid -> vLLM's block ids per group
        self.errors: set[int] = set()
        self.bounce_exhausted = 0

    # -- tables ------------------------------------------------------------------------

    def _table(self, ids: list[int]) -> list[int]:
        return [-1 if b == NULL_BLOCK else b for b in ids]

    def _window_blocks(self, gi: int, start: int, end: int) -> list[int]:
        """Blocks of a window group a load resuming at `end` fills (R15), from `start`: the
        runtime's own answer, so the bounce pages match what its plan loads."""
        return self.layout.load_blocks(self.group_ids[gi], start, end)

    # -- lookups from the scheduler ------------------------------------------------------

    def adopt(self, meta) -> None:
        """Takes the lookups `meta` brings (once per metadata, W3)."""
        if not self.adopts or meta is self._adopted_from:
            return
        self._adopted_from = meta
        for rid, record in meta.records.items():
            self.conn.adopt_lookup(rid, record)

    def _offered_here(self, plan: LoadPlan) -> bool:
        """Whether this rank's connector offers the tokens the scheduler's did (W3)."""
        if not self.adopts:
            return True  # one connector: the scheduler side reserved on it
        answer = self.conn.reserve(plan.rid, plan.start, plan.reservation)
        return answer is not None and answer[0] == plan.end - plan.start

    # -- loads -------------------------------------------------------------------------

    def start_loads(self, plans: list[LoadPlan]) -> None:
        steps = []
        for plan in plans:
            if plan.refused or not self._offered_here(plan):
                self.refused.append(replace(plan, refused=True))
                continue
            tables, taken = [], []
            for gi, g in enumerate(self.plan.groups):
                ids = plan.block_ids[g.vllm_index]
                if not self.pages.bounced(gi):
                    tables.append(self._table(ids))
                    continue
                table = [-1] * len(ids)
                for block in self._window_blocks(gi, plan.start, plan.end):
                    page = self.pages.take(gi)
                    if page is None:
                        break
                    table[block] = page
                    taken.append((gi, block, page))
                else:
                    tables.append(table)
                    continue
                break
            if len(tables) < len(self.plan.groups):  # a bounce pool ran dry
                self.bounce_exhausted += 1
                for gi, _block, page in taken:
                    self.pages.give_back(gi, [page])
                self.refused.append(plan)
                continue
            self.loads[plan.reservation] = plan
            self.load_pages[plan.reservation] = taken
            steps.append(self._step(plan.rid, plan.prompt_len, plan.start, plan.start, tables, plan.reservation))
        if steps:
            self.conn.on_step(steps)

    def _step(self, rid, prompt_len, before, after, tables, reservation=None):
        import kv_connector as kvc

        return kvc.StepRequest(rid, prompt_len, before, after, new_reservation=reservation, page_tables=tables)

    def _settle_load(self, plan: LoadPlan, filled: bool, out) -> None:
        recving, failed = out
        taken = self.load_pages.pop(plan.reservation, [])
        ended = self.after_load.pop(plan.rid, None)
        if filled and ended is None:
            for gi, block, page in taken:
                vllm_block = plan.block_ids[self.plan.groups[gi].vllm_index][block]
                if vllm_block != NULL_BLOCK:
                    self.pages.from_bounce(gi, page, vllm_block)
        for gi, _block, page in taken:
            self.pages.give_back(gi, [page])
        if not filled and not plan.refused:
            self.conn.release(plan.rid, plan.reservation, plan.start, plan.end)
        recving.add(plan.req_id)
        if ended is not None:
            # Aborted while loading: nothing was computed under this id, so no save holds
            # its blocks; vLLM frees them on this finished_recving.
            self.conn.request_finished(plan.rid)
            return
        if not filled:
            if self.plan.num_vllm_groups == 1:
                ids = plan.block_ids[0]
                self.errors.update(ids[plan.start // self.t : plan.end // self.t])
            else:
                failed.add(plan.req_id)

    # -- saves -------------------------------------------------------------------------

    def _table_of(self, c) -> list[list[int]] | None:
        """The request's vLLM block table after this step's update (ChunkPlan.table)."""
        if c.table is not None:
            mine = self.tables.get(c.rid)
            if c.replace:
                self.tables[c.rid] = [list(ids) for ids in c.table]
            elif mine is not None:
                for ids, added in zip(mine, c.table):
                    ids.extend(added)
        return self.tables.get(c.rid)

    def report_chunks(self, chunks) -> None:
        steps = []
        for c in chunks:
            table = self._table_of(c)
            if c.after <= c.before or table is None:
                continue
            # The window blocks the runtime saves for this chunk: its tail at the prompt's
            # last chunk (R17), each checkpoint window it passes (R28). Only those are
            # copied aside, so a long last chunk needs no more bounce pages than a window.
            saved = self.conn.window_save_blocks(c.rid, c.prompt_len, c.before, c.after)
            tables = []
            for gi, g in enumerate(self.plan.groups):
                if not self.pages.bounced(gi):
                    tables.append(self._table(table[g.vllm_index]))
                else:
                    ids = c.window_ids[g.vllm_index] if c.window_ids else {}
                    vllm = table[g.vllm_index]
                    fresh = step_blocks_start(c.table, c.replace, g.vllm_index, len(vllm))
                    tables.append(self._bounce_window(gi, c, ids, saved[gi], vllm, fresh))
            steps.append(self._step(c.rid, c.prompt_len, c.before, c.after, tables))
        if not steps:
            return
        if self.pages.device.type == "cuda":
            torch.cuda.current_stream(self.pages.device).synchronize()
        self.conn.on_step(steps)

    def _bounce_window(
        self, gi: int, c, ids: dict[int, int], blocks: list[int], vllm: list[int], fresh: int
    ) -> list[int]:
        """Copies the window blocks the runtime saves this step (`blocks`), those vLLM still
        holds, into bounce pages; a pool that runs dry publishes none of them. `vllm` is
        the group's table after this step: the blocks vLLM added this step (from `fresh`
        on) are current in it, the ones before them vLLM may have dropped and reused since,
        so theirs come from `ids` (read by the scheduler this step)."""
        length = len(vllm)
        table = [-1] * length
        for block in blocks:
            if block >= length:
                continue
            vllm_block = vllm[block] if block >= fresh else ids.get(block, NULL_BLOCK)
            if vllm_block == NULL_BLOCK:
                continue  # dropped by vLLM, or not among the scheduler's: not saved
            page = self.pages.take(gi)
            if page is None:  # the window is not published; a later lookup rewinds or misses
                self.bounce_exhausted += 1
                return [-1] * length
            self.pages.to_bounce(gi, vllm_block, page)
            table[block] = page
            self.save_pages.setdefault(c.rid, []).append((gi, page))
        return table

    def _saves_done(self, rid: int) -> None:
        for gi, page in self.save_pages.pop(rid, []):
            self.pages.give_back(gi, [page])

    def _poll_saves(self) -> None:
        for rid in self.conn.finished_saves():
            self.saves_settled.add(rid)

    # -- request ends ------------------------------------------------------------------

    def preempted(self, items) -> None:
        """vLLM freed these requests' blocks; the forward pass after this may overwrite
        them, so their saves must settle first."""
        for _req_id, rid in items:
            self.tables.pop(rid, None)
            if self.conn.request_finished(rid):
                while rid not in self.saves_settled:
                    self._poll_saves()
                    if rid not in self.saves_settled:
                        self.conn.wait_for_progress(WAIT_SLICE_S)
            self.saves_settled.discard(rid)
            self._saves_done(rid)

    def transfer_results(self, ended: list[Ended]):
        recving: set[str] = set()
        failed: set[str] = set()
        sending: set[str] = set()
        loading = {p.rid for p in self.loads.values()} | {p.rid for p in self.refused}
        for e in ended:
            self.tables.pop(e.rid, None)
            if e.rid in loading:
                self.after_load[e.rid] = e
            elif e.loading:
                # Its load was reported before the abort: nothing computed, nothing saved.
                self.conn.request_finished(e.rid)
            elif self.conn.request_finished(e.rid):
                self.saving[e.rid] = e.req_id
            else:
                self._saves_done(e.rid)
                sending.add(e.req_id)
        for reservation, _rid, filled in self.conn.finished_loads():
            plan = self.loads.pop(reservation, None)
            if plan is not None:
                self._settle_load(plan, filled, (recving, failed))
        for plan in self.refused:
            self._settle_load(plan, False, (recving, failed))
        self.refused = []
        self._poll_saves()
        for rid in [r for r in self.saving if r in self.saves_settled]:
            sending.add(self.saving.pop(rid))
            self.saves_settled.discard(rid)
            self._saves_done(rid)
        return sending, recving, failed

    def take_errors(self) -> set[int]:
        errors, self.errors = self.errors, set()
        return errors

    def drain(self, timeout_s: float) -> None:
        """Waits (bounded) for loads in flight to settle, for shutdown."""
        deadline = time.monotonic() + timeout_s
        while self.loads and time.monotonic() < deadline:
            for reservation, _rid, _filled in self.conn.finished_loads():
                self.loads.pop(reservation, None)
            self.conn.wait_for_progress(WAIT_SLICE_S)
