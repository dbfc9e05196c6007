"""A scripted OpenAI-compatible HTTP server for the LLM tests (stdlib only; run as a process).

    python fake_openai.py PORT_FILE

It listens on 127.0.0.1 (a free port, written to PORT_FILE) and serves
`GET /v1/models` and `POST /v1/chat/completions`. What a chat request gets comes from a
script set with `POST /_script {"replies": [...], "default": {...}}`; each request takes
the first reply whose "match" string occurs in its body (or the first without "match"):

    {"content": "...", "finish_reason": "stop", "usage": true, "sleep": 0.0}
    {"status": 429, "headers": {"Retry-After": "1"}, "error": "slow down"}
    {"drop": true}        headers promising 4096 bytes, 10 sent, connection closed
    {"malformed": true}   200 with a body that is not JSON
    {"echo": true}        replies with the last user message's text

`GET /_log` returns every chat request received since the script was set (its JSON
body and the time), so tests count retries. `POST /_stop` ends the process.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake-model"
STATE = {"replies": [], "default": {"content": "no script"}, "log": []}
LOCK = threading.Lock()


def _last_user_text(body: dict) -> str:
    for m in reversed(body.get("messages", [])):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else "\n".join(p.get("text", "") for p in c if p.get("type") == "text")
    return ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, payload, headers: dict | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 0, "owned_by": "jaxrace-tests"},
                {"id": "fake-vision", "object": "model", "created": 0, "owned_by": "jaxrace-tests"}]})
        elif self.path == "/_log":
            with LOCK:
                self._send(200, STATE["log"])
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        raw = self._body()
        if self.path == "/_script":
            script = json.loads(raw)
            with LOCK:
                STATE["replies"] = list(script.get("replies", []))
                STATE["default"] = script.get("default", {"content": "no script"})
                STATE["log"] = []
            self._send(200, {"ok": True})
            return
        if self.path == "/_stop":
            self._send(200, {"ok": True})
            threading.Thread(target=self.server.shutdown, daemon=True).start()
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"error": {"message": "the request body is not JSON"}})
            return
        text = raw.decode(errors="replace")
        with LOCK:
            STATE["log"].append({"time": time.time(), "body": body,
                                 "authorization": self.headers.get("Authorization", "")})
            chosen = next((r for r in STATE["replies"] if "match" in r and r["match"] in text), None)
            if chosen is None:
                chosen = next((r for r in STATE["replies"] if "match" not in r), None)
            if chosen is not None:
                STATE["replies"].remove(chosen)
            else:
                chosen = STATE["default"]
        self._reply(chosen, body)

    def _reply(self, r: dict, body: dict) -> None:
        time.sleep(r.get("sleep", 0.0))
        try:
            if "status" in r:
                self._send(r["status"], {"error": {"message": r.get("error", "scripted error"), "type": "test"}},
                           r.get("headers"))
            elif r.get("drop"):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "4096")
                self.end_headers()
                self.wfile.write(b'{"id": "cmp')
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
            elif r.get("malformed"):
                self._send(200, b'{"id": "cmpl-1", "choices": [ this is not json')
            else:
                content = _last_user_text(body) if r.get("echo") else r.get("content", "")
                reply = {"id": "cmpl-test", "object": "chat.completion", "created": int(time.time()),
                         "model": body.get("model", MODEL),
                         "choices": [{"index": 0, "finish_reason": r.get("finish_reason", "stop"),
                                      "message": {"role": "assistant", "content": content}}]}
                if r.get("usage", True):
                    prompt = sum(len(json.dumps(m.get("content", ""))) for m in body.get("messages", [])) // 4
                    reply["usage"] = {"prompt_tokens": prompt, "completion_tokens": len(content) // 4 + 1,
                                      "total_tokens": prompt + len(content) // 4 + 1}
                self._send(200, reply)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os

    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    server.serve_forever()


if __name__ == "__main__":
    main()
