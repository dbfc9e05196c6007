"""Videos of recorded trajectories, for judges (VLM or people) and for the README.

A trajectory is a stacked `EnvState` (leading axis T). Frames come from the same
renderer as the pixel observations, at a larger size; the overlay (speed, lap, position,
gap to the car ahead, and a map of the circuit with every car) is drawn on the host.
Files are mp4 (imageio-ffmpeg), or GIF when ffmpeg is not available.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from jaxrace.envs.laps import gaps
from jaxrace.envs.race import RaceEnv
from jaxrace.envs.render import CLASS, PALETTE, PALETTE32, make_renderer, make_textures
from jaxrace.envs.state import EnvParams, EnvState
from jaxrace.jit import jit
from jaxrace.rewards.api import NO_GAP

VIDEO_SIZE = (180, 320)  # (H, W)
MAP_SIZE = 64  # px, the picture-in-picture map


def render_frames(env: RaceEnv, params: EnvParams, states: EnvState, *, size=VIDEO_SIZE, camera: str = "chase",
                  car: int = 0, chunk: int = 64) -> np.ndarray:
    """uint8[T, H, W, 3]: `car`'s camera over a trajectory `states` (leading axis T)."""
    static = dataclasses.replace(env.static, pixels=True, image_size=tuple(size), camera=camera)
    textures = params.textures if params.textures is not None else make_textures(params.tracks, static.texture_size)
    frames_of = _frames_program(static)
    states = jax.device_get(states)  # chunks sliced on the host: eager slices would compile one program each
    t = states.time.shape[0]
    out = [np.asarray(frames_of(textures, jax.tree.map(lambda x, i=i: x[i:i + chunk], states), car))
           for i in range(0, t, chunk)]
    return np.concatenate(out)


@functools.cache
def _frames_program(static) -> Callable:
    """`(textures, states [T], car) -> uint8[T, H, W, 3]`, one jitted program per static config.

    Kept across calls, with the textures an argument rather than a constant, so every clip
    of a run (and every run in a process) reuses one compiled program per clip length.
    """
    return jit(jax.vmap(make_renderer(static), in_axes=(None, 0, None)), renders=True)


def _track_map(params: EnvParams, track: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(uint8[M, M, 3] map, world origin, metres per map pixel) from the ground texture."""
    textures = params.textures if params.textures is not None else make_textures(params.tracks)
    texels = np.asarray(textures.texels[track])
    stride = max(1, texels.shape[0] // MAP_SIZE)
    small = texels[::stride, ::stride][:MAP_SIZE, :MAP_SIZE]
    surface = [PALETTE32[CLASS[name]] for name in ("tarmac", "kerb_red", "kerb_white", "line")]
    tarmac = np.isin(small, surface)  # the circuit's shape
    image = np.where(tarmac[..., None], np.uint8(230), np.uint8(40)).repeat(3, -1)
    return image, np.asarray(textures.origin[track]), float(textures.texel_size[track]) * stride


def overlay(frames: np.ndarray, states: EnvState, params: EnvParams, car: int = 0) -> np.ndarray:
    """Frames with speed, lap, position and gap to the car ahead, and a map of all cars."""
    from PIL import Image, ImageDraw

    frames = np.array(frames)
    c = jax.tree.map(np.asarray, states.cars)
    active = np.asarray(states.active)
    track = int(max(np.asarray(states.track_index).ravel()[0], 0))
    base_map, origin, metres = _track_map(params, track)
    laps_total = int(np.asarray(params.laps))
    gap_ahead = np.asarray(jax.vmap(gaps, in_axes=(0, 0, 0, None))(c.progress, c.rank, active, car)[0])
    for t in range(frames.shape[0]):
        image = Image.fromarray(frames[t])
        draw = ImageDraw.Draw(image)
        speed = float(np.hypot(c.body.vx[t, car], c.body.vy[t, car])) * 3.6
        rank = int(c.rank[t, car])
        gap = f"{float(gap_ahead[t]):.0f} m" if gap_ahead[t] < NO_GAP else "-"
        lap = min(int(c.laps[t, car]) + 1, laps_total)
        text = f"{speed:3.0f} km/h  lap {lap}/{laps_total}  P{rank}/{int(active[t].sum())}  gap {gap}"
        draw.rectangle([0, 0, image.width, 12], fill=(0, 0, 0))
        draw.text((3, 1), text, fill=(255, 255, 255))
        pip = base_map.copy()
        for k in np.flatnonzero(active[t]):
            mx = int((c.body.x[t, k] - origin[0]) / metres)
            my = int((c.body.y[t, k] - origin[1]) / metres)
            colour = PALETTE[CLASS["ego"]] if k == car else np.array([220, 40, 40], np.uint8)
            pip[max(my - 1, 0):my + 2, max(mx - 1, 0):mx + 2] = colour
        pip = np.flipud(pip)  # world y up
        h, w = pip.shape[:2]
        if image.height >= h + 16 and image.width >= w + 4:
            image.paste(Image.fromarray(pip), (image.width - w - 2, image.height - h - 2))
        frames[t] = np.asarray(image)
    return frames


def write_video(frames: np.ndarray, path: str | Path, fps: float = 10.0) -> Path:
    """Writes uint8[T, H, W, 3] as mp4 (or as GIF beside it when ffmpeg fails). Returns the path written."""
    import imageio.v2 as imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() != ".gif":
        try:
            imageio.mimwrite(path, list(frames), fps=fps, codec="libx264", quality=7, macro_block_size=1)
            if path.is_file() and path.stat().st_size > 0:
                return path
        except Exception:  # noqa: BLE001 (no ffmpeg, or a broken one: fall back to GIF)
            pass
        path.unlink(missing_ok=True)  # a writer that failed may have left part of a file
        path = path.with_suffix(".gif")
    imageio.mimwrite(path, list(frames), duration=1000.0 / fps, loop=0)
    return path


def render_clip(env: RaceEnv, params: EnvParams, states: EnvState, path: str | Path, *, start: int = 0,
                seconds: float = 15.0, size=VIDEO_SIZE, camera: str = "chase", car: int = 0) -> Path:
    """Cuts `seconds` of a trajectory from step `start`, renders it with the overlay and writes it.

    The clip is clamped to the trajectory; every clip of the same length has the same
    number of frames (one per agent step), so judges compare like with like.
    """
    t = states.time.shape[0]
    n = int(round(seconds / env.static.dt))
    if n < 1 or n > t:
        raise ValueError(f"a {seconds} s clip is {n} steps; the trajectory has {t}")
    start = int(np.clip(start, 0, t - n))
    clip = jax.tree.map(lambda x: x[start:start + n], states)
    frames = overlay(render_frames(env, params, clip, size=size, camera=camera, car=car), clip, params, car)
    return write_video(frames, path, fps=1.0 / env.static.dt)


__all__ = ["VIDEO_SIZE", "overlay", "render_clip", "render_frames", "write_video"]
