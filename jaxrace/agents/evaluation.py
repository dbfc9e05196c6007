"""Deterministic evaluation of trained policies: races and their metrics.

`evaluate` runs `num_races` races per trained run (vmapped over runs and races, one
jitted call) with the policy's deterministic action for the ego car and the built-in AI
for the opponents, and returns the trajectories (for clips and videos) with per-race
metrics computed on the host.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrace.envs.rollouts import count_onsets, onset_steps, race_record, summarise
from jaxrace.jit import jit


@dataclasses.dataclass
class RaceMetrics:
    """The ego car's race, host-side."""

    finishing_position: int
    start_position: int
    positions_gained: int
    laps: int
    lap_times: list[float]
    best_lap: float | None  # s, None before a full lap
    mean_lap: float | None
    finished: bool
    winning_margin: float | None  # s, + ahead of the second car when winning, - behind the winner
    collisions_at_fault: int  # we ran into the back of another car
    collisions_not_at_fault: int  # another car ran into our back
    side_contacts: int
    course_outs: int
    wall_hits: int
    # each onset of an at-fault contact, a course-out or a wall hit, in time order:
    # {"kind": "at_fault" | "course_out" | "wall", "time": s, "lap": laps completed, "x": m, "y": m}
    incidents: list[dict]


INCIDENT_FLAGS = {"at_fault": "hit_other_from_behind", "course_out": "off_course", "wall": "wall_contact"}


def incidents(record, states, car: int = 0) -> list[dict]:
    """Where and when a car's incidents began: one race's RaceRecord and EnvState, leading axis T + 1."""
    x, y = np.asarray(states.cars.body.x[:, car]), np.asarray(states.cars.body.y[:, car])
    time, laps = np.asarray(states.time), np.asarray(record.laps[:, car])
    out = [{"kind": kind, "time": round(float(time[t]), 2), "lap": int(laps[t]), "x": round(float(x[t]), 1),
            "y": round(float(y[t]), 1)}
           for kind, flag in INCIDENT_FLAGS.items() for t in onset_steps(getattr(record, flag)[:, car])]
    return sorted(out, key=lambda i: i["time"])


@jit
def _race_records(states, params):
    """RaceRecord [T + 1, C] of one race, in one program (run eagerly, each operation compiles alone)."""
    return jax.vmap(race_record, in_axes=(0, None))(states, params)


def race_metrics(states, params) -> RaceMetrics:
    """Metrics of the ego car (car 0) from one race's stacked EnvState (leading axis T + 1)."""
    record = jax.tree.map(np.asarray, _race_records(states, params))
    laps_limit = int(np.asarray(params.laps))
    summary = summarise(record, laps_limit)
    ego = next(r for r in summary.results if r.car == 0)
    finish = {r.car: r.finish_time for r in summary.results}
    margin = None
    if ego.finish_time is not None:
        others = [t for car, t in finish.items() if car != 0 and t is not None]
        if ego.position == 1:
            margin = (min(others) - ego.finish_time) if others else None
        else:
            winner = min(t for t in finish.values() if t is not None)
            margin = winner - ego.finish_time
    return RaceMetrics(
        finishing_position=ego.position, start_position=ego.start_position,
        positions_gained=ego.start_position - ego.position, laps=ego.laps, lap_times=ego.lap_times,
        best_lap=min(ego.lap_times) if ego.lap_times else None,
        mean_lap=float(np.mean(ego.lap_times)) if ego.lap_times else None,
        finished=ego.finish_time is not None, winning_margin=margin,
        collisions_at_fault=count_onsets(record.hit_other_from_behind[:, 0]),
        collisions_not_at_fault=count_onsets(record.hit_from_behind[:, 0]),
        side_contacts=count_onsets(record.side_contact[:, 0]),
        course_outs=count_onsets(record.off_course[:, 0]), wall_hits=count_onsets(record.wall_contact[:, 0]),
        incidents=incidents(record, states),
    )


def mean_action_change(actions, finished) -> tuple[float, float] | None:
    """Mean squared change of the ego car's (steering, throttle_brake) from one step to the next
    while it races: actions f32[..., T, 2], finished bool[..., T + 1] (the ego car's, of the states
    the actions were taken in and after). None when no two actions were taken before the finish."""
    actions, racing = np.asarray(actions, np.float64), ~np.asarray(finished, bool)[..., 1:-1]
    change = np.square(np.diff(actions, axis=-2))[racing]  # [pairs, 2]
    if not len(change):
        return None
    return float(change[:, 0].mean()), float(change[:, 1].mean())


@functools.partial(jit, static_argnums=(0, 1, 5, 6), renders=lambda learner, env, *args, **kwargs: env.static.pixels)
def _races(learner, env, actor_params, params, keys, num_steps: int, params_per_race: bool):
    """Jitted once per (learner, env, shapes, num_steps): evaluation can run every chunk, and every bank.

    One scan over the steps of every run's races (the step vmapped over runs and races), not a scan
    vmapped twice: the same batched step, traced in about half the time (each vmap of a scan
    batches its body again). Race i of every run starts from the same reset and uses the same keys.
    """
    runs = jax.tree.leaves(actor_params)[0].shape[0]
    p_axis = 0 if params_per_race else None

    def over_runs_and_races(fn, *, runs_axes, races_axes):
        return jax.vmap(jax.vmap(fn, in_axes=races_axes), in_axes=runs_axes)

    obs, state = jax.vmap(env.reset, in_axes=(0, p_axis))(keys, params)  # [races, ...]
    obs, state = jax.tree.map(lambda x: jnp.broadcast_to(x, (runs, *x.shape)), (obs, state))
    carry = jax.tree.map(lambda x: jnp.broadcast_to(x, (runs, keys.shape[0], *x.shape)), learner.initial_carry())
    step_keys = jnp.moveaxis(jax.vmap(lambda k: jax.random.split(k, num_steps))(keys), 1, 0)  # [T, races]
    policy = over_runs_and_races(learner.policy, runs_axes=(0, 0, 0), races_axes=(None, 0, 0))
    step = over_runs_and_races(env.step_env, runs_axes=(None, 0, 0, None), races_axes=(0, 0, 0, p_axis))

    def body(carry, race_keys):
        obs, state, memory = carry
        memory, action = policy(actor_params, memory, obs)
        obs, state, *_ = step(race_keys, state, action, params)
        return (obs, state, memory), (state, jnp.asarray(action, jnp.float32))

    _, (states, actions) = jax.lax.scan(body, (obs, state, carry), step_keys)
    states = jax.tree.map(lambda first, rest: jnp.concatenate([first[:, :, None], jnp.moveaxis(rest, 0, 2)], axis=2),
                          state, states)
    return states, jnp.moveaxis(actions, 0, 2)


class Evaluation(NamedTuple):
    """Races of R runs, num_races each."""

    states: object  # EnvState with leading axes [R, num_races, num_steps + 1]
    actions: jax.Array  # f32[R, num_races, num_steps, 2], the ego car's actions
    metrics: list  # over runs, of lists over races, of RaceMetrics


def evaluate(trainer, actor_params, env, params, key: jax.Array, num_steps: int, num_races: int = 1, *,
             params_per_race: bool = False) -> Evaluation:
    """Races every run's deterministic policy.

    Args:
        trainer: a Trainer or its Learner (only the policy is used).
        actor_params: actor parameters with a leading run axis R (TrainState.policy_actor).
        params: EnvParams shared by every race, or with a leading axis of num_races
            when `params_per_race` (each race its own field: skills, aggression, ...).
        num_steps: static steps per race; num_races: races per run (different keys;
            race i of every run uses the same key and params, so runs meet the same scenarios).

    Returns:
        An `Evaluation` (states, actions, metrics).
    """
    runs = jax.tree.leaves(actor_params)[0].shape[0]
    keys = jax.random.split(key, num_races)
    learner = getattr(trainer, "learner", trainer)
    states, actions = _races(learner, env, actor_params, params, keys, num_steps, params_per_race)
    # Sliced on the host: eager slices of device arrays would compile one program per leaf.
    host_states, host_params = jax.device_get((states, params))
    race_params = [jax.tree.map(lambda x, i=i: x[i], host_params) if params_per_race else params
                   for i in range(num_races)]
    metrics = [[race_metrics(jax.tree.map(lambda x, r=r, i=i: x[r, i], host_states), race_params[i])
                for i in range(num_races)] for r in range(runs)]
    return Evaluation(states, actions, metrics)
