"""The loop with a VLM judge on an OpenAI-compatible server (a real HTTP server on 127.0.0.1),
on test_loop's tiny config, through the command line. A module of its own so that pytest-xdist
can run it beside test_loop's runs."""

import json
import sqlite3
import subprocess

from design.test_loop import RUN_TIMEOUT_S, command


def test_a_vlm_judge_on_an_openai_compatible_server(setup, fake_server):
    """--judge vlm: every clip gets a video; the judge's requests are recorded; its statistics are written."""
    root, config, env = setup
    run = root / "vlm"
    fake_server.script(default={"content": '{"better": "tie", "confidence": 0.5, "reason": "alike"}'})
    out = subprocess.run(command(config, run, "--iterations", "1", "--judge", "vlm", "--judge-base-url",
                                 fake_server.url, "--judge-model", "fake-vision"),
                         env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    db = sqlite3.connect(run / "preferences.sqlite")
    assert {r[0] for r in db.execute("SELECT judge_kind FROM preferences")} == {"vlm"}
    videos = [r[0] for r in db.execute("SELECT video FROM clips")]
    assert len(videos) == 14 and all((run / v).stat().st_size > 1000 for v in videos)  # 8 bootstrap + 6
    record = [json.loads(line) for line in (run / "llm" / "record.jsonl").read_text().splitlines()]
    judged = [r for r in record if r["role"] == "judge"]
    # each clip described once, each pair decided in both orders
    assert len(judged) == 14 + 2 * (12 + 6) and {r["stage"] for r in judged} == {"bootstrap/judge", "iter1/judge"}
    assert len(fake_server.log()) == len(judged)
    stats = json.loads((run / "iter1" / "judge_stats.json").read_text())
    assert stats["pairs"] == 18 and stats["skipped"] == 0 and stats["disagreements"] == 0
