"""The self-alignment paper's result in racing: an LLM's terms with a wrong weight, tuned from preferences.

Usage: python experiments/weight_tuning.py [--drivers 16] [--slots 3] [--epochs 300] [--seeds 3] [--races 10]

1. Clips: trained agents (the library rewards `progress` and `gt_sophy`, the candidate
   and the truth below, 2 seeds each, half the `--epochs`, one batched job, 2 races each
   against the AI) and the built-in AI driving the ego car at varied skill and aggression
   (the loop's bootstrap: `--drivers` races), `--slots` clips per race, so clips differ
   in pace, contacts and course-outs. Pairs: every two agents' clips at the same slot.
2. A ground-truth reward with known weights (progress 1, off course 20, contact 5),
   hidden from the tuner, labels the pairs as a B-Pref teacher would: Boltzmann-rational
   (beta 3 per s.d. of the true returns) with 10% mistakes.
3. The candidate has the same terms with the course-out weight 10x too small (2), as an
   LLM would write. (The issue's example is the contact weight; at this budget the clips
   hold almost no contacts, and no tuner can learn the weight of a term that never
   happens in them: the script prints the share of clips with each.) Tuned by gradient,
   Metropolis-Hastings and Soft-TAC on 70% of the pairs:
   held-out accuracy and log-likelihood before and after, and the recovered weight ratios
   against the truth.
4. MH against gradient: wall time (compiled, median of 3) of the cheapest setting of each
   that reaches the same held-out log-likelihood, as a ratio from one run.
5. The behavioural check: the candidate trained with its own and with the tuned weights
   on the same budget (`--seeds` seeds each, one batched job, the quick preset's agent on
   the oval), raced `--races` times from the back of the grid against the AI: at-fault
   contacts per race and finishing position.

Prints tables and writes results/weight_tuning.json (first, before anything optional).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import print_table, write_results

from jaxrace.design.config import load_config
from jaxrace.design.loop import Loop
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir
from jaxrace.rewards import RewardBank, compile_reward
from jaxrace.rewards.tac import clip_returns
from jaxrace.rewards.tuning import TuningConfig, fit_returns, linear_model, tune

PROGRAM = '''
PARAMS = {{"w_progress": {0}, "w_off_course": {1}, "w_contact": {2}}}

def reward(prev, action, curr, params):
    progress = curr.progress - prev.progress
    off = curr.off_course.astype(jnp.float32)
    contact = (curr.hit_other_from_behind | curr.side_contact).astype(jnp.float32)
    total = params["w_progress"] * progress - params["w_off_course"] * off - params["w_contact"] * contact
    return total, {{"progress": progress, "off_course": off, "contact": contact}}
'''
# The misweighted term is the course-out: at this training budget the clips hold almost no contacts
# (a weight on something that never happens in the clips cannot be learned from them), course-outs many.
TRUTH = (1.0, 20.0, 5.0)
WRONG = (1.0, 2.0, 5.0)
NAMES = ("w_progress", "w_off_course", "w_contact")


def make_pairs(drivers: int, slots: int, epochs: int, folder: Path, seed: int):
    """Clips of trained agents (the library rewards, the candidate and the truth, 2 seeds each, `epochs` each,
    2 races) and of the built-in AI at varied skill and aggression; pairs of clips at the same slot."""
    from jaxrace.agents import HParams, train_many
    from jaxrace.agents.evaluation import evaluate
    from jaxrace.rewards import library_reward

    config = load_config("quick", bootstrap_races=drivers, clips_per_race=slots, tac_min_preferences=0,
                         epochs=epochs, chunk_epochs=epochs, eval_races=2, seed=seed)
    loop = Loop(config, RunDir.open(folder, config), Display(quiet=True))
    loop.stage("bootstrap", loop.bootstrap)
    programs = [library_reward("progress"), library_reward("gt_sophy"),
                compile_reward(PROGRAM.format(*WRONG), name="candidate"),
                compile_reward(PROGRAM.format(*TRUTH), name="truth")]
    trainer = loop._trainer(1, RewardBank.from_compiled(programs))
    state, _, index = train_many(trainer, jax.random.key(seed), range(len(programs)), seeds_per_reward=2,
                                 hparams=HParams(reward_scale=config.reward_scale))
    e = loop.envs
    k_field, k_race = jax.random.split(jax.random.key(seed + 7))
    ev = evaluate(trainer, state.policy_actor, e.race_env, e.race_fields(k_field, 2), k_race, e.race_steps, num_races=2,
                  params_per_race=True)
    names = [programs[int(i)].name for i in np.asarray(index)]
    seeds = [r % 2 for r in range(len(names))]
    loop._store_clips("agents", 1, names, seeds, list(range(len(names))), ev.states, ev.actions, same_race=True)
    rows = loop.store.clips()
    clips = loop.store.load_clips(rows)
    slot = np.array([int(r.key.rsplit("slot", 1)[1]) for r in rows])
    owner = [f"{r.candidate}/{r.seed}" for r in rows]
    first, second = zip(*[(a, b) for a in range(len(rows)) for b in range(a + 1, len(rows))
                          if slot[a] == slot[b] and owner[a] != owner[b]], strict=True)
    rng = np.random.default_rng(seed)
    swap = rng.uniform(size=len(first)) < 0.5  # left/right drawn
    first, second = np.where(swap, second, first), np.where(swap, first, second)
    return jax.tree.map(jnp.asarray, clips), np.asarray(first), np.asarray(second), sum(r.iteration == 1 for r in rows)


def teacher_labels(true_returns, first, second, beta: float, mistake: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = (true_returns[first] - true_returns[second]) / true_returns.std()
    label = np.where(rng.uniform(size=d.shape) < 1 / (1 + np.exp(-beta * d)), 1.0, -1.0)
    return np.where(rng.uniform(size=d.shape) < mistake, -label, label).astype(np.float32)


def timed(fn, repeats=3):
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return out, first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drivers", type=int, default=16)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--races", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows: list[dict] = []

    truth, candidate = compile_reward(PROGRAM.format(*TRUTH), name="truth"), compile_reward(
        PROGRAM.format(*WRONG), name="candidate")
    with tempfile.TemporaryDirectory() as tmp:
        clips, first, second, trained = make_pairs(args.drivers, args.slots, args.epochs // 2, Path(tmp) / "run",
                                                   args.seed)
        true_returns = np.asarray(clip_returns(RewardBank.from_compiled([truth]), clips))[0]
        labels = teacher_labels(true_returns, first, second, beta=3.0, mistake=0.1, seed=args.seed)
        share = {f: float(np.mean(np.asarray(getattr(clips.views, f)).any(axis=1)))
                 for f in ("off_course", "side_contact", "hit_other_from_behind")}
        print(f"{len(true_returns)} clips ({trained} of trained agents), {len(labels)} pairs; clips with "
              + ", ".join(f"{k}: {100 * v:.0f}%" for k, v in share.items()))
        rows += [{"name": "clips", "value": len(true_returns), "unit": "count"},
                 {"name": "pairs", "value": len(labels), "unit": "count"}]
        rows += [{"name": f"clips with {k}", "value": round(v, 4), "unit": "share"} for k, v in share.items()]

        # 3. the tuners against the truth
        bank = RewardBank.from_compiled([candidate])
        first_clips = jax.tree.map(lambda x: x[first], clips)
        second_clips = jax.tree.map(lambda x: x[second], clips)
        table = []
        tuned_params = None
        for method in ("grad", "mh", "soft-tac"):
            result = tune(bank, first_clips, second_clips, labels, TuningConfig(method=method, seed=args.seed))
            c = result["candidate"]
            w = [c.params[n] for n in NAMES]
            ratios = (w[1] / w[0], w[2] / w[0])  # off course, contact
            table.append([method, f"{c.heldout_accuracy_before:.3f} -> {c.heldout_accuracy_after:.3f}",
                          f"{c.heldout_loglik_before:.3f} -> {c.heldout_loglik_after:.3f}",
                          f"{ratios[0]:.1f} (truth {TRUTH[1] / TRUTH[0]:.0f})",
                          f"{ratios[1]:.2f} (truth {TRUTH[2] / TRUTH[0]:.0f})", "yes" if c.tuned else c.reason])
            rows += [{"name": f"{method}: held-out accuracy before", "value": round(c.heldout_accuracy_before, 4),
                      "unit": "rate"},
                     {"name": f"{method}: held-out accuracy after", "value": round(c.heldout_accuracy_after, 4),
                      "unit": "rate"},
                     {"name": f"{method}: held-out log-likelihood before", "value": round(c.heldout_loglik_before, 4),
                      "unit": "nats/pair"},
                     {"name": f"{method}: held-out log-likelihood after", "value": round(c.heldout_loglik_after, 4),
                      "unit": "nats/pair"},
                     {"name": f"{method}: w_off_course / w_progress (truth {TRUTH[1] / TRUTH[0]:g})",
                      "value": round(ratios[0], 3), "unit": "ratio"},
                     {"name": f"{method}: w_contact / w_progress (truth {TRUTH[2] / TRUTH[0]:g})",
                      "value": round(ratios[1], 3), "unit": "ratio"}]
            if method == "grad":
                tuned_params = np.asarray(result.params[0])
        truth_acc = float(np.mean(np.sign(true_returns[first] - true_returns[second]) == labels))
        print(f"\nThe candidate (course-out weight {WRONG[1]:g}, truth {TRUTH[1]:g}) tuned on 70% of the pairs; "
              f"the truth itself agrees with {truth_acc:.3f} of the noisy labels")
        print_table(["method", "held-out accuracy", "held-out log-lik/pair", "w_off_course / w_progress",
                     "w_contact / w_progress", "tuned"], table)
        rows.append({"name": "agreement of the true reward with the noisy labels", "value": round(truth_acc, 4),
                     "unit": "rate"})

        # 4. MH against gradient: the cheapest setting of each that reaches the same held-out log-likelihood
        n = len(labels)
        clips_k = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), first_clips, second_clips)
        model, holds = linear_model(bank, clips_k, jax.random.key(1))
        assert holds.all()
        defaults = np.asarray(bank.default_params())
        mask = np.ones_like(defaults)

        def run(config):
            return fit_returns(model, defaults, mask, np.arange(n), n + np.arange(n), labels, config)

        settings = [("grad", TuningConfig(method="grad", grad_steps=s, restarts=1)) for s in (25, 50, 100, 200, 400)]
        settings += [("mh", TuningConfig(method="mh", steps=s, burn_in=s // 2)) for s in (250, 500, 1000, 2000, 4000)]
        speed = []
        for method, config in settings:
            out, first_call, median = timed(lambda config=config: run(config))
            speed.append((method, config, float(out["after"][1][0]), first_call, median))
        target = max(ll for method, _, ll, _, _ in speed if method == "grad") - 0.005
        best = {}
        timing = []
        for method, config, ll, first_call, median in speed:
            size = config.grad_steps if method == "grad" else config.steps
            timing.append([method, size, f"{ll:.4f}", f"{first_call:.2f}", f"{1000 * median:.1f}"])
            if ll >= target and method not in best:
                best[method] = median
        print(f"\nHeld-out log-likelihood per pair by steps (target {target:.4f}: the gradient's best - 0.005)")
        print_table(["method", "steps", "held-out log-lik/pair", "first call, s (compile)", "compiled, ms"], timing)
        ratio = best.get("mh", float("nan")) / best["grad"]
        print(f"MH needs {ratio:.1f}x the gradient's wall time to reach the target" if "mh" in best else
              "MH did not reach the target within 4000 steps")
        rows += [{"name": f"{m}, {c.grad_steps if m == 'grad' else c.steps} steps: held-out log-likelihood",
                  "value": round(ll, 5), "unit": "nats/pair"} for m, c, ll, _, _ in speed]
        rows += [{"name": f"{m}, {c.grad_steps if m == 'grad' else c.steps} steps: compiled wall time",
                  "value": round(1000 * t, 2), "unit": "ms"} for m, c, _, _, t in speed]
        rows.append({"name": "MH / gradient wall time to the same held-out log-likelihood",
                     "value": round(ratio, 2) if np.isfinite(ratio) else None, "unit": "ratio"})
        write_results(__file__, rows)  # before the long part: the tuning results are kept whatever happens

        # 5. the behavioural check: the same budget with the candidate's weights and with the tuned ones
        from jaxrace.agents import HParams, train_many
        from jaxrace.agents.evaluation import evaluate

        config = load_config("quick", epochs=args.epochs, chunk_epochs=args.epochs)
        loop = Loop(config, RunDir.open(Path(tmp) / "train", config), Display(quiet=True))
        trainer = loop._trainer(1, bank)
        weights = np.stack([defaults[0]] * args.seeds + [tuned_params] * args.seeds)
        t0 = time.perf_counter()
        state, history, _ = train_many(trainer, jax.random.key(args.seed), [0, 0], seeds_per_reward=args.seeds,
                                       hparams=HParams(reward_scale=config.reward_scale,
                                                       reward_params=jnp.asarray(weights)))
        train_seconds = time.perf_counter() - t0
        e = loop.envs
        k_field, k_race = jax.random.split(jax.random.key(args.seed + 1))
        ev = evaluate(trainer, state.policy_actor, e.race_env, e.race_fields(k_field, args.races), k_race, e.race_steps,
                      num_races=args.races, params_per_race=True)
        behaviour = []
        for v, name in enumerate(("candidate's weights", "tuned weights")):
            races = [m for r in range(v * args.seeds, (v + 1) * args.seeds) for m in ev.metrics[r]]
            contacts = float(np.mean([m.collisions_at_fault for m in races]))
            position = float(np.median([m.finishing_position for m in races]))
            mean_position = float(np.mean([m.finishing_position for m in races]))
            outs = float(np.mean([m.course_outs for m in races]))
            behaviour.append([name, len(races), f"{contacts:.2f}", f"{position:.1f}", f"{mean_position:.2f}",
                              f"{outs:.2f}"])
            rows += [{"name": f"{name}: at-fault contacts per race", "value": round(contacts, 3), "unit": "count"},
                     {"name": f"{name}: median finishing position", "value": position, "unit": "position"},
                     {"name": f"{name}: mean finishing position", "value": round(mean_position, 3),
                      "unit": "position"},
                     {"name": f"{name}: course-outs per race", "value": round(outs, 3), "unit": "count"}]
        print(f"\nTrained {args.epochs} epochs x {2 * args.seeds} runs in one job ({train_seconds:.0f} s), "
              f"{args.races} races each from P{e.race_env.static.num_cars} against the AI at {config.ai_skill}")
        print_table(["weights", "races", "at-fault contacts/race", "median position", "mean position",
                     "course-outs/race"], behaviour)
        rows.append({"name": "behavioural check: training wall time", "value": round(train_seconds, 1), "unit": "s"})
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
