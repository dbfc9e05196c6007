"""The loop with the human judge: pairs queued, the page served once, labels from it, rounds of active selection."""

import itertools
import json
import threading
import time
import urllib.request

import numpy as np
from test_active_judging import CANDIDATES, SLOTS, store_clips

from jaxrace.design.config import load_config
from jaxrace.design.loop import Loop
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir


def _call(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_a_person_on_the_page_labels_the_loops_active_rounds(tmp_path):
    config = load_config("quick", judge="human", judge_selection="active", judge_budget=6, bootstrap_races=0,
                         judge_timeout_s=60.0)
    run = RunDir.open(tmp_path / "run", config)
    loop = Loop(config, run, Display(quiet=True))
    ids = store_clips(loop, tmp_path / "run")
    owner = {i: c for (c, _), i in ids.items()}
    pairs = [(f"iter1/slot{s}/c{a}~c{b}", ids[(a, s)], ids[(b, s)])
             for s in range(SLOTS) for a, b in itertools.combinations(range(CANDIDATES), 2)]
    runs = [{"candidate": f"c{c}", "seed": 0, "failed": False} for c in range(CANDIDATES)]
    judge = loop.judge()
    stop, urls, seen = threading.Event(), set(), []

    def person():  # prefers the higher-numbered candidate, as the clips' speeds say
        while not stop.is_set():
            if judge.url is None:
                time.sleep(0.05)
                continue
            urls.add(judge.url)
            state = _call(judge.url + "api/state")
            if state["pair"] is None:
                time.sleep(0.05)
                continue
            assert state["task"] == config.task
            first, second = (int(state["pair"][side].rsplit("/", 1)[1]) for side in ("first", "second"))
            seen.append((state["pair"]["key"], state["done"], state["total"]))
            label = "first" if owner[first] > owner[second] else "second"
            _call(judge.url + "api/label", {"key": state["pair"]["key"], "label": label, "annotator": "ana"})

    helper = threading.Thread(target=person, daemon=True)
    helper.start()
    try:
        records = loop._judge_active(1, pairs, "iter1", runs, np.random.default_rng(7))
    finally:
        stop.set()
        helper.join(timeout=10)
        judge.close()
    assert len(records) == 6 == len(seen) and len(urls) == 1  # one page for every round
    assert [s[1:] for s in seen[:2]] == [(0, 1), (1, 2)]  # progress counts the pairs queued so far
    prefs = loop.store.preferences(1)
    assert [(p.judge_kind, p.judge_id) for p in prefs] == [("human", "ana")] * 6
    assert all((r["label"] == "first") == (r["key"].split("/")[-1].split("~")[0] > r["key"].split("~")[1])
               for r in records)
    assert all(r["judge"] == "ana" for r in records)
    log = run.file("log.txt").read_text()
    assert f"waiting for a person to label 1 pair of clips: open {urls.pop()}" in log
