"""The reference agent's training speed with jaxrace's CPU compile options against XLA's defaults.

Usage: python experiments/bench_reference_options.py [--rounds 2] [--steps 128000] [--track gp]

Runs `train_reference.py` with issue 16's recipe (README, "The reference agent") for
`--steps` env steps, two at once as issue 16's seeds train: one pinned to each core
(`taskset`), one with `JAXRACE_XLA_DEFAULTS=1` (XLA's defaults, as its runs before
2026-12-01) and one with jaxrace's options (`jaxrace.jit`), the cores swapped each round.
No checkpoint evaluations and 2 assessment races, so the time is training's. From each
run's per-chunk lines: the first chunk's seconds (compiling included) and the seconds per
epoch of the later chunks. Medians over rounds; writes results/bench_reference_options.json.
Host-side (subprocesses).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from common import RESULTS, print_table, write_results

RECIPE = ["--envs", "32", "--pack-gap", "25", "--grid-prob", "0.3", "--ai-aggression", "varied",
          "--weight", "w_rear_end=100", "--weight", "w_collision=10", "--train-course-out-margin", "0.3",
          "--actor-average", "3e-4", "--lane-headway", "--offtrack-start", "0.25", "--keep-average", "5"]
SETTINGS = {"XLA's defaults (JAXRACE_XLA_DEFAULTS=1)": {"JAXRACE_XLA_DEFAULTS": "1"},
            "jaxrace's CPU options": {"JAXRACE_XLA_DEFAULTS": "0"}}
LINE = re.compile(r"^\s*([\d.]+) s\s+epoch\s+(\d+)\s+steps")


def chunk_times(stdout: str) -> tuple[float, float, int]:
    """(first chunk's seconds, seconds per epoch after it, epochs after it) from train_reference's lines."""
    points = [(float(m.group(1)), int(m.group(2))) for m in map(LINE.match, stdout.splitlines()) if m]
    if len(points) < 3:
        raise SystemExit(f"train_reference printed {len(points)} chunk lines; need 3:\n{stdout[-2000:]}")
    (t1, e1), (tn, en) = points[0], points[-1]
    return t1, (tn - t1) / (en - e1), en - e1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=128_000)
    parser.add_argument("--chunk-epochs", type=int, default=100)
    parser.add_argument("--track", default="gp")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        raise SystemExit("needs 2 cores: the two settings train side by side, one on each")
    script = Path(__file__).with_name("train_reference.py")
    got = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        procs = {}
        for i, (name, env) in enumerate(SETTINGS.items()):
            core = cores[(i + r) % 2]
            tag = f"bench-options-{i}-{r}"
            cmd = ["taskset", "-c", str(core), sys.executable, str(script), "--track", args.track, "--seed",
                   str(args.seed), "--steps", str(args.steps), "--minutes", "100", "--chunk-epochs",
                   str(args.chunk_epochs), "--eval-every", "100000", "--races", "2", "--tag", tag, *RECIPE]
            procs[name] = (core, tag, subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE,
                                                       stderr=subprocess.STDOUT, text=True))
        for name, (core, tag, proc) in procs.items():
            try:
                out, _ = proc.communicate(timeout=3600)
            except subprocess.TimeoutExpired:
                for _, _, p in procs.values():  # leave no run training on a core
                    p.kill()
                raise SystemExit(f"{name} did not finish within an hour") from None
            for suffix in (".json", ".png"):  # the runs' own results: scratch
                (RESULTS / f"train_reference-{tag}{suffix}").unlink(missing_ok=True)
            if proc.returncode:
                raise SystemExit(f"{name} exited {proc.returncode}:\n{out[-3000:]}")
            first, per_epoch, epochs = chunk_times(out)
            got[name].append({"core": core, "first_chunk_s": first, "epoch_s": per_epoch, "epochs": epochs})
            print(f"round {r + 1}, {name}, core {core}: first chunk {first:.1f} s, "
                  f"{1000 * per_epoch:.0f} ms per epoch over {epochs}", flush=True)

    names = list(SETTINGS)
    med = {n: {k: statistics.median(x[k] for x in got[n]) for k in ("first_chunk_s", "epoch_s")} for n in names}
    base = med[names[0]]
    table = [[n, f"{med[n]['first_chunk_s']:.1f} s", f"{1000 * med[n]['epoch_s']:.0f} ms"
              + ("" if n == names[0] else f" ({100 * (med[n]['epoch_s'] / base['epoch_s'] - 1):+.0f}%)"),
              f"{3_328_000 / 256 * med[n]['epoch_s'] / 60:.0f} min"] for n in names]
    print_table(["train_reference.py, one core each, side by side", f"first chunk ({args.chunk_epochs} epochs, "
                 "compiling)", "per epoch after it", "3,328,000 steps at that rate"], table)
    rows = [{"name": f"train_reference on {args.track}, one core: seconds per epoch",
             "value": round(med[n]["epoch_s"], 4), "unit": "s", "setting": n,
             "first_chunk_s": round(med[n]["first_chunk_s"], 2),
             "chunk_epochs": args.chunk_epochs, "env_steps_per_epoch": 256, "rounds": args.rounds,
             "samples": got[n]} for n in names]
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
