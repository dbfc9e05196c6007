"""Exact values of the library rewards on hand-built RaceViews."""

import numpy as np
import pytest

from jaxrace.rewards import NO_GAP, library_reward
from jaxrace.rewards.synthetic import action, view


def test_progress_is_metres_along_the_centre_line():
    r = library_reward("progress")
    total, comps = r(view(progress=100.0), action(), view(progress=104.25))
    assert float(total) == pytest.approx(4.25) and float(comps["progress"]) == pytest.approx(4.25)
    total, _ = r(view(progress=100.0), action(), view(progress=98.0))
    assert float(total) == pytest.approx(-2.0)


def gt_sophy(prev, curr, **params):
    total, comps = library_reward("gt_sophy")(prev, action(), curr, params or None)
    return float(total), {k: float(v) for k, v in comps.items()}


def test_gt_sophy_clean_driving_is_progress_only():
    total, comps = gt_sophy(view(progress=100.0), view(progress=104.0, tyre_slip=0.1))
    assert total == pytest.approx(4.0)
    assert comps["progress"] == pytest.approx(4.0)
    assert all(v == 0.0 for k, v in comps.items() if k != "progress")


def test_gt_sophy_penalties_have_their_documented_sizes():
    prev = view(progress=100.0)
    curr = view(progress=102.0, speed=30.0, off_course=True, wall_contact=True, tyre_slip=0.33)
    total, comps = gt_sophy(prev, curr)
    assert comps["off_course"] == pytest.approx(-1.5 * 30.0 * 0.1)
    assert comps["wall"] == pytest.approx(-1.0 * 9.0)
    assert comps["slip"] == pytest.approx(-10.0 * 0.2, rel=1e-5)
    assert total == pytest.approx(2.0 - 4.5 - 9.0 - 2.0, rel=1e-5)


def test_gt_sophy_collisions_weigh_more_when_we_hit_from_behind():
    _, side = gt_sophy(view(), view(progress=100.0, side_contact=True))
    _, ours = gt_sophy(view(), view(progress=100.0, hit_other_from_behind=True))
    _, theirs = gt_sophy(view(), view(progress=100.0, hit_from_behind=True))
    assert side["collision"] == theirs["collision"] == pytest.approx(-10.0)
    assert side["rear_end"] == theirs["rear_end"] == 0.0
    assert ours["collision"] + ours["rear_end"] == pytest.approx(-110.0)


def test_gt_sophy_a_place_taken_by_running_into_a_cars_back_does_not_pay():
    total, comps = gt_sophy(view(rank=5, progress=100.0), view(rank=4, progress=104.0, hit_other_from_behind=True))
    assert comps["passing"] == pytest.approx(5.0)
    assert total == pytest.approx(4.0 + 5.0 - 110.0)


def test_gt_sophy_passing_pays_positions_and_closing_on_the_car_ahead():
    _, passed = gt_sophy(view(rank=5, gap_ahead=2.0), view(rank=4, gap_ahead=30.0))
    assert passed["passing"] == pytest.approx(5.0)  # gap terms ignored: a different car is ahead now
    _, closing = gt_sophy(view(rank=4, gap_ahead=20.0), view(rank=4, gap_ahead=17.5))
    assert closing["passing"] == pytest.approx(0.2 * 2.5)
    _, alone = gt_sophy(view(rank=1, gap_ahead=NO_GAP), view(rank=1, gap_ahead=NO_GAP))
    assert alone["passing"] == 0.0
    _, lost = gt_sophy(view(rank=4), view(rank=5))
    assert lost["passing"] == pytest.approx(-5.0)


def test_gt_sophy_near_miss_is_off_by_default_and_grows_as_the_lane_gap_closes():
    _, off = gt_sophy(view(), view(lane_gap_ahead=0.0))
    assert off["near_miss"] == 0.0
    # At 30 m/s the term starts at 0.3 s x 30 m/s + 1 m = 10 m of clear space ahead in our lane.
    near = [gt_sophy(view(), view(speed=30.0, lane_gap_ahead=g), w_near=4.0)[1]["near_miss"]
            for g in (NO_GAP, 12.0, 10.0, 7.5, 2.5, 0.0)]
    assert near == pytest.approx([0.0, 0.0, 0.0, -1.0, -3.0, -4.0])


def test_gt_sophy_push_charges_throttle_into_a_cars_back_and_the_step_after():
    def push(prev, curr, pedal, **params):
        _, comps = library_reward("gt_sophy")(prev, action(throttle_brake=pedal), curr, params or None)
        return float(comps["push"])

    hit, clear = view(hit_other_from_behind=True), view()
    assert push(clear, hit, 1.0) == 0.0  # off by default
    assert push(clear, hit, 0.5, w_push=20.0) == pytest.approx(-10.0)
    assert push(hit, clear, 1.0, w_push=20.0) == pytest.approx(-20.0)  # the step after the contact
    assert push(hit, hit, -1.0, w_push=20.0) == 0.0  # braking is never charged
    assert push(clear, clear, 1.0, w_push=20.0) == 0.0
    assert push(clear, view(hit_from_behind=True, side_contact=True), 1.0, w_push=20.0) == 0.0  # not our fault


def test_gt_sophy_weights_are_tunable_params():
    total, comps = gt_sophy(view(progress=0.0), view(progress=3.0, wall_contact=True, speed=20.0), w_wall=0.5,
                            w_progress=2.0)
    assert comps["wall"] == pytest.approx(-0.5 * 4.0)
    assert total == pytest.approx(6.0 - 2.0)
    np.testing.assert_equal(library_reward("gt_sophy").param_names[0], "w_progress")


def test_unknown_library_reward_is_a_clear_error():
    with pytest.raises(KeyError, match="gt_sophy"):
        library_reward("sophy")
