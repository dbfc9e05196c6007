"""The host side of training: many runs as one vmapped, jitted job, in chunks, with checkpoints.

Plain Python around jitted functions, each vmapped over the run axis: `init`, then per
epoch either one fused program (`fused=True`: `Trainer.run_epochs`, a scan over a chunk
of epochs) or three (`collect`, `label`, `learn`; the default; with
`TrainConfig.host_updates`, `learn` is `store`, one `update` call per gradient update
from a Python loop, and `finish`). Only `label` reads the
reward bank, so with the split programs a new bank recompiles only that small program:
`collect` and `learn` are compiled once per Learner (and kept in JAX's persistent cache
across processes). Progress callbacks, checkpoints (orbax) and resumption happen between
chunks. With several devices the run axis is sharded
across them: local ones, or every process's after `jaxrace.agents.distributed.initialize`;
with `TrainConfig.sequential_runs` each device loops over its own share (`shard_map`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrace.agents.checkpoint import Checkpointer
from jaxrace.agents.config import HParams
from jaxrace.agents.distributed import to_host
from jaxrace.agents.trainer import Learner, Metrics, Trainer, TrainState
from jaxrace.envs.parallel import env_sharding, shard_envs
from jaxrace.jit import jit


def _renders(job, *args, **kwargs) -> bool:
    """Whether a job's programs render (a pixel actor's): those compile with XLA's defaults (`jaxrace.jit`)."""
    return job.config.network.actor_input == "pixels"


_job_program = functools.partial(jit, renders=_renders)  # the first argument a Learner or a Trainer


@functools.partial(_job_program, static_argnums=(0,), static_argnames=("sharding",))
def _init_runs(learner: Learner, keys, hparams, *, sharding: NamedSharding | None = None):
    """`sharding`: the run axis split over devices. The state's leaves that do not depend on the
    keys (the empty replay, the counters) would otherwise come out replicated: every device would
    hold every run's replay, and the first chunk would compile again for the split state it returns."""
    state = jax.vmap(learner.init)(keys, hparams)
    return state if sharding is None else jax.lax.with_sharding_constraint(state, sharding)


def over_runs(learner: Learner, fn, mesh: Mesh | None = None):
    """`fn` over the leading run axis of its arguments: vmapped, or with
    `TrainConfig.sequential_runs` one run after another, unrolled (a scan with no loop left:
    XLA:CPU differentiates a convolution inside a loop an order of magnitude slower). `mesh`
    (train_many's, when the runs are split over several devices): each device loops over its own share."""
    if not learner.config.sequential_runs:
        return jax.vmap(fn)

    def one_after_another(*args):
        if jax.tree.leaves(args)[0].shape[0] == 1:  # a scan of one run is a loop to XLA: 18x slower there
            return jax.vmap(fn)(*args)
        return jax.lax.scan(lambda _, a: (None, fn(*a)), None, args, unroll=True)[1]

    if mesh is None:
        return one_after_another
    runs = P(mesh.axis_names[0])  # a prefix of every argument and result: the run axis first, split
    return jax.shard_map(one_after_another, mesh=mesh, in_specs=runs, out_specs=runs, check_vma=False)


@functools.partial(_job_program, static_argnums=(0, 4), static_argnames=("mesh",), donate_argnums=(1,))
def _run_chunk(trainer: Trainer, state, hparams, reward_index, num_epochs: int, *, mesh: Mesh | None = None):
    return over_runs(trainer.learner, lambda s, h, r: trainer.run_epochs(s, h, r, num_epochs), mesh)(
        state, hparams, reward_index)


@functools.partial(_job_program, static_argnums=(0,), static_argnames=("mesh",), donate_argnums=(1,))
def _collect(learner: Learner, state, *, mesh: Mesh | None = None):
    return over_runs(learner, learner.collect, mesh)(state)


@functools.partial(_job_program, static_argnums=(0,))
def _label(trainer: Trainer, collected, reward_index, reward_params):
    return jax.vmap(trainer.label)(collected, reward_index, reward_params)


@functools.partial(_job_program, static_argnums=(0,), static_argnames=("mesh",), donate_argnums=(1,))
def _learn(learner: Learner, state, hparams, collected, rewards, *, mesh: Mesh | None = None):
    return over_runs(learner, learner.learn, mesh)(state, hparams, collected, rewards)


@functools.partial(_job_program, static_argnums=(0,), static_argnames=("mesh",), donate_argnums=(1,))
def _store(learner: Learner, state, collected, rewards, *, mesh: Mesh | None = None):
    return over_runs(learner, learner.store, mesh)(state, collected, rewards)


@functools.partial(_job_program, static_argnums=(0,), static_argnames=("mesh",), donate_argnums=(1,))
def _update(learner: Learner, state, hparams, *, mesh: Mesh | None = None):
    return over_runs(learner, learner.update, mesh)(state, hparams)


@functools.partial(_job_program, static_argnums=(0,), static_argnames=("mesh",), donate_argnums=(1,))
def _finish(learner: Learner, state, collected, rewards, losses, *, mesh: Mesh | None = None):
    """losses: (critic, actor) f32[R, U], or None during warm-up (no updates: reported as 0)."""
    def one(s, c, r, ls):
        ls = (jnp.zeros(learner.config.updates_per_epoch),) * 2 if ls is None else ls
        return learner.finish(s, s, c, r, ls)

    return over_runs(learner, one, mesh)(state, collected, rewards, losses)


def _host_learn(learner: Learner, state, hparams, collected, rewards, epoch: int, mesh: Mesh | None = None):
    """`learn` with each update its own call (`TrainConfig.host_updates`); none during warm-up."""
    state = _store(learner, state, collected, rewards, mesh=mesh)
    losses = None
    if epoch >= learner.config.warmup_epochs:
        steps = []
        for _ in range(learner.config.updates_per_epoch):
            state, loss = _update(learner, state, hparams, mesh=mesh)
            steps.append(loss)
        losses = tuple(jnp.stack(x, axis=1) for x in zip(*steps, strict=True)) if steps else None
    return _finish(learner, state, collected, rewards, losses, mesh=mesh)


def split_epochs(trainer: Trainer, state, hparams, reward_index, num_epochs: int, first_epoch: int = 0,
                 mesh: Mesh | None = None):
    """`num_epochs` epochs of R vmapped runs as collect, label and learn calls (train_many's default).

    state, hparams (`per_run_hparams`) and reward_index i32[R] have the run axis R first;
    returns (state, Metrics [R, num_epochs]). The weights go to `label` alone: their width
    (the bank's most PARAMS) must not reach the bank-free programs' shapes. `first_epoch`
    (the epochs done before) tells the host loop of `TrainConfig.host_updates` when
    warm-up ends. `mesh`: the devices that each loop over their share of the runs (as in `over_runs`).
    """
    reward_params = _reward_params(trainer, hparams, reward_index)
    hparams = hparams.replace(reward_params=None)
    learner, metrics = trainer.learner, []
    for epoch in range(first_epoch, first_epoch + num_epochs):
        state, collected = _collect(learner, state, mesh=mesh)
        rewards = _label(trainer, collected, reward_index, reward_params)
        if learner.config.host_updates:
            state, epoch_metrics = _host_learn(learner, state, hparams, collected, rewards, epoch, mesh)
        else:
            state, epoch_metrics = _learn(learner, state, hparams, collected, rewards, mesh=mesh)
        metrics.append(epoch_metrics)
    return state, jax.tree.map(lambda *m: jnp.stack(m, axis=1), *metrics)


def committed(tree):
    """The arrays pinned where they are: the first chunk's calls then match every later one's.

    A jitted `trainer.init` called on uncommitted inputs returns uncommitted arrays, while the
    trainer's chunks return committed ones; jit compiles each kind apart, so a loop of chunks
    that starts from the bare init state compiles its chunk twice.
    """
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding), tree)


def _reward_params(trainer: Trainer, hparams: HParams, reward_index) -> jax.Array:
    """f32[R, P]: every run's weights (hparams.reward_params, or its candidate's defaults)."""
    if hparams.reward_params is not None:
        return hparams.reward_params
    return trainer.bank.default_params()[reward_index]


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


def device_memory_limit(device) -> int | None:
    """Bytes `device` may allocate (None where its backend does not say: XLA:CPU)."""
    stats = device.memory_stats() or {}
    return stats.get("bytes_limit")


def check_job_fits(learner: Learner, keys, hparams, devices) -> None:
    """Refuses a job whose state alone (replay buffers, networks, optimisers) cannot fit a device.

    The state's size comes from `jax.eval_shape` (nothing is allocated); the runs are split
    over `devices` when they divide the run count. A job that fails here would otherwise
    spend its compile and then run out of memory, or stall retrying, on the device.
    `train_many` checks single-process jobs only.
    """
    limit = device_memory_limit(devices[0])
    if limit is None:
        return
    state = jax.eval_shape(lambda k, h: jax.vmap(learner.init)(k, h), keys, hparams)
    runs = keys.shape[0]
    share = len(devices) if runs % len(devices) == 0 else 1
    needed = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) / share
    if needed > limit:
        c = learner.config
        replay = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.replay)) / share
        gib = 1 << 30
        raise ValueError(
            f"the training job does not fit on {devices[0].device_kind}: {runs} runs need {needed / gib:.1f} GiB "
            f"per device for their state alone ({replay / gib:.1f} GiB of it replay: replay_size {c.replay_size:,} "
            f"transitions per run), more than the {limit / gib:.1f} GiB it can use, before any temporary memory; "
            "lower replay_size, or train fewer runs per job (candidates x seeds), or use more devices "
            "(experiments/train_memory.py sizes a job)")


def warm_start(state: TrainState, start_from: dict) -> TrainState:
    """`state` (leading run axis R) with its networks and temperature replaced by `start_from`'s
    ("actor", "critic", "log_alpha"; see `train_many`), placed as the state's own arrays are, so
    the first chunk compiles no program of its own. The target critic starts as the critic, and
    the actor's moving average (when kept) as the actor."""
    missing = {"actor", "critic", "log_alpha"} - set(start_from)
    if missing:
        raise ValueError(f"start_from lacks {sorted(missing)}: it needs 'actor', 'critic' and 'log_alpha'")
    new = {"actor": start_from["actor"], "critic": start_from["critic"], "target_critic": start_from["critic"],
           "log_alpha": start_from["log_alpha"]}
    if state.average_actor is not None:
        new["average_actor"] = start_from["actor"]

    def placed(path, like, value):
        value = np.asarray(value)
        if value.shape != like.shape:
            raise ValueError(f"start_from{jax.tree_util.keystr(path)} has shape {value.shape}; this job's "
                             f"networks need {like.shape} (the same network config and {like.shape[0]} runs)")
        value = value.astype(like.dtype)
        return jax.make_array_from_callback(like.shape, like.sharding, lambda index: value[index])

    replaced = {}
    for name, value in new.items():
        like = getattr(state, name)
        if jax.tree.structure(like) != jax.tree.structure(value):
            raise ValueError(f"start_from's {name!r} is not this job's network: {jax.tree.structure(value)} "
                             f"against {jax.tree.structure(like)}")
        replaced[name] = jax.tree_util.tree_map_with_path(
            lambda path, x, v, n=name: placed((jax.tree_util.DictKey(n), *path), x, v), like, value)
    return state.replace(**replaced)


def train_many(trainer: Trainer, key: jax.Array, reward_indices, seeds_per_reward: int = 1,
               hparams: HParams | None = None, chunk_epochs: int | None = None, progress=None,
               checkpoint: str | None = None, fused: bool = False, checkpoint_async: bool = False,
               devices=None, keep=None, start_from: dict | None = None):
    """Trains every (reward index, seed) pair as one vmapped, jitted job.

    Args:
        trainer: from `make_train`.
        key: split into one key per run (runs never share a key).
        reward_indices: candidate indices into the bank.
        seeds_per_reward: runs per candidate.
        hparams: HParams (default HParams()); a field may hold one value per run
            (a leading axis of R = len(reward_indices) * seeds_per_reward) for a sweep.
        chunk_epochs: epochs per jitted call (default: all); `progress(epoch, metrics)`
            is called on the host after each chunk, with the chunk's Metrics as numpy
            arrays [R, chunk].
        checkpoint: a directory; the job state is saved there (orbax) after every chunk,
            and a job started with a checkpoint there resumes from its newest finished
            step (same arguments; any number of devices). The metrics of chunks done
            before the resume are in the checkpoint too.
        fused: one program per chunk (`Trainer.run_epochs`) instead of the split
            collect/label/learn programs; compiled again for every bank.
        checkpoint_async: write each checkpoint while the next chunk runs. Off by
            default: on a 2-core CPU the background write slows the chunk more than it
            saves (experiments/bench_checkpoint.py).

        devices: the devices to train on (default: all, of every process). This
            process's own (`jax.local_devices()`) make a job of this process alone.
        keep: a `jaxrace.agents.selection.KeepBest`: after every chunk it judges the runs'
            actors and keeps each run's best (its state is in the checkpoints too, so a
            resumed job keeps what it had chosen); read `keep.actor` after the job.
        start_from: networks to start from instead of fresh ones (`warm_start`): "actor" and
            "critic" as a job saves them (each leaf with a leading axis of R runs) and
            "log_alpha" f32[R]. Optimisers, replay, envs and keys start fresh; a resumed
            job takes its networks from the checkpoint.

    A chunk is reported to `progress` once its checkpoint is on disk: a job killed after
    a report resumes after that chunk.

    With several devices the run axis is sharded across them (when they divide R):
    each device trains its share of the runs (with `TrainConfig.sequential_runs`, one after
    another). Across processes (`distributed.initialize`)
    every process makes this same call, and the devices of all must divide R.

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
    run_sharding = env_sharding(devices, axis_name="runs")
    split = run_sharding if run_sharding.mesh.size > 1 and runs % run_sharding.mesh.size == 0 else None  # (shard_envs)
    mesh = split.mesh if split is not None and trainer.config.sequential_runs else None  # (GSPMD splits vmapped runs)
    local = jax.process_count() > 1 and run_sharding.is_fully_addressable
    if jax.process_count() > 1 and not local and runs % run_sharding.mesh.size:
        raise ValueError(f"{runs} runs cannot be split over the {run_sharding.mesh.size} devices of "
                         f"{jax.process_count()} processes: use a multiple of {run_sharding.mesh.size} runs")
    if jax.process_count() == 1:  # (asking another process's device for its memory stalled a 2-process job)
        check_job_fits(trainer.learner, keys, hparams.replace(reward_params=None), run_sharding.mesh.devices.flatten())
    keys, hparams, reward_index = shard_envs((keys, hparams, reward_index), run_sharding, strict=False)
    state = committed(_init_runs(trainer.learner, keys, hparams.replace(reward_params=None), sharding=split))
    if start_from is not None:
        state = warm_start(state, start_from)
    if keep is not None:
        keep.start(state.policy_actor, updates=len(range(0, epochs, chunk)))
    if fused and trainer.config.host_updates:
        raise ValueError("TrainConfig(host_updates=True) needs the split programs: train_many(fused=False)")
    history = shard_envs(Metrics(*(jnp.zeros((runs, epochs), bool if name == "failed" else jnp.float32)
                                   for name in Metrics._fields)), run_sharding, strict=False)
    start = 0
    checkpointer = (None if checkpoint is None
                    else Checkpointer(checkpoint, asynchronous=checkpoint_async, local=local))
    saved = None  # (epoch, metrics) of the chunk whose checkpoint is being written

    def report():
        # A chunk is reported once its checkpoint is on disk (a kill after the report loses none of it);
        # an asynchronous write overlaps the next chunk, dispatched before this wait.
        if checkpointer is not None:
            checkpointer.wait()
        host_metrics = to_host(saved[1])  # every process: a collective when the runs span processes
        if progress is not None:
            progress(saved[0], host_metrics)

    def job():
        return (state, history) if keep is None else (state, history, keep.saved())

    try:
        restored = None if checkpointer is None else checkpointer.restore(job())
        if restored is not None:
            stored, start = restored
            state, history = committed(stored[0]), stored[1]
            if keep is not None:
                keep.load(stored[2])
        for done in range(start, epochs, chunk):
            if fused:
                state, metrics = _run_chunk(trainer, state, hparams, reward_index, chunk, mesh=mesh)
            else:
                state, metrics = split_epochs(trainer, state, hparams, reward_index, chunk, first_epoch=done,
                                              mesh=mesh)
            history = jax.tree.map(lambda h, m, d=done: h.at[:, d:d + chunk].set(m), history, metrics)
            if keep is not None:
                keep.update(done + chunk, state.policy_actor)
            if saved is not None:
                report()
            if checkpointer is not None:
                checkpointer.save(job(), done + chunk)
            saved = (done + chunk, metrics)
        if saved is not None:
            report()
    finally:
        if checkpointer is not None:
            checkpointer.close()  # the last save finishes, also when the job is stopped
    return state, history, reward_index
