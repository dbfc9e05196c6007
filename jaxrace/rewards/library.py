"""Reference rewards, written as reward programs and compiled by the same compiler.

- `progress`: centre-line progress per step, the only reward of the GT7 vision agent.
- `gt_sophy`: a GT Sophy style sum: progress, off-course, wall, tyre slip, passing and
  collision terms (with extra weight when we run into the back of another car), and two
  terms off by default: tailgating (`w_near`), following a car in our lane too closely, and
  pushing (`w_push`), throttle held while running into a car's back or the step after.

The contact weights (10 for any contact, 100 more for running into a car's back) are issue
16's reference recipe: at 2 and 6, where a place gained paid as much as a rear-end cost, the
agent won by force (docs/reference_agent.md, *Contact weights at the loop's budget*).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxrace.rewards.compiler import CompiledReward

PROGRESS = '''\
"""Progress along the centre line in metres per step (the GT7 vision paper's reward)."""


def reward(prev, action, curr):
    progress = curr.progress - prev.progress
    return progress, {"progress": progress}
'''

GT_SOPHY = '''\
"""A GT Sophy style reward: progress, minus penalties for leaving the course, hitting a
wall, sliding and colliding, plus a bonus for passing. Units: metres of progress."""

PARAMS = {
    "w_progress": 1.0,     # per metre of centre-line progress
    "w_off_course": 1.5,   # per metre driven while off course
    "w_wall": 1.0,         # per (10 m/s)^2 of speed at a wall contact
    "w_slip": 10.0,        # per radian of tyre slip beyond the grip peak (0.13 rad)
    "w_pass": 5.0,         # per position gained
    "w_close": 0.2,        # per metre closed on the car ahead, when within 50 m
    "w_collision": 10.0,   # any contact with another car
    "w_rear_end": 100.0,   # extra, for running into the back of another car
    "w_near": 0.0,         # per step closer than NEAR_HEADWAY behind a car in our lane (1 when touching)
    "w_push": 0.0,         # per unit of throttle while we run into a car's back, or the step after
}
DT = 0.1  # s per agent step
SLIP_PEAK = 0.13  # rad
CLOSE_RANGE = 50.0  # m
NEAR_HEADWAY = 0.3  # s of our speed (plus 1 m) of clear space we keep to a car ahead in our lane


def reward(prev, action, curr, params):
    f32 = jnp.float32
    progress = curr.progress - prev.progress
    off_course = curr.off_course.astype(f32) * curr.speed * DT
    wall = curr.wall_contact.astype(f32) * jnp.square(curr.speed / 10.0)
    slip = jnp.maximum(curr.tyre_slip - SLIP_PEAK, 0.0)
    positions = (prev.rank - curr.rank).astype(f32)
    same_car_ahead = (prev.rank == curr.rank) & (prev.gap_ahead < CLOSE_RANGE) & (curr.gap_ahead < CLOSE_RANGE)
    closing = jnp.where(same_car_ahead, prev.gap_ahead - curr.gap_ahead, 0.0)
    contact = (curr.side_contact | curr.hit_from_behind | curr.hit_other_from_behind).astype(f32)
    rear_end = curr.hit_other_from_behind.astype(f32)
    near = jnp.clip(1.0 - curr.lane_gap_ahead / (NEAR_HEADWAY * curr.speed + 1.0), 0.0, 1.0)
    pushing = (prev.hit_other_from_behind | curr.hit_other_from_behind).astype(f32)
    push = pushing * jnp.maximum(action.throttle_brake, 0.0)
    components = {
        "progress": params["w_progress"] * progress,
        "off_course": -params["w_off_course"] * off_course,
        "wall": -params["w_wall"] * wall,
        "slip": -params["w_slip"] * slip,
        "passing": params["w_pass"] * positions + params["w_close"] * closing,
        "collision": -params["w_collision"] * contact,
        "rear_end": -params["w_rear_end"] * rear_end,
        "near_miss": -params["w_near"] * near,
        "push": -params["w_push"] * push,
    }
    total = sum(components.values())
    return total, components
'''

LIBRARY = {"progress": PROGRESS, "gt_sophy": GT_SOPHY}


def library_reward(name: str, **compile_options) -> CompiledReward:
    """A reference reward by name ('progress' or 'gt_sophy'), compiled."""
    from jaxrace.rewards.compiler import compile_reward  # here: the design config reads LIBRARY's names

    if name not in LIBRARY:
        raise KeyError(f"no library reward '{name}'; choose from {sorted(LIBRARY)}")
    return compile_reward(LIBRARY[name], name=name, **compile_options)
