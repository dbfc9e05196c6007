"""A run that starts from a library reward (`start_reward`): iteration 1 races it beside new candidates."""

from jaxrace.design.config import load_config
from jaxrace.design.loop import Loop
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir
from jaxrace.rewards import load_reward
from jaxrace.rewards.proposer import LIBRARY_FORMS, parse_proposal


def test_iteration_one_races_the_start_reward_and_the_offline_proposer_mutates_it(tmp_path):
    config = load_config("quick", bootstrap_races=0, m=5, n=2, start_reward="gt_sophy")
    run = RunDir.open(tmp_path / "run", config)
    loop = Loop(config, run, Display(quiet=True))
    loop.generate(1)
    candidates = run.read_json("iter1/candidates.json")
    assert [c["name"] for c in candidates] == [f"i1-c{i}" for i in range(1, 6)]
    start = candidates[0]
    assert start["origin"].startswith("carried from the start: the library's gt_sophy")
    assert start["params"] == load_reward(run.file("iter1/candidates/i1-c1.jaxreward")).params
    assert parse_proposal(run.file("iter1/candidates/i1-c1.py").read_text()).weights == LIBRARY_FORMS["gt_sophy"]
    # the offline proposer read it from the prompt as the program to improve on: some of the four are its
    # mutants (gt_sophy's terms, jittered), the rest fresh
    written = [parse_proposal(run.file(f"iter1/candidates/{c['name']}.py").read_text()) for c in candidates[1:]]
    mutants = [p for p in written if set(LIBRARY_FORMS["gt_sophy"]) - {"slip", "wall", "off_course", "closing"}
               <= set(p.terms) and p.weights != LIBRARY_FORMS["gt_sophy"]]
    assert 1 <= len(mutants) < 4
    loop.select(1)  # carried like a previous best: trained whatever TAC says
    assert run.read_json("iter1/select.json")["selected"][0] == "i1-c1"


def test_when_the_carried_programs_fill_m_the_llm_is_not_asked(tmp_path):
    config = load_config("quick", bootstrap_races=0, m=1, n=1, start_reward="gt_sophy")
    run = RunDir.open(tmp_path / "run", config)
    Loop(config, run, Display(quiet=True)).generate(1)
    assert [c["name"] for c in run.read_json("iter1/candidates.json")] == ["i1-c1"]
    assert run.read_json("iter1/attempts.json") == {"stopped": None, "tokens": 0, "attempts": []}
