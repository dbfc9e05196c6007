"""Building a Track, host-side NumPy: validate, resample, smooth, race line, speed profile.

`build_track` validates the input, resamples it to `num_points` stations of equal
spacing, smooths away survey noise, derives tangents, normals and curvature, fits or
imports a race line, and computes the reference speed profile.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxrace.envs import reference
from jaxrace.envs.track import Track, TrackError, wrap_angle
from jaxrace.envs.vehicle import CarParams

MIN_INPUT_POINTS = 20
RUNOFF = 8.0  # m of run-off between the track edge and the wall, by default
KERB_WIDTH = 1.2  # m, kerbs lie just outside the edge in corners
KERB_MIN_CURVATURE = 1.0 / 400.0  # 1/m, corners tighter than this get kerbs


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
