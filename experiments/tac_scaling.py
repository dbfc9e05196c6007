"""TAC's data scaling (the GT7 paper's open question): how many stored preferences before TAC picks well?

Usage: python experiments/tac_scaling.py [--candidates 8] [--epochs 150] [--races 4] [--resamples 200]

1. 2 x `--candidates` offline programs for the task; the first half are "earlier" agents
   (what an earlier iteration trained), the second half the candidates to choose among.
   All are trained in one batched job (the quick preset's agent on the oval, `--epochs`)
   and raced `--races` times against the AI; clips are cut as the loop cuts them.
2. The truth: the candidate the judge prefers after training. That is the Bradley-Terry
   top of the noiseless scripted judge over every pair of the candidates' clips (same
   race, same moment).
3. Stored preferences, labelled by a noisy scripted judge (10% mistakes, the `standard`
   preset's): pairs of the earlier agents' clips; the loop's bootstrap (the built-in AI at
   16 skill and aggression settings); or both.
4. For D = 25, 50, 100, 200, 400 stored preferences drawn from each pool (`--resamples`
   draws): TAC (tau-b) of each candidate, computed *before* the candidates are trained
   (from its returns on the stored clips). Reported: how often TAC's top candidate is the
   judge's top (chance is 1 / candidates), and Kendall tau between TAC and the judge's
   Bradley-Terry strengths.

Prints tables and writes results/tac_scaling.json.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path

import jax
import numpy as np
from common import print_table, write_results
from scipy.stats import kendalltau

from jaxrace.agents import HParams, train_many
from jaxrace.agents.evaluation import evaluate
from jaxrace.design.config import load_config
from jaxrace.design.loop import Loop
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir
from jaxrace.judges import Pair, ScriptedJudge, TaskScoring
from jaxrace.rewards import RewardBank, compile_rewards, propose
from jaxrace.rewards.bradley_terry import fit_labels
from jaxrace.rewards.tac import clip_returns, tac_from_returns

SIZES = (25, 50, 100, 200, 400)


def same_moment_pairs(rows, owners) -> list[tuple[int, int]]:
    """Index pairs of clips (rows of the store) of two different owners at the same race and slot."""
    where = {}
    for i, r in enumerate(rows):
        if r.candidate in owners:
            where.setdefault((r.race, r.key.rsplit("slot", 1)[1]), []).append(i)
    return [(a, b) for group in where.values() for a, b in itertools.combinations(group, 2)
            if rows[a].candidate != rows[b].candidate]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--races", type=int, default=4)
    parser.add_argument("--resamples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    m = args.candidates
    config = load_config("quick", bootstrap_races=16, clips_per_race=3, eval_races=args.races, epochs=args.epochs,
                         chunk_epochs=args.epochs, judge_mistake=0.1, videos_per_candidate=0, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        loop = Loop(config, RunDir.open(Path(tmp) / "run", config), Display(quiet=True))
        loop.stage("bootstrap", loop.bootstrap)  # AI clips, judged by the noisy scripted judge
        proposals = propose(config.task, 2 * m, jax.random.key(args.seed))
        compiled = compile_rewards([p.source for p in proposals], names=[f"p{i}" for i in range(2 * m)])
        bad = [c for c in compiled if isinstance(c, Exception)]
        if bad:
            raise SystemExit(f"an offline program failed to compile: {bad[0]}")
        bank = RewardBank.from_compiled(compiled)
        trainer = loop._trainer(1, bank)
        state, _, index = train_many(trainer, jax.random.key(args.seed), range(2 * m),
                                     hparams=HParams(reward_scale=config.reward_scale))
        e = loop.envs
        k_field, k_race = jax.random.split(jax.random.key(args.seed + 1))
        ev = evaluate(trainer, state.policy_actor, e.race_env, e.race_fields(k_field, args.races), k_race, e.race_steps,
                      num_races=args.races, params_per_race=True)
        names = [f"p{int(i)}" for i in np.asarray(index)]
        loop._store_clips("agents", 1, names, [0] * len(names), list(range(len(names))), ev.states, ev.actions,
                          same_race=True)
        rows = loop.store.clips()
        clips = jax.tree.map(np.asarray, loop.store.load_clips(rows))
        earlier, candidates = {f"p{i}" for i in range(m)}, [f"p{i}" for i in range(m, 2 * m)]

        # the truth: the noiseless judge's Bradley-Terry ranking of the trained candidates
        oracle = ScriptedJudge(scoring=TaskScoring.from_task(config.task))
        one = lambda i: jax.tree.map(lambda x: x[i], clips)  # noqa: E731
        truth_pairs = same_moment_pairs(rows, set(candidates))
        truth_labels = [oracle.judge(Pair(f"t{a}~{b}", one(a), one(b))).label for a, b in truth_pairs]
        owner = np.array([candidates.index(rows[i].candidate) if rows[i].candidate in candidates else -1
                          for i in range(len(rows))])
        strengths, _ = fit_labels(owner[[a for a, _ in truth_pairs]], owner[[b for _, b in truth_pairs]],
                                  truth_labels, m)
        strengths = np.asarray(strengths)
        best = int(np.argmax(strengths))
        print(f"{len(rows)} clips; the judge prefers {candidates[best]} of {m} candidates after training "
              f"({len(truth_pairs)} pairs judged)")

        # the pools of stored preferences
        noisy = ScriptedJudge(scoring=TaskScoring.from_task(config.task), mistake=0.1, seed=args.seed + 5)
        agent_pairs = same_moment_pairs(rows, earlier)
        agent_labels = [noisy.judge(Pair(f"a{a}~{b}", one(a), one(b))).label for a, b in agent_pairs]
        ids = {r.id: i for i, r in enumerate(rows)}
        boot = [(ids[p.first], ids[p.second], p.label) for p in loop.store.preferences(0)]
        sign = {"first": 1.0, "second": -1.0, "tie": 0.0, "skip": np.nan}
        pools = {
            "bootstrap (AI) only": [(a, b, sign[lab]) for a, b, lab in boot],
            "earlier agents only": [(a, b, sign[lab]) for (a, b), lab in zip(agent_pairs, agent_labels, strict=True)],
        }
        pools["both"] = pools["bootstrap (AI) only"] + pools["earlier agents only"]
        returns = np.asarray(clip_returns(RewardBank.from_compiled(compiled[m:]), jax.tree.map(np.asarray, clips)))

        results, table = [], []
        for pool_name, pool in pools.items():
            pool = [p for p in pool if not np.isnan(p[2])]
            for d in SIZES:
                if d > len(pool):
                    continue
                hits, taus = [], []
                for _ in range(args.resamples):
                    pick = rng.choice(len(pool), size=d, replace=False)
                    a = np.array([pool[i][0] for i in pick])
                    b = np.array([pool[i][1] for i in pick])
                    labels = np.array([pool[i][2] for i in pick], np.float32)
                    scores = np.asarray(tac_from_returns(returns[:, a], returns[:, b], labels, "b"))
                    top = np.flatnonzero(scores == scores.max())
                    hits.append(float(best in top) / len(top))  # a tie at the top shares the hit
                    taus.append(kendalltau(scores, strengths).statistic)
                hit, tau = float(np.mean(hits)), float(np.nanmean(taus))
                table.append([pool_name, d, f"{hit:.3f}", f"{tau:+.3f}"])
                results += [{"name": f"{pool_name}, D={d}: TAC's top is the judge's top", "value": round(hit, 4),
                             "unit": "rate", "chance": round(1 / m, 4), "resamples": args.resamples},
                            {"name": f"{pool_name}, D={d}: Kendall tau of TAC against the judge's ranking",
                             "value": round(tau, 4), "unit": "tau"}]
        print(f"\nTAC before training against the judge after training ({m} candidates, chance {1 / m:.3f}; "
              f"{args.resamples} draws of D preferences per row)")
        print_table(["stored preferences", "D", "TAC's top is the judge's top", "Kendall tau, TAC vs judge"], table)
        results.append({"name": "pool sizes", "value": {k: len(v) for k, v in pools.items()}, "unit": "pairs"})
    print(f"wrote {write_results(__file__, results)}")


if __name__ == "__main__":
    main()
