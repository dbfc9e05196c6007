"""`GymVectorRaceEnv`: a batch of races as a gymnasium `VectorEnv`, with numpy in and out."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from jaxrace.envs.adapters.common import env_and_params
from jaxrace.envs.race import RaceEnv
from jaxrace.envs.state import EnvParams
from jaxrace.jit import jit


class GymVectorRaceEnv(VectorEnv):
    """`num_envs` independent races stepped together by one compiled, vmapped function.

    Observations are dicts {"proprio": f32[num_envs, 20], "privileged": f32[num_envs, P]}
    (see `RaceEnv.observation`); actions are f32[num_envs, 2] (steering,
    throttle_brake) in [-1, 1] (NaN becomes 0 and values outside are clipped by the race
    env); rewards are f32[num_envs], metres of progress along the track during the step.

    Episodes reset in the step that ends them (gymnasium's same-step autoreset, declared
    in `metadata["autoreset_mode"]`): the returned observation of a finished env starts
    its next episode, and `infos` then holds, as gymnasium's `SyncVectorEnv` does in
    that mode:
        "final_obs": object array [num_envs], the last observation dict of each env
            whose episode ended, None for the others;
        "final_info": {RaceView field: array [num_envs]}, the ego car's `RaceView` at
            the end of those episodes (progress, laps, time, finished, ...), zero for
            the others;
        "_final_obs", "_final_info": bool[num_envs], which envs ended.
    `infos` is empty when no episode ended.

    Seeding: `reset(seed=s)` seeds the adapter's generator, so the starts and every
    later reset are reproducible; `reset()` without a seed draws new starts from it.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self, num_envs: int, env: RaceEnv | None = None, params: EnvParams | None = None, **make_kwargs
    ):
        """Builds `num_envs` copies of `env` with `params`, or of `jaxrace.make(**make_kwargs)`.

        Args:
            num_envs: races in the batch (>= 1).
            env: the race env; give it together with `params`.
            params: its EnvParams, shared by all races of the batch.
            **make_kwargs: instead of `env` and `params`, keyword arguments for
                `jaxrace.make` (track, start, laps, num_opponents, time_limit, ...).
        """
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.race_env, self.params = env_and_params(env, params, make_kwargs)
        self.num_envs = num_envs
        self.single_observation_space = spaces.Dict({
            name: spaces.Box(0, 255, shape, np.uint8) if name == "pixels" else spaces.Box(-np.inf, np.inf, shape,
                                                                                           np.float32)
            for name, shape in self.race_env.observation_shapes().items()
        })
        self.single_action_space = spaces.Box(-1.0, 1.0, (self.race_env.num_actions,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._reset = jit(self._batched_reset, renders=self.race_env.static.pixels)
        self._step = jit(self._batched_step, renders=self.race_env.static.pixels)
        self._key = None  # PRNG key for the next step's resets; set by `reset`
        self._state = None  # batched jaxrace EnvState

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Starts a new episode in every env.

        Args:
            seed: reseeds the adapter's generator; None continues it (or seeds it
                from the OS on first use).
            options: not supported; must be None or empty.

        Returns:
            (obs, infos): the batched observation dict and an empty dict.
        """
        if options:
            raise ValueError(f"GymVectorRaceEnv.reset takes no options, got {sorted(options)}")
        super().reset(seed=seed)
        key = jax.random.PRNGKey(self.np_random.integers(2**31))
        self._key, self._state, obs = self._reset(key, self.params)
        return jax.tree.map(np.array, obs), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Advances every env by one 0.1 s step.

        Args:
            actions: f32[num_envs, 2], (steering, throttle_brake) per env.

        Returns:
            (obs, rewards f32[num_envs], terminations bool[num_envs],
            truncations bool[num_envs], infos); see the class docstring for `infos`.

        Raises:
            ValueError: if `actions` does not have the shape of `action_space`.
            RuntimeError: if called before `reset`.
        """
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape != self.action_space.shape:
            raise ValueError(f"actions must have shape {self.action_space.shape}, got {actions.shape}")
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        self._key, self._state, *outputs = self._step(self._key, self._state, actions, self.params)
        # Writable numpy copies, as gymnasium's own vector envs return.
        obs, reward, terminated, truncated, final_obs, final_view = jax.tree.map(np.array, outputs)
        done = terminated | truncated
        infos = {}
        if done.any():
            infos["final_obs"] = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                infos["final_obs"][i] = {name: value[i] for name, value in final_obs.items()}
            infos["_final_obs"] = done
            view = dataclasses.asdict(final_view)
            infos["final_info"] = {name: np.where(done, value, np.zeros_like(value)) for name, value in view.items()}
            infos["_final_info"] = done.copy()
        return obs, reward, terminated, truncated, infos

    def _batched_reset(self, key: jax.Array, params: EnvParams):
        """(next key, state, obs) of `num_envs` fresh episodes."""
        key, reset_key = jax.random.split(key)
        obs, state = jax.vmap(self.race_env.reset, in_axes=(0, None))(
            jax.random.split(reset_key, self.num_envs), params
        )
        return key, state, obs

    def _batched_step(self, key: jax.Array, state, actions: jax.Array, params: EnvParams):
        """(next key, state, obs, reward, terminated, truncated, final obs, final view) of one step."""
        key, step_key = jax.random.split(key)
        obs, state, reward, terminated, truncated, info = jax.vmap(self.race_env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, self.num_envs), state, actions, params
        )
        return key, state, obs, reward, terminated, truncated, info["final_observation"], info["view"]

