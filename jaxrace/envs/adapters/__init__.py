"""Adapters that expose the race env through other RL APIs.

- `BraxRaceEnv` (`jaxrace.envs.adapters.brax_env`): a `brax.envs.base.Env`, for brax's
  training wrappers and agents (PPO, SAC).
- `GymVectorRaceEnv` (`jaxrace.envs.adapters.gym_vector`): a `gymnasium.vector.VectorEnv`
  with numpy inputs and outputs, for gymnasium-based libraries (needs gymnasium).

Both are built from `(env, params)` or from `jaxrace.make` keyword arguments. Import
each from its module, so that using one never imports the other's library.
"""
