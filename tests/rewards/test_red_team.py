"""Red team: hostile reward programs are refused or have no effect on the caller.

Every attack runs in a child process (`red_team.py`), so an attack that worked could
not harm this test process; the child checks the caller's invariants after each one.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from red_team import ATTACKS

RUNNER = Path(__file__).with_name("red_team.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{attack: result} from child processes; a child that dies is blamed on its attack, then replaced."""
    dump = tmp_path_factory.mktemp("dump")
    pending, results = list(ATTACKS), {}
    while pending:
        proc = subprocess.run([sys.executable, str(RUNNER), str(dump), *pending], capture_output=True, text=True,
                              timeout=900, cwd=RUNNER.parent)
        started = None
        for line in proc.stdout.splitlines():
            message = json.loads(line)
            if "start" in message:
                started = message["start"]
            else:
                results[message["name"]] = message
                pending.remove(message["name"])
        if started is not None and started in pending:  # the child died during this attack
            results[started] = {"outcome": "killed the caller", "message": proc.stderr[-500:], "problems": []}
            pending.remove(started)
        elif pending:
            pytest.fail(f"the red-team runner failed before any attack: {proc.stderr[-1000:]}")
    return results


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_refused_or_harmless(name, results):
    result = results[name]
    assert result["problems"] == [], result
    expected = ATTACKS[name][1]
    if expected == "harmless":
        assert result["outcome"] == "compiled", result
        return
    _, stage, fragment = expected.split(":", 2)
    assert result["outcome"] == "refused", result
    assert result["stage"] == stage, result
    assert fragment in result["message"], result
    assert len(result["message"]) < 400, result
