"""Adapters that expose the race env through other RL APIs.

- `BraxRaceEnv` (`jaxrace.envs.adapters.brax_env`): a `brax.envs.base.Env`, for brax's
  training wrappers and agents (PPO, SAC).
- `GymVectorRaceEnv` (`jaxrace.envs.adapters.gym_vector`): a `gymnasium.vector.VectorEnv`
  with numpy inputs and outputs, for gymnasium-based libraries.

Both are built from `(env, params)` or from `jaxrace.make` keyword arguments. The
classes are imported on first use, so importing this package pulls in neither brax nor
gymnasium.
"""

from __future__ import annotations

import importlib

from jaxrace.envs.race import RaceEnv
from jaxrace.envs.registry import make
from jaxrace.envs.state import EnvParams

_EXPORTS = {
    "BraxRaceEnv": "jaxrace.envs.adapters.brax_env",
    "GymVectorRaceEnv": "jaxrace.envs.adapters.gym_vector",
}

__all__ = ["BraxRaceEnv", "GymVectorRaceEnv", "env_and_params"]


def env_and_params(env: RaceEnv | None, params: EnvParams | None, make_kwargs: dict) -> tuple[RaceEnv, EnvParams]:
    """The (env, params) an adapter wraps: the ones given, or `jaxrace.make(**make_kwargs)`.

    Raises:
        TypeError: if only one of `env` and `params` is given, or both together with
            make keyword arguments.
    """
    if env is None and params is None:
        return make(**make_kwargs)
    if env is None or params is None or make_kwargs:
        raise TypeError(
            "pass either both `env` and `params`, or keyword arguments for jaxrace.make, not a mix; "
            f"got env={env is not None}, params={params is not None}, make kwargs={sorted(make_kwargs)}"
        )
    return env, params


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
