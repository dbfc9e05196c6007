"""What checkpoints cost a training job: none, orbax saves after each chunk (synchronous or
overlapped with the next chunk), and one save alone.

Usage: python experiments/bench_checkpoint.py [--runs 3] [--epochs 60] [--chunk 10] [--replay 300000] [--rounds 3]

The quick preset's training configuration with the reference agent's replay size (the job
state is mostly replay), compiled once, then in interleaved rounds: the job without
checkpoints, the same job saving after every chunk into a new directory, synchronously
(train_many's default) and asynchronously (`checkpoint_async=True`: each write overlaps
the next chunk), and one synchronous `save_checkpoint` of the final state. Medians over
the rounds. Writes results/bench_checkpoint.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax
from common import print_table, write_results

import jaxrace
from jaxrace.agents import TrainConfig, make_train, train_many
from jaxrace.agents.checkpoint import save_checkpoint
from jaxrace.agents.networks import NetworkConfig
from jaxrace.rewards import RewardBank, library_reward


def size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--replay", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env, params = jaxrace.make(track="oval", start="time_trial", laps=1000, time_limit=60.0)
    config = TrainConfig(network=NetworkConfig(recurrent=False, hidden=64), num_envs=16, rollout_steps=8,
                         updates_per_epoch=8, batch_size=128, replay_size=args.replay, warmup_epochs=2,
                         epochs=args.epochs)
    trainer = make_train(config, env, params, RewardBank.from_compiled([library_reward("gt_sophy")]))
    root = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))

    def job(checkpoint=None, asynchronous=False):
        t0 = time.perf_counter()
        state, metrics, _ = train_many(trainer, jax.random.key(0), [0] * args.runs, chunk_epochs=args.chunk,
                                       checkpoint=checkpoint, checkpoint_async=asynchronous)
        jax.block_until_ready(metrics)
        return time.perf_counter() - t0, state

    job()  # compile
    ways = {"no checkpoints": None, "synchronous saves (the default)": False, "asynchronous saves": True}
    wall = {way: [] for way in ways}
    alone, sizes = [], []
    for r in range(args.rounds):
        for way, asynchronous in ways.items():
            folder = None if asynchronous is None else root / f"{r}-{asynchronous}"
            seconds, state = job(None if folder is None else str(folder), bool(asynchronous))
            wall[way].append(seconds)
            if folder is not None:
                sizes.append(size_mib(folder))
        t0 = time.perf_counter()
        save_checkpoint(root / f"alone{r}", state, args.epochs)
        alone.append(time.perf_counter() - t0)
    shutil.rmtree(root, ignore_errors=True)
    saves = args.epochs // args.chunk
    median = {way: statistics.median(w) for way, w in wall.items()}
    none = median["no checkpoints"]
    table, rows = [], []
    for way, seconds in median.items():
        per_save = None if way == "no checkpoints" else (seconds - none) / saves
        table.append([way, f"{seconds:.2f}", "" if per_save is None else f"{100 * (seconds / none - 1):+.0f}%",
                      "" if per_save is None else f"{per_save:.3f}"])
        rows.append({"name": f"job, {way}", "value": round(seconds, 3), "unit": "s"})
        if per_save is not None:
            rows.append({"name": f"cost per save, {way}", "value": round(per_save, 4), "unit": "s"})
    a = statistics.median(alone)
    table.append(["one synchronous save of the final state, alone", f"{a:.3f}", "", f"{a:.3f}"])
    rows += [{"name": "one synchronous save alone", "value": round(a, 4), "unit": "s"},
             {"name": "checkpoint size on disk", "value": round(statistics.median(sizes), 1), "unit": "MiB"}]
    print(f"{args.runs} runs x {args.epochs} epochs in chunks of {args.chunk} ({saves} saves), replay "
          f"{args.replay:,} per run; a checkpoint is {statistics.median(sizes):.0f} MiB on disk; "
          f"medians of {args.rounds} interleaved rounds")
    print_table(["job", "wall (s)", "vs none", "per save (s)"], table)
    print(write_results(__file__, rows))


if __name__ == "__main__":
    main()
