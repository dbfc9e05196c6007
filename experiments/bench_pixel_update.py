"""One QR-SAC update of the pixel actor (CNN + GRU), jitted alone against inside `lax.scan`.

Usage: python experiments/bench_pixel_update.py [--repeats 2]

The trainer runs its epochs and updates as scans. On XLA:CPU the gradient of a
convolution is much slower inside a loop than outside one, which is what makes the
pixel actor impractical to train on this CPU (docs/reference_agent.md, "The pixel actor on CPU"). Times
one update's loss gradient on a replayed batch (16 envs, batch 32 sequences of burn-in 8
+ 16 trained steps + the n-step tail) both ways, and the same gradient of the encoder
alone on those frames. Then one whole epoch (16 envs x 8 steps, 4 updates) as
`train_many` runs it with `TrainConfig(host_updates=True)`: the split programs, each
update its own jitted call from a host loop. Writes results/bench_pixel_update.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
from common import print_table, write_results

import jaxrace
from jaxrace.agents import HParams, TrainConfig, make_train
from jaxrace.agents.networks import Encoder, NetworkConfig
from jaxrace.agents.runner import per_run_hparams, split_epochs
from jaxrace.rewards import RewardBank, library_reward


def timed(fn, *args, repeats: int):
    """(compile s, median run s) of jax.jit(fn)(*args)."""
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t
    jax.block_until_ready(compiled(*args))
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - t)
    return compile_s, sorted(runs)[len(runs) // 2]


def in_scan(grad_fn, length: int):
    """`length` gradient steps of a tiny SGD, as a scan (the trainer's shape of loop)."""
    def run(nets, batch):
        def body(n, _):
            g = grad_fn(n, batch)
            return jax.tree.map(lambda a, b: a - 1e-6 * b, n, g), None
        return jax.lax.scan(body, nets, None, length=length)[0]
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    env, params = jaxrace.make(track="oval", start="random", laps=1000, time_limit=60.0, pixels=True)
    network = NetworkConfig(actor_input="pixels", recurrent=True, hidden=128)
    config = TrainConfig(network=network, num_envs=16, rollout_steps=8, updates_per_epoch=4, burn_in=8,
                         train_length=16, batch_size=32, replay_size=4096, n_step=5, warmup_epochs=1, epochs=1)
    trainer = make_train(config, env, params, RewardBank.from_compiled([library_reward("gt_sophy")]))
    hparams = HParams(reward_scale=0.1)
    state = jax.jit(trainer.init)(jax.random.key(0), hparams, 0)
    state = jax.jit(lambda s: trainer.run_epochs(s, hparams, 0, 1))(state)[0]  # a warm-up epoch fills replay
    batch = jax.jit(trainer.sample)(state.replay, jax.random.key(1))
    nets = (state.actor, state.critic, state.log_alpha)

    def objective(n, b):
        out = trainer.loss_fn(n, state.target_critic, b, hparams, jax.random.key(2))
        return out.critic + out.actor + out.alpha

    frames = {"pixels": batch.obs["pixels"], "proprio": batch.obs["proprio"]}  # [B, T, ...]
    encoder = Encoder(network)
    enc_params = encoder.init(jax.random.key(3), jax.tree.map(lambda x: x[0, 0], frames))
    per_step = jax.tree.map(lambda x: x.swapaxes(0, 1), frames)  # [T, B, ...]

    def enc_batched(p, f):
        return encoder.apply(p, f).sum()

    def enc_stepwise(p, f):
        return jax.lax.scan(lambda c, x: (c + encoder.apply(p, x).sum(), None), 0.0, f)[0]

    rows, table = [], []
    cases = [("update gradient, jitted alone", jax.grad(objective), nets, batch, 1),
             ("update gradient, 2 iterations in lax.scan", in_scan(jax.grad(objective), 2), nets, batch, 2),
             ("encoder gradient, all frames in one batch", jax.grad(enc_batched), enc_params, frames, 1),
             ("encoder gradient, one batch per step in lax.scan", jax.grad(enc_stepwise), enc_params, per_step, 1)]
    for name, fn, a, b, per in cases:
        compile_s, run_s = timed(fn, a, b, repeats=args.repeats)
        rows += [{"name": f"{name}: run per gradient", "value": round(run_s / per, 5), "unit": "s"},
                 {"name": f"{name}: compile", "value": round(compile_s, 1), "unit": "s"}]
        table.append([name, f"{run_s / per:.3g}", round(compile_s, 1)])
        print(table[-1], flush=True)
    host = make_train(dataclasses.replace(config, host_updates=True), env, params, trainer.bank)
    runs = jax.tree.map(lambda x: x[None], state)  # one run, after the warm-up epoch
    hp, index = per_run_hparams(hparams, 1), jnp.zeros(1, jnp.int32)
    epoch_s = []
    for i in range(args.repeats + 1):  # the first call compiles
        t = time.perf_counter()
        runs, metrics = split_epochs(host, runs, hp, index, 1, first_epoch=1 + i)
        jax.block_until_ready((runs, metrics))
        epoch_s.append(time.perf_counter() - t)
    name = "epoch of 16 envs x 8 steps and 4 updates, host loop of jitted updates"
    run_s = sorted(epoch_s[1:])[len(epoch_s[1:]) // 2]
    rows += [{"name": f"{name}: run per epoch", "value": round(run_s, 5), "unit": "s"},
             {"name": f"{name}: first epoch, compile included", "value": round(epoch_s[0], 1), "unit": "s"}]
    table.append([name + " (per epoch)", f"{run_s:.3g}", round(epoch_s[0] - run_s, 1)])
    frames_n = batch.obs["pixels"].shape[0] * batch.obs["pixels"].shape[1]
    rows.append({"name": "frames per sampled batch", "value": int(frames_n), "unit": "frames"})
    print_table(["case", "s per gradient (median)", "compile s"], table)
    print(f"wrote {write_results('bench_pixel_update', rows)}")


if __name__ == "__main__":
    main()
