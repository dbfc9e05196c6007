"""Agreement between judges on the pairs they both labelled: rate and Cohen's kappa (host-side).

Two preferences are on the same pair when they compare the same two clips, in either
order; a label given with the clips the other way round is turned round first. Skips
are left out. Cohen's kappa corrects the agreement rate for chance,
`(p_o - p_e) / (1 - p_e)`, with `p_e` from each judge's own label frequencies: the
measure the GT7 paper reports between the VLM and people, and between people.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter, defaultdict

LABELS = ("first", "second", "tie")
_FLIP = {"first": "second", "second": "first", "tie": "tie"}


@dataclasses.dataclass(frozen=True)
class Agreement:
    """Two judges on the pairs both labelled (skips left out)."""

    judge_a: str
    judge_b: str
    shared: int
    agreed: int
    kappa: float | None  # None when chance agreement is 1 (both always give one and the same label)

    @property
    def rate(self) -> float | None:
        return self.agreed / self.shared if self.shared else None


def cohen_kappa(a: list[str], b: list[str]) -> float | None:
    """Cohen's kappa of two equally long label lists."""
    if len(a) != len(b):
        raise ValueError(f"label lists differ in length: {len(a)} and {len(b)}")
    if not a:
        return None
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b, strict=True)) / n
    fa, fb = Counter(a), Counter(b)
    p_e = sum(fa[k] * fb[k] for k in set(fa) | set(fb)) / (n * n)
    return None if p_e == 1.0 else (p_o - p_e) / (1.0 - p_e)


def agreements(preferences) -> list[Agreement]:
    """Every pair of judges (by `judge_id`) that share labelled pairs; `preferences` as the store returns them."""
    labels: dict[str, dict[tuple[int, int], str]] = defaultdict(dict)
    for p in preferences:
        if p.label not in LABELS:
            continue
        pair, label = ((p.first, p.second), p.label) if p.first < p.second else ((p.second, p.first), _FLIP[p.label])
        labels[p.judge_id][pair] = label
    out = []
    for ja, jb in itertools.combinations(sorted(labels), 2):
        shared = sorted(set(labels[ja]) & set(labels[jb]))
        if not shared:
            continue
        a, b = [labels[ja][s] for s in shared], [labels[jb][s] for s in shared]
        out.append(Agreement(ja, jb, len(shared), sum(x == y for x, y in zip(a, b, strict=True)), cohen_kappa(a, b)))
    return out
