"""Choosing checkpoints by racing: the score and the targets (exact values)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxrace.agents.evaluation import mean_action_change
from jaxrace.agents.selection import Assessment, KeepBest, Targets, racing_score


def assessment(**fields):
    base = dict(lap=80.0, lap_gap=3.0, lap_outs=0, positions=(1, 2, 3, 4), at_fault=4, course_outs=2)
    return Assessment(**{**base, **fields})


def test_the_score_adds_position_contacts_course_outs_and_the_time_trial():
    # mean position 2.5, 1 at-fault contact and 0.5 course-outs per race, a clean lap within 5%
    assert racing_score(assessment()) == pytest.approx(2.5 + 1.0 + 0.5)
    # beyond the targets (2 and 1 per race) the excess counts three times more
    assert racing_score(assessment(at_fault=12, course_outs=8)) == pytest.approx(2.5 + 3 + 2 + 3 * (1 + 1))
    # the lap: a fifth per % beyond 5 and one per course-out; 10 with no full lap; 1 more for the miss
    assert racing_score(assessment(lap_gap=10.0, lap_outs=2)) == pytest.approx(4.0 + 1.0 + 2.0 + 1.0)
    assert racing_score(assessment(lap=None, lap_gap=None)) == pytest.approx(4.0 + 10.0 + 1.0)
    # stricter targets move the excess
    assert racing_score(assessment(), Targets(max_at_fault=0.5)) == pytest.approx(4.0 + 3 * 0.5)


def test_a_missed_lap_target_costs_lap_miss_more():
    # 0.04 points beyond 5% cost 0.008 alone (lap_miss=0, as scores before 2026-11-30); the miss itself 1
    assert racing_score(assessment(lap_gap=5.04), lap_miss=0.0) == pytest.approx(4.0 + 0.008)
    assert racing_score(assessment(lap_gap=5.04)) == pytest.approx(4.0 + 0.008 + 1.0)
    assert racing_score(assessment(lap_gap=5.04), lap_miss=2.5) == pytest.approx(4.0 + 0.008 + 2.5)
    # a lap within 5% with a course-out misses it too; no full lap misses it
    assert racing_score(assessment(lap_outs=1), lap_miss=1.0) == pytest.approx(4.0 + 1.0 + 1.0)
    assert racing_score(assessment(lap=None, lap_gap=None), lap_miss=1.0) == pytest.approx(4.0 + 10.0 + 1.0)
    # a met target costs nothing, and the step follows the targets given
    assert racing_score(assessment(lap_gap=5.0), lap_miss=1.0) == pytest.approx(4.0)
    assert racing_score(assessment(), Targets(max_lap_gap=2.0), lap_miss=1.0) == pytest.approx(4.0 + 0.2 + 1.0)



@pytest.mark.parametrize("cost", [-1.0, float("nan")])
def test_a_negative_or_nan_lap_miss_is_refused(cost):
    with pytest.raises(ValueError, match="lap_miss must be a cost >= 0"):
        racing_score(assessment(lap_gap=5.04), lap_miss=cost)


def test_train_reference_refuses_a_negative_lap_miss_before_it_trains():
    script = Path(__file__).resolve().parents[2] / "experiments" / "train_reference.py"
    done = subprocess.run([sys.executable, str(script), "--lap-miss", "-0.5"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--lap-miss is a cost and must be >= 0" in done.stderr and "-0.5" in done.stderr

def test_targets_met_or_not():
    assert assessment().met() == {"lap": True, "position": True, "at_fault": True, "course_outs": True}
    met = assessment(lap_outs=1, positions=(1, 4, 5, 8), at_fault=9, course_outs=4).met()
    assert met == {"lap": False, "position": False, "at_fault": False, "course_outs": True}
    assert not assessment(lap=None, lap_gap=None).met()["lap"]


def test_keep_best_refuses_a_bad_interval():
    with pytest.raises(ValueError, match="every must be at least 1"):
        KeepBest(lambda epoch, actors: np.zeros(1), every=0)
    with pytest.raises(ValueError, match="average must be at least 1"):
        KeepBest(lambda epoch, actors: np.zeros(1), average=0)


def test_keep_best_judges_and_keeps_the_average_of_the_last_actors():
    """KeepBest(average=3): each judgement sees the mean of the last 3 actors handed to it at a
    judgement (fewer at first), keeps that mean, and a job resumed from `saved()` averages on."""
    judged = []

    def score(epoch, actors):  # run 0: the later the better; run 1: the first judgement stays best
        judged.append(np.asarray(actors["w"]))
        return np.array([-epoch, epoch], np.float32)

    def actors(epoch):  # two runs; run 1's values ten times run 0's
        return {"w": np.array([[epoch, 2.0 * epoch], [10.0 * epoch, 20.0 * epoch]], np.float32)}

    keep = KeepBest(score, every=2, average=3)
    keep.start(actors(0), updates=10)
    for epoch in range(1, 7):
        keep.update(epoch, actors(epoch))
    # judged at epochs 2, 4, 6: the means of (2), (2, 4), (2, 4, 6); the odd epochs are never seen
    np.testing.assert_array_equal([j[0, 0] for j in judged], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(judged[-1][1], [40.0, 80.0])
    np.testing.assert_array_equal(keep.actor["w"], [[4.0, 8.0], [20.0, 40.0]])  # run 0 the last, run 1 the first
    assert keep.epoch.tolist() == [6, 2]
    saved = keep.saved()
    for epoch in range(7, 11):
        keep.update(epoch, actors(epoch))
    np.testing.assert_array_equal([j[0, 0] for j in judged[3:]], [6.0, 8.0])  # (4, 6, 8), (6, 8, 10)
    resumed = KeepBest(score, every=2, average=3)
    resumed.start(actors(0), updates=10)
    resumed.load(saved)
    for epoch in range(7, 11):
        resumed.update(epoch, actors(epoch))
    np.testing.assert_array_equal([j[0, 0] for j in judged[5:]], [6.0, 8.0])
    np.testing.assert_array_equal(resumed.actor["w"], keep.actor["w"])
    assert resumed.epoch.tolist() == keep.epoch.tolist() == [10, 2]


def test_the_action_change_counts_only_steps_before_the_finish():
    """Mean squared change per step of (steering, throttle_brake); a race's steps after the ego
    car's finish do not count, and a race with no two actions before it gives None."""
    actions = np.asarray([[[0.0, 1.0], [0.5, 1.0], [0.5, -1.0], [-1.0, -1.0]],
                          [[0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]], np.float32)
    finished = np.asarray([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], bool)  # race 0 finishes after its third action
    # race 0: changes (0.5, 0), (0, -2); race 1: (1, 0), (0, 0), (0, 0)
    assert mean_action_change(actions, finished) == pytest.approx(((0.25 + 0 + 1) / 5, (0 + 4 + 0) / 5))
    assert mean_action_change(actions[:1, :2], np.ones((1, 3), bool)) is None
