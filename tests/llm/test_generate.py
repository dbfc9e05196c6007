"""Generation with extraction, compilation in the sandbox, repair, refill, dedupe, budget, record and replay."""

import json

import pytest
from fake_llm_server import FakeServer

from jaxrace.llm import Budget, BudgetedChat, OfflineChat, ReplayMiss, generate, open_chat
from jaxrace.llm.openai_chat import OpenAIChat

pytestmark = pytest.mark.timeout(120)
TASK = "win the race cleanly from the back of the grid"


def program(w: float, name: str = "speed") -> str:
    return (f'PARAMS = {{"w": {w}}}\n\n\ndef reward(prev, action, curr, params):\n'
            f'    r = params["w"] * (curr.progress - prev.progress)\n    return r, {{"{name}": r}}\n')


TRACE_FAIL = ('def reward(prev, action, curr):\n    r = curr.speed\n    if curr.speed > 1.0:\n        r = 2.0 * r\n'
              '    return r, {"speed": r}\n')


def test_every_fault_is_recorded_and_refilled(fake_server):
    a, b, c = program(1.0), program(2.0, "pace"), program(3.0, "go")
    fake_server.script(
        # sample 1: Python `if` on a traced value (the sandbox's trace stage), repaired in an odd fence
        {"match": "Write candidate 1 of", "content": f"Here:\n```python\n{TRACE_FAIL}```"},
        {"match": "rejected: trace error (line 3)", "content": f"Fixed, sorry.\n~~~py\n{a}~~~\nDone."},
        # sample 2: no code, then cut off by the length limit, then a duplicate of sample 1's program
        {"match": "Write candidate 2 of", "content": "I think a good reward pays for progress."},
        {"match": "holds no program", "content": f"```python\n{b[:50]}", "finish_reason": "length"},
        {"match": "cut off by the length limit", "content": f"```\n{a}```"},
        # sample 3: the server fails for good
        *[{"match": "Write candidate 3 of", "status": 500, "error": "boom"}] * 3,
        # refills
        {"match": "Write candidate 4 of", "content": f"Unfenced, with prose.\n\n{b}\nThat is all."},
        {"match": "Write candidate 5 of", "content": f"```python\n{c}```"},
    )
    chat = OpenAIChat(fake_server.url, "fake-model", timeout_s=5, max_retries=2, backoff_s=0.01)
    accepted = []
    result = generate(chat, TASK, 3, repairs=2, concurrency=3, seed=100, on_program=accepted.append)
    assert [p.source for p in result.programs] == [a, b, c]
    assert [(p.sample, p.repairs) for p in result.programs] == [(0, 1), (3, 0), (4, 0)]
    assert sorted(p.sample for p in accepted) == [0, 3, 4] and result.stopped is None
    stages = sorted((x["sample"], x["repair"], x["stage"]) for x in result.attempts)
    assert stages == [(0, 0, "trace"), (0, 1, "ok"), (1, 0, "extract"), (1, 1, "truncated"), (1, 2, "duplicate"),
                      (2, 0, "reply"), (3, 0, "ok"), (4, 0, "ok")]
    by = {(x["sample"], x["repair"]): x for x in result.attempts}
    assert by[(0, 0)]["line"] == 3 and by[(0, 0)]["source"] == TRACE_FAIL
    assert "HTTP 500: boom after 3 attempts" in by[(2, 0)]["error"]
    assert by[(1, 0)]["reply"] == "I think a good reward pays for progress."
    assert all(x["prompt_tokens"] > 0 for x in result.attempts if x["stage"] != "reply")
    log = fake_server.log()
    assert len(log) == 10  # samples 1 and 2 with their repairs (5), 3 tries of sample 3, 2 refills
    assert sorted(r["body"]["seed"] for r in log if "Write candidate 1 of" in json.dumps(r["body"])) == [100, 100]
    repair = next(r["body"]["messages"] for r in log if "rejected: trace" in json.dumps(r["body"]))
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert ">  3      if curr.speed > 1.0:" in repair[3]["content"]


def test_a_dead_endpoint_stops_generation_with_the_reason(fake_server):
    fake_server.script(default={"status": 503, "error": "down"})
    chat = OpenAIChat(fake_server.url, "fake-model", timeout_s=5, max_retries=1, backoff_s=0.01)
    result = generate(chat, TASK, 2, concurrency=2)
    assert result.programs == [] and "every request of a round failed" in result.stopped
    assert "HTTP 503: down" in result.stopped and len(fake_server.log()) == 4  # one round, no endless refill


def test_budget_stops_cleanly_with_what_it_has():
    budget = Budget(max_calls=2)
    result = generate(BudgetedChat(OfflineChat(), budget), TASK, 3, seed=5)
    assert len(result.programs) == 2 and "call budget (2 calls)" in result.stopped
    assert [x["stage"] for x in result.attempts].count("budget") == 1
    assert budget.calls == 2 and budget.tokens == result.tokens > 0


def test_offline_backend_goes_through_the_same_path_and_says_it_is_no_llm():
    result = generate(OfflineChat(), TASK, 2, seed=1)
    assert len(result.programs) == 2 and all(x["stage"] == "ok" for x in result.attempts)
    assert all("not an LLM" in p.source for p in result.programs)
    reply = OfflineChat().chat([{"role": "user", "content": "hello"}])
    assert "not an LLM" in reply.text and "```" not in reply.text


def test_record_then_replay_with_the_server_stopped(tmp_path):
    server = FakeServer(tmp_path)
    try:
        server.script({"match": "Write candidate 1 of", "content": f"```python\n{program(1.0)}```"},
                      {"match": "Write candidate 2 of", "content": f"```python\n{program(2.0)}```"})
        live = open_chat("openai", tmp_path / "run1" / "record.jsonl", base_url=server.url, model="fake-model",
                         api_key="sk-never-written", timeout_s=5)
        live.stage = "iter1/generate"
        recorded = generate(live, TASK, 2, seed=9)
    finally:
        server.stop()
    record_text = (tmp_path / "run1" / "record.jsonl").read_text()
    assert "sk-never-written" not in record_text and len(record_text.splitlines()) == 2
    replay = open_chat("replay", tmp_path / "run2" / "record.jsonl", replay_from=tmp_path / "run1" / "record.jsonl")
    replay.stage = "iter1/generate"
    replayed = generate(replay, TASK, 2, seed=9)
    assert [p.source for p in replayed.programs] == [p.source for p in recorded.programs]
    assert replayed.attempts == recorded.attempts
    assert (tmp_path / "run2" / "record.jsonl").read_text().count("\n") == 2  # the replay is itself a record
    changed = open_chat("replay", tmp_path / "run3.jsonl", replay_from=tmp_path / "run1" / "record.jsonl")
    changed.stage = "iter1/generate"
    with pytest.raises(ReplayMiss, match=r"stage 'iter1/generate'.*first differs at message 2 \(user\)"):
        generate(changed, "win the race from pole", 2, seed=9)
    with pytest.raises(ReplayMiss, match="other options: seed"):
        generate(open_chat("replay", tmp_path / "run4.jsonl", replay_from=tmp_path / "run1" / "record.jsonl"),
                 TASK, 2, seed=10)


def test_a_resumed_run_reuses_recorded_replies_and_asks_only_for_the_rest(tmp_path):
    calls = []

    class Counting(OfflineChat):
        def chat(self, messages, **options):
            calls.append(options["seed"])
            return super().chat(messages, **options)

    from jaxrace.llm import Record, RecordedChat

    path = tmp_path / "record.jsonl"
    # a run stopped after two replies (here by a budget), its record's last line half written by the kill;
    # one request at a time, so which two replies the budget lets through does not depend on thread timing
    first = generate(BudgetedChat(RecordedChat(Counting(), Record(path)), Budget(max_calls=2)), TASK, 3, seed=3,
                     concurrency=1)
    with open(path, "a") as f:
        f.write('{"key": "abc", "n": 0, "ro')
    with pytest.warns(UserWarning, match="half-written last line"):
        again = generate(RecordedChat(Counting(), Record(path)), TASK, 3, seed=3, concurrency=1)
    assert [p.source for p in again.programs[:2]] == [p.source for p in first.programs]
    assert calls == [3, 4, 5]  # samples 1 and 2 came from the record
