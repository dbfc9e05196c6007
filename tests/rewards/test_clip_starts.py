"""Where clips are cut: the race start, then the busiest moments, the same for every run of a race."""

import jax
import numpy as np
import pytest

from jaxrace.rewards import synthetic
from jaxrace.rewards.clips import finish_window_end, interesting_starts, race_events


def test_the_start_then_the_busiest_windows_that_do_not_overlap():
    events = np.zeros(100, np.float32)
    events[[40, 42, 44]] = 1.0  # a busy moment
    events[80] = 2.0  # a contact and a place lost at once
    assert interesting_starts(events, 10, 3) == [0, 35, 71]  # the earliest of the windows with all three
    assert interesting_starts(events, 10, 2) == [0, 35]
    # a quiet race: spread evenly, as before there were events
    assert interesting_starts(np.zeros(100), 10, 3) == [0, 45, 90]
    # one busy moment, then evenly spread for the rest
    one = np.zeros(100)
    one[50] = 1.0
    assert interesting_starts(one, 10, 3) == [0, 41, 90]
    # events inside the start's window are already covered by it
    early = np.zeros(100)
    early[3] = 5.0
    assert interesting_starts(early, 10, 2) == [0, 90]
    assert interesting_starts(np.zeros(10), 10, 2) == [0, 0]  # no room: the one window twice
    with pytest.raises(ValueError, match="does not fit a race of 10"):
        interesting_starts(np.zeros(10), 11, 1)


def test_the_finish_window_is_the_second_clip_and_the_busiest_fill_the_rest():
    events = np.zeros(100, np.float32)
    events[[40, 42, 44]] = 1.0
    events[80] = 2.0
    # the finish clip ends at step 97: start 87; the busiest window left is the one at 35
    assert interesting_starts(events, 10, 3, finish_end=97) == [0, 35, 87]
    assert interesting_starts(events, 10, 2, finish_end=97) == [0, 87]
    assert interesting_starts(events, 10, 1, finish_end=97) == [0]  # the start comes first
    assert interesting_starts(events, 10, 2, finish_end=5) == [0, 0]  # clamped into the race


def test_the_finish_window_ends_past_the_first_finish_of_any_run():
    finished = np.zeros((3, 101), bool)
    assert finish_window_end(finished, 20) == 100  # nobody finished: the race's end
    finished[1, 70:] = True  # run 1 crossed the line at transition 69 (view 70)
    finished[2, 60:] = True  # run 2 before it
    assert finish_window_end(finished, 20) == 80
    assert finish_window_end(finished, 50) == 100  # not past the race's end


def test_events_count_place_changes_and_onsets_while_racing():
    view = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (7,)).copy(), synthetic.view())
    view = view.replace(rank=np.array([3, 3, 2, 2, 2, 1, 1]),
                        side_contact=np.array([0, 1, 1, 0, 0, 0, 1], bool),
                        off_course=np.array([0, 0, 0, 1, 1, 1, 1], bool),
                        hit_other_from_behind=np.zeros(7, bool), hit_from_behind=np.zeros(7, bool),
                        wall_contact=np.zeros(7, bool),
                        finished=np.array([0, 0, 0, 0, 0, 1, 1], bool))
    # steps: 0 contact on; 1 place gained; 2 course-out on; 3 -; 4 place gained; 5 contact after the finish
    np.testing.assert_array_equal(race_events(view), [1, 1, 1, 0, 1, 0])
