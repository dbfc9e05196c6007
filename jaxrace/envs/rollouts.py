"""Whole races driven by the built-in AI (every car, the ego car included), and their summary.

`ai_race` is one jitted scan; `summarise` is host-side bookkeeping that turns the
per-step record into lap times, positions, overtakes and contacts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrace.envs.observation import edge_margin, is_off_course
from jaxrace.envs.race import RaceEnv
from jaxrace.envs.state import EnvParams, EnvState
from jaxrace.envs.track import track_slice


class RaceRecord(NamedTuple):
    """Per-step facts of every car: arrays [..., T, C] (T agent steps, C cars)."""

    laps: jax.Array  # i32
    last_lap: jax.Array  # f32, s
    rank: jax.Array  # i32
    finished: jax.Array  # bool
    finish_time: jax.Array  # f32, s
    off_course: jax.Array  # bool, beyond the course-out margin
    wall_contact: jax.Array  # bool
    hit_other_from_behind: jax.Array  # bool (this car's fault)
    hit_from_behind: jax.Array  # bool (another car's fault)
    side_contact: jax.Array  # bool
    active: jax.Array  # bool


def race_record(state: EnvState, params: EnvParams) -> RaceRecord:
    """The RaceRecord row (arrays [C]) of one state."""
    c = state.cars
    here = track_slice(params.tracks, state.track_index).row(c.station)
    return RaceRecord(
        laps=c.laps, last_lap=c.last_lap, rank=c.rank, finished=c.finished, finish_time=c.finish_time,
        off_course=is_off_course(edge_margin(here, c.lateral), params) & state.active, wall_contact=c.wall_contact,
        hit_other_from_behind=c.hit_other_from_behind, hit_from_behind=c.hit_from_behind,
        side_contact=c.side_contact, active=state.active,
    )


def ai_race(env: RaceEnv, params: EnvParams, key: jax.Array, num_steps: int) -> RaceRecord:
    """Runs `num_steps` agent steps with the AI driving every car (no auto-reset).

    Jit it with `num_steps` static: `jax.jit(ai_race, static_argnums=(0, 3))`.
    """
    _, state = env.reset(key, params)

    def body(state, step_key):
        _, state, *_ = env.step_env(step_key, state, env.ai_action(state, params), params)
        return state, race_record(state, params)

    _, record = jax.lax.scan(body, state, jax.random.split(key, num_steps))
    return record


def trajectory(env: RaceEnv, params: EnvParams, key: jax.Array, num_steps: int, policy=None,
               policy_carry=None) -> EnvState:
    """The stacked EnvState of one race: leading axis `num_steps + 1` (the reset state first).

    Args:
        policy: `policy(obs) -> f32[2]`, the ego car's action; None lets the built-in AI
            drive it. The opponents are always the AI.
        policy_carry: for a stateful (recurrent) policy, its initial state; the policy is
            then called as `policy(carry, obs) -> (carry, f32[2])`.

    Jit it with `env`, `num_steps` and `policy` static. This is what
    `jaxrace.envs.video` renders and what evaluation summarises.
    """
    return trajectory_with_actions(env, params, key, num_steps, policy, policy_carry)[0]


def trajectory_with_actions(env: RaceEnv, params: EnvParams, key: jax.Array, num_steps: int, policy=None,
                            policy_carry=None, ai_sees_traffic: jax.Array | bool = True) -> tuple[EnvState, jax.Array]:
    """`trajectory` and the ego car's actions: (EnvState [num_steps + 1], f32[num_steps, 2]).

    The actions are as the policy gave them (before the env sanitises them), which is
    what a reward program sees as `action`. Without a policy the AI drives the ego car,
    blind to the other cars where `ai_sees_traffic` is False.
    """
    obs, state = env.reset(key, params)

    def body(carry, step_key):
        obs, state, memory = carry
        if policy is None:
            action = env.ai_action(state, params, ai_sees_traffic)
        elif policy_carry is None:
            action = policy(obs)
        else:
            memory, action = policy(memory, obs)
        obs, state, *_ = env.step_env(step_key, state, action, params)
        return (obs, state, memory), (state, jnp.asarray(action, jnp.float32))

    _, (states, actions) = jax.lax.scan(body, (obs, state, policy_carry), jax.random.split(key, num_steps))
    states = jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]), state, states)
    return states, actions


@dataclass
class CarResult:
    """One car's race, host-side."""

    car: int  # 0 = the ego car
    position: int  # final race position (1 = winner)
    start_position: int
    laps: int
    lap_times: list[float]
    finish_time: float | None  # s, None if it did not finish


@dataclass
class RaceSummary:
    """A race, host-side: results by finishing order and incident counts."""

    results: list[CarResult]
    overtakes: int  # position gains summed over cars (each pass counts once)
    contacts: int  # car-car contact events (a contact between two cars counts once)
    course_outs: int  # times a car went beyond the course-out margin
    wall_hits: int  # times a car touched a wall


def count_onsets(flag: np.ndarray) -> int:
    """Number of False -> True transitions along axis 0, summed (a True first entry counts)."""
    f = flag.astype(np.int8)
    return int(np.sum(np.diff(f, axis=0, prepend=0) == 1))


def onset_steps(flag: np.ndarray) -> np.ndarray:
    """i64[K]: the indices of a 1-D flag's False -> True transitions, as `count_onsets` counts them."""
    f = np.asarray(flag).astype(np.int8)
    if f.ndim != 1:
        raise ValueError(f"onset_steps takes a 1-D flag, got shape {f.shape}")
    return np.flatnonzero(np.diff(f, prepend=0) == 1)


def summarise(record: RaceRecord, race_laps: int | None = None) -> RaceSummary:
    """Summarises one race's record (arrays [T, C]); lap times stop at `race_laps`."""
    rec = jax.tree.map(np.asarray, record)
    active = rec.active[0]
    results = []
    for car in np.flatnonzero(active):
        laps = rec.laps[:, car]
        completed = np.flatnonzero(np.diff(laps, prepend=0) > 0)
        lap_times = [float(rec.last_lap[t, car]) for t in completed][:race_laps]
        finished = bool(rec.finished[-1, car])
        results.append(CarResult(
            car=int(car), position=int(rec.rank[-1, car]), start_position=int(rec.rank[0, car]),
            laps=len(lap_times), lap_times=lap_times,
            finish_time=float(rec.finish_time[-1, car]) if finished else None,
        ))
    results.sort(key=lambda r: r.position)
    gains = np.diff(rec.rank[:, active], axis=0)
    contacts = count_onsets(rec.hit_other_from_behind[:, active]) + count_onsets(rec.side_contact[:, active]) // 2
    return RaceSummary(
        results=results,
        overtakes=int(np.sum(gains < 0)),
        contacts=contacts,
        course_outs=count_onsets(rec.off_course[:, active]),
        wall_hits=count_onsets(rec.wall_contact[:, active]),
    )


def format_summary(summary: RaceSummary, skills=None) -> str:
    """A table a person can read: positions, lap times, incidents."""
    lines = [f"{'pos':>3}  {'car':<8} {'skill':>5}  {'grid':>4}  {'laps':>4}  {'best lap':>9}  {'total':>9}  lap times"]
    for r in summary.results:
        name = "ego (AI)" if r.car == 0 else f"AI {r.car}"
        skill = f"{skills[r.car]:.2f}" if skills is not None else "-"
        best = f"{min(r.lap_times):9.3f}" if r.lap_times else f"{'-':>9}"
        total = f"{r.finish_time:9.3f}" if r.finish_time is not None else f"{'DNF':>9}"
        laps = " ".join(f"{t:.3f}" for t in r.lap_times)
        lines.append(f"{r.position:>3}  {name:<8} {skill:>5}  {r.start_position:>4}  {r.laps:>4}  {best}  {total}  "
                     f"{laps}")
    lines.append(f"overtakes {summary.overtakes}, car contacts {summary.contacts}, "
                 f"course-outs {summary.course_outs}, wall hits {summary.wall_hits}")
    return "\n".join(lines)
