"""Hand-built RaceViews and Actions for reward tests."""

import dataclasses

import jax.numpy as jnp

from jaxrace.rewards.api import NO_GAP, Action, RaceView

INT_FIELDS = {"rank", "start_rank", "num_cars", "laps"}
BOOL_FIELDS = {"off_course", "on_kerb", "wall_contact", "hit_from_behind", "hit_other_from_behind", "side_contact",
               "finished"}
DEFAULTS = dict(
    progress=100.0, lap_progress=0.1, speed=40.0, longitudinal_accel=0.0, lateral_accel=0.0, lateral_offset=0.0,
    edge_margin=5.0, heading_error=0.0, off_course=False, on_kerb=False, wall_contact=False, tyre_slip=0.05,
    hit_from_behind=False, hit_other_from_behind=False, side_contact=False, rank=3, start_rank=8, num_cars=8,
    gap_ahead=NO_GAP, gap_behind=NO_GAP, laps=0, lap_time=10.0, last_lap_time=0.0, time=10.0, finished=False,
    reference_speed=50.0,
)


def view(**changes) -> RaceView:
    unknown = set(changes) - set(DEFAULTS)
    assert not unknown, unknown
    values = {**DEFAULTS, **changes}

    def cast(name, value):
        dtype = jnp.int32 if name in INT_FIELDS else jnp.bool_ if name in BOOL_FIELDS else jnp.float32
        return jnp.asarray(value, dtype)

    return RaceView(**{f.name: cast(f.name, values[f.name]) for f in dataclasses.fields(RaceView)})


def action(steering=0.0, throttle_brake=1.0) -> Action:
    return Action(steering=jnp.float32(steering), throttle_brake=jnp.float32(throttle_brake))
