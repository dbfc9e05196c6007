"""Keeping each run's best checkpoint by racing (host-side orchestration around jitted races).

A QR-SAC policy's racing swings from one checkpoint to the next (first in most races, then
last in most), and the fastest lap alone says little about a race. So a checkpoint is
judged as a race is: `assess` runs a deterministic time trial and races on fields of its
own, and `racing_score` turns them into one number against `Targets` (lower is better).
`KeepBest` keeps every run's best actor by that score while `train_many` trains (its
`keep` argument); the kept actors, scores and epochs go into the job's checkpoints, so a
resumed job keeps what it had chosen.

Judge the kept actors on other races than those that chose them: the best of many
checkpoints on the same races flatters itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrace.agents.evaluation import evaluate, mean_action_change


@dataclasses.dataclass(frozen=True)
class Targets:
    """What a racer should reach (issue 16's defaults), per race."""

    max_at_fault: float = 2.0  # at-fault contacts (we ran into another car's back)
    max_course_outs: float = 1.0
    max_lap_gap: float = 5.0  # % over the reference lap in the time trial, with no course-out


@dataclasses.dataclass(frozen=True)
class Assessment:
    """One run's time trial and races (host-side numbers)."""

    lap: float | None  # best time-trial lap (s); None without a full lap
    lap_gap: float | None  # % over the reference lap
    lap_outs: int  # course-outs in the time trial
    positions: tuple[int, ...]  # finishing position in each race
    at_fault: int  # at-fault contacts over all races
    course_outs: int  # over all races
    finished: tuple[bool, ...] = ()  # each race: all its laps done before the time ran out
    outs_by_race: tuple[int, ...] = ()  # each race's course-outs
    at_fault_by_race: tuple[int, ...] = ()  # each race's at-fault contacts
    # mean squared change of (steering, throttle_brake) per step over the races (None: no races)
    action_change: tuple[float, float] | None = None

    @property
    def races(self) -> int:
        return len(self.positions)

    def met(self, targets: Targets = Targets()) -> dict[str, bool]:
        """Each target, met or not (the position target: median finish 3rd or better)."""
        races = max(self.races, 1)
        return {"lap": self.lap_gap is not None and self.lap_gap <= targets.max_lap_gap and self.lap_outs == 0,
                "position": bool(self.positions) and float(np.median(self.positions)) <= 3.0,
                "at_fault": self.at_fault / races <= targets.max_at_fault,
                "course_outs": self.course_outs / races <= targets.max_course_outs}


def racing_score(a: Assessment, targets: Targets = Targets(), lap_miss: float = 1.0) -> float:
    """Lower is better: mean finishing position, plus at-fault contacts and course-outs per
    race (three times more beyond the targets), plus a time-trial penalty (0 within the lap
    target with no course-out; a fifth per % beyond it and 1 per course-out; 10 without a lap),
    plus `lap_miss` whenever the lap target is missed (a lap 5.04% off otherwise costs 0.008;
    scores before 2026-11-30 used 0)."""
    if not lap_miss >= 0.0:  # also refuses NaN
        raise ValueError(f"lap_miss must be a cost >= 0 (a negative one rewards a missed lap), got {lap_miss}")
    races = max(a.races, 1)
    fault, outs = a.at_fault / races, a.course_outs / races
    if a.lap_gap is None:
        lap = 10.0
    else:
        lap = max(a.lap_gap - targets.max_lap_gap, 0.0) / 5.0 + a.lap_outs
    position = float(np.mean(a.positions)) if a.positions else 0.0
    beyond = max(fault - targets.max_at_fault, 0.0) + max(outs - targets.max_course_outs, 0.0)
    missed = 0.0 if a.met(targets)["lap"] else lap_miss
    return position + fault + outs + 3.0 * beyond + lap + missed


def assess(trainer, actors, ref_lap: float, key: jax.Array, *, tt_env=None, tt_params=None, tt_steps: int = 0,
           race_env=None, race_fields=None, race_steps: int = 0) -> list[Assessment]:
    """Time trial and races of every run's deterministic policy.

    Args:
        trainer: a Trainer or Learner (only its policy is used).
        actors: actor parameters with a leading run axis R.
        ref_lap: the reference lap (s), for the time trial's gap.
        tt_env, tt_params, tt_steps: the time trial (skipped when tt_env is None).
        race_env, race_fields, race_steps: races, `race_fields` EnvParams with a leading race
            axis (`jaxrace.envs.race_fields`); skipped when race_env is None.

    Returns:
        One Assessment per run.
    """
    k_tt, k_race = jax.random.split(key)
    runs = jax.tree.leaves(actors)[0].shape[0]
    laps = [(None, 0)] * runs
    if tt_env is not None:
        tt = evaluate(trainer, actors, tt_env, tt_params, k_tt, tt_steps).metrics
        laps = [(r[0].best_lap, r[0].course_outs) for r in tt]
    races, changes = [[] for _ in range(runs)], [None] * runs
    if race_env is not None:
        num = int(jax.tree.leaves(race_fields)[0].shape[0])
        raced = evaluate(trainer, actors, race_env, race_fields, k_race, race_steps, num_races=num,
                         params_per_race=True)
        races = raced.metrics
        finished = np.asarray(raced.states.cars.finished[..., 0])
        changes = [mean_action_change(raced.actions[r], finished[r]) for r in range(runs)]
    return [Assessment(lap=lap, lap_gap=None if lap is None else 100.0 * (lap / ref_lap - 1.0), lap_outs=outs,
                       positions=tuple(m.finishing_position for m in per_run),
                       at_fault=sum(m.collisions_at_fault for m in per_run),
                       course_outs=sum(m.course_outs for m in per_run),
                       finished=tuple(bool(m.finished) for m in per_run),
                       outs_by_race=tuple(int(m.course_outs) for m in per_run),
                       at_fault_by_race=tuple(int(m.collisions_at_fault) for m in per_run), action_change=change)
            for (lap, outs), per_run, change in zip(laps, races, changes, strict=True)]


def average_params(trees: list):
    """The uniform mean of parameter trees of one structure, leaf by leaf: summed in float32 in
    the list's order, then divided (the same rounding wherever it is taken, for the same list)."""
    return jax.tree.map(lambda *leaves: (sum(jnp.asarray(x, jnp.float32) for x in leaves)
                                         / len(leaves)).astype(leaves[0].dtype), *trees)


class KeepBest:
    """Each run's best actor so far by a score (lower is better), for `train_many(keep=...)`.

    `score(epoch, actors) -> f32[R]` judges every run's actor (leading run axis); it runs
    every `every`-th time `update` is called (once per chunk of the job). With `average=K` it
    judges, and keeps, the mean of the parameters of the last K actors it was handed at a
    judgement instead (weight averaging over checkpoints, as SWA; the first judgements average
    the fewer there are): a run's racing swings from one checkpoint to the next, and the
    average of a few swings less. Host-side and stateful: after training, `actor`, `score`
    and `epoch` hold the kept actors (run axis), their scores (inf: never judged) and the
    epochs they are from (-1: never judged; with averaging, the last actor averaged);
    `history` lists every judgement as (epoch, scores). Given the number of updates to come
    (`start(actors, updates)`), the history and the actors averaged are in the checkpoints too.
    """

    def __init__(self, score: Callable[[int, object], np.ndarray], every: int = 1, average: int = 1):
        if every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        if average < 1:
            raise ValueError(f"average must be at least 1 (1: the actor itself, no averaging), got {average}")
        self._score_fn = score
        self.every = every
        self.average = average
        self.actor = None
        self.score: np.ndarray | None = None
        self.epoch: np.ndarray | None = None
        self.history: list[tuple[int, list[float]]] = []
        self._calls = 0
        self._judgements = 0  # the history's length in a checkpoint (0: not stored)
        self._recent = []  # with averaging: the last `average` actors judged, oldest first

    def start(self, actors, updates: int = 0) -> None:
        """Before the job of `updates` chunks (0: unknown): nothing judged yet (the structure a checkpoint stores)."""
        runs = jax.tree.leaves(actors)[0].shape[0]
        self.actor = jax.tree.map(jnp.copy, actors)  # never the job's own (donated) buffers
        self.score = np.full((runs,), np.inf, np.float32)
        self.epoch = np.full((runs,), -1, np.int32)
        self.history = []
        self._calls = 0
        self._judgements = updates // self.every
        self._recent = []

    def _averaged(self, actors):
        """The mean of the last `average` actors handed in, `actors` the newest (itself without averaging)."""
        if self.average == 1:
            return actors
        self._recent = [*self._recent[1 - self.average:], jax.tree.map(jnp.copy, actors)]
        return average_params(self._recent)

    def update(self, epoch: int, actors) -> None:
        """After a chunk that ends at `epoch`: judge the actors (or their average) if due, keep the better ones."""
        self._calls += 1
        if self._calls % self.every:
            return
        actors = self._averaged(actors)
        scores = np.asarray(self._score_fn(epoch, actors), np.float32)
        self.history.append((int(epoch), [float(s) for s in scores]))
        better = scores < self.score
        if better.any():
            mask = jnp.asarray(better)
            self.actor = jax.tree.map(
                lambda new, old: jnp.where(mask.reshape((-1,) + (1,) * (new.ndim - 1)), new, old), actors, self.actor)
            self.score = np.where(better, scores, self.score)
            self.epoch = np.where(better, np.int32(epoch), self.epoch)

    def saved(self) -> dict:
        """What a checkpoint stores: fixed shapes (the history padded to the judgements to come)."""
        epochs = np.full((self._judgements,), -1, np.int32)
        scores = np.full((self._judgements, self.score.shape[0]), np.nan, np.float32)
        for i, (epoch, judged) in enumerate(self.history[:self._judgements]):
            epochs[i], scores[i] = epoch, judged
        saved = {"actor": self.actor, "score": np.asarray(self.score), "epoch": np.asarray(self.epoch),
                 "calls": np.asarray(self._calls, np.int32), "judged_epoch": epochs, "judged_score": scores}
        if self.average > 1:  # fixed shapes: the actors averaged, oldest first, padded with the kept actor
            padded = self._recent + [self.actor] * (self.average - len(self._recent))
            saved |= {"recent": jax.tree.map(lambda *x: jnp.stack(x), *padded),
                      "recent_count": np.asarray(len(self._recent), np.int32)}
        return saved

    def load(self, saved: dict) -> None:
        """Back to what `saved()` returned (a resumed job)."""
        self.actor = saved["actor"]
        self.score = np.asarray(saved["score"], np.float32)
        self.epoch = np.asarray(saved["epoch"], np.int32)
        self._calls = int(saved["calls"])
        self.history = [(int(e), [float(x) for x in scores])
                        for e, scores in zip(saved["judged_epoch"], saved["judged_score"], strict=True) if e >= 0]
        if self.average > 1:
            count = int(saved["recent_count"])
            self._recent = [jax.tree.map(lambda x, i=i: x[i], saved["recent"]) for i in range(count)]
