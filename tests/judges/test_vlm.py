"""The VLM judge against the scripted OpenAI-compatible server: describe, decide in both orders, skip on failure."""

import json

import numpy as np
import pytest

from jaxrace.judges import Pair
from jaxrace.judges.vlm import DECISION_SCHEMA, VLMJudge, clip_frames, frame_grid
from jaxrace.llm import LLMError, ReplayMiss, open_chat
from jaxrace.llm.openai_chat import OpenAIChat

pytestmark = pytest.mark.timeout(120)
TASK = "win the race cleanly"


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    from jaxrace.envs.video import write_video

    root = tmp_path_factory.mktemp("clips")
    t = np.arange(20)[:, None, None, None]
    red = np.broadcast_to(np.array([200, 30, 30], np.uint8), (20, 64, 96, 3)).copy()
    blue = np.broadcast_to(np.array([30, 30, 200], np.uint8), (20, 64, 96, 3)).copy()
    red[:, :, :8] = (t * 10).astype(np.uint8)  # frames differ over time
    paths = [write_video(f, root / name, fps=10.0) for f, name in ((red, "a.mp4"), (blue, "b.mp4"))]
    return root, [p.name for p in paths]


def pair(videos, key="p1") -> Pair:
    _, (a, b) = videos
    empty = None
    return Pair(key=key, first=empty, second=empty, first_video=a, second_video=b)


def decision(better: str, confidence: float = 0.8, reason: str = "cleaner") -> dict:
    return {"content": json.dumps({"better": better, "confidence": confidence, "reason": reason})}


def judge_for(server, root, **kw) -> VLMJudge:
    chat = OpenAIChat(server.url, "fake-vision", timeout_s=kw.pop("timeout_s", 5.0), max_retries=0)
    return VLMJudge(chat, TASK, root=root, seconds=2.0, **kw)


def test_frames_and_grid(videos):
    root, (a, _) = videos
    frames = clip_frames(root / a, 4)
    assert len(frames) == 4 and frames[0].shape == (64, 96, 3) and frames[0].dtype == np.uint8
    assert frames[0][0, 0, 0] < frames[-1][0, 0, 0]  # sampled through the clip, first to last
    png = frame_grid(frames)
    assert png.startswith(b"\x89PNG")
    import io

    from PIL import Image

    assert Image.open(io.BytesIO(png)).size == (2 * 96 + 4, 2 * 64 + 4)


def test_describe_then_decide_in_both_orders(fake_server, videos):
    root, _ = videos
    fake_server.script({"content": "Clip A: the ego car passes two cars cleanly."},
                       {"content": "Clip B: the ego car hits a car from behind."},
                       decision("first", 0.9, "A overtakes without contact"), decision("second", 0.7))
    judge = judge_for(fake_server, root)
    verdict = judge.judge(pair(videos))
    assert verdict.label == "first" and verdict.confidence == pytest.approx(0.8)
    assert verdict.rationale == "A overtakes without contact"
    log = [r["body"] for r in fake_server.log()]
    assert len(log) == 4
    describe = log[0]["messages"][0]["content"]
    assert describe[1]["image_url"]["url"].startswith("data:image/png;base64,") and "4 frames of a 2-second" in \
        describe[0]["text"]
    forward, backward = log[2]["messages"][0]["content"], log[3]["messages"][0]["content"]
    assert forward.index("passes two cars") < forward.index("hits a car")  # clip 1 = first
    assert backward.index("hits a car") < backward.index("passes two cars")  # the order swapped
    assert log[2]["response_format"]["json_schema"]["schema"] == DECISION_SCHEMA
    assert judge.stats.disagreements == 0 and judge.stats.position_bias == 0.5


def test_disagreeing_orders_become_a_tie_and_count_as_position_bias(fake_server, videos):
    root, _ = videos
    fake_server.script({"content": "A"}, {"content": "B"}, decision("first"), decision("first"))
    judge = judge_for(fake_server, root)
    verdict = judge.judge(pair(videos))
    assert verdict.label == "tie" and verdict.confidence == 0.0
    assert verdict.rationale.startswith("the two orders disagreed (first when shown first, second when shown second)")
    assert judge.stats.disagreements == 1 and judge.stats.position_bias == 1.0


def test_descriptions_are_asked_once_per_clip(fake_server, videos):
    root, _ = videos
    fake_server.script({"content": "A"}, {"content": "B"}, *[decision("second"), decision("first")] * 2)
    judge = judge_for(fake_server, root)
    judge.judge(pair(videos, "p1"))
    assert judge.judge(pair(videos, "p2")).label == "second"
    assert len(fake_server.log()) == 6  # 2 descriptions + 2 x 2 decisions


def test_malformed_answers_are_repaired_or_skipped(fake_server, videos):
    root, _ = videos
    fake_server.script({"content": "A"}, {"content": "B"}, {"content": "I pick the first one!"},
                       decision("first"), decision("second"))
    judge = judge_for(fake_server, root)
    assert judge.judge(pair(videos)).label == "first"  # the malformed answer was asked once more
    fake_server.script({"content": "A"}, {"content": "B"}, {"content": "no"}, {"content": "still no"})
    judge = judge_for(fake_server, root)
    verdict = judge.judge(pair(videos))
    assert verdict.label == "skip" and "no valid JSON answer after 2 tries" in verdict.rationale


def test_a_timeout_or_a_missing_video_is_a_skip_not_a_crash(fake_server, videos):
    root, _ = videos
    fake_server.script({"sleep": 3.0, "content": "late"})
    judge = judge_for(fake_server, root, timeout_s=0.5)
    verdict = judge.judge(pair(videos))
    assert verdict.label == "skip" and "no reply within the 0.5 s timeout" in verdict.rationale
    nothing = judge.judge(Pair("p", None, None, first_video=None, second_video="b.mp4"))
    assert nothing.label == "skip" and "no video" in nothing.rationale
    gone = judge.judge(Pair("p", None, None, first_video="missing.mp4", second_video="b.mp4"))
    assert gone.label == "skip" and "missing.mp4" in gone.rationale
    assert judge.stats.skipped == 3


def test_recorded_judge_replays_offline(fake_server, videos, tmp_path):
    root, _ = videos
    fake_server.script({"content": "A"}, {"content": "B"}, decision("second", 0.6), decision("first", 0.8))
    live = open_chat("openai", tmp_path / "r1.jsonl", base_url=fake_server.url, model="fake-vision", role="judge")
    first = VLMJudge(live, TASK, root=root).judge(pair(videos))
    fake_server.script(default={"status": 500})  # the server is of no use now
    replay = open_chat("replay", tmp_path / "r2.jsonl", replay_from=tmp_path / "r1.jsonl", role="judge")
    again = VLMJudge(replay, TASK, root=root).judge(pair(videos))
    assert again == first and again.label == "second" and len(fake_server.log()) == 0
    other = open_chat("replay", tmp_path / "r3.jsonl", replay_from=tmp_path / "r1.jsonl", role="judge")
    with pytest.raises(ReplayMiss):
        VLMJudge(other, "another task", root=root).judge(pair(videos))
    assert issubclass(ReplayMiss, LLMError)
