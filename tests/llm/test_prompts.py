"""Prompts are pure functions: exact text on fixed inputs, and the size limit."""

import pytest

from jaxrace.llm.prompts import (
    CUT,
    RULES,
    SYSTEM,
    CandidateSummary,
    IterationSummary,
    feedback_text,
    generation_messages,
    repair_messages,
)

RACES = {"median_position": 2.0, "mean_positions_gained": 1.5, "at_fault_contacts_per_race": 0.5,
         "side_contacts_per_race": 1.0, "course_outs_per_race": 0.0, "wall_hits_per_race": 0.0, "finished": 1.0,
         "best_lap": 31.0}
SUMMARY = IterationSummary(2, (
    CandidateSummary("i2-c1", "def reward(prev, action, curr):\n    return 0.0, {}\n", 1.25, 0.5, tac=0.3,
                     races=RACES, rationales=("kept clean",), training={"reward": [0.5, 1.25], "progress": [2.0]},
                     components={"progress": {"min": 0.0, "mean": 0.5, "max": 1.0, "share": 0.7, "constant": False,
                                              "samples": [0.1, 0.5]},
                                 "time": {"min": -0.1, "mean": -0.1, "max": -0.1, "share": 0.3, "constant": True,
                                          "samples": []}}),
    CandidateSummary("i2-c2", "X = 1\n", -1.25, 0.5, failed=True)), reference_lap=30.0, person="less contact please")
RACE_LINE = ("median finishing position 2.0, +1.5 places gained on average, per race 0.5 at-fault contacts (running "
             "into a car ahead), 1.0 side contacts, 0.0 course-outs, 0.0 wall hits; finished 100% of races; best lap "
             "31.00 s (+3.3% against the 30.00 s reference lap)")
HEAD = ("Iteration 2: 2 candidates were trained and raced against the built-in AI. Judges compared clips of their "
        "races; ranking by Bradley-Terry strength (higher is better, +- one standard error):\n"
        f"1. i2-c1: strength +1.25 +- 0.50, TAC +0.30; {RACE_LINE}\n"
        "2. i2-c2: strength -1.25 +- 0.50; FAILED in training (NaN or diverged)\n")
PERSON = "A person watching the races wrote:\nless contact please\n"


def test_generation_prompt_exact_text():
    system, user = generation_messages("win  the race\ncleanly", 1, 3, api="API TEXT\n")
    assert system == {"role": "system", "content": SYSTEM}
    assert user["role"] == "user"
    assert user["content"] == (
        "## The task\nwin the race cleanly\n\n## The reward API\nAPI TEXT\n\n" + RULES + "\n"
        "\n## What to write\nWrite candidate 2 of 3. The candidates are written independently and then compared, so "
        "make this one a distinct idea: choose its own terms, weights and shaping rather than the most obvious "
        "reward.\n")


def test_generation_prompt_holds_the_real_api_text():
    from jaxrace.rewards import api_text

    _, user = generation_messages("t", 0, 1)
    assert api_text().rstrip() in user["content"]


def test_feedback_exact_text():
    assert feedback_text(SUMMARY) == (
        HEAD + "\n### The best program: i2-c1\n```python\ndef reward(prev, action, curr):\n    return 0.0, {}\n```\n"
        f"Races: {RACE_LINE}.\n"
        "During training, at evenly spaced epochs:\n"
        "  its reward per step: 0.5, 1.25\n"
        "  progress in m per step: 2\n"
        "Each component per step over its races:\n"
        "  progress: min 0, mean 0.5, max 1, 70% of the total's magnitude; DOMINATES the total\n"
        "    values over the races: 0.1, 0.5\n"
        "  time: min -0.1, mean -0.1, max -0.1, 30% of the total's magnitude; CONSTANT: it never changes, so it "
        "teaches nothing\n"
        "\n### The worst program (an example of what not to do): i2-c2\n```python\nX = 1\n```\n"
        "Races: no races (training failed).\n"
        "\nWhat the judges said:\n- on i2-c1: kept clean\n"
        "\n" + PERSON)


def test_feedback_drops_the_least_useful_parts_first():
    small = feedback_text(SUMMARY, max_chars=700)
    assert small == HEAD + "\n" + PERSON  # programs and rationales went, ranking and the person's words stayed
    tiny = feedback_text(SUMMARY, max_chars=200)
    assert len(tiny) <= 200 and tiny.endswith(CUT)


def test_feedback_in_the_generation_prompt_is_cut_but_the_api_never():
    long = "x" * 50_000
    _, user = generation_messages("t", 0, 2, feedback=long, api="API " * 100, max_chars=6000)
    assert len(SYSTEM) + len(user["content"]) <= 6000
    assert ("API " * 100).rstrip() in user["content"] and CUT in user["content"]
    assert "Improve on the last iteration" in user["content"]
    with pytest.raises(ValueError, match="the API text is never cut"):
        generation_messages("t", 0, 2, api="API " * 3000, max_chars=6000)


def test_repair_exact_text():
    base = generation_messages("t", 0, 1, api="A")
    out = repair_messages(base, "reply text", "trace error (line 2): bad", "a = 1\nb = 2\n", 2)
    assert out[:2] == base
    assert out[2] == {"role": "assistant", "content": "reply text"}
    assert out[3] == {"role": "user", "content": (
        "Your program was rejected: trace error (line 2): bad\n\n"
        "The program, numbered, the failing line marked with >:\n```\n   1  a = 1\n>  2  b = 2\n```\n\n"
        "Fix it and reply with the whole corrected program in one ```python fenced block.")}
    no_source = repair_messages(base, "r", "the reply holds no program")
    assert no_source[3]["content"] == ("Your program was rejected: the reply holds no program\n\n"
                                       "Fix it and reply with the whole corrected program in one ```python fenced "
                                       "block.")
