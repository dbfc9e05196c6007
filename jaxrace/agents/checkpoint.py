"""Checkpoints of training state through orbax: sharded, atomic, resumable on other devices.

A checkpoint is a directory of numbered steps (orbax's `CheckpointManager`). Every process
writes the shards it holds; a step exists once orbax has committed it, so a job killed
mid-save resumes from the previous step (the torn one is removed when the directory is
opened again). PRNG keys are stored as their raw data. Loading takes a template of the
state (a fresh `init` of the same job, or its `jax.eval_shape`): structure, shapes and
dtypes must match, and the arrays come back with the template's shardings, so a job saved
on 2 devices resumes on 1 or 4. Host-side Python around orbax.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import SingleDeviceSharding

from jaxrace.agents.distributed import broadcast_json


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _storable(state):
    """The state as orbax stores it: keys as their raw data, empty arrays (a GRU-less actor's
    carry) left out as None, to be made again from the template."""
    def one(x):
        if np.size(x) == 0:
            return None
        return jax.random.key_data(x) if _is_key(x) else x

    return jax.tree.map(one, state)


def _from_stored(template, stored):
    def one(like, x):
        if np.size(like) == 0:
            return jax.device_put(np.zeros(np.shape(like), like.dtype), getattr(like, "sharding", None))
        return jax.random.wrap_key_data(x, impl=jax.random.key_impl(like)) if _is_key(like) else x

    return jax.tree.map(one, template, stored, is_leaf=lambda x: x is None)


def _abstract(template):
    """ShapeDtypeStructs of the stored form of `template`, each with the sharding to restore to
    (the template's; this process's first device for a leaf without one)."""
    def one(x):
        if np.size(x) == 0:
            return None
        sharding = getattr(x, "sharding", None) or SingleDeviceSharding(jax.local_devices()[0])
        if _is_key(x):
            data = jax.eval_shape(jax.random.key_data, x)
            return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)

    return jax.tree.map(one, template)


def _path(keys) -> str:
    """"actor/params/Dense_0/bias": the same for a dataclass field and the dict orbax reads it back as."""
    def name(k):
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                return str(getattr(k, attr))
        return str(k)

    return "/".join(name(k) for k in keys)


def _check_matches(directory: Path, step: int, stored, expected) -> None:
    """Raises ValueError naming the first array whose path, shape or dtype differs from the job's."""
    have = {_path(p): x for p, x in jax.tree_util.tree_flatten_with_path(stored)[0]}
    want = {_path(p): x for p, x in jax.tree_util.tree_flatten_with_path(expected)[0]}
    if have.keys() != want.keys():
        extra, missing = sorted(have.keys() - want.keys()), sorted(want.keys() - have.keys())
        raise ValueError(f"{directory} (step {step}) holds {len(have)} arrays, the job's state {len(want)}"
                         + (f"; not in the job: {extra[0]}" if extra else "")
                         + (f"; missing: {missing[0]}" if missing else "")
                         + ": was it written by a different configuration?")
    for name, like in want.items():
        meta = have[name]
        shape, dtype = tuple(getattr(meta, "shape", ())), getattr(meta, "dtype", None)
        if shape != tuple(like.shape) or (dtype is not None and np.dtype(dtype) != np.dtype(like.dtype)):
            raise ValueError(f"{directory} (step {step}): array {name} is {dtype}{list(shape)}, "
                             f"the job expects {like.dtype}{list(like.shape)}")


def _empty_fields_not_stored(abstract, metadata) -> list[str]:
    """Fields of a dataclass state that hold nothing (None) and that a step lacks because it was
    written before the field existed (`TrainState.average_actor` without policy averaging)."""
    if not dataclasses.is_dataclass(abstract) or not hasattr(metadata, "keys"):
        return []
    return [f.name for f in dataclasses.fields(abstract)
            if getattr(abstract, f.name) is None and f.name not in metadata.keys()]


class Checkpointer:
    """One job's checkpoints in `directory`, kept open across saves.

    `save(state, step)` returns once the step is on disk (with `asynchronous`, once the
    arrays are copied off the devices: the files are written while the job goes on);
    `restore(template)`
    gives (state, step) of the newest committed step, or None when there is none;
    `close()` waits for the last write. Only the newest `keep` steps are kept.
    Every process of a multi-process job makes the same calls, unless `local`: then
    this process alone reads or writes (its arrays must not span other processes).
    """

    def __init__(self, directory: str | Path, *, keep: int = 1, asynchronous: bool = False, local: bool = False):
        self.directory = Path(directory).absolute()
        self._local = local
        me = jax.process_index()
        processes = (ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
                     if local and jax.process_count() > 1 else ocp.options.MultiprocessingOptions())
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=asynchronous,
                                               cleanup_tmp_directories=True, multiprocessing_options=processes,
                                               create=not local)  # orbax: a local manager makes no folders
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_handlers=ocp.StandardCheckpointHandler())

    def latest(self) -> int | None:
        """The newest committed step, or None."""
        return self._manager.latest_step()

    def save(self, state, step: int) -> None:
        """Saves `state` as `step`, replacing a step of that number (a job redone after a kill)."""
        if int(step) in self._manager.all_steps():
            self._manager.delete(int(step))
        stored = _storable(state)
        if self._local and jax.process_count() > 1:
            stored = jax.tree.map(np.asarray, stored)  # orbax refuses this process's own jax.Arrays here
        self._manager.save(int(step), args=ocp.args.StandardSave(stored), force=True)

    def restore(self, template):
        """(state, step) from the newest committed step, shaped and placed like `template`; None if none."""
        step = self.latest()
        if jax.process_count() > 1 and not self._local:
            step = broadcast_json(step)  # one step for all: a shared file system may list late
        if step is None:
            return None
        abstract = _abstract(template)
        metadata = self._manager.item_metadata(step)
        _check_matches(self.directory, step, metadata, abstract)
        absent = _empty_fields_not_stored(abstract, metadata)
        if absent:
            fields = {f.name: getattr(abstract, f.name) for f in dataclasses.fields(abstract) if f.name not in absent}
            stored = self._manager.restore(step, args=ocp.args.StandardRestore(fields))
            stored = abstract.replace(**dict(stored), **dict.fromkeys(absent))
        else:
            stored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        return _from_stored(template, stored), int(step)

    def wait(self) -> None:
        """Blocks until the last save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def save_checkpoint(directory: str | Path, state, step: int, *, local: bool = False) -> Path:
    """Writes `state` (a pytree of arrays) as `step` in `directory`, synchronously; returns the directory.

    Every process of a job calls it, unless `local` (the arrays are this process's alone).
    """
    with Checkpointer(directory, local=local) as checkpointer:
        checkpointer.save(state, step)
    return Path(directory)


def load_checkpoint(directory: str | Path, template):
    """(state, step) of the newest step in `directory`, with the structure, dtypes and shardings of `template`.

    Reads in this process alone (process 0's report and races read what the job saved).
    """
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {directory}")
    with Checkpointer(directory, local=True) as checkpointer:
        restored = checkpointer.restore(template)
    if restored is None:
        raise FileNotFoundError(f"{directory} holds no finished checkpoint")
    return restored
