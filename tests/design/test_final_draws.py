"""Each reward's agent among the final job's draws (`final_seeds`), on a final job's files written by hand:
the pick, the report's tables and the headline experiment's rows read the same draw (no training)."""

import importlib
import sys
from pathlib import Path

import pytest

from jaxrace.design.config import load_config
from jaxrace.design.loop import final_agents, loop_agent
from jaxrace.design.report import _final
from jaxrace.design.rundir import RunDir

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def race(position: int, contacts: int, lap: float | None) -> dict:
    return {"best_lap": lap, "finishing_position": position, "positions_gained": 8 - position,
            "collisions_at_fault": contacts, "side_contacts": 0, "course_outs": 0, "wall_hits": 0,
            "finished": lap is not None}


# per run (candidate, seed, failed, kept selection score as kept.json stores it, its two races, its trial lap)
DRAWS = [("i3-c4", 0, False, "12.5", [race(6, 3, 80.0), race(7, 2, 81.0)], 90.0),
         ("i3-c4", 1, False, "30.0", [race(2, 1, 79.0), race(3, 0, 79.5)], 78.0),
         ("i3-c4", 2, True, "nan", [race(8, 0, None), race(8, 0, None)], None),
         ("gt_sophy", 0, False, "-inf", [race(4, 4, 80.0), race(5, 4, 80.5)], 85.0),
         ("gt_sophy", 1, False, "-inf", [race(1, 0, 78.5), race(1, 0, 78.0)], 77.0),
         ("gt_sophy", 2, False, "-inf", [race(8, 9, None), race(8, 9, None)], None)]


@pytest.fixture
def run(tmp_path) -> RunDir:
    config = load_config("quick", final_seeds=3, final_baselines=["gt_sophy"], final_races=2)
    run = RunDir.open(tmp_path / "run", config)
    runs = [{"candidate": c, "seed": s, "failed": f} for c, s, f, *_ in DRAWS]
    run.write_json("final/train/curves.json", {"runs": runs, "epochs": 10, "env_steps_per_epoch": 128,
                                               "progress": [[1.0, 2.0]] * 6, "reward": [[0.1, 0.2]] * 6})
    run.write_json("final/train/kept.json", {"epoch": [10, 5, -1, -1, -1, -1], "task_score": [d[3] for d in DRAWS],
                                             "judged": [], "races": 4, "every_chunks": 1, "averaged_policies": 1})
    run.write_json("final/race/metrics.json", {"runs": runs, "races": [d[4] for d in DRAWS], "reference_lap": 77.6})
    run.write_json("final/trial.json", {"runs": runs, "reference_lap": 77.6, "trials": [
        {"best_lap": d[5], "lap_gap_percent": None, "course_outs": 0} for d in DRAWS]})
    return run


def test_the_best_selection_score_picks_a_rewards_agent_and_a_never_judged_reward_keeps_its_first_draw(run):
    # i3-c4: seed 1 scored best (its failed seed 2 never counts); gt_sophy was never judged: its first draw,
    # though its seed 1 raced best in the final races (they never choose)
    assert final_agents(run.path) == {"i3-c4": 1, "gt_sophy": 3}
    assert loop_agent(run.path) == "i3-c4"


def test_the_report_shows_each_rewards_picked_draw_and_marks_it_among_the_draws(run):
    section = _final(run)
    main = section[:section.index("<h3>Training draws</h3>")]
    # the main table's rows: the picked draws' races (i3-c4 seed 1: median 2.5, 0.5 contacts; gt_sophy
    # seed 0: median 4.5, 4.0 contacts), not every draw's pooled
    assert '<tr class="best"><td>i3-c4</td><td class="num">2.5</td>' in main
    assert "<tr><td>gt_sophy</td><td class=\"num\">4.5</td>" in main
    assert "78.00 s (+0.5%), 0 outs" in main and "85.00 s (+9.5%), 0 outs" in main  # the picked draws' trials
    assert "77.00 s" not in main and "each trained 3 times (its agent the draw below)" in main
    draws = section[section.index("<h3>Training draws</h3>"):]
    draws = draws[:draws.index("</table>")]
    assert draws.count("<tr") == 7 and draws.count('<tr class="best">') == 2
    assert '<tr class="best"><td>i3-c4</td><td class="num">1</td><td>30.00</td>' in draws
    assert '<tr class="best"><td>gt_sophy</td><td class="num">0</td><td>-inf</td>' in draws
    assert draws.count("<td>failed</td>") == 1


def test_the_headline_experiment_reads_the_targets_on_the_loops_picked_draw(run, monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    experiment = importlib.import_module("design_clean_racing")
    try:
        rows, ref = experiment.final_table(run.path)
    finally:
        sys.modules.pop("design_clean_racing", None)
    assert ref == 77.6
    assert [(r["candidate"], r["seed"], r["agent"]) for r in rows] == [
        ("i3-c4", 0, False), ("i3-c4", 1, True), ("i3-c4", 2, False),
        ("gt_sophy", 0, True), ("gt_sophy", 1, False), ("gt_sophy", 2, False)]
    picked = rows[1]
    assert picked["median_position"] == 2.5 and picked["at_fault_contacts_per_race"] == 0.5
    assert picked["selection_score"] == 30.0 and picked["trial_gap"] == pytest.approx(78.0 / 77.6 - 1)
    assert experiment.targets_met(picked) == {name: True for name in experiment.TARGETS}
    assert not any(experiment.targets_met(rows[0]).values())
