"""What every judge shares: a pair of clips in, a `Verdict` out (host-side)."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from jaxrace.rewards.clips import Clip


@dataclasses.dataclass(frozen=True)
class ClipFacts:
    """What happened in one clip of the ego car, summed over its valid steps."""

    steps: int
    progress: float  # m along the course
    positions_gained: int  # start rank - end rank
    at_fault_contacts: int  # onsets of running into the back of another car
    side_contacts: int
    hit_from_behind: int  # onsets of being run into (not the ego car's fault)
    course_outs: int  # onsets
    wall_hits: int  # onsets
    standing: int = 0  # places up on the grid at the clip's end (start rank - rank), as the video's P shows

    def describe(self) -> str:
        return (f"{self.progress:.0f} m, {self.positions_gained:+d} places, {self.at_fault_contacts} at-fault "
                f"contacts, {self.side_contacts} side contacts, {self.course_outs} course-outs, "
                f"{self.wall_hits} wall hits, {self.standing:+d} on the grid at the end")


@dataclasses.dataclass(frozen=True)
class Pair:
    """Two clips as shown to a judge (first, then second), with a key naming the pair."""

    key: str
    first: Clip  # one clip: views [T + 1], actions [T], valid [T] (numpy)
    second: Clip
    first_video: str | None = None
    second_video: str | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """label in {first, second, tie, skip}; confidence in [0, 1]; rationale in words."""

    label: str
    confidence: float
    rationale: str


class Judge(Protocol):
    kind: str  # "scripted", "vlm", "human"
    id: str  # which judge of that kind (its settings)

    def judge(self, pair: Pair) -> Verdict: ...


def _onsets(flag: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """bool[T]: flag became true at this transition (views [T + 1] -> T transitions)."""
    flag = np.asarray(flag, bool)
    return flag[1:] & ~flag[:-1] & valid


def step_facts(clip: Clip) -> dict[str, np.ndarray]:
    """Per-transition facts of one clip (arrays [T], zero after the episode ended)."""
    v = clip.views
    valid = np.asarray(clip.valid, bool)
    rank = np.asarray(v.rank, np.int64)
    return {
        "progress": np.where(valid, np.diff(np.asarray(v.progress, np.float64)), 0.0),
        "positions_gained": np.where(valid, rank[:-1] - rank[1:], 0),
        "at_fault_contacts": _onsets(v.hit_other_from_behind, valid),
        "side_contacts": _onsets(v.side_contact, valid),
        "hit_from_behind": _onsets(v.hit_from_behind, valid),
        "course_outs": _onsets(v.off_course, valid),
        "wall_hits": _onsets(v.wall_contact, valid),
    }


def standing(clip: Clip, at: str = "end") -> int:
    """Places up on the grid (start rank - rank) at the clip's first view (`at="start"`) or its
    last valid one (`"end"`: the view before the first padded transition)."""
    if at not in ("start", "end"):
        raise ValueError(f"standing(at=...) is 'start' or 'end', not {at!r}")
    valid = np.asarray(clip.valid, bool)
    view = 0 if at == "start" else int(np.sum(np.cumprod(valid)))  # views 0..last are of the episode
    return int(np.asarray(clip.views.start_rank)[view] - np.asarray(clip.views.rank)[view])


def clip_facts(clip: Clip) -> ClipFacts:
    """The sums of `step_facts` over one clip, and its `standing` at the end."""
    facts = step_facts(clip)
    return ClipFacts(steps=int(np.sum(clip.valid)), progress=float(np.sum(facts["progress"])),
                     **{k: int(np.sum(v)) for k, v in facts.items() if k != "progress"}, standing=standing(clip))
