"""test_real_model.py's proof through a real Mooncake master (`mooncake_master` on
loopback), instances A and B in two processes, each with its own connector and Mooncake
client (no MemoryPool).

A runs in a child process (`models.peer`): for every model it serves A's part of the
conversation, the shared system prefix, the window walk-back (hybrid models) and two
negative controls, settles its saves and stays alive, its clients holding the objects,
until this process is done. Here one instance B per model serves B's parts: it looks up,
reserves, loads, builds the model's cache from exactly the loaded pages and computes the
rest and 16 greedy tokens; each test reads the counters its own part changed. Pass: test_real_model.py's criterion (offers, loaded pages,
cache, logits and tokens equal a no-reuse baseline bit for bit). Controls: a page of
another prompt misses the baseline by more than CONTROL_MIN_DIFF; an object A's process
rewrote with a flipped payload byte, through a raw Mooncake client, is refused and B
recomputes it to the baseline's bits. Drafting (test_real_model_drafter.py's proof): A's
process serves the first turns of a conversation with an EAGLE-style drafter, B the next
ones from A's objects, each drafting as a local reference that reuses the same prefix from
its own pages.

`KV_CONNECTOR_TEST_DEVICE=cuda` runs the models and page tensors of both processes on the
GPU.
"""

import functools
from dataclasses import dataclass, field

import pytest

import kv_connector as kvc
from api_support import mooncake_master, needs_mooncake  # noqa: F401 (fixture)
from models import draft_scenarios, scenarios
from models.engine import Instance
from models.peer import CONVERSATION, CORRUPT, DRAFTED, FOREIGN_PAGE, SHARED_PREFIX, WALK_BACK, Answer, Peer, plan
from models.tiny import SPECS, build_model

pytestmark = needs_mooncake

MODELS = list(SPECS)
HYBRID = [name for name in MODELS if SPECS[name].sliding_window]
DRAFTER_MODELS = ["gpt-oss", "llama"]
# B's counters a test reads, as changed by its own part (B serves the parts of several tests).
COUNTERS = ("pages_loaded", "loads_failed", "failed_corrupt", "full", "rewound", "recovered")


@functools.cache
def model(name: str):
    return build_model(SPECS[name], scenarios.device())


@functools.cache
def head(name: str):
    return draft_scenarios.make_head(SPECS[name], model(name))


@dataclass
class Deployment:
    """Instance A's process, its parts of every model served, and this process's instances
    B, one per model (each with its own connector and Mooncake client), made on first use."""

    peer: Peer
    answer: Answer
    instances: dict[str, Instance] = field(default_factory=dict)

    def b(self, name: str) -> Instance:
        if name not in self.instances:
            self.instances[name] = scenarios.make_instance(kvc, SPECS[name], model(name), base_config=self.peer.config)
        return self.instances[name]

    def drafting_b(self, name: str) -> Instance:
        """Instance B of `name` with the drafter (a connector of its own)."""
        key = f"{name} drafting"
        if key not in self.instances:
            self.instances[key] = draft_scenarios.make_instance(
                kvc, SPECS[name], model(name), head(name), base_config=self.peer.config
            )
        return self.instances[key]

    def serve_b(self, name: str, key: str) -> tuple[list[scenarios.Step], dict, dict]:
        """B's part of scenario `key`: its steps, B's stats after it, and the change of
        B's COUNTERS and pages_filled it made."""
        b = self.b(name)
        before, filled = b.conn.stats(), b.pages_filled
        steps = plan(SPECS[name])[key].b(b, self.answer.steps[name][key])
        after = b.conn.stats()
        change = {counter: scenarios.stat(after, counter) - scenarios.stat(before, counter) for counter in COUNTERS}
        return steps, after, {**change, "pages_filled": b.pages_filled - filled}


@pytest.fixture(scope="module")
def deployment(mooncake_master, tmp_path_factory):  # noqa: F811 (fixture)
    folder = tmp_path_factory.mktemp("peer")
    with Peer.start(mooncake_master.config(), MODELS, folder, drafter_models=DRAFTER_MODELS) as peer:
        d = Deployment(peer, peer.wait_ready())
        try:
            yield d
        finally:
            peer.say_done()  # A shuts down while B does
            for b in d.instances.values():
                scenarios.assert_saves(b.close())
            d.instances.clear()


def assert_a_loads_and_saves(d: Deployment, name: str) -> None:
    stats = d.answer.stats[name]
    scenarios.assert_loads(stats, d.answer.pages_filled[name])
    scenarios.assert_saves(stats)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("key", [CONVERSATION, SHARED_PREFIX])
def test_resumes_bit_exact_across_processes(deployment, key, name):
    """Conversation: A serves turns 1-2, B turns 3-4. Shared prefix: A serves three
    prompts after one system prefix, B a fourth."""
    a_steps = deployment.answer.steps[name][key]
    b_steps, stats, change = deployment.serve_b(name, key)
    for c in [scenarios.check(model(name), s) for s in a_steps + b_steps]:
        scenarios.assert_matches(c)
    if key == CONVERSATION:
        assert [s.served.offer for s in a_steps + b_steps] == [0, 160, 240, 320]
    assert change["pages_loaded"] > 0, "B loaded through Mooncake"
    scenarios.assert_loads(change, change["pages_filled"])
    scenarios.assert_saves(stats)
    assert_a_loads_and_saves(deployment, name)


@pytest.mark.parametrize("name", HYBRID)
def test_window_walk_back_resumes_bit_exact_across_processes(deployment, name):
    """B resumes at an earlier prompt end of A's whose window is in the pool: once past R
    (`recovered`, R13), once within it (`rewound`, R12)."""
    a_steps = deployment.answer.steps[name][WALK_BACK]
    b_steps, stats, change = deployment.serve_b(name, WALK_BACK)
    for c in [scenarios.check(model(name), s) for s in a_steps + b_steps]:
        scenarios.assert_matches(c)
    assert [change[outcome] for outcome in ("full", "rewound", "recovered")] == [0, 1, 1]
    scenarios.assert_loads(change, change["pages_filled"])
    scenarios.assert_saves(stats)


@pytest.mark.parametrize("name", MODELS)
def test_page_of_another_prompt_is_caught_across_processes(deployment, name):
    [step], _stats, _change = deployment.serve_b(name, FOREIGN_PAGE)
    c = scenarios.check(model(name), step)
    assert c.served.filled and c.served.offer == scenarios.SYSTEM_TOKENS
    assert c.max_abs_diff() > scenarios.CONTROL_MIN_DIFF


@pytest.mark.parametrize("name", MODELS)
def test_corrupt_object_is_refused_and_recomputed_across_processes(deployment, name):
    """B's connector refuses the load (R5, R25); B computes the prefix itself and then
    matches the baseline bit for bit."""
    key = scenarios.corrupt_key(deployment.b(name).conn, deployment.answer.steps[name][CORRUPT])
    assert deployment.answer.damaged[name] == [key]
    [step], _stats, change = deployment.serve_b(name, CORRUPT)
    c = scenarios.check(model(name), step)
    assert change["failed_corrupt"] == 1
    assert c.served.offer == scenarios.SYSTEM_TOKENS
    assert c.served.filled is False and c.served.start == 0
    assert c.exact(), f"max abs diff {c.max_abs_diff():.3e}"
    assert c.served.generated == c.baseline_generated


@pytest.mark.parametrize("name", DRAFTER_MODELS)
def test_drafted_conversation_resumes_identically_across_processes(deployment, name):
    """A's process serves turns 1-2 with the drafter, B turns 3-4 (turn 3 from A's
    objects): every turn drafts as the local reference and no reuse do (draft logits,
    drafts, accepted counts and target logits)."""
    a_steps = deployment.answer.steps[name][DRAFTED]
    b = deployment.drafting_b(name)
    b_steps = draft_scenarios.conversation.b(b, a_steps)
    draft_scenarios.assert_conversation(SPECS[name], model(name), head(name), a_steps + b_steps)
    stats = b.conn.stats()
    assert scenarios.stat(stats, "pages_loaded") == b.pages_filled > 0, "B loaded through Mooncake"
    scenarios.assert_saves(stats)
    scenarios.assert_loads(deployment.answer.drafting_stats[name], deployment.answer.drafting_pages_filled[name])
