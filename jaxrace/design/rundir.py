"""The run directory: atomic writes, finished stages, the config it was made with, a log (host-side).

Every file is written to a temporary name, flushed to disk and renamed into place, so a
run killed at any moment leaves each file either as it was or complete. `stages.json`
lists the finished stages with their wall time; a stage is marked finished only after
all its files are written, so resuming redoes at most the stage that was running.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from jaxrace.design.config import OPERATIONAL, PREDATED_VALUES, DesignConfig

CONFIG = "config.json"
STAGES = "stages.json"
LOG = "log.txt"


class ConfigMismatch(ValueError):
    """The run directory was made with a different configuration."""


def _json_default(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"cannot write a {type(x).__name__} as JSON")


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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
    return str(value).lower() if isinstance(value, bool) else repr(value)


class RunDir:
    """One reward-design run on disk."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

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
                               if getattr(old, k) == v != getattr(config, k))
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
        """{stage: {"seconds": s, "finished": unix time, ...}} of the finished stages."""
        return self.read_json(STAGES) if self.exists(STAGES) else {}

    def done(self, stage: str) -> bool:
        return stage in self.stages()

    def mark_done(self, stage: str, seconds: float, **info) -> None:
        stages = self.stages()
        stages[stage] = {"seconds": round(seconds, 3), "finished": time.time(), **info}
        self.write_json(STAGES, stages)

    def log(self, message: str) -> None:
        """One line, time-stamped, appended to log.txt."""
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n"
        with open(self.path / LOG, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
