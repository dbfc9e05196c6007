"""The race env: a thin gymnax-style API over the pure sub-steps of an agent step.

Car 0 is the ego car (driven by the agent); cars 1..num_opponents are driven by the
built-in AI, of which the first `params.num_active_opponents` take part. One agent
step (`dt` = 0.1 s) is: the AI's actions, physics (`physics.advance`: `substeps`
substeps of every car, walls and car-car contacts at 60 Hz), lap bookkeeping and
ranks (`laps`), then the RaceView and the observation (`observation`). The types live
in `state`, walls and contacts in `contacts`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrace.envs import opponents
from jaxrace.envs.laps import lap_bookkeeping, ranks
from jaxrace.envs.observation import observation, observation_shapes, race_view
from jaxrace.envs.physics import advance
from jaxrace.envs.render import make_renderer, make_textures
from jaxrace.envs.state import (
    MAX_OPPONENTS,
    START_MODES,
    CarsState,
    EnvParams,
    EnvState,
    StaticParams,
    select_tree,
)
from jaxrace.envs.track import Track, TrackSlice, num_tracks, point_at, track_slice
from jaxrace.envs.vehicle import CarParams, VehicleState, sanitise_action
from jaxrace.rewards.api import RaceView

__all__ = ["MAX_OPPONENTS", "START_MODES", "EnvParams", "EnvState", "RaceEnv", "StaticParams"]

_GRID_SPACING = 8.0  # m between grid slots (two staggered columns)
_CORNER_TRIES = 8  # random places a corner start chooses its braking zone from
_CORNER_LOOKAHEAD = 150.0  # m over which a corner start measures the fall in reference speed
# fold_in tags of further draws of a reset: 0-5 would repeat its six split keys, and a key
# folded from k_slot would repeat the bits of the slot permutation (fold_in(k, i) == split(k)[i])
_CORNER_KEY = 6
_GRID_KEY = 7
_OFFTRACK_KEY = 8
_OFFTRACK_HEADING = 0.5  # rad: an off-track start points up to this far from the track's heading


def _station_at(ts: TrackSlice, arc: jax.Array) -> jax.Array:
    """i32[...], the station at `arc` m along the lap (stations are equally spaced)."""
    return jnp.floor((arc % ts.length) / (ts.length / ts.n)).astype(jnp.int32)


def _ref_speed_at(ts: TrackSlice, arc: jax.Array) -> jax.Array:
    """f32[...], the reference speed at `arc` m along the lap."""
    return ts.row(_station_at(ts, arc)).ref_speed


class RaceEnv:
    """A racing environment with the functional API of gymnax 1.0.

    The object holds only its `StaticParams` (and the renderer built from them); all
    arrays live in `EnvParams` and `EnvState`, and every method is a pure function of
    its arguments.
    """

    def __init__(self, static: StaticParams):
        self.static = static
        self._render = make_renderer(static) if static.pixels else None

    # ------------------------------------------------------------------ params

    def default_params(self, tracks: Track, **overrides) -> EnvParams:
        """EnvParams for `tracks` (one Track or a stacked set) with default values."""
        num_cars = self.static.num_cars
        ones = jnp.ones((num_cars,), jnp.float32)
        base = dict(
            tracks=tracks,
            track_index=jnp.int32(0 if num_tracks(tracks) == 1 else -1),
            car=CarParams(),
            mass_scale=ones,
            power_scale=ones,
            grip_scale=ones,
            skill=jnp.linspace(0.97, 0.9, num_cars).astype(jnp.float32),
            aggression=jnp.full((num_cars,), 0.5, jnp.float32),
            num_active_opponents=jnp.int32(self.static.num_opponents),
            laps=jnp.int32(1),
            time_limit=jnp.float32(600.0),
            course_out_margin=jnp.float32(1.0),
            terminate_on_course_out=jnp.bool_(False),
            terminate_on_contact=jnp.bool_(False),
            random_start_speed=jnp.array([0.3, 0.9], jnp.float32),
            random_start_gap=jnp.float32(0.0),
            grid_start_prob=jnp.float32(0.0),
            corner_start_prob=jnp.float32(0.0),
            offtrack_start_prob=jnp.float32(0.0),
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
        return observation_shapes(self.static)

    def render(self, state: EnvState, params: EnvParams, car: int | jax.Array = 0) -> jax.Array:
        """uint8[H, W, 3], the camera image of `car` (needs static.pixels)."""
        if self._render is None:
            raise ValueError("this env renders nothing: make it with pixels=True")
        return self._render(params.textures, state, car)

    def _with_pixels(self, obs: dict, state: EnvState, params: EnvParams) -> dict:
        """The one place the ego camera is rendered into an observation."""
        if self._render is not None:
            obs = {**obs, "pixels": self._render(params.textures, state, 0)}
        return obs

    # ------------------------------------------------------------------ reset

    def reset(self, key: jax.Array, params: EnvParams) -> tuple[dict, EnvState]:
        """Starts a race. Returns (obs, state); different keys give different starts."""
        state, ts = self._initial_state(key, params)
        return self._with_pixels(observation(self.static, state, params, ts), state, params), state

    reset_env = reset

    def _initial_state(self, key, params: EnvParams) -> tuple[EnvState, TrackSlice]:
        """A fresh episode's state, and the track slice it races on."""
        s = self.static
        num_cars = s.num_cars
        k_track, k_slot, k_phase, k_jitter, k_lateral, k_speed = jax.random.split(key, 6)
        n_tracks = num_tracks(params.tracks)
        drawn = jax.random.randint(k_track, (), 0, n_tracks)
        track_index = jnp.where(params.track_index >= 0, params.track_index, drawn).astype(jnp.int32)
        ts = track_slice(params.tracks, track_index)
        idx = jnp.arange(num_cars)
        n_active = jnp.clip(params.num_active_opponents, 0, s.num_opponents)
        active = idx <= n_active

        # Two staggered columns behind the line, standing; the ego car takes the last slot.
        grid_slot = jnp.where(idx == 0, n_active, idx - 1)
        line = ts.row(jnp.int32(0))
        grid_progress = -(_GRID_SPACING + _GRID_SPACING * grid_slot).astype(jnp.float32)
        grid_lateral = (jnp.where(grid_slot % 2 == 0, 1.0, -1.0)
                        * jnp.minimum(2.5, jnp.minimum(line.width_left, line.width_right) - 1.5))
        zeros = jnp.zeros((num_cars,), jnp.float32)
        if s.start == "random":
            # Equal slots round the lap (or `random_start_gap` apart: a pack in traffic at a
            # random place), shuffled, with jitter inside each slot.
            packed = params.random_start_gap > 0
            spacing = jnp.where(packed, jnp.minimum(params.random_start_gap, ts.length / num_cars),
                                ts.length / num_cars)
            slot = jax.random.permutation(k_slot, num_cars)
            phase = jax.random.uniform(k_phase, (), maxval=ts.length)
            jitter = jax.random.uniform(k_jitter, (num_cars,), maxval=0.5) * spacing
            arc = (phase + slot * spacing + jitter) % ts.length
            here = ts.row(_station_at(ts, arc))
            half = jnp.minimum(here.width_left, here.width_right) - 1.5
            lateral = jax.random.uniform(k_lateral, (num_cars,), minval=-1.0, maxval=1.0) * jnp.maximum(half, 0.0)
            frac = jax.random.uniform(k_speed, (num_cars,), minval=params.random_start_speed[0],
                                      maxval=params.random_start_speed[1])
            # A pack shares one speed (within 5%), or its cars would run into each other at once.
            k_pack = jax.random.fold_in(k_speed, 1)
            common = jax.random.uniform(k_pack, (), minval=params.random_start_speed[0],
                                        maxval=params.random_start_speed[1])
            near = common * (1.0 + 0.05 * jax.random.uniform(jax.random.fold_in(k_speed, 2), (num_cars,),
                                                             minval=-1.0, maxval=1.0))
            frac = jnp.where(packed, near, frac)
            speed = frac * here.ref_speed
            # Some packs start as a race's first corners do: in grid formation at speed, just
            # before a braking zone (of 8 random places, the one whose reference speed falls
            # most over the next 150 m), the ego car in a random slot among the active cars.
            k_tries, k_corner_speed, k_corner = jax.random.split(jax.random.fold_in(key, _CORNER_KEY), 3)
            tries = jax.random.uniform(k_tries, (_CORNER_TRIES,), maxval=ts.length)
            drop = _ref_speed_at(ts, tries) - _ref_speed_at(ts, tries + _CORNER_LOOKAHEAD)
            front = tries[jnp.argmax(drop)]
            formation = jnp.argsort(jnp.argsort(jnp.where(active, slot, num_cars + slot)))  # active cars first
            corner_arc = (front - _GRID_SPACING * formation) % ts.length
            corner_here = ts.row(_station_at(ts, corner_arc))
            corner_half = jnp.minimum(corner_here.width_left, corner_here.width_right) - 1.5
            corner_lateral = jnp.where(formation % 2 == 0, 1.0, -1.0) * jnp.clip(corner_half, 0.0, 2.5)
            # one speed, from the middle to the top of the random starts' range, of the slowest
            # reference speed under the pack
            slowest = jnp.min(jnp.where(active, corner_here.ref_speed, jnp.inf))
            corner_frac = jax.random.uniform(k_corner_speed, (),
                                             minval=0.5 * (params.random_start_speed[0] + params.random_start_speed[1]),
                                             maxval=params.random_start_speed[1])
            at_corner = packed & (jax.random.uniform(k_corner) < params.corner_start_prob)
            arc = jnp.where(at_corner, corner_arc, arc)
            lateral = jnp.where(at_corner, corner_lateral, lateral)
            speed = jnp.where(at_corner, corner_frac * slowest, speed)
            progress = opponents.wrap_half(arc - arc[0], ts.length)
            lap_origin = progress
            # Some episodes start as a race does: standing on the grid (the same layout as start="grid_back").
            on_grid = jax.random.uniform(jax.random.fold_in(key, _GRID_KEY)) < params.grid_start_prob
            progress = jnp.where(on_grid, grid_progress, progress)
            lateral = jnp.where(on_grid, grid_lateral, lateral)
            arc = jnp.where(on_grid, grid_progress % ts.length, arc)
            speed = jnp.where(on_grid, 0.0, speed)
            lap_origin = jnp.where(on_grid, 0.0, lap_origin)
            # Some episodes start with the ego car off the course, on the run-off beyond an
            # edge at reduced speed and pointing off the track's heading, so rejoining is
            # trained: a car that leaves the track in a race has to come back to it.
            k_off, k_side, k_depth, k_turn = jax.random.split(jax.random.fold_in(key, _OFFTRACK_KEY), 4)
            ego_row = ts.row(_station_at(ts, arc[0]))
            left = jax.random.uniform(k_side) < 0.5
            width, wall = jnp.where(left, ego_row.width_left, ego_row.width_right), jnp.where(
                left, ego_row.wall_left, ego_row.wall_right)
            room = wall - width - params.course_out_margin - 2.5  # the car's centre stays 2 m off the wall
            off = (jax.random.uniform(k_off) < params.offtrack_start_prob) & ~on_grid & (room > 0)
            depth = params.course_out_margin + 0.5 + jax.random.uniform(k_depth) * jnp.maximum(room, 0.0)
            off_lateral = jnp.where(left, 1.0, -1.0) * (width + depth)
            lateral = jnp.where(off & (idx == 0), off_lateral, lateral)
            speed = jnp.where(off & (idx == 0), 0.6 * speed, speed)
            turn = jnp.where(off & (idx == 0), jax.random.uniform(k_turn, minval=-1.0, maxval=1.0)
                             * _OFFTRACK_HEADING, 0.0)
        elif s.start == "time_trial":
            progress = zeros
            lateral = jnp.broadcast_to(line.raceline, (num_cars,))
            arc, speed, lap_origin = zeros, zeros, zeros
        else:
            progress, lateral = grid_progress, grid_lateral
            arc, speed, lap_origin = grid_progress % ts.length, zeros, zeros
        if s.start != "random":
            turn = zeros
        xy, station = point_at(ts, arc, lateral)
        start_row = ts.row(station)
        yaw = start_row.heading + turn
        false = jnp.zeros((num_cars,), bool)
        body = VehicleState(x=xy[:, 0], y=xy[:, 1], yaw=yaw, vx=speed.astype(jnp.float32), vy=zeros,
                            yaw_rate=zeros, steer=zeros)
        lane = lateral - start_row.raceline
        cars = CarsState(
            body=body, station=station, arc=arc, lateral=lateral, heading_error=turn, progress=progress,
            lap_origin=lap_origin, laps=jnp.zeros((num_cars,), jnp.int32), lap_start=zeros, last_lap=zeros,
            best_lap=zeros, finished=false, finish_time=zeros, prev_action=jnp.zeros((num_cars, 2), jnp.float32),
            ax=zeros, ay=zeros, slip_front=zeros, slip_rear=zeros, lane=lane, wall_contact=false, hit_from_behind=false,
            hit_other_from_behind=false, side_contact=false, start_rank=jnp.zeros((num_cars,), jnp.int32),
            rank=jnp.zeros((num_cars,), jnp.int32),
        )
        rank = ranks(cars, active)
        cars = cars._replace(rank=rank, start_rank=rank)
        state = EnvState(cars=cars, active=active, track_index=track_index, time=jnp.float32(0.0),
                         steps=jnp.int32(0), bad_actions=jnp.int32(0), view=None, off_since_start=jnp.bool_(False))
        view = race_view(state, params, ts)
        return state.replace(view=view, off_since_start=view.off_course), ts

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
        reset_state, reset_ts = self._initial_state(key, params)
        reset_obs = observation(self.static, reset_state, params, reset_ts)
        done = terminated | truncated
        info["final_observation"] = obs
        state = select_tree(done, reset_state, next_state)
        obs = select_tree(done, reset_obs, obs)
        return self._with_pixels(obs, state, params), state, reward, terminated, truncated, info

    def step_env(self, key: jax.Array, state: EnvState, action: jax.Array, params: EnvParams):
        """One agent step without auto-reset (see `step`)."""
        del key  # the dynamics are deterministic
        obs, next_state, reward, terminated, truncated, info = self._step(state, action, params)
        return self._with_pixels(obs, next_state, params), next_state, reward, terminated, truncated, info

    def _step(self, state: EnvState, action: jax.Array, params: EnvParams):
        """The sub-steps of one agent step; the observation has no pixels."""
        s = self.static
        ts = track_slice(params.tracks, state.track_index)
        car = params.car.scaled(params.mass_scale, params.power_scale, params.grip_scale)
        ego_action, bad = sanitise_action(action)
        ai_action, lane = self._ai(state, params, ts, car)
        actions = ai_action.at[0].set(ego_action)
        cars = state.cars._replace(lane=lane)
        cars, step_flags = advance(s, ts, cars, state.active, actions, params, car)
        time = state.time + s.dt
        cars = lap_bookkeeping(cars, state.cars.progress, state.time, s.dt, ts.length, params.laps)
        cars = cars._replace(prev_action=actions, rank=ranks(cars, state.active), **step_flags)
        next_state = state.replace(cars=cars, time=time, steps=state.steps + 1,
                                   bad_actions=state.bad_actions + bad.astype(jnp.int32))
        view = race_view(next_state, params, ts)
        # An episode that starts off the course (`offtrack_start_prob`) is not a course-out
        # until the car has rejoined the course and left it again.
        off_since_start = state.off_since_start & view.off_course
        next_state = next_state.replace(view=view, off_since_start=off_since_start)
        reward = view.progress - state.view.progress
        terminated = (view.finished | (params.terminate_on_course_out & view.off_course & ~off_since_start)
                      | (params.terminate_on_contact & view.hit_other_from_behind))
        truncated = (time >= params.time_limit) & ~terminated
        info = {"view": view, "bad_action": bad, "bad_action_count": next_state.bad_actions}
        obs = observation(s, next_state, params, ts)
        return obs, next_state, reward, terminated, truncated, info

    def ai_action(self, state: EnvState, params: EnvParams, sees_traffic: jax.Array | bool = True) -> jax.Array:
        """The built-in AI's action f32[2] for the ego car: a baseline policy.

        `sees_traffic` False (bool[] or a Python bool): the ego drives as if alone on the track,
        so it runs into the cars ahead of it (a careless driver, for preferences with contacts).
        """
        ts = track_slice(params.tracks, state.track_index)
        car = params.car.scaled(params.mass_scale, params.power_scale, params.grip_scale)
        alone = state.active & (jnp.arange(state.active.shape[-1]) == 0)
        state = state.replace(active=jnp.where(sees_traffic, state.active, alone))
        return self._ai(state, params, ts, car)[0][0]

    def _ai(self, state, params, ts, car):
        cars = state.cars
        inputs = opponents.DriverInput(body=cars.body, station=cars.station, arc=cars.arc, lateral=cars.lateral,
                                       lane=cars.lane, accel=cars.ax, active=state.active)
        return opponents.drive(ts, inputs, params.skill, params.aggression, car, self.static.dt)

    # ------------------------------------------------------------------ views and observations

    def view(self, state: EnvState, params: EnvParams) -> RaceView:
        """The ego car's RaceView of `state` (also kept in `state.view`)."""
        return race_view(state, params, track_slice(params.tracks, state.track_index))

    def observation(self, state: EnvState, params: EnvParams, pixels: bool = True) -> dict[str, jax.Array]:
        """The ego car's observation (see `jaxrace.envs.observation.observation`); pixels if asked."""
        obs = observation(self.static, state, params, track_slice(params.tracks, state.track_index))
        return self._with_pixels(obs, state, params) if pixels else obs
