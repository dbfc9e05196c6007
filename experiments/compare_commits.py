"""Two commits side by side: env step and training epoch (or reward compiles), in interleaved rounds.

Usage: python experiments/compare_commits.py BASE [HEAD] [--rounds 3] [--what train|compile|loop] [--tag TAG]

Each commit is checked out in a temporary git worktree and measured in fresh
processes that import that worktree's jaxrace (PYTHONPATH first), alternating
BASE, HEAD, BASE, HEAD, ... so both see the same machine load. Per process: a jitted
scan of 20 vmapped env steps (4096 envs, 7 AI opponents, state only), the same for
training's env (1024 envs on gp, packed random starts, 30% of them on the grid: the
reset drawn at every step takes that path) and 10 epochs of 5 vmapped QR-SAC runs on
the oval (16 envs each); compile time and the median of repeated calls. Used to show
that a refactor changed no speed beyond noise.
With `--what compile`: `compile_reward` on 16 distinct offline proposals, one at a
time (the first call also starts the sandbox worker), the median seconds per program
(results/compare_commits-compile.json).
With `--what loop`: the tests' tiny loop (tests/design/test_loop.py's config, `jaxrace design`
in a subprocess) into a fresh compilation cache, then again on the same cache as a rerun
or resumed run (and the loop tests after the first) does; wall seconds of each and the
warm run's seconds compiling (its log, summed over stages)
(results/compare_commits-loop.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import print_table, write_results

REPO = Path(__file__).resolve().parents[1]

SNIPPET = r"""
import json, statistics, time
import jax, jax.numpy as jnp
import jaxrace
try:
    from jaxrace.agents.runner import train_many
except ImportError:
    from jaxrace.agents.trainer import train_many
from jaxrace.agents.trainer import TrainConfig, make_train
from jaxrace.rewards import RewardBank, library_reward

out = {"file": jaxrace.__file__}

def time_env(env, params, n):
    # (compile s, median ms per step) of a jitted scan of 20 vmapped env steps with random actions
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    _, state = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(jax.random.key(0), n), params)

    def rollout(key, state):
        def body(state, k):
            k_act, k_step = jax.random.split(k)
            action = jax.random.uniform(k_act, (n, 2), minval=-1.0, maxval=1.0)
            _, state, reward, *_ = step(jax.random.split(k_step, n), state, action, params)
            return state, reward.sum()
        return jax.lax.scan(body, state, jax.random.split(key, 20))

    t0 = time.perf_counter()
    compiled = jax.jit(rollout).lower(jax.random.key(1), state).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(jax.random.key(2 + r), state))
        times.append((time.perf_counter() - t0) / 20)
    return compile_s, 1e3 * statistics.median(times)

out["env_compile_s"], out["env_step_ms"] = time_env(*jaxrace.make(track="club", num_opponents=7, start="grid_back"),
                                                    4096)
# Training's env: every step also draws the reset it may need, a packed random start (grid starts among them).
out["random_env_compile_s"], out["random_env_step_ms"] = time_env(*jaxrace.make(
    track="gp", num_opponents=7, start="random", grid_start_prob=0.3, random_start_gap=25.0), 1024)

env, params = jaxrace.make(track="oval", start="time_trial", laps=1000, time_limit=60.0)
bank = RewardBank.from_compiled([library_reward("progress"), library_reward("gt_sophy")])
config = TrainConfig(num_envs=16, rollout_steps=8, updates_per_epoch=8, batch_size=128, epochs=10)
trainer = make_train(config, env, params, bank)
t0 = time.perf_counter()
jax.block_until_ready(train_many(trainer, jax.random.key(0), [0, 1, 1, 0, 1])[1])
first = time.perf_counter() - t0
times = []
for r in range(3):
    t0 = time.perf_counter()
    jax.block_until_ready(train_many(trainer, jax.random.key(r + 1), [0, 1, 1, 0, 1])[1])
    times.append((time.perf_counter() - t0) / config.epochs)
out["epoch_ms"] = 1e3 * statistics.median(times)
out["train_compile_s"] = first - statistics.median(times) * config.epochs
print("RESULT " + json.dumps(out))
"""

COMPILE_SNIPPET = r"""
import json, statistics, time
import jax
import jaxrace
from jaxrace.rewards import compile_reward, propose

out = {"file": jaxrace.__file__}
proposals = propose("win the race cleanly from the back of the grid", 17, jax.random.key(11))
t0 = time.perf_counter()
compile_reward(proposals[0].source, name=proposals[0].name)
out["first_s"] = time.perf_counter() - t0
times = []
for p in proposals[1:]:
    t0 = time.perf_counter()
    compile_reward(p.source, name=p.name)
    times.append(time.perf_counter() - t0)
out["per_program_s"] = statistics.median(times)
print("RESULT " + json.dumps(out))
"""

LOOP_SNIPPET = r"""
import json, os, re, subprocess, sys, tempfile, time
import jaxrace
out = {"file": jaxrace.__file__}
tiny = re.search(r'TINY = "{3}(.*?)"{3}', open("tests/design/test_loop.py").read(), re.S).group(1)
with tempfile.TemporaryDirectory() as tmp:
    config = os.path.join(tmp, "tiny.toml")
    open(config, "w").write(tiny)
    env = {**os.environ, "JAXRACE_CACHE_DIR": os.path.join(tmp, "cache")}
    for name in ("cold", "warm"):
        run = os.path.join(tmp, name)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "jaxrace.cli", "design", "--config", config, "--run-dir", run,
                        "--quiet"], env=env, check=True, capture_output=True)
        out[name + "_s"] = time.perf_counter() - t0
    log = open(os.path.join(tmp, "warm", "log.txt")).read()
    out["warm_compiling_s"] = sum(float(x) for x in re.findall(r"\(([\d.]+) s compiling\)", log))
print("RESULT " + json.dumps(out))
"""

LOOP_METRICS = (("cold_s", "tiny loop, fresh compilation cache", "s"),
                ("warm_s", "tiny loop again, the same cache", "s"),
                ("warm_compiling_s", "tiny loop again: stages' seconds compiling", "s"))

COMPILE_METRICS = (("per_program_s", "compile_reward, median over 16 programs", "s"),
                   ("first_s", "compile_reward, first call (worker start included)", "s"))

METRICS = (("env_step_ms", "env step, 4096 envs x 8 cars", "ms"), ("env_compile_s", "env step compile", "s"),
           ("random_env_step_ms", "env step with packed random starts, 1024 envs on gp", "ms"),
           ("random_env_compile_s", "env step with packed random starts, compile", "s"),
           ("epoch_ms", "training epoch, 5 vmapped runs", "ms"), ("train_compile_s", "training compile", "s"))


def measure(worktree: Path, snippet: str) -> dict:
    env = {"PYTHONPATH": str(worktree), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, env=env, timeout=1800,
                          cwd=worktree)
    if done.returncode:
        raise SystemExit(f"measuring {worktree} failed:\n{done.stderr[-3000:]}")
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    if not result["file"].startswith(str(worktree)):
        raise SystemExit(f"{worktree}: imported {result['file']} instead of the worktree's jaxrace")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("head", nargs="?", default="HEAD")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--what", choices=("train", "compile", "loop"), default="train")
    parser.add_argument("--tag", default=None,
                        help="results go to results/compare_commits[-compile|-loop]-<tag>.json (keeps earlier results)")
    args = parser.parse_args()
    if args.tag is not None and not args.tag.replace("-", "").replace("_", "").isalnum():
        parser.error(f"--tag {args.tag!r}: letters, digits, '-' and '_' only (it names a results file)")
    snippet, metrics = {"train": (SNIPPET, METRICS), "compile": (COMPILE_SNIPPET, COMPILE_METRICS),
                        "loop": (LOOP_SNIPPET, LOOP_METRICS)}[args.what]
    revs = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for name, rev in (("base", args.base), ("head", args.head)):
            revs[name] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], capture_output=True,
                                        text=True, check=True).stdout.strip()
            trees[name] = Path(tmp) / name
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(trees[name]), rev],
                           check=True, capture_output=True)
        try:
            results = {"base": [], "head": []}
            for r in range(args.rounds):
                for name in ("base", "head"):
                    results[name].append(measure(trees[name], snippet))
                    print(f"round {r + 1} {name} ({revs[name]}): " + ", ".join(
                        f"{k} {results[name][-1][k]:.2f}" for k, *_ in metrics), flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    rows, table = [], []
    for key, label, unit in metrics:
        base = statistics.median(x[key] for x in results["base"])
        head = statistics.median(x[key] for x in results["head"])
        table.append([label, f"{base:.2f} {unit}", f"{head:.2f} {unit}", f"{head / base - 1:+.1%}"])
        rows += [{"name": f"{label} ({revs['base']})", "value": round(base, 3), "unit": unit},
                 {"name": f"{label} ({revs['head']})", "value": round(head, 3), "unit": unit},
                 {"name": f"{label}: {revs['head']} / {revs['base']}", "value": round(head / base, 3), "unit": "x"}]
    print()
    print_table([f"median of {args.rounds} rounds", f"base {revs['base']}", f"head {revs['head']}", "change"], table)
    script = __file__ if args.what == "train" else __file__.replace(".py", f"-{args.what}.py")
    if args.tag:
        script = script.replace(".py", f"-{args.tag}.py")
    print(f"wrote {write_results(script, rows)}")


if __name__ == "__main__":
    main()
