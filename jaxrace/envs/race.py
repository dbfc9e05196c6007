"""The race: cars on a track, contacts, laps, positions, observations; gymnax-style API.

Car 0 is the ego car (driven by the agent); cars 1..num_opponents are driven by the
built-in AI, of which the first `params.num_active_opponents` take part. One agent
step (`dt` = 0.1 s) runs `substeps` physics substeps (60 Hz); each substep moves every
car, projects it onto the track, keeps it off the walls and resolves car-car contacts.

Contacts are solved in the track frame: cars are boxes aligned with the track, which
is what they are during racing; a contact along the track is a rear-end (the car
behind is at fault), across it a side contact.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxrace.envs import opponents
from jaxrace.envs.render import TrackTextures, make_renderer, make_textures
from jaxrace.envs.track import (
    Projection,
    StationRow,
    Track,
    TrackSlice,
    num_tracks,
    point_at,
    project,
    track_slice,
    wrap_angle,
)
from jaxrace.envs.vehicle import CarParams, Conditions, VehicleState, sanitize_action, vehicle_substep
from jaxrace.envs.xla_cpu import any_last, materialised, smallest_k, sum_last
from jaxrace.rewards.api import NO_GAP, RaceView

START_MODES = ("time_trial", "grid_back", "random")
MAX_OPPONENTS = 19
WALL_ALIGN = 0.1  # share of the angle to the wall that one contact substep takes away


@dataclasses.dataclass(frozen=True)
class StaticParams:
    """Configuration that fixes shapes or code paths; changing it recompiles."""

    num_opponents: int = 7  # cars driven by the AI (maximum; EnvParams masks them)
    start: str = "grid_back"  # "time_trial", "grid_back" or "random"
    dt: float = 0.1  # s per agent step (10 Hz)
    substeps: int = 6  # physics substeps per agent step (60 Hz)
    lookahead_points: int = 30  # track-edge stations ahead in the privileged observation
    lookahead_spacing: float = 10.0  # m between them
    opponent_slots: int = 6  # nearest opponents in the privileged observation
    pixels: bool = False  # add obs["pixels"], uint8[H, W, 3] from the ego camera
    image_size: tuple[int, int] = (64, 64)  # (H, W)
    camera: str = "chase"  # "chase" (behind and above, looking ahead) or "topdown"
    texture_size: int = 1024  # texels per side of each track's ground texture

    def __post_init__(self):
        if not 0 <= self.num_opponents <= MAX_OPPONENTS:
            raise ValueError(f"num_opponents must be in [0, {MAX_OPPONENTS}], got {self.num_opponents}")
        if self.start not in START_MODES:
            raise ValueError(f"start must be one of {START_MODES}, got {self.start!r}")
        if self.start == "time_trial" and self.num_opponents:
            raise ValueError("start='time_trial' races alone: use num_opponents=0")
        if self.camera not in ("chase", "topdown"):
            raise ValueError(f"camera must be 'chase' or 'topdown', got {self.camera!r}")
        if len(self.image_size) != 2 or min(self.image_size) < 8:
            raise ValueError(f"image_size must be (H, W) with both at least 8, got {self.image_size}")
        object.__setattr__(self, "image_size", tuple(int(x) for x in self.image_size))
        if self.substeps < 1 or self.dt <= 0:
            raise ValueError(f"need substeps >= 1 and dt > 0, got substeps={self.substeps}, dt={self.dt}")

    @property
    def num_cars(self) -> int:
        return 1 + self.num_opponents

    @property
    def num_slots(self) -> int:
        return min(self.opponent_slots, self.num_opponents)


@struct.dataclass
class EnvParams:
    """Traced parameters: vmappable for sweeps and domain randomisation.

    Per-car arrays have shape [C] with the ego car at index 0.
    """

    tracks: Track  # one Track or several stacked (leading axis T)
    track_index: jax.Array  # i32, which stacked track; -1 draws one at every reset
    car: CarParams  # the base car (scalar fields)
    mass_scale: jax.Array  # f32[C], balance of performance
    power_scale: jax.Array  # f32[C]
    grip_scale: jax.Array  # f32[C]
    skill: jax.Array  # f32[C], AI target speed / reference speed (index 0 unused)
    aggression: jax.Array  # f32[C] in [0, 1]
    num_active_opponents: jax.Array  # i32, opponents taking part (<= num_opponents)
    laps: jax.Array  # i32, race distance in laps
    time_limit: jax.Array  # f32, s, truncation
    course_out_margin: jax.Array  # f32, m beyond the edge that counts as a course-out
    terminate_on_course_out: jax.Array  # bool
    random_start_speed: jax.Array  # f32[2], random starts: speed range / reference speed
    kerb_grip: jax.Array  # f32, grip factor on kerbs
    offtrack_grip: jax.Array  # f32, grip factor on grass
    offtrack_drag: jax.Array  # f32, extra rolling-drag coefficient on grass
    wall_restitution: jax.Array  # f32, bounce of the normal speed at a wall
    wall_friction: jax.Array  # f32, speed lost at a wall per unit of normal/tangential speed
    car_restitution: jax.Array  # f32, bounce in car-car contacts
    textures: TrackTextures | None = None  # render data per track; None unless static.pixels


class CarsState(NamedTuple):
    """Per-car race state; every field has shape [C]."""

    body: VehicleState
    station: jax.Array  # i32, track segment
    arc: jax.Array  # f32, m along the lap, [0, length)
    lateral: jax.Array  # f32, m from the centre line (+ left)
    heading_error: jax.Array  # f32, rad
    progress: jax.Array  # f32, m from the start line, unwrapped
    lap_origin: jax.Array  # f32, progress where lap counting starts
    laps: jax.Array  # i32, laps completed
    lap_start: jax.Array  # f32, s, time the current lap started
    last_lap: jax.Array  # f32, s (0 = none yet)
    best_lap: jax.Array  # f32, s (0 = none yet)
    finished: jax.Array  # bool
    finish_time: jax.Array  # f32, s
    prev_action: jax.Array  # f32[C, 2]
    ax: jax.Array  # f32, m/s^2 (body frame)
    ay: jax.Array  # f32, m/s^2
    slip_front: jax.Array  # f32, rad
    slip_rear: jax.Array  # f32, rad
    lane: jax.Array  # f32, m, AI lane offset from the race line
    wall_contact: jax.Array  # bool, during the last step
    hit_from_behind: jax.Array  # bool, during the last step
    hit_other_from_behind: jax.Array  # bool, during the last step
    side_contact: jax.Array  # bool, during the last step
    start_rank: jax.Array  # i32
    rank: jax.Array  # i32


@struct.dataclass
class EnvState:
    """Everything that changes during an episode."""

    cars: CarsState
    active: jax.Array  # bool[C]
    track_index: jax.Array  # i32
    time: jax.Array  # f32, s
    steps: jax.Array  # i32
    bad_actions: jax.Array  # i32, NaN or out-of-range ego actions this episode
    view: RaceView  # the ego car's view of the current state


def _where(cond, a, b):
    """Selects between two pytrees; `cond` broadcasts against leading axes."""

    def pick(x, y):
        c = jnp.reshape(cond, jnp.shape(cond) + (1,) * (jnp.ndim(x) - jnp.ndim(cond)))
        return jnp.where(c, x, y)

    return jax.tree.map(pick, a, b)


class RaceEnv:
    """A racing environment with the functional API of gymnax 1.0.

    The object holds only its `StaticParams`; all arrays live in `EnvParams` and
    `EnvState`, and every method is a pure function of its arguments.
    """

    def __init__(self, static: StaticParams):
        self.static = static
        self._render = make_renderer(static) if static.pixels else None

    # ------------------------------------------------------------------ params

    def default_params(self, tracks: Track, **overrides) -> EnvParams:
        """EnvParams for `tracks` (one Track or a stacked set) with default values."""
        c = self.static.num_cars
        ones = jnp.ones((c,), jnp.float32)
        base = dict(
            tracks=tracks,
            track_index=jnp.int32(0 if num_tracks(tracks) == 1 else -1),
            car=CarParams(),
            mass_scale=ones,
            power_scale=ones,
            grip_scale=ones,
            skill=jnp.linspace(0.97, 0.9, c).astype(jnp.float32),
            aggression=jnp.full((c,), 0.5, jnp.float32),
            num_active_opponents=jnp.int32(self.static.num_opponents),
            laps=jnp.int32(1),
            time_limit=jnp.float32(600.0),
            course_out_margin=jnp.float32(1.0),
            terminate_on_course_out=jnp.bool_(False),
            random_start_speed=jnp.array([0.3, 0.9], jnp.float32),
            kerb_grip=jnp.float32(0.9),
            offtrack_grip=jnp.float32(0.6),
            offtrack_drag=jnp.float32(0.08),
            wall_restitution=jnp.float32(0.1),
            wall_friction=jnp.float32(0.5),
            car_restitution=jnp.float32(0.3),
            textures=make_textures(tracks, self.static.texture_size) if self.static.pixels else None,
        )
        unknown = set(overrides) - set(base)
        if unknown:
            raise TypeError(f"unknown EnvParams field(s) {sorted(unknown)}; known: {sorted(base)}")
        for key, value in overrides.items():
            if key in ("tracks", "car"):
                base[key] = value
            else:
                base[key] = jnp.asarray(value, dtype=jnp.asarray(base[key]).dtype) * jnp.ones_like(base[key])
        return EnvParams(**base)

    @property
    def num_actions(self) -> int:
        return 2

    def observation_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the observation dict's entries (float32; "pixels" is uint8)."""
        s = self.static
        shapes = {"proprio": (PROPRIO_SIZE,), "privileged": (4 * s.lookahead_points + 5 * s.num_slots,)}
        if s.pixels:
            shapes["pixels"] = (*s.image_size, 3)
        return shapes

    def render(self, state: EnvState, params: EnvParams, car: int | jax.Array = 0) -> jax.Array:
        """uint8[H, W, 3], the camera image of `car` (needs static.pixels)."""
        if self._render is None:
            raise ValueError("this env renders nothing: make it with pixels=True")
        return self._render(params.textures, state, car)

    # ------------------------------------------------------------------ reset

    def reset(self, key: jax.Array, params: EnvParams) -> tuple[dict, EnvState]:
        """Starts a race. Returns (obs, state); different keys give different starts."""
        state = self._initial_state(key, params)
        return self.observation(state, params), state

    reset_env = reset

    def _initial_state(self, key, params: EnvParams) -> EnvState:
        s = self.static
        c = s.num_cars
        k_track, k_slot, k_phase, k_jitter, k_lateral, k_speed = jax.random.split(key, 6)
        n_tracks = num_tracks(params.tracks)
        drawn = jax.random.randint(k_track, (), 0, n_tracks)
        track_index = jnp.where(params.track_index >= 0, params.track_index, drawn).astype(jnp.int32)
        ts = track_slice(params.tracks, track_index)
        idx = jnp.arange(c)
        n_active = jnp.clip(params.num_active_opponents, 0, s.num_opponents)
        active = idx <= n_active

        if s.start == "random":
            # Equal slots round the lap, shuffled, with jitter inside each slot.
            spacing = ts.length / c
            slot = jax.random.permutation(k_slot, c)
            phase = jax.random.uniform(k_phase, (), maxval=ts.length)
            jitter = jax.random.uniform(k_jitter, (c,), maxval=0.5) * spacing
            arc = (phase + slot * spacing + jitter) % ts.length
            here = ts.row(jnp.floor(arc / (ts.length / ts.n)).astype(jnp.int32))
            half = jnp.minimum(here.width_left, here.width_right) - 1.5
            lateral = jax.random.uniform(k_lateral, (c,), minval=-1.0, maxval=1.0) * jnp.maximum(half, 0.0)
            frac = jax.random.uniform(k_speed, (c,), minval=params.random_start_speed[0],
                                      maxval=params.random_start_speed[1])
            speed = frac * here.ref_speed
            progress = opponents.wrap_half(arc - arc[0], ts.length)
            lap_origin = progress
        else:
            # Two staggered columns behind the line; the ego car takes the last slot.
            slot = jnp.where(idx == 0, n_active, idx - 1)
            progress = -(8.0 + 8.0 * slot).astype(jnp.float32)
            column = jnp.where(slot % 2 == 0, 1.0, -1.0)
            line = ts.row(jnp.int32(0))
            lateral = column * jnp.minimum(2.5, jnp.minimum(line.width_left, line.width_right) - 1.5)
            if s.start == "time_trial":
                progress = jnp.zeros((c,), jnp.float32)
                lateral = jnp.broadcast_to(line.raceline, (c,))
            arc = progress % ts.length
            speed = jnp.zeros((c,), jnp.float32)
            lap_origin = jnp.zeros((c,), jnp.float32)
        xy, station = point_at(ts, arc, lateral)
        start_row = ts.row(station)
        yaw = start_row.heading
        zeros = jnp.zeros((c,), jnp.float32)
        false = jnp.zeros((c,), bool)
        body = VehicleState(x=xy[:, 0], y=xy[:, 1], yaw=yaw, vx=speed.astype(jnp.float32), vy=zeros,
                            yaw_rate=zeros, steer=zeros)
        lane = lateral - start_row.raceline
        cars = CarsState(
            body=body, station=station, arc=arc, lateral=lateral, heading_error=zeros, progress=progress,
            lap_origin=lap_origin, laps=jnp.zeros((c,), jnp.int32), lap_start=zeros, last_lap=zeros,
            best_lap=zeros, finished=false, finish_time=zeros, prev_action=jnp.zeros((c, 2), jnp.float32),
            ax=zeros, ay=zeros, slip_front=zeros, slip_rear=zeros, lane=lane, wall_contact=false, hit_from_behind=false,
            hit_other_from_behind=false, side_contact=false, start_rank=jnp.zeros((c,), jnp.int32),
            rank=jnp.zeros((c,), jnp.int32),
        )
        rank = _ranks(cars, active)
        cars = cars._replace(rank=rank, start_rank=rank)
        state = EnvState(cars=cars, active=active, track_index=track_index, time=jnp.float32(0.0),
                         steps=jnp.int32(0), bad_actions=jnp.int32(0), view=None)
        return state.replace(view=self._view(state, params, ts))

    # ------------------------------------------------------------------ step

    def step(self, key: jax.Array, state: EnvState, action: jax.Array, params: EnvParams):
        """One agent step with auto-reset.

        Args:
            key: used for the reset that follows the end of an episode (the dynamics
                are deterministic).
            state: EnvState.
            action: f32[2] (steering, throttle_brake) in [-1, 1]; NaN becomes 0 and
                values outside are clipped (counted in `info["bad_action_count"]`).
            params: EnvParams.

        Returns:
            (obs, state, reward, terminated, truncated, info). When the episode ended,
            `state` and `obs` are those of a fresh episode, and
            `info["final_observation"]` and `info["view"]` belong to the final state.
            `final_observation` has no "pixels": the image is rendered once per step, of
            the state returned (the critic's inputs, proprio and privileged, are there).
        """
        obs, next_state, reward, terminated, truncated, info = self._step(state, action, params)
        reset_state = self._initial_state(key, params)
        reset_obs = self.observation(reset_state, params, pixels=False)
        done = terminated | truncated
        info["final_observation"] = obs
        state = _where(done, reset_state, next_state)
        obs = _where(done, reset_obs, obs)
        if self._render is not None:
            obs["pixels"] = self._render(params.textures, state, 0)
        return obs, state, reward, terminated, truncated, info

    def step_env(self, key: jax.Array, state: EnvState, action: jax.Array, params: EnvParams):
        """One agent step without auto-reset (see `step`)."""
        del key  # the dynamics are deterministic
        obs, next_state, reward, terminated, truncated, info = self._step(state, action, params)
        if self._render is not None:
            obs["pixels"] = self._render(params.textures, next_state, 0)
        return obs, next_state, reward, terminated, truncated, info

    def _step(self, state: EnvState, action: jax.Array, params: EnvParams):
        s = self.static
        ts = track_slice(params.tracks, state.track_index)
        car = params.car.scaled(params.mass_scale, params.power_scale, params.grip_scale)
        ego_action, bad = sanitize_action(action)
        ai_action, lane = self._ai(state, params, ts, car)
        actions = ai_action.at[0].set(ego_action)
        cars = state.cars._replace(lane=lane)
        cars, step_flags = self._physics(ts, cars, state.active, actions, params, car)
        time = state.time + s.dt
        cars = _lap_bookkeeping(cars, state.cars.progress, state.time, s.dt, ts.length, params.laps)
        cars = cars._replace(prev_action=actions, rank=_ranks(cars, state.active), **step_flags)
        next_state = state.replace(cars=cars, time=time, steps=state.steps + 1,
                                   bad_actions=state.bad_actions + bad.astype(jnp.int32))
        view = self._view(next_state, params, ts)
        next_state = next_state.replace(view=view)
        reward = view.progress - state.view.progress
        terminated = view.finished | (params.terminate_on_course_out & view.off_course)
        truncated = (time >= params.time_limit) & ~terminated
        info = {"view": view, "bad_action": bad, "bad_action_count": next_state.bad_actions}
        return self.observation(next_state, params, pixels=False), next_state, reward, terminated, truncated, info

    def ai_action(self, state: EnvState, params: EnvParams) -> jax.Array:
        """The built-in AI's action f32[2] for the ego car: a baseline policy."""
        ts = track_slice(params.tracks, state.track_index)
        car = params.car.scaled(params.mass_scale, params.power_scale, params.grip_scale)
        return self._ai(state, params, ts, car)[0][0]

    def _ai(self, state, params, ts, car):
        c = state.cars
        inputs = opponents.DriverInput(body=c.body, station=c.station, arc=c.arc, lateral=c.lateral,
                                       lane=c.lane, accel=c.ax, active=state.active)
        return opponents.drive(ts, inputs, params.skill, params.aggression, car, self.static.dt)

    # ------------------------------------------------------------------ physics

    def _physics(self, ts: TrackSlice, cars: CarsState, active, actions, params: EnvParams, car: CarParams):
        s = self.static
        dt = s.dt / s.substeps
        partners = _contact_partners(ts, cars, active) if s.num_cars > 1 else None
        draft = _slipstream(ts, cars, active, car)

        def substep(_, carry: Substep) -> Substep:
            body, _ = vehicle_substep(carry.body, actions, Conditions(carry.grip, carry.rolling_drag, draft), car, dt)
            body = jax.tree.map(materialised, body)  # read by every output of the substep
            proj = project(ts, jnp.stack([body.x, body.y], -1), carry.station)
            motion, proj, wall = _walls(Motion.of(body), proj, car, params)
            contact = Contacts(*(jnp.zeros_like(active),) * 3)
            if partners is not None:
                motion, proj, contact = _contacts(ts, motion, proj, partners, car, params)
            # Inactive cars stay where they are (their masks keep them out of everything).
            lateral = jnp.where(active, proj.lateral, carry.lateral)
            grip, rolling_drag = _surface(proj.row, lateral, params)
            return Substep(
                body=_where(active, motion.to_body(body), carry.body),
                station=jnp.where(active, proj.station, carry.station),
                arc=jnp.where(active, proj.arc, carry.arc),
                lateral=lateral, grip=grip, rolling_drag=rolling_drag,
                events=carry.events | _pack_events(wall & active, contact.hit_from_behind,
                                                   contact.hit_other_from_behind, contact.side),
            )

        grip, rolling_drag = _surface(ts.row(cars.station), cars.lateral, params)
        start = Substep(body=cars.body, station=cars.station, arc=cars.arc, lateral=cars.lateral, grip=grip,
                        rolling_drag=rolling_drag, events=jnp.zeros(active.shape, jnp.int32))
        # The loop carries only what the next substep reads (XLA:CPU recomputes a substep's
        # chain for every loop output, so fewer outputs is measurably faster). What the step
        # reports is read off the end state: accelerations and slip from the tyre model
        # there (one vehicle evaluation), heading error from the track direction there.
        end = jax.lax.fori_loop(0, s.substeps, substep, start)
        _, aux = vehicle_substep(end.body, actions, Conditions(end.grip, end.rolling_drag, draft), car, dt)
        here = ts.row(end.station)
        heading = here.heading + jnp.clip((end.arc - here.s) / here.seg_len, 0.0, 1.0) * here.turn
        cars = cars._replace(
            body=end.body, station=end.station, arc=end.arc, lateral=end.lateral,
            heading_error=wrap_angle(end.body.yaw - heading),
            # A car covers far less than half a lap in one agent step.
            progress=cars.progress + opponents.wrap_half(end.arc - cars.arc, ts.length),
            ax=aux.ax, ay=aux.ay, slip_front=aux.slip_front, slip_rear=aux.slip_rear,
        )
        flags = {name: (end.events & (1 << bit)) != 0 for bit, name in enumerate(EVENT_FLAGS)}
        return cars, flags

    # ------------------------------------------------------------------ views and observations

    def view(self, state: EnvState, params: EnvParams) -> RaceView:
        """The ego car's RaceView of `state` (also kept in `state.view`)."""
        return self._view(state, params, track_slice(params.tracks, state.track_index))

    def _view(self, state: EnvState, params: EnvParams, ts: TrackSlice) -> RaceView:
        c = state.cars
        e = 0  # the ego car
        here = ts.row(c.station[e])
        lateral = c.lateral[e]
        edge = jnp.minimum(here.width_left - lateral, here.width_right + lateral)
        kerb = jnp.where(lateral > 0, here.kerb_left, here.kerb_right)
        # The cars one position ahead and behind (ranks are a permutation of 1..C).
        others = state.active & (jnp.arange(c.rank.shape[0]) != e)
        ahead = others & (c.rank == c.rank[e] - 1)
        behind = others & (c.rank == c.rank[e] + 1)
        gap_ahead = jnp.where(jnp.any(ahead), c.progress[jnp.argmax(ahead)] - c.progress[e], NO_GAP)
        gap_behind = jnp.where(jnp.any(behind), c.progress[e] - c.progress[jnp.argmax(behind)], NO_GAP)
        return RaceView(
            progress=c.progress[e],
            lap_progress=c.arc[e] / ts.length,
            speed=c.body.speed[e],
            longitudinal_accel=c.ax[e],
            lateral_accel=c.ay[e],
            lateral_offset=lateral,
            edge_margin=edge,
            heading_error=c.heading_error[e],
            off_course=edge < -params.course_out_margin,
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
            laps=c.laps[e],
            lap_time=state.time - c.lap_start[e],
            last_lap_time=c.last_lap[e],
            time=state.time,
            finished=c.finished[e],
            reference_speed=here.ref_speed,
        )

    def observation(self, state: EnvState, params: EnvParams, pixels: bool = True) -> dict[str, jax.Array]:
        """{"proprio": f32[PROPRIO_SIZE], "privileged": f32[4 L + 5 K]} for the ego car.

        proprio (the car's own senses): speed/50, vx/50, vy/10, ax/20, ay/20, yaw rate/2,
        steering angle / lock, previous action (2), front and rear slip angles x 5,
        off-course, on-kerb, wall contact, any car contact, lateral offset / half
        width, heading error, lap progress in [0, 1), race progress (laps done / laps),
        race position in [0, 1] (0 = leading).
        privileged (for the critic): L track-edge stations ahead, every
        `lookahead_spacing` m, as left (x, y) and right (x, y) in the car frame / 100 m;
        then the K nearest active opponents (nearest first) as relative position / 50 m,
        relative velocity / 20 m/s (car frame) and a presence flag.
        pixels (when static.pixels and `pixels`): uint8[H, W, 3] from the ego camera.
        """
        s = self.static
        ts = track_slice(params.tracks, state.track_index)
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
            dx, dy = c.body.x - body.x, c.body.y - body.y
            dist = jnp.where(state.active & (jnp.arange(s.num_cars) > 0), jnp.hypot(dx, dy), jnp.inf)
            nearest = smallest_k(dist, s.num_slots)
            wvx = c.body.vx * jnp.cos(c.body.yaw) - c.body.vy * jnp.sin(c.body.yaw)
            wvy = c.body.vx * jnp.sin(c.body.yaw) + c.body.vy * jnp.cos(c.body.yaw)
            px, py = to_car(dx[nearest], dy[nearest])
            rvx, rvy = to_car(wvx[nearest] - wvx[0], wvy[nearest] - wvy[0])
            present = jnp.isfinite(dist[nearest])
            slots = jnp.stack([px / 50.0, py / 50.0, rvx / 20.0, rvy / 20.0, jnp.ones_like(px)], axis=-1)
            parts.append(jnp.where(present[:, None], slots, 0.0).reshape(-1))
        obs = {"proprio": proprio, "privileged": jnp.concatenate(parts).astype(jnp.float32)}
        if pixels and self._render is not None:
            obs["pixels"] = self._render(params.textures, state, 0)
        return obs


PROPRIO_SIZE = 20


# ---------------------------------------------------------------------- pure pieces of a step


def _surface(row: StationRow, lateral, params: EnvParams) -> tuple[jax.Array, jax.Array]:
    """Grip factor and extra rolling drag under each car: tarmac, kerb outside the edge, grass beyond."""
    left = lateral >= 0
    beyond = jnp.abs(lateral) - jnp.where(left, row.width_left, row.width_right)
    grass = beyond > jnp.where(left, row.kerb_left, row.kerb_right)
    grip = jnp.where(beyond <= 0, 1.0, jnp.where(grass, params.offtrack_grip, params.kerb_grip))
    return grip, jnp.where(grass, params.offtrack_drag, 0.0)


SLIPSTREAM_DRAG = 0.35  # drag saved right behind another car
SLIPSTREAM_RANGE = 40.0  # m behind a car where its wake still helps


def _slipstream(ts: TrackSlice, cars: CarsState, active, car: CarParams) -> jax.Array:
    """Drag scale f32[C]: a car close behind another, in its wake, has less drag."""
    num = cars.arc.shape[0]
    behind = opponents.wrap_half(cars.arc[None, :] - cars.arc[:, None], ts.length)  # [i, j]: j ahead of i
    in_wake = (active[None, :] & ~jnp.eye(num, dtype=bool) & (behind > 0.0)
               & (jnp.abs(cars.lateral[None, :] - cars.lateral[:, None]) < car.width))
    tow = jnp.where(in_wake, jnp.clip(1.0 - behind / SLIPSTREAM_RANGE, 0.0, 1.0), 0.0)
    return 1.0 - SLIPSTREAM_DRAG * jnp.max(tow, axis=1)


EVENT_FLAGS = ("wall_contact", "hit_from_behind", "hit_other_from_behind", "side_contact")


def _pack_events(*flags) -> jax.Array:
    """Bool arrays in EVENT_FLAGS order as one i32 bit set (one loop output instead of four)."""
    return sum(flag.astype(jnp.int32) << bit for bit, flag in enumerate(flags))


class Substep(NamedTuple):
    """What one physics substep hands the next ([C] each)."""

    body: VehicleState
    station: jax.Array
    arc: jax.Array
    lateral: jax.Array
    grip: jax.Array
    rolling_drag: jax.Array
    events: jax.Array  # i32 bit set of EVENT_FLAGS seen so far in this agent step


class Motion(NamedTuple):
    """Cars' position, heading and world-frame velocity during contact handling ([C] each)."""

    x: jax.Array
    y: jax.Array
    yaw: jax.Array
    cos_yaw: jax.Array
    sin_yaw: jax.Array
    vx: jax.Array  # m/s, world frame
    vy: jax.Array

    @staticmethod
    def of(body: VehicleState) -> Motion:
        c, s = jnp.cos(body.yaw), jnp.sin(body.yaw)
        return Motion(body.x, body.y, body.yaw, c, s, body.vx * c - body.vy * s, body.vx * s + body.vy * c)

    def to_body(self, body: VehicleState) -> VehicleState:
        c, s = self.cos_yaw, self.sin_yaw
        return body.replace(x=self.x, y=self.y, yaw=self.yaw, vx=self.vx * c + self.vy * s,
                            vy=-self.vx * s + self.vy * c)


def _walls(m: Motion, proj: Projection, car: CarParams, params: EnvParams):
    """Keeps cars inside the walls: push back, bounce the normal speed, scrub the rest."""
    row = proj.row
    half = 0.5 * car.width
    over_left = proj.lateral - (row.wall_left - half)
    over_right = -proj.lateral - (row.wall_right - half)
    hit = (over_left > 0) | (over_right > 0)
    push = jnp.where(over_left > 0, -over_left, jnp.where(over_right > 0, over_right, 0.0))
    vn = m.vx * row.nx + m.vy * row.ny
    vt = m.vx * row.tx + m.vy * row.ty
    outward = jnp.where(over_left > 0, vn > 0, vn < 0)
    vn_new = jnp.where(hit & outward, -params.wall_restitution * vn, vn)
    scrub = jnp.clip(params.wall_friction * jnp.abs(vn) / jnp.maximum(jnp.abs(vt), 1.0) + 0.005, 0.0, 0.6)
    vt_new = jnp.where(hit, vt * (1.0 - scrub), vt)
    # A glancing impact turns the car along the wall, so it slides off instead of sticking.
    # The turn is at most WALL_ALIGN * pi, so a short series gives its cosine and sine.
    turn = jnp.where(hit, WALL_ALIGN * wrap_angle(row.heading - m.yaw), 0.0)
    t2 = turn * turn
    cos_t, sin_t = 1.0 - t2 / 2.0 + t2 * t2 / 24.0, turn * (1.0 - t2 / 6.0 + t2 * t2 / 120.0)
    m = Motion(
        x=m.x + push * row.nx,
        y=m.y + push * row.ny,
        yaw=m.yaw + turn,
        cos_yaw=m.cos_yaw * cos_t - m.sin_yaw * sin_t,
        sin_yaw=m.sin_yaw * cos_t + m.cos_yaw * sin_t,
        vx=vt_new * row.tx + vn_new * row.nx,
        vy=vt_new * row.ty + vn_new * row.ny,
    )
    return m, proj._replace(lateral=proj.lateral + push), hit


class Contacts(NamedTuple):
    hit_from_behind: jax.Array  # bool[C]
    hit_other_from_behind: jax.Array  # bool[C]
    side: jax.Array  # bool[C]


CONTACT_PARTNERS = 2  # nearest cars each car checks for contact during an agent step


def _contact_partners(ts: TrackSlice, cars: CarsState, active) -> jax.Array:
    """Broad phase, once per agent step: each car's nearest active cars, i32[C, K].

    A partner index equal to the car's own index means none (fewer cars than K).
    """
    num = cars.arc.shape[0]
    k = min(CONTACT_PARTNERS, num - 1)
    gap = jnp.abs(opponents.wrap_half(cars.arc[None, :] - cars.arc[:, None], ts.length))
    gap = gap + jnp.abs(cars.lateral[None, :] - cars.lateral[:, None])
    valid = active[None, :] & active[:, None] & ~jnp.eye(num, dtype=bool)
    nearest = smallest_k(jnp.where(valid, gap, jnp.inf), k)
    ok = jnp.take_along_axis(valid, nearest, axis=1)
    return jnp.where(ok, nearest, jnp.arange(num)[:, None]).astype(jnp.int32)


def _contacts(ts: TrackSlice, m: Motion, proj: Projection, partners, car: CarParams, params: EnvParams):
    """Narrow phase: contacts with the partners as track-aligned boxes.

    Impulses along the track are rear-ends (the car behind is at fault), across it side
    contacts; each car takes its mass share of the impulse and of the separation.
    """
    row = proj.row
    num = proj.arc.shape[0]
    v_along = m.vx * row.tx + m.vy * row.ty
    v_side = m.vx * row.nx + m.vy * row.ny
    mass = jnp.broadcast_to(car.mass, (num,))
    own = jnp.stack([proj.arc, proj.lateral, v_along, v_side, mass], axis=-1)  # [C, 5]
    other = own[partners]  # [C, K, 5], one gather
    d_along = opponents.wrap_half(other[..., 0] - proj.arc[:, None], ts.length)  # + when the partner is ahead
    d_side = other[..., 1] - proj.lateral[:, None]
    pen_along = car.length - jnp.abs(d_along)
    pen_side = car.width - jnp.abs(d_side)
    touch = (partners != jnp.arange(num)[:, None]) & (pen_along > 0) & (pen_side > 0)
    rear_end = touch & (pen_along / car.length < pen_side / car.width)
    side = touch & ~rear_end
    share = other[..., 4] / (other[..., 4] + mass[:, None])  # this car's share of the correction
    bounce = 1.0 + params.car_restitution

    def resolve(mask, dist, vel_other, vel, pen):
        direction = jnp.sign(dist)
        closing = (vel_other - vel[:, None]) * direction  # < 0: the pair is approaching
        dv = jnp.where(mask & (closing < 0), bounce * share * closing * direction, 0.0)
        push = jnp.where(mask, -direction * pen * share, 0.0)
        return materialised(sum_last(dv)), materialised(sum_last(push))  # read by x, y, vx, vy, arc

    dv_along, push_along = resolve(rear_end, d_along, other[..., 2], v_along, pen_along)
    dv_side, push_side = resolve(side, d_side, other[..., 3], v_side, pen_side)
    m = m._replace(
        x=m.x + push_along * row.tx + push_side * row.nx,
        y=m.y + push_along * row.ty + push_side * row.ny,
        vx=m.vx + dv_along * row.tx + dv_side * row.nx,
        vy=m.vy + dv_along * row.ty + dv_side * row.ny,
    )
    arc = proj.arc + push_along  # a push crosses the line at most once; no float remainder
    arc = jnp.where(arc < 0, arc + ts.length, jnp.where(arc >= ts.length, arc - ts.length, arc))
    proj = proj._replace(arc=arc, lateral=proj.lateral + push_side)
    contacts = Contacts(
        hit_from_behind=any_last(rear_end & (d_along < 0)),
        hit_other_from_behind=any_last(rear_end & (d_along > 0)),
        side=any_last(side),
    )
    return m, proj, contacts


def _lap_bookkeeping(cars: CarsState, prev_progress, prev_time, dt, length, race_laps) -> CarsState:
    """Laps completed, lap times (crossing time interpolated inside the step) and finish."""
    laps_now = jnp.maximum(cars.laps, jnp.floor((cars.progress - cars.lap_origin) / length).astype(jnp.int32))
    crossed = laps_now > cars.laps
    line = cars.lap_origin + laps_now.astype(jnp.float32) * length
    moved = jnp.maximum(cars.progress - prev_progress, 1e-6)
    t_cross = prev_time + dt * jnp.clip((line - prev_progress) / moved, 0.0, 1.0)
    lap = t_cross - cars.lap_start
    last_lap = jnp.where(crossed, lap, cars.last_lap)
    best_lap = jnp.where(crossed & ((cars.best_lap <= 0) | (lap < cars.best_lap)), lap, cars.best_lap)
    finish_now = ~cars.finished & (laps_now >= race_laps)
    return cars._replace(
        laps=laps_now,
        last_lap=last_lap,
        best_lap=best_lap,
        lap_start=jnp.where(crossed, t_cross, cars.lap_start),
        finished=cars.finished | finish_now,
        finish_time=jnp.where(finish_now, t_cross, cars.finish_time),
    )


def _ahead(cars: CarsState, active) -> jax.Array:
    """bool[C, C]: [i, j] is True when car j is classified ahead of car i.

    Finished cars lead, by finish time; then by progress; equal standing goes to the
    lower index; inactive cars are behind everyone. Compared exactly, not through a
    combined float score (float32 cannot tell finish times apart near 1e7).
    """
    idx = jnp.arange(cars.progress.shape[0])
    fin_i, fin_j = cars.finished[:, None], cars.finished[None, :]
    time_i, time_j = cars.finish_time[:, None], cars.finish_time[None, :]
    prog_i, prog_j = cars.progress[:, None], cars.progress[None, :]
    tie = idx[None, :] < idx[:, None]
    by_finish = jnp.where(time_j == time_i, tie, time_j < time_i)
    by_progress = jnp.where(prog_j == prog_i, tie, prog_j > prog_i)
    racing_ahead = jnp.where(fin_i, fin_j & by_finish, fin_j | by_progress)
    act_i, act_j = active[:, None], active[None, :]
    return jnp.where(act_i, act_j & racing_ahead, act_j | tie)


def _ranks(cars: CarsState, active) -> jax.Array:
    """Race positions i32[C] (1 = leading; inactive cars last)."""
    return (1 + jnp.sum(_ahead(cars, active), axis=1)).astype(jnp.int32)
