"""A preset's first training stage with the loop on 1 and on several JAX CPU devices (`--cpu-devices`).

Usage: python experiments/bench_cpu_devices.py [--preset standard] [--devices 1 2] [--stage iter1/train]

Runs `jaxrace design --preset P --iterations 1 --cpu-devices D` through the command line for each
D, one after another, each in a new run directory with a fresh JAX compilation cache, stops it once
`--stage` is finished, and reads the stage's seconds (compiling included) and compile seconds from
its stages.json, and the loop's line on where the job trained from its log. With the standard
preset's N = 4 runs per iteration, 2 devices train 2 runs each at once; 1 device trains all 4 in
one program. Writes results/bench_cpu_devices.json. Host-side.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import print_table, write_results


def stage_of(preset: str, devices: int, stage: str, root: Path, timeout_s: float) -> tuple[dict, str]:
    """(the stage's stages.json entry, the log's placement line) of a loop stopped after `stage`."""
    run_dir = root / f"devices{devices}"
    env = {**os.environ, "JAXRACE_CACHE_DIR": str(root / f"cache{devices}")}
    proc = subprocess.Popen([sys.executable, "-m", "jaxrace.cli", "design", "--preset", preset, "--iterations", "1",
                             "--cpu-devices", str(devices), "--run-dir", str(run_dir), "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    stages = {}
    try:
        while stage not in stages:
            if proc.poll() is not None:
                raise SystemExit(f"the loop ended before {stage}: {proc.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"{stage} did not finish within {timeout_s:.0f} s")
            time.sleep(2.0)
            path = run_dir / "stages.json"
            stages = json.loads(path.read_text()) if path.exists() else {}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    prefix = f"{stage}: "
    placement = next((line.split(prefix, 1)[1] for line in (run_dir / "log.txt").read_text().splitlines()
                      if prefix in line and " runs " in line), "one device")
    return stages[stage], placement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="standard")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--stage", default="iter1/train")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the stage, per run")
    args = parser.parse_args()
    rows, table = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for devices in args.devices:
            entry, placement = stage_of(args.preset, devices, args.stage, Path(tmp), args.timeout)
            seconds, compiling = entry["seconds"], entry.get("compile_seconds", 0.0)
            table.append([devices, placement, f"{seconds:.1f}", f"{compiling:.1f}", f"{seconds - compiling:.1f}"])
            rows.append({"name": f"{args.preset}: {args.stage} on {devices} CPU device(s)", "value": round(seconds, 2),
                         "unit": "s", "compile_seconds": round(compiling, 2), "placement": placement,
                         "devices": devices})
    base = rows[0]["value"]
    for row in rows:
        row["speedup_vs_first"] = round(base / row["value"], 3)
    print(f"preset {args.preset}: {args.stage}, stage seconds (compiling included) by JAX CPU devices")
    print_table(["CPU devices", "the job", "stage (s)", "compiling (s)", "rest (s)"], table)
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
