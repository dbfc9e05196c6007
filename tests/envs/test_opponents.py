import jax
import jax.numpy as jnp
import numpy as np
import pytest
from shared_tracks import shared_track

import jaxrace
from jaxrace.envs import load_track_csv, opponents
from jaxrace.envs.rollouts import ai_race, summarise
from jaxrace.envs.track import point_at, track_slice

race = jax.jit(ai_race, static_argnums=(0, 3))


def test_ai_laps_a_real_circuit_within_5_percent_of_the_reference():
    centre, raceline = shared_track("BrandsHatch")
    track = load_track_csv(centre, raceline)
    env, params = jaxrace.make(track=track, start="time_trial", laps=2, skill=jnp.ones(1))
    record = race(env, params, jax.random.key(0), int(float(track.ref_lap_time) * 2.3 / env.static.dt))
    summary = summarise(record, race_laps=2)
    flying = summary.results[0].lap_times[1]
    assert flying < 1.05 * float(track.ref_lap_time), (flying, float(track.ref_lap_time))
    assert flying > float(track.ref_lap_time)  # the reference is the limit
    assert summary.course_outs == 0 and summary.wall_hits == 0


def test_skill_sets_the_pace():
    env, params = jaxrace.make(track="club", start="time_trial", laps=2)
    laps = []
    for skill in (0.85, 1.0):
        record = race(env, params.replace(skill=jnp.full(1, skill)), jax.random.key(0), 1900)
        laps.append(summarise(record, 2).results[0].lap_times[1])
    slow, fast = laps
    assert fast < slow
    np.testing.assert_allclose(slow / fast, 1.0 / 0.85, rtol=0.05)  # lap time ~ 1 / speed


def test_eight_car_races_finish_with_overtakes_and_few_contacts():
    env, params = jaxrace.make(track="club", num_opponents=7, laps=2)

    def one(key):
        k_skill, k_race = jax.random.split(key)
        skill = jnp.sort(jax.random.uniform(k_skill, (8,), minval=0.86, maxval=1.0))  # faster cars behind
        return ai_race(env, params.replace(skill=skill), k_race, 1800)

    record = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(3), 4))
    summaries = [summarise(jax.tree.map(lambda a, i=i: a[i], record), 2) for i in range(4)]
    assert all(r.finish_time is not None for s in summaries for r in s.results)
    assert sum(s.overtakes for s in summaries) >= 4
    contacts_per_car_lap = sum(s.contacts for s in summaries) / (4 * 8 * 2)
    assert contacts_per_car_lap < 0.15, contacts_per_car_lap
    # Finishing order follows finish times.
    for s in summaries:
        times = [r.finish_time for r in s.results]
        assert times == sorted(times)


def test_ai_does_not_run_into_a_stopped_car():
    # The ego car stands still on the race line of the oval's straight; an AI car
    # arrives behind it at speed and must brake or pass, not hit it.
    env, params = jaxrace.make(track="oval", num_opponents=1)
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    ts = track_slice(params.tracks)
    arc = jnp.array([400.0, 250.0])
    lateral = params.tracks.raceline[jnp.array([700, 430])]
    xy, station = point_at(ts, arc, lateral)
    body = state.cars.body.replace(
        x=xy[:, 0], y=xy[:, 1], yaw=params.tracks.heading[station], vx=jnp.array([0.0, 40.0])
    )
    lane = lateral - params.tracks.raceline[station]
    state = state.replace(
        cars=state.cars._replace(body=body, station=station, arc=arc, lateral=lateral, progress=arc, lane=lane)
    )

    def body_fn(state, _):
        _, state, *_ = env.step_env(jax.random.key(0), state, jnp.array([0.0, -1.0]), params)
        return state, (state.cars.hit_other_from_behind[1], state.cars.side_contact[1], state.cars.arc[1])

    _, (rear, side, ai_arc) = jax.jit(lambda s: jax.lax.scan(body_fn, s, None, length=100))(state)
    assert not np.asarray(rear).any() and not np.asarray(side).any()
    assert float(ai_arc[-1]) > 400.0 + float(params.car.length)  # it got past


@pytest.mark.parametrize("side", [1.0, -1.0])
def test_pure_pursuit_steers_back_to_the_line(side):
    env, params = jaxrace.make(track="oval", start="time_trial")
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    ts = track_slice(params.tracks)
    arc = jnp.array([300.0])
    line = params.tracks.raceline[300]
    xy, station = point_at(ts, arc, jnp.array([line + 3.0 * side]))
    body = state.cars.body.replace(x=xy[:, 0], y=xy[:, 1], yaw=params.tracks.heading[station], vx=jnp.full(1, 30.0))
    cars = opponents.DriverInput(
        body=body,
        station=station,
        arc=arc,
        lateral=jnp.array([line + 3.0 * side]),
        lane=jnp.zeros(1),
        accel=jnp.zeros(1),
        active=jnp.ones(1, bool),
    )
    action, lane = opponents.drive(ts, cars, jnp.ones(1), jnp.zeros(1), params.car, 0.1)
    assert float(action[0, 0]) * side < -0.01  # left of the line steers right, and vice versa
    assert float(action[0, 1]) > 0.0  # below the reference speed on a straight: throttle
    assert float(lane[0]) == 0.0  # alone: stays on the race line
