"""Time of each stage of the reward-design loop, and of its compiling: a first run, then the same config again.

Usage: python experiments/bench_design.py [--preset quick] [--config FILE.toml] [--runs 2] [--keep DIR]

Runs `jaxrace design` twice through the command line, each in a new run directory, with
one fresh JAX compilation cache. The first run compiles everything; in it, the training
programs that do not read the reward bank are compiled once and serve every iteration
(only the small labelling program is compiled per bank). The second run finds the
compiled programs in the persistent cache. Prints every stage's seconds and seconds
spent compiling (trace, lower, XLA compile or cache load) side by side, the seconds
from the command's start until its first training epoch, and writes
results/bench_design.json (JAXRACE_RESULTS_TAG=TAG: bench_design-TAG.json). `--runs 1`
makes only the first run (a preset checked on a lent GPU, say); `--keep DIR` keeps the
run directories there (report, clips, log).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import print_table, write_results


def run(preset: str, config: str | None, run_dir: Path, cache: Path) -> tuple[dict, float, float]:
    """(stages.json, wall seconds, seconds from the start until the first training epoch begins)."""
    env = {**os.environ, "JAXRACE_CACHE_DIR": str(cache)}
    started = time.time()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "jaxrace.cli", "design", "--preset", preset, "--run-dir", str(run_dir),
                    "--quiet", *(["--config", config] if config else [])], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    stages = json.loads((run_dir / "stages.json").read_text())
    train = stages["iter1/train"]
    # The stage begins, then compiles its programs before the first epoch runs.
    to_training = (train["finished"] - train.get("last_attempt_seconds", train["seconds"])
                   + train.get("last_attempt_compile_seconds", train["compile_seconds"]) - started)
    return stages, wall, to_training


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--config", default=None, help="a TOML file of DesignConfig fields over the preset")
    parser.add_argument("--runs", type=int, default=2, choices=(1, 2),
                        help="1: the first run only (no second run from the compile cache)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the run directories under DIR")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache, base = Path(tmp) / "cache", Path(args.keep or tmp)
        first, first_wall, first_start = run(args.preset, args.config, base / "first", cache)
        second, second_wall, second_start = (run(args.preset, args.config, base / "second", cache)
                                             if args.runs == 2 else ({}, None, None))
    rows, table = [], []
    for stage in first:
        a, b = first[stage], second.get(stage)
        table.append([stage, f"{a['seconds']:.1f}", f"{a['compile_seconds']:.1f}",
                      *([f"{b['seconds']:.1f}", f"{b['compile_seconds']:.1f}"] if b else ["", ""])])
        rows.append({"name": f"{stage}, first run", "value": a["seconds"], "unit": "s",
                     "compile_seconds": a["compile_seconds"]})
        if b:
            rows.append({"name": f"{stage}, second run (compile cache)", "value": b["seconds"], "unit": "s",
                         "compile_seconds": b["compile_seconds"]})
    per_iteration = {}
    for k in range(2, 100):
        names = [s for s in first if s.startswith(f"iter{k}/")]
        if not names:
            break
        per_iteration[k] = sum(first[s]["compile_seconds"] for s in names)
        rows.append({"name": f"compiling in iteration {k}, first run", "value": round(per_iteration[k], 2),
                     "unit": "s"})
    def seconds(x):
        return "" if x is None else f"{x:.1f}"

    table.append(["whole command (process start included)", seconds(first_wall), "", seconds(second_wall), ""])
    table.append(["from the start to the first training epoch", seconds(first_start), "", seconds(second_start),
                  ""])
    rows += [{"name": "whole command, first run", "value": round(first_wall, 2), "unit": "s"},
             {"name": "start to first training epoch, first run", "value": round(first_start, 2), "unit": "s"}]
    if args.runs == 2:
        rows += [{"name": "whole command, second run (compile cache)", "value": round(second_wall, 2), "unit": "s"},
                 {"name": "start to first training epoch, second run (compile cache)",
                  "value": round(second_start, 2), "unit": "s"}]
    rows.append({"name": "options", "value": {"preset": args.preset, "runs": args.runs,
                                              "config": Path(args.config).read_text() if args.config else None},
                 "unit": "options"})
    print(f"preset {args.preset}" + (f", config {args.config}" if args.config else ""))
    print_table(["stage", "first run (s)", "compiling", "second run, compile cache (s)", "compiling"], table)
    for k, seconds in per_iteration.items():
        print(f"compiling in iteration {k} (first run): {seconds:.1f} s")
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
