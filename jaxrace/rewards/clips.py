"""Clips: fixed-length segments of a trajectory that judges compare and TAC scores."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

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


def unique_clips(first: Clip, second: Clip) -> tuple[Clip, np.ndarray, np.ndarray]:
    """The distinct clips of pairs (first[p], second[p]), and where each pair's two clips are among them.

    A judged clip is usually in many pairs (every clip of a race is compared with several others), so
    whatever evaluates programs on the pairs' clips costs pairs / distinct clips times less on these.

    Args:
        first, second: Clips with leading axis P (numpy or jax; read on the host).

    Returns:
        (clips with leading axis K <= 2P, in order of first appearance (first[0], second[0], first[1], ...),
        i32[P] index of first[p] among them, i32[P] index of second[p]). Clips are the same when every
        array holds the same bytes.
    """
    both = jax.tree.map(lambda a, b: np.stack([np.asarray(a), np.asarray(b)], axis=1).reshape(-1, *np.shape(a)[1:]),
                        first, second)  # [2P, ...]: first[0], second[0], first[1], ...
    leaves = jax.tree.leaves(both)
    rows = leaves[0].shape[0]
    seen: dict[tuple[bytes, ...], int] = {}
    keep, index = [], np.empty(rows, np.int32)
    for r in range(rows):
        key = tuple(np.ascontiguousarray(x[r]).tobytes() for x in leaves)
        if key not in seen:
            seen[key] = len(keep)
            keep.append(r)
        index[r] = seen[key]
    clips = jax.tree.map(lambda x: x[np.asarray(keep)], both)
    return clips, index[0::2], index[1::2]


def race_events(views: RaceView) -> np.ndarray:
    """f32[..., S]: things a judge looks for at each step (host-side numpy) from views [..., S + 1].

    Counts places changed and the onsets of contacts (any kind), course-outs and wall hits,
    while the race is on (not after the finish).
    """
    def onset(flag):
        flag = np.asarray(flag, bool)
        return flag[..., 1:] & ~flag[..., :-1]

    rank = np.asarray(views.rank)
    events = (rank[..., 1:] != rank[..., :-1]).astype(np.float32)
    for flag in (views.hit_other_from_behind, views.side_contact, views.hit_from_behind, views.off_course,
                 views.wall_contact):
        events += onset(flag)
    return np.where(np.asarray(views.finished, bool)[..., :-1], 0.0, events)


def interesting_starts(events: np.ndarray, length: int, slots: int, finish_end: int | None = None) -> list[int]:
    """Start steps of `slots` clips of `length` steps from a race with per-step `events` f32[S] (host-side).

    The first clip is the start of the race. With `finish_end` (a step) and two slots or more, the
    second is the window that ends there: the finish, seen by every run of the race at once. Each
    next one is the window with the most events that overlaps no clip chosen so far. Slots left
    over (a quiet race, or no room) go where they are farthest from the clips chosen. Returned in
    time order.
    """
    steps = events.shape[0]
    if length > steps:
        raise ValueError(f"a clip of {length} steps does not fit a race of {steps}")
    last = steps - length
    window = np.convolve(np.asarray(events, np.float64), np.ones(length), mode="valid")  # [last + 1]
    chosen = [0]
    if finish_end is not None and slots >= 2:
        chosen.append(int(np.clip(finish_end - length, 0, last)))
    while len(chosen) < slots:
        free = np.ones(last + 1, bool)
        for c in chosen:
            free[max(0, c - length + 1):c + length] = False
        score = np.where(free, window, -1.0)
        best = int(np.argmax(score))
        if score[best] <= 0:
            break
        chosen.append(best)
    candidates = np.arange(last + 1)
    while len(chosen) < slots:
        distance = np.min(np.abs(candidates[:, None] - np.asarray(chosen)[None, :]), axis=1)
        chosen.append(int(np.argmax(distance)))  # no room left: the same start again
    return sorted(chosen)


def finish_window_end(finished: np.ndarray, after: int) -> int:
    """The step a race's finish clip ends at (host-side): `after` steps past the first finish of
    any run, or the race's last step when none finished.

    finished: bool[R, S + 1], the ego car of each run has finished, before every step and after the last.
    """
    finished = np.asarray(finished, bool)
    steps = finished.shape[-1] - 1
    crossed = np.any(finished, axis=0)
    if not crossed.any():
        return steps
    return min(int(np.argmax(crossed)) + after, steps)
