"""An iteration in which every candidate fails in training: the loop goes on, the best stays, the final adapts."""

import json

import pytest

from jaxrace.design.config import LIBRARY_BASELINES, load_config
from jaxrace.design.loop import Loop, parent_runs
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir
from jaxrace.rewards import library_reward

RACE = {"best_lap": None, "finishing_position": 4, "positions_gained": 0, "collisions_at_fault": 0,
        "side_contacts": 0, "course_outs": 3, "wall_hits": 1, "finished": False}


def write_failed_iteration(run: RunDir, k: int, names: list[str]) -> None:
    for n in names:
        run.write_text(f"iter{k}/candidates/{n}.py", f"# {n}\ndef reward(prev, action, curr):\n    return curr.speed\n")
    run.write_json(f"iter{k}/select.json", {"selected": names, "reason": "all", "labelled_preferences": 0,
                                            "tac": None})
    run.write_json(f"iter{k}/train/curves.json", {
        "runs": [{"candidate": n, "seed": 0, "failed": True} for n in names], "epochs": 2,
        "reward": [[0.1, float("nan")] for _ in names], "progress": [[0.5, float("nan")] for _ in names]})
    run.write_json(f"iter{k}/race/metrics.json", {"runs": [], "races": [[RACE] for _ in names],
                                                  "reference_lap": 30.0})
    run.write_json(f"iter{k}/race/components.json", [])
    run.write_json(f"iter{k}/candidates.json", [{"name": n, "origin": "offline", "components": ["speed"],
                                                 "params": {}} for n in names])
    run.write_json(f"iter{k}/attempts.json", {"attempts": [], "tokens": 0, "stopped": None})


def test_every_candidate_failing_keeps_the_previous_best_and_says_so(tmp_path):
    config = load_config("quick", bootstrap_races=0)
    run = RunDir.open(tmp_path / "run", config)
    loop = Loop(config, run, Display(quiet=True))
    write_failed_iteration(run, 1, ["i1-c1", "i1-c2"])
    loop.rank(1)
    rank = run.read_json("iter1/rank.json")
    assert rank["best"] is None and rank["parents"] == [] and rank["order"] == ["i1-c1", "i1-c2"]
    assert loop._best(1) is None
    feedback = run.file("iter1/feedback.txt").read_text()
    assert "1. i1-c1: strength +0.00 +- 1.00; FAILED in training" in feedback
    assert "Every candidate failed in training" in feedback and "### The first failed program: i1-c1" in feedback
    assert "The best program" not in feedback
    assert "every candidate failed in training" in run.file("log.txt").read_text()

    # iteration 2 with a best, then iteration 3 where all fail again: the best of iteration 2 stays
    write_failed_iteration(run, 2, ["i2-c1"])
    curves = run.read_json("iter2/train/curves.json")
    curves["runs"][0]["failed"] = False
    curves["reward"], curves["progress"] = [[0.1, 0.2]], [[0.5, 0.6]]
    run.write_json("iter2/train/curves.json", curves)
    loop.rank(2)
    assert loop._best(2) == ("i2-c1", "iter2/candidates")
    write_failed_iteration(run, 3, ["i3-c1", "i3-c2"])
    loop.rank(3)
    assert json.loads(run.file("iter3/rank.json").read_text())["best_folder"] == "iter2/candidates"
    assert loop._best(3) == ("i2-c1", "iter2/candidates")
    # warm_start's parent: the best agent trained before an iteration, past iterations where all failed
    assert (loop._parent(2), loop._parent(3), loop._parent(4)) == (None, (2, "i2-c1"), (2, "i2-c1"))
    from jaxrace.design.report import _iteration

    section, _ = _iteration(run, 3, None)
    assert ("Every candidate of this iteration failed in training: the best agent is still i2-c1, from "
            "iter2/candidates.") in section
    assert 'class="best"' not in section and "The best agent" not in section

    # the final stage: the winner (from iteration 2's folder) and the library rewards; none when nothing trained
    final_config = load_config("quick", bootstrap_races=0, iterations=3)
    final_run = RunDir(run.path)
    final = Loop(final_config, final_run, Display(quiet=True))
    assert final._runs("final") == (["i2-c1", *LIBRARY_BASELINES], "final/candidates")
    library_reward("progress").save(run.file("iter2/candidates/i2-c1.jaxreward"))  # as the sandbox writes it
    final._prepare_final()
    assert final_run.file("final/candidates/i2-c1.py").read_text().startswith("# i2-c1")
    only_first = Loop(load_config("quick", bootstrap_races=0, iterations=1), RunDir(run.path), Display(quiet=True))
    assert only_first._runs("final") == (list(LIBRARY_BASELINES), "final/candidates")


def test_an_iteration_where_nothing_trains_is_retried_once_not_counted(tmp_path, monkeypatch):
    import jaxrace.design.report

    calls = []

    class Scripted(Loop):
        """The stages replaced by records of their calls; iterations in `failing` train nothing."""

        failing = {1, 2, 3}

        def generate(self, k):
            calls.append(f"generate{k}")

        def select(self, k):
            pass

        def train(self, k):
            calls.append(f"train{k}")

        def race(self, k):
            pass

        def time_trial(self):
            pass

        def judge_pairs(self, k):
            pass

        def rank(self, k):
            self.run.write_json(f"iter{k}/rank.json", {"parents": [] if k in self.failing else ["x"],
                                                       "best": None if k in self.failing else "x"})

        def tune(self, k):
            calls.append(f"tune{k}")

    monkeypatch.setattr(jaxrace.design.report, "write_report", lambda run: run.file("report.html"))
    config = load_config("quick", bootstrap_races=0, iterations=2, tune_weights="grad")
    loop = Scripted(config, RunDir.open(tmp_path / "a", config), Display(quiet=True))
    loop.failing = {1}
    loop.run_all()
    # iteration 1 failed: it is run again as iteration 2, and the run still has 2 counted iterations
    assert calls == ["generate1", "train1", "tune1", "generate2", "train2", "tune2", "generate3", "train3",
                     "trainfinal"]
    assert loop.last_iteration == 3
    assert "iter1: every candidate failed in training; iteration 2 retries it" in loop.run.file("log.txt").read_text()
    calls.clear()
    again = Scripted(config, RunDir.open(tmp_path / "a", config), Display(quiet=True))
    again.failing = {1}
    again.run_all()  # resumed: every stage finished, the same iterations, nothing redone
    assert calls == [] and again.last_iteration == 3

    calls.clear()
    stubborn = Scripted(config, RunDir.open(tmp_path / "b", config), Display(quiet=True))
    stubborn.run_all()  # every iteration fails: one retry only, then the run ends
    assert [c for c in calls if c.startswith("generate")] == ["generate1", "generate2", "generate3"]

    # ... and with no library reward in the final job there is nothing to train: no final job, the report says so
    from jaxrace.design.loop import NOTHING_TO_TRAIN
    from jaxrace.design.report import _final

    calls.clear()
    alone = load_config("quick", bootstrap_races=0, iterations=2, final_baselines=[])
    empty = Scripted(alone, RunDir.open(tmp_path / "c", alone), Display(quiet=True))
    empty.run_all()
    assert calls == ["generate1", "train1", "generate2", "train2", "generate3", "train3"]
    assert f"final: {NOTHING_TO_TRAIN}" in empty.run.file("log.txt").read_text()
    assert NOTHING_TO_TRAIN in _final(empty.run) and NOTHING_TO_TRAIN not in _final(stubborn.run)


def test_warm_started_runs_take_the_parent_run_of_their_seed_or_its_first_that_trained():
    trained = [{"candidate": "a", "seed": 0, "failed": False}, {"candidate": "a", "seed": 1, "failed": False},
               {"candidate": "b", "seed": 0, "failed": True}, {"candidate": "b", "seed": 1, "failed": False},
               {"candidate": "b", "seed": 2, "failed": False}]
    assert parent_runs(trained, "b", runs=6, seeds=3) == [3, 3, 4, 3, 3, 4]  # seed 0 failed: b's first that trained
    assert parent_runs(trained, "a", runs=4, seeds=2) == [0, 1, 0, 1]
    assert parent_runs(trained, "a", runs=3, seeds=3) == [0, 1, 0]  # no seed-2 run: a's first
    with pytest.raises(ValueError, match="c has no run that trained"):
        parent_runs(trained, "c", runs=1, seeds=1)
