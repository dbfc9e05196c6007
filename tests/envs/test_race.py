import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrace
from jaxrace.envs import StaticParams, builtin_track, per_env_params, stack_tracks
from jaxrace.envs.laps import lap_bookkeeping, ranks
from jaxrace.rewards.api import NO_GAP, RaceView


@pytest.fixture(scope="module")
def grid():
    env, params = jaxrace.make(track="club", num_opponents=7, laps=2)
    return env, params


@pytest.fixture(scope="module")
def solo():
    env, params = jaxrace.make(track="oval", start="time_trial")
    return env, params.replace(skill=params.skill.at[0].set(1.0))


def _set_cars(state, **fields):
    return state.replace(cars=state.cars._replace(**fields))


def test_shapes_and_dtypes(grid):
    env, params = grid
    obs, state = jax.jit(env.reset)(jax.random.key(0), params)
    assert set(obs) == {"proprio", "privileged"}
    for name, shape in env.observation_shapes().items():
        assert obs[name].shape == shape and obs[name].dtype == jnp.float32
    assert obs["privileged"].shape == (4 * 30 + 5 * 6,)
    obs, state, reward, term, trunc, info = jax.jit(env.step)(jax.random.key(1), state, jnp.zeros(2), params)
    assert reward.shape == () and reward.dtype == jnp.float32
    assert term.dtype == jnp.bool_ and trunc.dtype == jnp.bool_
    view = info["view"]
    assert isinstance(view, RaceView)
    for name in ("off_course", "wall_contact", "hit_from_behind", "hit_other_from_behind", "side_contact",
                 "finished", "on_kerb"):
        assert getattr(view, name).dtype == jnp.bool_, name
    for name in ("rank", "start_rank", "laps", "num_cars"):
        assert getattr(view, name).dtype == jnp.int32, name
    for name in ("progress", "speed", "gap_ahead", "lap_time", "time", "tyre_slip"):
        assert getattr(view, name).dtype == jnp.float32, name
    assert state.cars.body.x.shape == (8,)


def test_step_compiles_once(grid):
    env, params = grid
    step = jax.jit(chex.assert_max_traces(env.step, n=1))
    obs, state = jax.jit(env.reset)(jax.random.key(0), params)
    for i in range(4):
        action = jnp.array([0.1 * i, 1.0 - 0.3 * i])
        obs, state, *_ = step(jax.random.key(i), state, action, params)
    # New parameter values (same structure) do not retrace either.
    step(jax.random.key(9), state, jnp.zeros(2), params.replace(time_limit=jnp.float32(30.0)))


def test_determinism_under_a_key():
    env, params = jaxrace.make(track="club", num_opponents=3, start="random")

    def run(key):
        k_reset, k_act = jax.random.split(key)
        obs, state = env.reset(k_reset, params)

        def body(state, k):
            a = jax.random.uniform(k, (2,), minval=-1.0, maxval=1.0)
            obs, state, r, *_ = env.step(k, state, a, params)
            return state, r

        return jax.lax.scan(body, state, jax.random.split(k_act, 50))

    run = jax.jit(run)
    s1, r1 = run(jax.random.key(5))
    s2, r2 = run(jax.random.key(5))
    chex.assert_trees_all_equal(s1, s2)
    np.testing.assert_array_equal(np.asarray(r1), np.asarray(r2))


def test_random_starts_differ_by_key_and_are_valid():
    env, params = jaxrace.make(track="club", num_opponents=5, start="random")
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    _, states = reset(jax.random.split(jax.random.key(0), 16), params)
    arcs = np.asarray(states.cars.arc[:, 0])
    assert len(np.unique(np.round(arcs))) == 16  # every reset a fresh start
    # Cars never start on top of each other, and start on the track.
    for s in range(16):
        a = np.sort(np.asarray(states.cars.arc[s]))
        gaps = np.diff(np.append(a, a[0] + float(params.tracks.length)))
        assert gaps.min() > 5.0
    assert np.all(np.abs(np.asarray(states.view.edge_margin)) < 10.0)
    assert np.all(np.asarray(states.view.edge_margin) > 0.0)


def test_random_starts_in_a_pack_keep_the_cars_close_and_at_one_speed():
    """random_start_gap > 0 puts the field in a pack (traffic from the first step), per env."""
    env, params = jaxrace.make(track="club", num_opponents=5, start="random")
    params = per_env_params(params, 16, random_start_gap=[0.0] * 8 + [25.0] * 8)
    reset = jax.jit(jax.vmap(env.reset))
    _, states = reset(jax.random.split(jax.random.key(3), 16), params)
    length = float(params.tracks.length[0])
    for s in range(16):
        a = np.sort(np.asarray(states.cars.arc[s]))
        gaps = np.diff(np.append(a, a[0] + length))
        if s < 8:  # spread round the lap: no gap much over a sixth of it
            assert gaps.max() < 1.5 * length / 6
        else:  # six cars 25 m apart (jitter up to half a gap): one long gap, the rest 12.5-37.5 m
            assert gaps.max() > length - 6 * 25.0
            assert np.all(np.sort(gaps)[:-1] > 12.5) and np.all(np.sort(gaps)[:-1] < 37.5)
            ref_speed = np.asarray(params.tracks.ref_speed[s])
            ref = ref_speed[(np.asarray(states.cars.arc[s]) / (length / ref_speed.size)).astype(int)]
            frac = np.asarray(states.cars.body.speed[s]) / ref
            assert 0.3 * 0.95 <= frac.min() and frac.max() <= 0.9 * 1.05 and frac.max() / frac.min() < 1.11
    assert np.all(np.asarray(states.view.edge_margin) > 0.0)


def test_corner_starts_put_the_pack_in_grid_formation_at_speed_before_a_braking_zone():
    """corner_start_prob: packed starts in two columns 8 m apart, at one speed, where the reference speed falls."""
    env, params = jaxrace.make(track="gp", num_opponents=7, start="random")
    reset = jax.jit(jax.vmap(env.reset))
    keys = jax.random.split(jax.random.key(5), 32)
    packs = per_env_params(params, 32, random_start_gap=[25.0] * 32)
    _, corner = reset(keys, packs.replace(corner_start_prob=jnp.ones((32,), jnp.float32)))
    _, plain = reset(keys, packs)
    ref = np.asarray(params.tracks.ref_speed)
    length = float(params.tracks.length)

    def ref_at(arc):
        return ref[np.floor((np.asarray(arc) % length) / (length / ref.size)).astype(int)]

    drops, plain_drops = [], []
    for s in range(32):
        arc = np.asarray(corner.cars.arc[s])
        order = np.argsort(-np.asarray(corner.cars.progress[s]))  # front of the pack first
        ahead = (arc[order[0]] - arc[order]) % length
        np.testing.assert_allclose(ahead, 8.0 * np.arange(8), atol=1e-2)
        lateral = np.asarray(corner.cars.lateral[s])[order]
        np.testing.assert_allclose(np.abs(lateral), 2.5, atol=1e-5)
        assert np.all(np.sign(lateral[1:]) == -np.sign(lateral[:-1]))  # staggered columns
        speed = np.asarray(corner.cars.body.speed[s])
        np.testing.assert_allclose(speed, speed[0], rtol=1e-6)
        assert 0.6 * 0.999 <= speed[0] / ref_at(arc).min() <= 0.9 * 1.001  # of the slowest reference under the pack
        drops.append(ref_at(arc[order[0]]) - ref_at(arc[order[0]] + 150.0))
        front = np.argmax(np.asarray(plain.cars.progress[s]))
        plain_drops.append(ref_at(plain.cars.arc[s, front]) - ref_at(plain.cars.arc[s, front] + 150.0))
    # The front of the pack is before a braking zone: the reference speed falls ahead of it.
    assert np.median(drops) > 10.0 and np.median(drops) > np.median(plain_drops) + 10.0
    assert np.all(np.asarray(corner.view.edge_margin) > 0.0)
    assert len(np.unique(np.asarray(corner.view.rank))) > 4  # the ego car in any slot
    # With fewer cars taking part, the active ones fill the first slots: no holes in the pack.
    few = per_env_params(params, 32, random_start_gap=[25.0] * 32, num_active_opponents=[3] * 32,
                         corner_start_prob=[1.0] * 32)
    _, small = reset(keys, few)
    for s in range(32):
        arc = np.asarray(small.cars.arc[s, :4])
        progress = np.asarray(small.cars.progress[s, :4])
        ahead = (arc[np.argmax(progress)] - arc) % length
        np.testing.assert_allclose(np.sort(ahead), 8.0 * np.arange(4), atol=1e-2)
    # Only packs start at a corner: spread starts ignore it.
    spread = per_env_params(params, 32, random_start_gap=[0.0] * 32)
    _, spread_corner = reset(keys, spread.replace(corner_start_prob=jnp.ones((32,), jnp.float32)))
    _, spread_plain = reset(keys, spread)
    np.testing.assert_array_equal(np.asarray(spread_corner.cars.arc), np.asarray(spread_plain.cars.arc))


def test_random_starts_can_start_on_the_grid():
    """grid_start_prob: that share of random-start episodes are the race's grid start, exactly."""
    env, params = jaxrace.make(track="club", num_opponents=5, start="random")
    grid_env, grid_params = jaxrace.make(track="club", num_opponents=5, start="grid_back")
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    keys = jax.random.split(jax.random.key(4), 400)
    _, always = reset(keys, params.replace(grid_start_prob=jnp.float32(1.0)))  # (one batch size: one compile)
    _, grid = jax.jit(grid_env.reset)(jax.random.key(0), grid_params)
    for name in ("progress", "arc", "lateral", "lap_origin"):
        for s in range(0, 400, 50):
            np.testing.assert_array_equal(np.asarray(getattr(always.cars, name)[s]),
                                          np.asarray(getattr(grid.cars, name)), err_msg=name)
    np.testing.assert_array_equal(np.asarray(always.cars.body.speed), 0.0)
    assert np.all(np.asarray(always.view.rank) == 6)
    _, mixed = reset(keys, params.replace(grid_start_prob=jnp.float32(0.25)))
    standing = np.all(np.asarray(mixed.cars.body.speed) == 0.0, axis=1)
    assert 0.18 < standing.mean() < 0.32  # 100 expected of 400
    _, never = reset(keys, params)
    assert not np.any(np.all(np.asarray(never.cars.body.speed) == 0.0, axis=1))



def test_offtrack_starts_put_the_ego_car_on_the_run_off_and_end_only_when_it_leaves_again():
    """offtrack_start_prob: that share of random starts put the ego car (alone) beyond an edge by
    more than the course-out margin, 2 m or more short of the wall; such an episode goes on while the
    car stays off, and a course-out ends it only once the car has been back on the course."""
    env, params = jaxrace.make(track="club", num_opponents=5, start="random", terminate_on_course_out=True,
                               course_out_margin=0.6)
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    keys = jax.random.split(jax.random.key(8), 400)
    _, never = reset(keys, params)
    assert not np.any(np.asarray(never.view.off_course))
    off_params = params.replace(offtrack_start_prob=jnp.float32(1.0))
    _, always = reset(keys, off_params)  # (one batch size: one compile)
    ego = jax.tree.map(lambda x: np.asarray(x)[:, 0], always.cars)
    assert np.all(np.asarray(always.view.off_course))
    row = ego.station
    tracks = params.tracks
    width = np.where(ego.lateral > 0, np.asarray(tracks.width_left)[row], np.asarray(tracks.width_right)[row])
    wall = np.where(ego.lateral > 0, np.asarray(tracks.wall_left)[row], np.asarray(tracks.wall_right)[row])
    beyond = np.abs(ego.lateral) - width
    assert np.all(beyond > 0.6) and np.all(np.abs(ego.lateral) <= wall - 2.0 + 1e-4)
    assert 0.3 < np.mean(ego.lateral > 0) < 0.7  # both sides
    turn = np.asarray(always.cars.heading_error)
    assert np.all(np.abs(turn[:, 0]) <= 0.5) and np.std(turn[:, 0]) > 0.1 and np.all(turn[:, 1:] == 0.0)
    assert not np.any(np.asarray(always.cars.lateral)[:, 1:] != np.asarray(
        never.cars.lateral)[:, 1:])  # the other cars start where they would have
    _, mixed = reset(keys, params.replace(offtrack_start_prob=jnp.float32(0.25)))
    assert 0.18 < np.asarray(mixed.view.off_course).mean() < 0.32  # 100 expected of 400

    step = jax.jit(env.step_env)  # (one compiled step: `step` adds only the auto-reset)
    _, state = jax.jit(env.reset)(jax.random.key(3), off_params)
    assert bool(state.view.off_course)
    for _ in range(10):  # standing on the brakes off the course: no course-out, the episode goes on
        _, state, _, terminated, _, info = step(jax.random.key(0), state, jnp.array([0.0, -1.0]), off_params)
        assert bool(info["view"].off_course) and not bool(terminated)
    # The same car as if it had rejoined the course since: being off it is a course-out, every
    # step it stays off (brax's action repeat reads only the last step's `done`).
    rejoined = state.replace(off_since_start=jnp.bool_(False))
    for _ in range(2):
        _, rejoined, _, terminated, _, info = step(jax.random.key(0), rejoined, jnp.array([0.0, -1.0]), off_params)
        assert bool(info["view"].off_course) and bool(terminated)


def test_grid_starts_leave_the_other_starts_slots_uniform():
    """Whether an episode starts on the grid is drawn apart from the slots: the ego car is in
    any slot of a moving pack as often (it was once at the back in 1% of them, not 1 in 6)."""
    env, params = jaxrace.make(track="club", num_opponents=5, start="random")
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    params = params.replace(grid_start_prob=jnp.float32(0.3), random_start_gap=jnp.float32(25.0))
    _, states = reset(jax.random.split(jax.random.key(6), 3000), params)
    moving = ~np.all(np.asarray(states.cars.body.speed) == 0.0, axis=1)
    assert 0.63 < moving.mean() < 0.77
    at_back = np.asarray(states.view.rank)[moving] == 6
    assert 0.13 < at_back.mean() < 0.21  # 1 in 6


def test_opponents_in_the_track_frame_on_the_grid():
    """opponent_frame="track": gap along / 25 m, lateral gap / 4 m, speed differences, presence."""
    env, params = jaxrace.make(track="club", num_opponents=7, start="grid_back", opponent_frame="track")
    obs, state = jax.jit(env.reset)(jax.random.key(0), params)
    slots = np.asarray(obs["privileged"][4 * 30:]).reshape(6, 5)
    side = 2 * float(state.cars.lateral[1]) / 4.0  # the columns sit at +-lateral[1]
    # Nearest first: 8 m ahead in the other column, then 16 m ahead in ours, 24 m in the other...
    np.testing.assert_allclose(slots[:3, :2], [[8 / 25, side], [16 / 25, 0.0], [24 / 25, side]], atol=1e-5)
    np.testing.assert_array_equal(slots[:, 2:4], 0.0)  # standing
    np.testing.assert_array_equal(slots[:, 4], 1.0)
    # With two opponents taking part the other slots are empty (zeros).
    obs, _ = jax.jit(env.reset)(jax.random.key(0), params.replace(num_active_opponents=jnp.int32(2)))
    slots = np.asarray(obs["privileged"][4 * 30:]).reshape(6, 5)
    np.testing.assert_allclose(slots[:2, 0], [8 / 25, 16 / 25], atol=1e-5)
    np.testing.assert_array_equal(slots[2:], 0.0)
    # Far cars saturate at 4 (100 m) instead of growing with the distance.
    env, params = jaxrace.make(track="club", num_opponents=7, start="random", opponent_frame="track")
    obs, _ = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(jax.random.key(1), 8), params)
    along = np.asarray(obs["privileged"][:, 4 * 30:]).reshape(8, 6, 5)[..., 0]
    assert np.abs(along).max() == 4.0


def test_opponent_accel_adds_each_slots_brake_lights():
    """opponent_accel: a sixth number per slot, the car's longitudinal acceleration / 20 m/s^2."""
    # The cars' state does not depend on what the observation shows: one env places them
    # (random places round the lap), and each car gets its own acceleration, braking or not.
    driver, params = jaxrace.make(track="club", num_opponents=7, start="random")
    _, state = jax.jit(driver.reset)(jax.random.key(0), params)
    ax = np.array([1.0, -24.5, 3.25, -7.0, 12.0, -0.5, 6.75, -15.0], np.float32)
    state = _set_cars(state, ax=jnp.asarray(ax))
    for frame in ("car", "track"):
        plain_env, _ = jaxrace.make(track="club", num_opponents=7, start="random", opponent_frame=frame)
        env, _ = jaxrace.make(track="club", num_opponents=7, start="random", opponent_frame=frame,
                              opponent_accel=True)
        assert env.observation_shapes()["privileged"] == (4 * 30 + 6 * 6,)
        observe = jax.jit(env.observation)
        slots = np.asarray(observe(state, params)["privileged"][4 * 30:]).reshape(6, 6)
        plain = np.asarray(jax.jit(plain_env.observation)(state, params)["privileged"][4 * 30:]).reshape(6, 5)
        np.testing.assert_allclose(slots[:, :5], plain, rtol=1e-5, atol=1e-6)
        # The six nearest of the seven opponents, nearest first, by the frame's distance.
        c = jax.tree.map(np.asarray, state.cars)
        if frame == "car":
            dist = np.hypot(c.body.x[1:] - c.body.x[0], c.body.y[1:] - c.body.y[0])
        else:
            length = float(params.tracks.length)
            along = (c.arc[1:] - c.arc[0] + length / 2) % length - length / 2
            dist = np.hypot(along, c.lateral[1:] - c.lateral[0])
        nearest = 1 + np.argsort(dist)[:6]
        assert list(nearest) != sorted(nearest)  # nearest first, not in index order
        np.testing.assert_allclose(slots[:, 5], ax[nearest] / 20.0, rtol=1e-6)
        # Absent cars' slots are zeros, their acceleration too.
        obs = observe(state.replace(active=jnp.arange(8) < 3), params)
        assert np.count_nonzero(np.asarray(obs["privileged"][4 * 30:]).reshape(6, 6)[2:]) == 0


def test_grid_start_puts_the_ego_car_at_the_back(grid):
    env, params = grid
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    assert int(state.view.rank) == 8 and int(state.view.start_rank) == 8
    assert float(state.cars.progress[0]) == float(jnp.min(state.cars.progress))
    assert float(state.view.gap_behind) == NO_GAP
    np.testing.assert_allclose(float(state.view.gap_ahead), 8.0)
    # With fewer active opponents the ego car still starts last, right behind them.
    _, state = jax.jit(env.reset)(jax.random.key(0), params.replace(num_active_opponents=jnp.int32(3)))
    assert int(state.view.rank) == 4 and int(state.view.num_cars) == 4


def test_thousand_step_smoke_of_256_envs_stays_finite(grid):
    env, params = grid
    n = 256

    def run(key):
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n), params)

        def body(state, k):
            a = jax.random.uniform(k, (n, 2), minval=-1.0, maxval=1.0)
            obs, state, r, term, trunc, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k, n), state, a, params)
            return state, (r, obs["privileged"].sum(), state.cars.body.speed.max())

        return jax.lax.scan(body, state, jax.random.split(key, 1000))

    state, (reward, obs_sum, vmax) = jax.jit(run)(jax.random.key(0))
    chex.assert_tree_all_finite((state, reward, obs_sum))
    assert float(vmax.max()) < 85.0


def test_nan_and_out_of_range_actions_are_sanitised(solo):
    env, params = solo
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    step = jax.jit(env.step)
    _, state, r, *_, info = step(jax.random.key(1), state, jnp.array([jnp.nan, 5.0]), params)
    assert bool(info["bad_action"]) and int(info["bad_action_count"]) == 1
    chex.assert_tree_all_finite(state)
    _, state, r, *_, info = step(jax.random.key(1), state, jnp.array([0.0, 1.0]), params)
    assert not bool(info["bad_action"]) and int(info["bad_action_count"]) == 1
    assert float(state.cars.body.speed[0]) > 0.0  # the clipped full throttle drove


def test_progress_reward_laps_and_termination(solo):
    env, params = solo
    params = params.replace(laps=jnp.int32(1))
    _, state = jax.jit(env.reset)(jax.random.key(0), params)

    def body(state, _):
        prev = state
        obs, state, reward, term, trunc, info = env.step_env(jax.random.key(0), state, env.ai_action(state, params),
                                                             params)
        return state, (reward, term, trunc, info["view"], prev.view.progress)

    _, (reward, term, trunc, view, prev_progress) = jax.jit(
        lambda s: jax.lax.scan(body, s, None, length=500))(state)
    reward, term = np.asarray(reward), np.asarray(term)
    np.testing.assert_allclose(reward, np.asarray(view.progress) - np.asarray(prev_progress), atol=1e-4)
    end = int(np.argmax(term))
    assert term[end] and not term[:end].any() and not np.asarray(trunc)[: end + 1].any()
    length = float(params.tracks.length)
    assert float(view.progress[end]) >= length > float(view.progress[end - 1])
    assert int(view.laps[end]) == 1 and bool(view.finished[end])
    # The crossing time is interpolated inside the step.
    lap = float(view.last_lap_time[end])
    assert float(view.time[end]) - 0.1 <= lap <= float(view.time[end])
    # A standing start costs the AI about 7 s to 250 km/h; the rest is within 5% of the reference.
    assert lap < 1.05 * float(params.tracks.ref_lap_time) + 8.0


def test_time_limit_truncates_and_auto_resets(solo):
    env, params = solo
    params = params.replace(time_limit=jnp.float32(1.0))
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    step = jax.jit(env.step)
    for i in range(10):
        obs, state, r, term, trunc, info = step(jax.random.key(i), state, jnp.array([0.0, 1.0]), params)
        assert bool(trunc) == (i == 9) and not bool(term)
    # After the reset: a fresh episode, the final observation and view kept in info.
    assert float(state.time) == 0.0 and float(state.cars.body.speed[0]) == 0.0
    assert float(info["view"].time) == pytest.approx(1.0)
    assert float(info["final_observation"]["proprio"][0]) > 0.0 and float(obs["proprio"][0]) == 0.0


def test_course_out_terminates_when_asked(solo):
    env, params = solo
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    action = jnp.array([1.0, 1.0])  # full lock left: off the track within seconds

    def run(p):
        def body(state, _):
            obs, state, r, term, trunc, info = env.step_env(jax.random.key(0), state, action, p)
            return state, (term, info["view"].off_course)

        return jax.lax.scan(body, state, None, length=100)[1]

    term, off = jax.jit(run)(params)
    assert np.asarray(off).any() and not np.asarray(term).any()
    term, off = jax.jit(run)(params.replace(terminate_on_course_out=jnp.bool_(True)))
    first_off = int(np.argmax(np.asarray(off)))
    assert bool(term[first_off]) and not np.asarray(term[:first_off]).any()



def test_walls_keep_the_car_in_and_slow_it(solo):
    env, params = solo
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    state = _set_cars(state, body=state.cars.body.replace(vx=state.cars.body.vx.at[0].set(50.0)))

    def body(state, _):
        obs, state, r, term, trunc, info = env.step_env(jax.random.key(0), state, jnp.array([1.0, 0.0]), params)
        return state, (info["view"], state.cars.lateral[0])

    _, (view, lateral) = jax.jit(lambda s: jax.lax.scan(body, s, None, length=60))(state)
    hit = np.asarray(view.wall_contact)
    assert hit.any()
    first = int(np.argmax(hit))
    wall = float(params.tracks.wall_left[0]) - 0.5 * float(params.car.width)
    assert float(jnp.max(lateral)) <= wall + 0.05
    assert float(view.speed[first + 2]) < 0.9 * float(view.speed[first - 1])


def test_rear_end_contact_records_who_hit_whom():
    env, params = jaxrace.make(track="oval", num_opponents=1, skill=jnp.array([1.0, 0.0]))
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    c = state.cars
    # Ego 3 m behind the opponent on the same line, 10 m/s faster: it will run into it.
    arc = jnp.array([200.0, 203.5])
    from jaxrace.envs.track import point_at, track_slice

    xy, station = point_at(track_slice(params.tracks), arc, jnp.zeros(2))
    body = c.body.replace(x=xy[:, 0], y=xy[:, 1], yaw=params.tracks.heading[station],
                          vx=jnp.array([30.0, 20.0]))
    state = _set_cars(state, body=body, station=station, arc=arc, lateral=jnp.zeros(2), progress=arc)
    _, state, *_ , info = jax.jit(env.step_env)(jax.random.key(0), state, jnp.array([0.0, 0.0]), params)
    assert bool(state.cars.hit_other_from_behind[0]) and bool(state.cars.hit_from_behind[1])
    assert not bool(state.cars.hit_from_behind[0]) and not bool(state.cars.hit_other_from_behind[1])
    assert bool(info["view"].hit_other_from_behind)
    # Momentum went forward: the car hit gained speed, the hitter lost it, and they parted.
    assert float(state.cars.body.vx[1]) > 20.5 and float(state.cars.body.vx[0]) < 29.0
    assert float(state.cars.arc[1] - state.cars.arc[0]) >= float(params.car.length) - 0.3


def test_rear_end_contact_terminates_when_asked():
    """`terminate_on_contact` ends the episode on the first step the ego car runs into a
    car's back, and not before."""
    from jaxrace.envs.track import point_at, track_slice

    env, params = jaxrace.make(track="oval", num_opponents=1, skill=jnp.array([1.0, 0.0]))
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    arc = jnp.array([200.0, 212.0])  # ego 12 m behind on the same line, 20 m/s faster
    xy, station = point_at(track_slice(params.tracks), arc, jnp.zeros(2))
    body = state.cars.body.replace(x=xy[:, 0], y=xy[:, 1], yaw=params.tracks.heading[station],
                                   vx=jnp.array([30.0, 10.0]))
    state = _set_cars(state, body=body, station=station, arc=arc, lateral=jnp.zeros(2), progress=arc)

    def run(p):
        def body(state, _):
            obs, state, r, term, trunc, info = env.step_env(jax.random.key(0), state, jnp.array([0.0, 0.5]), p)
            return state, (term, info["view"].hit_other_from_behind)

        return jax.lax.scan(body, state, None, length=30)[1]

    term, hit = jax.jit(run)(params)
    first_hit = int(np.argmax(np.asarray(hit)))
    assert first_hit > 0 and bool(hit[first_hit]) and not np.asarray(term).any()
    term, hit = jax.jit(run)(params.replace(terminate_on_contact=jnp.bool_(True)))
    assert int(np.argmax(np.asarray(hit))) == first_hit
    assert bool(term[first_hit]) and not np.asarray(term[:first_hit]).any()

def test_lane_gap_ahead_is_the_clear_space_to_the_nearest_car_in_our_lane():
    from jaxrace.envs.observation import LANE_RANGE, lane_gap_ahead
    from jaxrace.envs.track import track_slice

    env, params = jaxrace.make(track="oval", num_opponents=5)
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    ts = track_slice(params.tracks)
    length = float(ts.length)

    def gap(arc, lateral, active=(True,) * 6):
        s = _set_cars(state, arc=jnp.asarray(arc, jnp.float32), lateral=jnp.asarray(lateral, jnp.float32))
        return float(lane_gap_ahead(s.replace(active=jnp.asarray(active)), params, ts))

    # Car 1 in our lane 10 m ahead (centre to centre): 10 - 4.6 m clear. Car 2 is nearer but
    # 3 m to the side (beyond 2 + 0.5 m), car 3 is behind, car 4 in lane further on.
    arcs, lats = [200.0, 210.0, 204.0, 190.0, 230.0, 600.0], [0.0, 2.4, 3.0, 0.0, -0.5, 0.0]
    assert gap(arcs, lats) == pytest.approx(10.0 - 4.6, abs=1e-4)
    # An inactive car does not count; the next one in lane does.
    assert gap(arcs, lats, (True, False, True, True, True, True)) == pytest.approx(30.0 - 4.6, abs=1e-4)
    # Overlapping boxes read 0; across the start line the gap wraps.
    assert gap([200.0, 203.0, 0, 0, 0, 0], [0.0, 0.5, 9, 9, 9, 9]) == 0.0
    assert gap([length - 2.0, 8.0, 0, 0, 0, 0], [0.0, 0.0, 9, 9, 9, 9]) == pytest.approx(10.0 - 4.6, abs=1e-3)
    # Up to LANE_RANGE of clear space counts; beyond it, NO_GAP.
    assert gap([200.0, 200.0 + 102.0, 150, 150, 150, 150], [0.0] * 6) == pytest.approx(102.0 - 4.6, abs=1e-3)
    far = 200.0 + LANE_RANGE + 4.6 + 1.0
    assert gap([200.0, far, 150, 150, 150, 150], [0.0, 0.0, 0, 0, 0, 0]) == NO_GAP
    # Jitted and vmapped over envs, as the trainer computes it, the values are the same.
    states = jax.tree.map(lambda *xs: jnp.stack(xs), *[
        _set_cars(state, arc=jnp.asarray(a, jnp.float32), lateral=jnp.asarray(lat, jnp.float32))
        for a, lat in ((arcs, lats), ([200.0, 203.0, 0, 0, 0, 0], [0.0, 0.5, 9, 9, 9, 9]))])
    batched = jax.jit(jax.vmap(lane_gap_ahead, in_axes=(0, None, None)))(states, params, ts)
    np.testing.assert_allclose(np.asarray(batched), [10.0 - 4.6, 0.0], atol=1e-4)
    # The env's RaceView carries it: on the grid the car straight ahead is on the other side,
    # so our lane's car is two grid slots (16 m) ahead.
    env8, params8 = jaxrace.make(track="club", num_opponents=7, laps=2)
    _, grid_state = jax.jit(env8.reset)(jax.random.key(0), params8)
    assert float(grid_state.view.gap_ahead) == pytest.approx(8.0)
    assert float(grid_state.view.lane_gap_ahead) == pytest.approx(16.0 - 4.6, abs=1e-3)


def test_lane_headway_reads_the_car_ahead_in_our_lane():
    from jaxrace.envs.observation import HEADWAY_CAP, lane_headway
    from jaxrace.envs.track import track_slice

    env, params = jaxrace.make(track="oval", num_opponents=5)
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    ts = track_slice(params.tracks)

    def headway(arc, lateral, vx):
        s = _set_cars(state, arc=jnp.asarray(arc, jnp.float32), lateral=jnp.asarray(lateral, jnp.float32),
                      body=state.cars.body.replace(vx=jnp.asarray(vx, jnp.float32)))
        return np.asarray(lane_headway(s, params, ts))

    # Car 1 in our lane 20 m ahead (15.4 m clear) and 10 m/s slower; car 2 nearer but beside.
    arcs, lats, vx = [200.0, 220.0, 205.0, 150, 150, 150], [0.0, 0.5, 3.0, 0, 0, 0], [30.0, 20.0, 5.0, 0, 0, 0]
    np.testing.assert_allclose(headway(arcs, lats, vx), [15.4 / 30.0 / HEADWAY_CAP, 10.0 / 16.4], rtol=1e-4)
    # Pulling away reads no closing; a long headway is capped; no car in lane reads (1, 0).
    np.testing.assert_allclose(headway(arcs, lats, [30.0, 35.0, 5, 0, 0, 0]), [15.4 / 90.0, 0.0], rtol=1e-4)
    np.testing.assert_allclose(headway(arcs, lats, [4.0, 3.0, 5, 0, 0, 0]), [1.0, 1.0 / 16.4], rtol=1e-4)
    np.testing.assert_allclose(headway([200.0, 220.0, 205.0, 150, 150, 150], [0.0, 5.0, 3.0, 0, 0, 0], vx), [1.0, 0.0])
    # The env appends the two numbers to the privileged observation only when asked.
    env_h, params_h = jaxrace.make(track="oval", num_opponents=5, lane_headway=True)
    assert env_h.observation_shapes()["privileged"][0] == env.observation_shapes()["privileged"][0] + 2
    obs, s_h = jax.jit(env_h.reset)(jax.random.key(0), params_h)
    obs0, _ = jax.jit(env.reset)(jax.random.key(0), params)
    np.testing.assert_array_equal(np.asarray(obs["privileged"][:-2]), np.asarray(obs0["privileged"]))
    np.testing.assert_allclose(np.asarray(obs["privileged"][-2:]), np.asarray(lane_headway(s_h, params_h, ts)))


def test_ranks_and_lap_bookkeeping_on_scripted_progress(grid):
    _, params = grid
    _, state = jax.jit(grid[0].reset)(jax.random.key(0), params)
    cars = state.cars._replace(
        progress=jnp.array([50.0, 120.0, 80.0, 80.0, 10.0, 300.0, 0.0, 0.0]),
        finished=jnp.array([False, False, False, False, False, True, False, False]),
    )
    active = jnp.array([True] * 6 + [False, False])
    # Finished first; equal progress goes to the lower index; inactive cars last.
    np.testing.assert_array_equal(np.asarray(ranks(cars, active)), [5, 2, 3, 4, 6, 1, 7, 8])

    length = 1000.0
    cars = state.cars._replace(
        progress=jnp.array([1010.0, 990.0, 2005.0, -5.0, 0.0, 0.0, 0.0, 0.0]),
        laps=jnp.array([0, 0, 1, 0, 0, 0, 0, 0], jnp.int32),
        lap_start=jnp.array([0.0, 0.0, 30.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
    )
    prev = jnp.array([990.0, 980.0, 1995.0, -15.0, 0.0, 0.0, 0.0, 0.0])
    out = lap_bookkeeping(cars, prev, jnp.float32(60.0), 0.1, jnp.float32(length), jnp.int32(2))
    np.testing.assert_array_equal(np.asarray(out.laps[:4]), [1, 0, 2, 0])
    # Car 0 crossed halfway through the step; car 2 finished its second lap.
    np.testing.assert_allclose(float(out.last_lap[0]), 60.05, rtol=1e-6)
    np.testing.assert_allclose(float(out.last_lap[2]), 30.05, rtol=1e-6)
    assert bool(out.finished[2]) and not bool(out.finished[0])
    np.testing.assert_allclose(float(out.finish_time[2]), 60.05, rtol=1e-6)
    np.testing.assert_allclose(float(out.best_lap[0]), 60.05, rtol=1e-6)


def test_params_vmap_over_tracks_and_skills():
    tracks = stack_tracks([builtin_track("club"), builtin_track("oval")])
    env, params = jaxrace.make(track=tracks, num_opponents=1)
    index = jnp.array([0, 1, 1])
    batched = params.replace(track_index=index)
    axes = jax.tree.map(lambda _: None, params).replace(track_index=0)
    _, state = jax.jit(jax.vmap(env.reset, in_axes=(None, axes)))(jax.random.key(0), batched)
    np.testing.assert_array_equal(np.asarray(state.track_index), [0, 1, 1])
    lengths = np.asarray(tracks.length)[[0, 1, 1]]
    np.testing.assert_allclose(np.asarray(state.view.lap_progress) * lengths,
                               np.asarray(state.cars.arc[:, 0]), rtol=1e-5)
    # track_index = -1 draws a track at every reset.
    _, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(jax.random.key(1), 32),
                                                        params.replace(track_index=jnp.int32(-1)))
    assert set(np.asarray(states.track_index).tolist()) == {0, 1}


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_opponents=20), ValueError, r"num_opponents must be in \[0, 19\]"),
        (dict(start="rolling"), ValueError, "start must be one of"),
        (dict(track="monaco"), ValueError, "unknown track 'monaco'"),
        (dict(time_limt=3.0), TypeError, "unknown EnvParams field.*time_limt"),
        (dict(start="time_trial", num_opponents=3), ValueError, "time_trial"),
    ],
)
def test_bad_configuration_is_rejected_clearly(kwargs, error, match):
    with pytest.raises(error, match=match):
        jaxrace.make(**kwargs)


def test_static_params_are_hashable():
    assert hash(StaticParams()) == hash(StaticParams())


def test_the_env_reads_the_reward_api_without_loading_the_compiler():
    import subprocess
    import sys

    code = ("import sys, jaxrace, jaxrace.envs.rollouts, jaxrace.envs.video; "
            "print(sorted(m for m in sys.modules if m.startswith('jaxrace.rewards')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "['jaxrace.rewards', 'jaxrace.rewards.api']", out.stdout


def test_onset_steps_are_the_transitions_count_onsets_counts():
    from jaxrace.envs.rollouts import count_onsets, onset_steps

    flag = np.array([True, True, False, True, False, False, True, True])
    np.testing.assert_array_equal(onset_steps(flag), [0, 3, 6])
    assert count_onsets(flag) == 3 and onset_steps(np.zeros(4, bool)).size == 0
    with pytest.raises(ValueError, match="1-D flag"):
        onset_steps(np.zeros((3, 2), bool))
