"""The scripted OpenAI-compatible server (tests/llm/fake_openai.py) as a process, for tests."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SERVER = Path(__file__).parent / "llm" / "fake_openai.py"


class FakeServer:
    """The scripted OpenAI-compatible server process (see fake_openai.py)."""

    def __init__(self, tmp: Path):
        port_file = tmp / "port"
        self.proc = subprocess.Popen([sys.executable, str(SERVER), str(port_file)])
        deadline = time.monotonic() + 20
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.05)
        self.root = f"http://127.0.0.1:{port_file.read_text()}"
        self.url = self.root + "/v1"

    def _post(self, path: str, payload: dict):
        req = urllib.request.Request(self.root + path, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def script(self, *replies: dict, default: dict | None = None) -> None:
        """Sets what the next chat requests get, in order, and clears the log."""
        self._post("/_script", {"replies": list(replies), "default": default or {"content": "no script"}})

    def log(self) -> list[dict]:
        with urllib.request.urlopen(self.root + "/_log", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
