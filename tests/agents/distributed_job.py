"""A tiny train_many job in a process of its own (the sharding, multi-process and resume tests).

    python distributed_job.py OUT [--devices D] [--processes P --process-id I --port PORT]
                              [--checkpoint DIR] [--kill-at EPOCH] [--seeds S] [--sequential]

S runs (default 2) of `small_trainer` (4 epochs, chunks of 1; `--sequential`: with
TrainConfig.sequential_runs and host_updates, the pixel actor's options on CPU) on D CPU
devices per process; with P > 1
the processes join through jax.distributed on 127.0.0.1:PORT. `--kill-at` SIGKILLs the
process after that epoch's checkpoint was handed to orbax. Process 0 writes OUT (.npz):
the metrics, the actor's leaves, the epochs this process trained and the devices per run array;
with `--sequential` also how many devices each traced program's runs were split over, whether
`collect` traces a shard_map, and how often each program compiled.
"""

import argparse
import collections
import logging
import os
import re
import signal
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--devices", type=int, default=1)
parser.add_argument("--processes", type=int, default=1)
parser.add_argument("--process-id", type=int, default=0)
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--checkpoint", default=None)
parser.add_argument("--kill-at", type=int, default=0)
parser.add_argument("--seeds", type=int, default=2)
parser.add_argument("--sequential", action="store_true")
args = parser.parse_args()
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"  # before jax starts

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxrace.agents.distributed import initialize, is_primary, to_host  # noqa: E402

if args.processes > 1:  # before anything computes (test_trainer makes arrays when imported)
    initialize(f"127.0.0.1:{args.port}", args.processes, args.process_id, timeout_s=120)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents.test_trainer import small_trainer  # noqa: E402

from jaxrace.agents import runner, train_many  # noqa: E402

trained = []
meshes = []  # with --sequential, the mesh each traced program's runs were split over (None: not split)
PROGRAMS = ("_init_runs", "_collect", "_label", "_store", "_update", "_finish")  # train_many's, with host_updates
compiles = collections.Counter()


class CountCompiles(logging.Handler):
    def emit(self, record):
        if match := re.match(r"Finished XLA compilation of jit\((\w+)\)", record.getMessage()):
            compiles[match.group(1)] += 1


if args.sequential:
    jax.config.update("jax_log_compiles", True)
    dispatch = logging.getLogger("jax._src.dispatch")
    dispatch.addHandler(CountCompiles())
    dispatch.propagate = False
    unspied = runner.over_runs

    def over_runs(learner, fn, mesh=None):
        meshes.append(mesh)
        return unspied(learner, fn, mesh)

    runner.over_runs = over_runs


def progress(epoch, metrics):
    trained.append(epoch)
    if epoch == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


print(f"devices {jax.device_count()}", flush=True)
trainer = small_trainer(sequential_runs=args.sequential, host_updates=args.sequential)
state, metrics, _ = train_many(trainer, jax.random.key(0), [0], seeds_per_reward=args.seeds, chunk_epochs=1,
                               checkpoint=args.checkpoint, progress=progress)
sequential = {}
if args.sequential:
    mesh = meshes[0]
    sequential = dict(loops=np.asarray([1 if m is None else m.size for m in meshes], np.int32),
                      compiles=np.asarray([compiles[p] for p in PROGRAMS]),
                      shard_map="shard_map" in str(jax.make_jaxpr(
                          lambda s: runner._collect(trainer.learner, s, mesh=mesh))(state)))
actor = to_host(jax.tree.leaves(state.actor))
metrics = to_host(metrics)
if is_primary():
    np.savez(args.out, critic_loss=metrics.critic_loss, progress=metrics.progress, trained=np.asarray(trained),
             devices=len(jax.tree.leaves(state.actor)[0].sharding.device_set),
             processes=jax.process_count(), **sequential, **{f"actor_{i}": a for i, a in enumerate(actor)})
