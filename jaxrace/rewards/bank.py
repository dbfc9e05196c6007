"""N compiled rewards evaluated as one batched function."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrace.rewards.api import Action, RaceView
from jaxrace.rewards.compiler import CompiledReward


@dataclasses.dataclass(frozen=True, eq=False)
class RewardBank:
    """N reward programs as one function of (candidate index, transition, weights).

    Candidates declare different PARAMS and components, so both are padded: weights are
    `f32[P]` per candidate (P = the most any candidate declares, its own names first in
    declaration order, then zeros) and components `f32[C]` likewise (`component_names`
    says which column is which; padding is 0). Hashable by identity, so jitted code can
    close over a bank.
    """

    rewards: tuple[CompiledReward, ...]

    @classmethod
    def from_compiled(cls, rewards: Sequence[CompiledReward]) -> RewardBank:
        rewards = tuple(rewards)
        if not rewards:
            raise ValueError("a RewardBank needs at least one CompiledReward")
        for i, r in enumerate(rewards):
            if not isinstance(r, CompiledReward):
                raise TypeError(f"rewards[{i}] is a {type(r).__name__}, not a CompiledReward (use compile_reward)")
        return cls(rewards)

    @property
    def num_rewards(self) -> int:
        return len(self.rewards)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rewards)

    @property
    def param_names(self) -> tuple[tuple[str, ...], ...]:
        return tuple(r.param_names for r in self.rewards)

    @property
    def component_names(self) -> tuple[tuple[str, ...], ...]:
        return tuple(r.component_names for r in self.rewards)

    @property
    def num_params(self) -> int:
        return max(len(r.params) for r in self.rewards)

    @property
    def num_components(self) -> int:
        return max(len(r.component_names) for r in self.rewards)

    def default_params(self) -> jax.Array:
        """f32[N, P]: every candidate's PARAMS defaults, zero-padded."""
        return jnp.asarray(self.params_matrix([{} for _ in self.rewards]))

    def params_matrix(self, overrides: Sequence[Mapping[str, float]]) -> np.ndarray:
        """f32[N, P] from one {name: value} per candidate (missing names take defaults)."""
        if len(overrides) != self.num_rewards:
            raise ValueError(f"need {self.num_rewards} dicts of weights, got {len(overrides)}")
        out = np.zeros((self.num_rewards, self.num_params), np.float32)
        for i, (r, given) in enumerate(zip(self.rewards, overrides, strict=True)):
            unknown = set(given) - set(r.params)
            if unknown:
                raise KeyError(f"candidate {i} ('{r.name}') has no PARAMS {sorted(unknown)}; "
                               f"it declares {list(r.params)}")
            for j, (k, default) in enumerate(r.params.items()):
                out[i, j] = given.get(k, default)
        return out

    def _branch(self, i: int):
        reward = self.rewards[i]
        width = self.num_components

        def branch(prev, action, curr, params_row):
            total, components = reward.apply(params_row[:len(reward.param_names)], prev, action, curr)
            padding = [(0, 0)] * (components.ndim - 1) + [(0, width - components.shape[-1])]
            return total, jnp.pad(components, padding)

        return branch

    def evaluate(self, index: jax.Array, prev: RaceView, action: Action, curr: RaceView,
                 params: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Candidate `index`'s reward of one transition.

        Every candidate's reward is computed and `index`'s picked: under a vmap over runs
        (a batched index) a `lax.switch` would compute every branch anyway, and its
        batching rule costs seconds of tracing per call site; rewards are cheap next to
        an env step (see the README's benchmark).

        Args:
            index: i32[] candidate (clamped to [0, N)); vmap over it for many candidates.
            prev, action, curr: one transition (scalar fields).
            params: f32[P], this candidate's weights (a row of `default_params()`);
                None takes the defaults.

        Returns:
            (total f32[], components f32[C]).
        """
        index = jnp.clip(jnp.asarray(index, jnp.int32), 0, self.num_rewards - 1)
        all_params = self.default_params()
        if params is not None:
            all_params = all_params.at[index].set(params)
        totals, components = self.evaluate_all(prev, action, curr, all_params)
        return totals[index], components[index]

    def evaluate_all(self, prev: RaceView, action: Action, curr: RaceView,
                     params: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Every candidate's reward of one transition: (f32[N], f32[N, C]).

        `params` is f32[N, P] (None: the defaults). vmap over transitions for a batch.
        """
        params = self.default_params() if params is None else params
        outs = [self._branch(i)(prev, action, curr, params[i]) for i in range(self.num_rewards)]
        return jnp.stack([o[0] for o in outs]), jnp.stack([o[1] for o in outs])
