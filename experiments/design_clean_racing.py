"""The headline experiment: the reward-design loop against the library rewards on a grand-prix circuit.

Usage: python experiments/design_clean_racing.py [--preset standard] [--run-dir DIR] [--set KEY=VALUE ...]
       [--cpu-devices auto]

Runs `jaxrace design` with the `standard` preset (the task "win the race cleanly from the
back of the grid" on `gp`, offline proposer, a noisy scripted judge) on its default CPU
devices (one per core) in a run directory,
or resumes it there, then reads the final stage: the loop's winner (with `final_candidates` > 1, the
finalist the judge picked from their final races; the others are printed too) and the library rewards
`gt_sophy` and `progress`, trained in one job with the same number of env steps each,
each keeping its best checkpoint by the task's selection races (with `final_seeds` > 1 each
reward trains that many draws and its agent is the draw best on those races; every draw is
printed), then raced `final_races`
times from P8 of 8 against the AI at skill 0.9 on fields of their own, and alone for a
two-lap time trial. Prints the three side by side with issue 15's targets for the loop's
agent (median finish 3rd or better, at most 1 at-fault contact per race, a time-trial lap
within 10% of the reference lap), the env steps the search spent before the final job,
and the time of each stage; writes results/design_clean_racing.json (`--tag` adds a
suffix).
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

from common import print_table, write_results

from jaxrace.design.config import load_config
from jaxrace.design.loop import final_agents, loop_agent, race_summary, run_design
from jaxrace.envs.parallel import cpu_devices, use_cpu_devices
from jaxrace.rewards.library import LIBRARY

TARGETS = {"median finish <= 3": ("median_position", 3.0), "<= 1 at-fault contact per race":
           ("at_fault_contacts_per_race", 1.0), "time-trial lap within 10% of the reference": ("trial_gap", 0.10)}


def parse_sets(pairs: list[str]) -> dict:
    """`key=value` pairs, each value read as TOML (`epochs=100`, `track="oval"`, `varied_ai=false`)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value  # a bare word: a string
    return out


def final_table(run_dir: Path) -> tuple[list[dict], float]:
    """Per run of the final job: its candidate, race summary, kept epoch and selection score, and whether
    it is its reward's agent (its picked draw with `final_seeds` > 1); and the reference lap."""
    metrics = json.loads((run_dir / "final/race/metrics.json").read_text())
    curves = json.loads((run_dir / "final/train/curves.json").read_text())
    kept_path = run_dir / "final/train/kept.json"
    kept = json.loads(kept_path.read_text()) if kept_path.exists() else None
    trials = json.loads((run_dir / "final/trial.json").read_text())["trials"]
    ref = metrics["reference_lap"]
    # a final run started from a pretrained agent has its steps too (every final run starts alike)
    pretrained = pretrain_steps(run_dir) if (run_dir / "final/train/start.json").exists() else 0
    agents = final_agents(run_dir)
    out = []
    for i, run in enumerate(metrics["runs"]):
        summary = race_summary([metrics["races"][i]])
        lap, trial = summary.get("best_lap"), trials[i]["best_lap"]
        out.append({"candidate": run["candidate"], "seed": run["seed"], "failed": run["failed"],
                    "library": run["candidate"] in LIBRARY, "agent": agents[run["candidate"]] == i,
                    "env_steps": curves["epochs"] * curves["env_steps_per_epoch"] + pretrained,
                    "kept_epoch": kept["epoch"][i] if kept else None,
                    "selection_score": float(kept["task_score"][i]) if kept else None,
                    **summary, "lap_gap": None if lap is None else lap / ref - 1.0,
                    "trial_lap": trial, "trial_gap": None if trial is None else trial / ref - 1.0,
                    "trial_outs": trials[i]["course_outs"]})
    return out, ref


def pretrain_steps(run_dir: Path) -> int:
    """Env steps of one pretrained agent (`pretrain_epochs`); 0 without pretraining."""
    path = run_dir / "pretrain/train/curves.json"
    if not path.exists():
        return 0
    c = json.loads(path.read_text())
    return c["epochs"] * c["env_steps_per_epoch"]


def search_steps(run_dir: Path) -> int:
    """Env steps trained before the final job: pretraining (every seed) and the iterations (every
    candidate and seed; a carried best raced with its earlier agent, `reused_from`, trained nothing)."""
    total = 0
    for curves in sorted(run_dir.glob("*/train/curves.json")):
        if curves.parent.parent.name == "final":
            continue
        c = json.loads(curves.read_text())
        trained = [r for r in c["runs"] if "reused_from" not in r]
        total += len(trained) * c["epochs"] * c["env_steps_per_epoch"]
    return total


def targets_met(row: dict) -> dict[str, bool]:
    return {name: row.get(field) is not None and row[field] <= bound for name, (field, bound) in TARGETS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="standard")
    parser.add_argument("--config", default=None, help="a TOML file of DesignConfig fields")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one DesignConfig field (repeatable), the value as TOML")
    parser.add_argument("--run-dir", default="runs/design_clean_racing",
                        help="the loop's run directory; rerunning resumes it")
    parser.add_argument("--tag", default="", help="results go to results/design_clean_racing-<tag>.json")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--cpu-devices", default="auto",
                        help="JAX CPU devices, as `jaxrace design --cpu-devices` (default: one per core, as there)")
    args = parser.parse_args()
    use_cpu_devices(cpu_devices(args.cpu_devices), warn=args.cpu_devices != "auto")  # before JAX runs anything

    config = load_config(args.preset, args.config, **parse_sets(args.set))
    run_dir = Path(args.run_dir)
    report = run_design(config, run_dir, quiet=args.quiet)
    final, ref = final_table(run_dir)
    agent = loop_agent(run_dir)
    stages = json.loads((run_dir / "stages.json").read_text())

    rows, table = [], []
    for r in final:
        met = targets_met(r)
        lap = "no lap" if r["best_lap"] is None else f"{r['best_lap']:.2f} s ({100 * r['lap_gap']:+.1f}%)"
        trial = ("no full lap" if r["trial_lap"] is None else
                 f"{r['trial_lap']:.2f} s ({100 * r['trial_gap']:+.1f}%)") + f", {r['trial_outs']} outs"
        role = "library" if r["library"] else "the loop" if r["candidate"] == agent else "a finalist not picked"
        draw = "" if r["agent"] else f", draw s{r['seed']}: not its agent"
        who = f"{r['candidate']} ({role}{draw})"
        score = "-" if r["selection_score"] is None else f"{r['selection_score']:.1f}"
        table.append([who, f"{r['env_steps']:,}", r["kept_epoch"], score, trial, f"{r['median_position']:g}",
                      f"{r['at_fault_contacts_per_race']:.2f}", f"{r['course_outs_per_race']:.2f}", lap,
                      f"{sum(met.values())} of {len(met)}"])
        prefix = f"final: {r['candidate']}" + ("" if r["agent"] else f" draw s{r['seed']} (not its agent)")
        rows += [{"name": f"{prefix}: median finish from P8", "value": r["median_position"], "unit": "position",
                  "races": r["races"]},
                 {"name": f"{prefix}: at-fault contacts per race", "value": r["at_fault_contacts_per_race"],
                  "unit": "contacts"},
                 {"name": f"{prefix}: course-outs per race", "value": r["course_outs_per_race"], "unit": "outs"},
                 {"name": f"{prefix}: best race lap", "value": r["best_lap"], "unit": "s",
                  "reference_lap": ref, "gap": r["lap_gap"]},
                 {"name": f"{prefix}: time-trial best lap (alone, 2 laps)", "value": r["trial_lap"], "unit": "s",
                  "reference_lap": ref, "gap": r["trial_gap"], "course_outs": r["trial_outs"]},
                 {"name": f"{prefix}: env steps trained", "value": r["env_steps"], "unit": "steps",
                  "kept_epoch": r["kept_epoch"], "selection_score": r["selection_score"], "seed": r["seed"],
                  "failed": r["failed"], "library": r["library"], "reward_agent": r["agent"],
                  "loop_agent": r["candidate"] == agent and r["agent"], "targets_met": met}]
    search = search_steps(run_dir)
    rows.append({"name": "search: env steps trained before the final job", "value": search, "unit": "steps"})
    for stage, s in stages.items():
        rows.append({"name": f"stage {stage}", "value": s["seconds"], "unit": "s",
                     "compile_seconds": s.get("compile_seconds")})
    total = sum(s["seconds"] for s in stages.values())
    rows.append({"name": "whole run (sum of stages)", "value": round(total, 1), "unit": "s"})

    print(f"task {config.task!r}, preset {config.preset} on {config.track!r}: {config.iterations} iterations of "
          f"M={config.m}, N={config.n}; final races {config.final_races} from P8 of {config.opponents + 1} against "
          f"the AI at skill {config.ai_skill}; reference lap {ref:.2f} s")
    print_table(["agent", "final env steps", "kept epoch", "selection score", "time trial", "median finish",
                 "at fault / race", "outs / race", "best race lap", "targets met"], table)
    print(f"search before the final job: {search:,} env steps; whole run {total / 60:.1f} min (sum of stages)")
    winner = next((r for r in final if r["candidate"] == agent and r["agent"]), None)
    if winner is None:
        print("the loop's agent: none (no candidate trained in any iteration)")
    for name, ok in targets_met(winner or {}).items():
        print(f"the loop's agent: {name}: {'met' if ok else 'NOT met'}")
    print(f"report: {report}")
    script = f"design_clean_racing-{args.tag}" if args.tag else "design_clean_racing"
    print(write_results(script + ".py", rows))


if __name__ == "__main__":
    main()
