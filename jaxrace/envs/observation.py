"""What the ego car's agent and its reward see: the RaceView, proprio and privileged features."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrace.envs import opponents
from jaxrace.envs.laps import gaps
from jaxrace.envs.state import EnvParams, EnvState, StaticParams
from jaxrace.envs.track import StationRow, TrackSlice
from jaxrace.envs.xla_cpu import smallest_k
from jaxrace.rewards.api import NO_GAP, RaceView

PROPRIO_SIZE = 20
LANE_RANGE = 100.0  # m ahead (centre to centre, beyond a car length) that `lane_gap_ahead` looks
LANE_MARGIN = 0.5  # m beyond a car width sideways within which a car ahead is in our lane
HEADWAY_CAP = 3.0  # s: time headways beyond this (or no car in our lane) read as this
HEADWAY_SIZE = 2  # numbers `lane_headway` adds to the privileged observation


def observation_shapes(static: StaticParams) -> dict[str, tuple[int, ...]]:
    """Shapes of the observation dict's entries (float32; "pixels" is uint8)."""
    privileged = 4 * static.lookahead_points + static.slot_size * static.num_slots
    privileged += HEADWAY_SIZE * static.lane_headway
    shapes = {"proprio": (PROPRIO_SIZE,), "privileged": (privileged,)}
    if static.pixels:
        shapes["pixels"] = (*static.image_size, 3)
    return shapes


def edge_margin(row: StationRow, lateral: jax.Array) -> jax.Array:
    """m from a car's centre to the nearer track edge at `row` (negative outside)."""
    return jnp.minimum(row.width_left - lateral, row.width_right + lateral)


def is_off_course(edge: jax.Array, params: EnvParams) -> jax.Array:
    """A car is off course when it is beyond an edge by more than the course-out margin."""
    return edge < -params.course_out_margin


def _lane_gaps(state: EnvState, params: EnvParams, ts: TrackSlice, car: int) -> tuple[jax.Array, jax.Array]:
    """(f32[C] clear space from `car`'s nose to each car's tail, NO_GAP where not in its lane; bool[C] in lane).

    In its lane: an active car whose centre is ahead along the track by at most LANE_RANGE + a car
    length, and sideways within a car width + LANE_MARGIN. The gap is 0 when touching or alongside.
    """
    c = state.cars
    length, width = params.car.length, params.car.width
    d_along = opponents.wrap_half(c.arc - c.arc[car], ts.length)
    d_side = jnp.abs(c.lateral - c.lateral[car])
    in_lane = (state.active & (jnp.arange(c.arc.shape[0]) != car) & (d_along > 0.0)
               & (d_along <= LANE_RANGE + length) & (d_side < width + LANE_MARGIN))
    return jnp.where(in_lane, jnp.maximum(d_along - length, 0.0), NO_GAP), in_lane


def lane_gap_ahead(state: EnvState, params: EnvParams, ts: TrackSlice, car: int = 0) -> jax.Array:
    """f32 m: clear space from `car`'s nose to the tail of the nearest active car ahead in its lane
    (see `_lane_gaps`); NO_GAP if none."""
    return jnp.min(_lane_gaps(state, params, ts, car)[0]).astype(jnp.float32)


def lane_car_ahead(state: EnvState, params: EnvParams, ts: TrackSlice, car: int = 0) -> tuple[jax.Array, jax.Array]:
    """(f32 m, i32): `lane_gap_ahead` and that car's index (`car` itself if none).

    Kept apart from `lane_gap_ahead`, which every env step computes: an argmin is a
    variadic reduce on XLA:CPU, and only the `lane_headway` observation needs the index.
    """
    gaps_, in_lane = _lane_gaps(state, params, ts, car)
    ahead = jnp.argmin(gaps_)
    return gaps_[ahead].astype(jnp.float32), jnp.where(in_lane[ahead], ahead, car).astype(jnp.int32)


def lane_headway(state: EnvState, params: EnvParams, ts: TrackSlice) -> jax.Array:
    """f32[2]: the ego car's time headway to the car ahead in its lane / HEADWAY_CAP (gap over
    our speed, capped: 1 when there is none), and its closing rate (the speed difference
    over the gap plus a metre, in 1/s, clipped to [0, 5]; 0 when there is none).

    The closing rate is an inverse time to contact: braking in behind a car depends on it,
    and a network would otherwise have to divide one of its inputs by another.
    """
    gap, ahead = lane_car_ahead(state, params, ts)
    vx = state.cars.body.vx
    present = ahead != 0
    headway = jnp.where(present, jnp.minimum(gap / jnp.maximum(vx[0], 1.0), HEADWAY_CAP), HEADWAY_CAP)
    closing = jnp.where(present, jnp.clip((vx[0] - vx[ahead]) / (gap + 1.0), 0.0, 5.0), 0.0)
    return jnp.stack([headway / HEADWAY_CAP, closing]).astype(jnp.float32)


def race_view(state: EnvState, params: EnvParams, ts: TrackSlice) -> RaceView:
    """The ego car's RaceView of `state` on the track slice `ts` (scalar fields)."""
    c = state.cars
    e = 0  # the ego car
    here = ts.row(c.station[e])
    lateral = c.lateral[e]
    edge = edge_margin(here, lateral)
    kerb = jnp.where(lateral > 0, here.kerb_left, here.kerb_right)
    gap_ahead, gap_behind = gaps(c.progress, c.rank, state.active, e)
    return RaceView(
        progress=c.progress[e],
        lap_progress=c.arc[e] / ts.length,
        speed=c.body.speed[e],
        longitudinal_accel=c.ax[e],
        lateral_accel=c.ay[e],
        lateral_offset=lateral,
        edge_margin=edge,
        heading_error=c.heading_error[e],
        off_course=is_off_course(edge, params),
        on_kerb=(edge < 0) & (edge >= -kerb),
        wall_contact=c.wall_contact[e],
        tyre_slip=jnp.maximum(jnp.abs(c.slip_front[e]), jnp.abs(c.slip_rear[e])),
        hit_from_behind=c.hit_from_behind[e],
        hit_other_from_behind=c.hit_other_from_behind[e],
        side_contact=c.side_contact[e],
        rank=c.rank[e],
        start_rank=c.start_rank[e],
        num_cars=jnp.sum(state.active).astype(jnp.int32),
        gap_ahead=gap_ahead.astype(jnp.float32),
        gap_behind=gap_behind.astype(jnp.float32),
        lane_gap_ahead=lane_gap_ahead(state, params, ts, e),
        laps=c.laps[e],
        lap_time=state.time - c.lap_start[e],
        last_lap_time=c.last_lap[e],
        time=state.time,
        finished=c.finished[e],
        reference_speed=here.ref_speed,
    )



def observation(static: StaticParams, state: EnvState, params: EnvParams, ts: TrackSlice) -> dict[str, jax.Array]:
    """{"proprio": f32[PROPRIO_SIZE], "privileged": f32[4 L + S K]} for the ego car.

    proprio (the car's own senses): speed/50, vx/50, vy/10, ax/20, ay/20, yaw rate/2,
    steering angle / lock, previous action (2), front and rear slip angles x 5,
    off-course, on-kerb, wall contact, any car contact, lateral offset / half
    width, heading error, lap progress in [0, 1), race progress (laps done / laps),
    race position in [0, 1] (0 = leading).
    privileged (for the critic): L track-edge stations ahead, every
    `lookahead_spacing` m, as left (x, y) and right (x, y) in the car frame / 100 m;
    then the K nearest active opponents (nearest first, S = `static.slot_size` numbers
    each, see `opponent_slots`); with `static.lane_headway`, two more (`lane_headway`).
    `ts` is the track slice of `state.track_index`. Pixels are added by `RaceEnv`.
    """
    s = static
    c = state.cars
    v = state.view
    body = jax.tree.map(lambda a: a[0], c.body)
    here = ts.row(c.station[0])
    half_width = 0.5 * (here.width_left + here.width_right)
    contact = v.hit_from_behind | v.hit_other_from_behind | v.side_contact
    proprio = jnp.stack([
        v.speed / 50.0, body.vx / 50.0, body.vy / 10.0, c.ax[0] / 20.0, c.ay[0] / 20.0, body.yaw_rate / 2.0,
        body.steer / params.car.max_steer, c.prev_action[0, 0], c.prev_action[0, 1],
        5.0 * c.slip_front[0], 5.0 * c.slip_rear[0],
        v.off_course, v.on_kerb, v.wall_contact, contact, v.lateral_offset / half_width, v.heading_error,
        v.lap_progress, c.laps[0] / jnp.maximum(params.laps, 1), (v.rank - 1) / jnp.maximum(v.num_cars - 1, 1),
    ]).astype(jnp.float32)

    cos_y, sin_y = jnp.cos(body.yaw), jnp.sin(body.yaw)

    def to_car(dx, dy):
        return cos_y * dx + sin_y * dy, -sin_y * dx + cos_y * dy

    arcs = c.arc[0] + s.lookahead_spacing * jnp.arange(s.lookahead_points)
    ahead = ts.row(jnp.floor(arcs / (ts.length / ts.n)).astype(jnp.int32))
    left = to_car(ahead.x + ahead.width_left * ahead.nx - body.x, ahead.y + ahead.width_left * ahead.ny - body.y)
    right = to_car(ahead.x - ahead.width_right * ahead.nx - body.x,
                   ahead.y - ahead.width_right * ahead.ny - body.y)
    edge_feat = jnp.stack([left[0], left[1], right[0], right[1]], axis=-1).reshape(-1) / 100.0

    parts = [edge_feat]
    if s.num_slots:
        parts.append(opponent_slots(s, state, ts, to_car))
    if s.lane_headway:
        parts.append(lane_headway(state, params, ts))
    return {"proprio": proprio, "privileged": jnp.concatenate(parts).astype(jnp.float32)}


def opponent_slots(static: StaticParams, state: EnvState, ts: TrackSlice, to_car) -> jax.Array:
    """f32[S K]: the K nearest active opponents, nearest first, S numbers each (zeros when absent).

    `static.opponent_frame == "car"`: relative position / 50 m and velocity / 20 m/s in the
    ego car's frame (`to_car` rotates world vectors into it), and a presence flag.
    `"track"`: the gap along the track / 25 m (clipped to +-4: beyond 100 m a car is just far),
    the lateral gap / 4 m, the along-track and lateral speed differences / 20 and / 5 m/s,
    and a presence flag: at racing distances a one-metre lane overlap is a quarter of a
    unit, where in the car frame it is 0.02 beside positions of a kilometre (+-20).
    With `static.opponent_accel` a sixth number follows the presence flag: the car's
    longitudinal acceleration / 20 m/s^2, its brake lights. A car that starts braking
    shows it at once, where its speed difference takes steps to build (a car braking at
    15 m/s^2 changes it by 0.075 units in one step at 10 Hz, its acceleration by 0.75).
    """
    c = state.cars
    body = c.body
    wvx = body.vx * jnp.cos(body.yaw) - body.vy * jnp.sin(body.yaw)
    wvy = body.vx * jnp.sin(body.yaw) + body.vy * jnp.cos(body.yaw)
    others = state.active & (jnp.arange(static.num_cars) > 0)
    if static.opponent_frame == "track":
        rows = ts.row(c.station)
        along = opponents.wrap_half(c.arc - c.arc[0], ts.length)
        side = c.lateral - c.lateral[0]
        v_along = wvx * rows.tx + wvy * rows.ty
        v_side = wvx * rows.nx + wvy * rows.ny
        dist = jnp.where(others, jnp.hypot(along, side), jnp.inf)
        nearest = smallest_k(dist, static.num_slots)
        slots = jnp.stack([jnp.clip(along[nearest] / 25.0, -4.0, 4.0), side[nearest] / 4.0,
                           (v_along[nearest] - v_along[0]) / 20.0, (v_side[nearest] - v_side[0]) / 5.0,
                           jnp.ones((static.num_slots,))], axis=-1)
    else:
        dx, dy = body.x - body.x[0], body.y - body.y[0]
        dist = jnp.where(others, jnp.hypot(dx, dy), jnp.inf)
        nearest = smallest_k(dist, static.num_slots)
        px, py = to_car(dx[nearest], dy[nearest])
        rvx, rvy = to_car(wvx[nearest] - wvx[0], wvy[nearest] - wvy[0])
        slots = jnp.stack([px / 50.0, py / 50.0, rvx / 20.0, rvy / 20.0, jnp.ones_like(px)], axis=-1)
    if static.opponent_accel:
        slots = jnp.concatenate([slots, (c.ax[nearest] / 20.0)[:, None]], axis=-1)
    present = jnp.isfinite(dist[nearest])
    return jnp.where(present[:, None], slots, 0.0).reshape(-1)
