"""The engine-agnostic example (examples/engine_loop.py) runs as documented: the second
instance loads the shared system prefix of every request, byte-checked by the example."""

import runpy
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "engine_loop.py"


def test_engine_loop_example_reuses_the_shared_prefix():
    summary = runpy.run_path(str(EXAMPLE), run_name="engine_loop")["main"]()
    assert summary["tokens_loaded"] == {100: 320, 101: 320, 102: 320}
    # 20 full-group blocks and the 4 window-group blocks of the window, per request.
    assert summary["pages_checked"] == 3 * (20 + 4)
    assert summary["pages_loaded"] == [0, 72]
    assert summary["lookups"] == [3, 3]


def test_engine_loop_example_runs_as_a_script():
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "tokens_loaded" in done.stdout
