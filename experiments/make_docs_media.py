"""Frames and a short GIF of the built-in AI racing, for the README (written to docs/).

Usage: python experiments/make_docs_media.py
"""

from __future__ import annotations

from pathlib import Path

import imageio.v2 as imageio
import jax
import numpy as np

import jaxrace
from jaxrace.envs.render import make_textures
from jaxrace.envs.rollouts import trajectory
from jaxrace.envs.video import overlay, render_frames, write_video

DOCS = Path(__file__).resolve().parents[1] / "docs"


def main() -> None:
    DOCS.mkdir(exist_ok=True)
    env, params = jaxrace.make(track="gp", num_opponents=7, laps=2, start="grid_back")
    params = params.replace(textures=make_textures(params.tracks, 2048))
    states = jax.jit(trajectory, static_argnums=(0, 3))(env, params, jax.random.key(7), 700)
    clip = jax.tree.map(lambda x: x[400:460], states)  # 6 s mid-race
    chase = overlay(render_frames(env, params, clip), clip, params)
    write_video(chase, DOCS / "race.gif", fps=10)
    imageio.imwrite(DOCS / "chase_320x180.png", chase[30])
    topdown = render_frames(env, params, clip, size=(180, 320), camera="topdown")
    imageio.imwrite(DOCS / "topdown_320x180.png", topdown[30])
    obs = render_frames(env, params, jax.tree.map(lambda x: x[430:431], states), size=(64, 64))[0]
    imageio.imwrite(DOCS / "obs_64x64.png", np.kron(obs, np.ones((3, 3, 1), np.uint8)))  # shown 3x
    for path in sorted(DOCS.iterdir()):
        print(f"{path.relative_to(DOCS.parent)}: {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
