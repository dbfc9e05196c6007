"""JSON answers: structured output, the fallback for servers without it, one retry, then a clear error."""

import pytest

from jaxrace.llm import LLMError, message
from jaxrace.llm.openai_chat import OpenAIChat
from jaxrace.llm.structured import chat_json, extract_json, schema_problems

pytestmark = pytest.mark.timeout(60)
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["label", "confidence"],
          "properties": {"label": {"type": "string", "enum": ["first", "second", "tie"]},
                         "confidence": {"type": "number", "minimum": 0, "maximum": 1}}}


def test_schema_problems_name_the_path():
    assert schema_problems({"label": "first", "confidence": 0.5}, SCHEMA) == []
    assert schema_problems({"label": "left", "confidence": 2, "x": 1}, SCHEMA) == [
        "$ has unexpected key 'x'", "$.label must be one of ['first', 'second', 'tie'], got 'left'",
        "$.confidence must be at most 1, got 2"]
    assert schema_problems({"confidence": True}, SCHEMA) == [
        "$ lacks required key 'label'", "$.confidence must be number, got bool true"]
    assert schema_problems([1, "a"], {"type": "array", "items": {"type": "integer"}}) == [
        '$[1] must be integer, got str "a"']


def test_extract_json_from_prose_and_fences():
    assert extract_json('{"a": 1}') == {"a": 1}
    assert extract_json('Verdict:\n```json\n{"a": [1, 2]}\n```') == {"a": [1, 2]}
    assert extract_json('I think {"a": "x}y", "b": {"c": 2}} is right') == {"a": "x}y", "b": {"c": 2}}
    with pytest.raises(ValueError, match="no JSON object"):
        extract_json("no json {here")


def chat(server):
    return OpenAIChat(server.url, "fake-model", timeout_s=5, max_retries=0)


def test_structured_output_then_a_server_without_it(fake_server):
    fake_server.script({"content": '{"label": "first", "confidence": 0.9}'})
    answer, _ = chat_json(chat(fake_server), [message("user", "which?")], SCHEMA)
    assert answer == {"label": "first", "confidence": 0.9}
    assert fake_server.log()[0]["body"]["response_format"]["json_schema"]["schema"] == SCHEMA
    # a server that refuses response_format is asked again in words only
    fake_server.script({"status": 400, "error": "response_format is not supported"},
                       {"content": 'Looking at both... {"label": "tie", "confidence": 0.4}'})
    answer, _ = chat_json(chat(fake_server), [message("user", "which?")], SCHEMA)
    assert answer == {"label": "tie", "confidence": 0.4}
    log = fake_server.log()
    assert "response_format" not in log[1]["body"] and "matches this JSON schema" in \
        log[1]["body"]["messages"][-1]["content"]


def test_an_invalid_answer_is_asked_once_more_then_a_clear_error(fake_server):
    fake_server.script({"content": '{"label": "left", "confidence": 0.5}'},
                       {"content": '{"label": "second", "confidence": 0.5}'})
    answer, _ = chat_json(chat(fake_server), [message("user", "which?")], SCHEMA)
    assert answer["label"] == "second"
    retry = fake_server.log()[1]["body"]["messages"]
    assert retry[-1]["content"].startswith("That reply is not valid: $.label must be one of")
    fake_server.script({"content": "no idea"}, {"content": "still no idea"})
    with pytest.raises(LLMError, match="no valid JSON answer after 2 tries"):
        chat_json(chat(fake_server), [message("user", "which?")], SCHEMA)
