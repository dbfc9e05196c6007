"""Best of k seeds: train k reference runs side by side and keep the one whose kept policy
scores best on its selection races. How often would that meet issue 16's four targets?

Usage: python experiments/best_of_seeds.py [--k 2 3] [--steps N]
       python experiments/best_of_seeds.py --pick results/train_reference-A.json results/train_reference-B.json

Trains nothing: reads the default recipe's runs on `gp` and BrandsHatch (results of
`train_reference.py` with `--keep-average 5`; seeds 1-3, trained before that option, as
emulated from their saved checkpoints by `checkpoint_hindsight.py --hindsight-average 5`).
For each run: the average it kept (by its own rule: seeds 1-5 were selected without the
lap step, as in the README's table of every seed), that average's racing score on its 16
selection races with the lap step (`racing_score`, `--lap-miss 1`, so runs of either rule
compare alike) and the targets it meets on the 20 assessment races, which are other races
than the selection's. Then for every set of k runs of a circuit,
the run with the lowest score is the pick: the share of sets whose pick meets all four
targets, against the share of single runs that do.

Choosing between runs by their selection races is the same rule that chooses the kept
checkpoint within a run, so nothing is judged on the races it is assessed by. k runs on
the 2 cores cost k/2 times one run on each core: two runs side by side, one pinned core
each, is the budget of one run on both cores, which trains about 1.34x the steps of one
core (both cores for one run, in docs/reference_agent.md).

`--pick FILE ...` applies the rule to runs trained for it (side by side, with
`--keep-average 5 --lap-miss 1`): it names the pick and its targets, writes nothing.

`--steps N` judges runs cut at N env steps (the recipe's runs trained 3,328,000; two side
by side within issue 16's 30 minutes on a 2-core Intel Xeon train about 2,660,000 each):
the kept average is then the best scored among those evaluated by N. Its targets are known
where the run's every average was assessed (seeds 1-3) or where the kept one comes before
N; otherwise the run counts as unknown, and the shares are given with unknown runs as
failures and as successes. Writes results/best_of_seeds.json (with --steps:
best_of_seeds-steps<N>.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from pathlib import Path

from common import RESULTS, print_table, write_results

from jaxrace.agents.selection import Targets

RECIPE = "E-envs32-avg-margin03-headway-offtrack025"
TARGETS = ("lap", "position", "at_fault", "course_outs")


def _rows(path: Path) -> dict:
    return {r["name"]: r["value"] for r in json.loads(path.read_text())["rows"]}


def _lap_step(score: float, lap_met: bool, lap_miss: float) -> float:
    """The score with the lap step (`--lap-miss 1`), whatever the run was selected with."""
    return score + (0.0 if lap_met or lap_miss else 1.0)


def emulated_run(circuit: str, seed: int, steps: int | None) -> dict:
    """A run trained before `--keep-average`: its averages of 5, all assessed (hindsight)."""
    path = RESULTS / f"checkpoint_hindsight-{circuit}-{RECIPE}-xeon-seed{seed}-avg5.json"
    every = _rows(path)["every average: the selection races and the assessment"]
    every = [a for a in every if steps is None or a["assessment"]["steps"] <= steps]
    # Kept as the README's table keeps it (the hindsight's rule, without the lap step); compared with it.
    best = min(every, key=lambda a: a["selection"]["score"])
    return dict(circuit=circuit, seed=seed, file=path.name, kept_steps=best["assessment"]["steps"],
                score=_lap_step(best["selection"]["score"], best["selection"]["met"]["lap"], 0.0),
                met=best["assessment"]["met"])


def trained_run(path: Path, circuit: str, seed: int, steps: int | None) -> dict:
    """A run trained with `--keep-average 5`: its selection scores, and the kept average's targets."""
    rows = _rows(path)
    tag = f"{'gp' if circuit == 'gp' else 'BrandsHatch'}: "
    lap_miss = rows["command-line options"].get("lap_miss", 0.0)
    evals = [e for e in rows[f"{tag}checkpoint evaluations"] if steps is None or e["steps"] <= steps]
    if not evals:
        raise SystemExit(f"{path.name}: no checkpoint evaluation at or before {steps} steps")
    best = min(evals, key=lambda e: e["score"])  # the run's own rule, as it kept its average
    kept_steps = rows[f"{tag}kept checkpoint: env steps"]
    met = None  # unknown: cut before the kept average, this average was never assessed
    if best["steps"] == kept_steps:
        k = f"{tag}kept checkpoint: "
        races = len(rows[f"{k}races, finishing positions"])
        lap_gap = rows[f"{k}time-trial lap vs reference"]
        t = Targets()  # as `Assessment.met` judges them
        met = {"lap": lap_gap is not None and lap_gap <= t.max_lap_gap and rows[f"{k}time-trial course-outs"] == 0,
               "position": rows[f"{k}20 races from P8 vs AI skill 0.9, median finish"] <= 3.0,
               "at_fault": rows[f"{k}races, collisions at fault (total)"] / races <= t.max_at_fault,
               "course_outs": rows[f"{k}races, course-outs (total)"] / races <= t.max_course_outs}
    return dict(circuit=circuit, seed=seed, file=path.name, kept_steps=best["steps"],
                score=_lap_step(best["score"], best["met"]["lap"], lap_miss), met=met)


def runs(circuit: str, steps: int | None) -> list[dict]:
    """Every run of the default recipe on `circuit` (gp or brands), by seed."""
    out = [emulated_run(circuit, seed, steps) for seed in (1, 2, 3)]
    for seed in range(4, 100):
        found = sorted(p for p in RESULTS.glob(f"train_reference-{circuit}-{RECIPE}-keepavg5-*seed{seed}.json")
                       if "-lrdecay" not in p.name and "-steps" not in p.name)
        if found:
            out.append(trained_run(found[0], circuit, seed, steps))
    return out


def all_four(run: dict) -> bool | None:
    return None if run["met"] is None else all(run["met"][t] for t in TARGETS)


def best_of(circuit_runs: list[dict], k: int) -> dict:
    """Over every set of k runs: how often the best-scored run meets all four targets."""
    sets = list(itertools.combinations(circuit_runs, k))
    picks = [min(s, key=lambda r: r["score"]) for s in sets]
    outcomes = [all_four(p) for p in picks]
    return {"sets": len(sets), "all four": sum(o is True for o in outcomes),
            "unknown": sum(o is None for o in outcomes)}


def pick(paths: list[Path]) -> None:
    """The run whose kept average scores best on its selection races, among `paths`."""
    table, picked = [], []
    for path in paths:
        circuit = "gp" if "-gp-" in path.name else "brands"
        found = re.search(r"seed(\d+)", path.stem)
        seed = int(found.group(1)) if found else -1
        try:
            run = trained_run(path, circuit, seed, None)
        except (OSError, ValueError, KeyError) as err:
            raise SystemExit(f"{path}: not a train_reference.py result of a --keep-average run "
                             f"({type(err).__name__}: {err})") from None
        picked.append(run)
        table.append([path.name, run["kept_steps"], round(run["score"], 2), sum(run["met"].values()),
                      "yes" if all_four(run) else "no"])
    print_table(["run", "kept steps", "selection score", "targets met", "all four"], table)
    best = min(picked, key=lambda r: r["score"])
    print(f"pick: {best['file']} ({'meets all four targets' if all_four(best) else 'misses a target'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--steps", type=int, default=None, help="judge the runs cut at this many env steps")
    parser.add_argument("--pick", type=Path, nargs="+", default=None, metavar="FILE",
                        help="train_reference results of runs trained side by side: name the best")
    args = parser.parse_args()
    if args.pick:
        return pick(args.pick)

    rows, table, summary = [], [], []
    for circuit in ("gp", "brands"):
        circuit_runs = runs(circuit, args.steps)
        for r in sorted(circuit_runs, key=lambda r: r["score"]):
            met = r["met"]
            table.append([circuit, r["seed"], r["kept_steps"], round(r["score"], 2),
                          "unknown" if met is None else sum(met.values()),
                          "unknown" if met is None else ("yes" if all_four(r) else "no")])
        rows.append({"name": f"{circuit}: runs (seed, kept steps, selection score, targets met on the assessment "
                             "races)", "unit": "list", "value": circuit_runs})
        singles = [all_four(r) for r in circuit_runs]
        share = {"k": 1, "sets": len(singles), "all four": sum(o is True for o in singles),
                 "unknown": sum(o is None for o in singles)}
        for result in [share] + [{"k": k, **best_of(circuit_runs, k)} for k in args.k]:
            low = result["all four"] / result["sets"]
            high = (result["all four"] + result["unknown"]) / result["sets"]
            summary.append([circuit, result["k"], result["sets"], result["all four"], result["unknown"],
                            f"{low:.0%}" if low == high else f"{low:.0%}-{high:.0%}"])
            rows.append({"name": f"{circuit}: best of {result['k']} by selection score, sets whose pick meets all "
                                 "four targets", "unit": "share", "value": [round(low, 3), round(high, 3)],
                         **result})
    print_table(["circuit", "seed", "kept steps", "selection score", "targets met", "all four"], table)
    print()
    print_table(["circuit", "k runs", "sets", "pick meets all four", "unknown", "share"], summary)
    if args.steps:
        rows.append({"name": "runs cut at", "value": args.steps, "unit": "steps"})
    print(f"wrote {write_results('best_of_seeds' + (f'-steps{args.steps}' if args.steps else ''), rows)}")


if __name__ == "__main__":
    main()
