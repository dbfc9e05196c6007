"""Checkpoints of a training job at chunk boundaries: save, and resume exactly.

A checkpoint is one `.npz` of every leaf of the (vmapped) TrainState, PRNG keys stored
as their raw data, plus the epoch. Loading needs a template state of the same structure
(a fresh `init` of the same job), so the file holds arrays only, never pickled code.
Writes go to a temporary file renamed into place, so a job killed mid-write leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def save_checkpoint(path: str | Path, state, epoch: int) -> Path:
    """Writes `state` (any pytree of arrays) and the number of epochs done to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    leaves = jax.tree.leaves(state)
    arrays = {f"leaf_{i}": np.asarray(jax.random.key_data(x) if _is_key(x) else x) for i, x in enumerate(leaves)}
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, epoch=np.int64(epoch), num_leaves=np.int64(len(leaves)), **arrays)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, template):
    """(state, epoch) from `path`, with the structure, dtypes and key types of `template`."""
    with np.load(Path(path)) as data:
        leaves, treedef = jax.tree.flatten(template)
        if int(data["num_leaves"]) != len(leaves):
            raise ValueError(f"{path}: {int(data['num_leaves'])} arrays, but the job's state has {len(leaves)}: "
                             "was it written by a different configuration?")
        restored = []
        for i, like in enumerate(leaves):
            value = data[f"leaf_{i}"]
            if _is_key(like):
                restored.append(jax.random.wrap_key_data(value, impl=jax.random.key_impl(like)))
                continue
            if value.shape != np.shape(like):
                raise ValueError(f"{path}: array {i} has shape {value.shape}, the job expects {np.shape(like)}")
            restored.append(jax.numpy.asarray(value, dtype=like.dtype))
        return jax.tree.unflatten(treedef, restored), int(data["epoch"])
