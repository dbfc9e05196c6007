"""QR-SAC training of many runs in one jitted job: vmap over candidates, seeds and hparams.

`make_train(config, env, env_params, bank)` returns a `Trainer` of pure functions:
`init(key, hparams, reward_index) -> TrainState` and `run_epochs(state, hparams,
reward_index) -> (state, metrics)`, which the host jits and calls in chunks (progress
bars, metrics, checkpoints between chunks). `train` is the whole run in one call.
vmap `init` and `run_epochs` over a leading run axis to train N runs in one program.

Replay stores observations, actions and RaceViews, never rewards: a run's reward is
computed by the reward bank (`bank.evaluate(reward_index, ...)`) when a batch is
sampled, which is what lets N candidate rewards share one pipeline.

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
import functools
from pathlib import Path
from typing import Any, NamedTuple

import flashbax
import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrace.agents import losses
from jaxrace.agents.checkpoint import load_checkpoint, save_checkpoint
from jaxrace.agents.networks import Actor, NetworkConfig, TwinCritic, action_distribution, deterministic_action
from jaxrace.rewards.api import Action, RaceView
from jaxrace.rewards.bank import RewardBank

HUGE_REWARD = 1e6  # a sampled reward beyond this marks the run failed


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Static training configuration (shapes and loop lengths)."""

    network: NetworkConfig = NetworkConfig(recurrent=False)
    num_envs: int = 16
    rollout_steps: int = 8  # env steps per env per epoch
    updates_per_epoch: int = 8
    batch_size: int = 128
    replay_size: int = 50_000  # transitions
    n_step: int = 3
    warmup_epochs: int = 2  # uniform random actions, no updates
    epochs: int = 100
    burn_in: int = 16  # recurrent actor only: replayed steps that warm the GRU state, no gradients
    train_length: int = 32  # recurrent actor only: trained steps per sampled sequence
    reinit_every: int = 0  # epochs between re-initialisations of the networks (primacy bias); 0: never

    def __post_init__(self):
        positive = ("n_step", "num_envs", "rollout_steps", "batch_size", "train_length")
        if any(getattr(self, name) < 1 for name in positive):
            raise ValueError(f"{', '.join(positive)} must be positive: got "
                             + ", ".join(f"{n}={getattr(self, n)}" for n in positive))
        if self.burn_in < 0 or self.reinit_every < 0:
            raise ValueError(f"burn_in and reinit_every must be >= 0: got {self.burn_in}, {self.reinit_every}")

    @property
    def trained_steps(self) -> int:
        """Steps per sampled sequence that get losses (1 for the feed-forward actor)."""
        return self.train_length if self.network.recurrent else 1

    @property
    def burn_in_steps(self) -> int:
        return self.burn_in if self.network.recurrent else 0

    @property
    def sequence_length(self) -> int:
        """Steps per sampled replay sequence: burn-in, trained steps, n-step tail.

        With pixels one more step: its image is the next frame of the last bootstrap step.
        """
        pixels = self.network.actor_input == "pixels"
        return self.burn_in_steps + self.trained_steps + self.n_step - 1 + pixels

    @property
    def carry_size(self) -> int:
        """The actor's recurrent state per env (0 without a GRU: nothing stored)."""
        return self.network.gru_size if self.network.recurrent else 0


@struct.dataclass
class HParams:
    """Traced hyperparameters of one run (vmap over them for a sweep)."""

    actor_lr: jax.Array = 3e-4
    critic_lr: jax.Array = 3e-4
    alpha_lr: jax.Array = 3e-4
    discount: jax.Array = 0.99
    target_entropy: jax.Array = -2.0
    tau: jax.Array = 0.005  # polyak rate of the target critics
    initial_alpha: jax.Array = 0.1
    reward_scale: jax.Array = 1.0  # the critic learns scale * reward (keeps returns near O(10-100))
    reward_params: jax.Array | None = None  # f32[P] the candidate's PARAMS (None: its defaults)


class Transition(NamedTuple):
    """One env step of one env, as stored in replay."""

    obs: dict
    action: jax.Array  # f32[2]
    prev_view: RaceView
    view: RaceView
    next_obs: dict  # the true next observation (the final one at an episode end), without pixels
    terminated: jax.Array
    truncated: jax.Array
    carry: jax.Array  # f32[G] the actor's GRU state before this step (G = 0 without a GRU)
    reset: jax.Array  # bool: the first step of an episode (the actor zeroes `carry`)


@struct.dataclass
class TrainState:
    actor: Any
    critic: Any
    target_critic: Any
    log_alpha: jax.Array
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any
    env_state: Any
    obs: dict
    carry: jax.Array  # f32[num_envs, G] the acting actor's GRU state
    reset: jax.Array  # bool[num_envs] the next step starts an episode
    replay: Any
    key: jax.Array
    epoch: jax.Array
    failed: jax.Array  # bool: frozen after a non-finite loss or a huge reward
    reward_params: jax.Array


class Metrics(NamedTuple):
    """Per epoch (stacked over epochs by run_epochs)."""

    reward: jax.Array  # mean candidate reward per step in the epoch's rollouts
    progress: jax.Array  # mean metres of progress per step in the rollouts
    critic_loss: jax.Array
    actor_loss: jax.Array
    alpha: jax.Array
    failed: jax.Array


@dataclasses.dataclass(frozen=True)
class Trainer:
    config: TrainConfig
    init: Any
    run_epochs: Any
    train: Any
    policy: Any  # (actor_params, carry f32[G], obs) -> (carry, action f32[2]), deterministic
    initial_carry: Any  # () -> f32[G]
    losses: Any  # (nets, target_critic, batch, reward_index, reward_params, hparams, key) -> Losses
    sample: Any  # (replay, key) -> Transition [batch_size, sequence_length]
    next_frames: Any  # (sequence Transition [S], steps i32[T]) -> uint8[T, H, W, 3], pixels only
    reward: Any  # (reward_index i32[], reward_params f32[P], prev RaceView, action f32[2], view) -> f32[]


def _adam():
    return optax.inject_hyperparams(optax.adam)(learning_rate=0.0)


def _with_lr(opt_state, lr):
    opt_state.hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
    return opt_state


class Losses(NamedTuple):
    """Mean losses over a batch of sequences."""

    critic: jax.Array
    actor: jax.Array
    alpha: jax.Array
    max_abs_reward: jax.Array  # of the sampled (unscaled) rewards


def per_env_params(env_params, num_envs: int, **fields):
    """EnvParams with a leading env axis: each env of a trainer gets its own scenario.

    `fields` maps an EnvParams field to num_envs values, e.g.
    `num_active_opponents=[0] * 8 + [7] * 8` trains half the envs alone (time trials)
    and half in traffic. Every other field is broadcast.
    """
    def broadcast(x):
        return jnp.broadcast_to(x, (num_envs, *jnp.shape(x)))

    batched = jax.tree.map(broadcast, env_params)
    for name, values in fields.items():
        values = jnp.asarray(values, getattr(env_params, name).dtype)
        if values.shape[:1] != (num_envs,):
            raise ValueError(f"per_env_params: {name} needs {num_envs} values (one per env), got shape {values.shape}")
        batched = batched.replace(**{name: values})
    return batched


def make_train(config: TrainConfig, env, env_params, bank: RewardBank) -> Trainer:
    """Builds the pure training functions for `env` with rewards from `bank`.

    `env_params` is shared by all envs, or has a leading axis of config.num_envs
    (from `per_env_params`) to give each env its own scenario.
    """
    net = config.network
    pixels = net.actor_input == "pixels"
    if pixels and not env.static.pixels:
        raise ValueError("NetworkConfig(actor_input='pixels') needs an env that renders: "
                         "jaxrace.make(..., pixels=True)")
    actor, critic = Actor(net), TwinCritic(net)
    n = config.num_envs
    burn, trained, seq_len = config.burn_in_steps, config.trained_steps, config.sequence_length
    per_env = jnp.ndim(env_params.time_limit) == 1
    if per_env and env_params.time_limit.shape[0] != n:
        raise ValueError(f"env_params has a leading axis of {env_params.time_limit.shape[0]}, "
                         f"but config.num_envs is {n}")
    params_axis = 0 if per_env else None
    step_envs = jax.vmap(env.step, in_axes=(0, 0, 0, params_axis))
    reset_envs = jax.vmap(env.reset, in_axes=(0, params_axis))
    buffer = flashbax.make_trajectory_buffer(
        add_batch_size=n, sample_batch_size=config.batch_size, sample_sequence_length=seq_len, period=1,
        min_length_time_axis=max(seq_len, config.rollout_steps),
        max_length_time_axis=max(config.replay_size // n, config.rollout_steps + seq_len))
    carry0 = jnp.zeros((config.carry_size,), jnp.float32)
    no_reset = jnp.zeros((), bool)

    def actor_step(actor_params, carry, obs, reset):
        """One env: (carry f32[G], obs, reset bool) -> (carry, (mean, log_std))."""
        return actor.apply(actor_params, carry, obs, reset)

    def sample_action(mean, log_std, key):
        return action_distribution(mean, log_std).sample_and_log_prob(seed=key)

    def policy(actor_params, carry, obs):
        """Deterministic action for evaluation: tanh of the mean (one env)."""
        carry, (mean, _) = actor_step(actor_params, carry, obs, no_reset)
        return carry, deterministic_action(mean)

    def reward_of(reward_index, params, prev_view, action, view):
        # Every candidate's reward, then this run's: under the vmap over runs a switch on
        # the (batched) index computes every branch anyway, and its batching rule costs
        # seconds of tracing per call site.
        act_ = Action(steering=action[0], throttle_brake=action[1])
        index = jnp.clip(reward_index, 0, bank.num_rewards - 1)
        all_params = bank.default_params().at[index].set(params)
        return bank.evaluate_all(prev_view, act_, view, all_params)[0][index]

    def new_networks(key, one_obs):
        k_actor, k_critic = jax.random.split(key)
        actor_params = actor.init(k_actor, carry0, one_obs, no_reset)
        critic_params = critic.init(k_critic, one_obs, jnp.zeros(2))
        opt = _adam()
        return dict(actor=actor_params, critic=critic_params, target_critic=critic_params,
                    actor_opt=opt.init(actor_params), critic_opt=opt.init(critic_params))

    def init(key, hparams: HParams, reward_index) -> TrainState:
        k_nets, k_env, k_run = jax.random.split(key, 3)
        obs, env_state = reset_envs(jax.random.split(k_env, n), env_params)
        one_obs = jax.tree.map(lambda x: x[0], obs)
        log_alpha = jnp.log(jnp.asarray(hparams.initial_alpha, jnp.float32))
        view = jax.tree.map(lambda x: x[0], env_state.view)
        example = Transition(obs=one_obs, action=jnp.zeros(2), prev_view=view, view=view,
                             next_obs={k: v for k, v in one_obs.items() if k != "pixels"},
                             terminated=jnp.bool_(False), truncated=jnp.bool_(False), carry=carry0,
                             reset=jnp.bool_(True))
        params = bank.default_params()[reward_index] if hparams.reward_params is None else hparams.reward_params
        return TrainState(
            **new_networks(k_nets, one_obs), log_alpha=log_alpha, alpha_opt=_adam().init(log_alpha),
            env_state=env_state, obs=obs, carry=jnp.zeros((n, config.carry_size), jnp.float32),
            reset=jnp.ones((n,), bool), replay=buffer.init(example), key=k_run, epoch=jnp.int32(0),
            failed=jnp.bool_(False), reward_params=jnp.asarray(params, jnp.float32))

    def collect(state: TrainState, reward_index, random_actions):
        def body(carry, key):
            env_state, obs, h, reset = carry
            k_act, k_rand, k_env = jax.random.split(key, 3)
            h_next, (mean, log_std) = jax.vmap(actor_step, in_axes=(None, 0, 0, 0))(state.actor, h, obs, reset)
            action, _ = jax.vmap(sample_action)(mean, log_std, jax.random.split(k_act, n))
            uniform = jax.random.uniform(k_rand, (n, 2), minval=-1.0, maxval=1.0)
            action = jnp.where(random_actions, uniform, action)
            next_obs, next_state, _, terminated, truncated, info = step_envs(
                jax.random.split(k_env, n), env_state, action, env_params)
            transition = Transition(obs=obs, action=action, prev_view=env_state.view, view=info["view"],
                                    next_obs=info["final_observation"], terminated=terminated, truncated=truncated,
                                    carry=h, reset=reset)
            return (next_state, next_obs, h_next, terminated | truncated), transition

        key, k_roll = jax.random.split(state.key)
        start = (state.env_state, state.obs, state.carry, state.reset)
        (env_state, obs, h, reset), traj = jax.lax.scan(body, start, jax.random.split(k_roll, config.rollout_steps))
        traj = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), traj)  # [n, T, ...]
        rewards = jax.vmap(jax.vmap(lambda p, a, v: reward_of(reward_index, state.reward_params, p, a, v)))(
            traj.prev_view, traj.action, traj.view)
        progress = traj.view.progress - traj.prev_view.progress
        state = state.replace(env_state=env_state, obs=obs, carry=h, reset=reset,
                              replay=buffer.add(state.replay, traj), key=key)
        return state, jnp.mean(rewards), jnp.mean(progress)

    def actor_over_sequence(actor_params, seq: Transition):
        """The actor's outputs at the trained steps and its state after every step from the burn-in on.

        Returns (mean, log_std) f32[trained, 2] and carries f32[seq_len - burn, G], where
        carries[i] is the state after step burn + i (what the next action is drawn with).
        """
        if not net.recurrent:
            obs = jax.tree.map(lambda x: x[:trained], seq.obs)
            _, (mean, log_std) = jax.vmap(actor_step, in_axes=(None, 0, 0, 0))(
                actor_params, seq.carry[:trained], obs, seq.reset[:trained])
            return mean, log_std, seq.carry[burn:]  # empty states (G = 0)

        def scan_actor(carry, steps):
            def body(h, step):
                obs, reset = step
                h, out = actor_step(actor_params, h, obs, reset)
                return h, (h, out)

            return jax.lax.scan(body, carry, steps)

        carry = seq.carry[0]
        if burn:
            # Burn-in: replay the stored state forward to the first trained step; no gradients.
            carry, _ = scan_actor(carry, jax.tree.map(lambda x: x[:burn], (seq.obs, seq.reset)))
            carry = jax.lax.stop_gradient(carry)
        _, (carries, (mean, log_std)) = scan_actor(carry, jax.tree.map(lambda x: x[burn:], (seq.obs, seq.reset)))
        return mean[:trained], log_std[:trained], carries

    def next_frames(seq: Transition, steps):
        """uint8[len(steps), H, W, 3]: the image after each step (see the module docstring)."""
        ended = (seq.terminated | seq.truncated)[steps]
        following = jnp.minimum(steps + 1, seq_len - 1)
        frames = seq.obs["pixels"]
        return jnp.where(ended[:, None, None, None], frames[steps], frames[following])

    def losses_of(nets, target_params, batch: Transition, reward_index, reward_params, hparams: HParams, key):
        """Mean critic, actor and temperature losses over a batch of sequences [B, seq_len].

        `nets` is (actor_params, critic_params, log_alpha). Every loss stops the
        gradients it must not send, so their sum trains each network on its own loss.
        """
        actor_params, critic_params, log_alpha = nets
        alpha = jnp.exp(log_alpha)
        steps = burn + jnp.arange(trained)

        def one(seq, key):
            k_next, k_pi = jax.random.split(key)
            rewards = jax.vmap(lambda p, a, v: reward_of(reward_index, reward_params, p, a, v))(
                seq.prev_view, seq.action, seq.view)
            returns, disc, last = losses.n_step_targets(hparams.reward_scale * rewards, seq.terminated,
                                                        seq.truncated, config.n_step, hparams.discount)
            mean, log_std, carries = actor_over_sequence(actor_params, seq)
            obs = jax.tree.map(lambda x: x[steps], seq.obs)
            # Bootstrap from the next observation of each trained step's last n-step transition,
            # with the actor state after that transition.
            boot = last[steps]
            boot_obs = jax.tree.map(lambda x: x[boot], seq.next_obs)
            if pixels:
                boot_obs["pixels"] = next_frames(seq, boot)
            boot_carry = carries[boot - burn] if net.recurrent else carries[:trained]
            _, (next_mean, next_log_std) = jax.vmap(actor_step, in_axes=(None, 0, 0, None))(
                actor_params, boot_carry, boot_obs, no_reset)
            next_action, next_logp = jax.vmap(sample_action)(next_mean, next_log_std,
                                                             jax.random.split(k_next, trained))
            next_q = critic.apply(target_params, boot_obs, next_action)  # [2, trained, K]
            target = jax.vmap(losses.critic_target, in_axes=(0, 0, 0, 0, 0, None))(
                next_q[0], next_q[1], next_logp, returns[steps], disc[steps], jax.lax.stop_gradient(alpha))
            q = critic.apply(critic_params, obs, seq.action[steps])
            critic_loss = jnp.mean(jax.vmap(losses.quantile_huber_loss)(q[0], target)
                                   + jax.vmap(losses.quantile_huber_loss)(q[1], target))
            action, logp = jax.vmap(sample_action)(mean, log_std, jax.random.split(k_pi, trained))
            q_pi = critic.apply(jax.lax.stop_gradient(critic_params), obs, action)  # trains the actor only
            actor_loss = jnp.mean(jax.vmap(losses.policy_loss, in_axes=(0, 0, 0, None))(q_pi[0], q_pi[1], logp,
                                                                                        alpha))
            alpha_loss = jnp.mean(jax.vmap(losses.temperature_loss, in_axes=(None, 0, None))(
                log_alpha, logp, hparams.target_entropy))
            return critic_loss, actor_loss, alpha_loss, jnp.max(jnp.abs(rewards))

        b = batch.action.shape[0]
        c, a, t, r = jax.vmap(one)(batch, jax.random.split(key, b))
        return Losses(critic=jnp.mean(c), actor=jnp.mean(a), alpha=jnp.mean(t), max_abs_reward=jnp.max(r))

    def update(state: TrainState, hparams: HParams, reward_index):
        key, k_sample, k_loss = jax.random.split(state.key, 3)
        batch = buffer.sample(state.replay, k_sample).experience  # [batch_size, sequence_length]

        def objective(nets):
            out = losses_of(nets, state.target_critic, batch, reward_index, state.reward_params, hparams, k_loss)
            return out.critic + out.actor + out.alpha, out

        (_, out), (actor_grad, critic_grad, alpha_grad) = jax.value_and_grad(objective, has_aux=True)(
            (state.actor, state.critic, state.log_alpha))

        opt = _adam()
        c_up, c_opt = opt.update(critic_grad, _with_lr(state.critic_opt, hparams.critic_lr))
        a_up, a_opt = opt.update(actor_grad, _with_lr(state.actor_opt, hparams.actor_lr))
        l_up, l_opt = opt.update(alpha_grad, _with_lr(state.alpha_opt, hparams.alpha_lr))
        critic_params = optax.apply_updates(state.critic, c_up)
        target = optax.incremental_update(critic_params, state.target_critic, hparams.tau)
        new = state.replace(actor=optax.apply_updates(state.actor, a_up), critic=critic_params, target_critic=target,
                            log_alpha=optax.apply_updates(state.log_alpha, l_up), actor_opt=a_opt, critic_opt=c_opt,
                            alpha_opt=l_opt, key=key)
        bad = ~(jnp.isfinite(out.critic) & jnp.isfinite(out.actor)) | ~(out.max_abs_reward < HUGE_REWARD)
        failed = state.failed | bad
        # A failed run keeps its last good parameters (frozen); only its key moves on.
        new = jax.tree.map(lambda old, fresh: jnp.where(failed, old, fresh), state, new)
        return new.replace(failed=failed, key=key), (out.critic, out.actor)

    def reinitialise(state: TrainState) -> TrainState:
        """Fresh networks and optimiser states (primacy bias); replay, temperature and envs kept."""
        key, k_nets = jax.random.split(state.key)
        one_obs = jax.tree.map(lambda x: x[0], state.obs)
        return state.replace(**new_networks(k_nets, one_obs), key=key)

    def epoch(state: TrainState, hparams: HParams, reward_index):
        if config.reinit_every:
            due = (state.epoch > 0) & (state.epoch % config.reinit_every == 0) & ~state.failed
            fresh = reinitialise(state)
            state = jax.tree.map(lambda f, s: jnp.where(due, f, s), fresh, state)
        random_actions = state.epoch < config.warmup_epochs
        state, mean_reward, mean_progress = collect(state, reward_index, random_actions)

        def body(s, _):
            return update(s, hparams, reward_index)

        trained_state, (c_loss, a_loss) = jax.lax.scan(body, state, None, length=config.updates_per_epoch)
        state = jax.tree.map(lambda w, t: jnp.where(random_actions, w, t), state, trained_state)
        metrics = Metrics(reward=mean_reward, progress=mean_progress, critic_loss=jnp.mean(c_loss),
                          actor_loss=jnp.mean(a_loss), alpha=jnp.exp(state.log_alpha), failed=state.failed)
        return state.replace(epoch=state.epoch + 1), metrics

    def run_epochs(state: TrainState, hparams: HParams, reward_index, num_epochs: int):
        """`num_epochs` (static) epochs; metrics stacked over them."""
        return jax.lax.scan(lambda s, _: epoch(s, hparams, reward_index), state, None, length=num_epochs)

    def train(key, hparams: HParams, reward_index):
        """A whole run: (final TrainState, Metrics stacked over config.epochs)."""
        return run_epochs(init(key, hparams, reward_index), hparams, reward_index, config.epochs)

    return Trainer(config=config, init=init, run_epochs=run_epochs, train=train, policy=policy,
                   initial_carry=lambda: carry0, losses=losses_of,
                   sample=lambda replay, key: buffer.sample(replay, key).experience, next_frames=next_frames,
                   reward=reward_of)


@functools.partial(jax.jit, static_argnums=(0,))
def _init_runs(trainer: Trainer, keys, hparams, reward_index):
    return jax.vmap(trainer.init)(keys, hparams, reward_index)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _run_chunk(trainer: Trainer, state, hparams, reward_index, num_epochs: int):
    return jax.vmap(lambda s, h, r: trainer.run_epochs(s, h, r, num_epochs))(state, hparams, reward_index)


def _per_run(hparams: HParams, runs: int) -> HParams:
    """HParams with a leading run axis on every field (shared values are broadcast)."""
    def broadcast(name, value):
        value = jnp.asarray(value, jnp.float32)
        per_run = value.ndim == (2 if name == "reward_params" else 1)
        if per_run and value.shape[0] != runs:
            raise ValueError(f"HParams.{name} has {value.shape[0]} values for {runs} runs")
        return value if per_run else jnp.broadcast_to(value, (runs, *value.shape))

    fields = {f.name: getattr(hparams, f.name) for f in dataclasses.fields(hparams)}
    return HParams(**{k: None if v is None else broadcast(k, v) for k, v in fields.items()})


def _shard_runs(tree, runs: int):
    """Places the run axis (leading) across the devices when they divide it; jit follows.

    With one device, or a run count the devices do not divide, the tree stays as is.
    """
    devices = jax.devices()
    if len(devices) == 1 or runs % len(devices):
        return tree
    mesh = jax.sharding.Mesh(devices, ("runs",))
    return jax.device_put(tree, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("runs")))


def train_many(trainer: Trainer, key: jax.Array, reward_indices, seeds_per_reward: int = 1,
               hparams: HParams | None = None, chunk_epochs: int | None = None, progress=None,
               checkpoint: str | None = None):
    """Trains every (reward index, seed) pair as one vmapped, jitted job.

    Args:
        trainer: from `make_train`.
        key: split into one key per run (runs never share a key).
        reward_indices: candidate indices into the bank.
        seeds_per_reward: runs per candidate.
        hparams: HParams (default HParams()); a field may hold one value per run
            (a leading axis of R = len(reward_indices) * seeds_per_reward) for a sweep.
        chunk_epochs: epochs per jitted call (default: all); `progress(epoch, metrics)`
            is called on the host after each chunk.
        checkpoint: a file path; the job state is saved there after every chunk, and a
            job started with an existing checkpoint resumes from it (same arguments).
            The metrics of chunks done before the resume are in the checkpoint too.

    With several devices the run axis is sharded across them (when they divide R):
    each device trains its share of the runs.

    Returns:
        (final TrainState with a leading run axis R, Metrics [R, epochs], reward_index i32[R]).
    """
    reward_index = jnp.repeat(jnp.asarray(reward_indices, jnp.int32), seeds_per_reward)
    runs = reward_index.shape[0]
    hparams = _per_run(HParams() if hparams is None else hparams, runs)
    keys = jax.random.split(key, runs)
    epochs = trainer.config.epochs
    chunk = chunk_epochs or epochs
    if epochs % chunk:
        raise ValueError(f"chunk_epochs ({chunk}) must divide epochs ({epochs})")
    keys, hparams, reward_index = _shard_runs((keys, hparams, reward_index), runs)
    state = _init_runs(trainer, keys, hparams, reward_index)
    history = jax.tree.map(lambda x: jnp.zeros((runs, epochs), x.dtype),
                           jax.eval_shape(lambda: _run_chunk(trainer, state, hparams, reward_index, chunk)[1]))
    start = 0
    if checkpoint is not None and Path(checkpoint).exists():
        (state, history), start = load_checkpoint(checkpoint, (state, history))
        state = _shard_runs(state, runs)
    for done in range(start, epochs, chunk):
        state, metrics = _run_chunk(trainer, state, hparams, reward_index, chunk)
        history = jax.tree.map(lambda h, m, d=done: h.at[:, d:d + chunk].set(m), history, metrics)
        if checkpoint is not None:
            save_checkpoint(checkpoint, (state, history), done + chunk)
        if progress is not None:
            progress(done + chunk, metrics)
    return state, history, reward_index
