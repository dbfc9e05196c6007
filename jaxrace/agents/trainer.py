"""QR-SAC training of many runs in one jitted job: vmap over candidates, seeds and hparams.

`make_learner(config, env, env_params)` builds the pure functions that do not depend on
any reward (acting, replay, the QR-SAC update); `make_train(..., bank)` (or
`Trainer.with_bank`) adds a reward bank. An epoch is three pieces:
`collect(state) -> (state, Collected)` drives the envs; `label(Collected, reward_index,
reward_params) -> f32[num_envs, rollout_steps]` computes the run's rewards (the only
piece that reads the bank); `learn(state, hparams, Collected, rewards)` stores the
labelled transitions and runs the updates (`store`, a scan of `update`, `finish`; the
runner can call `update` from a host loop instead, `TrainConfig.host_updates`).
`Trainer.run_epochs` fuses them into one
scan; `runner.train_many` can also jit them separately, so that only the small `label`
program is compiled again for a new bank (see the README's compile-time table).

Replay stores each transition's reward, computed by the bank once at collection (the
run's weights are fixed for its whole run), never the RaceViews it came from.

Failure isolation: a run whose losses or rewards go non-finite (or huge) is marked
failed and frozen (its parameters stop changing); vmapped runs never mix, so the
others are exactly what they would be without it.

Pixels (`NetworkConfig(actor_input="pixels")`, an env made with `pixels=True`): each
uint8 image is stored once, with its step. The image after a step is the next step's;
after an episode end, whose final image is not rendered, the actor bootstraps from the
last image of the episode (the critic's privileged inputs are exact there).

Recurrent replay (`NetworkConfig(recurrent=True)`): replay samples sequences of
`burn_in + train_length + n_step - 1` steps. Each stored step keeps the actor's GRU
state from collection and a reset flag (first step of an episode, where the actor
zeroes its state). The actor replays the burn-in steps from the stored state without
gradients, then trains on the next `train_length` steps by backpropagation through
time; the last `n_step - 1` steps only feed the n-step targets. The feed-forward
actor is the special case burn-in 0, train length 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flashbax.buffers.trajectory_buffer import TrajectoryBufferState
from flax import struct
from flax.typing import VariableDict

from jaxrace.agents.acting import Rollout, make_acting
from jaxrace.agents.config import HParams, TrainConfig
from jaxrace.agents.losses import make_losses
from jaxrace.agents.networks import Actor, TwinCritic, initial_carry
from jaxrace.agents.replay import Transition, make_replay, make_sampler, next_frames
from jaxrace.envs.state import EnvParams, EnvState
from jaxrace.rewards.api import Action, RaceView
from jaxrace.rewards.bank import RewardBank

HUGE_REWARD = 1e6  # a sampled reward beyond this marks the run failed
# The TrainState fields a gradient update writes. Selecting between two states (a failed update,
# a warm-up epoch's discarded updates) touches only these: a select over the whole state would
# also copy the replay buffer, which XLA cannot always see is the same on both sides.
UPDATED_FIELDS = ("actor", "critic", "target_critic", "log_alpha", "actor_opt", "critic_opt", "alpha_opt", "key",
                  "failed", "average_actor")


@struct.dataclass
class TrainState:
    """One run's whole state: networks, optimisers, the acting envs, replay, its key."""

    actor: VariableDict
    critic: VariableDict
    target_critic: VariableDict
    log_alpha: jax.Array
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    alpha_opt: optax.OptState
    env_state: EnvState
    obs: dict
    carry: jax.Array  # f32[num_envs, G] the acting actor's GRU state
    reset: jax.Array  # bool[num_envs] the next step starts an episode
    replay: TrajectoryBufferState
    key: jax.Array
    epoch: jax.Array
    failed: jax.Array  # bool: frozen after a non-finite loss or a huge reward
    average_actor: VariableDict | None = None  # the actor's moving average (TrainConfig.actor_average), or None

    @property
    def policy_actor(self) -> VariableDict:
        """The actor to evaluate, select and save: the average when there is one."""
        return self.actor if self.average_actor is None else self.average_actor


class Metrics(NamedTuple):
    """Per epoch (stacked over epochs by run_epochs)."""

    reward: jax.Array  # mean candidate reward per step in the epoch's rollouts
    progress: jax.Array  # mean metres of progress per step in the rollouts
    critic_loss: jax.Array
    actor_loss: jax.Array
    alpha: jax.Array
    failed: jax.Array


class Collected(NamedTuple):
    """One epoch's rollout before labelling ([num_envs, rollout_steps] each)."""

    transitions: Transition  # reward still 0: `label` computes it
    prev_view: RaceView  # the RaceView before each step
    view: RaceView  # and after it


@dataclasses.dataclass(frozen=True, eq=False)
class Learner:
    """The reward-free pure functions of one training configuration (hashable by identity).

    Jitted code closes over a Learner, so one Learner serves every reward bank: keep it
    (`Trainer.with_bank`) and the programs built from it are compiled once.
    """

    config: TrainConfig
    init: Callable  # (key, hparams) -> TrainState
    collect: Callable  # (state) -> (state, Collected)
    learn: Callable  # (state, hparams, Collected, rewards f32[n, T]) -> (state, Metrics): store, updates, finish
    store: Callable  # (state, Collected, rewards) -> state with the rollout in replay
    update: Callable  # (state, hparams) -> (state, (critic loss f32[], actor loss f32[])): one gradient update
    finish: Callable  # (stored, trained, Collected, rewards, losses f32[U] x2) -> (state, Metrics)
    policy: Callable  # (actor_params, carry f32[G], obs) -> (carry, action f32[2]), deterministic
    initial_carry: Callable  # () -> f32[G]
    loss_fn: Callable  # (nets, target_critic, batch, hparams, key) -> Losses
    sample: Callable  # (replay, key) -> Transition [batch_size, sequence_length]
    next_frames: Callable  # (sequence Transition [S], steps i32[T]) -> uint8[T, H, W, 3], pixels only
    restart_envs: Callable  # (state, key) -> state: every env starts a new episode under this learner's params


@dataclasses.dataclass(frozen=True, eq=False)
class Trainer:
    """A Learner and a reward bank: the whole epoch (hashable by identity: jit closes over it)."""

    learner: Learner
    bank: RewardBank
    config: TrainConfig  # the learner's, with this job's number of epochs

    @property
    def policy(self) -> Callable:
        return self.learner.policy

    @property
    def initial_carry(self) -> Callable:
        return self.learner.initial_carry

    @property
    def restart_envs(self) -> Callable:
        return self.learner.restart_envs

    @property
    def loss_fn(self) -> Callable:
        return self.learner.loss_fn

    @property
    def sample(self) -> Callable:
        return self.learner.sample

    @property
    def next_frames(self) -> Callable:
        return self.learner.next_frames

    def with_bank(self, bank: RewardBank, epochs: int | None = None) -> Trainer:
        """The same learner (and so the same compiled programs) with another bank."""
        config = self.config if epochs is None else dataclasses.replace(self.config, epochs=epochs)
        return Trainer(self.learner, bank, config)

    def reward(self, reward_index, reward_params, prev_view: RaceView, action, view: RaceView) -> jax.Array:
        """f32[]: candidate `reward_index`'s reward of one transition (action f32[2]) with its weights f32[P]."""
        return self.bank.evaluate(reward_index, prev_view, Action(steering=action[0], throttle_brake=action[1]),
                                  view, reward_params)[0]

    def label(self, collected: Collected, reward_index, reward_params) -> jax.Array:
        """f32[num_envs, rollout_steps]: the run's reward of every collected step."""
        def one(prev, action, view):
            return self.reward(reward_index, reward_params, prev, action, view)

        return jax.vmap(jax.vmap(one))(collected.prev_view, collected.transitions.action, collected.view)

    def reward_params(self, hparams: HParams, reward_index) -> jax.Array:
        """f32[P]: the run's weights (hparams.reward_params, or its candidate's defaults)."""
        if hparams.reward_params is not None:
            return jnp.asarray(hparams.reward_params, jnp.float32)
        return self.bank.default_params()[reward_index]

    def init(self, key, hparams: HParams, reward_index) -> TrainState:
        del reward_index  # a run's state does not depend on its reward
        return self.learner.init(key, hparams)

    def epoch(self, state: TrainState, hparams: HParams, reward_index) -> tuple[TrainState, Metrics]:
        state, collected = self.learner.collect(state)
        rewards = self.label(collected, reward_index, self.reward_params(hparams, reward_index))
        return self.learner.learn(state, hparams, collected, rewards)

    def run_epochs(self, state: TrainState, hparams: HParams, reward_index, num_epochs: int):
        """`num_epochs` (static) epochs in one scan; metrics stacked over them."""
        return jax.lax.scan(lambda s, _: self.epoch(s, hparams, reward_index), state, None, length=num_epochs)

    def train(self, key, hparams: HParams, reward_index):
        """A whole run: (final TrainState, Metrics stacked over config.epochs)."""
        return self.run_epochs(self.init(key, hparams, reward_index), hparams, reward_index, self.config.epochs)


def _select(pred: jax.Array, old: TrainState, new: TrainState) -> TrainState:
    """`new` with each of `UPDATED_FIELDS` taken from `old` where `pred` (a bool scalar) holds."""
    return new.replace(**{f: jax.tree.map(lambda a, b: jnp.where(pred, a, b), getattr(old, f), getattr(new, f))
                          for f in UPDATED_FIELDS})


def _adam():
    return optax.inject_hyperparams(optax.adam)(learning_rate=0.0)


def _with_lr(opt_state, lr):
    opt_state.hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
    return opt_state


def make_train(config: TrainConfig, env, env_params: EnvParams, bank: RewardBank) -> Trainer:
    """A Trainer for `env` with rewards from `bank` (see `make_learner` for env_params)."""
    return Trainer(make_learner(config, env, env_params), bank, config)


def make_learner(config: TrainConfig, env, env_params: EnvParams) -> Learner:
    """Builds the reward-free training functions for `env`.

    `env_params` is shared by all envs, or has a leading axis of config.num_envs
    (from `jaxrace.envs.per_env_params`) to give each env its own scenario.
    """
    net = config.network
    if net.actor_input == "pixels" and not env.static.pixels:
        raise ValueError("NetworkConfig(actor_input='pixels') needs an env that renders: "
                         "jaxrace.make(..., pixels=True)")
    actor, critic = Actor(net), TwinCritic(net)
    acting = make_acting(config, env, env_params, actor)
    buffer = make_replay(config)
    sample = make_sampler(config, buffer)
    carry0 = initial_carry(net)
    no_reset = jnp.zeros((), bool)
    loss_fn = make_losses(config, actor, critic)

    def new_networks(key, one_obs):
        k_actor, k_critic = jax.random.split(key)
        actor_params = actor.init(k_actor, carry0, one_obs, no_reset)
        critic_params = critic.init(k_critic, one_obs, jnp.zeros(2))
        opt = _adam()
        return dict(actor=actor_params, critic=critic_params, target_critic=critic_params,
                    actor_opt=opt.init(actor_params), critic_opt=opt.init(critic_params),
                    average_actor=jax.tree.map(jnp.copy, actor_params) if config.actor_average else None)

    def init(key, hparams: HParams) -> TrainState:
        k_nets, k_env, k_run = jax.random.split(key, 3)
        rollout = acting.reset(k_env)
        one_obs = jax.tree.map(lambda x: x[0], rollout.obs)
        log_alpha = jnp.log(jnp.asarray(hparams.initial_alpha, jnp.float32))
        example = Transition(obs=one_obs, action=jnp.zeros(2), reward=jnp.float32(0.0),
                             next_obs={k: v for k, v in one_obs.items() if k != "pixels"},
                             terminated=jnp.bool_(False), truncated=jnp.bool_(False), carry=carry0,
                             reset=jnp.bool_(True))
        return TrainState(
            **new_networks(k_nets, one_obs), log_alpha=log_alpha, alpha_opt=_adam().init(log_alpha),
            env_state=rollout.env_state, obs=rollout.obs, carry=rollout.carry, reset=rollout.reset,
            replay=buffer.init(example), key=k_run, epoch=jnp.int32(0), failed=jnp.bool_(False))

    def update(state: TrainState, hparams: HParams):
        key, k_sample, k_loss = jax.random.split(state.key, 3)
        batch = sample(state.replay, k_sample)  # [batch_size, sequence_length]

        def objective(nets):
            out = loss_fn(nets, state.target_critic, batch, hparams, k_loss)
            return out.critic + out.actor + out.alpha, out

        (_, out), (actor_grad, critic_grad, alpha_grad) = jax.value_and_grad(objective, has_aux=True)(
            (state.actor, state.critic, state.log_alpha))

        opt = _adam()
        c_up, c_opt = opt.update(critic_grad, _with_lr(state.critic_opt, hparams.critic_lr))
        a_up, a_opt = opt.update(actor_grad, _with_lr(state.actor_opt, hparams.actor_lr))
        l_up, l_opt = opt.update(alpha_grad, _with_lr(state.alpha_opt, hparams.alpha_lr))
        critic_params = optax.apply_updates(state.critic, c_up)
        target = optax.incremental_update(critic_params, state.target_critic, hparams.tau)
        actor_params = optax.apply_updates(state.actor, a_up)
        average = (None if state.average_actor is None
                   else optax.incremental_update(actor_params, state.average_actor, config.actor_average))
        log_alpha = optax.apply_updates(state.log_alpha, l_up)
        # the actor held (HParams.actor_hold_epochs): the critics alone learn
        hold = state.epoch < config.warmup_epochs + hparams.actor_hold_epochs
        actor_params, a_opt, average, log_alpha, l_opt = jax.tree.map(
            lambda old, up: jnp.where(hold, old, up),
            (state.actor, state.actor_opt, state.average_actor, state.log_alpha, state.alpha_opt),
            (actor_params, a_opt, average, log_alpha, l_opt))
        new = state.replace(actor=actor_params, critic=critic_params, target_critic=target,
                            log_alpha=log_alpha, actor_opt=a_opt, critic_opt=c_opt,
                            alpha_opt=l_opt, key=key, average_actor=average)
        bad = ~(jnp.isfinite(out.critic) & jnp.isfinite(out.actor)) | ~(out.max_abs_reward < HUGE_REWARD)
        failed = state.failed | bad
        # A failed run keeps its last good parameters (frozen); only its key moves on.
        new = _select(failed, state, new)
        return new.replace(failed=failed, key=key), (out.critic, out.actor)

    def restart_envs(state: TrainState, key) -> TrainState:
        """Every env starts a new episode under this learner's env params; networks, replay and key kept.

        A curriculum hands a state trained under other per-env params (say, every env
        alone) to a learner of the same config with new ones (traffic): the state's shapes
        do not depend on the params' values. The cut episodes' last stored transitions are
        not marked truncated, so one n-step window per env can run across the restart.
        """
        rollout = acting.reset(key)
        return state.replace(env_state=rollout.env_state, obs=rollout.obs, carry=rollout.carry, reset=rollout.reset)

    def reinitialise(state: TrainState) -> TrainState:
        """Fresh networks and optimiser states (primacy bias; the average restarts too); replay, temperature
        and envs kept."""
        key, k_nets = jax.random.split(state.key)
        one_obs = jax.tree.map(lambda x: x[0], state.obs)
        return state.replace(**new_networks(k_nets, one_obs), key=key)

    def collect(state: TrainState) -> tuple[TrainState, Collected]:
        """The epoch's rollout (after a scheduled re-initialisation); uniform actions during warm-up."""
        if config.reinit_every:
            due = (state.epoch > 0) & (state.epoch % config.reinit_every == 0) & ~state.failed
            fresh = reinitialise(state)
            state = _select(due, fresh, state)
        key, k_roll = jax.random.split(state.key)
        start = Rollout(state.env_state, state.obs, state.carry, state.reset)
        rollout, traj, (prev_view, view) = acting.collect(state.actor, start, k_roll,
                                                          state.epoch < config.warmup_epochs)
        state = state.replace(env_state=rollout.env_state, obs=rollout.obs, carry=rollout.carry,
                              reset=rollout.reset, key=key)
        return state, Collected(traj, prev_view, view)

    def store(state: TrainState, collected: Collected, rewards) -> TrainState:
        """The labelled rollout into replay."""
        traj = collected.transitions._replace(reward=jnp.asarray(rewards, jnp.float32))
        return state.replace(replay=buffer.add(state.replay, traj))

    def finish(stored: TrainState, trained: TrainState, collected: Collected, rewards,
               losses) -> tuple[TrainState, Metrics]:
        """The epoch's end: `trained` (or `stored`, untouched, during warm-up) and its metrics.

        losses: (critic f32[U], actor f32[U]) of the epoch's updates; reported as 0 during
        warm-up, whose updates are discarded.
        """
        random_actions = stored.epoch < config.warmup_epochs
        state = _select(random_actions, stored, trained)
        progress = collected.view.progress - collected.prev_view.progress
        c_loss, a_loss = (jnp.where(random_actions, 0.0, jnp.mean(x)) for x in losses)
        metrics = Metrics(reward=jnp.mean(jnp.asarray(rewards, jnp.float32)), progress=jnp.mean(progress),
                          critic_loss=c_loss, actor_loss=a_loss, alpha=jnp.exp(state.log_alpha), failed=state.failed)
        return state.replace(epoch=state.epoch + 1), metrics

    def learn(state: TrainState, hparams: HParams, collected: Collected, rewards) -> tuple[TrainState, Metrics]:
        """Stores the labelled rollout, then `updates_per_epoch` updates (none during warm-up) in a scan."""
        stored = store(state, collected, rewards)
        trained, losses = jax.lax.scan(lambda s, _: update(s, hparams), stored, None,
                                       length=config.updates_per_epoch)
        return finish(stored, trained, collected, rewards, losses)

    return Learner(config=config, init=init, collect=collect, learn=learn, store=store, update=update,
                   finish=finish, policy=acting.policy,
                   initial_carry=lambda: carry0, loss_fn=loss_fn,
                   sample=sample, next_frames=next_frames,
                   restart_envs=restart_envs)
