"""Which checkpoint a selection rule keeps, against every checkpoint judged in hindsight.

Not run by itself: `train_reference.py --assess DIR --hindsight` (same options and seed as the
run, which was trained with `--save DIR --save-evaluated`) calls `hindsight`. Every evaluated
checkpoint is assessed on the 20 assessment races and the time trial, which did not choose
it; the run's own checkpoint evaluations (16 selection races each, in its results JSON) are
what each rule sees. The rules:

- *racing score*: the lowest `racing_score` on the selection races (what `KeepBest` keeps);
- *most targets*: the most of issue 16's four targets met on the selection races, ties to
  the lower racing score;
- *last*: the last evaluated checkpoint;
- *hindsight*: the most targets met on the assessment races themselves, ties to the lower
  racing score there (an upper bound no rule can reach: it looks at the answer).

If no checkpoint meets the targets in hindsight, choosing better cannot help and training
must; if some do and the rules miss them, the selection is the lever. With
`--hindsight-fields N` the checkpoints race on a third set of fields instead, drawn apart
from both, so that rules reading the selection or the assessment races can be judged on
races none of them saw (results/checkpoint_hindsight-<tag>-fieldsN.json). With
`--hindsight-average K` the checkpoints are replaced by weight averages (stochastic weight
averaging over checkpoints): at each one the uniform mean of the last K evaluated actors'
parameters, as `KeepBest(average=K)` takes it in training (`averaged_hindsight`), raced on
the selection races of its last
checkpoint (what a rule sees) and on the same assessment races as the single checkpoints,
so the two compare race for race; with `--select-races N` the averages race on N selection
races instead of the run's 16 (`-selectN` in the file's name), and each race's finish, contacts
and course-outs are kept, so that a rule can be re-scored on any subset of them. Each checkpoint races
alone, as the run's own assessment did: raced as a stack of actors, their networks' sums round
otherwise and the races drift apart (on the oval, a kept checkpoint's 23 course-outs in 3 races
became 20 in a stack of 4). A checkpoint whose save failed in training is named, and nothing is
assessed. Host-side.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import scipy.stats
from common import RESULTS, print_table, write_results

from jaxrace.agents.checkpoint import load_checkpoint
from jaxrace.agents.selection import Assessment, average_params, racing_score


def run_evaluations(tag: str) -> list[dict]:
    """The run's checkpoint evaluations from results/train_reference-<tag>.json."""
    path = RESULTS / f"train_reference{'-' + tag if tag else ''}.json"
    if not path.exists():
        raise SystemExit(f"{path}: no results of the run (--tag must be the run's)")
    rows = [r for r in json.loads(path.read_text())["rows"] if r["name"].endswith("checkpoint evaluations")]
    if not rows or not rows[0]["value"] or "met" not in rows[0]["value"][0]:
        raise SystemExit(f"{path}: no checkpoint evaluations with targets met (a run before --save-evaluated)")
    return rows[0]["value"]


def rule_choices(evals: list[dict], assessed: list[dict]) -> dict[str, int]:
    """Index of the checkpoint each rule keeps (`evals` and `assessed` in the same, epoch, order)."""
    first_min = lambda keys: min(range(len(keys)), key=lambda i: (keys[i], i))  # noqa: E731 (KeepBest: first on ties)
    return {
        "racing score": first_min([e["score"] for e in evals]),
        "most targets": first_min([(-sum(e["met"].values()), e["score"]) for e in evals]),
        "last": len(evals) - 1,
        "hindsight": first_min([(-a["targets_met"], a["score"]) for a in assessed]),
    }


def assessed_row(epoch: int, steps: int, a: Assessment, lap_miss: float = 1.0) -> dict:
    met = a.met()
    return {"epoch": epoch, "steps": steps, "targets_met": sum(met.values()), "met": met,
            "score": round(racing_score(a, lap_miss=lap_miss), 3), "median_position": float(np.median(a.positions)),
            "at_fault_per_race": a.at_fault / a.races, "course_outs_per_race": a.course_outs / a.races,
            "lap_gap": None if a.lap_gap is None else round(a.lap_gap, 2), "lap_outs": a.lap_outs}


def selection_row(epoch: int, a: Assessment, lap_miss: float = 1.0) -> dict:
    """What a rule sees of an average's selection races: its score and targets, and each race's
    finish, at-fault contacts and course-outs (so that a rule can be re-scored offline on a subset)."""
    return {"epoch": epoch, "score": racing_score(a, lap_miss=lap_miss), "met": a.met(),
            "lap_gap": None if a.lap_gap is None else round(a.lap_gap, 3), "lap_outs": a.lap_outs,
            "positions": list(a.positions), "at_fault_by_race": list(a.at_fault_by_race),
            "outs_by_race": list(a.outs_by_race)}


def hindsight(directory: Path, template, final_assessment, ref_lap: float, tag: str, out: str | None = None,
              lap_miss: float = 1.0) -> None:
    """Assesses every checkpoint under `directory`/evaluated with `final_assessment(actor) -> Assessment`
    (the run's own assessment, or a third set of races) and writes results/checkpoint_hindsight-<out>.json
    (`out`: the run's `tag` unless given)."""
    evals = run_evaluations(tag)
    saved = sorted((directory / "evaluated").glob("epoch*"))
    by_epoch = {int(p.name.removeprefix("epoch")): p for p in saved}
    missing = [e["epoch"] for e in evals if e["epoch"] not in by_epoch]
    if missing:
        raise SystemExit(f"{directory}/evaluated: no saved actor for the evaluated epochs {missing}")
    assessed = []
    for e in evals:  # one at a time: see the module's docstring
        a = final_assessment(load_checkpoint(by_epoch[e["epoch"]], template)[0])
        assessed.append(assessed_row(e["epoch"], e["steps"], a, lap_miss))
        print(f"assessed {len(assessed)} of {len(evals)} checkpoints", flush=True)
    choices = rule_choices(evals, assessed)
    print_table(["epoch", "selection: score", "targets met", "assessment: score", "targets met", "median",
                 "at fault/race", "outs/race", "lap gap %", "TT outs"],
                [[a["epoch"], round(e["score"], 2), sum(e["met"].values()), a["score"], a["targets_met"],
                  a["median_position"], a["at_fault_per_race"], a["course_outs_per_race"], a["lap_gap"],
                  a["lap_outs"]] for e, a in zip(evals, assessed, strict=True)])
    rule_rows = [[rule, assessed[i]["epoch"], assessed[i]["targets_met"], assessed[i]["score"]]
                 for rule, i in choices.items()]
    print_table(["rule", "kept epoch", "assessment: targets met", "assessment: score"], rule_rows)
    rho = scipy.stats.spearmanr([e["score"] for e in evals], [a["score"] for a in assessed]).statistic
    print(f"rank correlation of the selection and the assessment racing scores: {rho:.2f}")
    rows = [{"name": f"{rule}: kept checkpoint, targets met on the assessment races", "value": met,
             "unit": "targets", "epoch": epoch, "score": score} for rule, epoch, met, score in rule_rows]
    rows += [{"name": "checkpoints meeting k targets on the assessment races (k = 0..4)", "unit": "count",
              "value": [sum(a["targets_met"] == k for a in assessed) for k in range(5)]},
             {"name": "rank correlation, selection vs assessment racing score (Spearman)", "unit": "rho",
              "value": round(float(rho), 3)},
             {"name": "every checkpoint: the selection races and the assessment", "unit": "list",
              "value": [{"selection": e, "assessment": a} for e, a in zip(evals, assessed, strict=True)]},
             {"name": "reference lap", "value": round(ref_lap, 2), "unit": "s"},
             {"name": "saved actors", "value": str(directory), "unit": "path"}]
    print(f"wrote {write_results(f'checkpoint_hindsight-{out or tag}', rows)}")


def average_windows(count: int, k: int) -> list[list[int]]:
    """The checkpoint indices each average takes: the last `k` at each of `count` checkpoints (the
    fewer there are at the first k - 1, as `KeepBest(average=k)` takes them; k = 1: each alone, as a
    run's own selection raced it, for runs that kept averages)."""
    return [list(range(max(i - k + 1, 0), i + 1)) for i in range(count)]


def averaged_hindsight(directory: Path, template, final_assessment, select_assessment, ref_lap: float, tag: str,
                       out: str, window: int, lap_miss: float = 1.0) -> None:
    """Assesses weight averages of the saved checkpoints (see the module's docstring) with
    `final_assessment(actor) -> Assessment`, and on the selection races of the average's last
    checkpoint with `select_assessment(actor, epoch)`, so each rule of `rule_choices` can keep an
    average as it kept a checkpoint; writes results/checkpoint_hindsight-<out>.json."""
    evals = run_evaluations(tag)
    by_epoch = {int(p.name.removeprefix("epoch")): p for p in (directory / "evaluated").glob("epoch*")}
    missing = [e["epoch"] for e in evals if e["epoch"] not in by_epoch]
    if missing:
        raise SystemExit(f"{directory}/evaluated: no saved actor for the evaluated epochs {missing}")
    windows = average_windows(len(evals), window)
    loaded, selected, assessed = {}, [], []
    for members in windows:
        for i in members:
            if i not in loaded:
                loaded[i] = load_checkpoint(by_epoch[evals[i]["epoch"]], template)[0]
        actor = average_params([loaded[i] for i in members])
        last = evals[members[-1]]
        selected.append(selection_row(last["epoch"], select_assessment(actor, last["epoch"]), lap_miss))
        assessed.append({**assessed_row(last["epoch"], last["steps"], final_assessment(actor), lap_miss),
                         "averaged_epochs": [evals[i]["epoch"] for i in members]})
        print(f"assessed {len(assessed)} of {len(windows)} averages", flush=True)
    choices = rule_choices(selected, assessed)
    print_table(["last epoch", "checkpoints", "selection: score", "targets met", "assessment: score", "targets met",
                 "median", "at fault/race", "outs/race", "lap gap %", "TT outs"],
                [[a["epoch"], len(a["averaged_epochs"]), round(e["score"], 2), sum(e["met"].values()), a["score"],
                  a["targets_met"], a["median_position"], a["at_fault_per_race"], a["course_outs_per_race"],
                  a["lap_gap"], a["lap_outs"]] for e, a in zip(selected, assessed, strict=True)])
    rule_rows = [[rule, assessed[i]["epoch"], assessed[i]["targets_met"], assessed[i]["score"]]
                 for rule, i in choices.items()]
    print_table(["rule", "kept average (last epoch)", "assessment: targets met", "assessment: score"], rule_rows)
    rows = [{"name": "averaged checkpoints: the last K evaluated actors' parameters",
             "unit": "window", "value": window}]
    rows += [{"name": f"{rule}: kept average, targets met on the assessment races", "value": met,
              "unit": "targets", "epoch": epoch, "score": score} for rule, epoch, met, score in rule_rows]
    rows += [{"name": "averages meeting k targets on the assessment races (k = 0..4)", "unit": "count",
              "value": [sum(a["targets_met"] == k for a in assessed) for k in range(5)]},
             {"name": "every average: the selection races and the assessment", "unit": "list",
              "value": [{"selection": e, "assessment": a} for e, a in zip(selected, assessed, strict=True)]},
             {"name": "reference lap", "value": round(ref_lap, 2), "unit": "s"},
             {"name": "saved actors", "value": str(directory), "unit": "path"}]
    print(f"wrote {write_results(f'checkpoint_hindsight-{out}', rows)}")
