"""Reward compilation: one program at a time versus many at once (the sandbox builds one per core).

Usage: python experiments/bench_compile.py [--programs 32]

Side by side in one run, on offline proposals (distinct sources, so no cache hits):
`compile_reward` called once per program, then `compile_rewards` on as many other
programs at once. Reports the worker start, seconds per program both ways (wall
time over the batch for the second) and the speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
from common import print_table, write_results

from jaxrace.rewards import RewardCompileError, compile_reward, compile_rewards, propose, sandbox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=32)
    args = parser.parse_args()
    n = args.programs
    proposals = propose("win the race cleanly from the back of the grid", 2 * n, jax.random.key(7))
    one_by_one, together = proposals[:n], proposals[n:]

    t0 = time.perf_counter()
    sandbox.isolation()  # starts the worker
    start_s = time.perf_counter() - t0
    times = []
    for p in one_by_one:
        t0 = time.perf_counter()
        compile_reward(p.source, name=p.name)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    results = compile_rewards([p.source for p in together], names=[p.name for p in together])
    batch_s = time.perf_counter() - t0
    failures = sum(isinstance(r, RewardCompileError) for r in results)
    if failures:
        raise SystemExit(f"{failures} proposals failed to compile")

    sequential = statistics.median(times)
    parallel = batch_s / n
    print_table(["reward compilation", "seconds per program"], [
        ["worker start (once)", f"{start_s:.2f} s"],
        [f"compile_reward, one at a time (median of {n})", f"{sequential:.3f} s"],
        [f"compile_rewards, {n} at once ({sandbox.PARALLEL} builds in parallel)", f"{parallel:.3f} s"],
        ["speed-up", f"{sequential / parallel:.2f}x"],
    ])
    rows = [
        {"name": "sandbox worker start", "value": round(start_s, 3), "unit": "s"},
        {"name": f"compile_reward, one at a time, median of {n}", "value": round(sequential, 3), "unit": "s"},
        {"name": f"compile_rewards, {n} at once, wall per program", "value": round(parallel, 3), "unit": "s",
         "parallel_builds": sandbox.PARALLEL},
        {"name": "compile_rewards speed-up over one at a time", "value": round(sequential / parallel, 2), "unit": "x"},
    ]
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
