"""The preference store: clips and pairwise judgements in one SQLite file (host-side).

One file per run, shared across its iterations and written by the loop (and later by the
human judge's page). Rows are only ever added: a clip or a preference carries a `key`
that names it uniquely (for example `iter2/race0/slot1/i2-c1` for a clip), and adding a
row whose key exists returns the existing row instead, so a stage redone after a crash
never duplicates what it stored before. WAL journaling keeps the file whole when a writer
is killed mid-write (at most the transaction in flight is lost) and lets a reader work
beside a writer.

A clip row points at its arrays (`RaceView`s, actions, valid mask) in an `.npz` written
by `save_clip_arrays` beside the store, so TAC and weight tuning can compute any reward's
return of any stored clip.

Schema 2 adds the `queue` of pairs waiting for a person (the human judge's page labels
them; a queued pair is done once a preference with its key exists) and a `meta` table of
settings the page shows (the task). Older files are migrated in place when opened.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
import warnings
from pathlib import Path

import numpy as np

from jaxrace.rewards.api import NO_GAP, Action, RaceView
from jaxrace.rewards.clips import Clip

SCHEMA_VERSION = 2
LABELS = ("first", "second", "tie", "skip")
LABEL_SIGN = {"first": 1.0, "second": -1.0, "tie": 0.0, "skip": float("nan")}

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS clips (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    iteration INTEGER NOT NULL,
    candidate TEXT NOT NULL,
    seed INTEGER NOT NULL,
    race INTEGER NOT NULL,
    start INTEGER NOT NULL,
    length INTEGER NOT NULL,
    metrics TEXT NOT NULL,
    arrays TEXT NOT NULL,
    arrays_row INTEGER NOT NULL,
    video TEXT,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS preferences (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    iteration INTEGER NOT NULL,
    first INTEGER NOT NULL REFERENCES clips(id),
    second INTEGER NOT NULL REFERENCES clips(id),
    label TEXT NOT NULL CHECK (label IN ('first', 'second', 'tie', 'skip')),
    judge_kind TEXT NOT NULL,
    judge_id TEXT NOT NULL,
    confidence REAL,
    rationale TEXT NOT NULL,
    seconds REAL NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY,
    iteration INTEGER NOT NULL,
    author TEXT NOT NULL,
    text TEXT NOT NULL,
    created REAL NOT NULL
);
"""

_SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS queue (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    iteration INTEGER NOT NULL,
    first INTEGER NOT NULL REFERENCES clips(id),
    second INTEGER NOT NULL REFERENCES clips(id),
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

# (version, script) in order: a file at version v runs every script after v, one transaction each.
MIGRATIONS = ((1, _SCHEMA_V1), (2, _SCHEMA_V2))


def _statements(script: str) -> list[str]:
    """The SQL statements of a script, one by one (executescript would commit our transaction)."""
    out, current = [], ""
    for piece in script.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            if current.strip(" \n;"):
                out.append(current.strip())
            current = ""
    return out


@dataclasses.dataclass(frozen=True)
class ClipRow:
    """A stored clip: where it comes from, its race metrics and where its arrays are."""

    id: int
    key: str
    iteration: int
    candidate: str
    seed: int
    race: int
    start: int
    length: int
    metrics: dict
    arrays: str  # path of the .npz, relative to the store's folder
    arrays_row: int
    video: str | None


@dataclasses.dataclass(frozen=True)
class Preference:
    """One judgement of two clips, in the order they were shown."""

    id: int
    key: str
    iteration: int
    first: int
    second: int
    label: str
    judge_kind: str
    judge_id: str
    confidence: float | None
    rationale: str
    seconds: float


@dataclasses.dataclass(frozen=True)
class QueuedPair:
    """A pair waiting for a person: the preference key it will be stored under, and the clips' ids."""

    key: str
    iteration: int
    first: int
    second: int


# RaceView fields added after stores were first written, with the value an older clip reads
# as (it did not record them): the store's clips stay usable for TAC and the judges.
ADDED_VIEW_FIELDS = {"lane_gap_ahead": NO_GAP}


def save_clip_arrays(path: str | Path, clips: Clip) -> Path:
    """Writes clips (leading axis P) to an `.npz` atomically; rows are addressed by index."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"views.{f.name}": np.asarray(getattr(clips.views, f.name)) for f in dataclasses.fields(RaceView)}
    arrays.update({f"actions.{f.name}": np.asarray(getattr(clips.actions, f.name))
                   for f in dataclasses.fields(Action)})
    arrays["valid"] = np.asarray(clips.valid)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return path


def load_clip_arrays(path: str | Path, rows=None) -> Clip:
    """Clips (leading axis P, or the given rows) from an `.npz` of `save_clip_arrays`."""
    with np.load(Path(path)) as data:
        pick = (lambda x: x) if rows is None else (lambda x: x[np.asarray(rows)])
        def view_field(name):
            key = f"views.{name}"
            if key in data.files:
                return pick(data[key])
            if name in ADDED_VIEW_FIELDS:
                warnings.warn(f"{path} predates RaceView.{name}: its clips read it as "
                              f"{ADDED_VIEW_FIELDS[name]:g}", stacklevel=3)
                shape = pick(data["views.progress"]).shape
                return np.full(shape, ADDED_VIEW_FIELDS[name], np.float32)
            raise ValueError(f"{path}: the clips have no RaceView field '{name}'; not a clip file of this jaxrace")

        views = RaceView(**{f.name: view_field(f.name) for f in dataclasses.fields(RaceView)})
        actions = Action(**{f.name: pick(data[f"actions.{f.name}"]) for f in dataclasses.fields(Action)})
        return Clip(views=views, actions=actions, valid=pick(data["valid"]))


class PreferenceStore:
    """An append-only SQLite store of clips and preferences (see the module docstring).

    Args:
        path: the database file (created with its folder if missing).
        timeout_s: how long a write waits for another writer's lock before failing.
    """

    def __init__(self, path: str | Path, timeout_s: float = 30.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"{self.path}: preference store schema {version} is newer than this jaxrace "
                               f"understands ({SCHEMA_VERSION}); upgrade jaxrace")
        if version == SCHEMA_VERSION:
            return  # nothing to write: a current store opens read-only-safe
        for target, script in MIGRATIONS:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                # read again under the write lock: another process may have migrated meanwhile
                if self.schema_version < target:
                    for statement in _statements(f"{script} PRAGMA user_version={target};"):
                        self._db.execute(statement)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> PreferenceStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add_clip(self, key: str, *, iteration: int, candidate: str, seed: int, race: int, start: int, length: int,
                 metrics: dict, arrays: str | Path, arrays_row: int, video: str | Path | None = None) -> int:
        """The id of the clip named `key`, stored now unless it was already."""
        arrays = self._relative(arrays)
        video = None if video is None else self._relative(video)
        self._db.execute(
            "INSERT OR IGNORE INTO clips (key, iteration, candidate, seed, race, start, length, metrics, arrays, "
            "arrays_row, video, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, iteration, candidate, seed, race, start, length, json.dumps(metrics), arrays, arrays_row, video,
             time.time()))
        return int(self._db.execute("SELECT id FROM clips WHERE key = ?", (key,)).fetchone()[0])

    def add_preference(self, key: str, *, iteration: int, first: int, second: int, label: str, judge_kind: str,
                       judge_id: str, rationale: str = "", confidence: float | None = None,
                       seconds: float = 0.0) -> Preference:
        """Stores a judgement (unless one with `key` exists) and returns the stored row."""
        if label not in LABELS:
            raise ValueError(f"label must be one of {LABELS}, got {label!r}")
        if first == second:
            raise ValueError(f"a preference compares two different clips, got clip {first} twice")
        self._db.execute(
            "INSERT OR IGNORE INTO preferences (key, iteration, first, second, label, judge_kind, judge_id, "
            "confidence, rationale, seconds, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, iteration, first, second, label, judge_kind, judge_id, confidence, rationale, seconds, time.time()))
        return self.preference(key)

    def add_feedback(self, iteration: int, author: str, text: str) -> None:
        self._db.execute("INSERT INTO feedback (iteration, author, text, created) VALUES (?, ?, ?, ?)",
                         (iteration, author, text, time.time()))

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def meta(self, key: str, default: str = "") -> str:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def enqueue(self, key: str, *, iteration: int, first: int, second: int) -> None:
        """Queues a pair (first shown left) for a person under the preference key `key` (kept if queued)."""
        if first == second:
            raise ValueError(f"a pair compares two different clips, got clip {first} twice")
        self._db.execute("INSERT OR IGNORE INTO queue (key, iteration, first, second, created) VALUES (?, ?, ?, ?, ?)",
                         (key, iteration, first, second, time.time()))

    def pending(self) -> list[QueuedPair]:
        """Queued pairs with no preference yet, oldest first."""
        rows = self._db.execute("SELECT q.* FROM queue q LEFT JOIN preferences p ON p.key = q.key "
                                "WHERE p.id IS NULL ORDER BY q.id")
        return [QueuedPair(r["key"], r["iteration"], r["first"], r["second"]) for r in rows]

    def queue_progress(self, iteration: int) -> tuple[int, int]:
        """(labelled, queued) pairs of the queue for one iteration."""
        done, total = self._db.execute(
            "SELECT COUNT(p.id), COUNT(q.id) FROM queue q LEFT JOIN preferences p ON p.key = q.key "
            "WHERE q.iteration = ?", (iteration,)).fetchone()
        return int(done), int(total)

    def preference(self, key: str) -> Preference | None:
        row = self._db.execute("SELECT * FROM preferences WHERE key = ?", (key,)).fetchone()
        return None if row is None else _preference(row)

    def preferences(self, iteration: int | None = None) -> list[Preference]:
        """Every preference (of one iteration), in the order they were stored."""
        where, args = ("WHERE iteration = ?", (iteration,)) if iteration is not None else ("", ())
        return [_preference(r) for r in self._db.execute(f"SELECT * FROM preferences {where} ORDER BY id", args)]

    def clips(self, ids=None) -> list[ClipRow]:
        """Clips by id (in that order), or all of them."""
        if ids is None:
            return [_clip(r) for r in self._db.execute("SELECT * FROM clips ORDER BY id")]
        ids = [int(i) for i in ids]
        found = {r["id"]: _clip(r) for r in self._db.execute(
            f"SELECT * FROM clips WHERE id IN ({','.join('?' * len(ids))})", ids)}
        missing = [i for i in ids if i not in found]
        if missing:
            raise KeyError(f"{self.path}: no clips with ids {missing}")
        return [found[i] for i in ids]

    def feedback(self, iteration: int | None = None) -> list[tuple[int, str, str]]:
        where, args = ("WHERE iteration = ?", (iteration,)) if iteration is not None else ("", ())
        return [(r["iteration"], r["author"], r["text"])
                for r in self._db.execute(f"SELECT * FROM feedback {where} ORDER BY id", args)]

    def count_labelled(self) -> int:
        """Preferences with a label other than skip (what TAC can use)."""
        return int(self._db.execute("SELECT COUNT(*) FROM preferences WHERE label != 'skip'").fetchone()[0])

    def export_rows(self) -> list[dict]:
        """Every preference with its two clips' keys, candidates and videos, in stored order (for CSV/JSON)."""
        clips = {c.id: c for c in self.clips()}
        rows = []
        for p in self.preferences():
            a, b = clips[p.first], clips[p.second]
            rows.append({"key": p.key, "iteration": p.iteration, "first_clip": a.key, "second_clip": b.key,
                         "first_candidate": a.candidate, "second_candidate": b.candidate, "label": p.label,
                         "judge_kind": p.judge_kind, "judge_id": p.judge_id, "confidence": p.confidence,
                         "rationale": p.rationale, "seconds": p.seconds, "first_video": a.video,
                         "second_video": b.video})
        return rows

    def export(self, path: str | Path) -> Path:
        """Writes `export_rows()` as CSV (a .csv path) or JSON with the feedback too (.json); returns the path."""
        import csv

        path = Path(path)
        rows = self.export_rows()
        if path.suffix == ".csv":
            with open(path, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["key"])
                writer.writeheader()
                writer.writerows(rows)
        elif path.suffix == ".json":
            feedback = [{"iteration": i, "author": a, "text": t} for i, a, t in self.feedback()]
            path.write_text(json.dumps({"preferences": rows, "feedback": feedback}, indent=1), encoding="utf-8")
        else:
            raise ValueError(f"{path}: export to a .csv or .json file")
        return path

    def load_clips(self, rows: list[ClipRow]) -> Clip:
        """The arrays of `rows`, stacked in that order (leading axis len(rows))."""
        if not rows:
            raise ValueError("no clips to load")
        by_file: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            by_file.setdefault(r.arrays, []).append(i)
        parts, order = [], []
        for name, positions in by_file.items():
            parts.append(load_clip_arrays(self.path.parent / name, [rows[i].arrays_row for i in positions]))
            order += positions
        inverse = np.argsort(np.asarray(order))
        return _stack(parts, inverse)

    def labelled_pairs(self) -> tuple[Clip, Clip, np.ndarray]:
        """Every non-skip preference as (first clips, second clips, labels f32[P] in {+1, -1, 0}) for TAC."""
        prefs = [p for p in self.preferences() if p.label != "skip"]
        if not prefs:
            raise ValueError(f"{self.path}: no labelled preferences yet")
        clips = {c.id: c for c in self.clips(sorted({i for p in prefs for i in (p.first, p.second)}))}
        first = self.load_clips([clips[p.first] for p in prefs])
        second = self.load_clips([clips[p.second] for p in prefs])
        return first, second, np.asarray([LABEL_SIGN[p.label] for p in prefs], np.float32)

    def _relative(self, path: str | Path) -> str:
        path = Path(path)
        try:
            return str(path.resolve().relative_to(self.path.parent.resolve()))
        except ValueError:
            return str(path)


def _stack(parts: list[Clip], inverse: np.ndarray) -> Clip:
    import jax

    joined = jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
    return jax.tree.map(lambda x: x[inverse], joined)


def _preference(row: sqlite3.Row) -> Preference:
    return Preference(id=row["id"], key=row["key"], iteration=row["iteration"], first=row["first"],
                      second=row["second"], label=row["label"], judge_kind=row["judge_kind"],
                      judge_id=row["judge_id"], confidence=row["confidence"], rationale=row["rationale"],
                      seconds=row["seconds"])


def _clip(row: sqlite3.Row) -> ClipRow:
    return ClipRow(id=row["id"], key=row["key"], iteration=row["iteration"], candidate=row["candidate"],
                   seed=row["seed"], race=row["race"], start=row["start"], length=row["length"],
                   metrics=json.loads(row["metrics"]), arrays=row["arrays"], arrays_row=row["arrays_row"],
                   video=row["video"])
