"""A synthetic batch of transitions that exercises a reward's edge cases.

The compiler runs every program on it (stage 4 and 5); each transition carries the name
of the case it belongs to so that a non-finite result can be reported as "inf when the
car is at rest" rather than "inf at index 3".
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxrace.rewards.api import NO_GAP, Action, RaceView, field_dtypes

DEFAULT_VIEW = dict(  # an ordinary mid-race state: the one home of RaceView defaults
    progress=1234.5, lap_progress=0.3, speed=45.0, longitudinal_accel=2.0, lateral_accel=5.0,
    lateral_offset=1.0, edge_margin=4.0, heading_error=0.05, off_course=False, on_kerb=False,
    wall_contact=False, tyre_slip=0.05, hit_from_behind=False, hit_other_from_behind=False, side_contact=False,
    rank=4, start_rank=8, num_cars=8, gap_ahead=12.0, gap_behind=20.0, lane_gap_ahead=7.4, laps=1, lap_time=30.0,
    last_lap_time=95.0, time=125.0, finished=False, reference_speed=55.0,
)
_PREV_DELTA = dict(progress=-4.5, lap_progress=-0.001, lap_time=-0.1, time=-0.1, gap_ahead=0.3, gap_behind=-0.2,
                   lane_gap_ahead=0.3)

# (case, changes to prev, changes to curr, action (steering, throttle_brake))
_CASES = (
    ("mid-race, driving normally", {}, {}, (0.1, 0.8)),
    ("a car at rest on the grid (speed 0, progress < 0, time 0, laps 0, last_lap_time 0)",
     dict(progress=-20.0, speed=0.0, time=0.0, lap_time=0.0, laps=0, last_lap_time=0.0, lap_progress=0.99),
     dict(progress=-20.0, speed=0.0, time=0.0, lap_time=0.0, laps=0, last_lap_time=0.0, lap_progress=0.99,
          longitudinal_accel=0.0, lateral_accel=0.0, tyre_slip=0.0), (0.0, 0.0)),
    ("before the first lap is done (laps 0, last_lap_time 0)",
     dict(laps=0, last_lap_time=0.0), dict(laps=0, last_lap_time=0.0), (0.0, 1.0)),
    ("no car ahead or behind (gap_ahead = gap_behind = lane_gap_ahead = NO_GAP, rank 1, num_cars 1)",
     dict(gap_ahead=NO_GAP, gap_behind=NO_GAP, lane_gap_ahead=NO_GAP, rank=1, start_rank=1, num_cars=1),
     dict(gap_ahead=NO_GAP, gap_behind=NO_GAP, lane_gap_ahead=NO_GAP, rank=1, start_rank=1, num_cars=1), (0.0, 1.0)),
    ("leading with cars behind (rank 1, gap_ahead = lane_gap_ahead = NO_GAP)",
     dict(rank=1, gap_ahead=NO_GAP, lane_gap_ahead=NO_GAP), dict(rank=1, gap_ahead=NO_GAP, lane_gap_ahead=NO_GAP),
     (-0.2, 1.0)),
    ("a car comes into our lane close ahead (lane_gap_ahead NO_GAP -> 1 m)",
     dict(lane_gap_ahead=NO_GAP), dict(lane_gap_ahead=1.0), (0.0, -0.5)),
    ("last place (rank = num_cars, gap_behind = NO_GAP)",
     dict(rank=8, gap_behind=NO_GAP), dict(rank=8, gap_behind=NO_GAP), (0.2, 1.0)),
    ("an overtake during the step (rank 5 -> 4)", dict(rank=5, gap_ahead=1.0), dict(rank=4, gap_ahead=30.0),
     (0.0, 1.0)),
    ("overtaken during the step (rank 4 -> 5)", dict(rank=4), dict(rank=5), (0.0, -0.5)),
    ("off course, on a kerb, against a wall and sliding",
     {}, dict(off_course=True, on_kerb=True, wall_contact=True, edge_margin=-3.0, lateral_offset=9.0,
              tyre_slip=0.9, heading_error=1.2, speed=20.0), (1.0, -1.0)),
    ("collisions (hit from behind, hit another from behind, side contact)",
     {}, dict(hit_from_behind=True, hit_other_from_behind=True, side_contact=True, gap_ahead=0.0,
              lane_gap_ahead=0.0), (-1.0, 1.0)),
    ("a lap completed during the step (laps 1 -> 2, lap_time resets)",
     dict(laps=1, lap_progress=0.999, lap_time=96.0), dict(laps=2, lap_progress=0.002, lap_time=0.05,
                                                           last_lap_time=96.05), (0.0, 1.0)),
    ("the race finished during the step", dict(finished=False), dict(finished=True, laps=3), (0.0, 0.0)),
    ("driving backwards (progress falls, heading_error = pi)",
     dict(progress=1240.0), dict(progress=1238.0, heading_error=float(np.pi), speed=20.0), (0.0, 0.5)),
    ("zero gaps (cars level, gap_ahead = gap_behind = lane_gap_ahead = 0)",
     dict(gap_ahead=0.0, gap_behind=0.0, lane_gap_ahead=0.0), dict(gap_ahead=0.0, gap_behind=0.0, lane_gap_ahead=0.0),
     (0.0, 1.0)),
)
NUM_RANDOM = 50

# Cases at and beyond the documented range of every field. A reward must stay finite on
# them (arcsin(lateral_accel / 25), sqrt(reference_speed - 20), log(edge_margin + 7),
# exp(speed) and float16 arithmetic do not); their magnitude is not checked.
_EXTREME_CASES = (
    ("very fast with extreme accelerations (speed 150 m/s, lateral_accel 60, longitudinal_accel -60)",
     dict(speed=140.0), dict(speed=150.0, lateral_accel=60.0, longitudinal_accel=-60.0, tyre_slip=1.5), (1.0, 1.0)),
    ("extreme accelerations the other way (lateral_accel -60, longitudinal_accel 40)",
     {}, dict(lateral_accel=-60.0, longitudinal_accel=40.0, heading_error=-float(np.pi)), (-1.0, -1.0)),
    ("far off course (lateral_offset 200 m, edge_margin -190 m)",
     dict(lateral_offset=195.0, edge_margin=-185.0, off_course=True),
     dict(lateral_offset=200.0, edge_margin=-190.0, off_course=True, on_kerb=False), (0.0, 0.5)),
    ("far off course on the other side (lateral_offset -200 m, edge_margin -190 m)",
     {}, dict(lateral_offset=-200.0, edge_margin=-190.0, off_course=True), (0.0, 0.5)),
    ("after many laps (progress 1e6 m, laps 200, time 40000 s)",
     dict(progress=999_990.0, laps=200, time=39_999.9), dict(progress=1_000_000.0, laps=200, time=40_000.0,
                                                           lap_time=200.0, last_lap_time=190.0), (0.0, 1.0)),
    ("reference speed near zero (0.5 m/s)", dict(reference_speed=0.5), dict(reference_speed=0.5, speed=3.0),
     (0.0, 0.2)),
    ("a very slow lap (lap_time and last_lap_time 1000 s)", {}, dict(lap_time=1000.0, last_lap_time=1000.0),
     (0.0, 0.1)),
    ("far behind the start line (progress -500 m)", dict(progress=-505.0), dict(progress=-500.0, laps=0,
                                                                                 last_lap_time=0.0), (0.0, 1.0)),
    ("huge gaps (gap_ahead, gap_behind and lane_gap_ahead 5000 m)", {},
     dict(gap_ahead=5000.0, gap_behind=5000.0, lane_gap_ahead=5000.0), (0.0, 1.0)),
)


def _random_state(rng: np.random.Generator) -> dict:
    num_cars = int(rng.integers(1, 9))
    rank = int(rng.integers(1, num_cars + 1))
    return dict(
        progress=float(rng.uniform(-30, 20_000)), lap_progress=float(rng.uniform(0, 1)),
        speed=float(rng.uniform(0, 80)), longitudinal_accel=float(rng.uniform(-30, 10)),
        lateral_accel=float(rng.uniform(-25, 25)), lateral_offset=float(rng.uniform(-12, 12)),
        edge_margin=float(rng.uniform(-6, 7)), heading_error=float(rng.uniform(-np.pi, np.pi)),
        off_course=bool(rng.random() < 0.2), on_kerb=bool(rng.random() < 0.2), wall_contact=bool(rng.random() < 0.1),
        tyre_slip=float(rng.uniform(0, 0.6)), hit_from_behind=bool(rng.random() < 0.1),
        hit_other_from_behind=bool(rng.random() < 0.1), side_contact=bool(rng.random() < 0.1),
        rank=rank, start_rank=int(rng.integers(1, num_cars + 1)), num_cars=num_cars,
        gap_ahead=float(rng.uniform(0, 200)) if rank > 1 else NO_GAP,
        gap_behind=float(rng.uniform(0, 200)) if rank < num_cars else NO_GAP,
        laps=int(rng.integers(0, 4)), lap_time=float(rng.uniform(0, 140)),
        last_lap_time=float(rng.uniform(80, 140)), time=float(rng.uniform(0, 500)),
        finished=bool(rng.random() < 0.05), reference_speed=float(rng.uniform(20, 80)),
        lane_gap_ahead=float(rng.uniform(0, 100)) if num_cars > 1 and rng.random() < 0.6 else NO_GAP,
    )


def view(**changes) -> RaceView:
    """One RaceView (scalar fields): `DEFAULT_VIEW` with `changes` (field names are checked)."""
    unknown = set(changes) - set(DEFAULT_VIEW)
    if unknown:
        raise TypeError(f"RaceView has no field(s) {sorted(unknown)}")
    values = {**DEFAULT_VIEW, **changes}
    return RaceView(**{k: jnp.asarray(values[k], d) for k, d in field_dtypes(RaceView).items()})


def action(steering: float = 0.0, throttle_brake: float = 1.0) -> Action:
    """One Action (scalar fields)."""
    return Action(steering=jnp.float32(steering), throttle_brake=jnp.float32(throttle_brake))


def _stack(rows: list[dict]) -> RaceView:  # numpy: building a batch must not start JAX's runtime (see build)
    return RaceView(**{k: np.asarray([r[k] for r in rows], dtype=d) for k, d in field_dtypes(RaceView).items()})


def _case_rows(cases) -> tuple[list, list, list, list]:
    prevs, currs, actions, names = [], [], [], []
    for name, prev_changes, curr_changes, action in cases:
        prev = {k: v + _PREV_DELTA[k] if k in _PREV_DELTA else v for k, v in DEFAULT_VIEW.items()}
        prevs.append({**prev, **prev_changes})
        currs.append({**DEFAULT_VIEW, **curr_changes})
        actions.append(action)
        names.append(name)
    return prevs, currs, actions, names


def _batch(prevs, currs, actions, names) -> tuple[RaceView, Action, RaceView, tuple[str, ...]]:
    action = Action(steering=np.asarray([a[0] for a in actions], np.float32),
                    throttle_brake=np.asarray([a[1] for a in actions], np.float32))
    return _stack(prevs), action, _stack(currs), tuple(names)


def extreme_batch() -> tuple[RaceView, Action, RaceView, tuple[str, ...]]:
    """(prev, action, curr, case names): transitions at and beyond the documented ranges (numpy arrays)."""
    return _batch(*_case_rows(_EXTREME_CASES))


def synthetic_batch() -> tuple[RaceView, Action, RaceView, tuple[str, ...]]:
    """(prev, action, curr, case names): B ordinary transitions, every field a numpy array [B]."""
    rng = np.random.default_rng(20261122)
    prevs, currs, actions, names = _case_rows(_CASES)
    for _ in range(NUM_RANDOM):
        curr = _random_state(rng)
        prev = {**curr, "progress": curr["progress"] - curr["speed"] * 0.1 * float(rng.uniform(0.8, 1.1)),
                "rank": int(np.clip(curr["rank"] + rng.integers(-1, 2), 1, curr["num_cars"])),
                "time": max(curr["time"] - 0.1, 0.0)}
        prevs.append(prev)
        currs.append(curr)
        actions.append(tuple(rng.uniform(-1, 1, 2)))
        names.append("random mid-race state")
    return _batch(prevs, currs, actions, names)
