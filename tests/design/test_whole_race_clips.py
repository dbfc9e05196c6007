"""`clip_whole_race`: each race is one clip from the grid to the race's end, and the judge compares whole races."""

import dataclasses
import itertools

import jax
import numpy as np
import pytest

from jaxrace.design.config import load_config
from jaxrace.design.loop import Loop
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir
from jaxrace.judges import clip_facts


def test_whole_race_clips_need_one_clip_per_race():
    with pytest.raises(ValueError, match="clip_whole_race makes each race one clip: clips_per_race must be 1"):
        load_config("quick", clip_whole_race=True)  # the quick preset cuts 2 clips per race
    assert load_config("quick", clip_whole_race=True, clips_per_race=1).clip_whole_race


def test_the_bootstrap_judges_whole_races(tmp_path):
    config = load_config("quick", clip_whole_race=True, clips_per_race=1, bootstrap_races=3, opponents=2)
    loop = Loop(config, RunDir.open(tmp_path / "run", config), Display(quiet=True))
    e = loop.envs
    assert e.clip_steps == e.race_steps and e.clip_seconds == pytest.approx(e.race_steps * e.race_env.static.dt)
    assert load_config("quick").clip_seconds == 10.0 and Loop(load_config("quick"), RunDir.open(
        tmp_path / "parts", load_config("quick")), Display(quiet=True)).envs.clip_steps == 100

    loop.bootstrap()
    clips = loop.store.clips()
    assert [(c.start, c.length, c.race) for c in clips] == [(0, e.race_steps, 0)] * 3
    arrays = loop.store.load_clips(clips)
    assert arrays.valid.shape == (3, e.race_steps) and arrays.views.progress.shape == (3, e.race_steps + 1)
    # every clip starts on the grid and runs to the race's end: the finish line (steps after it are padding), or
    # the last step for a slow car that does not get there
    finished = np.asarray(arrays.views.finished)
    ends = [int(np.argmax(f)) if f.any() else e.race_steps for f in finished]
    assert not finished[:, 0].any() and finished[:, -1].any()
    assert [int(v.sum()) for v in np.asarray(arrays.valid)] == ends
    # the places a car gained are the race's: its grid slot (last) less where it finished
    ranks = np.asarray(arrays.views.rank)
    for i, clip in enumerate(clips):
        one = jax.tree.map(lambda x, i=i: x[i], arrays)
        assert clip.metrics == dataclasses.asdict(clip_facts(one))
        assert clip.metrics["positions_gained"] == ranks[i, 0] - ranks[i, ends[i]] and ranks[i, 0] == 3
    # three races, one slot: three pairs, each judged on the whole race's score (a noiseless judge)
    judge = loop.judge()
    prefs = loop.store.preferences(0)
    assert len(prefs) == 3
    scores = {c.id: judge.score(jax.tree.map(lambda x, i=i: x[i], arrays)) for i, c in enumerate(clips)}
    assert {(p.first, p.second) for p in prefs} == set(itertools.combinations([c.id for c in clips], 2))
    for p in prefs:
        gap = scores[p.first] - scores[p.second]
        assert p.label == ("tie" if abs(gap) <= config.judge_equal_within else "first" if gap > 0 else "second")


def test_a_run_made_before_whole_race_clips_resumes_only_with_the_clips_it_stored(tmp_path):
    import json

    from jaxrace.design.rundir import ConfigMismatch

    quick = load_config("quick")
    run = RunDir.open(tmp_path / "run", quick)
    stored = json.loads(run.file("config.json").read_text())
    del stored["clip_whole_race"]  # as written before the field existed: its clips are 10-second ones
    run.file("config.json").write_text(json.dumps(stored))
    whole = load_config("quick", clip_whole_race=True, clips_per_race=1)
    with pytest.raises(ConfigMismatch, match=r"clips_per_race: 2 -> 1; clip_whole_race: False -> True\); rerun") as e:
        RunDir.open(tmp_path / "run", whole)
    assert "default has changed" not in str(e.value)  # it has not: no hint to put it in a TOML file
    assert RunDir.open(tmp_path / "run", quick).config() == quick


def test_a_blind_ai_ego_runs_into_cars_in_the_bootstrap_and_a_seeing_one_does_not(tmp_path):
    """`bootstrap_careless`: that share of the bootstrap's races has the AI ego blind to traffic, so the
    store holds at-fault contacts for TAC and weight tuning to price; the seeing AI causes none."""
    with pytest.raises(ValueError, match=r"bootstrap_careless is a share of the bootstrap races, in \[0, 1\] "
                                         r"\(got 1.5\)"):
        load_config("quick", bootstrap_careless=1.5)
    config = load_config("quick", clip_whole_race=True, clips_per_race=1, bootstrap_races=6, bootstrap_careless=0.5,
                         track="gp", opponents=7)
    loop = Loop(config, RunDir.open(tmp_path / "run", config), Display(quiet=True))
    loop.bootstrap()
    races = loop.run.read_json("bootstrap/races.json")
    assert sum(races["blind"]) == 3 and len(races["blind"]) == 6
    clips = loop.store.clips()
    assert [c.candidate.endswith(", blind)") for c in clips] == races["blind"]
    blind = [c.metrics["at_fault_contacts"] for c, b in zip(clips, races["blind"], strict=True) if b]
    seeing = [c.metrics["at_fault_contacts"] for c, b in zip(clips, races["blind"], strict=True) if not b]
    assert seeing == [0, 0, 0] and min(blind) >= 1, (blind, seeing)
    # a blind ego drives at least about as fast as the field (skill 0.9 here), or it would never reach it
    assert all(s >= 0.85 for s, b in zip(races["skill"], races["blind"], strict=True) if b)
    assert min(races["skill"]) >= 0.6 and max(races["skill"]) <= 1.0
