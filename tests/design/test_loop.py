"""The reward-design loop end to end on a tiny config, through the command line, offline.

The config trains as many runs in each iteration as the final job does (3) and races the final
job's selection races once, as the final races: the final job then reuses the iterations'
compiled programs instead of compiling its own, as a user's run whose N is 3 does.

One uninterrupted run is shared by the tests; a second run replays the first one's LLM
record (`--llm replay`), is killed (SIGKILL) in the middle of training and in the middle of
racing, resumed with the same command, and must end with the same results. Runs share a
JAX compilation cache, so later compiles are quick.
"""

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

TINY = """
iterations = 2
m = 4
n = 3
epochs = 20
chunk_epochs = 10
final_epochs = 20
warmup_epochs = 2
replay_size = 4000
hidden = 32
num_envs = 8
opponents = 2
eval_races = 1
final_races = 1
select_races = 1
clip_seconds = 5.0
clips_per_race = 2
bootstrap_races = 4
tac_min_preferences = 5
warm_start = true
pretrain_epochs = 10
start_hold_epochs = 3
start_hold_final = false
"""
ITERATION = ("generate", "select", "train", "race", "judge", "rank")
STAGES = (["bootstrap", "pretrain/train"] + [f"iter{k}/{s}" for k in (1, 2) for s in ITERATION]
          + ["final/train", "final/race", "final/trial", "report"])
RUN_TIMEOUT_S = 600


def command(config, run_dir, *extra):
    return [sys.executable, "-m", "jaxrace.cli", "design", "--config", str(config), "--run-dir", str(run_dir),
            "--quiet", *extra]


@pytest.fixture(scope="module")
def finished(setup):
    root, config, env = setup
    run = root / "uninterrupted"
    out = subprocess.run(command(config, run), env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith(f"report: {run / 'report.html'}")
    return run


def test_every_stage_writes_its_files(finished):
    run = finished
    assert list(json.loads((run / "stages.json").read_text())) == STAGES
    for k in (1, 2):
        d = run / f"iter{k}"
        candidates = json.loads((d / "candidates.json").read_text())
        assert len(candidates) == 4
        for c in candidates:
            assert (d / "candidates" / f"{c['name']}.py").read_text().startswith('"""Offline proposal')
            assert (d / "candidates" / f"{c['name']}.jaxreward").stat().st_size > 0
        selected = json.loads((d / "select.json").read_text())
        assert len(selected["selected"]) == 3 and selected["labelled_preferences"] >= 5
        assert set(selected["tac"]) == {c["name"] for c in candidates}  # TAC ran: the bootstrap filled the store
        curves = json.loads((d / "train" / "curves.json").read_text())
        assert len(curves["runs"]) == 3 and len(curves["progress"][0]) == 20
        assert (d / "train" / "agents" / "20").is_dir() and not (d / "train" / "job.ckpt").exists()
        rank = json.loads((d / "rank.json").read_text())
        assert rank["best"] in selected["selected"] and len(rank["scores"]) == 3
        feedback = (d / "feedback.txt").read_text()
        assert feedback.startswith(f"Iteration {k}: 3 candidates were trained and raced")
        assert f"### The best program: {rank['best']}\n```python\n" in feedback
        attempts = json.loads((d / "attempts.json").read_text())
        assert [a["stage"] for a in attempts["attempts"]] == ["ok"] * (4 if k == 1 else 3)
        assert attempts["stopped"] is None and attempts["tokens"] > 0
        videos = list((d / "videos").iterdir())
        assert len(videos) == 3 and all(v.stat().st_size > 1000 for v in videos)
    # Iteration 2 carries iteration 1's best over and mutates it.
    best = json.loads((run / "iter1" / "rank.json").read_text())["best"]
    carried = json.loads((run / "iter2" / "candidates.json").read_text())[0]
    assert carried["name"] == best and carried["origin"] == "carried from iteration 1"
    # Pretraining: one run of the library reward; iteration 1 and the final job start from its agent.
    pretrained = json.loads((run / "pretrain" / "train" / "curves.json").read_text())
    assert pretrained["runs"] == [{"candidate": "progress", "seed": 0, "failed": False}]
    assert len(pretrained["progress"][0]) == 10 and (run / "pretrain" / "train" / "agents" / "10").is_dir()
    curves1 = json.loads((run / "iter1" / "train" / "curves.json").read_text())
    pretrained_alpha = pretrained["alpha"][0][-1]
    log = (run / "log.txt").read_text()
    # the iterations' runs hold the actor 3 epochs; the final job's do not (start_hold_final = false)
    for stage, hold in (("iter1", 3), ("final", 0)):
        runs = json.loads((run / stage / "train" / "curves.json").read_text())
        start = json.loads((run / stage / "train" / "start.json").read_text())
        assert start == {"pretrained": "progress", "runs": [0] * 3, "alpha": [pretrained_alpha] * 3,
                         "actor_hold_epochs": hold}, stage
        for r in range(3):  # the temperature is the pretrained one through the warm-up (2) and the hold
            assert runs["alpha"][r][:2 + hold] == pytest.approx([pretrained_alpha] * (2 + hold), rel=1e-5)
            assert runs["alpha"][r][2 + hold] != pytest.approx(pretrained_alpha, rel=1e-5)
        (line,) = [x for x in log.splitlines() if f"{stage}/train: from the agents pretrained on progress" in x]
        assert line.endswith("; the actor held for 3 epochs" if hold else ")"), line
    report = (run / "report.html").read_text()
    assert report.count("trained on from the agent pretrained on progress") == 2  # iteration 1, final
    assert report.count("For its first 3 epochs after the warm-up the actor and temperature were held") == 2  # 1, 2
    # Iteration 2 trains on from iteration 1's best agent (warm_start), not from the pretrained one.
    curves2 = json.loads((run / "iter2" / "train" / "curves.json").read_text())
    (parent,) = [r for r, x in enumerate(curves1["runs"]) if x["candidate"] == best]
    start = json.loads((run / "iter2" / "train" / "start.json").read_text())
    last_alpha = curves1["alpha"][parent][-1]
    assert start == {"iteration": 1, "candidate": best, "runs": [parent] * 3, "alpha": [last_alpha] * 3,
                     "actor_hold_epochs": 3}
    for r in range(3):  # the warm-up and the hold update no temperature: it is the parent's last
        assert curves2["alpha"][r][:5] == pytest.approx([last_alpha] * 5, rel=1e-5)
    assert f"iter2/train: warm start from iter1's best, {best}" in (run / "log.txt").read_text()
    assert f"trained on from the agent of iteration 1's best, {best} (warm start" in (run / "report.html").read_text()
    # Every request and reply is recorded; iteration 2's prompts hold iteration 1's feedback, and the
    # offline proposer mutates the best programs it finds there.
    record = [json.loads(line) for line in (run / "llm" / "record.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in record] == ["iter1/generate"] * 4 + ["iter2/generate"] * 3
    iter1_feedback = (run / "iter1" / "feedback.txt").read_text()
    assert all(iter1_feedback in r["request"]["messages"][1]["content"] for r in record[4:])
    assert sum("a mutation of" in r["reply"]["text"] for r in record[4:]) == 1
    final = json.loads((run / "final" / "race" / "metrics.json").read_text())
    winner = json.loads((run / "iter2" / "rank.json").read_text())["best"]
    assert [r["candidate"] for r in final["runs"]] == [winner, "progress", "gt_sophy"]
    assert final["reference_lap"] > 0 and len(list((run / "final" / "videos").iterdir())) == 3
    # Each final run keeps its best checkpoint, judged after each of the 2 chunks by its task score.
    kept = json.loads((run / "final" / "train" / "kept.json").read_text())
    assert [j["epoch"] for j in kept["judged"]] == [10, 20] and len(kept["judged"][0]["task_score"]) == 3
    for r, epoch in enumerate(kept["epoch"]):  # the first judgement with the highest task score
        best = max(kept["judged"], key=lambda j, r=r: j["task_score"][r])
        assert epoch == best["epoch"] and kept["task_score"][r] == best["task_score"][r]
    assert kept["averaged_policies"] == 1 and "each run's policy raced" in (run / "report.html").read_text()
    assert "Kept: " in (run / "report.html").read_text()
    # Each final agent's time trial: alone for two laps, its best lap (if it completed one) against the reference.
    trial = json.loads((run / "final" / "trial.json").read_text())
    assert trial["runs"] == final["runs"] and trial["reference_lap"] == final["reference_lap"]
    for t in trial["trials"]:
        assert isinstance(t["course_outs"], int) and t["course_outs"] >= 0
        assert (t["best_lap"] is None) == (t["lap_gap_percent"] is None)
        if t["best_lap"] is not None:
            assert t["lap_gap_percent"] == pytest.approx(100 * (t["best_lap"] / trial["reference_lap"] - 1))
    assert "time trial: best lap, course-outs" in (run / "report.html").read_text()
    # Where each final agent's incidents began: as many as counted, and a map of them in the report.
    for per_run in final["races"]:
        for m in per_run:
            kinds = [i["kind"] for i in m["incidents"]]
            assert (kinds.count("at_fault"), kinds.count("course_out"), kinds.count("wall")) == (
                m["collisions_at_fault"], m["course_outs"], m["wall_hits"])
    track = json.loads((run / "final" / "race" / "track.json").read_text())
    assert 100 <= len(track["xy"]) <= 500 and track["width"] > 5
    page = (run / "report.html").read_text()
    assert page.count("<polygon points=") == 3 and "Where the incidents began" in page


def test_the_store_holds_every_clip_and_verdict(finished):
    db = sqlite3.connect(finished / "preferences.sqlite")
    # Bootstrap: 4 races x 2 clip slots; each iteration: 3 runs x 1 race x 2 slots.
    assert db.execute("SELECT iteration, COUNT(*) FROM clips GROUP BY iteration").fetchall() == [(0, 8), (1, 6), (2, 6)]
    # Bootstrap: C(4, 2) pairs x 2 slots; each iteration: C(3, 2) pairs x 1 race x 2 slots.
    assert db.execute("SELECT iteration, COUNT(*) FROM preferences GROUP BY iteration").fetchall() == \
        [(0, 12), (1, 6), (2, 6)]
    assert {r[0] for r in db.execute("SELECT judge_kind FROM preferences")} == {"scripted"}
    assert db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 2


def test_the_second_clip_of_a_race_is_its_finish(finished):
    import numpy as np

    from jaxrace.rewards.preferences import PreferenceStore

    store = PreferenceStore(finished / "preferences.sqlite")
    after = 20  # clip_finish_after_s 2.0 at 0.1 s per step
    for k in (1, 2):
        rows = [r for r in store.clips() if r.iteration == k]
        finish = [r for r in rows if r.key.endswith("/slot1")]
        assert len(finish) == 3 and len({r.start for r in finish}) == 1  # one window for every run of the race
        crossed = np.asarray(store.load_clips(finish).views.finished, bool)  # [runs, T + 1]
        if crossed.any():  # the window ends `after` steps past the first run's finish
            assert int(np.argmax(crossed.any(axis=0))) == finish[0].length - after
        else:  # nobody finished: the race's last window, after every other clip
            assert finish[0].start > max(r.start for r in rows if not r.key.endswith("/slot1"))
    store.close()


def test_the_report_has_every_section_and_rebuilds(setup, finished):
    _, _, env = setup
    text = (finished / "report.html").read_text()
    for section in ("Bootstrap preferences", "Pretraining", "Iteration 1", "Iteration 2", "Bradley-Terry strengths",
                    "The best agent", "Judged pairs", "Sources", "diff against the previous best",
                    "Final agent against the library rewards", "Time and tokens per stage", "<video src="):
        assert section in text, section
    assert "4 races of the built-in AI driving the ego car with varied skill and aggression, 2 of them blind" in text
    (finished / "report.html").unlink()
    out = subprocess.run([sys.executable, "-m", "jaxrace.cli", "report", str(finished)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (finished / "report.html").read_text() == text


def test_another_config_on_the_same_directory_is_refused(setup, finished):
    _, config, env = setup
    before = (finished / "stages.json").read_text()
    out = subprocess.run(command(config, finished, "--iterations", "3"), env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "different config (iterations: 2 -> 3)" in out.stderr
    assert (finished / "stages.json").read_text() == before


REUSE_ITERATION_2 = """
import json, shutil, sys
import jax
import numpy as np
from jaxrace.design.config import load_config
from jaxrace.design.loop import Loop
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir

path, config = sys.argv[1], sys.argv[2]
for stale in ("train", "race", "videos"):
    shutil.rmtree(f"{path}/iter2/{stale}")
loop = Loop(load_config("quick", config, reuse_carried_agent=True), RunDir(path), Display(quiet=True))
loop.last_iteration = 2
for stage in (loop.select, loop.train, loop.race, loop.judge_pairs, loop.rank):
    stage(2)
trainer = loop._trainer(2, loop._bank("iter1/candidates", [loop._best(1)[0]]))
sums = {}
for k in (1, 2):
    runs = len(json.load(open(f"{path}/iter{k}/train/curves.json"))["runs"])
    actor = loop._actors(k, trainer, runs)
    sums[k] = [sum(float(np.abs(np.asarray(x[r], np.float64)).sum()) for x in jax.tree.leaves(actor))
               for r in range(runs)]
print(json.dumps(sums))
"""


def test_a_carried_best_races_again_with_its_saved_agent_when_reuse_is_on(setup, finished, tmp_path):
    """reuse_carried_agent on a copy of the finished run, iteration 2 again: the carried best is not
    trained again but races with iteration 1's agent, beside N=3 new candidates that train."""
    import shutil

    _, config, env = setup
    run = tmp_path / "reuse"
    shutil.copytree(finished, run)
    out = subprocess.run([sys.executable, "-c", REUSE_ITERATION_2, str(run), str(config)], env=env,
                         capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    best = json.loads((run / "iter1" / "rank.json").read_text())["best"]
    names = [c["name"] for c in json.loads((run / "iter2" / "candidates.json").read_text())]
    select = json.loads((run / "iter2" / "select.json").read_text())
    assert select["selected"] == names and len(names) == 4  # the carried best and the 3 that train
    assert select["reason"].endswith(f"; {best} races with its agent from iteration 1")
    before = json.loads((run / "iter1" / "train" / "curves.json").read_text())
    curves = json.loads((run / "iter2" / "train" / "curves.json").read_text())
    assert [r["candidate"] for r in curves["runs"]] == names[1:] + [best]
    assert curves["runs"][-1] == {"candidate": best, "seed": 0, "failed": False, "reused_from": 1}
    (r1,) = [r for r, x in enumerate(before["runs"]) if x["candidate"] == best]
    assert curves["progress"][-1] == before["progress"][r1] and curves["alpha"][-1] == before["alpha"][r1]
    assert curves["progress"][0] != before["progress"][r1]  # the others trained
    # Its saved actor is iteration 1's (the sum of its absolute weights, per run); the others are new.
    sums = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(sums["1"]) == 3 and len(sums["2"]) == 4 and sums["2"][3] == sums["1"][r1]
    assert not set(sums["2"][:3]) & set(sums["1"])
    metrics = json.loads((run / "iter2" / "race" / "metrics.json").read_text())
    assert [r["candidate"] for r in metrics["runs"]] == names[1:] + [best] and len(metrics["races"]) == 4
    assert len(json.loads((run / "iter2" / "judge.json").read_text())) == 6 * 2  # C(4, 2) pairs x 2 slots
    assert len(json.loads((run / "iter2" / "rank.json").read_text())["scores"]) == 4
    assert f"iter2/train: {best} races with its agent from iteration 1" in (run / "log.txt").read_text()


def test_two_finalists_train_in_the_final_job_and_the_judge_picks_the_loops_agent(setup, finished, tmp_path):
    """A copy of the finished run with its final job removed and `final_candidates = 2` in its config (the
    same search, another final job): the final job trains iteration 2's best two beside a library reward (one:
    3 runs, as the iterations', so no new compile), the judge compares the two on each final race and clip
    slot, and Bradley-Terry's first is the loop's agent."""
    from jaxrace.design.loop import loop_agent

    root, _, env = setup
    run = tmp_path / "finalists"
    out = another_final_job(finished, run, root / "finalists.toml", env,
                            {"final_candidates": 2, "final_baselines": ["gt_sophy"]})
    assert out.returncode == 0, out.stderr[-3000:]
    assert list(json.loads((run / "stages.json").read_text()))[-5:] == [
        "final/train", "final/race", "final/judge", "final/trial", "report"]
    assert json.loads((run / "config.json").read_text())["final_candidates"] == 2
    rank = json.loads((run / "iter2" / "rank.json").read_text())
    finalists = [rank["best"], next(n for n in rank["order"] if n != rank["best"] and not rank["failed"][n])]
    metrics = json.loads((run / "final" / "race" / "metrics.json").read_text())
    assert [r["candidate"] for r in metrics["runs"]] == finalists + ["gt_sophy"]
    for name in finalists:
        assert (run / "final" / "candidates" / f"{name}.py").read_text() == (
            run / "iter2" / "candidates" / f"{name}.py").read_text()
    # one pair per final race (1) and clip slot (2), each the two finalists' clips of that race and slot
    judged = json.loads((run / "final" / "judge.json").read_text())
    assert sorted(j["key"].rsplit("/", 1)[0] for j in judged) == ["final/seed0/race0/slot0", "final/seed0/race0/slot1"]
    with sqlite3.connect(run / "preferences.sqlite") as db:
        clips = db.execute("SELECT id, candidate, race, iteration FROM clips WHERE key LIKE 'final/%'").fetchall()
        prefs = db.execute("SELECT key, label FROM preferences WHERE iteration = 3").fetchall()
    assert sorted((c[1], c[2], c[3]) for c in clips) == sorted([(n, 0, 3) for n in finalists] * 2)
    assert sorted(prefs) == sorted((j["key"], j["label"]) for j in judged)
    owner = {c[0]: c[1] for c in clips}
    assert all({owner[j["first"]], owner[j["second"]]} == set(finalists) for j in judged)
    pick = json.loads((run / "final" / "pick.json").read_text())
    assert pick["finalists"] == finalists and pick["games"] == sum(j["label"] != "skip" for j in judged)
    wins = {n: sum((j["label"] == "first") == (owner[j["first"]] == n) for j in judged if j["label"] in ("first",
                                                                                                        "second"))
            for n in finalists}
    if wins[finalists[0]] != wins[finalists[1]]:  # Bradley-Terry's first is the finalist that won more games
        assert pick["pick"] == max(wins, key=wins.get)
    assert pick["order"][0] == pick["pick"] and loop_agent(run) == pick["pick"]
    assert pick["scores"][finalists.index(pick["pick"])] >= max(pick["scores"])
    assert f"final/judge: the judge picked {pick['pick']} from the finalists" in (run / "log.txt").read_text()
    trial = json.loads((run / "final" / "trial.json").read_text())
    assert [r["candidate"] for r in trial["runs"]] == finalists + ["gt_sophy"]
    page = (run / "report.html").read_text()
    assert "The judge compared the 2 finalists on each of their 1 final races" in page
    assert f"The loop's agent is <b>{pick['pick']}</b>" in page
    final_section = page[page.index('<h2 id="final">'):]
    final_section = final_section[:final_section.index("<h2", 4)]
    assert final_section.count('<tr class="best">') == 1
    assert f'<tr class="best"><td>{pick["pick"]}</td>' in final_section
    assert loop_agent(finished) == json.loads((finished / "iter2" / "rank.json").read_text())["best"]
    assert pick["pairs"] == len(judged)
    # Before the judge has picked (a report rebuilt mid-run), no finalist is called the loop's agent.
    from jaxrace.design.report import build_report
    from jaxrace.design.rundir import RunDir

    (run / "final" / "pick.json").rename(run / "final" / "pick.json.later")
    assert loop_agent(run) is None
    early = build_report(RunDir(run))
    early = early[early.index('<h2 id="final">'):]
    assert "The judge has not yet picked the loop's agent." in early
    assert '<tr class="best">' not in early[:early.index("<h2", 4)]


def another_final_job(finished: Path, run: Path, config: Path, env: dict, fields: dict):
    """Copies the finished run to `run` without its final job, with `fields` in its config (the same
    search, another final job), and runs `jaxrace design` there; returns the completed process."""
    import shutil

    shutil.copytree(finished, run)
    shutil.rmtree(run / "final")
    stages = json.loads((run / "stages.json").read_text())
    search = {k: v for k, v in stages.items() if k.startswith(("bootstrap", "pretrain", "iter"))}
    (run / "stages.json").write_text(json.dumps(search))
    stored = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps(stored | fields))
    config.write_text(TINY + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items()))
    return subprocess.run(command(config, run), env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def test_each_reward_of_the_final_job_trains_several_draws_and_its_agent_is_the_best_on_the_selection_races(
        setup, finished, tmp_path):
    """`final_seeds = 3` with no library reward (3 runs, as the iterations'): the loop's best trains three
    draws on keys of their own; its agent is the draw whose kept checkpoint scored best on the selection
    races; only that draw's video is rendered and the report marks it in a table of the draws."""
    from jaxrace.design.loop import final_agents, loop_agent

    root, _, env = setup
    run = tmp_path / "draws"
    out = another_final_job(finished, run, root / "draws.toml", env, {"final_seeds": 3, "final_baselines": []})
    assert out.returncode == 0, out.stderr[-3000:]
    assert list(json.loads((run / "stages.json").read_text()))[-4:] == [
        "final/train", "final/race", "final/trial", "report"]
    best = json.loads((run / "iter2" / "rank.json").read_text())["best"]
    curves = json.loads((run / "final" / "train" / "curves.json").read_text())
    assert [(r["candidate"], r["seed"]) for r in curves["runs"]] == [(best, 0), (best, 1), (best, 2)]
    rewards = np.asarray(curves["reward"], np.float64)  # (a diverged run's "nan" strings too)
    assert rewards.shape[0] == 3 and not np.allclose(rewards[0], rewards[1])  # keys of their own
    assert json.loads((run / "final" / "train" / "start.json").read_text())["runs"] == [0, 0, 0]  # all pretrained
    scores = [float(x) for x in json.loads((run / "final" / "train" / "kept.json").read_text())["task_score"]]
    ok = [i for i, r in enumerate(curves["runs"]) if not r["failed"]] or [0, 1, 2]
    picked = max(ok, key=lambda i: (scores[i], -i))
    assert final_agents(run) == {best: picked} and loop_agent(run) == best
    assert [p.stem for p in (run / "final" / "videos").iterdir()] == [f"{best}-race0-slot0"]  # one: its agent's
    trial = json.loads((run / "final" / "trial.json").read_text())
    assert len(trial["trials"]) == 3
    page = (run / "report.html").read_text()
    section = page[page.index('<h2 id="final">'):]
    section = section[:section.index("<h2", 4)]
    draws = section[section.index("<h3>Training draws</h3>"):]
    draws = draws[:draws.index("</table>")]
    assert draws.count("<tr") == 4 and draws.count('<tr class="best">') == 1  # header and the three draws
    assert f'<tr class="best"><td>{best}</td><td class="num">{picked}</td>' in draws
    from jaxrace.design.report import _trial_cell

    mine = section[section.index(f'<tr class="best"><td>{best}</td>'):]
    assert _trial_cell(trial, picked) in mine[:mine.index("</tr>")]  # the agent's row is its picked draw's


def test_picked_draws_takes_each_rewards_best_selection_score_among_the_draws_that_trained():
    from jaxrace.design.loop import picked_draws

    runs = [{"candidate": "a", "failed": False}, {"candidate": "a", "failed": False},
            {"candidate": "b", "failed": True}, {"candidate": "b", "failed": False},
            {"candidate": "c", "failed": True}, {"candidate": "c", "failed": True}]
    assert picked_draws(runs, [1.0, 2.0, 5.0, -1.0, 3.0, 4.0]) == {"a": 1, "b": 3, "c": 5}
    assert picked_draws(runs, [2.0, 2.0, 0.0, 0.0, 0.0, 0.0]) == {"a": 0, "b": 3, "c": 4}  # a tie: the first
    assert picked_draws(runs, [float("-inf")] * 6) == {"a": 0, "b": 3, "c": 4}  # never judged
    assert picked_draws(runs, None) == {"a": 0, "b": 3, "c": 4}


def wait_for_line(log: Path, text: str, proc, timeout_s: float = RUN_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before logging {text!r}")
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in {log} after {timeout_s} s")


def log_seconds(text: str, line: str) -> float:
    """The time stamp of the first log line that contains `line`, in seconds since the epoch."""
    stamp = next(row for row in text.splitlines() if line in row)[:19]
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def test_replayed_killed_twice_the_same_command_resumes_and_ends_the_same(setup, finished):
    root, config, env = setup
    run = root / "killed"
    log = run / "log.txt"
    replay = ("--llm", "replay", "--replay-from", str(finished))
    for marker, unfinished in (("iter1/train: epoch 10/20", "iter1/train"), ("iter2/race: started", "iter2/race")):
        proc = subprocess.Popen(command(config, run, *replay), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        wait_for_line(log, marker, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert unfinished not in json.loads((run / "stages.json").read_text())
        if unfinished == "iter1/train":  # the report of a stopped run shows the stage it stopped in
            out = subprocess.run([sys.executable, "-m", "jaxrace.cli", "report", str(run)], env=env,
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr[-3000:]
            page = (run / "report.html").read_text()
            assert "iter1/train (unfinished: 1 attempt, last seen" in page
            assert "selected; training not finished" in page and ">trained<" not in page
    assert (run / "iter1" / "train" / "job.ckpt").exists() is False  # iter1 trained to the end on resume
    out = subprocess.run(command(config, run, *replay), env=env, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    text = log.read_text()
    # No finished stage was redone; training resumed from its checkpoint (epoch 10 logged once).
    assert text.count("iter1/generate: started") == 1 and text.count("iter1/train: started") == 2
    assert text.count("iter1/train: epoch 10/20") == 1 and text.count("iter2/race: started") == 2
    assert text.count("iter2/train: started") == 1
    # A stage's time adds its killed attempt's, counted up to the last line that attempt logged.
    stages = json.loads((run / "stages.json").read_text())
    assert {name for name, info in stages.items() if info["attempts"] > 1} == {"iter1/train", "iter2/race"}
    assert stages["iter1/train"]["attempts"] == stages["iter2/race"]["attempts"] == 2
    killed = log_seconds(text, "iter1/train: epoch 10/20") - log_seconds(text, "iter1/train: started")
    earlier = stages["iter1/train"]["seconds"] - stages["iter1/train"]["last_attempt_seconds"]
    assert abs(earlier - killed) <= 1.5, (earlier, killed)  # the log's stamps are to the second
    assert json.loads((run / "running.json").read_text()) == {}
    assert "iter1/train (2 attempts)" in (run / "report.html").read_text()
    for rel in ("iter1/rank.json", "iter2/rank.json", "iter2/select.json", "final/race/metrics.json",
                "iter2/race/components.json", "iter1/attempts.json", "iter2/attempts.json", "iter2/feedback.txt"):
        assert (run / rel).read_text() == (finished / rel).read_text(), rel
    # the same requests and replies (appended in the order concurrent requests finished)
    record = sorted((run / "llm" / "record.jsonl").read_text().splitlines())
    assert record == sorted((finished / "llm" / "record.jsonl").read_text().splitlines())
    db = sqlite3.connect(run / "preferences.sqlite")
    assert db.execute("SELECT COUNT(*) FROM preferences").fetchone()[0] == 24  # nothing judged twice
