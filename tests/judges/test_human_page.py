"""The human judge's page in a real headless Chromium (Debian's chromium and chromium-driver), and its waits."""

import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from jaxrace.envs.video import write_video
from jaxrace.judges.human import HumanJudge, HumanServer, token_cookie
from jaxrace.rewards.preferences import PreferenceStore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def _store_with_pairs(tmp_path, pairs=3):
    """A store with pairs + 1 clips, each with a short mp4 of its own colour, and `pairs` queued pairs."""
    store = PreferenceStore(tmp_path / "preferences.sqlite")
    store.set_meta("task", "win the race cleanly")
    ids = []
    for i in range(pairs + 1):
        frames = np.zeros((30, 48, 64, 3), np.uint8)
        frames[..., i % 3] = 60 + 40 * i
        for t in range(30):  # a bar that grows: the clip moves
            frames[t, :8, : 2 + 2 * t] = 255
        video = write_video(frames, tmp_path / "videos" / f"c{i}.mp4")
        ids.append(store.add_clip(f"c{i}", iteration=1, candidate=f"cand{i}", seed=0, race=0, start=0, length=30,
                                  metrics={}, arrays=tmp_path / "clips.npz", arrays_row=i, video=video))
    for j in range(pairs):
        store.enqueue(f"iter1/pair{j}", iteration=1, first=ids[j], second=ids[j + 1])
    store.set_meta("iteration", "1")
    return store, ids


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        message = "needs chromium and chromedriver (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--autoplay-policy=no-user-gesture-required"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def _wait(condition, what, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _videos(driver):
    return driver.execute_script(
        "return ['first', 'second'].map(id => { const v = document.getElementById(id);"
        " return {ready: v.readyState, paused: v.paused, t: v.currentTime, rate: v.playbackRate,"
        " width: v.videoWidth, src: v.currentSrc, error: v.error && v.error.code}; });")


def test_a_person_labels_pairs_with_keys_types_feedback_and_a_reload_resumes(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    store, ids = _store_with_pairs(tmp_path)
    labelled = []
    with HumanServer(store.path, on_label=labelled.append) as server:
        assert server.token is None and server.url == f"http://127.0.0.1:{server.port}/"
        browser.get(server.url)
        _wait(lambda: all(v["ready"] >= 2 for v in _videos(browser)), "both videos to load")
        first, second = _videos(browser)
        assert (first["width"], second["width"]) == (64, 64) and first["error"] is None
        assert first["src"].endswith(f"/clip/{ids[0]}") and second["src"].endswith(f"/clip/{ids[1]}")
        assert "win the race cleanly" in browser.find_element(By.ID, "task-text").text
        assert browser.find_element(By.ID, "progress-text").text == "pair 1 of 3"
        _wait(lambda: all(not v["paused"] and v["t"] > 0.2 for v in _videos(browser)), "both videos to play")
        body = browser.find_element(By.TAG_NAME, "body")
        body.send_keys(Keys.SPACE)  # pause both
        _wait(lambda: all(v["paused"] for v in _videos(browser)), "space to pause both")
        a, b = _videos(browser)
        assert abs(a["t"] - b["t"]) < 0.3, (a, b)  # in step
        body.send_keys(Keys.SPACE)
        _wait(lambda: not any(v["paused"] for v in _videos(browser)), "space to play both again")
        Select(browser.find_element(By.ID, "speed")).select_by_visible_text("2")
        a, b = _videos(browser)
        assert a["rate"] == 2 and 1.5 <= b["rate"] <= 2.5  # the right clip's rate is nudged to stay in step
        browser.save_screenshot(str(tmp_path / "page.png"))

        browser.find_element(By.ID, "annotator").send_keys("ana")
        browser.find_element(By.TAG_NAME, "body").click()
        body.send_keys(Keys.ARROW_LEFT)
        _wait(lambda: browser.find_element(By.ID, "progress-text").text == "pair 2 of 3", "the second pair")
        assert labelled == ["iter1/pair0"]

        browser.refresh()  # a reload resumes at the first unlabelled pair, with the annotator kept
        _wait(lambda: browser.find_element(By.ID, "progress-text").text == "pair 2 of 3", "the reload to resume")
        assert browser.find_element(By.ID, "annotator").get_attribute("value") == "ana"
        assert _videos(browser)[0]["src"].endswith(f"/clip/{ids[1]}")
        box = browser.find_element(By.ID, "feedback")
        box.send_keys("brakes too early; s and arrows typed here label nothing " + Keys.ARROW_LEFT)
        browser.find_element(By.ID, "send-feedback").click()
        _wait(lambda: "saved" in browser.find_element(By.ID, "feedback-status").text, "feedback to be saved")
        assert labelled == ["iter1/pair0"]  # typing in the box labelled nothing
        body = browser.find_element(By.TAG_NAME, "body")
        body.send_keys(Keys.ARROW_RIGHT)
        _wait(lambda: browser.find_element(By.ID, "progress-text").text == "pair 3 of 3", "the third pair")
        body.send_keys("s")
        _wait(lambda: browser.find_element(By.ID, "done").is_displayed(), "the page to say all are done")
        assert browser.find_element(By.ID, "progress-text").text == "3 of 3 labelled"

    rows = [(p.key, p.label, p.judge_kind, p.judge_id, p.first, p.second) for p in store.preferences()]
    assert rows == [("iter1/pair0", "first", "human", "ana", ids[0], ids[1]),
                    ("iter1/pair1", "second", "human", "ana", ids[1], ids[2]),
                    ("iter1/pair2", "skip", "human", "ana", ids[2], ids[3])]
    assert all(0 < p.seconds < 60 for p in store.preferences())
    assert store.feedback() == [(1, "human:ana", "brakes too early; s and arrows typed here label nothing")]
    assert store.pending() == []
    store.close()


def _request(url, body=None, cookie=None, host=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} | (
        {"Cookie": cookie} if cookie else {}) | ({"Host": host} if host else {}))
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            status, raw, headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as err:
        status, raw, headers = err.code, err.read(), err.headers
    is_json = headers.get("Content-Type", "").startswith("application/json")
    return status, json.loads(raw) if is_json else raw.decode(), headers


def test_the_api_rejects_bad_labels_and_another_address_needs_the_token(tmp_path):
    store, ids = _store_with_pairs(tmp_path, pairs=1)
    with HumanServer(store.path) as server:
        base = server.url
        assert _request(base + "api/label", {"key": "iter1/pair0", "label": "left"})[:2] == (
            400, {"error": "label must be one of first, second, tie, skip, got 'left'"})
        assert _request(base + "api/label", {"key": "nope", "label": "tie"})[0] == 404
        assert _request(base + "api/label", {"key": "iter1/pair0", "label": "tie", "seconds": 3})[0] == 200
        status, body, _ = _request(base + "api/label", {"key": "iter1/pair0", "label": "first"})
        assert status == 409 and "already labelled (tie by anonymous)" in body["error"]
        assert _request(base + "api/feedback", {"iteration": 1, "text": "  "})[0] == 400
        assert _request(base + f"clip/{ids[0] + 100}")[:2] == (404, {"error": f"not found: /clip/{ids[0] + 100}"})
        # A page from another site rebound by DNS to 127.0.0.1 names its own host: refused.
        status, body, _ = _request(base + "api/state", host=f"evil.example:{server.port}")
        assert status == 403 and "loopback address only, not 'evil.example:" in body["error"]
        assert _request(base + "api/state", host=f"localhost:{server.port}")[0] == 200
    assert [(p.label, p.seconds) for p in store.preferences()] == [("tie", 3.0)]

    with HumanServer(store.path, host="127.0.0.2") as server:  # not loopback's usual address: a token
        assert server.token and server.url.endswith(f"/?token={server.token}")
        base = f"http://127.0.0.2:{server.port}/"
        status, body, _ = _request(base + "api/state")
        assert status == 403 and "token" in body["error"]
        status, _, headers = _request(base + "api/state?token=wrong")
        assert status == 403 and headers.get("Set-Cookie") is None  # a wrong token learns nothing
        status, body, headers = _request(server.url)  # the page, once with the token: it sets the cookie
        cookie = token_cookie(server.token)
        assert status == 200 and headers["Set-Cookie"].startswith(f"{cookie}={server.token};")
        assert "HttpOnly" in headers["Set-Cookie"]
        status, body, _ = _request(base + "api/state", cookie=f"{cookie}={server.token}")
        assert status == 200 and body["done"] == 1 and body["pair"] is None
        assert _request(base + "api/state", cookie=f"{cookie}=wrong")[0] == 403
    assert token_cookie("a") != token_cookie("b")  # two runs' pages in one browser keep their cookies
    store.close()


def test_a_label_that_loses_a_race_is_refused_not_reported_saved(tmp_path, monkeypatch):
    store, ids = _store_with_pairs(tmp_path, pairs=1)
    (queued,) = store.pending()
    store.add_preference(queued.key, iteration=1, first=queued.first, second=queued.second, label="skip",
                         judge_kind="human", judge_id="timeout")
    # The page checked the queue before the timeout's skip went in: it still sees the pair pending.
    monkeypatch.setattr(PreferenceStore, "pending", lambda self: [queued])
    with HumanServer(store.path) as server:
        status, body, _ = _request(server.url + "api/label", {"key": queued.key, "label": "first"})
    assert status == 409 and body["error"] == f"pair {queued.key!r} is already labelled (skip by timeout)"
    assert [(p.label, p.judge_id) for p in store.preferences()] == [("skip", "timeout")]
    store.close()


def test_the_judge_waits_for_labels_from_the_page_and_turns_a_timeout_into_skips(tmp_path):
    store, ids = _store_with_pairs(tmp_path, pairs=2)
    pairs = [("iter2/a", ids[0], ids[1]), ("iter2/b", ids[2], ids[1])]
    messages = []

    def person():  # labels the first pair through the page, as a browser would, 1 s after the URL is out
        _wait(lambda: messages, "the judge to print its URL")
        url = messages[0].split("open ")[1].split(" ")[0]
        time.sleep(1.0)
        assert _request(url + "api/label", {"key": "iter2/a", "label": "second", "annotator": "bo"})[0] == 200

    helper = threading.Thread(target=person)
    helper.start()
    judge = HumanJudge(store, timeout_s=1.5, notify=messages.append, poll_s=0.5)
    t0 = time.monotonic()
    verdicts = judge.judge_many(2, pairs)
    helper.join(timeout=10)
    # An idle timeout: the label at 1 s gave another 1.5 s (a fixed deadline would end at 1.5 s).
    assert 2.4 < time.monotonic() - t0 < 10
    assert "waiting for a person to label 2 pairs" in messages[0] and "after 2 s without a label" in messages[0]
    assert verdicts["iter2/a"].label == "second"
    assert verdicts["iter2/b"].label == "skip"
    assert verdicts["iter2/b"].rationale == "no label for 2 s (idle timeout)"
    rows = {p.key: (p.judge_id, p.first, p.second) for p in store.preferences(2)}
    assert rows == {"iter2/a": ("bo", ids[0], ids[1]), "iter2/b": ("timeout", ids[2], ids[1])}
    url = judge.url
    again = judge.judge_many(2, pairs)  # all stored: returns at once, asks nothing
    assert {k: v.label for k, v in again.items()} == {"iter2/a": "second", "iter2/b": "skip"}
    assert len(messages) == 1
    judge.timeout_s = 0.2
    judge.judge_many(3, [("iter3/a", ids[1], ids[0])])  # the next round: the same page, the same URL
    assert messages[1].endswith(f"open {url} (after 0 s without a label, the pairs left become skips)")
    assert _request(url + "api/state")[1]["pair"]["key"] == "iter1/pair0"  # still served: the oldest queued
    judge.close()
    assert judge.url is None
    store.close()
