"""What every adapter shares: the (env, params) it wraps."""

from __future__ import annotations

from jaxrace.envs.race import RaceEnv
from jaxrace.envs.registry import make
from jaxrace.envs.state import EnvParams


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
