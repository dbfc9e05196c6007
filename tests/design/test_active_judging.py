"""The loop's active pair selection: exactly the budget, deterministic, resumable, spread over candidates."""

import itertools

import jax
import numpy as np

from jaxrace.design.config import load_config
from jaxrace.design.loop import Loop
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir
from jaxrace.rewards import synthetic
from jaxrace.rewards.clips import Clip
from jaxrace.rewards.preferences import save_clip_arrays

CANDIDATES, SLOTS, T = 5, 3, 6


def store_clips(loop, folder):
    """Clips whose ego car covers 10 + 5 * candidate metres per step: a clear true order."""
    n = CANDIDATES * SLOTS
    view = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (n, T + 1)).copy(), synthetic.view())
    speed = 10.0 + 5.0 * np.repeat(np.arange(CANDIDATES), SLOTS).astype(np.float32)
    view = view.replace(progress=speed[:, None] * np.arange(T + 1, dtype=np.float32)[None, :])
    action = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (n, T)).copy(), synthetic.action())
    path = save_clip_arrays(folder / "clips.npz", Clip(views=view, actions=action, valid=np.ones((n, T), bool)))
    ids = {}
    for c, s in itertools.product(range(CANDIDATES), range(SLOTS)):
        ids[(c, s)] = loop.store.add_clip(f"c{c}/slot{s}", iteration=1, candidate=f"c{c}", seed=0, race=0, start=0,
                                          length=T, metrics={}, arrays=path, arrays_row=c * SLOTS + s)
    return ids


def test_active_selection_spends_the_budget_once_and_resumes_alike(tmp_path):
    config = load_config("quick", judge_selection="active", judge_budget=10, bootstrap_races=0)
    run = RunDir.open(tmp_path / "run", config)
    loop = Loop(config, run, Display(quiet=True))
    ids = store_clips(loop, tmp_path / "run")
    pairs = [(f"iter1/slot{s}/c{a}~c{b}", ids[(a, s)], ids[(b, s)])
             for s in range(SLOTS) for a, b in itertools.combinations(range(CANDIDATES), 2)]
    runs = [{"candidate": f"c{c}", "seed": 0, "failed": False} for c in range(CANDIDATES)]
    records = loop._judge_active(1, pairs, "iter1", runs, np.random.default_rng(7))
    assert len(records) == 10 == len({r["key"] for r in records}) == len(loop.store.preferences(1))
    assert {r["key"] for r in records} <= {p[0] for p in pairs}
    # the faster candidate always wins (a noiseless judge), and the labels say so
    assert all((r["label"] == "first") == (r["key"].split("/")[-1].split("~")[0] > r["key"].split("~")[1])
               for r in records)
    # the clip model's prior picks the first round (budget // 5 = 2 pairs) on two moments, then the rounds compare
    # mostly neighbours in strength, where the order is most in doubt (4 of the 10 pairs of candidates), and never
    # the slowest with the fastest, whose order the labels settle by transitivity; every candidate and moment is seen
    first_round = [r["key"].split("/")[1] for r in records[:2]]
    assert len(set(first_round)) == 2
    gaps = [abs(int(a[1:]) - int(b[1:])) for a, b in (r["key"].split("/")[-1].split("~") for r in records[2:])]
    assert gaps.count(1) >= 6 and 4 not in gaps
    seen = {n for r in records for n in r["key"].split("/")[-1].split("~")}
    assert seen == {f"c{c}" for c in range(CANDIDATES)}
    assert {r["key"].split("/")[1] for r in records} == {f"slot{s}" for s in range(SLOTS)}
    # a resumed stage makes the same choices and judges nothing twice
    again = Loop(config, RunDir.open(tmp_path / "run", config), Display(quiet=True))
    assert again._judge_active(1, pairs, "iter1", runs, np.random.default_rng(7)) == records
    assert len(again.store.preferences(1)) == 10
