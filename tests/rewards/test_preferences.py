import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from jaxrace.rewards import NO_GAP, synthetic
from jaxrace.rewards.clips import Clip
from jaxrace.rewards.preferences import SCHEMA_VERSION, PreferenceStore, load_clip_arrays, save_clip_arrays


def clips(n: int, t: int = 4, offset: float = 0.0) -> Clip:
    """n clips of t transitions whose progress starts at offset + clip index (to tell them apart)."""
    view = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (n, t + 1)).copy(), synthetic.view())
    view = view.replace(progress=(offset + np.arange(n, dtype=np.float32))[:, None] + np.zeros((1, t + 1), np.float32))
    action = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (n, t)).copy(), synthetic.action())
    return Clip(views=view, actions=action, valid=np.ones((n, t), bool))


def add(store, path, n, iteration=1, prefix="c"):
    return [store.add_clip(f"{prefix}{i}", iteration=iteration, candidate=f"cand{i}", seed=0, race=0, start=0,
                           length=4, metrics={"progress": float(i)}, arrays=path, arrays_row=i) for i in range(n)]


def test_rows_are_added_once_per_key_and_pairs_load_in_order(tmp_path):
    store = PreferenceStore(tmp_path / "prefs.sqlite")
    a = save_clip_arrays(tmp_path / "a.npz", clips(3))
    b = save_clip_arrays(tmp_path / "b.npz", clips(2, offset=10.0))
    ids = add(store, a, 3) + add(store, b, 2, prefix="d")
    assert add(store, a, 3) == ids[:3]  # same keys: the same rows, nothing new
    assert len(store.clips()) == 5 and store.clips([ids[4]])[0].arrays == "b.npz"
    store.add_preference("p1", iteration=1, first=ids[0], second=ids[4], label="second", judge_kind="scripted",
                         judge_id="s", rationale="d1 went further")
    store.add_preference("p2", iteration=1, first=ids[3], second=ids[1], label="tie", judge_kind="scripted",
                         judge_id="s")
    store.add_preference("p3", iteration=2, first=ids[2], second=ids[1], label="skip", judge_kind="human",
                         judge_id="ann")
    again = store.add_preference("p1", iteration=1, first=ids[0], second=ids[4], label="first",
                                 judge_kind="scripted", judge_id="s")
    assert again.label == "second"  # the first verdict stays: rows are never rewritten
    assert store.count_labelled() == 2 and len(store.preferences(iteration=2)) == 1
    first, second, labels = store.labelled_pairs()
    np.testing.assert_array_equal(labels, [-1.0, 0.0])
    np.testing.assert_array_equal(first.views.progress[:, 0], [0.0, 10.0])
    np.testing.assert_array_equal(second.views.progress[:, 0], [11.0, 1.0])
    with pytest.raises(ValueError, match="label must be"):
        store.add_preference("p4", iteration=1, first=ids[0], second=ids[1], label="left", judge_kind="x",
                             judge_id="x")
    with pytest.raises(KeyError, match="no clips with ids"):
        store.clips([999])
    store.close()


def test_clip_arrays_round_trip(tmp_path):
    c = clips(3)
    back = load_clip_arrays(save_clip_arrays(tmp_path / "c.npz", c), rows=[2, 0])
    for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(jax.tree.map(lambda v: np.asarray(v)[[2, 0]], c)),
                    strict=True):
        np.testing.assert_array_equal(x, y)
        assert x.dtype == y.dtype


def test_clips_written_before_lane_gap_ahead_existed_load_with_no_car_in_lane(tmp_path):
    path = save_clip_arrays(tmp_path / "c.npz", clips(3))
    with np.load(path) as data:
        old = {k: data[k] for k in data.files if k != "views.lane_gap_ahead"}
    np.savez(tmp_path / "old.npz", **old)
    with pytest.warns(UserWarning, match="old.npz predates RaceView.lane_gap_ahead"):
        back = load_clip_arrays(tmp_path / "old.npz", rows=[1])
    assert back.views.lane_gap_ahead.shape == (1, 5) and back.views.lane_gap_ahead.dtype == np.float32
    assert np.all(back.views.lane_gap_ahead == NO_GAP)
    np.testing.assert_array_equal(back.views.progress, np.full((1, 5), 1.0, np.float32))
    # Any other missing field is not a clip file of this jaxrace: said with the path.
    np.savez(tmp_path / "bad.npz", **{k: v for k, v in old.items() if k != "views.speed"})
    with pytest.raises(ValueError, match="bad.npz.*no RaceView field 'speed'"):
        load_clip_arrays(tmp_path / "bad.npz")


WRITER = textwrap.dedent("""
    import sys
    from jaxrace.rewards.preferences import PreferenceStore
    store = PreferenceStore(sys.argv[1])
    ids = [c.id for c in store.clips()]
    for i in range(int(sys.argv[3])):
        store.add_preference(f"{sys.argv[2]}-{i}", iteration=1, first=ids[0], second=ids[1], label="first",
                             judge_kind="scripted", judge_id=sys.argv[2])
        if i == 5:
            print("writing", flush=True)
""")


def test_two_writers_at_once_and_a_killed_writer(tmp_path):
    path = tmp_path / "prefs.sqlite"
    with PreferenceStore(path) as store:
        add(store, save_clip_arrays(tmp_path / "a.npz", clips(2)), 2)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, "150"], env=env,
                                stdout=subprocess.PIPE) for name in ("loop", "page")]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    # A writer killed mid-stream: the file stays whole and keeps every committed row.
    victim = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "victim", "100000"], env=env,
                              stdout=subprocess.PIPE)
    assert victim.stdout.readline().strip() == b"writing"
    time.sleep(0.3)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    with PreferenceStore(path) as store:
        judges = [p.judge_id for p in store.preferences()]
        assert judges.count("loop") == 150 and judges.count("page") == 150
        killed = [p.key for p in store.preferences() if p.judge_id == "victim"]
        assert len(killed) > 5 and killed == [f"victim-{i}" for i in range(len(killed))]  # no gap, no duplicate
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(RuntimeError, match="newer than this jaxrace"):
        PreferenceStore(path)


def test_a_schema_1_file_is_migrated_in_place_and_keeps_its_rows(tmp_path):
    from jaxrace.rewards.preferences import MIGRATIONS

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)  # a file as jaxrace wrote it before the queue existed
    db.executescript(MIGRATIONS[0][1] + "PRAGMA user_version=1;")
    db.execute("INSERT INTO clips (key, iteration, candidate, seed, race, start, length, metrics, arrays, arrays_row,"
               " created) VALUES ('c0', 1, 'a', 0, 0, 0, 4, '{}', 'x.npz', 0, 0), "
               "('c1', 1, 'b', 0, 0, 0, 4, '{}', 'x.npz', 1, 0)")
    db.execute("INSERT INTO preferences (key, iteration, first, second, label, judge_kind, judge_id, rationale, "
               "seconds, created) VALUES ('p', 1, 1, 2, 'first', 'scripted', 's', '', 0, 0)")
    db.commit()
    db.close()
    with PreferenceStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 2
        assert [p.key for p in store.preferences()] == ["p"] and len(store.clips()) == 2
        store.enqueue("p", iteration=1, first=1, second=2)  # already judged: not pending
        store.enqueue("q", iteration=1, first=2, second=1)
        store.enqueue("q", iteration=1, first=1, second=2)  # same key: kept as first queued
        assert [(q.key, q.first, q.second) for q in store.pending()] == [("q", 2, 1)]
        assert store.queue_progress(1) == (1, 2) and store.queue_progress(2) == (0, 0)
        store.set_meta("task", "drive")
        store.set_meta("task", "win")
        assert store.meta("task") == "win" and store.meta("missing", "-") == "-"
        with pytest.raises(ValueError, match="two different clips"):
            store.enqueue("r", iteration=1, first=1, second=1)
    with PreferenceStore(path) as again:  # opening a current file migrates nothing
        assert again.schema_version == 2 and [q.key for q in again.pending()] == ["q"]
