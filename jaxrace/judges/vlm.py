"""The VLM judge: a vision-language model compares two clips' frames for the task (host-side).

As the GT7 reward-design paper and RL-VLM-F do, it works in two stages: it first asks the
model to **describe** each clip against the task (one image per clip: a grid of frames
sampled from its video, with the race overlay), then to **decide** from the two
descriptions, as JSON (`jaxrace.llm.structured.chat_json`: structured output where the
server has it, a repaired retry where the reply is malformed). The decision is asked in
**both orders**; when the two disagree the verdict is a tie, and `stats` counts how
often that happened and how often the model picked whichever clip came first (its
position bias). A timeout, a server error or an unreadable video becomes a skip with its
reason and never stops the loop. Every request goes through the given chat backend, so a
`RecordedChat` records and replays the judge like the generator.
"""

from __future__ import annotations

import dataclasses
import io
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxrace.judges.base import Pair, Verdict
from jaxrace.llm.base import ChatBackend, LLMError, message
from jaxrace.llm.record import ReplayMiss
from jaxrace.llm.structured import chat_json

DESCRIBE = (
    "You judge an autonomous racing agent for this task: {task}\n\n"
    "The image shows {n} frames of a {seconds:.0f}-second clip, left to right then top to bottom, from the camera "
    "that follows the agent's car (the ego car), with the race overlay (position, lap, speed). Describe what the "
    "ego car does: its pace, places gained or lost, contact with other cars and whose fault it was, leaving the "
    "track, hitting walls. Be factual and brief: at most five sentences."
)
DECIDE = (
    "You judge an autonomous racing agent for this task: {task}\n\n"
    "Clip 1: {first}\n\nClip 2: {second}\n\n"
    "Which clip shows the ego car doing the task better? Answer \"first\" for clip 1, \"second\" for clip 2, or "
    "\"tie\" when neither is clearly better, with your confidence (0 to 1) and a one-sentence reason."
)
DECISION_SCHEMA = {
    "type": "object", "required": ["better", "confidence", "reason"],
    "properties": {"better": {"type": "string", "enum": ["first", "second", "tie"]},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                   "reason": {"type": "string"}}}


@dataclasses.dataclass
class VLMStats:
    """What the judge did so far: decisions asked, orders that disagreed, picks of the clip shown first."""

    pairs: int = 0
    skipped: int = 0
    disagreements: int = 0
    decisions: int = 0  # non-tie decisions over both orders
    picked_shown_first: int = 0

    @property
    def position_bias(self) -> float | None:
        """Share of non-tie decisions that picked the clip shown first (0.5: no bias)."""
        return self.picked_shown_first / self.decisions if self.decisions else None


def clip_frames(video: str | Path, n: int = 4, max_side: int = 256) -> list[np.ndarray]:
    """n frames (uint8 [H, W, 3]) evenly spaced through a video, scaled to at most `max_side` pixels."""
    import imageio.v3 as iio
    from PIL import Image

    with warnings.catch_warnings():  # ffmpeg is fork+exec'd, which is safe; JAX warns about any fork
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        frames = np.asarray(iio.imread(video, index=None))  # [T, H, W, 3]
    if frames.ndim != 4 or len(frames) == 0:
        raise ValueError(f"{video}: no frames")
    picks = np.linspace(0, len(frames) - 1, n).round().astype(int)
    out = []
    for i in picks:
        image = Image.fromarray(frames[i][..., :3])
        image.thumbnail((max_side, max_side))
        out.append(np.asarray(image))
    return out


def frame_grid(frames: Sequence[np.ndarray], cols: int = 2) -> bytes:
    """The frames tiled in a grid, as PNG bytes (what one clip looks like to the model)."""
    from PIL import Image

    h, w = frames[0].shape[:2]
    rows = -(-len(frames) // cols)
    grid = Image.new("RGB", (cols * w + (cols - 1) * 4, rows * h + (rows - 1) * 4), (255, 255, 255))
    for i, f in enumerate(frames):
        grid.paste(Image.fromarray(f), ((i % cols) * (w + 4), (i // cols) * (h + 4)))
    buffer = io.BytesIO()
    grid.save(buffer, format="PNG")
    return buffer.getvalue()


class VLMJudge:
    """Judges pairs with a vision-language model behind any chat backend (see the module docstring).

    Args:
        chat: the backend (`jaxrace.llm.open_chat(..., role="judge")` records and replays).
        task: the task in words.
        root: the folder clip video paths are relative to (the store's).
        frames: frames per clip; seconds: the clip length said in the prompt.
        options: chat options (temperature 0 by default, max_tokens).
    """

    kind = "vlm"

    def __init__(self, chat: ChatBackend, task: str, *, root: str | Path = ".", frames: int = 4,
                 seconds: float = 15.0, temperature: float = 0.0, max_tokens: int = 400):
        self.chat, self.task, self.root = chat, " ".join(task.split()), Path(root)
        self.frames, self.seconds = frames, seconds
        self.options = {"temperature": temperature, "max_tokens": max_tokens}
        self.id = f"vlm:{chat.model}:frames={frames}"
        self.stats = VLMStats()
        self._descriptions: dict[str, str] = {}

    def describe(self, video: str) -> str:
        """The model's description of one clip (asked once per video)."""
        if video not in self._descriptions:
            grid = frame_grid(clip_frames(self.root / video, self.frames))
            prompt = DESCRIBE.format(task=self.task, n=self.frames, seconds=self.seconds)
            reply = self.chat.chat([message("user", prompt, [grid])], **self.options)
            self._descriptions[video] = " ".join(reply.text.split())
        return self._descriptions[video]

    def _decide(self, first: str, second: str) -> dict:
        prompt = DECIDE.format(task=self.task, first=first, second=second)
        answer, _ = chat_json(self.chat, [message("user", prompt)], DECISION_SCHEMA, name="verdict", **self.options)
        return answer

    def judge(self, pair: Pair) -> Verdict:
        self.stats.pairs += 1
        if not pair.first_video or not pair.second_video:
            self.stats.skipped += 1
            return Verdict("skip", 0.0, "vlm judge: a clip has no video to look at")
        try:
            a, b = self.describe(pair.first_video), self.describe(pair.second_video)
            forward, backward = self._decide(a, b), self._decide(b, a)
        except ReplayMiss:
            raise  # a replay that does not match the run is an error, not a skip
        except (LLMError, OSError, ValueError) as err:
            self.stats.skipped += 1
            return Verdict("skip", 0.0, f"vlm judge failed, skipped: {err}")
        swapped = {"first": "second", "second": "first", "tie": "tie"}[backward["better"]]
        for shown in (forward["better"], backward["better"]):
            if shown != "tie":
                self.stats.decisions += 1
                self.stats.picked_shown_first += shown == "first"
        if forward["better"] == swapped:
            confidence = (float(forward["confidence"]) + float(backward["confidence"])) / 2
            return Verdict(forward["better"], confidence, forward["reason"])
        self.stats.disagreements += 1
        return Verdict("tie", 0.0, f"the two orders disagreed ({forward['better']} when shown first, "
                                   f"{swapped} when shown second), counted as a tie: {forward['reason']}")
