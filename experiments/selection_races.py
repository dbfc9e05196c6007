"""How the kept weight average is chosen: how many selection races, and a step for a missed lap.

Reads the averaged hindsight of saved runs raced on N selection races and the 40 held-out
races (`train_reference.py --assess DIR --hindsight --hindsight-average 5 --select-races N
--hindsight-fields 1 --races 40`: results/checkpoint_hindsight-<tag>-selectN-fields1-avg5.json,
which keep each selection race's finish, at-fault contacts and course-outs). For every run
and each n of the N races, `--draws` random subsets of n races (the same subset for every
average of the run, as one set of fields judges a whole training run) choose the average
with the lowest `racing_score`, with and without `lap_miss=1` (a missed lap target costs 1
more); the chosen average's targets on the held-out races are what the rule is worth.
*best* is the most targets any average of the run meets there (no rule can beat it).
The step was first tried on some of these runs (`CONCEIVED_ON`), so the table also sums the
others apart, and the runs trained after it became the default (`TRAINED_WITH_STEP`). Nothing
is trained. Host-side.

    python experiments/selection_races.py [--select-races 48] [--draws 400]
"""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
from common import RESULTS, print_table, write_results

from jaxrace.agents.selection import Assessment, racing_score

SUBSETS = (8, 16, 24, 32, 48)
# The runs on whose saved hindsight the lap-miss step was first tried (2026-11-30, on the 16 races
# the runs had chosen with): the others test it afresh.
CONCEIVED_ON = {f"{c} {s} margin03-headway-offtrack025" for c in ("gp", "brands") for s in range(1, 6)} | {
    "gp 3 margin00-headway-offtrack025", "brands 3 margin00-headway-offtrack025"}
# Runs trained after the step became the default (their kept averages were chosen with it in training).
TRAINED_WITH_STEP = ("-keepavg5-lapmiss1", "-keepavg5-lrdecay05")


def run_name(path) -> str:
    """'gp 2 margin03-headway-offtrack025' from a hindsight file's name."""
    m = re.search(r"hindsight-(\w+)-E-envs32-avg-(.+?)(?:-keepavg5)?-xeon-seed(\d+)", path.name)
    return f"{m.group(1)} {m.group(3)} {m.group(2)}" if m else path.stem


def load(path) -> tuple[list[dict], np.ndarray]:
    """Each average's selection record, and the targets it meets on the held-out races."""
    rows = json.loads(path.read_text())["rows"]
    every = next(r for r in rows if r["name"].startswith("every average"))["value"]
    if "at_fault_by_race" not in every[0]["selection"]:
        raise SystemExit(f"{path}: no per-race selection records (a hindsight before --select-races)")
    return [e["selection"] for e in every], np.array([e["assessment"]["targets_met"] for e in every])


def choose(selections: list[dict], races: np.ndarray, lap_miss: float) -> int:
    """Index of the average with the lowest racing score on the selection races `races`
    (the first on ties, as KeepBest)."""
    scores = [racing_score(Assessment(lap=None, lap_gap=s["lap_gap"], lap_outs=s["lap_outs"],
                                      positions=tuple(np.asarray(s["positions"])[races]),
                                      at_fault=int(np.asarray(s["at_fault_by_race"])[races].sum()),
                                      course_outs=int(np.asarray(s["outs_by_race"])[races].sum())),
                           lap_miss=lap_miss) for s in selections]
    return int(np.argmin(scores))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--select-races", type=int, default=48, help="N: the selection races the hindsight ran")
    parser.add_argument("--draws", type=int, default=400, help="random subsets per run and subset size")
    args = parser.parse_args()
    paths = sorted(RESULTS.glob(f"checkpoint_hindsight-*-select{args.select_races}-fields1-avg5.json"))
    if not paths:
        raise SystemExit(f"no results/checkpoint_hindsight-*-select{args.select_races}-fields1-avg5.json: "
                         "run the hindsight above first")
    sizes = [n for n in SUBSETS if n <= args.select_races]
    rng = np.random.default_rng(0)
    runs, table = [], []
    for path in paths:
        selections, held_out = load(path)
        total = len(selections[0]["positions"])
        if total != args.select_races:
            raise SystemExit(f"{path}: {total} selection races, not {args.select_races}")
        run = {"run": run_name(path), "best": int(held_out.max()), "rules": {}}
        for n in sizes:
            subsets = [np.arange(n)] if n == total else [np.sort(rng.choice(total, n, replace=False))
                                                         for _ in range(args.draws)]
            for lap_miss in (0.0, 1.0):
                kept = np.array([held_out[choose(selections, races, lap_miss)] for races in subsets])
                run["rules"][f"{n} races, lap_miss {lap_miss:g}"] = {
                    "targets": float(kept.mean()), "all_four": float(np.mean(kept == 4))}
        runs.append(run)
        table.append([run["run"], run["best"]] + [f"{r['targets']:.2f} / {r['all_four']:.2f}"
                                                    for r in run["rules"].values()])
    rules = list(runs[0]["rules"])
    groups = {"all runs": runs, "runs the step was tried on first": [r for r in runs if r["run"] in CONCEIVED_ON],
              "the other runs": [r for r in runs if r["run"] not in CONCEIVED_ON],
              "runs trained with the step": [r for r in runs if r["run"].endswith(TRAINED_WITH_STEP)]}
    sums = {}
    for group, members in groups.items():
        sums[group] = {rule: (sum(r["rules"][rule]["targets"] for r in members),
                              sum(r["rules"][rule]["all_four"] for r in members)) for rule in rules}
        table.append([f"sum, {group} ({len(members)})", sum(r["best"] for r in members)]
                     + [f"{t:.1f} / {f:.1f}" for t, f in sums[group].values()])
    print("held-out targets of the kept average (mean over subsets) / share of subsets meeting all four")
    print_table(["run", "best"] + rules, table)
    rows = [{"name": f"{r['run']}: {rule}: kept average, held-out targets (mean over subsets)",
             "value": round(v["targets"], 3), "unit": "targets", "all_four_share": round(v["all_four"], 3)}
            for r in runs for rule, v in r["rules"].items()]
    rows += [{"name": f"{r['run']}: best average, held-out targets", "value": r["best"], "unit": "targets"}
             for r in runs]
    rows += [{"name": f"sum, {group}: {rule}", "value": round(t, 2), "unit": "targets",
              "runs_all_four": round(f, 2), "runs": len(groups[group])}
             for group, by_rule in sums.items() for rule, (t, f) in by_rule.items()]
    rows.append({"name": "options", "value": vars(args), "unit": "options"})
    print("wrote", write_results(__file__, rows))


if __name__ == "__main__":
    main()
