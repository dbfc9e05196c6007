"""The scripted judge: prefers the clip that scores higher on the task, with B-Pref's noise.

Host-side. A clip's score is a weighted sum of per-step facts (metres of progress, places
gained, at-fault and side contacts, course-outs, wall hits) and of where the car stands on
the grid at the clip's end (places up from its start, as the video's P shows), the weights
read from the task's words (`TaskScoring.from_task`). The noise models are those of B-Pref (Lee et al.,
2021), a teacher that is:
- myopic: step t of T counts `myopic ** (T - 1 - t)` (1.0: every step the same);
- skipping: both clips score below `skip_below` -> skip (None: never);
- equal: scores within `equal_within` -> tie;
- stochastic: picks the first with probability sigmoid(beta * (s1 - s2)) (beta inf: always the better);
- mistaken: flips its answer with probability `mistake`.
Draws are seeded per pair (the judge's seed and the pair's key), so a verdict does not
depend on the order pairs are judged in, and a stage redone after a crash judges alike.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

from jaxrace.judges.base import Pair, Verdict, clip_facts, standing, step_facts


@dataclasses.dataclass(frozen=True)
class TaskScoring:
    """Points per unit of each per-step fact."""

    progress: float = 0.01  # per metre (a 100 m lead is a point)
    positions_gained: float = 1.0
    at_fault_contacts: float = -1.0
    side_contacts: float = -0.25
    hit_from_behind: float = 0.0
    course_outs: float = -1.0
    wall_hits: float = -1.0
    standing: float = 0.0  # per place up on the grid at the clip's start or end (not discounted)
    # "start": the places a clip gains count once, as positions_gained, so a pass that costs an at-fault
    # contact scores what it did without the standing; "end" (as the video's P shows at the end) counts
    # them twice, and under "cleanly" a pass by contact cost nothing
    standing_at: str = "start"

    @classmethod
    def from_task(cls, task: str) -> TaskScoring:
        """Weights leaning on the task's words: "clean" makes contacts count triple, and so on."""
        t = task.lower()
        out = cls()
        if any(w in t for w in ("clean", "no contact", "collision", "safe", "fair")):
            out = dataclasses.replace(out, at_fault_contacts=-3.0, side_contacts=-1.0)
        if any(w in t for w in ("win", "overtake", "pass", "position", "back of the grid")):
            out = dataclasses.replace(out, positions_gained=2.0, standing=1.0)
        if any(w in t for w in ("track limits", "on track", "clean", "stay")):
            out = dataclasses.replace(out, course_outs=-2.0, wall_hits=-2.0)
        if any(w in t for w in ("fast", "lap time", "pace", "quick")):
            out = dataclasses.replace(out, progress=0.02)
        return out


@dataclasses.dataclass(frozen=True)
class ScriptedJudge:
    """A judge from the task's scoring and B-Pref noise (see the module docstring)."""

    scoring: TaskScoring = TaskScoring()
    beta: float = math.inf
    mistake: float = 0.0
    equal_within: float = 0.0
    skip_below: float | None = None
    myopic: float = 1.0
    seed: int = 0
    kind: str = "scripted"

    def __post_init__(self):
        if not (self.beta > 0) or not (0.0 <= self.mistake <= 1.0) or self.equal_within < 0:
            raise ValueError(f"ScriptedJudge needs beta > 0, mistake in [0, 1] and equal_within >= 0; got "
                             f"beta={self.beta}, mistake={self.mistake}, equal_within={self.equal_within}")
        if not (0.0 < self.myopic <= 1.0):
            raise ValueError(f"ScriptedJudge needs myopic in (0, 1], got {self.myopic}")

    @property
    def id(self) -> str:
        return (f"scripted(beta={self.beta:g}, mistake={self.mistake:g}, equal={self.equal_within:g}, "
                f"skip={self.skip_below}, myopic={self.myopic:g}, seed={self.seed})")

    def score(self, clip) -> float:
        """The clip's task score (myopically discounted)."""
        facts = step_facts(clip)
        t = len(facts["progress"])
        discount = self.myopic ** np.arange(t - 1, -1, -1, dtype=np.float64)
        weights = dataclasses.asdict(self.scoring)
        steps = sum(weights[k] * np.sum(discount * np.asarray(v, np.float64)) for k, v in facts.items())
        up = standing(clip, self.scoring.standing_at) if self.scoring.standing else 0
        return float(steps + self.scoring.standing * up)

    def judge(self, pair: Pair) -> Verdict:
        s1, s2 = self.score(pair.first), self.score(pair.second)
        f1, f2 = clip_facts(pair.first), clip_facts(pair.second)
        why = f"first: {f1.describe()} (score {s1:.2f}); second: {f2.describe()} (score {s2:.2f})"
        rng = np.random.default_rng(
            [self.seed, int.from_bytes(hashlib.sha256(pair.key.encode()).digest()[:8], "little")])
        if self.skip_below is not None and max(s1, s2) < self.skip_below:
            return Verdict("skip", 1.0, f"neither clip does the task well enough to compare; {why}")
        if abs(s1 - s2) <= self.equal_within:
            return Verdict("tie", 1.0, f"the clips are equally good; {why}")
        p_first = 1.0 / (1.0 + math.exp(-max(min(self.beta * (s1 - s2), 700.0), -700.0)))
        first = bool(rng.uniform() < p_first) if math.isfinite(self.beta) else s1 > s2
        if rng.uniform() < self.mistake:
            first = not first
        return Verdict("first" if first else "second", p_first if first else 1.0 - p_first, why)
