"""The host side of training: many runs as one vmapped, jitted job, in chunks, with checkpoints.

Plain Python around two jitted functions (`init` and a chunk of epochs, each vmapped
over the run axis); progress callbacks, checkpoints and resumption happen between
chunks. With several devices the run axis is sharded across them.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxrace.agents.checkpoint import load_checkpoint, save_checkpoint
from jaxrace.agents.config import HParams
from jaxrace.agents.trainer import Trainer
from jaxrace.envs.parallel import env_sharding, shard_envs


@functools.partial(jax.jit, static_argnums=(0,))
def _init_runs(trainer: Trainer, keys, hparams, reward_index):
    return jax.vmap(trainer.init)(keys, hparams, reward_index)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _run_chunk(trainer: Trainer, state, hparams, reward_index, num_epochs: int):
    return jax.vmap(lambda s, h, r: trainer.run_epochs(s, h, r, num_epochs))(state, hparams, reward_index)


def per_run_hparams(hparams: HParams, runs: int) -> HParams:
    """HParams with a leading run axis on every field (shared values are broadcast)."""
    def broadcast(name, value):
        value = jnp.asarray(value, jnp.float32)
        per_run = value.ndim == (2 if name == "reward_params" else 1)
        if per_run and value.shape[0] != runs:
            raise ValueError(f"HParams.{name} has {value.shape[0]} values for {runs} runs")
        return value if per_run else jnp.broadcast_to(value, (runs, *value.shape))

    fields = {f.name: getattr(hparams, f.name) for f in dataclasses.fields(hparams)}
    return HParams(**{k: None if v is None else broadcast(k, v) for k, v in fields.items()})


def train_many(trainer: Trainer, key: jax.Array, reward_indices, seeds_per_reward: int = 1,
               hparams: HParams | None = None, chunk_epochs: int | None = None, progress=None,
               checkpoint: str | None = None):
    """Trains every (reward index, seed) pair as one vmapped, jitted job.

    Args:
        trainer: from `make_train`.
        key: split into one key per run (runs never share a key).
        reward_indices: candidate indices into the bank.
        seeds_per_reward: runs per candidate.
        hparams: HParams (default HParams()); a field may hold one value per run
            (a leading axis of R = len(reward_indices) * seeds_per_reward) for a sweep.
        chunk_epochs: epochs per jitted call (default: all); `progress(epoch, metrics)`
            is called on the host after each chunk.
        checkpoint: a file path; the job state is saved there after every chunk, and a
            job started with an existing checkpoint resumes from it (same arguments).
            The metrics of chunks done before the resume are in the checkpoint too.

    With several devices the run axis is sharded across them (when they divide R):
    each device trains its share of the runs.

    Returns:
        (final TrainState with a leading run axis R, Metrics [R, epochs], reward_index i32[R]).
    """
    reward_index = jnp.repeat(jnp.asarray(reward_indices, jnp.int32), seeds_per_reward)
    runs = reward_index.shape[0]
    hparams = per_run_hparams(HParams() if hparams is None else hparams, runs)
    keys = jax.random.split(key, runs)
    epochs = trainer.config.epochs
    chunk = chunk_epochs or epochs
    if epochs % chunk:
        raise ValueError(f"chunk_epochs ({chunk}) must divide epochs ({epochs})")
    run_sharding = env_sharding(axis_name="runs")
    keys, hparams, reward_index = shard_envs((keys, hparams, reward_index), run_sharding, strict=False)
    state = _init_runs(trainer, keys, hparams, reward_index)
    history = jax.tree.map(lambda x: jnp.zeros((runs, epochs), x.dtype),
                           jax.eval_shape(lambda: _run_chunk(trainer, state, hparams, reward_index, chunk)[1]))
    start = 0
    if checkpoint is not None and Path(checkpoint).exists():
        (state, history), start = load_checkpoint(checkpoint, (state, history))
        state = shard_envs(state, run_sharding, strict=False)
    for done in range(start, epochs, chunk):
        state, metrics = _run_chunk(trainer, state, hparams, reward_index, chunk)
        history = jax.tree.map(lambda h, m, d=done: h.at[:, d:d + chunk].set(m), history, metrics)
        if checkpoint is not None:
            save_checkpoint(checkpoint, (state, history), done + chunk)
        if progress is not None:
            progress(done + chunk, metrics)
    return state, history, reward_index
