"""Where a training epoch's time goes: each program of a design preset's job, compiled and timed apart.

Usage: python experiments/epoch_split.py [--preset paper] [--config FILE.toml] [--runs 2] [--epochs 5]
                                         [--variants preset feedforward]
       XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true python experiments/epoch_split.py --preset standard \
           --runs 3 --variants preset --profile

For R runs vmapped in one job with the preset's networks, envs, batches and replay (the
library `progress` reward in the bank): the compile seconds of `init`, `collect`, `label`
and the fused `learn` (the GPU's path: `updates_per_epoch` updates in one scan; with
`--host-updates` the CPU's, each update its own call, timed together), then the
median seconds of each over `--epochs` epochs, each waited for on its own. A variant
`feedforward` is the same preset without the actor's GRU, for the recurrent network's
share, and `sequential` the preset with `TrainConfig(sequential_runs=True)` (each program
loops over the runs instead of vmapping them: plain convolutions, not grouped ones). Writes
results/epoch_split.json (JAXRACE_RESULTS_TAG=TAG: -TAG.json).

`--profile` (XLA:CPU only, with XLA's per-op trace events on, as above) then traces `--epochs`
more epochs with JAX's profiler and splits the fused `learn` program's op time by what the ops
compute (from each optimised op's source metadata: the critics' and the actor's forward and
backward passes, the losses, the optimiser, the replay's sampling, random numbers) and by op
kind (dots, copies, fusions). Shares of the ops' own time, not seconds: tracing every op slows
them, and the CPU runs ops on two threads. A loop's or call's time holds its body's ops, so it
is left out. Beside them: the learn program's floating-point operations per epoch (XLA's cost
analysis of one update, times the updates), its rate at the measured learn time, and one large
matmul's rate on this machine. With the trace events on, the timed epochs can run slower (on
2026-12-02, 328 ms an epoch of the standard preset's 3 runs without them, 358-400 ms in three runs
with them), so the rate is a lower bound.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
from common import print_table, write_results

from jaxrace.agents import HParams, make_train, runner
from jaxrace.design.config import load_config
from jaxrace.design.loop import Envs, train_config
from jaxrace.rewards import RewardBank, library_reward


def timed(fn, *args):
    started = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - started


# What an op of the learn program computes: the first pattern that matches its source metadata
# (`op_name`: the backward pass of a network is the transpose of its JVP), else the file of the
# innermost source line it was traced from (FILES), else "other: <that file>"; an op without
# metadata XLA made itself (a copy to change a layout, say).
PARTS = (("critics, backward", r"transpose\(jvp\(.*Critic"), ("critics, forward", r"Critic"),
         ("actor, backward", r"transpose\(jvp\(.*Actor"), ("actor, forward", r"Actor"),
         ("random numbers", r"threefry|random_bits|_randint|_uniform|_normal"))
FILES = (("losses (backward)", r"jaxrace/agents/losses\.py", r"transpose\(jvp"),
         ("losses (forward)", r"jaxrace/agents/losses\.py", r""), ("optimiser", r"/optax/", r""),
         ("replay sampling", r"/flashbax/|jaxrace/agents/replay\.py", r""))
NESTING = ("while", "conditional", "call")  # their events span their bodies' ops


def _table(text: str, title: str, pattern: str) -> dict[int, tuple]:
    """A table of an HLO module's stack-frame section (FileNames, FileLocations, StackFrames)."""
    rows, inside = {}, False
    for line in text.splitlines():
        if line.strip() == title:
            inside = True
        elif inside:
            found = re.match(r"(\d+) " + pattern, line)
            if not found:
                break
            rows[int(found.group(1))] = found.groups()[1:]
    return rows


def op_parts(hlo_text: str) -> dict[str, str]:
    """{op name: part} for every op of an optimised HLO module's text (see PARTS and FILES). A
    fusion's metadata is its root op's."""
    files = _table(hlo_text, "FileNames", r'"(.*)"')
    locations = _table(hlo_text, "FileLocations", r"\{file_name_id=(\d+)")
    frames = _table(hlo_text, "StackFrames", r"\{file_location_id=(\d+)")
    parts = {}
    for line in hlo_text.splitlines():
        found = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*?metadata=\{([^}]*)\}", line)
        if not found:  # an op XLA made (a layout's copy, say) has no source
            continue
        name, metadata = found.groups()
        source = (re.search(r'op_name="([^"]*)"', metadata) or [None, ""])[1]
        frame = re.search(r"stack_frame_id=(\d+)", metadata)
        file = ""
        if frame and int(frame[1]) in frames:
            location = locations.get(int(frames[int(frame[1])][0]))
            file = files.get(int(location[0]), ("",))[0] if location else ""
        part = next((part for part, pattern in PARTS if re.search(pattern, source)), None)
        part = part or next((part for part, where, how in FILES if re.search(where, file) and re.search(how, source)),
                            None)
        parts[name] = part or f"other: {file.rsplit('/', 1)[-1] or 'no source'}"
    return parts


def profile_learn(learn, hlo_text: str, epochs: int) -> dict:
    """Shares of the learn program's op time by part and by op kind, over `epochs` calls of
    `learn()` (each waited for) under JAX's profiler."""
    parts = op_parts(hlo_text)
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(epochs):
                learn()
        (trace,) = glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True)
        events = json.load(gzip.open(trace))["traceEvents"]
    by_part, by_kind = collections.Counter(), collections.Counter()
    for e in events:
        args = e.get("args", {})
        if e.get("ph") != "X" or args.get("hlo_module") != "jit__learn":
            continue
        op = args.get("hlo_op", e["name"])
        kind = re.sub(r"[.\d]+$", "", op)
        if kind in NESTING:
            continue
        by_part[parts.get(op, f"no source: {kind} (made by XLA)")] += e["dur"]
        by_kind["dot" if kind.startswith("dot") else "fusion" if kind.endswith("fusion") else kind] += e["dur"]
    total = sum(by_part.values())
    if not total:
        raise SystemExit("--profile saw no op of the learn program: run it with "
                         "XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true on a CPU")
    share = lambda counts: {k: round(v / total, 4) for k, v in counts.most_common()}  # noqa: E731
    return {"ops_by_part": share(by_part), "ops_by_kind": share(by_kind)}


def matmul_rate(n: int = 2048, calls: int = 10) -> float:
    """GFLOP/s of one f32[n, n] @ f32[n, n] on the default device (median of `calls`): what this machine's
    dots can do, beside the learn program's rate."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(matmul(a, a))
    seconds = [timed(matmul, a, a)[1] for _ in range(calls)]
    return 2 * n ** 3 / statistics.median(seconds) / 1e9


def measure(trainer, runs: int, epochs: int, profile: bool = False) -> dict:
    """Compile seconds (first call) and median run seconds of each program of an epoch; with
    `profile`, the learn program's op time split (profile_learn) over `epochs` more epochs."""
    learner = trainer.learner
    keys = jax.random.split(jax.random.key(0), runs)
    hparams = runner.per_run_hparams(HParams(), runs)
    reward_params = runner._reward_params(trainer, hparams, jnp.zeros(runs, jnp.int32))
    hparams = hparams.replace(reward_params=None)
    index = jnp.zeros(runs, jnp.int32)
    out = {}
    state, out["init_first_s"] = timed(runner._init_runs, learner, keys, hparams)
    state = runner.committed(state)  # as train_many does: an uncommitted state compiles each program again
    seconds = {"collect": [], "label": [], "learn": []}
    for epoch in range(epochs + 1):
        (state, collected), c = timed(runner._collect, learner, state)
        rewards, lab = timed(runner._label, trainer, collected, index, reward_params)
        if learner.config.host_updates:
            (state, _), lrn = timed(lambda *a: runner._host_learn(*a, epoch=learner.config.warmup_epochs),
                                    learner, state, hparams, collected, rewards)
        else:
            (state, _), lrn = timed(runner._learn, learner, state, hparams, collected, rewards)
        for name, s in (("collect", c), ("label", lab), ("learn", lrn)):
            if epoch == 0:
                out[f"{name}_first_s"] = s
            else:
                seconds[name].append(s)
    for name, s in seconds.items():
        out[f"{name}_s"] = statistics.median(s)
        out[f"{name}_max_s"] = max(s)
    out["epoch_s"] = sum(out[f"{name}_s"] for name in seconds)
    if profile:
        def learn():
            nonlocal state
            state, collected = runner._collect(learner, state)
            rewards = runner._label(trainer, collected, index, reward_params)
            state, _ = jax.block_until_ready(runner._learn(learner, state, hparams, collected, rewards))

        state, collected = runner._collect(learner, state)
        rewards = runner._label(trainer, collected, index, reward_params)
        compiled = runner._learn.lower(learner, state, hparams, collected, rewards).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        # XLA counts a loop's body once: the scan of updates runs it updates_per_epoch times
        out["learn_gflop"] = cost["flops"] * learner.config.updates_per_epoch / 1e9
        out["learn_gflop_per_s"] = out["learn_gflop"] / out["learn_s"]
        out["matmul_gflop_per_s"] = matmul_rate()
        out |= profile_learn(learn, compiled.as_text(), epochs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--config", default=None, help="a TOML file of DesignConfig fields over the preset")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs after the first (compiling) one")
    parser.add_argument("--host-updates", action="store_true",
                        help="learn as the CPU's pixel actor does: each update its own call (TrainConfig.host_updates)")
    parser.add_argument("--variants", nargs="+", default=["preset", "feedforward"],
                        choices=["preset", "feedforward", "sequential"])
    parser.add_argument("--profile", action="store_true",
                        help="split the learn program's op time by part and op kind (needs "
                             "XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true)")
    args = parser.parse_args()
    if args.profile and "xla_cpu_enable_xprof_traceme=true" not in os.environ.get("XLA_FLAGS", ""):
        parser.error("--profile needs XLA's per-op trace events: XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true")
    if args.profile and args.host_updates:
        parser.error("--profile splits the fused learn program: leave out --host-updates")
    c = load_config(args.preset, args.config)
    envs = Envs.make(c)
    bank = RewardBank.from_compiled([library_reward("progress")])
    rows, table = [], []
    for variant in args.variants:
        config = train_config(c, host_updates=args.host_updates)
        if variant == "feedforward":
            config = dataclasses.replace(config, network=dataclasses.replace(config.network, recurrent=False))
        elif variant == "sequential":
            config = dataclasses.replace(config, sequential_runs=True)
        m = measure(make_train(config, envs.train_env, envs.train_params, bank), args.runs, args.epochs,
                    args.profile)
        updates = c.updates_per_epoch
        table.append([variant, args.runs, f"{m['init_first_s']:.1f}", f"{m['collect_first_s']:.1f}",
                      f"{m['learn_first_s']:.1f}", f"{1000 * m['collect_s']:.0f}", f"{1000 * m['label_s']:.0f}",
                      f"{1000 * m['learn_s']:.0f}", f"{1000 * m['learn_s'] / updates:.1f}",
                      f"{1000 * m['epoch_s']:.0f}"])
        rows.append({"name": f"{c.preset} ({variant}): {args.runs} runs per job, seconds per epoch",
                     "value": round(m["epoch_s"], 4), "unit": "s", "variant": variant, "runs": args.runs,
                     "num_envs": c.num_envs, "rollout_steps": c.rollout_steps, "updates_per_epoch": updates,
                     "batch_size": c.batch_size, "hidden": c.hidden, "recurrent": config.network.recurrent,
                     **{k: v if isinstance(v, dict) else round(v, 4) for k, v in m.items()}})
        write_results(__file__, rows)  # after each variant: a run cut short keeps what it measured
        print(variant, m, flush=True)
    print(f"{c.preset}: {c.num_envs} envs x {c.rollout_steps} steps and {c.updates_per_epoch} updates of "
          f"{c.batch_size} per epoch; first calls include compiling; medians of {args.epochs} epochs")
    print_table(["network", "runs", "init first (s)", "collect first (s)", "learn first (s)", "collect (ms)",
                 "label (ms)", "learn (ms)", "per update (ms)", "epoch (ms)"], table)
    for row in rows if args.profile else ():
        print(f"{row['variant']}: learn {row['learn_gflop']:.2f} GFLOP per epoch (XLA's count), "
              f"{row['learn_gflop_per_s']:.1f} GFLOP/s; one f32[2048, 2048] matmul "
              f"{row['matmul_gflop_per_s']:.1f} GFLOP/s")
        for split in ("ops_by_part", "ops_by_kind"):
            print(f"{row['variant']}: learn's op time by {split.split('_')[-1]}")
            print_table([split.split("_")[-1], "share"], [[k, f"{100 * v:.1f}%"] for k, v in row[split].items()])
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
