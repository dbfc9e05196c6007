"""What a reward function may read: `RaceView` and `Action`.

This file is the one definition of the reward API; its source text is what an LLM is
shown. Every field is for the ego car at the end of an agent step (10 Hz), and inside
a batch or a trajectory every field gains the same leading axes.
"""

from __future__ import annotations

import jax
from flax import struct

NO_GAP = 10_000.0  # m, the gap reported when there is no car ahead (or behind)


@struct.dataclass
class RaceView:
    """Facts about the ego car after one agent step (all scalars per car, SI units)."""

    progress: jax.Array
    """f32, metres driven along the centre line since the start line, unwrapped over laps
    (negative while behind the start line on the grid). Its change is the distance made."""

    lap_progress: jax.Array
    """f32 in [0, 1), fraction of the current lap done."""

    speed: jax.Array
    """f32, m/s, the car's speed over ground (0 to about 80)."""

    longitudinal_accel: jax.Array
    """f32, m/s^2, forward acceleration (negative when braking, down to about -30)."""

    lateral_accel: jax.Array
    """f32, m/s^2, sideways acceleration (+ left, about -25 to 25)."""

    lateral_offset: jax.Array
    """f32, m, distance from the centre line (+ left of the driving direction)."""

    edge_margin: jax.Array
    """f32, m, distance from the car's centre to the nearer track edge (negative outside)."""

    heading_error: jax.Array
    """f32, rad in [-pi, pi], car heading minus track direction (+ pointing left)."""

    off_course: jax.Array
    """bool, the car is beyond a track edge by more than the course-out margin."""

    on_kerb: jax.Array
    """bool, the car's centre is on a kerb just outside the edge."""

    wall_contact: jax.Array
    """bool, the car touched a wall during this step."""

    tyre_slip: jax.Array
    """f32, rad >= 0, the larger of the front and rear tyre slip angles (grip peaks near
    0.13; much more means sliding)."""

    hit_from_behind: jax.Array
    """bool, another car ran into the back of this car during this step (not our fault)."""

    hit_other_from_behind: jax.Array
    """bool, this car ran into the back of another car during this step (our fault)."""

    side_contact: jax.Array
    """bool, side-by-side contact with another car during this step."""

    rank: jax.Array
    """i32, race position, 1 = leading."""

    start_rank: jax.Array
    """i32, race position at the start (positions gained = start_rank - rank)."""

    num_cars: jax.Array
    """i32, cars in the race, the ego car included."""

    gap_ahead: jax.Array
    """f32, m, progress of the car one position ahead minus ours (NO_GAP = 10000 if none)."""

    gap_behind: jax.Array
    """f32, m, our progress minus that of the car one position behind (NO_GAP if none)."""

    lane_gap_ahead: jax.Array
    """f32, m, clear space from our nose to the tail of the nearest car ahead in our lane
    (any car whose centre is ahead of ours along the track and within a car width plus
    0.5 m of ours sideways; race order and laps do not matter); 0 when touching or
    alongside, NO_GAP if no such car with at most 100 m of clear space. Unlike gap_ahead
    it says whether we are about to run into someone."""

    laps: jax.Array
    """i32, laps completed."""

    lap_time: jax.Array
    """f32, s, time spent on the current lap."""

    last_lap_time: jax.Array
    """f32, s, time of the last completed lap (0 before the first)."""

    time: jax.Array
    """f32, s, time since the start of the episode."""

    finished: jax.Array
    """bool, the car has completed the race distance."""

    reference_speed: jax.Array
    """f32, m/s, the reference (fastest) speed of a GT3 car at this point of the race line."""


@struct.dataclass
class Action:
    """The agent's command for one step (each in [-1, 1])."""

    steering: jax.Array
    """f32, -1 full right lock, +1 full left lock."""

    throttle_brake: jax.Array
    """f32, > 0 throttle (1 = full), < 0 brake (-1 = full)."""


INT_FIELDS = frozenset({"rank", "start_rank", "num_cars", "laps"})
BOOL_FIELDS = frozenset({"off_course", "on_kerb", "wall_contact", "hit_from_behind", "hit_other_from_behind",
                         "side_contact", "finished"})


def field_dtypes(cls: type[RaceView] | type[Action]) -> dict[str, jax.numpy.dtype]:
    """{field: dtype} of a RaceView or an Action, in field order (int32, bool or float32)."""
    import dataclasses

    import jax.numpy as jnp

    return {f.name: jnp.dtype(jnp.int32 if f.name in INT_FIELDS else jnp.bool_ if f.name in BOOL_FIELDS
                              else jnp.float32) for f in dataclasses.fields(cls)}


REWARD_SIGNATURE = '''\
def reward(prev: RaceView, action: Action, curr: RaceView, params: dict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The reward for one agent step from `prev` to `curr` under `action`.

    Returns (total, components): `total` a float32 scalar, `components` a dict of named
    float32 scalars (what each term contributed; they need not sum to `total`).
    """'''

RULES = """\
Rules for a reward program (it is compiled to pure JAX, then jitted and vmapped over
thousands of cars, so every value you compute is a traced array, not a Python number):
1. Define `reward(prev, action, curr)`, or `reward(prev, action, curr, params)` when the
   program declares tunable weights as a module-level `PARAMS = {"name": number, ...}`;
   read them as `params["name"]` (tuning changes them without touching your code).
   Helper functions are allowed.
2. Use `jnp` (jax.numpy), `jax.nn`, `jax.lax` and `math`; they are already available.
   Do not import anything. There is no `np`, no I/O, no randomness, no clock.
3. No Python `if`, `and`, `or`, `not`, `min` or `max` on traced values: use
   `jnp.where(cond, a, b)`, `a & b`, `a | b`, `~a`, `jnp.minimum`, `jnp.maximum`,
   `jnp.abs`, `jnp.clip`. Booleans become numbers with `.astype(jnp.float32)`.
4. No `while` loops, no `global`, no classes, no `try`, no names or attributes that start
   with `_`, no `getattr`/`eval`/`exec`/`open`, no `jax.debug` or callbacks.
5. Return a float32 scalar and a dict of float32 scalars with string keys. The result
   must be finite for every input: guard divisions, e.g. `x / jnp.maximum(d, 1e-3)`;
   `gap_ahead` is NO_GAP (10000 m) when there is no car ahead, and `last_lap_time` is 0
   before the first lap is done.
"""


def api_text() -> str:
    """The reward API as shown to an LLM: `RaceView`, `Action`, the signature and rules.

    Generated from this module's own source, so it never drifts from the definitions.
    """
    import ast
    import inspect
    import sys

    source = inspect.getsource(sys.modules[__name__])
    tree = ast.parse(source)
    parts = [ast.get_docstring(tree) or ""]
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "NO_GAP" for t in node.targets):
            parts.append(source.splitlines()[node.lineno - 1])
        if isinstance(node, ast.ClassDef):
            lines = source.splitlines()[node.lineno - 1:node.end_lineno]  # the class without its decorator
            parts.append("\n".join(lines))
    parts += ["The entry point:\n\n" + REWARD_SIGNATURE, RULES]
    return "\n\n".join(parts)
