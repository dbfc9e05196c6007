"""Reference speed profile and lap time (host-side NumPy).

The quasi-steady-state lap simulation used by race engineers: at each point of the
line the speed is at most the cornering limit ``v^2 |k| <= mu (g + downforce / m)``;
a forward pass adds what the power (and traction) allows, a backward pass what the
brakes allow, both inside the friction circle (the longitudinal acceleration left
after the lateral one). It gives the built-in AI its target speed and the reference
lap time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrace.envs.vehicle import GRAVITY, CarParams, top_speed


def _grip(car: CarParams, v):
    """Total tyre force available per unit mass at speed v (m/s^2)."""
    down = 0.5 * car.air_density * car.cla / car.mass
    return car.mu * (GRAVITY + down * v * v)


def speed_profile(ds, curvature, car: CarParams | None = None) -> np.ndarray:
    """Fastest speed at every point of a closed line for `car`.

    Args:
        ds: f[N] length of the step from point i to i+1 (m).
        curvature: f[N] curvature at point i (1/m).
        car: CarParams with scalar fields (default GT3).

    Returns:
        f64[N] speed (m/s).
    """
    car = car or CarParams()
    car = CarParams(**{f.name: float(np.asarray(getattr(car, f.name))) for f in dataclasses.fields(car)})
    ds = np.asarray(ds, np.float64)
    kappa = np.abs(np.asarray(curvature, np.float64))
    n = len(ds)
    down = 0.5 * car.air_density * car.cla / car.mass
    v_top = top_speed(car)
    # Cornering limit: v^2 k = mu (g + down v^2)  =>  v^2 = mu g / (k - mu down).
    denom = kappa - car.mu * down
    v_corner = np.where(denom > 1e-9, np.sqrt(car.mu * GRAVITY / np.maximum(denom, 1e-9)), v_top)
    v = np.minimum(v_corner, v_top)
    rear_share = car.lf / (car.lf + car.lr)

    def long_budget(speed, k):
        grip = _grip(car, speed)
        lateral = speed * speed * k
        return grip * np.sqrt(max(0.0, 1.0 - (lateral / grip) ** 2))

    def resist(speed):
        drag = 0.5 * car.air_density * car.cda * speed * speed / car.mass
        return drag + car.rolling_resistance * (GRAVITY + down * speed * speed)

    start = int(np.argmin(v))
    # Two laps of each pass so the profile is consistent across the start point.
    for _ in range(2):
        for step in range(n):
            i = (start + step) % n
            j = (i + 1) % n
            vi = v[i]
            traction = long_budget(vi, kappa[i]) * rear_share
            drive = min(car.power / (car.mass * max(vi, 1.0)), traction)
            acc = drive - resist(vi)
            v[j] = min(v[j], np.sqrt(max(vi * vi + 2.0 * acc * ds[i], 0.0)))
        for step in range(n):
            j = (start - step) % n
            i = (j - 1) % n
            vj = v[j]
            dec = long_budget(vj, kappa[j]) + resist(vj)
            v[i] = min(v[i], np.sqrt(vj * vj + 2.0 * dec * ds[i]))
    return v


def lap_time(ds, speed) -> float:
    """Time (s) to drive a closed line of steps `ds` at point speeds `speed`."""
    ds = np.asarray(ds, np.float64)
    speed = np.asarray(speed, np.float64)
    mean = 0.5 * (speed + np.roll(speed, -1))
    return float(np.sum(ds / np.maximum(mean, 1e-3)))
