"""Where tracks come from: built-in layouts, a seeded generator, and the CSV loader.

Built-in and generated circuits are polygons whose corners are rounded by circular
arcs of a given radius (straights joined by constant-radius corners, as circuits are
drawn); `build_track` then smooths and samples them. All host-side.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxrace.envs.track import Track, TrackError
from jaxrace.envs.track_build import build_track

# Real circuits (not shipped; centre lines from the TUM racetrack database, see the
# README): length in km and the band of dry GT3 qualifying laps in s (public race
# reports, 2019-2024), for calibrating the car and the reference lap.
REAL_CIRCUITS = {
    "Monza": (5.79, (104.7, 107.0)),
    "Spa": (7.00, (133.7, 137.4)),
    "Silverstone": (5.89, (116.6, 119.0)),
    "BrandsHatch": (3.91, (82.5, 84.5)),
}


def filleted_polygon(vertices, radii, spacing: float = 1.0) -> np.ndarray:
    """Dense points of a closed polygon whose corners are arcs of the given radii.

    Args:
        vertices: f[K, 2] corners in driving order.
        radii: f[K] corner radii (m); shrunk where two corners would overlap on an edge.
        spacing: distance between output points (m).

    Returns:
        f64[M, 2] points starting at the middle of the edge from vertex 0 to vertex 1.
    """
    p = np.asarray(vertices, np.float64)
    r = np.asarray(radii, np.float64) * np.ones(len(p))
    d_in = p - np.roll(p, 1, axis=0)
    d_out = np.roll(p, -1, axis=0) - p
    len_out = np.linalg.norm(d_out, axis=1)
    u_in = d_in / np.linalg.norm(d_in, axis=1)[:, None]
    u_out = d_out / len_out[:, None]
    turn = np.arctan2(u_in[:, 0] * u_out[:, 1] - u_in[:, 1] * u_out[:, 0], np.sum(u_in * u_out, axis=1))
    tan_half = np.tan(np.abs(turn) / 2.0)
    # Each edge gives its two corners at most the share of it they ask for.
    for _ in range(4):
        reach = r * tan_half
        need = reach + np.roll(reach, -1)
        scale = np.minimum(1.0, 0.98 * len_out / np.maximum(need, 1e-9))
        r = r * np.minimum(scale, np.roll(scale, 1))
    reach = r * tan_half
    pieces = []
    for k in range(len(p)):
        a = p[k] - u_in[k] * reach[k]
        left = np.array([-u_in[k, 1], u_in[k, 0]])
        sign = np.sign(turn[k]) if turn[k] != 0 else 1.0
        centre = a + left * r[k] * sign
        start = np.arctan2(*(a - centre)[::-1])
        steps = max(2, int(np.ceil(abs(turn[k]) * r[k] / spacing)))
        ang = start + sign * np.linspace(0.0, abs(turn[k]), steps)
        pieces.append(centre + r[k] * np.stack([np.cos(ang), np.sin(ang)], axis=1))
        b = p[k] + u_out[k] * reach[k]
        nxt = p[(k + 1) % len(p)] - u_out[k] * reach[(k + 1) % len(p)]
        steps = max(2, int(np.ceil(np.linalg.norm(nxt - b) / spacing)))
        pieces.append(b + np.linspace(0.0, 1.0, steps)[1:-1, None] * (nxt - b))
    path = np.concatenate(pieces)
    # Start the lap in the middle of the first straight.
    mid = 0.5 * (p[0] + p[1])
    first = int(np.argmin(np.linalg.norm(path - mid, axis=1)))
    path = np.roll(path, -first, axis=0)
    keep = np.concatenate([[True], np.linalg.norm(np.diff(path, axis=0), axis=1) > 1e-6])
    return path[keep]


# Built-in layouts designed for jaxrace: (vertices in m, corner radii in m, half width m).
_LAYOUTS = {
    # A 2.3 km speed bowl: two long straights, two 150 m radius turns.
    "oval": (
        [(0, 0), (1000, 0), (1000, 300), (0, 300)],
        [150, 150, 150, 150],
        7.0,
    ),
    # A 2.5 km technical club circuit: hairpins, a chicane, an esses section.
    "club": (
        [(0, 0), (620, 0), (700, 230), (480, 260), (440, 430), (170, 470),
         (240, 300), (60, 250), (-140, 380), (-230, 140)],
        [45, 30, 22, 35, 60, 15, 25, 30, 55, 70],
        5.5,
    ),
    # A 4.3 km grand-prix circuit: a long main straight into a hairpin, fast sweepers,
    # a chicane on the back straight, a long double-apex right-hander.
    "gp": (
        [(0, 0), (1250, 0), (1320, 180), (1150, 240), (1300, 520), (1050, 820),
         (700, 700), (650, 740), (300, 780), (150, 600), (-250, 520), (-320, 250), (-200, 60)],
        [20, 30, 90, 200, 70, 120, 18, 120, 40, 250, 60, 80, 60],
        7.0,
    ),
}


def _figure_eight(spacing: float = 1.0) -> np.ndarray:
    """A 3.2 km figure-eight (lemniscate of Gerono) that crosses itself at a bridge."""
    a = 520.0
    # Start on the long arc of a lobe, away from the crossing at the origin.
    t = np.linspace(0.0, 2.0 * np.pi, 20000, endpoint=False) + 0.5 * np.pi + 0.6
    pts = np.stack([a * np.cos(t), a * np.sin(t) * np.cos(t)], axis=1)
    seg = np.linalg.norm(np.diff(pts, axis=0, append=pts[:1]), axis=1)
    s = np.concatenate([[0.0], np.cumsum(seg)])
    st = np.arange(0.0, s[-1], spacing)
    closed = np.vstack([pts, pts[:1]])
    return np.stack([np.interp(st, s, closed[:, 0]), np.interp(st, s, closed[:, 1])], axis=1)


BUILTIN_TRACKS = (*_LAYOUTS, "figure_eight")


def builtin_track(name: str, *, num_points: int = 2048, **build_kwargs) -> Track:
    """One of the circuits designed for jaxrace: 'oval', 'club', 'gp', 'figure_eight'."""
    if name == "figure_eight":
        return build_track(_figure_eight(), 6.0, 6.0, num_points=num_points, where=name, **build_kwargs)
    if name not in _LAYOUTS:
        raise KeyError(f"unknown built-in track {name!r}; choose one of {', '.join(BUILTIN_TRACKS)}")
    vertices, radii, half_width = _LAYOUTS[name]
    xy = filleted_polygon(vertices, radii)
    return build_track(xy, half_width, half_width, num_points=num_points, where=name, **build_kwargs)


def _min_clearance(xy, skip_m: float) -> float:
    """Smallest distance between points more than `skip_m` apart along the loop."""
    pts = xy[:: max(1, len(xy) // 600)]
    step = np.mean(np.linalg.norm(np.diff(pts, axis=0), axis=1))
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    idx = np.arange(len(pts))
    sep = np.abs(idx[:, None] - idx[None])
    sep = np.minimum(sep, len(pts) - sep) * step
    return float(np.min(np.where(sep > skip_m, d, np.inf)))


def procedural_track(
    seed: int,
    *,
    num_points: int = 2048,
    length_range: tuple[float, float] = (2000.0, 6000.0),
    **build_kwargs,
) -> Track:
    """A random valid circuit, the same for the same seed.

    A star-shaped polygon of 6-14 corners (some pulled inwards, giving right-handers
    among the left-handers) with corner radii from 15 m hairpins to 250 m sweepers,
    scaled to a length drawn from `length_range`, rejected and redrawn if two parts of
    the track come closer than the walls allow.
    """
    rng = np.random.default_rng(seed)
    for _ in range(100):
        k = int(rng.integers(6, 15))
        angles = np.sort(rng.uniform(0.0, 2.0 * np.pi, k))
        angles = np.linspace(0, 2 * np.pi, k, endpoint=False) * 0.5 + angles * 0.5  # spread them out
        angles = np.sort(angles)
        radius = rng.uniform(0.55, 1.0, k)
        radius[rng.random(k) < 0.25] *= 0.55  # concave corners
        poly = np.stack([np.cos(angles), np.sin(angles)], axis=1) * radius[:, None]
        corner_r = np.exp(rng.uniform(np.log(15.0), np.log(250.0), k))
        half_width = float(rng.uniform(5.0, 8.0))
        target = float(rng.uniform(*length_range))
        scale = target / 4.0
        for _ in range(4):
            xy = filleted_polygon(poly * scale, corner_r)
            length = float(np.sum(np.linalg.norm(np.diff(xy, axis=0, append=xy[:1]), axis=1)))
            scale *= target / length
        xy = filleted_polygon(poly * scale, corner_r)
        clearance = 2.0 * (half_width + 8.0) + 10.0
        if _min_clearance(xy, skip_m=4.0 * clearance) > clearance:
            return build_track(xy, half_width, half_width, num_points=num_points, where=f"procedural seed {seed}",
                               **build_kwargs)
    raise TrackError(f"procedural seed {seed}: no valid circuit in 100 draws")


def _read_csv(path: Path, columns: int, what: str) -> np.ndarray:
    try:
        data = np.loadtxt(path, delimiter=",", comments="#", ndmin=2)
    except ValueError as err:
        raise TrackError(f"{path}: cannot read {what}: {err}") from err
    if data.shape[1] < columns:
        raise TrackError(f"{path}: {what} needs {columns} columns, found {data.shape[1]}")
    return data[:, :columns]


def load_track_csv(path, raceline_path=None, *, num_points: int = 2048, **build_kwargs) -> Track:
    """Loads a circuit in the public centre-line format.

    Args:
        path: CSV with rows ``x_m, y_m, w_tr_right_m, w_tr_left_m`` ('#' starts a comment),
            in driving order, implicitly closed (as in the TUM racetrack database).
        raceline_path: optional CSV with rows ``x_m, y_m``; without it a
            minimum-curvature race line is fitted.
        num_points: stations of the resampled track.
    """
    path = Path(path)
    data = _read_csv(path, 4, "centre line x_m, y_m, w_tr_right_m, w_tr_left_m")
    raceline = None
    if raceline_path is not None:
        raceline = _read_csv(Path(raceline_path), 2, "race line x_m, y_m")
    return build_track(data[:, :2], data[:, 2], data[:, 3], num_points=num_points, raceline_xy=raceline,
                       where=str(path), **build_kwargs)
