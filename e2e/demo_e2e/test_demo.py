"""`make demo DEMO_FLAGS=--exit` tells the whole story.

The README's first command runs as a subprocess (with `--fast` steps); the demo's last line,
`DEMO_RESULT={json}`, is what it saw: both InferenceServices Ready, SmolLM2's streamed chat
answer, the services `kubectl get fsvc` listed, and, from MiniLM's status, the promoted
version with every canary weight it saw and the rollback's phase and reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 420.0


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_demo_serves_two_models_promotes_then_rolls_back(tmp_path: Path) -> None:
    """Two models serve; MiniLM v2 is promoted step by step and a failing v3 rolled back.

    MiniLM and SmolLM2 are Ready and SmolLM2 streams an answer; v2 goes through
    1 → 5 → 20 → 50 → 100 and is promoted; v3 errs and is rolled back.
    """
    log_path = tmp_path / "demo.log"
    with log_path.open("w") as log:
        demo = subprocess.Popen(
            ["make", "--no-print-directory", "demo", "DEMO_FLAGS=--exit --fast"],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = demo.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # SIGTERM, not SIGKILL, to make and the demo under it: the demo then stops every
            # process it started.
            os.killpg(demo.pid, signal.SIGTERM)
            demo.wait(timeout=60)
            pytest.fail(f"the demo ran over {TIMEOUT_S:.0f}s:\n{log_path.read_text()[-6000:]}")
    output = log_path.read_text()
    assert code == 0, output[-6000:]
    line = next(x for x in reversed(output.splitlines()) if x.startswith("DEMO_RESULT="))
    result = json.loads(line.removeprefix("DEMO_RESULT="))
    assert result["ok"], result
    assert set(result["ready_s"]) == {"minilm", "smollm2"}, result["ready_s"]
    chat = result["chat"]
    # Streamed: the answer came as many deltas, one per token or so, not as one body.
    assert chat["text"].strip(), chat
    assert chat["completion_tokens"] > 1, chat
    assert chat["chunks"] > 1, chat
    assert chat["ttft_ms"] > 0, chat
    assert chat["text"].strip() in output, "the answer was not shown"
    assert sorted(result["fleet"]) == ["minilm", "smollm2"], result["fleet"]
    assert result["promoted_version"] == "2"
    assert result["promotion_weights"] == [1, 5, 20, 50, 100]
    assert result["promotion_analyses"], "no analysis of v2 was seen"
    assert result["promotion_analyses"][-1]["verdict"] == "Passed"
    assert result["rollback_phase"] == "RolledBack"
    assert "error-rate" in result["rollback_reason"], result["rollback_reason"]
    assert any(a["verdict"] == "Failed" for a in result["rollback_analyses"])
    assert 0 < result["time_to_rollback_s"] < 60
    assert "Where to look" in output
    assert "get fsvc" in output
