"""The physics of one agent step: substeps of every car, the surface under it, events."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrace.envs import opponents
from jaxrace.envs.contacts import Contacts, Motion, contact_partners, contacts, slipstream, walls
from jaxrace.envs.state import CarsState, EnvParams, StaticParams, select_tree
from jaxrace.envs.track import StationRow, TrackSlice, project, wrap_angle
from jaxrace.envs.vehicle import CarParams, Conditions, VehicleState, vehicle_substep
from jaxrace.envs.xla_cpu import materialised


def surface_grip(row: StationRow, lateral, params: EnvParams) -> tuple[jax.Array, jax.Array]:
    """Grip factor and extra rolling drag under each car: tarmac, kerb outside the edge, grass beyond."""
    left = lateral >= 0
    beyond = jnp.abs(lateral) - jnp.where(left, row.width_left, row.width_right)
    grass = beyond > jnp.where(left, row.kerb_left, row.kerb_right)
    grip = jnp.where(beyond <= 0, 1.0, jnp.where(grass, params.offtrack_grip, params.kerb_grip))
    return grip, jnp.where(grass, params.offtrack_drag, 0.0)




EVENT_FLAGS = ("wall_contact", "hit_from_behind", "hit_other_from_behind", "side_contact")


def pack_events(*flags) -> jax.Array:
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




def advance(static: StaticParams, ts: TrackSlice, cars: CarsState, active, actions, params: EnvParams,
            car: CarParams) -> tuple[CarsState, dict[str, jax.Array]]:
    """One agent step of physics: `static.substeps` substeps of every car, walls and contacts.

    Returns the moved cars and the step's event flags ({name in EVENT_FLAGS: bool[C]}).
    """
    s = static
    dt = s.dt / s.substeps
    partners = contact_partners(ts, cars, active) if s.num_cars > 1 else None
    draft = slipstream(ts, cars, active, car)

    def substep(_, carry: Substep) -> Substep:
        body, _ = vehicle_substep(carry.body, actions, Conditions(carry.grip, carry.rolling_drag, draft), car, dt)
        body = jax.tree.map(materialised, body)  # read by every output of the substep
        proj = project(ts, jnp.stack([body.x, body.y], -1), carry.station)
        motion, proj, wall = walls(Motion.of(body), proj, car, params)
        contact = Contacts(*(jnp.zeros_like(active),) * 3)
        if partners is not None:
            motion, proj, contact = contacts(ts, motion, proj, partners, car, params)
        # Inactive cars stay where they are (their masks keep them out of everything).
        lateral = jnp.where(active, proj.lateral, carry.lateral)
        grip, rolling_drag = surface_grip(proj.row, lateral, params)
        return Substep(
            body=select_tree(active, motion.to_body(body), carry.body),
            station=jnp.where(active, proj.station, carry.station),
            arc=jnp.where(active, proj.arc, carry.arc),
            lateral=lateral, grip=grip, rolling_drag=rolling_drag,
            events=carry.events | pack_events(wall & active, contact.hit_from_behind,
                                               contact.hit_other_from_behind, contact.side),
        )

    grip, rolling_drag = surface_grip(ts.row(cars.station), cars.lateral, params)
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
