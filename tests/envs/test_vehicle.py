"""Physical checks of the vehicle model, driven directly (no track)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrace.envs.vehicle import (
    GRAVITY,
    CarParams,
    Conditions,
    VehicleState,
    sanitise_action,
    top_speed,
    vehicle_substep,
)

DT = 1.0 / 60.0
CAR = CarParams()
TARMAC = Conditions(grip=jnp.ones(1), rolling_drag=jnp.zeros(1), drag_scale=jnp.ones(1))


def _state(speed=0.0, n=1):
    z = jnp.zeros(n)
    return VehicleState(x=z, y=z, yaw=z, vx=z + speed, vy=z, yaw_rate=z, steer=z)


def _drive(state, actions, car=CAR, surface=TARMAC):
    """Runs substeps with actions f32[T, C, 2]; returns the final state and the trajectory."""

    def body(s, a):
        s, aux = vehicle_substep(s, a, surface, car, DT)
        return s, (s, aux)

    return jax.jit(lambda s, a: jax.lax.scan(body, s, a))(state, actions)


def _const(action, steps, n=1):
    return jnp.broadcast_to(jnp.asarray(action, jnp.float32), (steps, n, 2))


def _energy(s: VehicleState, car=CAR):
    return 0.5 * car.mass * (s.vx**2 + s.vy**2) + 0.5 * car.yaw_inertia * s.yaw_rate**2


def test_top_speed_on_a_long_straight():
    final, _ = _drive(_state(), _const([0.0, 1.0], 60 * 90))
    kmh = float(final.speed[0]) * 3.6
    assert 270.0 < kmh < 290.0, kmh
    np.testing.assert_allclose(float(final.speed[0]), top_speed(CAR), rtol=0.01)


def test_standing_start_acceleration_is_gt3_like():
    _, (traj, _) = _drive(_state(), _const([0.0, 1.0], 60 * 15))
    speed = np.asarray(traj.speed[:, 0])
    t100 = np.argmax(speed > 100 / 3.6) * DT
    t200 = np.argmax(speed > 200 / 3.6) * DT
    assert 2.5 < t100 < 4.5, t100  # GT3: about 3 s
    assert 7.0 < t200 < 13.0, t200  # GT3: about 9 s


def test_braking_from_200_to_100_kmh():
    _, (traj, aux) = _drive(_state(200 / 3.6), _const([0.0, -1.0], 60 * 5))
    speed = np.asarray(traj.speed[:, 0])
    x = np.asarray(traj.x[:, 0])
    distance = x[np.argmax(speed < 100 / 3.6)]
    # Slicks and downforce: about 2 g average; public GT3 data puts it near 60 m.
    assert 45.0 < distance < 80.0, distance
    assert float(np.min(aux.ax[:, 0])) > -3.5 * GRAVITY  # never more than the tyres allow


def test_steady_state_cornering_reaches_the_friction_limit():
    # Hold 30 m/s and wind the steering on slowly: the peak lateral acceleration is the
    # friction circle's mu (g + downforce / m).
    steps = 60 * 20
    steer = jnp.linspace(0.0, 0.4, steps)

    def body(s, st):
        s = s.replace(vx=jnp.full_like(s.vx, 30.0))  # an ideal cruise control
        s, aux = vehicle_substep(s, jnp.stack([st, jnp.zeros_like(st)], -1)[None], TARMAC, CAR, DT)
        return s, aux.ay

    _, ay = jax.jit(lambda s: jax.lax.scan(body, s, steer))(_state(30.0))
    down = 0.5 * CAR.air_density * CAR.cla * 30.0**2 / CAR.mass
    limit = CAR.mu * (GRAVITY + down)
    peak = float(jnp.max(jnp.abs(ay)))
    assert 0.93 * limit < peak <= 1.01 * limit, (peak, limit)


def test_no_speed_is_gained_without_throttle():
    key = jax.random.key(0)
    steps, n = 60 * 20, 64
    steer = jax.random.uniform(key, (steps, n), minval=-1.0, maxval=1.0)
    brake = -jax.random.uniform(jax.random.fold_in(key, 1), (steps, n))
    actions = jnp.stack([steer, brake * (jnp.arange(steps)[:, None] % 120 < 60)], -1)  # coast or brake
    start = _state(50.0, n)
    _, (traj, _) = _drive(start, actions, surface=Conditions(jnp.ones(n), jnp.zeros(n), jnp.ones(n)))
    energy = np.asarray(_energy(traj))
    e0 = np.asarray(_energy(start))
    # Kinetic energy (translation + rotation) never rises above where it started.
    assert np.all(energy <= e0[None] * (1 + 1e-4))
    assert np.all(np.diff(energy, axis=0) <= 1e-3 * e0[None])


def test_left_and_right_steering_are_mirror_images():
    actions = jnp.concatenate([_const([0.3, 0.5], 120), _const([-0.6, 0.2], 120)])
    left, _ = _drive(_state(20.0), actions)
    right, _ = _drive(_state(20.0), actions * jnp.array([-1.0, 1.0]))
    np.testing.assert_allclose(float(left.x[0]), float(right.x[0]), rtol=1e-5)
    np.testing.assert_allclose(float(left.y[0]), -float(right.y[0]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(left.yaw[0]), -float(right.yaw[0]), rtol=1e-4, atol=1e-5)
    assert float(left.y[0]) > 1.0  # positive steering turns left


def test_energy_stays_bounded_over_a_long_random_rollout():
    n, steps = 32, 60 * 120
    actions = jax.random.uniform(jax.random.key(1), (steps, n, 2), minval=-1.0, maxval=1.0)
    final, (traj, aux) = _drive(_state(0.0, n), actions, surface=Conditions(jnp.ones(n), jnp.zeros(n), jnp.ones(n)))
    assert np.isfinite(np.asarray(traj.x)).all() and np.isfinite(np.asarray(traj.yaw_rate)).all()
    assert float(jnp.max(traj.speed)) <= top_speed(CAR) * 1.01
    assert float(jnp.max(jnp.abs(traj.yaw_rate))) < 10.0


def test_steering_is_rate_limited_and_bounded():
    _, (traj, _) = _drive(_state(10.0), _const([1.0, 0.0], 60))
    steer = np.asarray(traj.steer[:, 0])
    np.testing.assert_allclose(np.diff(steer).max(), CAR.steer_rate * DT, rtol=1e-4)
    assert steer.max() <= CAR.max_steer + 1e-6


def test_speed_sensitive_steering_shrinks_the_lock_with_speed():
    sensitive = CAR.replace(steer_lock_speed=20.0)
    np.testing.assert_allclose(sensitive.steering_lock(jnp.array([0.0, 20.0, 60.0])),
                               [CAR.max_steer, CAR.max_steer / 2, CAR.max_steer / 10], rtol=1e-6)
    np.testing.assert_allclose(CAR.steering_lock(jnp.array([0.0, 60.0])), CAR.max_steer)  # off by default
    # Held full lock at 60 m/s settles on a tenth of the angle (the car slows a little meanwhile).
    _, (traj, _) = _drive(_state(60.0), _const([1.0, 0.0], 30), car=sensitive)
    lock_now = np.asarray(sensitive.steering_lock(traj.vx[:, 0]))
    assert np.all(np.asarray(traj.steer[:, 0]) <= lock_now + 1e-6)
    assert np.asarray(traj.steer[-1, 0]) > 0.9 * lock_now[-1]


def test_grass_slows_the_car_and_loses_grip():
    grass = Conditions(grip=jnp.full(1, 0.6), rolling_drag=jnp.full(1, 0.08), drag_scale=jnp.ones(1))
    on_tarmac, _ = _drive(_state(40.0), _const([0.0, 0.0], 120))
    on_grass, _ = _drive(_state(40.0), _const([0.0, 0.0], 120), surface=grass)
    assert float(on_grass.speed[0]) < float(on_tarmac.speed[0]) - 1.0


def test_slipstream_raises_top_speed():
    tow = Conditions(grip=jnp.ones(1), rolling_drag=jnp.zeros(1), drag_scale=jnp.full(1, 0.7))
    alone, _ = _drive(_state(60.0), _const([0.0, 1.0], 60 * 20))
    towed, _ = _drive(_state(60.0), _const([0.0, 1.0], 60 * 20), surface=tow)
    assert float(towed.speed[0]) > float(alone.speed[0]) + 5.0


def test_a_car_at_rest_stays_at_rest():
    final, (traj, _) = _drive(_state(0.0), _const([1.0, -1.0], 600))
    assert float(jnp.max(jnp.abs(traj.vx))) < 1e-6 and float(jnp.max(jnp.abs(traj.x))) < 1e-6


def test_balance_of_performance_scales_acceleration():
    base, _ = _drive(_state(), _const([0.0, 1.0], 300))
    heavy, _ = _drive(_state(), _const([0.0, 1.0], 300), car=CAR.scaled(1.2, 1.0, 1.0))
    strong, _ = _drive(_state(), _const([0.0, 1.0], 300), car=CAR.scaled(1.0, 1.2, 1.0))
    assert float(heavy.speed[0]) < float(base.speed[0]) < float(strong.speed[0])


@pytest.mark.parametrize(
    "action, clean, bad",
    [
        ([0.5, -0.2], [0.5, -0.2], False),
        ([np.nan, 0.3], [0.0, 0.3], True),
        ([2.0, -7.0], [1.0, -1.0], True),
        ([np.inf, -np.inf], [1.0, -1.0], True),
    ],
)
def test_sanitise_action(action, clean, bad):
    out, flag = sanitise_action(jnp.array(action, jnp.float32))
    np.testing.assert_allclose(np.asarray(out), clean)
    assert bool(flag) is bad


def test_fast_atan_matches_numpy_to_2e_6_rad():
    from jaxrace.envs.vehicle import fast_atan

    x = np.concatenate([np.linspace(-3.0, 3.0, 60001), np.geomspace(3.0, 1e6, 2000), -np.geomspace(3.0, 1e6, 2000)])
    got = np.asarray(jax.jit(fast_atan)(jnp.asarray(x, jnp.float32)), np.float64)
    assert np.abs(got - np.arctan(x)).max() < 2e-6
    assert float(fast_atan(jnp.float32(0.0))) == 0.0
