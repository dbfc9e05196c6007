"""Agreement and Cohen's kappa between judges, from a real SQLite store."""

import pytest

from jaxrace.judges.agreement import agreements, cohen_kappa
from jaxrace.rewards.preferences import PreferenceStore


def test_cohen_kappa_exact_values():
    a = ["first", "first", "second", "tie"]
    b = ["first", "second", "second", "tie"]
    assert cohen_kappa(a, b) == pytest.approx(7 / 11)  # p_o 3/4, p_e 5/16
    assert cohen_kappa(a, a) == 1.0
    assert cohen_kappa(["first", "second"], ["second", "first"]) == pytest.approx(-1.0)
    assert cohen_kappa(["tie", "tie"], ["tie", "tie"]) is None and cohen_kappa([], []) is None
    with pytest.raises(ValueError, match="differ in length"):
        cohen_kappa(["first"], [])


def test_agreement_on_shared_pairs_in_either_order(tmp_path):
    store = PreferenceStore(tmp_path / "prefs.sqlite")
    ids = [store.add_clip(f"c{i}", iteration=1, candidate=f"cand{i}", seed=0, race=0, start=0, length=4,
                          metrics={}, arrays=tmp_path / "x.npz", arrays_row=i) for i in range(4)]

    def pref(key, judge, first, second, label):
        store.add_preference(key, iteration=1, first=ids[first], second=ids[second], label=label,
                             judge_kind=judge.split(":")[0], judge_id=judge)

    pref("a1", "scripted:a", 0, 1, "first")
    pref("a2", "scripted:a", 2, 3, "second")
    pref("a3", "scripted:a", 0, 2, "tie")
    pref("a4", "scripted:a", 1, 3, "first")
    pref("b1", "vlm:m", 1, 0, "second")  # the same verdict as a1, clips shown the other way round
    pref("b2", "vlm:m", 2, 3, "first")  # disagrees with a2
    pref("b3", "vlm:m", 0, 2, "skip")  # skips are left out
    pref("c1", "human:ann", 0, 1, "first")
    [ab, ah, bh] = agreements(store.preferences())
    assert (ab.judge_a, ab.judge_b, ab.shared, ab.agreed, ab.rate) == ("human:ann", "scripted:a", 1, 1, 1.0)
    assert (ah.judge_a, ah.judge_b, ah.shared, ah.agreed, ah.rate) == ("human:ann", "vlm:m", 1, 1, 1.0)
    assert (bh.judge_a, bh.judge_b, bh.shared, bh.agreed) == ("scripted:a", "vlm:m", 2, 1)
    assert bh.kappa == pytest.approx(cohen_kappa(["first", "second"], ["first", "first"]))


def test_cli_agreement_and_export(tmp_path, capsys):
    import csv
    import json

    from jaxrace.cli import main

    path = tmp_path / "prefs.sqlite"
    with PreferenceStore(path) as store:
        ids = [store.add_clip(f"c{i}", iteration=1, candidate=f"cand{i}", seed=0, race=0, start=0, length=4,
                              metrics={}, arrays=tmp_path / "x.npz", arrays_row=i) for i in range(2)]
        store.add_preference("a", iteration=1, first=ids[0], second=ids[1], label="first", judge_kind="scripted",
                             judge_id="scripted:x", rationale="went further")
        store.add_preference("b", iteration=1, first=ids[1], second=ids[0], label="second", judge_kind="vlm",
                             judge_id="vlm:m")
        store.add_feedback(1, "ann", "fewer contacts")
    assert main(["judges", "agreement", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 labels from 2 judges (scripted:x 1, vlm:m 1)" in out
    assert out.splitlines()[-1].split() == ["scripted:x", "vlm:m", "1", "1", "1.000", "-"]
    assert main(["judges", "export", str(path), "--out", str(tmp_path / "p.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert [(r["first_candidate"], r["second_candidate"], r["label"]) for r in rows] == [
        ("cand0", "cand1", "first"), ("cand1", "cand0", "second")]
    assert main(["judges", "export", str(path), "--out", str(tmp_path / "p.json")]) == 0
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["feedback"] == [{"iteration": 1, "author": "ann", "text": "fewer contacts"}]
    assert data["preferences"][0]["rationale"] == "went further"
    assert main(["judges", "agreement", str(tmp_path / "none.sqlite")]) == 2
    assert "no such store" in capsys.readouterr().err


def test_rank_per_iteration_from_the_store(tmp_path, capsys):
    import numpy as np

    from jaxrace.cli import main
    from jaxrace.rewards.bradley_terry import fit_labels, rank_named

    rows = rank_named(["b", "a", "a", "c"], ["a", "b", "c", "b"], ["second", "tie", "first", "skip"])
    assert [(r["name"], r["games"], r["wins"]) for r in rows] == [("a", 3, 2.5), ("b", 2, 0.5), ("c", 1, 0.0)]
    scores, stderr = fit_labels([1, 0, 0, 2], [0, 1, 2, 1], ["second", "tie", "first", "skip"], 3)
    np.testing.assert_allclose([r["score"] for r in rows], np.asarray(scores), rtol=1e-6)
    np.testing.assert_allclose([r["stderr"] for r in rows], np.asarray(stderr), rtol=1e-6)
    assert rank_named([], [], []) == []

    path = tmp_path / "prefs.sqlite"
    with PreferenceStore(path) as store:
        ids = [store.add_clip(f"c{i}", iteration=i // 2, candidate=f"cand{i}", seed=0, race=0, start=0, length=4,
                              metrics={}, arrays=tmp_path / "x.npz", arrays_row=i) for i in range(4)]
        store.add_preference("boot", iteration=0, first=ids[0], second=ids[1], label="second", judge_kind="s",
                             judge_id="s")
        store.add_preference("i1", iteration=1, first=ids[2], second=ids[3], label="first", judge_kind="s",
                             judge_id="s")
        store.add_preference("i1b", iteration=1, first=ids[3], second=ids[2], label="skip", judge_kind="s",
                             judge_id="s")
    assert main(["judges", "rank", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "bootstrap: 1 judged pairs (0 skipped)" and lines[2].split()[0] == "cand1"
    assert lines[4] == "iteration 1: 2 judged pairs (1 skipped)" and lines[6].split()[0] == "cand2"
    assert lines[6].split()[3:] == ["1", "1.0"]
    assert main(["judges", "rank", str(path), "--iteration", "3"]) == 1
    assert "no preferences in iteration 3" in capsys.readouterr().out
