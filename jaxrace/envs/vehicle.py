"""Dynamic bicycle model of a GT3-class car.

One substep advances every car by `dt` seconds (60 Hz by default). Forces, in the
car's body frame (x forward, y left):

* tyres: a simplified Pacejka lateral curve ``mu Fz sin(C atan(B alpha))`` per axle,
  coupled to the longitudinal force by a friction circle; as with the traction control
  and ABS of a GT3 car, drive and brake forces take what the lateral force leaves
  (brakes keep a floor), so full throttle does not spin the car;
* drive on the rear axle, limited by wheel power ``P / v`` and by traction;
* brakes shared between the axles in proportion to their load (ideal balance, ABS-like:
  never more than the tyre can take);
* aerodynamic drag and downforce (``0.5 rho CdA v^2``, ``0.5 rho ClA v^2``, aero balance
  equal to the static weight distribution), and rolling resistance;
* conditions: a grip factor and an extra rolling drag (kerbs, grass) and a drag scale
  (slipstream) given per car by the caller.

Below a few m/s the explicit dynamic model is stiff, so the lateral velocity and yaw
rate are blended towards the kinematic bicycle model (the usual low-speed fix).
Walls and car-car contacts are resolved by the race, which knows the track.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

GRAVITY = 9.81
BRAKE_FLOOR = 0.3  # share of a tyre's grip the brakes may always use


@struct.dataclass
class CarParams:
    """Physical parameters of a car; every field may be a scalar or an array over cars.

    The defaults describe a GT3-class car: about 1300 kg, 370 kW at the wheels, a top
    speed near 280 km/h and racing slicks.
    """

    mass: jax.Array | float = 1300.0  # kg, with driver
    power: jax.Array | float = 370e3  # W, at the wheels
    max_brake_force: jax.Array | float = 40e3  # N, total over both axles
    lf: jax.Array | float = 1.30  # m, centre of mass to front axle
    lr: jax.Array | float = 1.40  # m, centre of mass to rear axle
    yaw_inertia: jax.Array | float = 1900.0  # kg m^2
    cda: jax.Array | float = 1.2  # m^2, drag coefficient x frontal area
    cla: jax.Array | float = 3.0  # m^2, downforce coefficient x area
    air_density: jax.Array | float = 1.225  # kg/m^3
    mu: jax.Array | float = 1.6  # tyre friction coefficient on tarmac
    tyre_b: jax.Array | float = 18.0  # Pacejka stiffness factor (1/rad); peak near 0.15 rad
    tyre_c: jax.Array | float = 1.3  # Pacejka shape factor (mild fall-off past the peak)
    rolling_resistance: jax.Array | float = 0.015  # coefficient, times normal load
    max_steer: jax.Array | float = 0.35  # rad, road-wheel angle at full lock
    steer_rate: jax.Array | float = 1.5  # rad/s, steering-rate limit at the road wheel
    # m/s; speed-sensitive steering (a game's controller assist): full lock shrinks as
    # max_steer / (1 + (v / steer_lock_speed)^2). 0 keeps a fixed lock.
    steer_lock_speed: jax.Array | float = 0.0
    length: jax.Array | float = 4.6  # m
    width: jax.Array | float = 2.0  # m

    def steering_lock(self, speed: jax.Array) -> jax.Array:
        """rad: the road-wheel angle of a full steering command at `speed` (m/s)."""
        sensitive = jnp.asarray(self.steer_lock_speed) > 0.0
        ratio = speed / jnp.where(sensitive, self.steer_lock_speed, 1.0)
        return self.max_steer / jnp.where(sensitive, 1.0 + ratio * ratio, 1.0)

    def scaled(self, mass_scale, power_scale, grip_scale) -> CarParams:
        """Balance-of-performance variant: mass (and yaw inertia), power and grip scaled."""
        return self.replace(
            mass=self.mass * mass_scale,
            yaw_inertia=self.yaw_inertia * mass_scale,
            power=self.power * power_scale,
            mu=self.mu * grip_scale,
        )


@struct.dataclass
class VehicleState:
    """Rigid-body state of cars; every field has shape ``[...]`` (one entry per car)."""

    x: jax.Array  # m, world
    y: jax.Array  # m, world
    yaw: jax.Array  # rad, world heading of the car's x axis
    vx: jax.Array  # m/s, body-frame forward velocity
    vy: jax.Array  # m/s, body-frame lateral velocity (+ left)
    yaw_rate: jax.Array  # rad/s
    steer: jax.Array  # rad, current road-wheel angle

    @property
    def speed(self) -> jax.Array:
        return jnp.sqrt(self.vx**2 + self.vy**2)


class Conditions(NamedTuple):
    """What the ground and the air around each car do to it (arrays over cars)."""

    grip: jax.Array  # multiplies mu (1 on tarmac)
    rolling_drag: jax.Array  # extra rolling-resistance coefficient (0 on tarmac)
    drag_scale: jax.Array  # multiplies aerodynamic drag (< 1 in another car's slipstream)


class VehicleAux(NamedTuple):
    """By-products of a substep, for observations and rewards (arrays over cars)."""

    ax: jax.Array  # m/s^2, body-frame longitudinal acceleration
    ay: jax.Array  # m/s^2, body-frame lateral acceleration
    slip_front: jax.Array  # rad, front slip angle
    slip_rear: jax.Array  # rad, rear slip angle


def sanitise_action(action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Replaces NaN by 0 and clips to [-1, 1].

    Args:
        action: f32[..., 2] (steering, throttle_brake).

    Returns:
        The clean action f32[..., 2] and a bool[...] flag: True where the input had a
        NaN or an entry outside [-1, 1].
    """
    action = jnp.asarray(action, jnp.float32)
    bad = jnp.any(~jnp.isfinite(action) | (jnp.abs(action) > 1.0), axis=-1)
    clean = jnp.clip(jnp.nan_to_num(action, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    return clean, bad


def top_speed(car: CarParams) -> float:
    """Speed (m/s) where wheel power equals drag plus rolling resistance (bisection, host)."""
    lo, hi = 1.0, 200.0
    for _ in range(60):
        v = 0.5 * (lo + hi)
        downforce = 0.5 * car.air_density * car.cla * v * v
        resist = 0.5 * car.air_density * car.cda * v**3 + car.rolling_resistance * (
            car.mass * GRAVITY + downforce
        ) * v
        lo, hi = (v, hi) if resist < car.power else (lo, v)
    return float(lo)


# Minimax coefficients of atan(x) / x on [-1, 1] in powers of x^2 (error < 1e-5 rad).
_ATAN_COEFFS = (0.99997726, -0.33262347, 0.19354346, -0.11643287, 0.05265332, -0.01172120)


def fast_atan(x: jax.Array) -> jax.Array:
    """arctan to 1e-5 rad with plain arithmetic: XLA:CPU's arctan costs ~40x an add.

    For |x| > 1 it uses atan(x) = sign(x) pi/2 - atan(1/x).
    """
    big = jnp.abs(x) > 1.0
    z = jnp.where(big, 1.0 / jnp.where(big, x, 1.0), x)
    z2 = z * z
    poly = _ATAN_COEFFS[-1]
    for coeff in _ATAN_COEFFS[-2::-1]:
        poly = poly * z2 + coeff
    small = z * poly
    return jnp.where(big, jnp.sign(x) * (0.5 * jnp.pi) - small, small)


def _pacejka(alpha, b, c):
    return jnp.sin(c * fast_atan(b * alpha))


def vehicle_substep(
    state: VehicleState,
    action: jax.Array,
    conditions: Conditions,
    car: CarParams,
    dt: float,
) -> tuple[VehicleState, VehicleAux]:
    """Advances cars by one physics substep.

    Args:
        state: VehicleState with fields of shape [C].
        action: f32[C, 2] sanitised (steering, throttle_brake) in [-1, 1]; +steering
            turns left; throttle_brake > 0 drives, < 0 brakes (there is no reverse).
        conditions: per-car grip factor, extra rolling drag and drag scale, each f32[C].
        car: CarParams, fields scalars or f32[C].
        dt: substep length in seconds (static).

    Returns:
        The new VehicleState and the substep's accelerations and slip angles.
    """
    steer_cmd, pedal = action[..., 0], action[..., 1]
    wheelbase = car.lf + car.lr
    mu = car.mu * conditions.grip

    # Steering actuator: move towards the commanded angle at a limited rate.
    steer_target = steer_cmd * car.steering_lock(jnp.abs(state.vx))
    max_delta = car.steer_rate * dt
    steer = state.steer + jnp.clip(steer_target - state.steer, -max_delta, max_delta)

    vx, vy, r = state.vx, state.vy, state.yaw_rate
    v2 = vx * vx + vy * vy
    downforce = 0.5 * car.air_density * car.cla * v2
    total_load = car.mass * GRAVITY + downforce
    load_f = total_load * car.lr / wheelbase
    load_r = total_load * car.lf / wheelbase

    # Lateral forces from the slip angles (on |vx|, so the force always opposes slip).
    vx_safe = jnp.maximum(jnp.abs(vx), 1.0)
    slip_f = steer - fast_atan((vy + car.lf * r) / vx_safe)
    slip_r = -fast_atan((vy - car.lr * r) / vx_safe)
    grip_f, grip_r = mu * load_f, mu * load_r
    fy_f = grip_f * _pacejka(slip_f, car.tyre_b, car.tyre_c)
    fy_r = grip_r * _pacejka(slip_r, car.tyre_b, car.tyre_c)

    # Longitudinal forces get what the friction circle leaves (traction control and
    # ABS keep the car steerable; the brakes always keep a floor of BRAKE_FLOOR).
    room_f = jnp.sqrt(jnp.maximum(grip_f**2 - fy_f**2, 0.0))
    room_r = jnp.sqrt(jnp.maximum(grip_r**2 - fy_r**2, 0.0))
    forward = jnp.tanh(vx / 0.5)  # smooth sign: brakes and rolling drag oppose motion
    drive = jnp.maximum(pedal, 0.0) * car.power / jnp.maximum(jnp.abs(vx), 5.0)
    brake = jnp.maximum(-pedal, 0.0) * car.max_brake_force
    brake_f = jnp.minimum(brake * load_f / total_load, jnp.maximum(room_f, BRAKE_FLOOR * grip_f))
    brake_r = jnp.minimum(brake * load_r / total_load, jnp.maximum(room_r, BRAKE_FLOOR * grip_r))
    fx_f = -brake_f * forward
    # Traction control: past the rear tyre's peak slip angle, power fades out (by 1.5x the
    # peak it is gone), so throttle cannot keep a sliding rear sliding.
    peak = jnp.tan(0.5 * jnp.pi / car.tyre_c) / car.tyre_b
    traction = jnp.clip(1.0 - (jnp.abs(slip_r) - peak) / (0.5 * peak), 0.0, 1.0)
    fx_r = jnp.minimum(drive, room_r * traction) - brake_r * forward
    # Only braking beyond the room (the floor) eats into the lateral force.
    lat_f = jnp.sqrt(jnp.maximum(grip_f**2 - fx_f**2, 0.0))
    lat_r = jnp.sqrt(jnp.maximum(grip_r**2 - fx_r**2, 0.0))
    fy_f = jnp.clip(fy_f, -lat_f, lat_f)
    fy_r = jnp.clip(fy_r, -lat_r, lat_r)

    drag = 0.5 * car.air_density * car.cda * conditions.drag_scale * vx * jnp.abs(vx)
    rolling = (car.rolling_resistance + conditions.rolling_drag) * total_load * forward

    cos_s, sin_s = jnp.cos(steer), jnp.sin(steer)
    force_x = fx_r + fx_f * cos_s - fy_f * sin_s - drag - rolling
    force_y = fy_r + fy_f * cos_s + fx_f * sin_s
    moment = car.lf * (fy_f * cos_s + fx_f * sin_s) - car.lr * fy_r
    ax = force_x / car.mass
    ay = force_y / car.mass

    # Semi-implicit Euler: velocities first, then positions with the new velocities.
    new_vx = vx + (ax + vy * r) * dt
    # Rolling drag and brakes must not reverse a (nearly) stopped car.
    new_vx = jnp.where((vx >= 0.0) & (pedal <= 0.0), jnp.maximum(new_vx, 0.0), new_vx)
    new_vy = vy + (ay - vx * r) * dt
    new_r = r + moment / car.yaw_inertia * dt

    # Low-speed blend towards the kinematic bicycle model.
    kin_r = new_vx * (sin_s / cos_s) / wheelbase
    kin_vy = kin_r * car.lr
    w = jnp.clip((jnp.abs(new_vx) - 3.0) / 3.0, 0.0, 1.0)
    new_vy = w * new_vy + (1.0 - w) * kin_vy
    new_r = w * new_r + (1.0 - w) * kin_r

    yaw = state.yaw + new_r * dt
    cos_y, sin_y = jnp.cos(yaw), jnp.sin(yaw)
    x = state.x + (new_vx * cos_y - new_vy * sin_y) * dt
    y = state.y + (new_vx * sin_y + new_vy * cos_y) * dt
    new_state = VehicleState(x=x, y=y, yaw=yaw, vx=new_vx, vy=new_vy, yaw_rate=new_r, steer=steer)
    return new_state, VehicleAux(ax=ax, ay=ay, slip_front=slip_f, slip_rear=slip_r)
