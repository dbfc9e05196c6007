"""The built-in AI that drives every non-ego car (and can drive the ego car as a baseline).

Per car, once per agent step:

* steering: pure pursuit towards a point a speed-dependent distance ahead on the race
  line shifted sideways by the car's lane offset, plus yaw-rate feedback;
* speed: skill x the reference speed a little ahead (with a drag feed-forward), capped
  by the cornering limit of the path actually driven when off the race line, and by a
  Gipps-style safe speed behind a slower car in the same lane (able to stop behind it,
  given how hard it is braking);
* racecraft: when held up, close into the slipstream and move to a side of the car
  ahead with track and no car there; side by side, hold the lane (never aim closer than
  a car width plus a gap to the other car); drift back to the race line once clear.

Skill scales the target speed (1.0 drives the reference profile, less a small margin);
aggression in [0, 1] shortens the following gap and speeds up lane changes.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrace.envs.track import TrackSlice, station_at
from jaxrace.envs.vehicle import CarParams, VehicleState

LANE_GAP = 1.2  # m of air between two cars side by side when passing
EDGE_MARGIN = 1.6  # m from the car's centre to the track edge that the AI keeps
YAW_GAIN = 0.08  # rad of steering per rad/s of yaw-rate error
CORNER_MARGIN = 0.98  # the AI's target speed at skill 1 as a share of the reference
FOLLOW_BRAKING = 12.0  # m/s^2 a follower counts on to stop behind the car ahead
REACTION = 0.3  # s the follower looks ahead at the lead's speed


class DriverInput(NamedTuple):
    """What the AI sees of every car; fields have shape [C]."""

    body: VehicleState
    station: jax.Array  # i32
    arc: jax.Array  # f32, m along the lap
    lateral: jax.Array  # f32, m from the centre line
    lane: jax.Array  # f32, m, the AI's current offset from the race line
    accel: jax.Array  # f32, m/s^2, longitudinal acceleration (negative when braking)
    active: jax.Array  # bool


def wrap_half(d: jax.Array, length: jax.Array) -> jax.Array:
    """Wraps a difference of arc lengths to [-length/2, length/2] (round, not a slow %)."""
    return d - length * jnp.round(d / length)


def drive(
    ts: TrackSlice,
    cars: DriverInput,
    skill: jax.Array,
    aggression: jax.Array,
    car: CarParams,
    dt: float,
) -> tuple[jax.Array, jax.Array]:
    """Actions of the AI for all cars of one race.

    Args:
        ts: the race's track.
        cars: DriverInput with fields [C].
        skill: f32[C], target speed as a fraction of the reference profile.
        aggression: f32[C] in [0, 1].
        car: per-car CarParams (fields scalars or f32[C]).
        dt: agent step (s).

    Returns:
        (actions f32[C, 2] in [-1, 1], new lane offsets f32[C]).
    """
    body = cars.body
    speed = body.speed
    num = cars.arc.shape[0]
    ahead_dist = wrap_half(cars.arc[None, :] - cars.arc[:, None], ts.length)  # [i, j], + when j is ahead
    side_dist = cars.lateral[None, :] - cars.lateral[:, None]
    other = cars.active[None, :] & ~jnp.eye(num, dtype=bool)

    # The nearest car ahead that overlaps our lane.
    look = 15.0 + 2.0 * speed
    in_lane = other & (jnp.abs(side_dist) < car.width + 0.6)
    ahead = in_lane & (ahead_dist > 0.0) & (ahead_dist < look[:, None])
    gap = jnp.where(ahead, ahead_dist, jnp.inf)
    lead = jnp.argmin(gap, axis=1)
    has_lead = jnp.any(ahead, axis=1)
    lead_gap = jnp.take_along_axis(gap, lead[:, None], axis=1)[:, 0]
    lead_speed = speed[lead]
    lead_lateral = cars.lateral[lead]

    # Target speed: the profile slightly ahead, then the follower.
    v_ref = ts.row(station_at(ts, cars.arc + 0.25 * speed)).ref_speed
    v_free = CORNER_MARGIN * skill * v_ref
    safe = car.length + 1.5 + speed * (0.4 - 0.25 * aggression)  # racing gap: a few tenths
    # A car that wants by closes up into the slipstream before it pulls out.
    wants_by = has_lead & (lead_speed < v_free - 0.5)
    gap_goal = jnp.where(wants_by, car.length + 1.0 + speed * (0.15 - 0.05 * aggression), safe)
    # Gipps-style safe speed: able to stop behind the lead at FOLLOW_BRAKING, using the
    # lead's speed a reaction time ahead given how hard it is braking now.
    lead_soon = jnp.maximum(lead_speed + jnp.minimum(cars.accel[lead], 0.0) * REACTION, 0.0)
    v_follow = jnp.sqrt(jnp.maximum(lead_soon**2 + 2.0 * FOLLOW_BRAKING * (lead_gap - gap_goal), 0.0))
    v_target = jnp.where(has_lead, jnp.minimum(v_free, v_follow), v_free)
    resist = 0.5 * car.air_density * car.cda * speed**2 + car.rolling_resistance * car.mass * 9.81
    feed_forward = resist / (car.power / jnp.maximum(speed, 5.0))

    # Lane choice: pass a slower car on a side with track and no car there.
    here = ts.row(cars.station)
    here_line = here.raceline
    left_room = here.width_left - EDGE_MARGIN
    right_room = here.width_right - EDGE_MARGIN
    held_up = wants_by & (lead_gap < safe + 20.0)
    offset = car.width + LANE_GAP

    def side_is_free(lateral_target):
        near = other & (ahead_dist > -(car.length + 4.0)) & (ahead_dist < lead_gap[:, None] + car.length)
        blocked = near & (jnp.abs(cars.lateral[None, :] - lateral_target[:, None]) < car.width + 0.5)
        return ~jnp.any(blocked & (jnp.arange(num)[None, :] != lead[:, None]), axis=1)

    left_target = lead_lateral + offset
    right_target = lead_lateral - offset
    left_ok = (left_target < left_room) & side_is_free(left_target)
    right_ok = (right_target > -right_room) & side_is_free(right_target)
    prefer_left = jnp.abs(left_target - cars.lateral) <= jnp.abs(right_target - cars.lateral)
    pass_lateral = jnp.where(
        left_ok & (prefer_left | ~right_ok), left_target, jnp.where(right_ok, right_target, cars.lateral)
    )
    lateral_goal = jnp.where(held_up, pass_lateral, here_line)

    # Side by side, hold the lane (inside stays inside, outside stays outside) at least
    # a car width plus a gap from the other car, whatever the race line does; squeezed
    # from both sides, back off.
    alongside = other & (jnp.abs(ahead_dist) < car.length + 4.0)
    hold = jnp.any(alongside, axis=1)
    sep = car.width + 0.8
    upper = jnp.min(jnp.where(alongside & (side_dist > 0.0), cars.lateral[None, :] - sep, jnp.inf), axis=1)
    lower = jnp.max(jnp.where(alongside & (side_dist <= 0.0), cars.lateral[None, :] + sep, -jnp.inf), axis=1)
    squeezed = lower > upper
    lane_goal = lateral_goal - here_line
    rate = (1.5 + 2.0 * aggression) * dt
    lane = jnp.where(hold, cars.lateral - here_line, cars.lane + jnp.clip(lane_goal - cars.lane, -rate, rate))
    lane = jnp.clip(lane, -right_room - here_line, left_room - here_line)

    # Steering: pure pursuit on the shifted race line, or on the held lane.
    lookahead = 8.0 + 0.45 * speed
    there = ts.row(station_at(ts, cars.arc + lookahead))
    line_ahead = there.raceline
    held = jnp.where(squeezed, cars.lateral, jnp.clip(cars.lateral, lower, upper))
    target_lateral = jnp.where(hold, held, line_ahead + lane)
    target_lateral = jnp.clip(target_lateral, EDGE_MARGIN - there.width_right, there.width_left - EDGE_MARGIN)
    dx = there.x + target_lateral * there.nx - body.x
    dy = there.y + target_lateral * there.ny - body.y
    cos_y, sin_y = jnp.cos(body.yaw), jnp.sin(body.yaw)
    lx, ly = cos_y * dx + sin_y * dy, -sin_y * dx + cos_y * dy
    curvature = 2.0 * ly / jnp.maximum(lx * lx + ly * ly, 1.0)
    # Yaw-rate feedback catches the car before a slide builds (what a driver does).
    yaw_error = speed * curvature - body.yaw_rate
    steer = (jnp.arctan(curvature * (car.lf + car.lr)) + YAW_GAIN * yaw_error) / car.steering_lock(jnp.abs(body.vx))

    # Off the race line the reference profile does not hold: cap the speed by the
    # cornering limit of the path actually driven.
    centre_curv = there.curvature
    path_curv = jnp.abs(centre_curv / jnp.maximum(1.0 - target_lateral * centre_curv, 0.2))
    down = car.mu * 0.5 * car.air_density * car.cla / car.mass
    v_path = jnp.sqrt(car.mu * 9.81 / jnp.maximum(path_curv - down, 1e-6))
    off_line = jnp.abs(target_lateral - line_ahead) > 1.0
    v_target = jnp.where(off_line, jnp.minimum(v_target, CORNER_MARGIN * skill * v_path), v_target)
    # Backing off has a floor: two cars squeezing each other at walking pace would never move again.
    v_target = jnp.where(squeezed, jnp.minimum(v_target, jnp.maximum(0.95 * speed, 8.0)), v_target)
    pedal = jnp.clip(feed_forward + 0.6 * (v_target - speed), -1.0, 1.0)
    actions = jnp.stack([jnp.clip(steer, -1.0, 1.0), pedal], axis=-1)
    return actions, lane
