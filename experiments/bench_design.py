"""Time of each stage of the reward-design loop: a first run, then the same config again.

Usage: python experiments/bench_design.py [--preset quick]

Runs `jaxrace design` twice through the command line, each in a new run directory, with
one fresh JAX compilation cache: the first run compiles everything (the trainer once per
iteration, as every iteration's bank differs); the second finds the compiled programs in
the persistent cache. Prints the seconds of every stage side by side and writes
results/bench_design.json.
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


def run(preset: str, run_dir: Path, cache: Path) -> tuple[dict, float]:
    env = {**os.environ, "JAXRACE_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "jaxrace.cli", "design", "--preset", preset, "--run-dir", str(run_dir),
                    "--quiet"], env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    return json.loads((run_dir / "stages.json").read_text()), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        first, first_wall = run(args.preset, tmp / "first", tmp / "cache")
        second, second_wall = run(args.preset, tmp / "second", tmp / "cache")
    rows, table = [], []
    for stage in first:
        a, b = first[stage]["seconds"], second[stage]["seconds"]
        table.append([stage, f"{a:.1f}", f"{b:.1f}"])
        rows += [{"name": f"{stage}, first run", "value": a, "unit": "s"},
                 {"name": f"{stage}, second run (compile cache)", "value": b, "unit": "s"}]
    table.append(["whole command (process start included)", f"{first_wall:.1f}", f"{second_wall:.1f}"])
    rows += [{"name": "whole command, first run", "value": round(first_wall, 2), "unit": "s"},
             {"name": "whole command, second run (compile cache)", "value": round(second_wall, 2), "unit": "s"}]
    print(f"preset {args.preset}")
    print_table(["stage", "first run (s)", "second run, compile cache (s)"], table)
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
