"""Actor and critic networks for QR-SAC (flax.linen), as in the GT7 vision agent.

- Actor: pixels (a small CNN) or the state vector, joined with proprioception, then an
  optional GRU, then a tanh-Gaussian policy over (steering, throttle_brake).
- Critic: twin quantile networks. Asymmetric by default: they read the privileged
  features (track points ahead, nearby opponents) with proprioception and the action;
  the symmetric variant reads the actor's inputs instead (the vision paper's ablation).
"""

from __future__ import annotations

import dataclasses

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

LOG_STD_RANGE = (-5.0, 2.0)
ACTION_SIZE = 2


def one_key_at_a_time(init):
    """An initializer that, vmapped over its keys, draws one key after another (`lax.map`).

    jaxlib 0.10's CPU LAPACK kernels split a batched QR over XLA's intra-op thread pool and
    block a pool thread until its parts finish. Two batched QRs at once on a 2-thread pool
    wait on each other for ever: vmapped over 2 runs, the GRU's orthogonal initialisations
    hung the paper preset's init in 10 of 11 tries on a 2-core CPU. A single matrix's QR runs
    inline. The values are the same: the batched kernel loops over the same LAPACK call.
    """

    def draw_with(key, shape, dtype=jnp.float32):
        @custom_vmap
        def draw(k):
            return init(k, shape, dtype)

        @draw.def_vmap
        def _(axis_size, in_batched, k):
            return jax.lax.map(draw, k), True

        return draw(key)

    return draw_with


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """Static network configuration (hashable)."""

    actor_input: str = "state"  # "state" (proprio + privileged) or "pixels" (CNN + proprio)
    symmetric: bool = False  # the critic reads the actor's inputs instead of privileged + proprio
    recurrent: bool = True  # a GRU in the actor
    hidden: int = 256
    gru_size: int = 128
    critic_layers: int = 2
    num_quantiles: int = 32
    cnn_channels: tuple[int, ...] = (32, 64, 64)
    critic_layer_norm: bool = False  # LayerNorm before each hidden ReLU of the critics (as RLPD and BRO)

    def __post_init__(self):
        if self.actor_input not in ("state", "pixels"):
            raise ValueError(f"actor_input must be 'state' or 'pixels', got {self.actor_input!r}")
        if self.num_quantiles < 1 or self.hidden < 1 or self.gru_size < 1:
            raise ValueError("num_quantiles, hidden and gru_size must be positive")

    @property
    def carry_size(self) -> int:
        """The actor's recurrent state per env: gru_size with a GRU, 0 without (nothing stored)."""
        return self.gru_size if self.recurrent else 0


class Encoder(nn.Module):
    """obs dict -> f32[..., hidden]: the actor's view (pixels or state, with proprio)."""

    config: NetworkConfig

    @nn.compact
    def __call__(self, obs: dict) -> jax.Array:
        c = self.config
        parts = [obs["proprio"]]
        if c.actor_input == "pixels":
            x = obs["pixels"].astype(jnp.float32) / 255.0
            for channels in c.cnn_channels:
                x = nn.relu(nn.Conv(channels, (3, 3), strides=(2, 2))(x))
            parts.append(nn.relu(nn.Dense(c.hidden)(x.reshape(*x.shape[:-3], -1))))
        else:
            parts.append(obs["privileged"])
        return nn.relu(nn.Dense(c.hidden)(jnp.concatenate(parts, axis=-1)))


class Actor(nn.Module):
    """One step: (carry f32[..., G], obs, reset bool[...]) -> (carry, (mean, log_std) f32[..., 2]).

    The GRU carry is zeroed where `reset` is set (the first step of an episode). Without
    a GRU the carry passes through untouched. `encode` (the observation alone) and `core`
    (the rest) split the step, so a sequence encodes all its frames in one batch.
    """

    config: NetworkConfig

    def setup(self):
        # Named as nn.compact names them, so parameter trees and checkpoints keep their layout.
        c = self.config
        self.Encoder_0 = Encoder(c)
        if c.recurrent:
            self.GRUCell_0 = nn.GRUCell(
                c.gru_size, recurrent_kernel_init=one_key_at_a_time(nn.initializers.orthogonal()))
        self.Dense_0 = nn.Dense(c.hidden)
        self.Dense_1 = nn.Dense(ACTION_SIZE)
        self.Dense_2 = nn.Dense(ACTION_SIZE)

    def __call__(self, carry: jax.Array, obs: dict, reset: jax.Array):
        return self.core(carry, self.encode(obs), reset)

    def encode(self, obs: dict) -> jax.Array:
        """obs (any leading axes) -> f32[..., hidden]."""
        return self.Encoder_0(obs)

    def core(self, carry: jax.Array, x: jax.Array, reset: jax.Array):
        """(carry, encoded obs f32[..., hidden], reset) -> (carry, (mean, log_std))."""
        if self.config.recurrent:
            carry = jnp.where(reset[..., None], 0.0, carry)
            carry, x = self.GRUCell_0(carry, x)
        x = nn.relu(self.Dense_0(x))
        log_std = jnp.clip(self.Dense_2(x), *LOG_STD_RANGE)
        return carry, (self.Dense_1(x), log_std)


def actor_sequence(actor: Actor, params, carry: jax.Array, obs: dict, reset: jax.Array):
    """The actor over a leading time axis T of `obs` and `reset`, from `carry` f32[..., G].

    Returns (final carry, (carries f32[T, ..., G], (mean, log_std) f32[T, ..., 2])), where
    carries[t] is the state after step t (what the next action is drawn with). Every
    frame is encoded before the scan: one batched convolution, not one per step (on
    XLA:CPU the gradient of a convolution inside a loop is about 18x slower).
    """
    encoded = actor.apply(params, obs, method=Actor.encode)

    def body(h, step):
        x, step_reset = step
        h, out = actor.apply(params, h, x, step_reset, method=Actor.core)
        return h, (h, out)

    return jax.lax.scan(body, carry, (encoded, reset))


class QuantileCritic(nn.Module):
    """(obs, action f32[..., 2]) -> f32[..., K] quantiles of the return."""

    config: NetworkConfig

    @nn.compact
    def __call__(self, obs: dict, action: jax.Array) -> jax.Array:
        c = self.config
        if c.symmetric:
            x = jnp.concatenate([Encoder(c)(obs), action], axis=-1)
        else:
            x = jnp.concatenate([obs["privileged"], obs["proprio"], action], axis=-1)
        for _ in range(c.critic_layers):
            x = nn.Dense(c.hidden)(x)
            if c.critic_layer_norm:
                x = nn.LayerNorm()(x)
            x = nn.relu(x)
        return nn.Dense(c.num_quantiles)(x)


class TwinCritic(nn.Module):
    """Two independent quantile critics: f32[2, ..., K]."""

    config: NetworkConfig

    @nn.compact
    def __call__(self, obs: dict, action: jax.Array) -> jax.Array:
        twins = nn.vmap(QuantileCritic, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None,
                        out_axes=0, axis_size=2)
        return twins(self.config, name="critics")(obs, action)


def action_distribution(mean: jax.Array, log_std: jax.Array) -> distrax.Distribution:
    """The tanh-Gaussian policy over actions in (-1, 1)^2 (event shape [2])."""
    normal = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))
    return distrax.Transformed(normal, distrax.Block(distrax.Tanh(), ndims=1))


def sample_action(mean: jax.Array, log_std: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(action f32[2], log-probability f32[]) drawn from the tanh-Gaussian policy."""
    return action_distribution(mean, log_std).sample_and_log_prob(seed=key)


def deterministic_action(mean: jax.Array) -> jax.Array:
    """The evaluation action: tanh of the mean."""
    return jnp.tanh(mean)


def initial_carry(config: NetworkConfig, batch_shape: tuple[int, ...] = ()) -> jax.Array:
    """f32[..., G] zeros: the actor's state at the start of an episode (G = config.carry_size)."""
    return jnp.zeros((*batch_shape, config.carry_size), jnp.float32)
