"""Weight tuning on a loop's store: every pair's clips evaluated, or each distinct clip once.

Usage: python experiments/tuning_shared_clips.py [--pool 56] [--pairs 180] [--steps 2242] [--repeats 3]

The loop's tune stage fits the best program's weights to every stored preference. With
whole-race clips a clip is judged in several pairs: the headline run's store (seed 0, gt_sophy
pretraining) held 56 distinct clips of 2,242 steps in its 180 iteration-1 pairs, 136 in 300
by iteration 3. A program whose returns are not affine in its weights (a clipped or squashed
sum: the cap binds somewhere on a whole race) is evaluated on the clips at every one of the
Adam steps, so the tuning's cost is proportional to the clips it evaluates.

Side by side in one run, the same pairs and labels, the offline proposer's squashed program:
- "every pair's clips": 2P clips, each pair's two its own (what `tune` evaluated before it
  kept each clip once; here the copies are made distinct, so `tune` cannot merge them);
- "distinct clips once": the pool's clips, indexed by the pairs (`unique_clips`).
First call (compile included) and the median of the warm calls after it.

The views are synthetic (random speeds, course-outs, contacts and places on `synthetic.view()`),
which is enough for timing: a program's cost does not depend on the values it reads.
Prints a table and writes results/tuning_shared_clips.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np
from common import print_table, write_results

from jaxrace.rewards import RewardBank, compile_reward, propose, synthetic
from jaxrace.rewards.clips import Clip
from jaxrace.rewards.tuning import TuningConfig, tune

TASK = "win the race cleanly from the back of the grid"


def squashed_program() -> tuple[object, str]:
    for seed in range(64):
        for p in propose(TASK, 8, jax.random.key(seed)):
            if p.structure == "squashed":
                return compile_reward(p.source, name="squashed"), p.source
    raise RuntimeError("the offline proposer wrote no squashed program in 64 keys")


def random_clips(k: int, steps: int, rng: np.random.Generator) -> Clip:
    view = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (k, steps + 1)).copy(), synthetic.view())
    view = view.replace(speed=rng.uniform(0, 60, (k, steps + 1)).astype(np.float32),
                        progress=np.cumsum(rng.uniform(0, 4.0, (k, steps + 1)), axis=1).astype(np.float32),
                        reference_speed=np.full((k, steps + 1), 10.0, np.float32),  # pace past the cap: not affine
                        off_course=rng.uniform(size=(k, steps + 1)) < 0.05,
                        hit_other_from_behind=rng.uniform(size=(k, steps + 1)) < 0.002)
    action = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (k, steps)).copy(), synthetic.action())
    return Clip(views=view, actions=action, valid=np.ones((k, steps), bool))


def timed(bank, first, second, labels, repeats: int) -> tuple[float, float, int, str]:
    seconds, result = [], None
    for _ in range(1 + repeats):
        t0 = time.perf_counter()
        result = tune(bank, first, second, labels, TuningConfig(method="grad"))
        seconds.append(time.perf_counter() - t0)
    return seconds[0], statistics.median(seconds[1:]), result.clips, result.candidates[0].returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=int, default=56)
    parser.add_argument("--pairs", type=int, default=180)
    parser.add_argument("--steps", type=int, default=2242)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    program, source = squashed_program()
    bank = RewardBank.from_compiled([program])
    unread = next(f for f in ("num_cars", "lateral_accel", "tyre_slip", "on_kerb") if f not in source)
    a = rng.integers(0, args.pool, args.pairs)
    b = (a + rng.integers(1, args.pool, args.pairs)) % args.pool
    labels = np.where(rng.uniform(size=args.pairs) < 0.5, 1.0, -1.0).astype(np.float32)
    pool = random_clips(args.pool, args.steps, rng)
    take = lambda rows: jax.tree.map(lambda x: x[rows], pool)  # noqa: E731
    # each pair's own copies: the same arrays but for a number at step 0 in a field the program does not read
    copies = [take(rows) for rows in (a, b)]
    for side, clips in enumerate(copies):
        getattr(clips.views, unread)[:, 0] = np.arange(args.pairs) * 2 + side
    variants = {"every pair's clips": copies, "distinct clips once": [take(a), take(b)]}

    rows, table = [], []
    for name, (first, second) in variants.items():
        first_s, warm_s, clips, returns = timed(bank, first, second, labels, args.repeats)
        table.append([name, clips, returns, f"{first_s:.1f}", f"{warm_s:.1f}"])
        rows += [{"name": f"{name}: first call (compile included)", "value": round(first_s, 2), "unit": "s",
                  "clips": clips, "pairs": args.pairs, "steps": args.steps, "returns": returns},
                 {"name": f"{name}: warm call (median of {args.repeats})", "value": round(warm_s, 2), "unit": "s",
                  "clips": clips, "pairs": args.pairs, "steps": args.steps, "returns": returns}]
    print_table(["pairs' clips", "clips evaluated", "returns", "first call s", "warm call s (median)"], table)
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
