"""Hand-built RaceViews and Actions for reward tests."""


import jax.numpy as jnp

from jaxrace.rewards.api import NO_GAP, Action, RaceView, field_dtypes

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

    return RaceView(**{k: jnp.asarray(values[k], d) for k, d in field_dtypes(RaceView).items()})


def action(steering=0.0, throttle_brake=1.0) -> Action:
    return Action(steering=jnp.float32(steering), throttle_brake=jnp.float32(throttle_brake))
