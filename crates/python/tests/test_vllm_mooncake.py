"""Two vLLM engines in two processes share one pool through a real `mooncake_master` on
loopback (each engine its own Mooncake client): process A serves a conversation's first
turn, process B the second turn, which parks while it loads A's prefix and resumes
bit-exact. Each process drives vLLM's real Scheduler with the tiny GPT-OSS model."""

import json
import subprocess
import sys
from pathlib import Path

from api_support import PATIENCE_S, import_vllm, mooncake_master, needs_mooncake  # noqa: F401 (fixture)

import_vllm()

pytestmark = needs_mooncake

HERE = Path(__file__).parent

ENGINE = r"""
import json, sys, tempfile
sys.path.insert(0, sys.argv[1])
import torch
import vllm_support as vs
from models import scenarios, tiny

config, turn, prompt = json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
spec = tiny.SPECS["gpt-oss"]
model = tiny.build_model(spec)
engine = vs.VllmInstance(spec, model, vs.write_model_dir(spec, tempfile.mkdtemp()), extra={"kvc": config, "model_key": "tiny-gpt-oss"})
s = engine.serve(f"turn{turn}", prompt)
engine.conn.settle_saves()
chunks = vs.baseline_chunks(len(s.tokens), s.start, s.chunks, scenarios.CHUNK)
rows, generated = vs.native_rows(model, s.tokens, chunks, scenarios.DECODE)
stats = engine.conn.stats()
print(json.dumps({"start": s.start, "parked": s.parked, "generated": s.generated,
                  "exact": torch.equal(s.logits, rows[s.start:]) and generated == s.generated,
                  "loads": stats["loads"], "saves": stats["saves"]}), flush=True)
# A Mooncake client's segment holds the objects it stored: the engine stays up until
# told to stop, so the other process can load them.
sys.stdin.readline()
engine.close()
"""


class EngineProcess:
    """One engine in its own interpreter; `result` is what it served."""

    def __init__(self, config: dict, turn: int, prompt: list[int], log: Path):
        self.log = log
        with open(log, "w") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-c", ENGINE, str(HERE), json.dumps(config), str(turn), json.dumps(prompt)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sink, text=True,
            )
        line = self.process.stdout.readline()
        assert line, f"the engine process ended early; see {log}: {log.read_text()[-3000:]}"
        self.result = json.loads(line)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write("stop\n")
            self.process.stdin.flush()
        assert self.process.wait(timeout=PATIENCE_S) == 0, self.log.read_text()[-3000:]


def test_two_engine_processes_share_a_prefix_through_mooncake(mooncake_master, tmp_path):  # noqa: F811 (fixture)
    from models import scenarios

    config = {**mooncake_master.config(), "planner": {"swa_endpoint_rewind_tokens": scenarios.REWIND}}
    prompt = scenarios.random_tokens(1, scenarios.FIRST_TURN_TOKENS)
    a = EngineProcess(config, 1, prompt, tmp_path / "a.log")
    try:
        first = a.result
        second_prompt = prompt + first["generated"][: scenarios.DECODE] + scenarios.random_tokens(101, scenarios.USER_TOKENS)
        b = EngineProcess(config, 2, second_prompt, tmp_path / "b.log")
        b.stop()
    finally:
        a.stop()
    second = b.result
    assert first["start"] == 0 and not first["parked"] and first["exact"]
    assert first["saves"]["saves_done"] > 0 and first["saves"]["saves_failed"] == 0, first["saves"]
    assert second["parked"] and second["start"] == 160, second
    assert second["exact"], "the logits after the load equal the no-reuse baseline bit for bit"
    assert second["loads"]["loads_done"] == 1 and second["loads"]["loads_failed"] == 0
    # 10 full-attention pages and the 2 window pages of the window of 160 (W = 32).
    assert second["loads"]["pages_loaded"] == 12
