"""Acting: the actor driving `num_envs` envs for a rollout, and the deterministic policy.

`make_acting(config, env, env_params, actor)` returns pure functions. `env_params` is
shared by all envs, or has a leading axis of `config.num_envs` (from
`jaxrace.envs.per_env_params`) to give each env its own scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrace.agents.config import TrainConfig
from jaxrace.agents.networks import Actor, deterministic_action, sample_action
from jaxrace.agents.replay import Transition
from jaxrace.envs.state import EnvParams, EnvState


class Rollout(NamedTuple):
    """Where the acting envs are: what the next rollout continues from ([num_envs, ...] each)."""

    env_state: EnvState
    obs: dict
    carry: jax.Array  # f32[num_envs, G] the actor's state
    reset: jax.Array  # bool[num_envs] the next step starts an episode


class Acting(NamedTuple):
    reset: Callable  # (key) -> Rollout at the start of every env's episode
    collect: Callable  # (actor_params, Rollout, key, random_actions bool[])
    #                    -> (Rollout, Transition [n, T] (reward 0), (prev_view, view) RaceView [n, T])
    policy: Callable  # (actor_params, carry f32[G], obs) -> (carry, action f32[2]), deterministic, one env


def make_acting(config: TrainConfig, env, env_params: EnvParams, actor: Actor) -> Acting:
    """The acting functions of a trainer (see the module docstring)."""
    n = config.num_envs
    per_env = jnp.ndim(env_params.time_limit) == 1
    if per_env and env_params.time_limit.shape[0] != n:
        raise ValueError(f"env_params has a leading axis of {env_params.time_limit.shape[0]}, "
                         f"but config.num_envs is {n}")
    params_axis = 0 if per_env else None
    step_envs = jax.vmap(env.step, in_axes=(0, 0, 0, params_axis))
    reset_envs = jax.vmap(env.reset, in_axes=(0, params_axis))
    no_reset = jnp.zeros((), bool)

    def actor_step(actor_params, carry, obs, reset):
        """One env: (carry f32[G], obs, reset bool) -> (carry, (mean, log_std))."""
        return actor.apply(actor_params, carry, obs, reset)

    def reset(key) -> Rollout:
        obs, env_state = reset_envs(jax.random.split(key, n), env_params)
        return Rollout(env_state=env_state, obs=obs, carry=jnp.zeros((n, config.carry_size), jnp.float32),
                       reset=jnp.ones((n,), bool))

    def policy(actor_params, carry, obs):
        """Deterministic action for evaluation: tanh of the mean (one env)."""
        carry, (mean, _) = actor_step(actor_params, carry, obs, no_reset)
        return carry, deterministic_action(mean)

    def collect(actor_params, rollout: Rollout, key, random_actions):
        """`config.rollout_steps` steps of every env; uniform random actions while `random_actions`.

        Returns the transitions (reward 0: the trainer labels them) and the RaceViews
        before and after each step.
        """
        def body(carry, key):
            env_state, obs, h, reset = carry
            k_act, k_rand, k_env = jax.random.split(key, 3)
            h_next, (mean, log_std) = jax.vmap(actor_step, in_axes=(None, 0, 0, 0))(actor_params, h, obs, reset)
            action, _ = jax.vmap(sample_action)(mean, log_std, jax.random.split(k_act, n))
            uniform = jax.random.uniform(k_rand, (n, 2), minval=-1.0, maxval=1.0)
            action = jnp.where(random_actions, uniform, action)
            next_obs, next_state, _, terminated, truncated, info = step_envs(
                jax.random.split(k_env, n), env_state, action, env_params)
            transition = Transition(obs=obs, action=action, reward=jnp.zeros((n,), jnp.float32),
                                    next_obs=info["final_observation"], terminated=terminated, truncated=truncated,
                                    carry=h, reset=reset)
            return Rollout(next_state, next_obs, h_next, terminated | truncated), (transition, (env_state.view,
                                                                                             info["view"]))

        rollout, steps = jax.lax.scan(body, rollout, jax.random.split(key, config.rollout_steps))
        traj, views = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps)  # [n, T, ...]
        return rollout, traj, views

    return Acting(reset=reset, collect=collect, policy=policy)
