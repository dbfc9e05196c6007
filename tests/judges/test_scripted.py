import dataclasses
import math

import numpy as np
import pytest

from jaxrace.judges import Pair, ScriptedJudge, TaskScoring, clip_facts
from jaxrace.rewards.api import Action, RaceView
from jaxrace.rewards.clips import Clip
from jaxrace.rewards.synthetic import DEFAULT_VIEW

T = 10


def make_clip(progress=None, rank=None, valid=None, **flags) -> Clip:
    """A hand-made clip of T transitions: views [T + 1] from DEFAULT_VIEW, with the given arrays."""
    values = {k: np.full(T + 1, v) for k, v in DEFAULT_VIEW.items()}
    values["progress"] = np.asarray(progress if progress is not None else np.linspace(0.0, 100.0, T + 1), np.float32)
    values["rank"] = np.asarray(rank if rank is not None else np.full(T + 1, 4), np.int32)
    for name, steps in flags.items():
        values[name] = np.zeros(T + 1, bool)
        values[name][list(steps)] = True
    views = RaceView(**{f.name: values[f.name] for f in dataclasses.fields(RaceView)})
    actions = Action(steering=np.zeros(T, np.float32), throttle_brake=np.ones(T, np.float32))
    return Clip(views=views, actions=actions, valid=np.ones(T, bool) if valid is None else np.asarray(valid))


def test_facts_count_onsets_and_ignore_padding():
    clip = make_clip(rank=[4, 4, 3, 3, 2, 2, 2, 3, 3, 3, 3], hit_other_from_behind=[2, 3, 4, 8],
                     off_course=[0, 1, 5], valid=[True] * 6 + [False] * 4)
    facts = clip_facts(clip)
    # hit_other_from_behind is True at views 2-4 (one onset at transition 1) and 8 (transition 7: padding).
    assert facts.at_fault_contacts == 1
    # off_course True at view 0 already: no onset there; onset at view 5 (transition 4).
    assert facts.course_outs == 1
    assert facts.positions_gained == 2  # 4 -> 2 within the valid steps; the loss after is padding
    assert facts.progress == pytest.approx(60.0)
    assert facts.steps == 6


def test_exact_labels_from_the_task_scoring():
    # the per-step facts alone (the standing at a clip's end: the next test)
    judge = ScriptedJudge(scoring=dataclasses.replace(TaskScoring.from_task("win the race cleanly"), standing=0.0))
    fast = make_clip(progress=np.linspace(0, 200, T + 1))
    slow = make_clip(progress=np.linspace(0, 100, T + 1))
    assert judge.judge(Pair("a", fast, slow)).label == "first"
    assert judge.judge(Pair("b", slow, fast)).label == "second"
    # "cleanly": an at-fault contact costs 3 points, as much as 100 m (1 point) and a place (2 points).
    dirty = make_clip(progress=np.linspace(0, 200, T + 1), rank=[4] * 5 + [3] * 6, hit_other_from_behind=[5])
    steady = make_clip(progress=np.linspace(0, 150, T + 1))
    assert judge.score(dirty) == pytest.approx(2.0 + 2.0 - 3.0)
    assert judge.judge(Pair("t", dirty, slow)).label == "tie"  # 1.0 against 1.0
    verdict = judge.judge(Pair("c", dirty, steady))
    assert verdict.label == "second"
    assert "1 at-fault contacts" in verdict.rationale and "score 1.00" in verdict.rationale
    # Without "clean" in the task the same contact costs 1 point and the pass wins.
    assert ScriptedJudge(scoring=dataclasses.replace(TaskScoring.from_task("win"), standing=0.0)).judge(
        Pair("d", dirty, steady)).label == "first"


def test_standing_at_the_clip_end_counts_for_a_task_about_places():
    # the grid start is P8 (DEFAULT_VIEW); the rank in padding after the episode ended does not count
    ahead = make_clip(rank=[3] * 6 + [1] * 5, valid=[True] * 5 + [False] * 5)
    behind = make_clip(rank=np.full(T + 1, 7))
    assert clip_facts(ahead).standing == 5 and clip_facts(behind).standing == 1
    assert "+5 on the grid at the end" in clip_facts(ahead).describe()
    win = ScriptedJudge(scoring=TaskScoring.from_task("win the race cleanly from the back of the grid"))
    assert win.scoring.standing == 1.0
    # the same 100 m and no events: 5 places up against 1, at a point each
    ahead_full = make_clip(rank=np.full(T + 1, 3))
    assert win.score(ahead_full) - win.score(behind) == pytest.approx(4.0)
    assert win.judge(Pair("p", behind, ahead_full)).label == "second"
    # a task that says nothing of places does not look at them
    fast = ScriptedJudge(scoring=TaskScoring.from_task("drive a fast lap"), equal_within=0.01)
    assert fast.scoring.standing == 0.0
    assert fast.judge(Pair("q", behind, ahead_full)).label == "tie"


def test_a_pass_by_contact_loses_to_staying_behind_cleanly_when_standing_is_read_at_the_start():
    """standing_at="start" (the default): a place gained in the clip counts once (2 points), so under
    "cleanly" the pass that costs a contact (3) loses; read at the end it counts again and ties."""
    task = TaskScoring.from_task("win the race cleanly from the back of the grid")
    assert task.standing_at == "start"
    # from P6 (two places up at the clip's start); the pass to P5 at view 5 comes with a contact
    passed = make_clip(rank=[6] * 5 + [5] * 6, hit_other_from_behind=[5])
    stayed = make_clip(rank=np.full(T + 1, 6))
    assert clip_facts(passed).standing == 3  # what the video's P shows at the end
    start = ScriptedJudge(scoring=task)
    assert start.score(stayed) == pytest.approx(1.0 + 2.0)  # 100 m, two places up
    assert start.score(passed) == pytest.approx(1.0 + 2.0 - 3.0 + 2.0)
    assert start.judge(Pair("s", passed, stayed)).label == "second"
    end = ScriptedJudge(scoring=dataclasses.replace(task, standing_at="end"), equal_within=0.01)
    assert end.score(passed) == pytest.approx(1.0 + 2.0 - 3.0 + 3.0)
    assert end.judge(Pair("e", passed, stayed)).label == "tie"
    with pytest.raises(ValueError, match="'start' or 'end', not 'middle'"):
        ScriptedJudge(scoring=dataclasses.replace(task, standing_at="middle")).score(stayed)


def test_equal_skip_and_myopic_rules():
    a = make_clip(progress=np.linspace(0, 100, T + 1))
    b = make_clip(progress=np.linspace(0, 103, T + 1))
    assert ScriptedJudge(equal_within=0.05).judge(Pair("e", a, b)).label == "tie"
    assert ScriptedJudge(equal_within=0.01).judge(Pair("e", a, b)).label == "second"
    assert ScriptedJudge(skip_below=5.0).judge(Pair("s", a, b)).label == "skip"
    # Myopic: step t of T counts gamma^(T - 1 - t); 10 m per step -> 0.1 point per step.
    gamma = 0.5
    assert ScriptedJudge(myopic=gamma).score(a) == pytest.approx(0.1 * sum(gamma ** i for i in range(T)))


def test_noise_rates_and_determinism_per_pair():
    a = make_clip(progress=np.linspace(0, 100, T + 1))
    b = make_clip(progress=np.linspace(0, 150, T + 1))  # b is 0.5 points better
    keys = [f"pair{i}" for i in range(3000)]
    boltzmann = ScriptedJudge(beta=2.0, seed=1)
    p_second = 1.0 / (1.0 + math.exp(-2.0 * 0.5))
    rate = np.mean([boltzmann.judge(Pair(k, a, b)).label == "second" for k in keys])
    assert abs(rate - p_second) < 0.03
    mistaken = ScriptedJudge(mistake=0.2, seed=2)
    flips = np.mean([mistaken.judge(Pair(k, a, b)).label == "first" for k in keys])
    assert abs(flips - 0.2) < 0.03
    # The same pair key gets the same verdict whatever was judged before it.
    assert [boltzmann.judge(Pair(k, a, b)).label for k in keys[:50]] == \
        [boltzmann.judge(Pair(k, a, b)).label for k in reversed(keys[:50])][::-1]


def test_bad_noise_settings_are_rejected():
    with pytest.raises(ValueError, match="mistake in"):
        ScriptedJudge(mistake=1.5)
    with pytest.raises(ValueError, match="myopic"):
        ScriptedJudge(myopic=0.0)
