"""Clips: fixed-length segments of a trajectory that judges compare and TAC scores."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrace.rewards.api import Action, RaceView


class Clip(NamedTuple):
    """T transitions of one car (fields gain leading batch axes for many clips).

    views: RaceView with leading axis T + 1 (views[t] -> actions[t] -> views[t + 1]).
    actions: Action with leading axis T.
    valid: bool[T], False for transitions after the episode ended (padding).
    """

    views: RaceView
    actions: Action
    valid: jax.Array

    @property
    def length(self) -> int:
        return self.valid.shape[-1]


def cut_clip(views: RaceView, actions: Action, done: jax.Array, start: jax.Array, length: int) -> Clip:
    """The clip of `length` transitions starting at step `start` of one trajectory.

    Args:
        views: RaceView with leading axis S + 1 (the view before every step, then the last).
        actions: Action with leading axis S.
        done: bool[S], the episode ended at this step (later steps are padding).
        start: i32[] first step; the clip is clamped to end inside the trajectory.
        length: static number of transitions.
    """
    steps = done.shape[0]
    if length > steps:
        raise ValueError(f"a clip of {length} steps does not fit a trajectory of {steps}")
    start = jnp.clip(start, 0, steps - length)
    take = lambda x, n: jax.lax.dynamic_slice_in_dim(x, start, n)  # noqa: E731
    ended_before = jnp.cumsum(done) - done  # episodes ended before each step
    valid = take(ended_before, length) == ended_before[start]
    return Clip(views=jax.tree.map(lambda x: take(x, length + 1), views),
                actions=jax.tree.map(lambda x: take(x, length), actions), valid=valid)
