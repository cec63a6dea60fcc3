"""Instance A of the two-process real-model tests (test_real_model_mooncake.py), in a
process of its own, and the parent's handle on that process.

The parent (`Peer.start`) runs `python -m models.peer REQUEST` in tests/. REQUEST is a
JSON file: the models, the connector configuration of a Mooncake client (master and
metadata server) and the folder to answer in. For every model the child builds instance
A, with its own connector and so its own Mooncake client, and runs A's part of every
scenario in its `plan`, each settling its saves, and for the models REQUEST names as
drafter models a drafting instance A (`models.drafter`, its own connector) serves A's
part of the drafted conversation (`DRAFTED`). Then it damages the object of the corrupt
control through a raw Mooncake client of its own (`damage`; the client lives as long as
A, as the rewritten object may be in its segment), writes its answer
(`torch.save` of an `Answer`) to `a.pt`, whole (renamed into place), and waits for a line
or the end of file on stdin: a Mooncake client's objects leave the store when the client
closes, so A stays alive until the parent has loaded. Then it shuts its connectors down
and exits 0; a failure exits non-zero, its traceback in `peer.log`.

The parent waits for `a.pt`, failing once the child has exited or READY_S has passed, and
serves B's parts with its own connectors. `Peer.stop` says done, waits STOP_S for the exit
and kills the child by its PID when the exit does not come; the child also leaves when
the parent's end of stdin closes, so it never outlives the parent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import kv_connector as kvc

from . import draft_scenarios, scenarios
from .tiny import SPECS, ModelSpec, build_model

# The scenarios both processes run, each on prompts of its own: the controls have their
# own system prefixes, so the object damaged for one is in no other's prefix.
CONVERSATION, SHARED_PREFIX, WALK_BACK, FOREIGN_PAGE, CORRUPT = (
    "conversation",
    "shared prefix",
    "walk back",
    "page of another prompt",
    "corrupt object",
)


# The drafted conversation (`draft_scenarios.conversation` on drafting instances).
DRAFTED = "drafted conversation"


def plan(spec: ModelSpec) -> dict[str, scenarios.Scenario]:
    """The scenarios of a model: all of them, the walk-back for hybrid models only."""
    out = {
        CONVERSATION: scenarios.conversation,
        SHARED_PREFIX: scenarios.shared_prefix,
        WALK_BACK: scenarios.walk_back,
        FOREIGN_PAGE: scenarios.foreign_page(system_seed=5),
        CORRUPT: scenarios.corrupt(system_seed=6),
    }
    if not spec.sliding_window:
        del out[WALK_BACK]
    return out


ANSWER = "a.pt"
# Hang guards, never timing checks: A's parts of every model (process start included) on a
# busy two-core machine, and the child's shutdown.
READY_S = 300.0
STOP_S = 60.0
TESTS_DIR = Path(__file__).resolve().parent.parent


@dataclass
class Answer:
    """What instance A's process sends back, per model name."""

    steps: dict[str, dict[str, list[scenarios.Step]]]  # scenario -> A's steps
    stats: dict[str, dict]  # A's connector stats once every save is settled
    pages_filled: dict[str, int]  # A's Instance.pages_filled
    damaged: dict[str, list[str]]  # the keys `damage` rewrote
    drafting_stats: dict[str, dict] = field(default_factory=dict)  # the drafting A's stats
    drafting_pages_filled: dict[str, int] = field(default_factory=dict)  # and its pages_filled


# ---- the child ----


def raw_client(config: dict):
    """A Mooncake Store client of the master `config` names, outside any connector."""
    from mooncake.store import MooncakeDistributedStore

    mc = config["mooncake"]
    store = MooncakeDistributedStore()
    code = store.setup("127.0.0.1", mc["metadata_server"], 16 << 20, 16 << 20, "tcp", "", mc["master_address"])
    if code != 0:
        raise RuntimeError(f"raw Mooncake client setup answered {code}")
    return store


def damage(store, key: str) -> list[str]:
    """Rewrites the stored object `key` with its last byte (a payload byte) flipped: get,
    remove, put. Returns the keys rewritten."""
    data = bytearray(store.get(key))
    if not data:
        raise RuntimeError(f"{key}: not in the store")
    data[-1] ^= 0xFF
    if (code := store.remove(key, True)) != 0:  # force: past any lease of the connectors' probes
        raise RuntimeError(f"{key}: remove answered {code}")
    if (code := store.put(key, bytes(data))) != 0:
        raise RuntimeError(f"{key}: put answered {code}")
    return [key]


def main(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    folder = Path(request["folder"])
    answer = Answer({}, {}, {}, {})
    instances, store = [], None
    try:
        for name in request["models"]:
            spec = SPECS[name]
            model = build_model(spec, scenarios.device())
            a = scenarios.make_instance(kvc, spec, model, base_config=request["config"])
            instances.append(a)
            answer.steps[name] = {key: scenario.a(a) for key, scenario in plan(spec).items()}
            answer.stats[name] = a.conn.stats()
            answer.pages_filled[name] = a.pages_filled
            store = store or raw_client(request["config"])
            answer.damaged[name] = damage(store, scenarios.corrupt_key(a.conn, answer.steps[name][CORRUPT]))
            if name in request.get("drafter_models", []):
                head = draft_scenarios.make_head(spec, model)
                drafting = draft_scenarios.make_instance(kvc, spec, model, head, base_config=request["config"])
                instances.append(drafting)
                answer.steps[name][DRAFTED] = draft_scenarios.conversation.a(drafting)
                answer.drafting_stats[name] = drafting.conn.stats()
                answer.drafting_pages_filled[name] = drafting.pages_filled
        partial = folder / f"{ANSWER}.partial"
        torch.save(answer, partial)
        os.replace(partial, folder / ANSWER)
        sys.stdin.readline()  # the parent's "done", or the end of file once it is gone
    finally:
        for a in instances:
            a.close()
        if store is not None:
            store.close()


# ---- the parent ----


class Peer:
    """Instance A's process, seen from the parent; a context manager that stops it."""

    def __init__(self, process: subprocess.Popen, folder: Path, config: dict):
        self.process, self.folder, self.config = process, folder, config
        self.answer: Answer | None = None

    @classmethod
    def start(cls, config: dict, models: list[str], folder: Path, drafter_models: list[str] = ()) -> Peer:
        """Starts A's process for `models` (`drafter_models` also drafting) on the Mooncake
        client configuration `config`."""
        request = folder / "request.json"
        fields = {"config": config, "models": models, "folder": str(folder), "drafter_models": list(drafter_models)}
        request.write_text(json.dumps(fields))
        env = {**os.environ, "MC_TCP_BIND_ADDRESS": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
        with open(folder / "peer.log", "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "models.peer", str(request)],
                cwd=TESTS_DIR,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        return cls(process, folder, config)

    def log_tail(self, lines: int = 40) -> str:
        text = (self.folder / "peer.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_ready(self) -> Answer:
        """A's answer, once its process has written it; loaded onto this process's device."""
        deadline = time.monotonic() + READY_S
        path = self.folder / ANSWER
        while not path.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"instance A exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"instance A not ready after {READY_S} s:\n{self.log_tail()}")
            time.sleep(0.05)
        self.answer = torch.load(path, map_location=scenarios.device(), weights_only=False)
        return self.answer

    def say_done(self) -> None:
        """Tells A's process that B is done, so it shuts down and exits."""
        if self.process.stdin.closed:
            return
        try:
            self.process.stdin.write(b"done\n")
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # already gone

    def stop(self) -> int:
        """Says done and waits for the exit, killing the child after STOP_S; its status."""
        self.say_done()
        try:
            return self.process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"instance A did not exit within {STOP_S} s:\n{self.log_tail()}") from None

    def kill(self) -> None:
        """Ends the child by its PID, now."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=STOP_S)
        if not self.process.stdin.closed:
            self.process.stdin.close()

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.kill()  # the parent failed: nothing is left for A to wait for
            return
        status = self.stop()
        if status != 0:
            raise RuntimeError(f"instance A exited with {status}:\n{self.log_tail()}")


if __name__ == "__main__":
    # Through the package's module, so that what is pickled names `models.peer`, not
    # `__main__`.
    from models.peer import main as run_child

    run_child(sys.argv[1])
