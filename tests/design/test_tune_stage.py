"""The loop's weight-tuning stage: the best program tuned from the store, carried beside it into the next iteration."""

import jax
import numpy as np
from tuning_data import LINEAR, racing_clips

from jaxrace.design.config import load_config
from jaxrace.design.loop import Loop
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir
from jaxrace.rewards import compile_reward, load_reward
from jaxrace.rewards.clips import Clip
from jaxrace.rewards.preferences import save_clip_arrays


def tuned_in_a_loop(tmp_path, source: str, **task):
    """A loop whose iteration 1's best is `source`, with 80 labelled pairs of racing clips in its store."""
    config = load_config("quick", bootstrap_races=0, tune_weights="grad", m=3, n=3, **task)
    run = RunDir.open(tmp_path / "run", config)
    loop = Loop(config, run, Display(quiet=True))
    run.write_text("iter1/candidates/i1-c2.py", source)
    compile_reward(source, name="i1-c2").save(run.file("iter1/candidates/i1-c2.jaxreward"))
    run.write_json("iter1/rank.json", {"best": "i1-c2", "best_folder": "iter1/candidates"})
    run.write_text("iter1/feedback.txt", "Iteration 1: i1-c2 was best.\n")
    first, second, labels = racing_clips(pairs=80, seed=5)
    arrays = save_clip_arrays(tmp_path / "run" / "clips.npz",
                              Clip(*jax.tree.map(lambda a, b: np.concatenate([a, b]), first, second)))
    ids = [loop.store.add_clip(f"c{i}", iteration=1, candidate="x", seed=0, race=0, start=0, length=8, metrics={},
                               arrays=arrays, arrays_row=i) for i in range(160)]
    for p, label in enumerate(labels):
        loop.store.add_preference(f"p{p}", iteration=1, first=ids[p], second=ids[80 + p],
                                  label="first" if label > 0 else "second", judge_kind="scripted", judge_id="s")
    loop.tune(1)
    return loop, run


def test_the_tuned_best_joins_the_next_iteration_beside_the_best(tmp_path):
    loop, run = tuned_in_a_loop(tmp_path, LINEAR)
    record = run.read_json("iter1/tune.json")
    assert record["limits"] is None  # not the offline proposer's program: only the tuner's own 3x
    assert record["clips"] == 160  # each stored clip evaluated once
    assert record["program"] == "i1-c2-t1" and record["tuned"] and record["method"] == "grad"
    tuned = load_reward(run.file("iter1/tuned/i1-c2-t1.jaxreward"))
    assert tuned.params["w_off"] / tuned.params["w_speed"] > 5  # the truth is 20, the default 1
    assert "PARAMS = {\n    'w_speed': " in run.file("iter1/tuned/i1-c2-t1.py").read_text()

    loop.generate(2)
    candidates = run.read_json("iter2/candidates.json")
    assert [c["name"] for c in candidates][:2] == ["i1-c2", "i1-c2-t1"] and len(candidates) == 3
    assert candidates[1]["origin"].startswith("carried from iteration 1: i1-c2 with weights tuned (grad, tuned on 56")
    assert candidates[1]["params"] == tuned.params
    loop.select(2)  # while the store is small, the carried programs are trained first
    assert run.read_json("iter2/select.json")["selected"][:2] == ["i1-c2", "i1-c2-t1"]


def test_an_offline_proposal_is_tuned_within_the_proposers_limits(tmp_path, monkeypatch):
    """The offline proposer's program for a clean race keeps its rules through the loop's tuning: the
    limits are recorded, and no tuned weight leaves them (a named price never falls, a place's pay never
    rises, a rear-end keeps 1.5-3 s of the pay for progress), whatever the labels pull toward."""
    import jaxrace.rewards.tuning as tuning
    from jaxrace.rewards import propose
    from jaxrace.rewards.proposer import parse_proposal, tuning_bands, tuning_limits

    handed = []
    real_tune = tuning.tune
    monkeypatch.setattr(tuning, "tune", lambda *a, **kw: handed.append((kw.get("limits"), kw.get("bands")))
                        or real_tune(*a, **kw))
    task = "win the race cleanly from the back of the grid"
    proposal = next(p for p in propose(task, 6, jax.random.key(0)) if p.structure in ("sum", "gated"))
    loop, run = tuned_in_a_loop(tmp_path, proposal.source, task=task)
    record = run.read_json("iter1/tune.json")
    limits = tuning_limits(parse_proposal(proposal.source), task)
    assert record["limits"] == {k: list(v) for k, v in limits.items()}
    bands = tuning_bands(parse_proposal(proposal.source))
    assert len(bands) == 1 and record["bands"] == [b.as_dict() for b in bands]
    assert handed == [([limits], [bands])]  # what the tuner was given, not only what the record says
    assert bands[0].least * (1 - 1e-4) <= bands[0].ratio(record["params"]) <= bands[0].most * (1 + 1e-4)
    assert {"w_rear_end", "w_contact", "w_positions"} <= set(limits)
    for name, (least, most) in limits.items():
        w = record["params"][name]
        assert (least is None or w >= least * (1 - 1e-5)) and (most is None or w <= most * (1 + 1e-5)), (name, w)

    # the report's tuning table says what each weight was kept within
    from jaxrace.design.report import _tuned

    html = _tuned(record)
    assert "Tuned within the offline proposer's rules" in html
    least = limits["w_rear_end"][0]
    assert f"<td>w_rear_end</td><td>{least:.4g}</td>" in html and f"at least {least:.4g}" in html
    low, high = limits["w_positions"]  # named by the task (at least the library's 5) and paying a place
    assert f"{low:.4g} to {high:.4g}" in html
    assert "w_rear_end + w_contact kept within 1.5-3 times" in html
