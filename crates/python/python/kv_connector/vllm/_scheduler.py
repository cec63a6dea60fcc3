"""The scheduler side: admission (lookup, reserve) and the per-step plans for the worker.

Each vLLM request gets a runtime request id at its first `get_num_new_matched_tokens`;
a preempted request gets a new one when it is admitted again (the runtime sees a new
prompt: everything computed so far). A request's `cache_salt` and LoRA adapter scope its
keys (R34): it shares KV only with requests of the same salt and adapter, the adapter
named by its name and path (vLLM's `lora_int_id` is the engine's own number for it).
Requests the runtime cannot key (multimodal inputs, prompt embeddings) are passed over:
no lookup, no saves.

With the ranks in their own processes the scheduler looks up through its own lookup-only
connector (`_ranks`), and the first metadata that carries a request to the workers carries
its finished lookup (`KvcMetadata.records`) for every rank to adopt.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from ._engine import ChunkPlan, Ended, Engine, KvcMetadata, LoadPlan, lookup, step_blocks_start
from ._layout import UnsupportedVllmSetup
from ._ranks import lookup_connector, separate_processes


@dataclass
class _Req:
    rid: int
    prompt_len: int
    answer: tuple[int, bool] | None = None
    answer_at: int = 0  # num_computed the answer was given for
    reservation: int = 0
    loading: bool = False
    # A load ran (filled or not): vLLM asks again only after a failed one, and then
    # computes the tokens itself rather than being offered the same objects again.
    loaded: bool = False
    # Its lookup went to the workers (ranks in their own processes).
    sent: bool = False
    # The runtime's window save points, ascending, and per point the window blocks (per
    # layout group) a chunk passing it saves; asked at the request's first chunk.
    window_points: list[int] | None = None
    window_blocks: list[list[list[int]]] = field(default_factory=list)


def keyable(request) -> bool:
    """Whether the runtime's keys describe this request's KV: its tokens and its scope do,
    unless multimodal inputs or prompt embeddings stand in for tokens."""
    return not (request.mm_features or request.prompt_embeds is not None)


def _tokens(request) -> list[int]:
    """The request's tokens so far. A new request's are its prompt, handed over as vLLM's
    own list, not copied: vLLM only ever appends to a request's prompt list (a streaming
    session's next input), so its first tokens stay as they are for the runtime to read on
    its own thread (`lookup(append_only=True)`)."""
    prompt = request.prompt_token_ids
    if prompt is not None and request.num_tokens == len(prompt):
        return prompt
    return list(request.all_token_ids[: request.num_tokens])


def scope(request) -> tuple[str | None, str | None]:
    """The request's (cache salt, adapter) for the runtime's lookup (R34). The adapter is
    named by what identifies its weights on every instance: its name and path."""
    lora = request.lora_request
    adapter = None if lora is None else json.dumps([lora.lora_name, lora.lora_path])
    return request.cache_salt or None, adapter


class SchedulerSide:
    def __init__(self, engine_id: str, vllm_config=None, settings=None):
        self.engine_id = engine_id
        self._engine: Engine | None = None
        self.reqs: dict[str, _Req] = {}
        self.loads: list[LoadPlan] = []
        self.ended: list[Ended] = []
        # vLLM's KVCacheManager, bound before the first step is scheduled.
        self.kv_cache_manager: Any = None
        # Ranks in their own processes: every rank's handshake (EngineCore hands them over
        # before the first step), and the lookups then go through a connector of our own.
        self.remote = vllm_config is not None and separate_processes(vllm_config)
        self.handshakes: dict | None = None
        self._vllm_config, self._settings = vllm_config, settings
        self._windows: list[tuple[int, int]] | None = None

    @property
    def engine(self):
        if self._engine is None:
            self._engine = self._remote_engine() if self.remote else lookup(self.engine_id)
        return self._engine

    def _remote_engine(self) -> Engine:
        if not self.handshakes:
            raise UnsupportedVllmSetup(
                "the scheduler has no kv_connector handshake from its workers: vLLM's EngineCore "
                "collects them after the KV caches are registered (get_handshake_metadata)"
            )
        return Engine(lookup_connector(self.handshakes, self._vllm_config, self._settings), None)

    def ranks_reported(self, handshakes: dict) -> None:
        """EngineCore hands over every rank's handshake before the first step: with ranks in
        their own processes, the lookup-only connector starts now, not on the first lookup."""
        self.handshakes = handshakes
        if self.remote and self._engine is None:
            self._engine = self._remote_engine()

    def shutdown(self):
        engine, self._engine = self._engine, None
        if not self.remote or engine is None:
            return None
        conn: Any = engine.conn
        return conn.shutdown()

    def matched_tokens(self, request, num_computed: int) -> tuple[int | None, bool]:
        if not keyable(request):
            return 0, False
        engine = self.engine
        r = self.reqs.get(request.request_id)
        if r is None:
            tokens = _tokens(request)
            r = _Req(rid=engine.new_rid(), prompt_len=len(tokens))
            self.reqs[request.request_id] = r
            cache_salt, adapter = scope(request)
            # The runtime reads the list on its own thread, not this one, and copies nothing.
            engine.conn.lookup(
                r.rid,
                tokens,
                local_match_tokens=num_computed,
                cache_salt=cache_salt,
                adapter=adapter,
                read_later=True,
                append_only=True,
            )
            engine.conn.flush()
        if r.loaded:
            return 0, False
        if r.answer is not None and r.answer_at == num_computed:
            return r.answer
        reservation = engine.new_reservation()
        answer = engine.conn.reserve(r.rid, num_computed, reservation)
        if answer is None:
            return None, False
        extra = answer[0]
        r.reservation, r.answer_at = reservation, num_computed
        # Every load is asynchronous for vLLM: the request waits in
        # WAITING_FOR_REMOTE_KVS until the worker reports it (a sync_load runtime just
        # reports it at once).
        r.answer = (extra, True) if extra > 0 else (0, False)
        return r.answer

    def after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        r = self.reqs.get(request.request_id)
        if r is None or num_external_tokens == 0:
            return
        offered = r.answer[0] if r.answer is not None else 0
        self.loads.append(
            LoadPlan(
                req_id=request.request_id,
                rid=r.rid,
                reservation=r.reservation,
                prompt_len=r.prompt_len,
                start=r.answer_at,
                end=r.answer_at + num_external_tokens,
                block_ids=blocks.get_block_ids(),  # fresh lists, ours to keep
                refused=num_external_tokens != offered,
            )
        )
        r.loading = True
        r.answer = None

    def build_meta(self, so) -> KvcMetadata:
        meta = KvcMetadata(loads=self.loads, ended=self.ended)
        self.loads, self.ended = [], []
        for req_id in so.preempted_req_ids or ():
            r = self.reqs.pop(req_id, None)
            if r is not None:
                meta.preempted.append((req_id, r.rid))
                self._forget(r)
        # vLLM's own block ids of this step (no list is built here): a new or resumed
        # request's whole table, else the blocks added this step.
        scheduled = {n.req_id: (n.num_computed_tokens, n.block_ids, True) for n in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            replace = req_id in cached.resumed_req_ids
            scheduled[req_id] = (cached.num_computed_tokens[i], cached.new_block_ids[i], replace)
        for req_id, (before, table, replace) in scheduled.items():
            r = self.reqs.get(req_id)
            if r is None or before >= r.prompt_len:
                continue  # not ours, or decoding: only prompt tokens are saved
            drafts = len(so.scheduled_spec_decode_tokens.get(req_id, ()))
            after = before + so.num_scheduled_tokens[req_id] - drafts
            windows = () if replace else self._window_ids(req_id, r, before, after, table)
            meta.chunks.append(ChunkPlan(req_id, r.rid, r.prompt_len, before, after, table, replace, windows))
        if self.remote:
            self._send_records(meta)
        return meta

    def _window_ids(self, req_id: str, r: _Req, before: int, after: int, added) -> tuple[dict[int, int], ...]:
        """Per vLLM group, the ids of the window blocks the runtime saves for this chunk
        (its tail, its checkpoints) that precede the blocks vLLM `added` this step, read
        from vLLM's table as it is now: a window block vLLM already dropped reads as its
        null block, never as a block it reused. The worker takes the added blocks' ids
        from the step's table (current by construction), so a new or resumed request,
        whose whole table is the step's, needs none of these. The blocks come from the
        request's save schedule, asked once: the points the chunk passes list every block
        it saves (and perhaps sink blocks it has not computed, which the worker leaves
        alone)."""
        groups = self._window_groups()
        if after <= before or not groups:
            return ()
        if r.window_points is None:
            schedule = self.engine.conn.window_save_schedule(r.rid, r.prompt_len)
            r.window_points = [point for point, _ in schedule]
            r.window_blocks = [blocks for _, blocks in schedule]
        passed = r.window_blocks[bisect_right(r.window_points, before) : bisect_right(r.window_points, after)]
        if not passed:
            return ()  # the chunk passes no checkpoint and is not the prompt's last
        blocks = self.kv_cache_manager.get_blocks(req_id).blocks
        ids: list[dict[int, int]] = [{} for _ in blocks]
        for g, position in groups:
            group = blocks[g]
            kept = step_blocks_start(added, False, g, len(group))
            ids[g] = {b: group[b].block_id for saved in passed for b in saved[position] if b < kept}
        return tuple(ids)

    def _window_groups(self) -> list[tuple[int, int]]:
        """(vLLM group, layout position) of each window group; with pipeline stages, stage
        0's (every stage has the same groups, numbered `stage * groups + index`)."""
        if self._windows is None:
            count = len(self.kv_cache_manager.kv_cache_config.kv_cache_groups)
            layout = self.engine.conn.layout.groups
            self._windows = [(g["id"], p) for p, g in enumerate(layout) if g["kind"] == "window" and g["id"] < count]
        return self._windows

    def _send_records(self, meta: KvcMetadata) -> None:
        """The finished lookups of the requests this metadata first brings to the workers."""
        conn = self.engine.conn
        plans: list[LoadPlan | ChunkPlan] = [*meta.loads, *meta.chunks]
        for plan in plans:
            r = self.reqs.get(plan.req_id)
            if r is None or r.sent or r.rid != plan.rid:
                continue
            r.sent = True
            record = conn.lookup_record(r.rid)
            if record is not None:
                meta.records[r.rid] = record

    def _forget(self, r: _Req) -> None:
        """The lookup-only connector keeps nothing of a request vLLM is done with."""
        if self.remote:
            self.engine.conn.request_finished(r.rid)

    def finished(self, request) -> tuple[bool, None]:
        """True: the worker reports the request in finished_sending once its saves
        settled. A request whose load may still run is left to vLLM, which holds its
        blocks until the worker reports the load (finished_recving)."""
        r = self.reqs.pop(request.request_id, None)
        if r is None:
            return False, None
        self._forget(r)
        self.ended.append(Ended(request.request_id, r.rid, r.loading))
        return (not r.loading), None

    def connector_output(self, output) -> None:
        for req_id in output.finished_recving or ():
            r = self.reqs.get(req_id)
            if r is not None:
                r.loading, r.loaded = False, True
