"""The report's tokens per stage come from the run's LLM record (generator and judge); its notes on training."""

import dataclasses
import json

from jaxrace.design.config import load_config
from jaxrace.design.report import _tokens_by_stage, _training_notes
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
