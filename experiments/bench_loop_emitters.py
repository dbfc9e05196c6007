"""The tests' tiny loop with XLA:CPU's default fusion emitters and with its older ones, side by side.

Usage: python experiments/bench_loop_emitters.py [--rounds 2]

Runs tests/design/test_loop.py's tiny config through `jaxrace design` in subprocesses, as the
loop tests do: into a fresh compilation cache (the first loop test), then again on the same
cache (a rerun or a resumed run), alternating the two settings round by round so both see the
same machine load. `older` sets XLA_FLAGS=--xla_cpu_use_fusion_emitters=false, as the tests
do (with LLVM level 1 as well; tests/conftest.py, TEST_XLA_OPTIONS). Per run: the wall seconds of the
command, the stages' seconds spent compiling (trace, lower, XLA compile or cache load; from
the run's stages.json) and the rest (running, host work), and the train stages' rest alone
(how fast the compiled training runs). Medians over the rounds; writes
results/bench_loop_emitters.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import print_table, write_results

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {"default": "", "older": "--xla_cpu_use_fusion_emitters=false"}


def tiny_config() -> str:
    source = (REPO / "tests" / "design" / "test_loop.py").read_text()
    return re.search(r'TINY = """(.*?)"""', source, re.S).group(1)


def run(config: Path, run_dir: Path, cache: Path, flags: str) -> dict:
    env = {**os.environ, "JAXRACE_CACHE_DIR": str(cache), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "jaxrace.cli", "design", "--config", str(config), "--run-dir",
                    str(run_dir), "--quiet"], env=env, check=True, capture_output=True, timeout=1800)
    wall = time.perf_counter() - t0
    stages = json.loads((run_dir / "stages.json").read_text())
    compiling = sum(s["compile_seconds"] for s in stages.values())
    train_rest = sum(s["seconds"] - s["compile_seconds"] for k, s in stages.items() if k.endswith("/train"))
    return {"wall_s": wall, "compiling_s": compiling, "rest_s": sum(s["seconds"] for s in stages.values()) - compiling,
            "train_rest_s": train_rest}


METRICS = (("wall_s", "whole command", "s"), ("compiling_s", "stages' seconds compiling", "s"),
           ("rest_s", "stages' other seconds", "s"), ("train_rest_s", "train stages' other seconds", "s"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results = {(s, p): [] for s in SETTINGS for p in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tiny.toml"
        config.write_text(tiny_config())
        for r in range(args.rounds):
            for setting, flags in SETTINGS.items():
                cache = Path(tmp) / f"cache-{setting}-{r}"
                for phase in ("cold", "warm"):
                    out = run(config, Path(tmp) / f"{setting}-{r}-{phase}", cache, flags)
                    results[setting, phase].append(out)
                    print(f"round {r + 1} {setting} {phase}: " + ", ".join(f"{k} {v:.1f}" for k, v in out.items()),
                          flush=True)
    rows, table = [], []
    for phase, what in (("cold", "fresh compilation cache"), ("warm", "again, the same cache")):
        for key, label, unit in METRICS:
            med = {s: statistics.median(x[key] for x in results[s, phase]) for s in SETTINGS}
            table.append([f"{what}: {label}", f"{med['default']:.1f} {unit}", f"{med['older']:.1f} {unit}",
                          f"{med['older'] / med['default'] - 1:+.1%}"])
            for s in SETTINGS:
                rows.append({"name": f"tiny loop, {what}: {label} ({s} emitters)", "value": round(med[s], 2),
                             "unit": unit, "rounds": args.rounds})
    print()
    print_table([f"tiny loop, median of {args.rounds} rounds", "default emitters", "older emitters", "change"],
                table)
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
