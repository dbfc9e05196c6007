"""A short QR-SAC run on the grand-prix circuit (the reference recipe, scaled down) learns to
drive well beyond an untrained one. The full targets (laps within 5%, races won) are for
experiments/train_reference.py; this guards the recipe against regressions on a real layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrace
from jaxrace.agents import HParams, TrainConfig, make_train
from jaxrace.agents.evaluation import evaluate
from jaxrace.agents.networks import NetworkConfig
from jaxrace.envs import builtin_track, per_env_params, reference_lap_time
from jaxrace.rewards import RewardBank, library_reward


@pytest.mark.slow
def test_a_short_run_on_gp_drives_far_beyond_a_random_policy():
    ref_lap = float(reference_lap_time(builtin_track("gp")))
    env, params = jaxrace.make(
        track="gp", start="random", laps=1000, time_limit=1.6 * ref_lap, terminate_on_course_out=True
    )
    params = params.replace(
        skill=jnp.full((env.static.num_cars,), 0.9, jnp.float32), car=params.car.replace(steer_lock_speed=20.0)
    )
    # half the envs alone, half in a pack of 7 AI cars
    params = per_env_params(params, 8, num_active_opponents=[0] * 4 + [7] * 4, random_start_gap=[0.0] * 4 + [25.0] * 4)
    config = TrainConfig(
        network=NetworkConfig(recurrent=False, hidden=64),
        num_envs=8,
        rollout_steps=8,
        updates_per_epoch=8,
        batch_size=128,
        replay_size=40_000,
        n_step=5,
        warmup_epochs=4,
        epochs=240,
    )
    bank = RewardBank.from_compiled([library_reward("gt_sophy")])
    trainer = make_train(config, env, params, bank)
    hparams = HParams(reward_scale=0.1, reward_params=jnp.asarray(bank.params_matrix([{}])[0]))
    k_train, k_race = jax.random.split(jax.random.key(1))
    untrained = jax.jit(trainer.init)(k_train, hparams, 0)
    trained, _ = jax.jit(lambda s: trainer.run_epochs(s, hparams, 0, config.epochs))(untrained)
    assert not bool(trained.failed)

    # 30 s alone from a standing start, deterministic: the trained policy and the
    # untrained one (what a random network does) side by side as two runs.
    tt_env, tt_params = jaxrace.make(track="gp", start="grid_back", laps=2, num_active_opponents=0)
    tt_params = tt_params.replace(skill=jnp.full((tt_env.static.num_cars,), 0.9, jnp.float32),
                                  car=tt_params.car.replace(steer_lock_speed=20.0))
    actors = jax.tree.map(lambda a, b: jnp.stack([a, b]), trained.actor, untrained.actor)
    race = evaluate(trainer, actors, tt_env, tt_params, k_race, num_steps=300)
    progress = np.asarray(race.states.cars.progress[:, 0, :, 0])  # (run, T + 1) of the ego car
    trained_m, untrained_m = progress[:, -1] - progress[:, 0]
    assert trained_m > 400 and trained_m > 4 * max(untrained_m, 0.0), (trained_m, untrained_m)
