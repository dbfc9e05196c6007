"""The run directory: atomic writes, finished stages, the config it was made with, a log (host-side).

Every file is written to a temporary name, flushed to disk and renamed into place, so a
run killed at any moment leaves each file either as it was or complete. `stages.json`
lists the finished stages with their wall time; a stage is marked finished only after
all its files are written, so resuming redoes at most the stage that was running.
`running.json` holds the stage under way: when it began, and when the run was last seen
alive in it (each log line, and every `HEARTBEAT_S`). A stage's time in `stages.json`
is then the sum over its attempts, a killed attempt's counted up to its last sign of life.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from jaxrace.design.config import OPERATIONAL, PREDATED_VALUES, DesignConfig

CONFIG = "config.json"
STAGES = "stages.json"
RUNNING = "running.json"
LOG = "log.txt"
HEARTBEAT_S = 10.0  # a killed stage's time is undercounted by at most this (less where it logged)
NO_ATTEMPTS = {"attempts": 0, "seconds": 0.0, "compile_seconds": 0.0}


class ConfigMismatch(ValueError):
    """The run directory was made with a different configuration."""


def _json_default(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"cannot write a {type(x).__name__} as JSON")


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj) -> Path:
    return atomic_write_text(path, json.dumps(_finite(obj), indent=1, default=_json_default) + "\n")


def _finite(obj):
    """NaN and infinities as strings, so the files are standard JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _toml(value) -> str:
    if isinstance(value, tuple | list):
        return json.dumps(list(value))
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _preset_value(config: DesignConfig, field: str):
    """The field's value in the config's preset today (its default where the preset is unknown)."""
    from jaxrace.design.config import PRESETS

    return getattr(PRESETS.get(config.preset, DesignConfig()), field)


class RunDir:
    """One reward-design run on disk."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._running: dict | None = None  # this process's attempt at a stage, while under way
        self._running_lock = threading.Lock()

    @classmethod
    def open(cls, path: str | Path, config: DesignConfig) -> RunDir:
        """Creates the directory with `config`, or opens it to resume when its config is the same."""
        run = cls(path)
        stored = run.path / CONFIG
        if stored.exists():
            old = run.config(fill_from=config)
            if old != config and not old.changes(config, ignore=OPERATIONAL):
                atomic_write_json(stored, config.to_dict())  # only where the human page listens changed: kept
            elif old != config:
                hint = "".join(f"; {k}'s default has changed since: put `{k} = {_toml(v)}` in a --config TOML "
                               "file to resume it" for k, v in PREDATED_VALUES.items()
                               if getattr(old, k) == v != getattr(config, k) and _preset_value(old, k) != v)
                raise ConfigMismatch(
                    f"{run.path} holds a run made with a different config "
                    f"({'; '.join(old.changes(config, ignore=OPERATIONAL))}){hint}; "
                    "rerun with the same options to resume it, or pass a new --run-dir")
        elif run.path.exists() and any(run.path.iterdir()):
            raise ConfigMismatch(f"{run.path} exists and is not a jaxrace run directory (no {CONFIG}); "
                                 "pass a new or empty --run-dir")
        else:
            atomic_write_json(stored, config.to_dict())
        return run

    def config(self, fill_from: DesignConfig | None = None) -> DesignConfig:
        """The run's config. Fields it predates take their values from `fill_from` (the resuming
        command's), which are stored: the run never chose them. Those in `PREDATED_VALUES` take the
        value the run ran with instead."""
        data = self.read_json(CONFIG)
        data = {k: float(v) if isinstance(v, str) and v in ("inf", "-inf", "nan") else v for k, v in data.items()}
        missing = {k: PREDATED_VALUES.get(k, v) for k, v in (fill_from.to_dict() if fill_from else {}).items()
                   if k not in data}
        if "final_seeds" in missing:  # before the field, the final job trained `seeds` draws of each reward
            missing["final_seeds"] = data.get("seeds", 1)
        if missing:
            data.update(missing)
            atomic_write_json(self.path / CONFIG, data)
            self.log(f"run: config fields added since this run began, taken from this command: {missing}")
        return DesignConfig(**data)

    def file(self, rel: str) -> Path:
        return self.path / rel

    def write_json(self, rel: str, obj) -> Path:
        return atomic_write_json(self.path / rel, obj)

    def write_text(self, rel: str, text: str) -> Path:
        return atomic_write_text(self.path / rel, text)

    def read_json(self, rel: str):
        return json.loads((self.path / rel).read_text(encoding="utf-8"))

    def exists(self, rel: str) -> bool:
        return (self.path / rel).exists()

    def stages(self) -> dict:
        """{stage: {"seconds": s, "finished": unix time, "attempts": n, ...}} of the finished stages;
        `seconds` sums every attempt, `last_attempt_seconds` is the one that finished."""
        return self.read_json(STAGES) if self.exists(STAGES) else {}

    def done(self, stage: str) -> bool:
        return stage in self.stages()

    def _read_running(self) -> dict:
        try:
            return self.read_json(RUNNING) if self.exists(RUNNING) else {}
        except ValueError:  # not JSON (a disk that lost the rename): the record only, nothing else, is lost
            return {}

    def unfinished(self) -> dict:
        """{stage: {"seconds": s, "compile_seconds": c, "attempts": n, "alive": unix time}} of the stages begun
        and not finished (one under way now, or stopped), their time summed up to the last sign of life."""
        finished = self.stages()
        out = {}
        for stage, record in self._read_running().items():
            if stage in finished:  # killed after it was marked finished, before its record was dropped
                continue
            e, c = record["earlier"], record["current"]
            out[stage] = {"seconds": e["seconds"] + max(0.0, c["alive"] - c["started"]),
                          "compile_seconds": e["compile_seconds"] + c["compile_seconds"],
                          "attempts": e["attempts"] + 1, "alive": c["alive"]}
        return out

    @contextmanager
    def attempt(self, stage: str, compile_seconds: Callable[[], float] = lambda: 0.0) -> Iterator[dict]:
        """Records an attempt at `stage` in `running.json` while it runs, and yields the stage's earlier,
        unfinished attempts: {"attempts": n, "seconds": s, "compile_seconds": c} (zeros on the first).

        A thread writes a heartbeat every `HEARTBEAT_S` (and `log` writes one with each line), so a
        killed attempt is counted up to its last heartbeat; an attempt that raised, up to the raise.
        `compile_seconds` reads this attempt's compile time so far, for the heartbeats. The record is
        best effort: a heartbeat that cannot be written is skipped, and never fails the stage."""
        before = self.unfinished().get(stage)
        earlier = dict(NO_ATTEMPTS) if before is None else {k: before[k] for k in NO_ATTEMPTS}
        with self._running_lock:
            self._running = {"stage": stage, "earlier": earlier, "started": time.time(), "compile": compile_seconds}
        self._heartbeat()
        stop = threading.Event()

        def beat():
            while not stop.wait(HEARTBEAT_S):
                self._heartbeat()

        thread = threading.Thread(target=beat, name=f"jaxrace heartbeat {stage}", daemon=True)
        thread.start()
        try:
            yield dict(earlier)
        finally:
            stop.set()
            thread.join()
            self._heartbeat()  # the attempt's end, finished or raised
            with self._running_lock:
                self._running = None

    def _heartbeat(self) -> None:
        """Writes this process's attempt as alive now (no-op when none is under way)."""
        with self._running_lock:
            r = self._running
            if r is None:
                return
            try:
                running = self._read_running()
                running[r["stage"]] = {"earlier": r["earlier"], "current": {
                    "started": r["started"], "alive": time.time(), "compile_seconds": round(r["compile"](), 3)}}
                self.write_json(RUNNING, running)
            except OSError:  # a full or read-only disk: the stage's own writes will say so
                pass

    def mark_done(self, stage: str, seconds: float, *, compile_seconds: float = 0.0, earlier: dict | None = None,
                  **info) -> None:
        """Marks `stage` finished by an attempt of `seconds` (`earlier`: its unfinished attempts, from `attempt`)."""
        earlier = earlier or NO_ATTEMPTS
        stages = self.stages()
        stages[stage] = {"seconds": round(seconds + earlier["seconds"], 3),
                         "compile_seconds": round(compile_seconds + earlier["compile_seconds"], 3),
                         "attempts": earlier["attempts"] + 1, "last_attempt_seconds": round(seconds, 3),
                         "last_attempt_compile_seconds": round(compile_seconds, 3), "finished": time.time(), **info}
        self.write_json(STAGES, stages)  # first: a kill between the two writes leaves a stale record, ignored
        with self._running_lock:
            running = self._read_running()
            if stage in running:
                running.pop(stage)
                try:
                    self.write_json(RUNNING, running)
                except OSError:
                    pass

    def log(self, message: str) -> None:
        """One line, time-stamped, appended to log.txt."""
        self._heartbeat()  # before the line: whoever sees the line sees the attempt alive until then
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n"
        with open(self.path / LOG, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
