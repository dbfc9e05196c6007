"""`BraxRaceEnv`: the race env as a brax `Env`, for brax's training wrappers and agents."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from brax.envs.base import Env, State
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrace.envs.adapters.common import env_and_params
from jaxrace.envs.race import RaceEnv
from jaxrace.envs.state import EnvParams
from jaxrace.rewards.api import RaceView


class BraxRaceEnv(Env):
    """One race episode behind brax's `Env` interface (unbatched; brax's wrappers vmap it).

    Observation: f32[observation_size], the flat `concatenate([proprio, privileged])` of
    the race env's observation dict: entries [0, 20) are "proprio", the rest
    "privileged" (see `RaceEnv.observation`).

    The `State` fields:
        pipeline_state: the jaxrace `EnvState`. Keeping it here lets brax's
            `AutoResetWrapper` restore it together with the observation.
        reward: f32, metres of progress along the track during the step.
        done: f32, 1 when the episode terminated (race finished, or a course-out when
            `params.terminate_on_course_out`, a rear-end contact when
            `params.terminate_on_contact`) or was truncated by `params.time_limit`.
        metrics: f32 scalars for brax's episode statistics, which sum them over an
            episode; its evaluator divides the "*_per_step" ones by the episode length.
            "progress" (m along the track this step; sums to the episode's distance),
            "speed_per_step" (m/s), "off_course_per_step" and "wall_contact_per_step"
            (1 or 0).
        info: "rng" (PRNG key, split for the key of each step), "truncation" (f32, 1 when
            the time limit ended the episode) and "time_out" (f32, the same).

    Time limits under brax's training wrappers: `EpisodeWrapper` (used by brax PPO and
    SAC) replaces `info["truncation"]` with its own, 1 after `episode_length` steps
    unless the env is done on that step, and brax PPO treats every other end (done = 1)
    as terminal. So either leave truncation to it, with `params.time_limit >
    episode_length * dt`, or let the race's time limit end episodes and pass
    `bootstrap_on_timeout=True` to PPO, which reads `info["time_out"]`.

    The race env's own auto-reset is not used: `step` calls `RaceEnv.step_env`, and
    brax's `AutoResetWrapper` returns a finished env to the first state of its batch
    slot, so with start="random" each slot replays its start until brax resets it with
    fresh keys (PPO's `num_resets_per_eval`).
    """

    def __init__(self, env: RaceEnv | None = None, params: EnvParams | None = None, **make_kwargs):
        """Wraps `env` with `params`, or builds both with `jaxrace.make(**make_kwargs)`.

        Args:
            env: the race env; give it together with `params`.
            params: its EnvParams (fixed for this adapter; they become constants of the
                compiled functions).
            **make_kwargs: instead of `env` and `params`, keyword arguments for
                `jaxrace.make` (track, start, laps, num_opponents, time_limit, ...).
        """
        self.race_env, self.params = env_and_params(env, params, make_kwargs)
        shapes = self.race_env.observation_shapes()
        self._observation_size = shapes["proprio"][0] + shapes["privileged"][0]

    def reset(self, rng: jax.Array) -> State:
        """Starts an episode from PRNG key `rng`; obs f32[observation_size]."""
        rng, key = jax.random.split(rng)
        obs, race_state = self.race_env.reset(key, self.params)
        zero = jnp.zeros((), jnp.float32)
        return State(
            pipeline_state=race_state,
            obs=_flatten(obs),
            reward=zero,
            done=zero,
            metrics=_metrics(race_state.view, race_state.view),
            info={"rng": rng, "truncation": zero, "time_out": zero},
        )

    def step(self, state: State, action: jax.Array) -> State:
        """One 0.1 s step with `action` f32[2] (steering, throttle_brake) in [-1, 1]."""
        rng, key = jax.random.split(state.info["rng"])
        obs, race_state, reward, terminated, truncated, _ = self.race_env.step_env(
            key, state.pipeline_state, action, self.params
        )
        truncation = truncated.astype(jnp.float32)
        return state.replace(
            pipeline_state=race_state,
            obs=_flatten(obs),
            reward=reward,
            done=(terminated | truncated).astype(jnp.float32),
            # Keep the entries that brax's wrappers added to `metrics` and `info`.
            metrics={**state.metrics, **_metrics(state.pipeline_state.view, race_state.view)},
            info={**state.info, "rng": rng, "truncation": truncation, "time_out": truncation},
        )

    @property
    def observation_size(self) -> int:
        return self._observation_size

    @property
    def action_size(self) -> int:
        return self.race_env.num_actions

    @property
    def backend(self) -> str:
        return "jaxrace"


def _flatten(obs: dict[str, jax.Array]) -> jax.Array:
    """f32[P + Q] from {"proprio": f32[P], "privileged": f32[Q]}."""
    return jnp.concatenate([obs["proprio"], obs["privileged"]])


def _metrics(before: RaceView, after: RaceView) -> dict[str, jax.Array]:
    """The step's metrics (f32 scalars) from the views before and after it."""
    return {
        "progress": after.progress - before.progress,
        "speed_per_step": after.speed,
        "off_course_per_step": after.off_course.astype(jnp.float32),
        "wall_contact_per_step": after.wall_contact.astype(jnp.float32),
    }


@contextlib.contextmanager
def brax_training_compat():
    """Lets brax 0.14's trainers run on jax >= 0.10 inside the `with` block.

    brax 0.14.2's PPO and SAC call `jax.device_put_replicated`, which jax 0.10 removed
    (google/brax#671). Inside the block that name is JAX's documented replacement (put
    a stacked copy on each device); outside it jax is untouched. Does nothing on a jax
    that still has it.

    Example:
        with brax_training_compat():
            make_policy, params, metrics = brax.training.agents.ppo.train.train(env, ...)
    """
    if hasattr(jax, "device_put_replicated"):
        yield
        return

    def device_put_replicated(x, devices):
        sharding = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec("devices"))
        return jax.tree.map(lambda y: jax.device_put(jnp.stack([y] * len(devices)), sharding), x)

    jax.device_put_replicated = device_put_replicated
    try:
        yield
    finally:
        del jax.device_put_replicated
