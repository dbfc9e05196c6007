"""Noisy judges against the noiseless one, and random against active pair selection.

Usage: python experiments/judge_agreement.py [--drivers 16] [--slots 3] [--repeats 10] [--budget 0.5]
                                            [--round 10] [--every 2]

The agents are the built-in AI driving the ego car at varied skill and aggression (the
loop's bootstrap stage, run here with `--drivers` races cut into `--slots` clips each),
so they differ for real. The pool is every pair of clips of two drivers at the same clip
slot. The truth is the Bradley-Terry ranking of the noiseless scripted judge on the whole
pool.

1. Agreement (rate and Cohen's kappa over the pool) of B-Pref's noisy teachers with the
   noiseless one: stochastic (beta 1), mistaken (10%), myopic (0.9), equal (within 0.25
   points), skipping (both below the median score), and all of them at once.
2. Ranking accuracy (Kendall tau of the Bradley-Terry scores against the truth) as labels
   from the mistaken teacher grow, picking pairs at random or actively: in rounds of 10
   by the expected information of a label under the clip model (what the loop does,
   `jaxrace.judges.pairs.choose_informative`: each clip's strength is its driver's plus
   its own deviation, labels have a 10% lapse rate; the prior picks the first round);
   or 10 random pairs, then rounds of 10 whose outcome is least certain under the
   drivers' Bradley-Terry fit (`choose_active`); and two variants: that score times the
   two strengths' variances, and divided by one plus the times the two drivers were
   compared; Thompson sampling: the pair of drivers adjacent in a ranking drawn from the
   fit's posterior; and expected information:
   a greedy batch maximising p(1-p) Var(s_a - s_b) under the fit's Laplace posterior, each
   pick's information added before the next; expected ranking error: the same greedy
   batch maximising the drop of the expected number of discordant pairs; and two
   ceilings that choose with the truth's scores in place of the fit's), over `--repeats`
   seeds. Every method is ranked by the drivers' Bradley-Terry fit of its labels,
   measured every `--every` labels (a round's picks are in the order chosen, so any
   prefix is what a smaller budget would have judged). The target: active selection
   reaches random selection's accuracy at the label budget (`--budget` of the pool)
   with at most 60% of those labels; the labels needed come with a 90% interval from
   resampling the seeds.

Prints tables and writes results/judge_agreement.json.
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

from jaxrace.design.config import load_config
from jaxrace.design.loop import Loop
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir
from jaxrace.judges import Pair, ScriptedJudge, TaskScoring, cohen_kappa
from jaxrace.judges.pairs import choose_active, choose_informative, greedy_information, pair_information
from jaxrace.rewards.bradley_terry import fit_labels


def make_clips(drivers: int, slots: int, folder: Path):
    config = load_config("quick", bootstrap_races=drivers, clips_per_race=slots, tac_min_preferences=0)
    loop = Loop(config, RunDir.open(folder, config), Display(quiet=True))
    loop.stage("bootstrap", loop.bootstrap)
    rows = [r for r in loop.store.clips() if r.iteration == 0]
    clips = loop.store.load_clips(rows)
    names = sorted({r.candidate for r in rows})
    agent = np.array([names.index(r.candidate) for r in rows])
    slot = np.array([int(r.key.rsplit("slot", 1)[1]) for r in rows])
    one = [jax.tree.map(lambda x, i=i: np.asarray(x[i]), clips) for i in range(len(rows))]
    return config.task, names, agent, slot, one


def labels(judge, pool, clips, tag: str) -> list[str]:
    return [judge.judge(Pair(f"{tag}/{a}~{b}", clips[a], clips[b])).label for a, b in pool]


def fit(pool_agents, labs, idx, k) -> tuple[np.ndarray, np.ndarray]:
    idx = np.asarray(idx, np.int64)
    s, se = fit_labels(pool_agents[idx, 0], pool_agents[idx, 1], [labs[i] for i in idx], k)
    return np.asarray(s, np.float64), np.asarray(se, np.float64)


def choose_thompson(items: np.ndarray, scores: np.ndarray, stderr: np.ndarray, k: int, rng: np.random.Generator,
                    compared: np.ndarray | None = None) -> np.ndarray:
    """Indices of k candidate comparisons (rows of items, i64[P, 2]) by Thompson sampling of the ranking.

    For each pick, strengths are drawn from the fit's approximate posterior N(scores, stderr^2)
    and the comparison of two items adjacent in the drawn ranking is taken (the closest in
    rank when no adjacent pair is left), preferring the pair of items compared least so far
    (`compared`: f[K, K] counts, symmetric). Neighbours whose order is in doubt are drawn
    adjacent often; a settled order rarely, so the labels go where they change the ranking.
    """
    items = np.asarray(items, np.int64)
    if k < 1 or len(items) == 0:
        return np.zeros((0,), np.int64)
    scores, stderr = np.asarray(scores, np.float64), np.asarray(stderr, np.float64)
    counts = np.zeros((len(scores), len(scores))) if compared is None else np.array(compared, np.float64)
    free = np.ones(len(items), bool)
    picked = []
    for _ in range(min(k, len(items))):
        draw = scores + stderr * rng.standard_normal(len(scores))
        rank = np.empty(len(scores), np.int64)
        rank[np.argsort(-draw)] = np.arange(len(scores))
        gap = np.abs(rank[items[:, 0]] - rank[items[:, 1]]).astype(np.float64)
        seen = counts[items[:, 0], items[:, 1]]
        order = np.lexsort((rng.random(len(items)), seen, gap + np.where(free, 0.0, np.inf)))
        best = int(order[0])
        picked.append(best)
        free[best] = False
        a, b = items[best]
        counts[a, b] += 1.0
        counts[b, a] += 1.0
    return np.asarray(picked, np.int64)


def choose_information(items: np.ndarray, scores: np.ndarray, games: np.ndarray, k: int,
                       rng: np.random.Generator, prior: float = 1.0) -> np.ndarray:
    """Indices of k candidate comparisons (rows of items, i64[P, 2]) of the most expected information.

    The fit's Laplace posterior (the Bradley-Terry Hessian over `games`, f[K, K] counts, with
    the prior's pseudo-games) gives Var(s_a - s_b); a comparison's information is
    log(1 + p (1 - p) Var). Picks are greedy, each adding its Fisher information to the
    posterior (a rank-one update) before the next, so a batch spreads over the drivers.
    """
    items = np.asarray(items, np.int64)
    if k < 1 or len(items) == 0:
        return np.zeros((0,), np.int64)
    scores = np.asarray(scores, np.float64)
    sig = 1.0 / (1.0 + np.exp(-(scores[:, None] - scores[None, :])))
    info = games * sig * (1.0 - sig)
    ref = 1.0 / (1.0 + np.exp(-scores))
    cov = np.linalg.inv(np.diag(info.sum(axis=1) + 2.0 * prior * ref * (1.0 - ref)) - info)
    return greedy_information(cov, items[:, 0], items[:, 1], sig[items[:, 0], items[:, 1]]
                              * (1.0 - sig[items[:, 0], items[:, 1]]), k, rng)


def choose_ranking(items: np.ndarray, scores: np.ndarray, games: np.ndarray, k: int,
                   rng: np.random.Generator, prior: float = 1.0) -> np.ndarray:
    """Indices of k candidate comparisons (rows of items, i64[P, 2]) that most reduce the expected ranking error.

    Under the fit's Laplace posterior the two items k, l are in the wrong order with
    probability Phi(-|s_k - s_l| / sd(s_k - s_l)); summed over all pairs, the expected
    number of discordant pairs (what Kendall tau counts). A comparison of a and b adds
    p (1 - p) of Fisher information along e_a - e_b, which shrinks every sd(s_k - s_l)
    (a rank-one update). The score is the drop of that sum with the means held fixed,
    so pairs that look tied (|s_k - s_l| near 0: one more noisy label will not settle
    them) and pairs already settled both score low. Picks are greedy, each updating
    the covariance before the next.
    """
    from scipy.special import ndtr

    items = np.asarray(items, np.int64)
    if k < 1 or len(items) == 0:
        return np.zeros((0,), np.int64)
    scores = np.asarray(scores, np.float64)
    n = len(scores)
    sig = 1.0 / (1.0 + np.exp(-(scores[:, None] - scores[None, :])))
    ref = 1.0 / (1.0 + np.exp(-scores))
    cov = np.linalg.inv(np.diag((games * sig * (1.0 - sig)).sum(axis=1) + 2.0 * prior * ref * (1.0 - ref))
                        - games * sig * (1.0 - sig))
    kk, ll = np.triu_indices(n, 1)
    gap = np.abs(scores[kk] - scores[ll])
    a, b = items[:, 0], items[:, 1]
    weight = sig[a, b] * (1.0 - sig[a, b])
    taken = np.zeros(len(items), bool)
    tie_break = 1e-12 * rng.random(len(items))
    picked = []
    for _ in range(min(k, len(items))):
        var = np.maximum(cov[kk, kk] + cov[ll, ll] - 2.0 * cov[kk, ll], 1e-12)
        g = cov[:, a] - cov[:, b]  # C u for every candidate, [K, P]
        q = g[a, np.arange(len(a))] - g[b, np.arange(len(a))]  # u^T C u
        shrink = weight[None, :] * (g[kk] - g[ll]) ** 2 / (1.0 + weight * q)[None, :]
        after = np.maximum(var[:, None] - shrink, 1e-12)
        gain = (ndtr(-gap / np.sqrt(var))[:, None] - ndtr(-gap[:, None] / np.sqrt(after))).sum(axis=0) + tie_break
        best = int(np.argmax(np.where(taken, -np.inf, gain)))
        picked.append(best)
        taken[best] = True
        cu = g[:, best]
        cov = cov - np.outer(cu, cu) * weight[best] / (1.0 + weight[best] * q[best])
    return np.asarray(picked, np.int64)


CLIPS = "clip information (the loop's)"


def pick(method: str, pool_agents, chosen, left, scores, stderr, n: int, rng, labs, pool_clips=None,
         agent=None) -> np.ndarray:
    """The next n of `left` by `method`: the library's score, or it weighted as variants to compare with."""
    if method == CLIPS:
        return choose_informative(pool_clips[left], agent, pool_clips[chosen], [labs[i] for i in chosen], n, rng)
    if method.startswith("oracle"):  # a ceiling: the choice made with the true scores in place of the fit's
        method = "ranking error" if "ranking" in method else "active, / (1 + repeats)"
    if method in ("information", "ranking error"):
        games = np.zeros((len(scores), len(scores)))
        judged = [i for i in chosen if labs[i] != "skip"]
        np.add.at(games, (pool_agents[judged, 0], pool_agents[judged, 1]), 1.0)
        choose = choose_information if method == "information" else choose_ranking
        return choose(pool_agents[left], scores, games + games.T, n, rng)
    if method == "active":
        return choose_active(pool_agents[left], scores, n, rng)
    if method == "thompson":
        compared = np.zeros((len(scores), len(scores)))
        np.add.at(compared, (pool_agents[chosen, 0], pool_agents[chosen, 1]), 1.0)
        compared = compared + compared.T
        return choose_thompson(pool_agents[left], scores, stderr, n, rng, compared)
    a, b = pool_agents[left, 0], pool_agents[left, 1]
    info = pair_information(scores, a, b)
    if method == "active, x stderr^2":
        info = info * (stderr[a] ** 2 + stderr[b] ** 2)
    else:
        compared = np.zeros((len(scores), len(scores)))
        np.add.at(compared, (pool_agents[chosen, 0], pool_agents[chosen, 1]), 1.0)
        info = info / (1.0 + compared[a, b] + compared[b, a])
    return np.lexsort((rng.random(len(left)), -info))[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drivers", type=int, default=16)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget", type=float, default=0.5, help="the label budget, as a share of the pool")
    parser.add_argument("--round", type=int, default=10, help="pairs chosen per round of active selection")
    parser.add_argument("--every", type=int, default=2, help="labels between two measures of the ranking")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        task, names, agent, slot, clips = make_clips(args.drivers, args.slots, Path(tmp))
    k = len(names)
    pool = [(a, b) for a, b in itertools.combinations(range(len(clips)), 2) if slot[a] == slot[b]
            and agent[a] != agent[b]]
    pool_agents = np.array([(agent[a], agent[b]) for a, b in pool])
    pool_clips = np.array(pool, np.int64)
    scoring = TaskScoring.from_task(task)
    oracle = ScriptedJudge(scoring=scoring)
    truth_labels = labels(oracle, pool, clips, "truth")
    truth, _ = fit(pool_agents, truth_labels, range(len(pool)), k)
    median = float(np.median([oracle.score(c) for c in clips]))
    median_myopic = float(np.median([ScriptedJudge(scoring=scoring, myopic=0.9).score(c) for c in clips]))
    print(f"{len(clips)} clips of {k} drivers, a pool of {len(pool)} pairs; task {task!r}")

    teachers = {
        "stochastic (beta 1)": ScriptedJudge(scoring=scoring, beta=1.0, seed=1),
        "mistaken (10%)": ScriptedJudge(scoring=scoring, mistake=0.1, seed=1),
        "myopic (0.9)": ScriptedJudge(scoring=scoring, myopic=0.9, seed=1),
        "equal (within 0.25 points)": ScriptedJudge(scoring=scoring, equal_within=0.25, seed=1),
        "skipping (below the median)": ScriptedJudge(scoring=scoring, skip_below=median, seed=1),
        "all of them": ScriptedJudge(scoring=scoring, beta=1.0, mistake=0.1, myopic=0.9, equal_within=0.25,
                                     skip_below=median_myopic, seed=1),
    }
    rows, table = [], []
    for name, judge in teachers.items():
        labs = labels(judge, pool, clips, "agree")
        both = [(t, x) for t, x in zip(truth_labels, labs, strict=True) if "skip" not in (t, x)]
        rate = float(np.mean([t == x for t, x in both]))
        kappa = cohen_kappa([t for t, _ in both], [x for _, x in both])
        table.append([name, len(both), f"{rate:.3f}", f"{kappa:.3f}"])
        rows += [{"name": f"agreement with the noiseless judge: {name}", "value": round(rate, 4), "unit": "rate",
                  "shared": len(both)},
                 {"name": f"kappa with the noiseless judge: {name}", "value": round(kappa, 4), "unit": "kappa"}]
    print_table(["teacher", "pairs both labelled", "agreement", "Cohen's kappa"], table)

    budget = int(round(args.budget * len(pool)))
    steps = sorted(set(range(args.every, budget + 1, args.every)) | {budget})
    methods = ("random", CLIPS, "active", "active, x stderr^2", "active, / (1 + repeats)", "thompson",
               "information", "ranking error", "oracle, closest", "oracle, ranking error")
    taus = {m: np.zeros((args.repeats, len(steps))) for m in methods}
    for rep in range(args.repeats):
        teacher = ScriptedJudge(scoring=scoring, mistake=0.1, seed=100 + rep)
        labs = labels(teacher, pool, clips, f"rep{rep}")
        order = np.random.default_rng(rep).permutation(len(pool))
        for j, n in enumerate(steps):
            s, _ = fit(pool_agents, labs, order[:n], k)
            taus["random"][rep, j] = kendalltau(s, truth).statistic
        for method in methods[1:]:
            rng = np.random.default_rng([rep, methods.index(method)])
            if method == CLIPS:  # the clip model's prior picks the first round: no random start
                chosen = [int(i) for i in choose_informative(pool_clips, agent, pool_clips[:0], [], args.round, rng)]
            else:
                chosen = [int(i) for i in order[:args.round]]
            for j, n in enumerate(steps):
                while n > len(chosen):  # the next round, chosen with everything judged so far
                    s, se = fit(pool_agents, labs, chosen, k)
                    left = np.setdiff1d(np.arange(len(pool)), chosen)
                    more = min(args.round, budget - len(chosen))
                    chosen += [int(i) for i in left[pick(method, pool_agents, chosen, left,
                                                         truth if method.startswith("oracle") else s, se,
                                                         more, rng, labs, pool_clips, agent)]]
                s, _ = fit(pool_agents, labs, chosen[:n], k)
                taus[method][rep, j] = kendalltau(s, truth).statistic
    mean = {m: t.mean(axis=0) for m, t in taus.items()}
    target = mean["random"][-1]
    table = [[n, *(f"{mean[m][j]:.3f}" for m in methods)] for j, n in enumerate(steps)
             if n % 20 == 0 or n == steps[-1]]
    print_table(["labels", *(f"Kendall tau, {m}" for m in methods)], table)
    for j, n in enumerate(steps):
        rows += [{"name": f"Kendall tau at {n} labels, {m}", "value": round(float(mean[m][j]), 4), "unit": "tau"}
                 for m in methods if n % 10 == 0 or n == budget]
    resample = np.random.default_rng(0).integers(0, args.repeats, (1000, args.repeats))

    def needed(curve: np.ndarray, goal: float) -> float:
        return next((n for n, t in zip(steps, curve, strict=True) if t >= goal), np.inf)

    for m in methods[1:]:
        reached = needed(mean[m], target)
        share = None if reached == np.inf else reached / budget
        draws = [needed(taus[m][r].mean(axis=0), taus["random"][r, -1].mean()) for r in resample]
        draws = np.sort(draws)  # "never" (inf) sorts last
        low, high = draws[int(0.05 * len(draws))] / budget, draws[int(0.95 * len(draws)) - 1] / budget
        print(f"random selection reaches tau {target:.3f} with {budget} labels; {m} "
              + ("never does within the budget" if share is None else
                 f"with {reached} ({100 * share:.0f}%; 90% interval {100 * low:.0f}-{100 * high:.0f}%, inf: never)"))
        rows.append({"name": f"labels {m} needs for random's accuracy at the budget, share of the budget",
                     "value": None if share is None else round(share, 3), "unit": "share", "budget": budget,
                     "interval_90": [None if not np.isfinite(q) else round(q, 3) for q in (low, high)],
                     "pool": len(pool), "drivers": k, "repeats": args.repeats, "round": args.round,
                     "every": args.every})
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
