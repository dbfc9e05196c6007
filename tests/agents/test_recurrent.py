"""Recurrent replay: sequences, burn-in, stored GRU state, and re-initialisation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrace
from jaxrace.agents import HParams, TrainConfig, make_train, runner
from jaxrace.agents.networks import NetworkConfig
from jaxrace.agents.runner import committed
from jaxrace.rewards import RewardBank, library_reward

BURN_IN, TRAIN_LENGTH, N_STEP = 3, 4, 2


def recurrent_trainer(**config_changes):
    # A 1.5 s time limit: 15 steps per episode, so sampled sequences cross episode ends.
    env, params = jaxrace.make(track="oval", start="time_trial", time_limit=1.5)
    bank = RewardBank.from_compiled([library_reward("progress")])
    net = NetworkConfig(recurrent=True, hidden=32, gru_size=8, num_quantiles=4)
    # A replay of 16 steps per env (the minimum for 8-step rollouts of 8-step sequences),
    # written over 3 times in 6 epochs.
    config = TrainConfig(network=net, num_envs=2, rollout_steps=8, updates_per_epoch=1, batch_size=8,
                         replay_size=24, n_step=N_STEP, burn_in=BURN_IN, train_length=TRAIN_LENGTH,
                         warmup_epochs=2, epochs=6)
    return make_train(dataclasses.replace(config, **config_changes), env, params, bank)


@pytest.fixture(scope="module")
def trainer():
    return recurrent_trainer()


@pytest.fixture(scope="module")
def trained(trainer):
    state, _ = jax.jit(lambda k: trainer.train(k, HParams(), 0))(jax.random.key(0))
    return state


def test_sequence_length_is_burn_in_plus_trained_steps_plus_the_n_step_tail(trainer):
    assert trainer.config.sequence_length == BURN_IN + TRAIN_LENGTH + N_STEP - 1
    flat = TrainConfig(network=NetworkConfig(recurrent=False), n_step=3, burn_in=16, train_length=32)
    assert (flat.sequence_length, flat.burn_in_steps, flat.trained_steps, flat.carry_size) == (3, 0, 1, 0)


def test_replayed_sequences_are_contiguous_and_flag_every_episode_start(trainer, trained):
    batch = jax.tree.map(np.asarray, jax.jit(trainer.sample)(trained.replay, jax.random.key(1)))
    assert batch.action.shape == (8, trainer.config.sequence_length, 2)
    assert batch.carry.shape == (8, trainer.config.sequence_length, 8)
    ends = batch.terminated | batch.truncated
    assert ends.any(), "the short time limit should put episode ends inside the sequences"
    # Inside an episode a step continues the previous one; after an end the next step is a reset.
    np.testing.assert_array_equal(batch.reset[:, 1:], ends[:, :-1])
    going_on = ~ends[:, :-1]
    for name, obs in batch.obs.items():  # the observation after a step is the next step's
        np.testing.assert_array_equal(batch.next_obs[name][:, :-1][going_on], obs[:, 1:][going_on])
    # Each step's reward was stored at collection: progress in metres, moving forward on average.
    assert batch.reward.dtype == np.float32 and np.all(np.isfinite(batch.reward))
    assert np.any(batch.reward != 0.0)


def test_the_burn_in_gets_no_gradient_and_the_trained_steps_do(trainer, trained):
    batch = jax.jit(trainer.sample)(trained.replay, jax.random.key(2))
    batch = batch._replace(reset=jnp.zeros_like(batch.reset))  # one episode: every step reaches the next

    def loss(obs, carry):
        out = trainer.loss_fn((trained.actor, trained.critic, trained.log_alpha), trained.target_critic,
                             batch._replace(obs=obs, carry=carry), HParams(), jax.random.key(3))
        return out.actor + out.critic

    d_obs, d_carry = jax.jit(jax.grad(loss, argnums=(0, 1)))(batch.obs, batch.carry)
    proprio = np.abs(np.asarray(d_obs["proprio"]))
    assert np.all(proprio[:, :BURN_IN] == 0.0)
    assert np.all(np.asarray(d_carry) == 0.0)
    assert np.all(proprio[:, BURN_IN:BURN_IN + TRAIN_LENGTH].sum(axis=(0, 2)) > 0.0)


def test_action_smoothing_adds_the_change_of_the_mean_action_between_consecutive_steps(trainer, trained):
    """TrainConfig.action_smoothness adds to the actor's loss the weight times the squared change of
    tanh(mean) from each trained step to the next, with the GRU state carried through: checked
    against one pass of the actor along sequences made of one episode each."""
    from jaxrace.agents.losses import action_change
    from jaxrace.agents.networks import Actor, actor_sequence

    batch = jax.jit(trainer.sample)(trained.replay, jax.random.key(2))
    no_end = jnp.zeros_like(batch.reset)
    # One episode per sequence: no reset, no end, and each step's next observation the next step's.
    next_obs = jax.tree.map(lambda x: jnp.concatenate([x[:, 1:], x[:, -1:]], axis=1), batch.obs)
    batch = batch._replace(reset=no_end, terminated=no_end, truncated=no_end, next_obs=next_obs)
    weight = 3.0
    smooth = recurrent_trainer(action_smoothness=weight)
    nets = (trained.actor, trained.critic, trained.log_alpha)
    plain, smoothed = (jax.jit(t.loss_fn)(nets, trained.target_critic, batch, HParams(), jax.random.key(3))
                       for t in (trainer, smooth))

    def means(seq):
        _, (_, (mean, _)) = actor_sequence(Actor(trainer.config.network), trained.actor, seq.carry[0], seq.obs,
                                           seq.reset)
        return mean[BURN_IN:BURN_IN + TRAIN_LENGTH + 1]  # the trained steps and the step after the last

    mean = jax.vmap(means)(batch)
    want = weight * jnp.mean(action_change(mean[:, :-1], mean[:, 1:]))
    assert float(want) > 1e-4  # an untrained actor does change its action from step to step
    np.testing.assert_allclose(smoothed.actor - plain.actor, want, rtol=1e-4)
    np.testing.assert_allclose(smoothed.critic, plain.critic, rtol=1e-6)


def test_the_acting_state_is_carried_across_epochs(trainer, trained):
    carry = np.asarray(trained.carry)
    assert carry.shape == (2, 8) and np.any(carry != 0.0)


def test_networks_are_reinitialised_on_schedule_and_replay_is_kept():
    env, params = jaxrace.make(track="oval", start="time_trial", time_limit=5.0)
    bank = RewardBank.from_compiled([library_reward("progress")])
    net = NetworkConfig(recurrent=False, hidden=16, num_quantiles=4)
    # Warm-up throughout: no updates, so the parameters change only by re-initialisation.
    config = TrainConfig(network=net, num_envs=2, rollout_steps=4, updates_per_epoch=1, batch_size=4,
                         replay_size=64, warmup_epochs=10, reinit_every=2, epochs=4)
    trainer = make_train(config, env, params, bank)
    init = committed(jax.jit(trainer.init)(jax.random.key(0), HParams(), 0))
    run = jax.jit(lambda s: trainer.run_epochs(s, HParams(), 0, 2))  # one compile for both calls
    two, _ = run(init)  # epochs 0 and 1: no re-initialisation yet
    four, _ = run(two)  # epoch 2 starts with one
    same = [np.array_equal(a, b) for a, b in zip(jax.tree.leaves(init.actor), jax.tree.leaves(two.actor), strict=True)]
    assert all(same)
    kernels = [(a, b) for a, b in zip(jax.tree.leaves(two.critic), jax.tree.leaves(four.critic), strict=True)
               if np.any(a != 0)]  # biases start at zero every time
    assert kernels and not any(np.array_equal(a, b) for a, b in kernels)
    np.testing.assert_array_equal(jax.tree.leaves(four.target_critic)[0], jax.tree.leaves(four.critic)[0])
    assert int(four.replay.current_index) == 16  # 4 epochs x 4 steps: replay kept through the reset


def test_pixels_are_stored_once_as_uint8_and_the_next_frame_is_the_next_step():
    env, params = jaxrace.make(track="oval", start="time_trial", time_limit=0.5, pixels=True, image_size=(16, 16))
    bank = RewardBank.from_compiled([library_reward("progress")])
    net = NetworkConfig(actor_input="pixels", recurrent=False, hidden=16, cnn_channels=(4,), num_quantiles=4)
    config = TrainConfig(network=net, num_envs=2, rollout_steps=6, updates_per_epoch=1, batch_size=32,
                         replay_size=64, n_step=2, warmup_epochs=1, epochs=3)
    trainer = make_train(config, env, params, bank)
    assert config.sequence_length == 3  # n-step window plus the step holding the next frame
    state, metrics = jax.jit(lambda k: trainer.train(k, HParams(), 0))(jax.random.key(0))
    assert np.all(np.isfinite(np.asarray(metrics.critic_loss))) and not bool(metrics.failed[-1])
    stored = state.replay.experience
    assert stored.obs["pixels"].dtype == jnp.uint8 and "pixels" not in stored.next_obs
    batch = jax.tree.map(np.asarray, jax.jit(trainer.sample)(state.replay, jax.random.key(1)))
    frames = np.asarray(jax.jit(jax.vmap(trainer.next_frames, in_axes=(0, None)))(batch, jnp.arange(2)))
    ended = batch.terminated[:, :2] | batch.truncated[:, :2]
    assert ended.any() and (~ended).any()
    for b, i in zip(*np.nonzero(~ended), strict=True):
        np.testing.assert_array_equal(frames[b, i], batch.obs["pixels"][b, i + 1])
    for b, i in zip(*np.nonzero(ended), strict=True):  # the final frame is not rendered: the last one stands in
        np.testing.assert_array_equal(frames[b, i], batch.obs["pixels"][b, i])


def test_a_pixel_actor_needs_an_env_that_renders():
    env, params = jaxrace.make(track="oval", start="time_trial")
    bank = RewardBank.from_compiled([library_reward("progress")])
    with pytest.raises(ValueError, match="pixels=True"):
        make_train(TrainConfig(network=NetworkConfig(actor_input="pixels")), env, params, bank)



def test_vmapped_runs_make_no_batched_lapack_call(trainer):
    """jaxlib 0.10's CPU LAPACK kernels deadlock a 2-thread pool on two batched calls at once
    (networks.one_key_at_a_time): the 2-run init, and an epoch that re-initialises the
    networks, factorise one matrix per call (`num_batch_dims = "0"`)."""
    keys = jax.random.split(jax.random.key(0), 2)
    hparams = runner.per_run_hparams(HParams(), 2).replace(reward_params=None)
    reinit = recurrent_trainer(reinit_every=1)
    state = jax.eval_shape(jax.vmap(reinit.learner.init), keys, hparams)
    programs = {
        "init": jax.jit(jax.vmap(trainer.learner.init)).lower(keys, hparams),
        "epoch": jax.jit(jax.vmap(lambda s, h: reinit.run_epochs(s, h, jnp.int32(0), 1))).lower(state, hparams),
    }
    for name, lowered in programs.items():
        calls = [line for line in lowered.as_text().splitlines() if "custom_call @lapack_" in line]
        assert calls, f"{name}: expected the GRU's QR factorisations"
        for line in calls:
            assert 'num_batch_dims = "0"' in line, f"{name}: a batched LAPACK call: {line.strip()[:160]}"
