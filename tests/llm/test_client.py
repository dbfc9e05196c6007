"""The OpenAI-compatible backend against a real HTTP server on 127.0.0.1 that scripts faults."""

import time

import pytest

from jaxrace.llm import LLMError, message
from jaxrace.llm.openai_chat import OpenAIChat, resolve_endpoint

pytestmark = pytest.mark.timeout(60)
HELLO = [message("user", "hello")]


def client(server, **kw) -> OpenAIChat:
    kw = {"timeout_s": 2.0, "max_retries": 2, "backoff_s": 0.01} | kw
    return OpenAIChat(server.url, "fake-model", api_key="sk-test-secret", **kw)


def test_a_reply_with_usage(fake_server):
    fake_server.script({"content": "hi there", "finish_reason": "stop"})
    reply = client(fake_server).chat(HELLO, max_tokens=10, temperature=0.0, seed=3)
    assert (reply.text, reply.finish_reason, reply.model, reply.retries) == ("hi there", "stop", "fake-model", 0)
    assert reply.completion_tokens == 3 and not reply.estimated
    [request] = fake_server.log()
    assert request["body"]["messages"] == HELLO and request["body"]["seed"] == 3
    assert request["body"]["max_tokens"] == 10 and request["authorization"] == "Bearer sk-test-secret"


def test_429_waits_what_retry_after_asks_then_succeeds(fake_server):
    fake_server.script({"status": 429, "headers": {"Retry-After": "0.6"}}, {"content": "ok"})
    t0 = time.perf_counter()
    reply = client(fake_server).chat(HELLO)
    assert reply.text == "ok" and reply.retries == 1
    log = fake_server.log()
    assert len(log) == 2 and log[1]["time"] - log[0]["time"] >= 0.55  # the wait, not the 0.01 s backoff
    assert time.perf_counter() - t0 < 5


def test_a_retry_after_longer_than_allowed_fails_at_once(fake_server):
    fake_server.script({"status": 429, "headers": {"Retry-After": "3600"}, "error": "quota"})
    with pytest.raises(LLMError, match="asks to wait 3600 s") as err:
        client(fake_server).chat(HELLO)
    assert err.value.status == 429 and len(fake_server.log()) == 1


def test_5xx_is_retried_a_bounded_number_of_times_then_a_clear_error(fake_server):
    fake_server.script(*[{"status": 503, "error": "overloaded"}] * 5)
    chat = client(fake_server)
    with pytest.raises(LLMError) as err:
        chat.chat(HELLO)
    text = str(err.value)
    assert fake_server.url in text and "'fake-model'" in text and "HTTP 503: overloaded" in text
    assert "after 3 attempts" in text and err.value.retries == 2 and err.value.status == 503
    assert len(fake_server.log()) == 3 and chat.retries == 2


def test_client_errors_are_not_retried(fake_server):
    fake_server.script({"status": 400, "error": "bad model"})
    with pytest.raises(LLMError, match="HTTP 400: bad model") as err:
        client(fake_server).chat(HELLO)
    assert err.value.retries == 0 and len(fake_server.log()) == 1


def test_a_reply_slower_than_the_timeout_is_retried_then_fails_without_hanging(fake_server):
    fake_server.script(*[{"sleep": 5.0, "content": "late"}] * 2)
    t0 = time.perf_counter()
    with pytest.raises(LLMError, match="no reply within the 0.5 s timeout after 2 attempts"):
        client(fake_server, timeout_s=0.5, max_retries=1).chat(HELLO)
    assert time.perf_counter() - t0 < 3.0


def test_a_connection_dropped_mid_reply_and_malformed_json_are_retried(fake_server):
    fake_server.script({"drop": True}, {"malformed": True}, {"content": "third time"})
    reply = client(fake_server).chat(HELLO)
    assert reply.text == "third time" and reply.retries == 2 and len(fake_server.log()) == 3
    fake_server.script({"drop": True}, {"drop": True})
    with pytest.raises(LLMError, match="connection failed"):
        client(fake_server, max_retries=1).chat(HELLO)


def test_an_unreachable_endpoint_is_a_clear_error():
    chat = OpenAIChat("http://127.0.0.1:9/v1", "m", timeout_s=1.0, max_retries=1, backoff_s=0.01)
    with pytest.raises(LLMError, match=r"http://127.0.0.1:9/v1 \(model 'm'\): connection failed"):
        chat.chat(HELLO)


def test_no_usage_means_estimated_tokens(fake_server):
    fake_server.script({"content": "x" * 40, "usage": False})
    reply = client(fake_server).chat(HELLO)
    assert reply.estimated and reply.completion_tokens == 11


def test_images_travel_as_data_urls(fake_server):
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    fake_server.script({"content": "red"})
    client(fake_server).chat([message("user", "colour?", [png])])
    parts = fake_server.log()[0]["body"]["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "colour?"}
    assert parts[1]["type"] == "image_url" and parts[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    with pytest.raises(ValueError, match="PNG or JPEG"):
        message("user", "x", [b"GIF89a..."])


def test_endpoint_from_the_environment(monkeypatch, fake_server):
    with pytest.raises(LLMError, match="no model named"):
        resolve_endpoint()
    monkeypatch.setenv("OPENAI_BASE_URL", "http://fallback/v1")
    monkeypatch.setenv("OPENAI_MODEL", "fallback-model")
    assert resolve_endpoint() == ("http://fallback/v1", "fallback-model")
    monkeypatch.setenv("JAXRACE_LLM_BASE_URL", fake_server.url + "/")
    monkeypatch.setenv("JAXRACE_LLM_MODEL", "fake-model")
    monkeypatch.setenv("JAXRACE_LLM_API_KEY", "sk-from-env")
    chat = OpenAIChat()
    assert (chat.base_url, chat.model) == (fake_server.url, "fake-model")
    assert "sk-from-env" not in repr(chat)
    fake_server.script({"content": "ok"})
    chat.chat(HELLO)
    assert fake_server.log()[0]["authorization"] == "Bearer sk-from-env"
    assert chat.list_models() == ["fake-model", "fake-vision"]
