"""The human judge: a local web page (Flask) that shows queued pairs of clips and stores labels (host-side).

The loop queues pairs in the preference store (`PreferenceStore.enqueue`), serves this page
and waits; the person's label goes straight into the store as a preference with the queued
key, so a reload (or a restarted page, or another process serving the same store) resumes
at the first unlabelled pair. The page never shows race metrics or candidate names: the
person judges what they see.

Bound to 127.0.0.1 by default. Bound to any other address, every request needs the
run's token (in the URL printed once, then a cookie), compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from importlib import resources
from pathlib import Path

from jaxrace.judges.base import Verdict
from jaxrace.rewards.preferences import LABELS, PreferenceStore

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def token_cookie(token: str) -> str:
    """The cookie's name for one token: two runs' pages in one browser keep their own cookies."""
    return "jaxrace_token_" + hashlib.sha256(token.encode()).hexdigest()[:12]


def create_app(store_path: str | Path, *, token: str | None = None, on_label=None):
    """The Flask app of the page over the store at `store_path`.

    Args:
        token: required on every request when set (`?token=` once, then the cookie the page sets).
        on_label: called with the preference key after each stored label (the loop's wake-up).
    """
    from flask import Flask, abort, g, jsonify, request, send_file

    store_path = Path(store_path)
    app = Flask("jaxrace.judges.human")
    page = resources.files("jaxrace.judges").joinpath("page.html").read_text(encoding="utf-8")

    def open_store() -> PreferenceStore:
        # one connection per request: sqlite3 connections stay in the thread that made them
        return PreferenceStore(store_path)

    @app.before_request
    def check_access():
        if token is None:
            # Loopback only: a page from another site, rebound by DNS to 127.0.0.1, sends its own name.
            host = request.host.rsplit(":", 1)[0] if not request.host.endswith("]") else request.host
            if host.strip("[]") not in LOOPBACK:
                return jsonify(error=f"this page answers on a loopback address only, not {request.host!r}"), 403
            return None
        given = request.args.get("token") or request.cookies.get(token_cookie(token)) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            return jsonify(error="this page needs its token: open the URL the loop printed"), 403
        g.token_in_url = bool(request.args.get("token"))  # and it matched
        return None

    @app.after_request
    def remember_token(response):
        if token is not None and g.get("token_in_url"):
            response.set_cookie(token_cookie(token), token, httponly=True, samesite="Strict")
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.errorhandler(404)
    def not_found(_):
        return jsonify(error=f"not found: {request.path}"), 404

    @app.get("/")
    def index():
        return page, 200, {"Content-Type": "text/html; charset=utf-8"}

    @app.get("/api/state")
    def state():
        with open_store() as store:
            pending = store.pending()
            task = store.meta("task", "")
            if not pending:
                latest = int(store.meta("iteration", "0"))
                done, total = store.queue_progress(latest)
                # the loop ranks as soon as the last label is in: feedback now is for the next iteration
                return jsonify(task=task, pair=None, iteration=latest, feedback_iteration=latest + 1, done=done,
                               total=total)
            q = pending[0]
            done, total = store.queue_progress(q.iteration)
            return jsonify(task=task, iteration=q.iteration, feedback_iteration=q.iteration, done=done, total=total,
                           pair={"key": q.key, "first": f"/clip/{q.first}", "second": f"/clip/{q.second}"})

    @app.get("/clip/<int:clip_id>")
    def clip(clip_id: int):
        with open_store() as store:
            try:
                (row,) = store.clips([clip_id])
            except KeyError:
                abort(404)
        if not row.video:
            abort(404)
        path = (store_path.parent / row.video).resolve()
        if not path.is_file():
            abort(404)
        return send_file(path, conditional=True)  # ranges: the browser seeks to keep both videos in step

    @app.post("/api/label")
    def label():
        body = request.get_json(silent=True) or {}
        key, choice = body.get("key"), body.get("label")
        annotator = str(body.get("annotator") or "").strip()[:64] or "anonymous"
        if choice not in LABELS:
            return jsonify(error=f"label must be one of {', '.join(LABELS)}, got {choice!r}"), 400
        try:
            seconds = max(0.0, float(body.get("seconds", 0.0)))
        except (TypeError, ValueError):
            return jsonify(error=f"seconds must be a number, got {body.get('seconds')!r}"), 400
        with open_store() as store:
            queued = {q.key: q for q in store.pending()}
            if key not in queued:
                done = store.preference(str(key))
                if done is None:
                    return jsonify(error=f"no queued pair {key!r}"), 404
                return jsonify(error=f"pair {key!r} is already labelled ({done.label} by {done.judge_id})"), 409
            q = queued[key]
            stored = store.add_preference(q.key, iteration=q.iteration, first=q.first, second=q.second,
                                          label=choice, judge_kind="human", judge_id=annotator,
                                          rationale=str(body.get("note") or ""), seconds=seconds)
            if (stored.label, stored.judge_kind, stored.judge_id) != (choice, "human", annotator):
                # another tab, or the loop's timeout, stored this pair first: say so, do not claim it saved
                return jsonify(error=f"pair {key!r} is already labelled ({stored.label} by {stored.judge_id})"), 409
            done, total = store.queue_progress(q.iteration)
        if on_label is not None:
            on_label(key)
        return jsonify(ok=True, done=done, total=total)

    @app.post("/api/feedback")
    def feedback():
        body = request.get_json(silent=True) or {}
        text = str(body.get("text") or "").strip()
        if not text:
            return jsonify(error="feedback is empty"), 400
        annotator = str(body.get("annotator") or "").strip()[:64] or "anonymous"
        try:
            iteration = int(body.get("iteration"))
        except (TypeError, ValueError):
            return jsonify(error=f"iteration must be an integer, got {body.get('iteration')!r}"), 400
        with open_store() as store:
            store.add_feedback(iteration, f"human:{annotator}", text[:4000])
        return jsonify(ok=True)

    return app


class HumanServer:
    """The page served from a background thread (werkzeug's threaded server) until `close()`.

    Args:
        host, port: where to listen (port 0: a free one); any host but loopback requires a token.
        token: the token to require (default: a new random one when the host is not loopback).
    """

    def __init__(self, store_path: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, on_label=None):
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):  # no line per request on the loop's terminal; errors still go out
            def log_request(self, *args, **kwargs):
                pass

        if token is None and host not in LOOPBACK:
            token = secrets.token_urlsafe(16)
        self.token = token
        self.host = host
        self._server = make_server(host, port, create_app(store_path, token=token, on_label=on_label),
                                   threaded=True, request_handler=Quiet)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="jaxrace-human-page", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> HumanServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HumanJudge:
    """Waits for a person to label queued pairs on the page, which it serves from the first wait until `close()`.

    One server for the judge's life: the URL printed once stays valid across rounds and
    iterations, and between them the page says it waits for more. `judge_many` returns once
    every pair has a label, or after `timeout_s` without a new one (an idle timeout: a
    person labelling steadily is never cut off); pairs still unlabelled then are stored as
    skips whose rationale says so, so the loop goes on and nothing waits forever.
    """

    kind = "human"

    def __init__(self, store: PreferenceStore, *, host: str = "127.0.0.1", port: int = 0,
                 timeout_s: float = 3600.0, token: str | None = None, notify=print, poll_s: float = 2.0):
        self.store = store
        self.host, self.port, self.token = host, port, token
        self.timeout_s = timeout_s
        self.notify = notify
        self.poll_s = poll_s
        self.id = "page"
        self._server: HumanServer | None = None
        self._wake = threading.Event()

    @property
    def url(self) -> str | None:
        return None if self._server is None else self._server.url

    def judge_many(self, iteration: int, pairs: list[tuple[str, int, int]]) -> dict[str, Verdict]:
        """Labels of (key, first clip id, second clip id) pairs from the page: {key: Verdict}."""
        for key, first, second in pairs:
            self.store.enqueue(key, iteration=iteration, first=first, second=second)
        self.store.set_meta("iteration", str(iteration))
        keys = [key for key, _, _ in pairs]
        if missing := self._missing(keys):
            if self._server is None:
                self._server = HumanServer(self.store.path, host=self.host, port=self.port, token=self.token,
                                           on_label=lambda _: self._wake.set())
            pairs_text = f"{len(missing)} pair{'s' if len(missing) != 1 else ''}"
            self.notify(f"waiting for a person to label {pairs_text} of clips: open {self.url} "
                        f"(after {self.timeout_s:.0f} s without a label, the pairs left become skips)")
            deadline = time.monotonic() + self.timeout_s
            while (now_missing := len(self._missing(keys))) and (left := deadline - time.monotonic()) > 0:
                # woken by each label; the poll catches labels from a page in another process
                self._wake.wait(min(left, self.poll_s))
                self._wake.clear()
                if len(self._missing(keys)) < now_missing:
                    deadline = time.monotonic() + self.timeout_s
        for key in self._missing(keys):
            first, second = next((a, b) for k, a, b in pairs if k == key)
            self.store.add_preference(key, iteration=iteration, first=first, second=second, label="skip",
                                      judge_kind=self.kind, judge_id="timeout",
                                      rationale=f"no label for {self.timeout_s:.0f} s (idle timeout)")
        out = {}
        for key in keys:
            p = self.store.preference(key)
            out[key] = Verdict(p.label, 1.0 if p.label != "skip" else 0.0, p.rationale)
        return out

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def _missing(self, keys: list[str]) -> list[str]:
        pending = {q.key for q in self.store.pending()}
        return [k for k in keys if k in pending]
