"""A real speculative drafter on the tiny models: an EAGLE-style draft head with its own
KV cache, paged like the target's, and a serving instance that drafts and verifies.

The head (vLLM's EAGLE convention): one Llama decoder layer, random seeded weights,
sharing the target's token embedding and LM head. Its row at position `i` reads
`fc([embed(token i+1), h_i])`, `h_i` being the target's last hidden state at `i`, and its
output at `i` proposes token `i + 2`. Its KV lives in the layout's draft group
(`role = "draft"`, R6; `tiny.layout(spec, drafter=True)`), and `PagedKv` builds its cache
from that group's pages exactly as it builds the target's from the target groups' pages.

`DraftingInstance` serves a prompt as a speculative engine does (vLLM v1's EAGLE path):
1. each prompt chunk `[lo, hi)`: the target computes it (K/V paged, hidden states kept),
   then the head computes draft rows `[lo, hi)`, the last one fed the next prompt token,
   or at the prompt end the token the target just sampled; only then is the chunk
   reported (`on_step`), so a draft page the connector may save is complete;
2. at the prompt end the head proposes `k` tokens: the first from its last row, each
   further one from one more draft step at the next position, fed its own hidden state;
3. each verify step: the target computes `[last token, d_1 .. d_k]`; the drafts are
   accepted while they equal the target's greedy tokens, plus the target's own next token;
   the head recomputes draft rows for the accepted positions from the target's hidden
   states (overwriting its speculative rows) and proposes again.

Invariants:
- `drafter::D1`. A draft row at `i` depends on token `i + 1`: the draft page of block `b` (rows
  `bT .. bT + T - 1`) depends on token `(b + 1) T`, which block `b`'s chain hash does not
  cover. A pool that keys a draft page by the chain hash alone can serve a row computed
  with another next token (the next-token keying of the runtime's draft groups closes it).
- `drafter::D2`. Draft rows past the last reported position are speculative (drafts, rejected
  verify tokens); they are rewritten before anything reads them as final, and they lie
  past every chunk end the connector is told, so they are never saved (R16, R18).
- `drafter::D3`. Every step is recorded (`DraftStep`): the target's logits, the head's logits of
  every row it computed, the drafts proposed and the accepted count. Two runs "draft
  identically" when their records are equal, tensors bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaModel

from .engine import Instance, Request, cache_argument, chunk_bounds
from .paged import role
from .tiny import INIT_STD, VOCAB

DRAFT_TOKENS = 3  # k: tokens proposed per step
DRAFT_SEED = 4321


class DraftHead(torch.nn.Module):
    """The EAGLE-style head of a target model (see the module doc)."""

    def __init__(self, target: torch.nn.Module, *, kv_heads: int = 2, head_dim: int = 16):
        super().__init__()
        hidden = target.config.hidden_size
        self.config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=hidden,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=128,
            max_position_embeddings=4096,
            initializer_range=INIT_STD,
        )
        torch.manual_seed(DRAFT_SEED)
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        torch.nn.init.normal_(self.fc.weight, std=INIT_STD)
        with torch.no_grad():  # pass the target's hidden state through (see the module doc)
            self.fc.weight[:, hidden:] += torch.eye(hidden)
        self.body = LlamaModel(self.config)  # its own embedding is unused: the input is `fc`'s
        self.body.config._attn_implementation = "eager"
        self.embed = target.get_input_embeddings()  # shared with the target, as in EAGLE
        self.lm_head = target.get_output_embeddings()
        device = next(target.parameters()).device
        self.to(device=device, dtype=torch.float32).eval()

    def forward(self, hidden: torch.Tensor, next_tokens: list[int], start: int, cache):
        """Rows `[start, start + n)`: `hidden` the `[n, hidden_size]` states they read,
        `next_tokens` token `i + 1` of each row `i`; `cache` holds rows `[0, start)`.
        Returns the head's logits and its own hidden states, each a row per position."""
        device = hidden.device
        ids = torch.tensor([next_tokens], device=device)
        x = self.fc(torch.cat([self.embed(ids)[0], hidden], dim=-1)).unsqueeze(0)
        positions = torch.arange(start, start + len(next_tokens), device=device).unsqueeze(0)
        out = self.body(inputs_embeds=x, position_ids=positions, use_cache=True, **{cache_argument(self.body): cache})
        states = out.last_hidden_state[0]
        return self.lm_head(states), states


@dataclass
class DraftStep:
    """One step of a drafting instance (`drafter::D3`)."""

    kind: str  # "prefill" (one prompt chunk) or "verify"
    start: int  # the first position the target computed in this step
    logits: torch.Tensor  # the target's logits, one row per position it computed
    draft_logits: torch.Tensor  # the head's logits, one row per draft row it computed
    drafts: list[int]  # tokens proposed at the end of the step ([] before the prompt end)
    accepted: int | None  # verify steps: how many of the previous proposal were accepted


class DraftingInstance(Instance):
    """An `Instance` whose layout has a draft group and whose decode is speculative (see
    the module doc); `Served.trace` holds its `DraftStep`s."""

    def __init__(self, *args, head: DraftHead, draft_tokens: int = DRAFT_TOKENS, **kwargs):
        super().__init__(*args, **kwargs)
        self.head, self.k = head, draft_tokens
        self.draft_groups = [gi for gi, g in enumerate(self.layout["groups"]) if role(g) == "draft"]
        assert self.draft_groups, "a drafting instance needs a layout with a draft group"

    def _draft_pass(self, req: Request, start: int, hidden: torch.Tensor, next_tokens: list[int]):
        """Draft rows `[start, start + n)` from the draft group's pages (rows `[0, start)`);
        their K/V written back to those pages. Returns the head's (logits, hidden)."""
        end = start + len(next_tokens)
        for gi in self.draft_groups:
            for block in range(start // self.t, (end - 1) // self.t + 1):
                self._ensure(req, gi, block)
        cache = self.paged.build_cache(self.head.config, req.tables, start, self.zeros_for_missing, "draft")
        logits, states = self.head(hidden, next_tokens, start, cache)
        self.paged.write(req.tables, start, cache.added, "draft")
        return logits, states

    def _propose(self, req: Request, position: int, logits: torch.Tensor, states: torch.Tensor):
        """The `k` drafts after draft rows ending at `position` (exclusive), whose last
        logits and hidden state are given: the first from them, each further one from a
        draft step at the next position (speculative rows, `drafter::D2`). Returns (drafts, the draft
        steps' logits rows)."""
        drafts, rows = [int(logits[-1].argmax())], []
        for j in range(self.k - 1):
            step_logits, step_states = self._draft_pass(req, position + j, states[-1:], [drafts[-1]])
            rows.append(step_logits)
            drafts.append(int(step_logits[-1].argmax()))
            states = step_states
        return drafts, rows

    def _prefill(self, req: Request, start: int, first_cache: list, trace: list[DraftStep]) -> list[int]:
        """Step 1 and 2 of the module doc: the prompt from `start`, then the first drafts.
        Appends the sampled token to `req.tokens`; returns the drafts."""
        prompt_len, drafts = len(req.tokens), []
        for lo, hi in chunk_bounds(start, prompt_len, self.chunk):
            logits, hidden = self._target_pass(req, lo, req.tokens[lo:hi], first_cache, hidden=True)
            if hi == prompt_len:
                req.tokens.append(int(logits[-1].argmax()))
            draft_logits, states = self._draft_pass(req, lo, hidden, req.tokens[lo + 1 : hi + 1])
            self._report(req, lo, hi)
            extra: list[torch.Tensor] = []
            if hi == prompt_len:
                drafts, extra = self._propose(req, hi, draft_logits, states)
            trace.append(DraftStep("prefill", lo, logits, torch.cat([draft_logits, *extra]), list(drafts), None))
        return drafts

    def _verify(self, req: Request, drafts: list[int], trace: list[DraftStep]) -> tuple[list[int], list[int]]:
        """Step 3 of the module doc, once. Returns (tokens accepted, bonus included; the
        next drafts)."""
        computed = len(req.tokens) - 1
        logits, hidden = self._target_pass(req, computed, [req.tokens[-1], *drafts], None, hidden=True)
        greedy = logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == greedy[accepted]:
            accepted += 1
        new = [*drafts[:accepted], greedy[accepted]]
        req.tokens.extend(new)
        draft_logits, states = self._draft_pass(req, computed, hidden[: accepted + 1], new)
        self._report(req, computed, computed + accepted + 1)
        drafts, extra = self._propose(req, computed + accepted + 1, draft_logits, states)
        trace.append(DraftStep("verify", computed, logits, torch.cat([draft_logits, *extra]), drafts, accepted))
        return new, drafts

    def _generate(self, req: Request, start: int, decode: int, first_cache: list):
        """The prompt from `start`, then verify steps until at least `decode` tokens follow
        the first sampled one. Returns (target logits of the accepted rows, the tokens
        generated, the trace)."""
        trace: list[DraftStep] = []
        drafts = self._prefill(req, start, first_cache, trace)
        rows = [s.logits for s in trace]
        generated = [req.tokens[-1]]
        while len(generated) <= decode:
            new, drafts = self._verify(req, drafts, trace)
            rows.append(trace[-1].logits[: len(new)])
            generated.extend(new)
        return rows, generated, trace
