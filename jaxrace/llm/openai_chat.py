"""Any OpenAI-compatible chat endpoint through the official `openai` SDK (host-side).

OpenAI, vLLM, llama.cpp's server, Ollama and LM Studio all speak the chat-completions
protocol; only the base URL, the model and (for OpenAI) the key differ. They come from
arguments or the environment: `JAXRACE_LLM_BASE_URL`, `JAXRACE_LLM_MODEL`,
`JAXRACE_LLM_API_KEY`, falling back to `OPENAI_BASE_URL`, `OPENAI_MODEL`,
`OPENAI_API_KEY`. The key is held by the SDK client only; nothing here logs or returns it.

The SDK's own retries are off: this module retries 408, 409, 429, 5xx, timeouts and
dropped connections up to `max_retries` times with exponential backoff, waits what a
`Retry-After` header asks (up to `max_retry_after_s`), counts the retries, and then
raises one `LLMError` naming the endpoint, the model and what happened.
"""

from __future__ import annotations

import email.utils
import os
import random
import threading
import time
from collections.abc import Sequence

from jaxrace.llm.base import LLMError, Reply

DEFAULT_TIMEOUT_S = 120.0
RETRYABLE_STATUS = (408, 409, 429)


def env_setting(name: str) -> str | None:
    """JAXRACE_LLM_<name>, else OPENAI_<name>, else None."""
    return os.environ.get(f"JAXRACE_LLM_{name}") or os.environ.get(f"OPENAI_{name}") or None


def resolve_endpoint(base_url: str | None = None, model: str | None = None) -> tuple[str, str]:
    """(base URL, model) from the arguments, else the environment; a clear error when one is missing."""
    base_url = base_url or env_setting("BASE_URL") or "https://api.openai.com/v1"
    model = model or env_setting("MODEL")
    if not model:
        raise LLMError("no model named: pass --model NAME or set JAXRACE_LLM_MODEL (or OPENAI_MODEL)")
    return base_url.rstrip("/"), model


def _retry_after(headers) -> float | None:
    """Seconds a `Retry-After` (or `retry-after-ms`) header asks for, or None."""
    if headers is None:
        return None
    if headers.get("retry-after-ms"):
        try:
            return float(headers["retry-after-ms"]) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_tz(value)
        return None if parsed is None else max(0.0, email.utils.mktime_tz(parsed) - time.time())


class OpenAIChat:
    """A chat backend for an OpenAI-compatible endpoint.

    Args:
        base_url, model, api_key: the endpoint (see `resolve_endpoint`); the key falls
            back to the environment, then to a placeholder local servers accept.
        timeout_s: per request (connect, read, write).
        max_retries: retries of one request before `LLMError`.
        backoff_s: the first backoff; it doubles per retry (with up to 25% jitter), up to 30 s.
        max_retry_after_s: a server asking to wait longer than this fails the request at once.
    """

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_retries: int = 4, backoff_s: float = 1.0,
                 max_retry_after_s: float = 60.0, max_concurrency: int = 8):
        try:
            import openai
        except ImportError:
            raise LLMError("the openai backend needs the 'openai' package: pip install 'jaxrace[llm]'") from None
        if max_retries < 0 or timeout_s <= 0:
            raise ValueError(f"max_retries must be >= 0 and timeout_s > 0 (got {max_retries}, {timeout_s})")
        self.base_url, self.model = resolve_endpoint(base_url, model)
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.retries = 0  # over the backend's life, for reports
        self._lock = threading.Lock()
        self._openai = openai
        self._client = openai.OpenAI(base_url=self.base_url, api_key=api_key or env_setting("API_KEY") or "no-key",
                                     timeout=timeout_s, max_retries=0)
        self._slots = threading.BoundedSemaphore(max_concurrency)

    def __repr__(self) -> str:
        return f"OpenAIChat(base_url={self.base_url!r}, model={self.model!r})"

    def _fail(self, what: str, status: int | None, retries: int) -> LLMError:
        tries = f" after {retries + 1} attempts" if retries else ""
        return LLMError(f"{self.base_url} (model {self.model!r}): {what}{tries}", status=status, retries=retries)

    def chat(self, messages: Sequence[dict], **options) -> Reply:
        openai = self._openai
        t0 = time.perf_counter()
        for attempt in range(self.max_retries + 1):
            wait = None
            try:
                with self._slots:
                    completion = self._client.chat.completions.create(model=self.model, messages=list(messages),
                                                                      **options)
                return self._reply(completion, messages, time.perf_counter() - t0, attempt)
            except openai.APIStatusError as e:
                detail = _error_detail(e)
                what = f"HTTP {e.status_code}: {detail}"
                if not (e.status_code in RETRYABLE_STATUS or e.status_code >= 500):
                    raise self._fail(what, e.status_code, attempt) from None
                wait = _retry_after(e.response.headers)
                if wait is not None and wait > self.max_retry_after_s:
                    raise self._fail(f"{what}; the server asks to wait {wait:.0f} s (Retry-After), more than "
                                     f"the {self.max_retry_after_s:.0f} s allowed", e.status_code, attempt) from None
                status = e.status_code
            except openai.APITimeoutError:
                what, status = f"no reply within the {self.timeout_s:g} s timeout", None
            except openai.APIConnectionError as e:
                cause = e.__cause__ or e
                what, status = f"connection failed ({type(cause).__name__}: {cause})", None
            except openai.APIResponseValidationError as e:
                raise self._fail(f"the reply is not a chat completion: {e}", None, attempt) from None
            except ValueError as e:  # the SDK lets a body that is not JSON through as JSONDecodeError
                what, status = f"the reply is not valid JSON ({e})", None
            if attempt == self.max_retries:
                raise self._fail(what, status, attempt)
            with self._lock:
                self.retries += 1
            if wait is None:
                wait = min(self.backoff_s * 2.0 ** attempt, 30.0) * (1.0 - 0.25 * random.random())
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _reply(self, completion, messages, seconds: float, retries: int) -> Reply:
        if isinstance(completion, str) or not getattr(completion, "choices", None):
            raise self._fail(f"the reply has no choices: {str(completion)[:200]!r}", None, retries)
        choice = completion.choices[0]
        text = choice.message.content or ""
        usage = getattr(completion, "usage", None)
        estimated = usage is None or usage.prompt_tokens is None
        if estimated:
            prompt_chars = sum(len(str(m.get("content", ""))) for m in messages)
            prompt_tokens, completion_tokens = prompt_chars // 4 + 1, len(text) // 4 + 1
        else:
            prompt_tokens, completion_tokens = usage.prompt_tokens, usage.completion_tokens or 0
        return Reply(text=text, finish_reason=choice.finish_reason or "stop", model=completion.model or self.model,
                     prompt_tokens=int(prompt_tokens), completion_tokens=int(completion_tokens), estimated=estimated,
                     seconds=round(seconds, 3), retries=retries)

    def list_models(self) -> list[str]:
        """The endpoint's model ids (GET /models)."""
        try:
            return sorted(m.id for m in self._client.models.list())
        except self._openai.APIError as e:
            raise self._fail(f"listing models failed: {e}", getattr(e, "status_code", None), 0) from None


def _error_detail(e) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
        return str(inner)[:300]
    return str(getattr(e, "message", e))[:300]
