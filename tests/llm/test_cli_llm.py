"""`jaxrace llm check` and `jaxrace reward generate` against the scripted server, and bad input."""

import json

import pytest

from jaxrace.cli import main

pytestmark = pytest.mark.timeout(120)
PROGRAM = ('PARAMS = {"w": 1.0}\n\n\ndef reward(prev, action, curr, params):\n'
           '    r = params["w"] * (curr.progress - prev.progress)\n    return r, {"progress": r}\n')


def test_llm_check_reports_reply_json_and_images(fake_server, capsys):
    fake_server.script({"content": "ready"}, {"content": 'Sure: {"colour": "blue"}'}, {"content": "Red."})
    assert main(["llm", "check", "--base-url", fake_server.url, "--model", "fake-model", "--timeout", "5"]) == 0
    out = capsys.readouterr().out
    assert f"endpoint {fake_server.url}, model fake-model" in out
    assert "models: 2 (fake-model, fake-vision); fake-model listed" in out
    assert "reply: 'ready' in" in out and "JSON: works ({'colour': 'blue'})" in out and "images: work" in out
    log = fake_server.log()
    assert log[1]["body"]["response_format"]["type"] == "json_schema"
    assert log[2]["body"]["messages"][0]["content"][1]["type"] == "image_url"


def test_llm_check_on_a_dead_endpoint_fails_clearly(capsys):
    assert main(["llm", "check", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--timeout", "1"]) == 1
    assert "reply: FAILED: http://127.0.0.1:9/v1 (model 'm'): connection failed" in capsys.readouterr().out


def test_reward_generate_with_openai_then_replay(fake_server, tmp_path, capsys, monkeypatch):
    fake_server.script({"match": "candidate 1 of", "content": f"```python\n{PROGRAM}```"},
                       {"match": "candidate 2 of", "content": "no code here"},
                       {"match": "holds no program", "content": f"```python\n{PROGRAM.replace('1.0', '2.0')}```"})
    monkeypatch.setenv("JAXRACE_LLM_API_KEY", "sk-secret-key")
    out = tmp_path / "gen"
    assert main(["reward", "generate", "-m", "2", "--llm", "openai", "--base-url", fake_server.url, "--model",
                 "fake-model", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 of 2 programs from fake-model; attempts: extract 1, ok 2;" in printed
    assert (out / "candidate-1.py").read_text() == PROGRAM and (out / "candidate-2.jaxreward").exists()
    attempts = json.loads((out / "attempts.json").read_text())
    assert [(a["sample"], a["repair"], a["stage"]) for a in attempts["attempts"]] == [
        (1, 0, "extract"), (0, 0, "ok"), (1, 1, "ok")]
    assert not any("sk-secret-key" in p.read_text() for p in out.rglob("*") if p.is_file() and p.suffix != ".jaxreward")
    again = tmp_path / "again"
    assert main(["reward", "generate", "-m", "2", "--llm", "replay", "--replay-from", str(out), "--out",
                 str(again)]) == 0
    assert (again / "candidate-2.py").read_text() == (out / "candidate-2.py").read_text()


def test_design_refuses_openai_without_a_model(capsys, tmp_path):
    assert main(["design", "--llm", "openai", "--run-dir", str(tmp_path / "r"), "--quiet"]) == 2
    assert "llm 'openai' needs a model (--model, or JAXRACE_LLM_MODEL / OPENAI_MODEL)" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
