"""The report's tokens per stage come from the run's LLM record (generator and judge); its notes on training;
its clips as video or, where ffmpeg failed and a GIF was written, as an image."""

import dataclasses
import json

from jaxrace.design.config import load_config
from jaxrace.design.report import _kept_note, _tokens_by_stage, _training_notes, _videos
from jaxrace.design.rundir import RunDir


def test_tokens_are_summed_per_stage_from_the_record(tmp_path):
    run = RunDir.open(tmp_path / "run", load_config("quick"))
    entries = [
        {"stage": "iter1/generate", "reply": {"prompt_tokens": 100, "completion_tokens": 20}},
        {"stage": "iter1/generate", "reply": {"prompt_tokens": 50, "completion_tokens": 5, "estimated": True}},
        {"stage": "bootstrap/judge", "reply": {"prompt_tokens": 7, "completion_tokens": 3}},
        {"stage": "iter1/judge", "reply": {"prompt_tokens": 1, "completion_tokens": None}},
    ]
    lines = [json.dumps(e) for e in entries] + ['{"stage": "iter2/gen']  # the torn line of a killed run
    run.write_text("llm/record.jsonl", "\n".join(lines))
    assert _tokens_by_stage(run) == {"iter1/generate": (175, True), "bootstrap": (10, False),
                                     "iter1/judge": (1, False)}
    assert _tokens_by_stage(RunDir.open(tmp_path / "empty", load_config("quick"))) == {}


def test_the_final_section_says_when_agents_are_averaged_or_risk_averse():
    quick = load_config("quick")
    assert _training_notes(quick) == ""  # neither: nothing to say
    notes = _training_notes(dataclasses.replace(quick, actor_average=3e-4, actor_cvar=0.5))
    assert "policy averaging: 0.0003 of the way" in notes and "the lowest 50% of its critic's return" in notes
    assert "averaging" not in _training_notes(dataclasses.replace(quick, actor_cvar=0.25))


def test_the_report_says_whether_the_final_job_kept_policies_or_weight_averages():
    runs = [{"candidate": "i2-c1", "seed": 0}, {"candidate": "gt_sophy", "seed": 0}]
    kept = {"epoch": [400, 800], "every_chunks": 4, "races": 8}  # a run directory from before averaging
    plain = _kept_note(kept, runs)
    assert "every 4 chunk(s) of training each run's policy raced 8 times" in plain
    assert "Kept: i2-c1 (seed 0): epoch 400, gt_sophy (seed 0): epoch 800." in plain
    averaged = _kept_note({**kept, "averaged_policies": 5}, runs)
    assert "the mean of the parameters of each run's last 5 judged policies (weight averaging) raced 8" in averaged
    assert _kept_note({**kept, "averaged_policies": 1}, runs) == plain


def test_a_gif_clip_is_shown_as_an_image_and_an_mp4_as_a_video():
    html = _videos([("final/videos/a-race0-slot0.mp4", "a <mp4>"), ("final/videos/b-race0-slot0.GIF", "b")])
    assert html.count("<figure>") == 2
    assert '<video src="final/videos/a-race0-slot0.mp4" controls' in html and "a &lt;mp4&gt;" in html
    assert '<img src="final/videos/b-race0-slot0.GIF" alt="b"' in html and html.count("<video") == 1
    assert _videos([]) == ""
