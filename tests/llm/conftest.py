import pytest


@pytest.fixture(autouse=True)
def _no_llm_environment(monkeypatch):
    for name in ("BASE_URL", "MODEL", "API_KEY"):
        monkeypatch.delenv(f"JAXRACE_LLM_{name}", raising=False)
        monkeypatch.delenv(f"OPENAI_{name}", raising=False)
