"""Several processes (and hosts) as one JAX job: `jax.distributed`, and moving results to the host.

JAX's multi-controller runtime runs the same program in every process; arrays are sharded
over a mesh of every device of every process, and each process holds its shards. jaxrace
uses it for training: `train_many` shards its run axis over `jax.devices()` (all of them,
once `initialize` has run), and host-side work (LLM calls, judging, files, the report)
happens on process 0 only. Host-side Python.

Settings come from arguments, else the environment, else JAX's cluster detection (SLURM,
Open MPI, Kubernetes, Cloud TPU):

    JAXRACE_COORDINATOR   host:port of process 0's coordinator (or JAX_COORDINATOR_ADDRESS)
    JAXRACE_NUM_PROCESSES how many processes take part
    JAXRACE_PROCESS_ID    this process's index, 0 .. count - 1
"""

from __future__ import annotations

import itertools
import json
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

ENV_COORDINATOR = "JAXRACE_COORDINATOR"
ENV_NUM_PROCESSES = "JAXRACE_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXRACE_PROCESS_ID"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {value!r}") from None


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
               *, timeout_s: int = 300) -> None:
    """Joins this process to the job (call before any other JAX work); a no-op when already joined.

    Args:
        coordinator: "host:port" where process 0 serves the coordinator (every process
            gives the same address).
        num_processes, process_id: the job's size and this process's index.
        timeout_s: how long to wait for the other processes to join.

    Raises:
        ValueError: settings that cannot work (an id outside 0 .. count - 1, a port missing).
    """
    if jax.distributed.is_initialized():
        return
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR) or os.environ.get("JAX_COORDINATOR_ADDRESS")
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    if coordinator is not None and ":" not in coordinator:
        raise ValueError(f"the coordinator address {coordinator!r} needs a port, e.g. 10.0.0.1:1234")
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"the number of processes must be at least 1, got {num_processes}")
    if None not in (num_processes, process_id) and not 0 <= process_id < num_processes:
        raise ValueError(f"process id {process_id} is outside 0 .. {num_processes - 1}")
    jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=timeout_s)


def is_primary() -> bool:
    """True in process 0, which does the host-side work (always True in a single process)."""
    return jax.process_index() == 0


def to_host(tree):
    """A pytree of arrays as numpy arrays, whole, in every process (a collective when sharded over processes)."""
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)


_BROADCASTS = itertools.count()  # every process numbers its broadcasts alike
WAIT_S = 600  # one wait for process 0's next message; waits repeat while it works


def broadcast_json(value=None):
    """Process 0's `value` (anything JSON can hold) in every process; other processes pass nothing.

    Through the coordinator's key-value store, not a device collective: the other processes
    may wait for hours while process 0 works (XLA's CPU collectives time out after 30 min).
    Each wait lasts `WAIT_S` and is repeated; it ends with an error if process 0 is gone.
    """
    if jax.process_count() == 1:
        return value
    client = jax._src.distributed.global_state.client  # as orbax reads it: JAX has no public accessor
    key = f"jaxrace/broadcast/{next(_BROADCASTS)}"
    if is_primary():
        client.key_value_set(key, json.dumps(value))
        return value
    while True:
        try:
            return json.loads(client.blocking_key_value_get(key, WAIT_S * 1000))
        except Exception as err:  # noqa: BLE001 (jaxlib's error type is internal)
            if "DEADLINE_EXCEEDED" not in str(err):
                raise


def barrier(name: str) -> None:
    """Waits until every process has reached the barrier `name` (no-op in a single process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
