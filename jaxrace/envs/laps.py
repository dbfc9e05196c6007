"""Lap bookkeeping and race positions: pure functions of the cars' state."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrace.envs.state import CarsState
from jaxrace.rewards.api import NO_GAP


def lap_bookkeeping(cars: CarsState, prev_progress, prev_time, dt, length, race_laps) -> CarsState:
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


def ahead(cars: CarsState, active) -> jax.Array:
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


def ranks(cars: CarsState, active) -> jax.Array:
    """Race positions i32[C] (1 = leading; inactive cars last)."""
    return (1 + jnp.sum(ahead(cars, active), axis=1)).astype(jnp.int32)


def gaps(progress: jax.Array, rank: jax.Array, active: jax.Array, car: int | jax.Array
         ) -> tuple[jax.Array, jax.Array]:
    """(gap ahead, gap behind) of `car` in m: progress to the car one position ahead and behind.

    Args are per-car arrays [C] (ranks a permutation of 1..C among the active cars);
    NO_GAP where there is no such car. vmap over leading axes for a record.
    """
    others = active & (jnp.arange(rank.shape[0]) != car)
    ahead = others & (rank == rank[car] - 1)
    behind = others & (rank == rank[car] + 1)
    gap_ahead = jnp.where(jnp.any(ahead), progress[jnp.argmax(ahead)] - progress[car], NO_GAP)
    gap_behind = jnp.where(jnp.any(behind), progress[car] - progress[jnp.argmax(behind)], NO_GAP)
    return gap_ahead, gap_behind
