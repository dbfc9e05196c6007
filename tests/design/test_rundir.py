"""A stage's time over its attempts: a raised attempt, a killed one, and the heartbeat between log lines."""

import json
import signal
import subprocess
import sys
import time

import pytest

from jaxrace.design import RunDir
from jaxrace.design import rundir as rundir_module
from jaxrace.design.rundir import NO_ATTEMPTS, RUNNING

# A stage attempt in a process that is killed (SIGKILL) after it logs, like a user's Ctrl-\ or an OOM kill.
KILLED_ATTEMPT = """
import os, signal, sys, time
from jaxrace.design import RunDir
run = RunDir(sys.argv[1])
with run.attempt("iter1/train", lambda: 0.25):
    run.log("iter1/train: started")
    time.sleep(0.6)
    run.log("iter1/train: epoch 10/20")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_raised_attempt_counts_up_to_the_raise_and_adds_to_the_one_that_finishes(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(RuntimeError, match="judge crashed"), run.attempt("iter1/judge", lambda: 0.5) as earlier:
        assert earlier == NO_ATTEMPTS
        time.sleep(0.3)
        raise RuntimeError("judge crashed")
    with run.attempt("iter1/judge") as earlier:
        pass
    assert earlier["attempts"] == 1 and earlier["compile_seconds"] == 0.5
    assert 0.3 <= earlier["seconds"] < 1.5
    run.mark_done("iter1/judge", 2.0, compile_seconds=1.0, earlier=earlier)
    info = run.stages()["iter1/judge"]
    assert info["attempts"] == 2 and info["last_attempt_seconds"] == 2.0
    assert info["seconds"] == round(2.0 + earlier["seconds"], 3) and info["compile_seconds"] == 1.5
    assert json.loads((tmp_path / RUNNING).read_text()) == {}  # nothing under way once it is done
    run.mark_done("report", 1.0)  # a stage marked without an attempt: one attempt of its seconds
    assert run.stages()["report"]["attempts"] == 1 and run.stages()["report"]["seconds"] == 1.0


def test_a_killed_attempt_counts_up_to_its_last_log_line(tmp_path):
    out = subprocess.run([sys.executable, "-c", KILLED_ATTEMPT, str(tmp_path)], capture_output=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr.decode()[-2000:]
    run = RunDir(tmp_path)
    stopped = run.unfinished()["iter1/train"]  # what the report shows before a resume
    assert stopped["attempts"] == 1 and stopped["compile_seconds"] == 0.25 and 0.6 <= stopped["seconds"] < 5.0
    with run.attempt("iter1/train") as earlier:
        pass
    assert earlier == {k: stopped[k] for k in earlier}
    assert 0.6 <= earlier["seconds"] < 5.0  # the sleep between the two lines, without the heartbeat's 10 s
    # another stage's record is its own
    with run.attempt("iter1/race") as other:
        pass
    assert other == NO_ATTEMPTS


def test_the_heartbeat_keeps_a_quiet_attempt_alive(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir_module, "HEARTBEAT_S", 0.05)
    run = RunDir(tmp_path)
    with run.attempt("final/train"):
        time.sleep(0.4)  # logs nothing
        current = json.loads((tmp_path / RUNNING).read_text())["final/train"]["current"]
    assert current["alive"] - current["started"] >= 0.25


def test_a_finished_stage_redone_starts_afresh_and_a_broken_record_fails_nothing(tmp_path):
    run = RunDir(tmp_path)
    with run.attempt("report") as earlier:
        time.sleep(0.2)
    # killed after the stage was marked finished, before its record was dropped: the record is stale
    stale = (tmp_path / RUNNING).read_text()
    run.mark_done("report", 0.2, earlier=earlier)
    (tmp_path / RUNNING).write_text(stale)
    assert run.unfinished() == {}
    with run.attempt("report") as earlier:
        assert earlier == NO_ATTEMPTS
    (tmp_path / RUNNING).write_text('{"iter1/train": {"earl')  # not JSON: only the record is lost
    with run.attempt("iter1/train") as earlier:
        run.log("iter1/train: started")
    assert earlier == NO_ATTEMPTS and "iter1/train" in json.loads((tmp_path / RUNNING).read_text())
