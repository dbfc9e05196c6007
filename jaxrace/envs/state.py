"""The env's data: static configuration, traced parameters and episode state (Craftax's three tiers).

`StaticParams` fixes shapes and code paths (hashable; changing it recompiles),
`EnvParams` holds traced values (vmappable for sweeps and domain randomisation) and
`EnvState` everything that changes during an episode. Per-car arrays have shape [C]
with the ego car at index 0.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxrace.envs.render import TrackTextures
from jaxrace.envs.track import Track
from jaxrace.envs.vehicle import CarParams, VehicleState
from jaxrace.rewards.api import RaceView

START_MODES = ("time_trial", "grid_back", "random")
MAX_OPPONENTS = 19


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
    opponent_frame: str = "car"  # their relative states in the car's frame, or in the track's ("track")
    opponent_accel: bool = False  # add each slot's longitudinal acceleration (its brake lights)
    lane_headway: bool = False  # add the time headway and closing rate to the car ahead in our lane
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
        if self.opponent_frame not in ("car", "track"):
            raise ValueError(f"opponent_frame must be 'car' or 'track', got {self.opponent_frame!r}")
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

    @property
    def slot_size(self) -> int:
        """Numbers per opponent slot in the privileged observation."""
        return 6 if self.opponent_accel else 5


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
    terminate_on_course_out: jax.Array  # bool: an episode ends at a course-out (not while an off-track start is off)
    terminate_on_contact: jax.Array  # bool: an episode ends when the ego car runs into the back of another car
    random_start_speed: jax.Array  # f32[2], random starts: speed range / reference speed
    random_start_gap: jax.Array  # f32, random starts: m between consecutive cars (0: spread round the lap)
    grid_start_prob: jax.Array  # f32, random starts: chance an episode starts standing on the grid, ego car last
    corner_start_prob: jax.Array  # f32, packed random starts: chance of grid formation at speed before a braking zone
    offtrack_start_prob: jax.Array  # f32, random starts: chance the ego car starts off course, to learn to rejoin
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
    off_since_start: jax.Array  # bool, the ego car has been off the course since the episode began


def select_tree(cond, a, b):
    """Selects between two pytrees; `cond` broadcasts against leading axes."""

    def pick(x, y):
        c = jnp.reshape(cond, jnp.shape(cond) + (1,) * (jnp.ndim(x) - jnp.ndim(cond)))
        return jnp.where(c, x, y)

    return jax.tree.map(pick, a, b)


def per_env_params(env_params: EnvParams, num_envs: int, **fields) -> EnvParams:
    """EnvParams with a leading env axis: each env of a trainer gets its own scenario.

    `fields` maps an EnvParams field to num_envs values, e.g.
    `num_active_opponents=[0] * 8 + [7] * 8` trains half the envs alone (time trials)
    and half in traffic. Every other field is broadcast.
    """
    def broadcast(x):
        return jnp.broadcast_to(x, (num_envs, *jnp.shape(x)))

    batched = jax.tree.map(broadcast, env_params)
    for name, values in fields.items():
        values = jnp.asarray(values, getattr(env_params, name).dtype)
        if values.shape[:1] != (num_envs,):
            raise ValueError(f"per_env_params: {name} needs {num_envs} values (one per env), got shape {values.shape}")
        batched = batched.replace(**{name: values})
    return batched


def race_fields(params: EnvParams, key: jax.Array, num_races: int, skill_spread: float = 0.03) -> EnvParams:
    """EnvParams with a leading race axis: each race its own AI field, so races differ.

    The dynamics are deterministic and a grid start has no randomness, so races that
    share params are copies of one race. Here every opponent's skill is drawn within
    +-`skill_spread` of its configured one and its aggression uniformly in [0, 1]
    (the ego car's entries are unused). Use with `evaluate(..., params_per_race=True)`.
    """
    cars = params.skill.shape[-1]
    k_skill, k_aggr = jax.random.split(key)
    skill = params.skill + jax.random.uniform(k_skill, (num_races, cars), minval=-skill_spread, maxval=skill_spread)
    aggression = jax.random.uniform(k_aggr, (num_races, cars))
    return jax.vmap(lambda s, a: params.replace(skill=s, aggression=a))(skill, aggression)
