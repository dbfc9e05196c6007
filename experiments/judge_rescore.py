"""What a judge with other weights would have picked in finished runs: a rescoring of stored clips.

Usage: python experiments/judge_rescore.py RUN_DIR [RUN_DIR ...]

Reads each run directory's preference store (the clips of every iteration's evaluation races,
with their facts) and scores every clip linearly as the scripted judge does (`TaskScoring`,
no myopic discount), under the task's own weights and under variants that price an at-fault
contact higher or a metre of progress lower. Per variant and iteration it names the candidate
with the best mean clip score (a noiseless judge's pick, which Bradley-Terry over all pairs
orders alike) and that candidate's evaluation races (rank.json). It asks whether the judge's
weights, not the candidates, are why the loop's picks race with contacts: a pick that changes
to a candidate with fewer contacts under a heavier contact price says so. Host-side only, no
training. Writes results/judge_rescore.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import numpy as np
from common import print_table, run_dirs, write_results

from jaxrace.judges import TaskScoring

# the per-step facts a clip's stored metrics sum, as TaskScoring weighs them; the standing is left out: a
# whole-race clip starts on the grid, so the standing at its start gains nothing
FACTS = tuple(f.name for f in dataclasses.fields(TaskScoring) if f.name not in ("standing", "standing_at"))


def variants(task: str) -> dict[str, TaskScoring]:
    base = TaskScoring.from_task(task)
    return {
        "the task's weights": base,
        "contact x3": dataclasses.replace(base, at_fault_contacts=3 * base.at_fault_contacts),
        "contact x10": dataclasses.replace(base, at_fault_contacts=10 * base.at_fault_contacts),
        "progress x0.2": dataclasses.replace(base, progress=0.2 * base.progress),
        "contact x3, progress x0.2": dataclasses.replace(base, at_fault_contacts=3 * base.at_fault_contacts,
                                                         progress=0.2 * base.progress),
    }


def clip_scores(run: Path, scoring: TaskScoring) -> dict[int, dict[str, float]]:
    """{iteration: {candidate: mean clip score}} over the store's clips of iterations >= 1."""
    weights = dataclasses.asdict(scoring)
    sums: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    store = run / "preferences.sqlite"
    with contextlib.closing(sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)) as db:
        for iteration, candidate, metrics in db.execute(
                "SELECT iteration, candidate, metrics FROM clips WHERE iteration >= 1"):
            m = json.loads(metrics)
            sums[iteration][candidate].append(sum(weights[f] * m[f] for f in FACTS))
    return {k: {c: float(np.mean(v)) for c, v in per.items()} for k, per in sums.items()}


def main() -> None:
    rows, table = [], []
    for run in run_dirs(__doc__.splitlines()[0]):
        task = json.loads((run / "config.json").read_text())["task"]
        for name, scoring in variants(task).items():
            for k, scores in sorted(clip_scores(run, scoring).items()):
                rank = json.loads((run / f"iter{k}" / "rank.json").read_text())
                pick = max(scores, key=scores.get)
                races = rank["races"].get(pick, {})
                row = {"name": f"{run.name}: iter{k}: {name}", "value": pick, "unit": "candidate",
                       "bradley_terry_best": rank["best"], "mean_clip_score": scores[pick],
                       "median_position": races.get("median_position"),
                       "at_fault_contacts_per_race": races.get("at_fault_contacts_per_race"),
                       "course_outs_per_race": races.get("course_outs_per_race"), "finished": races.get("finished")}
                rows.append(row)
                table.append([run.name, k, name, pick + (" (BT's)" if pick == rank["best"] else ""),
                              f"{row['median_position']:.1f}", f"{row['at_fault_contacts_per_race']:.1f}",
                              f"{row['course_outs_per_race']:.1f}", f"{row['finished']:.1f}"])
    print_table(["run", "iteration", "judge weights", "pick (by mean clip score)", "median finish",
                 "at-fault contacts/race", "course-outs/race", "share finished"], table)
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
