import dataclasses
import json

import jax
import pytest

from jaxrace.design import PRESETS, ConfigMismatch, DesignConfig, RunDir, load_config
from jaxrace.design.rundir import atomic_write_json


def test_presets_are_valid_and_differ_where_the_issue_says():
    assert PRESETS["quick"].actor_input == "state" and PRESETS["quick"].llm == "offline"
    paper = PRESETS["paper"]
    assert (paper.m, paper.n, paper.iterations, paper.final_epochs) == (10, 5, 4, 1500)
    assert paper.actor_input == "pixels" and paper.recurrent
    standard = PRESETS["standard"]
    assert standard.track == "gp"
    # the headline runs' settings: a gt_sophy-pretrained start, whole races judged, the hold in the search only
    assert (standard.pretrain_reward, standard.pretrain_epochs, standard.start_hold_epochs) == ("gt_sophy", 2000, 200)
    assert standard.clip_whole_race and standard.clips_per_race == 1 and not standard.start_hold_final
    assert standard.final_seeds == 1 and PRESETS["quick"].pretrain_epochs == 0
    # the final job keeps the best weight average of 5 policies (issue 16), the quick one each policy
    assert PRESETS["standard"].keep_best_average == 5 and PRESETS["quick"].keep_best_average == 1
    assert {p.preset for p in PRESETS.values()} == set(PRESETS)


def test_toml_then_options_override_the_preset(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('preset = "standard"\nm = 8\nclip_seconds = 12\ntask = "stay on track"\n')
    config = load_config("quick", path, n=2, task=None)
    assert config.preset == "standard" and config.m == 8 and config.n == 2
    assert config.clip_seconds == 12.0 and isinstance(config.clip_seconds, float)
    assert config.task == "stay on track" and config.track == "gp"  # the rest from the standard preset


@pytest.mark.parametrize("text, message", [
    ("mm = 3\n", "unknown config keys \\['mm'\\]"),
    ("m = 'four'\n", "m must be a int"),
    ("m = 2\nn = 3\n", "n \\(trained per iteration, 3\\) cannot exceed m"),
    ("n = 2\nfinal_candidates = 3\n", "final_candidates \\(3\\) cannot exceed n \\(trained per iteration, 2\\)"),
    ("final_candidates = 0\n", "final_candidates must be at least 1 \\(got 0\\)"),
    ("final_seeds = 0\n", "final_seeds must be at least 1 \\(got 0\\)"),
    ("final_seeds = 2\nkeep_best_every = 0\n", "final_seeds \\(2\\) picks each reward's draw by the final job's "
                                               "selection races: keep_best_every \\(0\\) must be at least 1"),
    ("final_seeds = 2\nkeep_best_every = 7\n", "keep_best_every \\(7\\) must be at least 1 and at most the final "
                                               "job's chunks \\(6\\)"),
    ("final_baselines = ['progress', 'speed']\n", "final_baselines must name distinct library rewards, of "
                                                  "gt_sophy, progress \\(got \\['progress', 'speed'\\]\\)"),
    ("final_baselines = ['progress', 'progress']\n", "final_baselines must name distinct library rewards"),
    ("final_baselines = 'progress'\n", "final_baselines must be a tuple, got 'progress'"),
    ("epochs = 70\n", "chunk_epochs \\(50\\) must divide epochs \\(70\\)"),
    ("llm = 'gpt'\n", "llm must be one of"),
    ("m = [\n", "cannot read the config"),
    ('preset = "huge"\n', "unknown preset 'huge'"),
    ("corner_start_prob = 1.5\n", "corner_start_prob must be in \\[0, 1\\] \\(got 1.5\\)"),
    ("offtrack_start_prob = -0.1\n", "offtrack_start_prob must be in \\[0, 1\\] \\(got -0.1\\)"),
    ("actor_average = 1.0\n", "actor_average must be in \\[0, 1\\) \\(0: no averaging; got 1.0\\)"),
    ("keep_best_average = 0\n", "keep_best_average must be at least 1 \\(got 0\\)"),
    ("actor_cvar = 0.0\n", "actor_cvar must be in \\(0, 1\\] \\(1: risk-neutral; got 0.0\\)"),
    ("corner_start_prob = 0.5\ntraffic_start_gap = 0.0\n", "corner_start_prob needs traffic_start_gap > 0"),
    ("pretrain_reward = 'speed'\n", "pretrain_reward must be a library reward, one of gt_sophy, progress "
                                     "\\(got 'speed'\\)"),
    ("start_reward = 'sophy'\n", "start_reward must be '' or a library reward, one of gt_sophy, progress "
                                  "\\(got 'sophy'\\)"),
    ("pretrain_epochs = 75\n", "chunk_epochs \\(50\\) must divide pretrain_epochs \\(75\\)"),
    ("pretrain_epochs = -50\n", "pretrain_epochs must be at least 0 \\(got -50\\)"),
    ("start_hold_epochs = -1\n", "start_hold_epochs must be at least 0 \\(got -1\\)"),
])
def test_bad_configs_are_refused_with_the_field_named(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config("quick", path)


def test_final_baselines_read_from_toml_as_a_tuple_and_resume_from_the_stored_list(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("final_baselines = ['gt_sophy']\nfinal_seeds = 2\n")
    config = load_config("quick", path)
    assert config.final_baselines == ("gt_sophy",) and config.final_seeds == 2
    assert load_config("quick", None, final_baselines=[]).final_baselines == ()
    run = RunDir.open(tmp_path / "run", config)
    assert json.loads(run.file("config.json").read_text())["final_baselines"] == ["gt_sophy"]
    assert RunDir.open(tmp_path / "run", config).config() == config  # JSON's list is the same config
    with pytest.raises(ConfigMismatch, match=r"final_baselines: \('gt_sophy',\) -> \('progress', 'gt_sophy'\)"):
        RunDir.open(tmp_path / "run", dataclasses.replace(config, final_baselines=("progress", "gt_sophy")))


def test_a_run_made_before_final_draws_resumes_with_one_draw_and_both_library_rewards(tmp_path):
    quick = PRESETS["quick"]
    run = RunDir.open(tmp_path / "run", quick)
    stored = json.loads(run.file("config.json").read_text())
    del stored["final_seeds"], stored["final_baselines"]
    run.file("config.json").write_text(json.dumps(stored))
    assert RunDir.open(tmp_path / "run", quick).config() == quick
    assert json.loads(run.file("config.json").read_text())["final_baselines"] == ["progress", "gt_sophy"]
    # a paper run (seeds 2) trained every reward's final job twice before the field: it resumes so
    paper = PRESETS["paper"]
    assert paper.seeds == paper.final_seeds == 2
    older = RunDir.open(tmp_path / "paper", dataclasses.replace(paper, seeds=3, final_seeds=3))
    stored = json.loads(older.file("config.json").read_text())
    del stored["final_seeds"]
    older.file("config.json").write_text(json.dumps(stored))
    assert older.config(fill_from=paper).final_seeds == 3


def test_a_run_directory_refuses_another_config_and_foreign_folders(tmp_path):
    config = DesignConfig()
    run = RunDir.open(tmp_path / "run", config)
    assert RunDir.open(tmp_path / "run", config).config() == config  # the same config resumes
    with pytest.raises(ConfigMismatch, match="iterations: 2 -> 3"):
        RunDir.open(tmp_path / "run", dataclasses.replace(config, iterations=3))
    # where the human judge's page listens is not part of the result: a resume may move it (and keeps it)
    moved = dataclasses.replace(config, judge_port=8777, judge_host="0.0.0.0", judge_timeout_s=60.0)
    assert RunDir.open(tmp_path / "run", moved).config() == moved
    with pytest.raises(ConfigMismatch, match=r"config \(seed: 0 -> 1\);"):
        RunDir.open(tmp_path / "run", dataclasses.replace(config, seed=1))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigMismatch, match="not a jaxrace run directory"):
        RunDir.open(tmp_path / "other", config)
    run.mark_done("bootstrap", 1.5)
    assert run.done("bootstrap") and not run.done("iter1/generate")
    # Standard JSON: an infinite judge beta is written as a string and read back.
    assert json.loads(run.file("config.json").read_text())["judge_beta"] == "inf"
    atomic_write_json(tmp_path / "x.json", {"a": float("nan")})
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_run_made_before_a_config_field_existed_resumes_with_the_commands_value(tmp_path):
    standard = PRESETS["standard"]
    run = RunDir.open(tmp_path / "run", standard)
    stored = json.loads(run.file("config.json").read_text())
    del stored["tune_weights"]  # as written before weight tuning existed
    run.file("config.json").write_text(json.dumps(stored))
    assert RunDir.open(tmp_path / "run", standard).config() == standard
    assert json.loads(run.file("config.json").read_text())["tune_weights"] == "grad"
    assert "config fields added since this run began, taken from this command: {'tune_weights': 'grad'}" in (
        run.file("log.txt").read_text())
    with pytest.raises(ConfigMismatch, match="tune_weights: 'grad' -> ''"):  # once stored, it is the run's
        RunDir.open(tmp_path / "run", dataclasses.replace(standard, tune_weights=""))


def test_a_run_made_before_a_default_changed_keeps_the_value_it_ran_with(tmp_path):
    quick = PRESETS["quick"]
    # the defaults since issue 16's headway runs; runs before the fields existed ran without them
    assert quick.lane_headway and quick.offtrack_start_prob == 0.25
    run = RunDir.open(tmp_path / "run", quick)
    stored = json.loads(run.file("config.json").read_text())
    del stored["lane_headway"], stored["offtrack_start_prob"]  # as written before the fields existed
    run.file("config.json").write_text(json.dumps(stored))
    with pytest.raises(ConfigMismatch, match=r"offtrack_start_prob: 0.0 -> 0.25; lane_headway: False -> True\); "
                                             r"lane_headway's default has changed since: put `lane_headway = false` "
                                             r"in a --config TOML file to resume it; offtrack_start_prob's default has "
                                             r"changed since: put `offtrack_start_prob = 0.0` in"):
        RunDir.open(tmp_path / "run", quick)
    assert json.loads(run.file("config.json").read_text())["lane_headway"] is False
    (tmp_path / "resume.toml").write_text("lane_headway = false\nofftrack_start_prob = 0.0\n")
    resumed = load_config("quick", tmp_path / "resume.toml")
    assert resumed == dataclasses.replace(quick, lane_headway=False, offtrack_start_prob=0.0)
    assert RunDir.open(tmp_path / "run", resumed).config() == resumed


def test_a_standard_run_made_before_weight_averaging_resumes_keeping_each_policy(tmp_path):
    """Its final job's checkpoints hold no averaged policies: it resumes with keep_best_average 1."""
    standard = PRESETS["standard"]
    run = RunDir.open(tmp_path / "run", standard)
    stored = json.loads(run.file("config.json").read_text())
    del stored["keep_best_average"]
    run.file("config.json").write_text(json.dumps(stored))
    with pytest.raises(ConfigMismatch, match=r"keep_best_average: 1 -> 5\); keep_best_average's default has changed "
                                             r"since: put `keep_best_average = 1` in a --config TOML file"):
        RunDir.open(tmp_path / "run", standard)
    resumed = dataclasses.replace(standard, keep_best_average=1)
    assert RunDir.open(tmp_path / "run", resumed).config() == resumed


def test_the_actors_view_of_other_cars_reaches_training_and_races_alike():
    from jaxrace.design.loop import Envs

    for accel, headway in ((False, False), (True, False), (False, True)):
        envs = Envs.make(dataclasses.replace(PRESETS["quick"], opponent_accel=accel, lane_headway=headway))
        size = 4 * 30 + (6 if accel else 5) * envs.train_env.static.num_slots + (2 if headway else 0)
        assert envs.train_env.observation_shapes()["privileged"] == (size,)
        assert envs.race_env.observation_shapes() == envs.train_env.observation_shapes()


def test_the_training_jobs_take_every_training_field_of_the_design_config():
    from jaxrace.design.loop import train_config

    fields = dict(num_envs=8, rollout_steps=4, updates_per_epoch=3, batch_size=64, replay_size=1000, n_step=2,
                  warmup_epochs=3, epochs=100, actor_average=0.01, actor_cvar=0.5)
    c = dataclasses.replace(load_config("paper"), hidden=32, chunk_epochs=50, final_epochs=200, **fields)
    t = train_config(c, host_updates=True, sequential_runs=True)
    assert {k: getattr(t, k) for k in fields} == fields
    assert (t.network.hidden, t.network.recurrent, t.network.actor_input, t.host_updates, t.sequential_runs) == (
        32, True, "pixels", True, True)
    assert not train_config(c).sequential_runs


def test_the_pixel_actor_trains_its_runs_one_after_another(monkeypatch):
    from jaxrace.design.loop import backend_options

    assert jax.default_backend() == "cpu" and jax.device_count() == 1
    paper, standard = load_config("paper"), load_config("standard")
    assert backend_options(paper) == {"host_updates": True, "sequential_runs": True}
    assert backend_options(standard) == {"host_updates": False, "sequential_runs": False}
    # What the same call decides on a GPU, where vmapped runs' convolutions took 11.5x as long.
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert backend_options(paper) == {"host_updates": False, "sequential_runs": True}
    assert backend_options(standard) == {"host_updates": False, "sequential_runs": False}
