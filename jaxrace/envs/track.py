"""Tracks: a closed centre line resampled to a fixed number of stations.

Construction (`build_track`) is host-side NumPy: validate the input, resample to
`num_points` stations of equal spacing, smooth away survey noise, derive tangents,
normals and curvature, fit or import a race line, and compute the reference speed
profile. The result is a `Track` pytree of fixed-shape arrays, so tracks built with the
same `num_points` stack (`stack_tracks`) and vmap. Station 0 is the start/finish line
and the track is driven in order of increasing station index.

`project` is the jittable query: a car position to (station, arc length, lateral
offset, heading error), searching a small window around the car's previous station, so
it costs O(window) and never jumps to the other branch of a crossover.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrace.envs import reference
from jaxrace.envs.vehicle import CarParams
from jaxrace.envs.xla_cpu import sum_last

MIN_INPUT_POINTS = 20
RUNOFF = 8.0  # m of run-off between the track edge and the wall, by default
KERB_WIDTH = 1.2  # m, kerbs lie just outside the edge in corners
KERB_MIN_CURVATURE = 1.0 / 400.0  # 1/m, corners tighter than this get kerbs


class TrackError(ValueError):
    """A centre line that cannot make a track; the message names the point."""


@struct.dataclass
class Track:
    """A closed circuit sampled at N stations of (nearly) equal spacing.

    All per-station arrays have shape [N]; `xy`, `tangent`, `normal` have [N, 2].
    Segment i runs from station i to station i+1 (mod N). Lateral offsets are metres,
    positive to the left of the driving direction. Station 0 is the start/finish line.
    """

    xy: jax.Array  # f32[N, 2], centre-line points (m)
    s: jax.Array  # f32[N], arc length of each station from the start line (m)
    seg_len: jax.Array  # f32[N], length of segment i (m)
    tangent: jax.Array  # f32[N, 2], unit direction of segment i
    normal: jax.Array  # f32[N, 2], unit left normal of segment i
    heading: jax.Array  # f32[N], angle of segment i (rad)
    curvature: jax.Array  # f32[N], centre-line curvature (1/m, + turning left)
    width_left: jax.Array  # f32[N], centre line to left edge (m)
    width_right: jax.Array  # f32[N], centre line to right edge (m)
    kerb_left: jax.Array  # f32[N], kerb width outside the left edge (m, 0 = none)
    kerb_right: jax.Array  # f32[N]
    wall_left: jax.Array  # f32[N], centre line to the left wall (m)
    wall_right: jax.Array  # f32[N]
    raceline: jax.Array  # f32[N], lateral offset of the race line (m)
    raceline_ds: jax.Array  # f32[N], race-line length from station i to i+1 (m)
    raceline_curvature: jax.Array  # f32[N], race-line curvature (1/m)
    ref_speed: jax.Array  # f32[N], reference speed on the race line (m/s)
    length: jax.Array  # f32[], centre-line length (m)
    ref_lap_time: jax.Array  # f32[], reference lap time of the default car (s)

    @property
    def num_points(self) -> int:
        return self.xy.shape[-2]


# ----------------------------------------------------------------------------- host


def validate_centreline(xy, width_right, width_left, *, car_width: float = 2.0, where: str = "centre line"):
    """Checks a raw closed centre line; raises TrackError naming the first bad point.

    A repeated closing point (last == first) is dropped. Self-crossings (a figure
    eight with a bridge) are allowed.

    Returns:
        (xy f64[M, 2], width_right f64[M], width_left f64[M]) ready for `build_track`.
    """
    xy = np.asarray(xy, np.float64)
    wr = np.asarray(width_right, np.float64) * np.ones(len(xy))
    wl = np.asarray(width_left, np.float64) * np.ones(len(xy))
    if xy.ndim != 2 or xy.shape[1] != 2:
        raise TrackError(f"{where}: expected points of shape [M, 2], got {xy.shape}")
    for name, arr in (("x/y", xy), ("w_tr_right_m", wr), ("w_tr_left_m", wl)):
        bad = np.flatnonzero(~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1))
        if bad.size:
            raise TrackError(f"{where}: non-finite {name} at point {bad[0]}")
    if len(xy) >= 2 and np.linalg.norm(xy[-1] - xy[0]) < 1e-3:
        xy, wr, wl = xy[:-1], wr[:-1], wl[:-1]
    if len(xy) < MIN_INPUT_POINTS:
        raise TrackError(f"{where}: too few points ({len(xy)}); a track needs at least {MIN_INPUT_POINTS}")
    seg = np.linalg.norm(np.diff(xy, axis=0), axis=1)
    short = np.flatnonzero(seg < 1e-3)
    if short.size:
        i = short[0]
        raise TrackError(f"{where}: zero-length segment between points {i} and {i + 1} (duplicate point)")
    for name, arr in (("w_tr_right_m", wr), ("w_tr_left_m", wl)):
        neg = np.flatnonzero(arr < 0)
        if neg.size:
            raise TrackError(f"{where}: negative {name} ({arr[neg[0]]:.2f} m) at point {neg[0]}")
    narrow = np.flatnonzero(wr + wl < car_width)
    if narrow.size:
        i = narrow[0]
        raise TrackError(
            f"{where}: track width at point {i} is {wr[i] + wl[i]:.2f} m, narrower than a car ({car_width:.1f} m)"
        )
    closing = float(np.linalg.norm(xy[-1] - xy[0]))
    spacing = float(np.median(seg))
    if closing > max(5.0 * spacing, 1.0):
        raise TrackError(
            f"{where}: centre line is not closed: the last point ({len(xy) - 1}) is {closing:.1f} m from the "
            f"first, but points are {spacing:.1f} m apart; a circuit must end near where it starts"
        )
    return xy, wr, wl


def _closed_arclength(xy):
    seg = np.linalg.norm(np.roll(xy, -1, axis=0) - xy, axis=1)
    return np.concatenate([[0.0], np.cumsum(seg)])


def _resample(xy, values, n):
    """Resamples a closed polyline (and per-point values) at n equally spaced stations."""
    s = _closed_arclength(xy)
    stations = np.arange(n) * s[-1] / n
    closed = np.vstack([xy, xy[:1]])
    out_xy = np.stack([np.interp(stations, s, closed[:, k]) for k in range(2)], axis=1)
    out_vals = [np.interp(stations, s, np.append(v, v[0])) for v in values]
    return out_xy, out_vals


def _smooth_periodic(values, sigma_points):
    """Gaussian smoothing of periodic samples along axis 0 (FFT, exact wrap-around)."""
    if sigma_points <= 0:
        return values
    n = values.shape[0]
    freq = np.fft.rfftfreq(n)
    gain = np.exp(-0.5 * (2 * np.pi * freq * sigma_points) ** 2)
    shape = (-1,) + (1,) * (values.ndim - 1)
    return np.fft.irfft(np.fft.rfft(values, axis=0) * gain.reshape(shape), n=n, axis=0)


def _curvature(xy):
    """Signed curvature (1/m) of a closed polyline from headings of neighbouring segments."""
    d = np.roll(xy, -1, axis=0) - xy
    heading = np.arctan2(d[:, 1], d[:, 0])
    length = np.linalg.norm(d, axis=1)
    turn = wrap_angle(heading - np.roll(heading, 1))
    return turn / (0.5 * (length + np.roll(length, 1)))


def _project_polyline(points, xy, window=24):
    """Projects an ordered sequence of points onto a closed polyline (host).

    The first point is matched globally, later ones in a window ahead of the previous
    match, as the jitted `project` does. Returns (arc length f64[P], lateral f64[P]).
    """
    n = len(xy)
    seg_vec = np.roll(xy, -1, axis=0) - xy
    seg_len = np.linalg.norm(seg_vec, axis=1)
    s_at = _closed_arclength(xy)[:-1]
    out_s, out_n = np.empty(len(points)), np.empty(len(points))
    idx = None
    for j, p in enumerate(points):
        cand = np.arange(n) if idx is None else (idx + np.arange(-window // 4, window)) % n
        a, v = xy[cand], seg_vec[cand]
        t = np.clip(np.einsum("ij,ij->i", p - a, v) / seg_len[cand] ** 2, 0.0, 1.0)
        d2 = np.sum((a + t[:, None] * v - p) ** 2, axis=1)
        k = int(np.argmin(d2))
        idx = int(cand[k])
        out_s[j] = s_at[idx] + t[k] * seg_len[idx]
        rel = p - a[k]
        out_n[j] = (v[k, 0] * rel[1] - v[k, 1] * rel[0]) / seg_len[idx]
    return out_s, out_n


def fit_raceline(xy, normal, lo, hi, *, coarse_spacing=10.0, max_iter=100):
    """Minimum-curvature race line as lateral offsets within [lo, hi] (host).

    Minimises the sum of squared second differences of the race-line points on a coarse
    grid (about `coarse_spacing` m) subject to the bounds, by a primal active-set method
    with sparse direct solves, then interpolates back to every station.
    """
    from scipy import sparse
    from scipy.sparse.linalg import spsolve

    n = len(xy)
    stride = max(1, int(round(coarse_spacing / np.mean(np.linalg.norm(np.roll(xy, -1, 0) - xy, axis=1)))))
    idx = np.arange(0, n, stride)
    c, v, lo_c, hi_c = xy[idx], normal[idx], lo[idx], hi[idx]
    m = len(idx)
    rows = np.repeat(np.arange(m), 3)
    cols = (rows + np.tile([-1, 0, 1], m)) % m
    second = sparse.csr_matrix((np.tile([1.0, -2.0, 1.0], m), (rows, cols)), shape=(m, m))  # D2 around the loop
    a = sparse.vstack([second @ sparse.diags(v[:, 0]), second @ sparse.diags(v[:, 1])]).tocsr()
    b = np.concatenate([second @ c[:, 0], second @ c[:, 1]])
    hess = (a.T @ a + 1e-6 * sparse.eye(m)).tocsc()
    grad0 = a.T @ b
    x = np.clip(np.zeros(m), lo_c, hi_c)
    fixed = np.zeros(m, bool)
    for _ in range(max_iter):
        free = ~fixed
        rhs = -(grad0[free] + hess[free][:, fixed] @ x[fixed])
        x[free] = spsolve(hess[free][:, free].tocsc(), rhs) if free.any() else x[free]
        below, above = free & (x < lo_c), free & (x > hi_c)
        grad = hess @ x + grad0
        # A bound is released when moving inwards would lower the objective.
        release = fixed & (((x <= lo_c) & (grad < 0)) | ((x >= hi_c) & (grad > 0)))
        if not (below.any() or above.any() or release.any()):
            break
        x = np.clip(x, lo_c, hi_c)
        fixed = (fixed | below | above) & ~release
    coarse = np.append(np.clip(x, lo_c, hi_c), np.clip(x, lo_c, hi_c)[0])
    stations = np.append(idx, n)
    return np.clip(np.interp(np.arange(n), stations, coarse), lo, hi)


def build_track(
    xy,
    width_right,
    width_left,
    *,
    num_points: int = 2048,
    raceline_xy=None,
    smooth_m: float = 4.0,
    runoff: float = RUNOFF,
    car: CarParams | None = None,
    where: str = "centre line",
) -> Track:
    """Builds a Track from a closed centre line (host-side).

    Args:
        xy: f[M, 2] centre-line points (m), in driving order; the loop closes itself.
        width_right, width_left: f[M] or scalars, distance to the edges (m).
        num_points: number of stations N (fixes all shapes).
        raceline_xy: optional f[K, 2] race line; otherwise a minimum-curvature line
            is fitted inside the edges.
        smooth_m: Gaussian smoothing (m) of the centre line against survey noise.
        runoff: metres of run-off from the edge to the wall.
        car: car whose reference speed profile the track stores (default GT3).
        where: name used in error messages (the file path, the layout name).
    """
    car = car or CarParams()
    xy, wr, wl = validate_centreline(xy, width_right, width_left, car_width=float(car.width), where=where)
    # Resample twice: smoothing shifts points, the second pass restores equal spacing.
    pts, (wr_n, wl_n) = _resample(xy, [wr, wl], num_points)
    ds = _closed_arclength(pts)[-1] / num_points
    pts = _smooth_periodic(pts, smooth_m / ds)
    pts, (wr_n, wl_n) = _resample(pts, [wr_n, wl_n], num_points)
    ds_vec = np.roll(pts, -1, axis=0) - pts
    seg_len = np.linalg.norm(ds_vec, axis=1)
    tangent = ds_vec / seg_len[:, None]
    normal = np.stack([-tangent[:, 1], tangent[:, 0]], axis=1)
    curvature = _smooth_periodic(_curvature(pts), 2.0)
    s = np.concatenate([[0.0], np.cumsum(seg_len)[:-1]])
    length = float(seg_len.sum())

    margin = 0.5 * float(car.width) + 0.3
    lo, hi = -(wr_n - margin), wl_n - margin
    if raceline_xy is not None:
        rl = np.asarray(raceline_xy, np.float64)
        if rl.ndim != 2 or rl.shape[1] != 2 or not np.isfinite(rl).all() or len(rl) < MIN_INPUT_POINTS:
            raise TrackError(f"{where}: race line must be at least {MIN_INPUT_POINTS} finite points of shape [K, 2]")
        rl_s, rl_n = _project_polyline(rl, pts)
        order = np.argsort(rl_s)
        rl_s, rl_n = rl_s[order], rl_n[order]
        offset = np.interp(s, rl_s, rl_n, period=length)
        offset = np.clip(_smooth_periodic(offset, smooth_m / ds), lo, hi)
    else:
        offset = fit_raceline(pts, normal, lo, hi)
    line = _smooth_periodic(pts + offset[:, None] * normal, smooth_m / ds)
    line_ds = np.linalg.norm(np.roll(line, -1, axis=0) - line, axis=1)
    line_curv = _smooth_periodic(_curvature(line), 2.0)

    kerb = np.where(np.abs(curvature) > KERB_MIN_CURVATURE, KERB_WIDTH, 0.0)
    ref_speed = reference.speed_profile(line_ds, line_curv, car)
    lap = reference.lap_time(line_ds, ref_speed)
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    return Track(
        xy=f32(pts),
        s=f32(s),
        seg_len=f32(seg_len),
        tangent=f32(tangent),
        normal=f32(normal),
        heading=f32(np.arctan2(tangent[:, 1], tangent[:, 0])),
        curvature=f32(curvature),
        width_left=f32(wl_n),
        width_right=f32(wr_n),
        kerb_left=f32(kerb),
        kerb_right=f32(kerb),
        wall_left=f32(wl_n + runoff),
        wall_right=f32(wr_n + runoff),
        raceline=f32(offset),
        raceline_ds=f32(line_ds),
        raceline_curvature=f32(line_curv),
        ref_speed=f32(ref_speed),
        length=f32(length),
        ref_lap_time=f32(lap),
    )


def stack_tracks(tracks) -> Track:
    """Stacks tracks of equal `num_points` along a new leading axis (an episode picks one)."""
    tracks = list(tracks)
    sizes = {t.num_points for t in tracks}
    if len(sizes) != 1:
        raise TrackError(f"tracks to stack must share num_points, got {sorted(sizes)}")
    return jax.tree.map(lambda *xs: jnp.stack(xs), *tracks)


def num_tracks(tracks: Track) -> int:
    """How many tracks a (possibly stacked) Track holds."""
    return 1 if tracks.xy.ndim == 2 else tracks.xy.shape[0]


def reference_lap_time(track: Track, car: CarParams | None = None) -> float:
    """Reference lap time (s) on the track's race line for `car` (default GT3), host-side."""
    if car is None:
        return float(track.ref_lap_time)
    ds = np.asarray(track.raceline_ds, np.float64)
    v = reference.speed_profile(ds, np.asarray(track.raceline_curvature, np.float64), car)
    return reference.lap_time(ds, v)


# ----------------------------------------------------------------------------- jittable


class StationRow(NamedTuple):
    """Everything the simulation reads about one station, fetched by a single gather."""

    x: jax.Array
    y: jax.Array
    tx: jax.Array  # unit tangent of the segment
    ty: jax.Array
    seg_len: jax.Array
    s: jax.Array  # arc length at the station
    heading: jax.Array
    turn: jax.Array  # heading change to the next station (rad)
    curvature: jax.Array
    width_left: jax.Array
    width_right: jax.Array
    kerb_left: jax.Array
    kerb_right: jax.Array
    wall_left: jax.Array
    wall_right: jax.Array
    raceline: jax.Array
    ref_speed: jax.Array

    @property
    def nx(self) -> jax.Array:  # unit left normal
        return -self.ty

    @property
    def ny(self) -> jax.Array:
        return self.tx


def station_table(tracks: Track) -> jax.Array:
    """Packs per-station fields into f32[..., N, len(StationRow._fields)] (one row per station)."""
    turn = wrap_angle(jnp.roll(tracks.heading, -1, axis=-1) - tracks.heading)
    cols = dict(
        x=tracks.xy[..., 0], y=tracks.xy[..., 1], tx=tracks.tangent[..., 0], ty=tracks.tangent[..., 1],
        seg_len=tracks.seg_len, s=tracks.s, heading=tracks.heading, turn=turn, curvature=tracks.curvature,
        width_left=tracks.width_left, width_right=tracks.width_right, kerb_left=tracks.kerb_left,
        kerb_right=tracks.kerb_right, wall_left=tracks.wall_left, wall_right=tracks.wall_right,
        raceline=tracks.raceline, ref_speed=tracks.ref_speed,
    )
    return jnp.stack([cols[name] for name in StationRow._fields], axis=-1)


@struct.dataclass
class TrackSlice:
    """One track inside the flat station table of stacked tracks (a jittable view).

    Stacked tracks are laid end to end (`rows` has shape [T * N, K]) and an episode
    reads its own track at `base + station`. Under vmap over episodes only the rows
    actually read are gathered, never a copy of a whole track per episode; one gather
    fetches every field of a station (separate gathers per field are slow on XLA:CPU).
    """

    rows: jax.Array  # f32[T * N, K], see StationRow
    segments: jax.Array  # f32[T * N, 4], (x, y, tx, ty): all that choosing a segment needs
    base: jax.Array  # i32[], flat index of this track's station 0
    length: jax.Array  # f32[], centre-line length (m)
    ref_lap_time: jax.Array  # f32[], s
    n: int = struct.field(pytree_node=False, default=0)  # stations per track

    def row(self, station: jax.Array) -> StationRow:
        """All fields at `station` (i32[...], any value; wraps), each of shape [...]."""
        r = self.rows[self.base + station % self.n]
        return StationRow(*jnp.moveaxis(r, -1, 0))


def track_slice(tracks: Track, index=0) -> TrackSlice:
    """The view of track `index` of a stacked (or single) Track; jittable in `index`."""
    table = station_table(tracks)
    if table.ndim == 2:
        table = table[None]
    t, n, k = table.shape
    rows = table.reshape(t * n, k)
    fields = StationRow._fields
    segments = rows[:, [fields.index(f) for f in ("x", "y", "tx", "ty")]]
    index = jnp.asarray(index, jnp.int32)
    return TrackSlice(rows=rows, segments=segments, base=index * n,
                      length=jnp.reshape(tracks.length, (-1,))[index],
                      ref_lap_time=jnp.reshape(tracks.ref_lap_time, (-1,))[index], n=n)


class Projection(NamedTuple):
    """A position expressed in track coordinates; fields broadcast over cars."""

    station: jax.Array  # i32, segment the point projects onto
    arc: jax.Array  # f32, arc length from the start line, in [0, length) (m)
    lateral: jax.Array  # f32, signed offset from the centre line (m, + left)
    heading: jax.Array  # f32, track direction at the point (rad)
    row: StationRow  # the station's fields, for walls, surface and contacts


PROJECTION_WINDOW = (-1, 3)  # segments searched, relative to the previous one


def project(ts: TrackSlice, xy: jax.Array, prev_station: jax.Array, window=PROJECTION_WINDOW) -> Projection:
    """Projects points onto the centre line near their previous segment.

    Args:
        ts: the episode's track.
        xy: f32[..., 2] positions.
        prev_station: i32[...] segment each point was on last time.
        window: (first, last) segment offsets searched, inclusive; the cost is
            O(last - first + 1) whatever N is. A car must not move more than `last`
            segments between calls (3 segments, at least 3 m at the default spacing).

    Returns:
        A Projection with fields of shape [...].
    """
    offsets = jnp.arange(window[0], window[1] + 1, dtype=jnp.int32)
    stations = (prev_station[..., None] + offsets) % ts.n  # [..., W]
    seg = ts.segments[ts.base + stations]  # [..., W, 4]: one small gather
    ax, ay, tx, ty = seg[..., 0], seg[..., 1], seg[..., 2], seg[..., 3]
    # The car is on the last candidate segment whose start it has passed (candidates
    # are in driving order); if it passed none, it moved back past the window: take the
    # first, and the next call searches further back.
    passed = (xy[..., 0:1] - ax) * tx + (xy[..., 1:2] - ay) * ty >= 0.0
    k = jnp.clip(sum_last(passed) - 1, 0, offsets.shape[0] - 1)
    station = jnp.take_along_axis(stations, k[..., None], axis=-1)[..., 0]
    row = ts.row(station)
    rx, ry = xy[..., 0] - row.x, xy[..., 1] - row.y
    along = rx * row.tx + ry * row.ty
    lateral = ry * row.tx - rx * row.ty
    heading = row.heading + jnp.clip(along / row.seg_len, 0.0, 1.0) * row.turn
    return Projection(station=station, arc=row.s + along, lateral=lateral, heading=heading, row=row)


def wrap_angle(a):
    """Wraps angles to [-pi, pi]; numpy in, numpy out; jax in, jax out (jittable).

    Written with round, not %: a float remainder costs ~40x an add on XLA:CPU.
    """
    return a - (2 * np.pi) * (a / (2 * np.pi)).round()


def station_at(ts: TrackSlice, arc: jax.Array) -> jax.Array:
    """Index of the segment containing arc length `arc` (any real; wraps), jittable."""
    ds = ts.length / ts.n
    return jnp.floor(arc / ds).astype(jnp.int32) % ts.n


def point_at(ts: TrackSlice, arc: jax.Array, lateral: jax.Array) -> tuple[jax.Array, jax.Array]:
    """World position f32[..., 2] and station of track coordinates (arc, lateral)."""
    station = station_at(ts, arc)
    r = ts.row(station)
    along = jnp.mod(arc, ts.length) - r.s
    xy = jnp.stack([r.x + along * r.tx + lateral * r.nx, r.y + along * r.ty + lateral * r.ny], axis=-1)
    return xy, station
