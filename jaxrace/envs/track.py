"""Tracks: a closed centre line resampled to a fixed number of stations, and its jittable queries.

A `Track` (built host-side by `jaxrace.envs.track_build.build_track`) is a pytree of
fixed-shape arrays, so tracks built with the same `num_points` stack (`stack_tracks`)
and vmap. Station 0 is the start/finish line and the track is driven in order of
increasing station index.

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
