"""The brax and gymnasium adapters of the race env."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax.envs.wrappers import training as brax_training
from brax.training.agents.ppo import networks as ppo_networks
from brax.training.agents.ppo import train as ppo
from gymnasium.vector import AutoresetMode

import jaxrace
from jaxrace.envs.adapters.brax_env import BraxRaceEnv, brax_training_compat
from jaxrace.envs.adapters.gym_vector import GymVectorRaceEnv

TIME_LIMIT = 0.45  # s: the race's time limit ends every episode after its 5th 0.1 s step
LIMIT_STEPS = 5
PREV_ACTION = slice(7, 9)  # the previous action inside obs["proprio"] (zero at a start)


# ---------------------------------------------------------------------- brax


@pytest.fixture(scope="module")
def brax_env():
    return BraxRaceEnv(track="oval", start="time_trial", time_limit=TIME_LIMIT)


def test_construction_from_env_and_params_or_make_kwargs():
    env, params = jaxrace.make("race", track="oval", start="time_trial")
    adapter = BraxRaceEnv(env, params)
    assert adapter.race_env is env and adapter.params is params
    assert adapter.observation_size == sum(shape[0] for shape in env.observation_shapes().values())
    assert adapter.action_size == 2
    gym_env = GymVectorRaceEnv(2, env, params)
    assert gym_env.single_observation_space["privileged"].shape == env.observation_shapes()["privileged"]
    with pytest.raises(TypeError, match="not a mix"):
        BraxRaceEnv(env)
    with pytest.raises(TypeError, match="not a mix"):
        GymVectorRaceEnv(2, env, params, track="oval")
    with pytest.raises(ValueError, match="num_envs"):
        GymVectorRaceEnv(0, env, params)


def test_brax_reset_and_step_jit_and_truncate_at_the_time_limit(brax_env):
    reset, step = jax.jit(brax_env.reset), jax.jit(brax_env.step)
    state = reset(jax.random.PRNGKey(0))
    race_obs = jax.jit(brax_env.race_env.observation)(state.pipeline_state, brax_env.params)
    assert state.obs.shape == (brax_env.observation_size,) and state.obs.dtype == jnp.float32
    np.testing.assert_array_equal(state.obs, jnp.concatenate([race_obs["proprio"], race_obs["privileged"]]))

    full_throttle = jnp.array([0.0, 1.0])
    for i in range(1, LIMIT_STEPS + 1):
        prev_progress = state.pipeline_state.view.progress
        state = step(state, full_throttle)
        assert state.obs.shape == (brax_env.observation_size,)
        assert float(state.pipeline_state.time) == pytest.approx(0.1 * i)
        assert state.reward > 0  # the car pulls away
        np.testing.assert_allclose(state.metrics["progress"], state.pipeline_state.view.progress - prev_progress)
        np.testing.assert_allclose(state.metrics["speed_per_step"], state.pipeline_state.view.speed)
        ended = float(i == LIMIT_STEPS)
        assert (float(state.done), float(state.info["truncation"]), float(state.info["time_out"])) == (ended,) * 3


def test_brax_training_wrappers_truncate_and_reset(brax_env):
    """EpisodeWrapper's shorter episode_length ends episodes first; AutoResetWrapper restarts them."""
    episode_length, num_envs = 3, 2
    env = brax_training.EvalWrapper(brax_training.wrap(brax_env, episode_length=episode_length))
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    first = reset(jax.random.split(jax.random.PRNGKey(1), num_envs))
    state, total_reward = first, 0.0
    for i in range(1, episode_length + 1):
        state = step(state, jnp.tile(jnp.array([0.0, 1.0]), (num_envs, 1)))
        total_reward = total_reward + state.reward
        ended = float(i == episode_length)
        np.testing.assert_array_equal(state.done, ended)
        np.testing.assert_array_equal(state.info["truncation"], ended)
    np.testing.assert_array_equal(state.pipeline_state.time, 0.0)  # back at the start
    np.testing.assert_array_equal(state.obs, first.obs)
    episode = state.info["eval_metrics"].episode_metrics
    np.testing.assert_allclose(episode["progress"], total_reward, rtol=1e-5)
    assert np.all(np.asarray(total_reward) > 0)


@pytest.mark.slow
def test_brax_ppo_trains_through_the_adapter():
    env = BraxRaceEnv(track="oval", start="time_trial")
    network_factory = functools.partial(
        ppo_networks.make_ppo_networks, policy_hidden_layer_sizes=(16,), value_hidden_layer_sizes=(16,)
    )
    with brax_training_compat():
        make_policy, params, metrics = ppo.train(
            env, num_timesteps=2_000, episode_length=40, num_envs=4, batch_size=4, num_minibatches=4,
            unroll_length=10, num_updates_per_batch=1, num_evals=1, run_evals=False, num_eval_envs=1,
            network_factory=network_factory, learning_rate=3e-4, seed=0,
        )
    assert not hasattr(jax, "device_put_replicated") or jax.__version_info__ < (0, 10)  # jax left as it was
    assert {"training/policy_loss", "training/v_loss"} <= set(metrics)
    assert all(np.all(np.isfinite(value)) for value in metrics.values())

    obs = jax.jit(env.reset)(jax.random.PRNGKey(1)).obs
    for deterministic in (True, False):
        action, _ = jax.jit(make_policy(params, deterministic=deterministic))(obs, jax.random.PRNGKey(2))
        assert action.shape == (2,)
        assert np.all(np.abs(np.asarray(action)) <= 1.0)


# ---------------------------------------------------------------------- gymnasium


@pytest.fixture(scope="module")
def gym_env():
    return GymVectorRaceEnv(3, track="oval", start="random", num_opponents=0, time_limit=TIME_LIMIT)


def test_gym_spaces_and_outputs(gym_env):
    assert gym_env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert gym_env.single_action_space.shape == (2,) and gym_env.action_space.shape == (3, 2)
    assert gym_env.single_action_space.dtype == np.float32
    assert gym_env.observation_space["proprio"].shape == (3, 20)

    obs, info = gym_env.reset(seed=0)
    assert info == {}
    assert gym_env.observation_space.contains(obs)
    for name, space in gym_env.single_observation_space.items():
        assert obs[name].shape == (3, *space.shape) and obs[name].dtype == np.float32

    gym_env.action_space.seed(0)
    obs, rewards, terminations, truncations, infos = gym_env.step(gym_env.action_space.sample())
    assert gym_env.observation_space.contains(obs)
    assert rewards.shape == (3,) and rewards.dtype == np.float32 and np.all(np.isfinite(rewards))
    assert terminations.dtype == truncations.dtype == np.bool_
    assert not terminations.any() and not truncations.any() and infos == {}


def test_gym_seeding(gym_env):
    first, _ = gym_env.reset(seed=1)
    step_first = gym_env.step(np.full((3, 2), 0.5, np.float32))
    again, _ = gym_env.reset(seed=1)
    step_again = gym_env.step(np.full((3, 2), 0.5, np.float32))
    other, _ = gym_env.reset(seed=2)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
        np.testing.assert_array_equal(step_first[0][name], step_again[0][name])
        assert not np.allclose(first[name], other[name])
    assert not np.allclose(first["proprio"][0], first["proprio"][1])  # each env has its own start


def test_gym_rejects_a_wrong_action_shape(gym_env):
    gym_env.reset(seed=0)
    for actions in (np.zeros((2, 2)), np.zeros(2), np.zeros((3, 3))):
        with pytest.raises(ValueError, match="shape"):
            gym_env.step(actions)


def test_gym_time_limit_truncates_and_resets_in_the_same_step(gym_env):
    gym_env.reset(seed=3)
    actions = np.tile(np.array([0.3, 0.5], np.float32), (3, 1))
    for _ in range(LIMIT_STEPS - 1):
        _, _, terminations, truncations, infos = gym_env.step(actions)
        assert not truncations.any() and not terminations.any() and infos == {}

    obs, _, terminations, truncations, infos = gym_env.step(actions)
    assert truncations.all() and not terminations.any()
    assert infos["_final_obs"].all() and infos["_final_info"].all()
    np.testing.assert_allclose(infos["final_info"]["time"], 0.1 * LIMIT_STEPS)
    for i in range(3):
        final = infos["final_obs"][i]
        assert gym_env.single_observation_space.contains(final)
        np.testing.assert_allclose(final["proprio"][PREV_ACTION], [0.3, 0.5])
        np.testing.assert_array_equal(obs["proprio"][i, PREV_ACTION], 0.0)  # a fresh episode
        assert not np.allclose(final["privileged"], obs["privileged"][i])

    _, _, _, truncations, infos = gym_env.step(actions)
    assert not truncations.any() and infos == {}  # the time limit counts from the new start
