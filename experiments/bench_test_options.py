"""Tests' seconds under XLA:CPU compile options: XLA's defaults against the suite's own (TEST_XLA_OPTIONS).

Usage: python experiments/bench_test_options.py [--rounds 1] [--settings NAME ...] [--tag T] [TEST_ID ...]

Runs the given tests (default: the small trainer's vmapped-runs test, compile-bound, and the
tiny learning test, run-bound) in one pytest process per setting, without xdist and each with
a fresh XLA cache (tests/conftest.py), alternating the settings round by round so they see the
same machine load. The settings: XLA's defaults; the older fusion emitters alone; older
emitters with LLVM optimisation level 1 (what the suite uses, tests/conftest.py); older
emitters with level 0; the suite's without YNNPACK's fusions (`--settings` picks some,
`--tag` names their results file). Per test and setting: the median seconds of its call over the rounds,
from pytest's JUnit XML. Writes results/bench_test_options.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from common import print_table, write_results

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/agents/test_trainer.py::test_vmapped_runs_differ_by_seed_and_match_the_unvmapped_run",
         "tests/agents/test_trainer.py::test_learns_to_make_progress_on_a_tiny_task"]
EMITTERS = "--xla_cpu_use_fusion_emitters=false"
SETTINGS = {"XLA defaults": "", "older emitters": EMITTERS,
            "older emitters, LLVM level 1 (the suite's)": f"{EMITTERS} --xla_backend_optimization_level=1",
            "older emitters, LLVM level 0": f"{EMITTERS} --xla_backend_optimization_level=0",
            "older emitters, LLVM level 1, no YNNPACK": f"{EMITTERS} --xla_backend_optimization_level=1 "
                                                        "--xla_cpu_experimental_ynn_fusion_type="}


def run_tests(tests: list[str], xla_flags: str) -> dict[str, float]:
    """{test id: seconds of its call} of one pytest process with these XLA_FLAGS (conftest leaves them as given)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        env = {**os.environ, "XLA_FLAGS": xla_flags, "JAXRACE_TEST_DEFAULT_XLA_FLAGS": xla_flags}
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-o", "addopts=",
                              f"--junitxml={report}", *tests], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=3600)
        if out.returncode != 0:
            raise SystemExit(f"tests failed with XLA_FLAGS={xla_flags!r}:\n{out.stdout[-3000:]}")
        return {f"{case.get('classname')}::{case.get('name')}": float(case.get("time"))
                for case in ET.parse(report).getroot().iter("testcase")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--tag", default="", help="results go to results/bench_test_options-<tag>.json")
    parser.add_argument("tests", nargs="*", default=TESTS)
    args = parser.parse_args()
    settings = {name: SETTINGS[name] for name in args.settings}
    times: dict[str, dict[str, list[float]]] = {name: {} for name in settings}
    for r in range(args.rounds):
        order = list(settings) if r % 2 == 0 else list(reversed(settings))
        for name in order:
            for test, seconds in run_tests(args.tests, SETTINGS[name]).items():
                times[name].setdefault(test, []).append(seconds)
                print(f"round {r + 1}, {name}: {test.rsplit('::', 1)[-1]} {seconds:.1f} s", flush=True)
    tests = list(times[args.settings[0]])
    table, rows = [], []
    for name, flags in settings.items():
        medians = [statistics.median(times[name][t]) for t in tests]
        table.append([name, *(f"{m:.1f} s" for m in medians)])
        rows += [{"name": f"{t.rsplit('::', 1)[-1]}: {name}", "value": round(m, 2), "unit": "s",
                  "xla_flags": flags, "rounds": args.rounds, "seconds": times[name][t]}
                 for t, m in zip(tests, medians, strict=True)]
    print_table(["setting", *(t.rsplit("::", 1)[-1] for t in tests)], table)
    print(f"wrote {write_results(__file__.replace('.py', f'-{args.tag}.py') if args.tag else __file__, rows)}")


if __name__ == "__main__":
    main()
