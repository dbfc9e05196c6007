"""How cars meet walls and each other: walls, car-car contacts, slipstream.

Contacts are solved in the track frame: cars are boxes aligned with the track, which
is what they are during racing; a contact along the track is a rear-end (the car
behind is at fault), across it a side contact.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrace.envs import opponents
from jaxrace.envs.state import CarsState, EnvParams
from jaxrace.envs.track import Projection, TrackSlice, wrap_angle
from jaxrace.envs.vehicle import CarParams, VehicleState
from jaxrace.envs.xla_cpu import any_last, materialised, smallest_k, sum_last

WALL_ALIGN = 0.1  # share of the angle to the wall that one contact substep takes away


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


def walls(m: Motion, proj: Projection, car: CarParams, params: EnvParams):
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


def contact_partners(ts: TrackSlice, cars: CarsState, active) -> jax.Array:
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


def contacts(ts: TrackSlice, m: Motion, proj: Projection, partners, car: CarParams, params: EnvParams):
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




SLIPSTREAM_DRAG = 0.35  # drag saved right behind another car
SLIPSTREAM_RANGE = 40.0  # m behind a car where its wake still helps


def slipstream(ts: TrackSlice, cars: CarsState, active, car: CarParams) -> jax.Array:
    """Drag scale f32[C]: a car close behind another, in its wake, has less drag."""
    num = cars.arc.shape[0]
    behind = opponents.wrap_half(cars.arc[None, :] - cars.arc[:, None], ts.length)  # [i, j]: j ahead of i
    in_wake = (active[None, :] & ~jnp.eye(num, dtype=bool) & (behind > 0.0)
               & (jnp.abs(cars.lateral[None, :] - cars.lateral[:, None]) < car.width))
    tow = jnp.where(in_wake, jnp.clip(1.0 - behind / SLIPSTREAM_RANGE, 0.0, 1.0), 0.0)
    return 1.0 - SLIPSTREAM_DRAG * jnp.max(tow, axis=1)
