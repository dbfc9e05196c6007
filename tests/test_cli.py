from jaxrace.cli import main
from jaxrace.rewards import load_reward


def test_race_prints_positions_and_lap_times(capsys):
    assert main(["race", "--track", "oval", "--opponents", "3", "--laps", "1", "--steps", "600"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("pos"))
    rows = lines[header + 1 : header + 5]
    assert [int(r.split()[0]) for r in rows] == [1, 2, 3, 4]
    assert sum("ego (AI)" in r for r in rows) == 1
    assert "overtakes" in lines[header + 5]
    # 60 s is enough for one lap of the oval: every car has a lap time and a total.
    assert all("DNF" not in r for r in rows)


def test_bad_input_is_an_error_message_not_a_traceback(capsys):
    assert main(["race", "--track", "monaco"]) == 2
    assert "unknown track 'monaco'" in capsys.readouterr().err
    assert main(["race", "--opponents", "25"]) == 2
    assert "num_opponents" in capsys.readouterr().err


def test_reward_propose_then_check_round_trips(tmp_path, capsys):
    assert main(["reward", "propose", "-m", "2", "--out", str(tmp_path), "--task", "overtake cleanly"]) == 0
    files = sorted(tmp_path.glob("*.py"))
    assert [f.name for f in files] == ["offline-1.py", "offline-2.py"]
    bad = tmp_path / "bad.py"
    bad.write_text("def reward(prev, action, curr):\n    return curr.spd, {}\n")
    capsys.readouterr()
    out = tmp_path / "artifacts"
    assert main(["reward", "check", *map(str, files), str(bad), "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out.count(": ok, components") == 2
    assert f"{bad}:2: policy error (line 2): RaceView has no field 'spd'; did you mean 'speed'?" in captured.err
    # The artifacts load without the source being executed, and name their source.
    loaded = load_reward(out / "offline-1.jaxreward")
    assert loaded.source == files[0].read_text() and sorted(p.name for p in out.iterdir()) == [
        "offline-1.jaxreward", "offline-2.jaxreward"]


def test_reward_api_prints_the_llm_api(capsys):
    assert main(["reward", "api"]) == 0
    assert "class RaceView" in capsys.readouterr().out


def test_design_and_report_refuse_bad_input_with_a_message(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("m = 2\nn = 5\n")
    assert main(["design", "--config", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    assert "n (trained per iteration, 5) cannot exceed m (generated, 2)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main(["report", str(tmp_path)]) == 2
    assert "is not a run directory (no config.json)" in capsys.readouterr().err
    assert main(["design", "--cpu-devices", "0", "--run-dir", str(tmp_path / "run")]) == 2
    assert "--cpu-devices: CPU devices must be 'auto' or a whole number >= 1, got '0'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
