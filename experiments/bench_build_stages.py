"""Where a reward program's build time goes, stage by stage, as the sandbox worker builds it.

Usage: python experiments/bench_build_stages.py [--programs 16]

A child process does what the worker does: `build.warm_up()` and `gc.freeze()`, then one forked child
per program running `build.build_artifact` (the offline proposer's programs, distinct
sources). Stages are timed from `build_artifact`'s own stage reports (the determinism
check reports on the same thread while another compiles validation's executable). Then,
in the same forked child, the validation executable (the forward at the training batch,
the forward on one transition and the weights' gradient on one) is compiled again four
ways, in an order that rotates with the program: with `build.VALIDATION_COMPILER_OPTIONS`
(what validation does), the same without YNNPACK's fusions (as `jaxrace.jit`'s programs
compile), at LLVM level 0 only (validation before XLA:CPU's older fusion emitters), and
with XLA's defaults; each is called twice, as validation does, and the second call timed.
Medians over the programs; no sandbox limits (the timings, not the isolation).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import print_table, write_results

STAGES = ("parse and policy", "execute", "trace and export", "validate: load, trace and lower; XLA's compile starts",
          "determinism, during the compile: execute again", "determinism, during the compile: trace again",
          "validate: the rest of the compile, two calls, the checks")
VARIANTS = ("as validation: LLVM level 0, older fusion emitters, one codegen part",
            "the same without YNNPACK's fusions (as training)", "LLVM level 0 only", "XLA's defaults")


def _measure(source: str, index: int) -> dict:
    """In a forked child: build the artifact, timing each stage; then the validation compile variants."""
    import jax
    import numpy as np

    from jaxrace.rewards import build

    marks = []
    build.build_artifact(source, report=lambda stage: marks.append(time.perf_counter()))
    marks.append(time.perf_counter())
    out = {"stages": [b - a for a, b in zip(marks, marks[1:], strict=False)]}
    info = build.check_policy(build.parse_program(source))
    call = build.load_call(build.export_program(source, info, build.execute_program(source, info)))
    prev, action, curr, _, _ = build.validation_cases()
    tiled = list(build.tiled_validation_cases(build.Limits().train_batch))
    one = [build._one(x, slice(0, 1)) for x in (prev, action, curr)]
    weights = np.ones((len(build.check_policy(build.parse_program(source)).params),), np.float32)
    without_ynn = {**build.VALIDATION_COMPILER_OPTIONS, "xla_cpu_experimental_ynn_fusion_type": ""}
    options = (build.VALIDATION_COMPILER_OPTIONS, without_ynn, {"xla_backend_optimization_level": 0}, None)
    lowered = jax.jit(build.validation_function(call)).lower(weights, tiled, one)
    out["compile"], out["run"] = [0.0] * len(options), [0.0] * len(options)
    turn = index % len(options)
    for i in [*range(turn, len(options)), *range(turn)]:
        t0 = time.perf_counter()
        compiled = lowered.compile(options[i])
        out["compile"][i] = time.perf_counter() - t0
        jax.block_until_ready(compiled(weights, tiled, one))
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(weights, tiled, one))  # validation runs it twice
        out["run"][i] = time.perf_counter() - t0
    return out


def child(path: str) -> None:
    """The worker's pattern: warm up (no runtime threads), freeze the heap, then fork one child per program."""
    from jaxrace.rewards import build

    build.warm_up()
    gc.freeze()
    sources = json.loads(open(path).read())
    for index, source in enumerate(sources):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                os.write(write_fd, json.dumps(_measure(source, index)).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        data = b""
        while chunk := os.read(read_fd, 1 << 16):
            data += chunk
        os.close(read_fd)
        os.waitpid(pid, 0)
        print(data.decode(), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=16)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)

    import jax

    from jaxrace.rewards import propose

    sources = [p.source for p in propose("win the race cleanly from the back of the grid", args.programs,
                                         jax.random.key(11))]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(sources, f)
    try:
        done = subprocess.run([sys.executable, __file__, "--child", f.name], capture_output=True, text=True,
                              timeout=600, check=True)
    finally:
        os.unlink(f.name)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    stages = [statistics.median(r["stages"][i] for r in results) for i in range(len(STAGES))]
    total = statistics.median(sum(r["stages"]) for r in results)
    compiles = [statistics.median(r["compile"][i] for r in results) for i in range(len(VARIANTS))]
    runs = [statistics.median(r["run"][i] for r in results) for i in range(len(VARIANTS))]
    n = len(results)
    print_table(["build stage (forked child)", f"median of {n} programs"],
                [[s, f"{t:.3f} s"] for s, t in zip(STAGES, stages, strict=True)] + [["all", f"{total:.3f} s"]])
    print_table(["validation executable", f"XLA compile, median of {n} programs", "one call (it runs twice)"],
                [[v, f"{t:.3f} s", f"{r:.3f} s"] for v, t, r in zip(VARIANTS, compiles, runs, strict=True)])
    rows = [{"name": f"build stage: {s}", "value": round(t, 4), "unit": "s", "programs": n}
            for s, t in zip(STAGES, stages, strict=True)]
    rows.append({"name": "build, all stages", "value": round(total, 4), "unit": "s", "programs": n})
    rows += [{"name": f"validation compile: {v}", "value": round(t, 4), "unit": "s", "programs": n}
             for v, t in zip(VARIANTS, compiles, strict=True)]
    rows += [{"name": f"validation call: {v}", "value": round(t, 4), "unit": "s", "programs": n}
             for v, t in zip(VARIANTS, runs, strict=True)]
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
