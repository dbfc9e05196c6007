"""Ego-camera pixels: a pure-JAX renderer, vmappable over cars, envs and tracks.

Each track is rasterised once on the host into a texture of surface classes (tarmac,
kerbs, run-off, grass, walls, start line) plus a skyline: a ring of trees, buildings
and grandstands at a finite distance around the circuit, so that parallax tells where
on the track the car is. Per step, the work is per-pixel arithmetic and one texture
lookup per ground pixel:

- the camera is rigid on the car (no roll or pitch), so every pixel's ray, and where it
  meets the ground in the car's frame, is a constant of the static config; a row is all
  sky or all ground;
- ground pixels rotate their constant offset by the car's yaw and read the texture;
- sky pixels compare their elevation with the skyline height of their column, which
  costs one ray-circle intersection per column;
- cars are screen rectangles (chase) or rotated boxes (top-down); where they overlap, the
  nearer car wins (chase) so a nearer car occludes a farther one.

Textures hold colours, not classes: a pixel is one packed RGBA word (`PALETTE32`) from
its lookup to the end, where the words are split into bytes once.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrace.envs.track import Track, num_tracks
from jaxrace.envs.xla_cpu import materialised

CAMERAS = ("chase", "topdown")

# Surface and object classes, and their colours.
_CLASSES = [
    ("sky_high", (96, 150, 220)), ("sky_low", (170, 200, 235)), ("trees", (34, 84, 40)),
    ("buildings", (120, 118, 128)), ("stands", (200, 70, 60)), ("tarmac", (88, 88, 92)),
    ("kerb_red", (210, 30, 30)), ("kerb_white", (240, 240, 240)), ("runoff", (150, 140, 115)),
    ("grass_a", (70, 150, 60)), ("grass_b", (60, 135, 52)), ("wall", (40, 60, 150)), ("line", (250, 250, 250)),
    ("outside", (45, 95, 45)), ("car_dark", (20, 20, 24)), ("ego", (250, 200, 20)),
]
CAR_COLOURS = [(30, 120, 230), (230, 110, 30), (150, 60, 200), (20, 190, 190), (230, 60, 150), (120, 200, 40),
               (240, 240, 240), (60, 60, 220), (200, 160, 60), (120, 120, 120)]
CLASS = {name: i for i, (name, _) in enumerate(_CLASSES)}
CAR_BASE = len(_CLASSES)
PALETTE = np.array([c for _, c in _CLASSES] + CAR_COLOURS, np.uint8)
# The same colours packed as little-endian RGBA words (alpha 0): a pixel is one uint32 until the end.
PALETTE32 = np.concatenate([PALETTE, np.zeros((len(PALETTE), 1), np.uint8)], 1).view(np.uint32)[:, 0]

CAR_LENGTH, CAR_WIDTH, CAR_HEIGHT = 4.6, 2.0, 1.25  # m, the drawn box
SKYLINE_ANGLES = 512


@struct.dataclass
class TrackTextures:
    """Per-track render data, stacked over T tracks (leading axis T).

    texels: uint32[T, S, S] colour (PALETTE32) of each texel's surface class, row = y, column = x.
    origin: f32[T, 2] world (x, y) of texel (0, 0)'s corner; texel_size: f32[T] m.
    sky_centre: f32[T, 2], sky_radius: f32[T]: the skyline ring.
    sky_height: f32[T, A] m, sky_colour: uint32[T, A]: the skyline around the ring.
    """

    texels: jax.Array
    origin: jax.Array
    texel_size: jax.Array
    sky_centre: jax.Array
    sky_radius: jax.Array
    sky_height: jax.Array
    sky_colour: jax.Array


# ---------------------------------------------------------------------------------- host: textures


def _surface(track: dict, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """Class id of every world point (px, py), from the nearest centre-line segment."""
    from scipy.spatial import cKDTree

    xy = track["xy"]
    n = len(xy)
    _, nearest = cKDTree(xy).query(np.stack([px, py], -1), k=1)
    best = np.full(px.shape, np.inf)
    lateral = np.zeros(px.shape)
    arc = np.zeros(px.shape)
    station = np.zeros(px.shape, np.int64)
    for shift in (0, -1):  # the segments starting at the nearest station and just before it
        j = (nearest + shift) % n
        rel = np.stack([px, py], -1) - xy[j]
        along = np.clip(np.einsum("...k,...k->...", rel, track["tangent"][j]), 0.0, track["seg_len"][j])
        foot = xy[j] + along[..., None] * track["tangent"][j]
        dist = np.linalg.norm(np.stack([px, py], -1) - foot, axis=-1)
        better = dist < best
        best = np.where(better, dist, best)
        lateral = np.where(better, np.einsum("...k,...k->...", rel, track["normal"][j]), lateral)
        arc = np.where(better, track["s"][j] + along, arc)
        station = np.where(better, j, station)
    wl, wr = track["width_left"][station], track["width_right"][station]
    kl, kr = track["kerb_left"][station], track["kerb_right"][station]
    fl, fr = track["wall_left"][station], track["wall_right"][station]
    out = np.full(px.shape, CLASS["outside"], np.uint8)
    grass = np.where((np.floor(px / 6) + np.floor(py / 6)) % 2 == 0, CLASS["grass_a"], CLASS["grass_b"])
    inside_walls = (lateral <= fl) & (lateral >= -fr)
    out = np.where(inside_walls, grass, out)
    edge = np.where(lateral >= 0, lateral - wl, -lateral - wr)  # m beyond the nearer edge
    kerb = np.where(lateral >= 0, kl, kr)
    out = np.where(inside_walls & (edge > kerb) & (edge < kerb + 4.0), CLASS["runoff"], out)
    stripe = np.where(np.floor(arc / 3.0) % 2 == 0, CLASS["kerb_red"], CLASS["kerb_white"])
    out = np.where((edge > 0) & (edge <= kerb), stripe, out)
    length = track["length"]
    on_line = (arc % length < 1.5) | (arc % length > length - 0.5)
    out = np.where(edge <= 0, np.where(on_line, CLASS["line"], CLASS["tarmac"]), out)
    wall = np.where(lateral >= 0, np.abs(lateral - fl), np.abs(-lateral - fr)) < 0.8
    return np.where(wall & (best < np.maximum(fl, fr) + 1.0), CLASS["wall"], out).astype(np.uint8)


def _rasterise_near_track(track: dict, origin: np.ndarray, texel: float, size: int, block: int = 16) -> np.ndarray:
    """uint8[size, size] classes; only blocks near the track are classified texel by texel."""
    from scipy.spatial import cKDTree

    blocks = -(-size // block)
    centre = origin + texel * block * (np.arange(blocks)[:, None] + 0.5)  # block centres per axis
    bx, by = np.meshgrid(centre[:, 0], centre[:, 1])
    reach = float(max(track["wall_left"].max(), track["wall_right"].max()) + track["seg_len"].max()) + 2.0
    dist, _ = cKDTree(track["xy"]).query(np.stack([bx.ravel(), by.ravel()], -1), k=1)
    near = np.flatnonzero(dist < reach + texel * block * 0.75)
    texels = np.full((blocks * block, blocks * block), CLASS["outside"], np.uint8)
    rows, cols = np.divmod(near, blocks)
    offsets = np.arange(block)
    iy = (rows[:, None, None] * block + offsets[None, :, None]) * np.ones((1, 1, block), np.int64)
    ix = (cols[:, None, None] * block + offsets[None, None, :]) * np.ones((1, block, 1), np.int64)
    px, py = origin[0] + texel * (ix + 0.5), origin[1] + texel * (iy + 0.5)
    texels[iy, ix] = _surface(track, px, py)
    return texels[:size, :size]


def _skyline(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = np.arange(SKYLINE_ANGLES)
    height = 12.0 + 4.0 * np.sin(2 * np.pi * a / SKYLINE_ANGLES * 3 + rng.uniform(0, 6))
    height += 3.0 * np.sin(2 * np.pi * a / SKYLINE_ANGLES * 11 + rng.uniform(0, 6))
    kind = np.full(SKYLINE_ANGLES, CLASS["trees"], np.int32)
    for _ in range(int(rng.integers(4, 8))):  # blocks of buildings and grandstands
        start, width = int(rng.integers(0, SKYLINE_ANGLES)), int(rng.integers(6, 40))
        idx = (start + np.arange(width)) % SKYLINE_ANGLES
        is_stand = rng.random() < 0.4
        kind[idx] = CLASS["stands"] if is_stand else CLASS["buildings"]
        height[idx] = rng.uniform(15, 25) if is_stand else rng.uniform(25, 70)
    return height.astype(np.float32), kind


_TEXTURE_CACHE: dict[tuple[bytes, int], tuple] = {}


def _textures_of(track: dict, size: int) -> tuple:
    key = hashlib.sha256(track["xy"].tobytes() + track["width_left"].tobytes() + track["wall_left"].tobytes()).digest()
    if (key, size) not in _TEXTURE_CACHE:
        _TEXTURE_CACHE[(key, size)] = _rasterise(track, size, key)
    return _TEXTURE_CACHE[(key, size)]


def _rasterise(track: dict, size: int, key: bytes) -> tuple:
    walls = np.concatenate([track["xy"] + track["normal"] * track["wall_left"][:, None],
                            track["xy"] - track["normal"] * track["wall_right"][:, None]])
    lo, hi = walls.min(0) - 20.0, walls.max(0) + 20.0
    texel = float(np.max(hi - lo)) / (size - 2)
    origin = (lo + hi) / 2 - texel * size / 2
    texels = _rasterise_near_track(track, origin, texel, size)
    texels[[0, -1], :] = CLASS["outside"]  # a border, so clamped lookups read "outside"
    texels[:, [0, -1]] = CLASS["outside"]
    seed = int.from_bytes(key[:4], "little")
    height, kind = _skyline(seed)
    radius = 0.5 * float(np.linalg.norm(hi - lo)) + 250.0
    return texels, origin.astype(np.float32), np.float32(texel), ((lo + hi) / 2).astype(np.float32), \
        np.float32(radius), height, kind


def make_textures(tracks: Track, size: int = 2048) -> TrackTextures:
    """Rasterises every track of `tracks` (one or stacked) on the host; cached per track."""
    if not 16 <= size <= 4096:  # the renderer's texel index is an exact float32 below 2**24
        raise ValueError(f"texture size must be between 16 and 4096 texels, got {size}")
    fields = ("xy", "s", "seg_len", "tangent", "normal", "width_left", "width_right", "kerb_left", "kerb_right",
              "wall_left", "wall_right", "length")
    parts = []
    for t in range(num_tracks(tracks)):
        one = {k: np.asarray(getattr(tracks, k) if num_tracks(tracks) == 1 else getattr(tracks, k)[t], np.float64)
               for k in fields}
        parts.append(_textures_of(one, size))
    stack = lambda i, dtype: jnp.asarray(np.stack([p[i] for p in parts]), dtype)  # noqa: E731
    colours = lambda i: jnp.asarray(PALETTE32[np.stack([p[i] for p in parts])])  # noqa: E731
    return TrackTextures(texels=colours(0), origin=stack(1, jnp.float32), texel_size=stack(2, jnp.float32),
                         sky_centre=stack(3, jnp.float32), sky_radius=stack(4, jnp.float32),
                         sky_height=stack(5, jnp.float32), sky_colour=colours(6))


# ---------------------------------------------------------------------------------- the camera


CHASE_BACK, CHASE_UP, CHASE_PITCH, CHASE_FOV = 6.5, 2.6, np.deg2rad(7.0), np.deg2rad(60.0)
TOPDOWN_SPAN, TOPDOWN_BEHIND = 80.0, 20.0  # m across the image, m shown behind the car
MAX_GROUND = 800.0  # m; farther ground reads as "outside"


def chase_geometry(h: int, w: int):
    f = (w / 2) / np.tan(CHASE_FOV / 2)
    v_up = (h / 2 - np.arange(h) - 0.5) / f  # per row
    u_left = (w / 2 - np.arange(w) - 0.5) / f  # per column
    sp, cp = np.sin(CHASE_PITCH), np.cos(CHASE_PITCH)
    ray_fwd = cp + v_up * sp  # the ray F + u L + v U in the car's yaw frame, per row
    ray_z = -sp + v_up * cp
    ground_rows = int(np.sum(ray_z < -1e-3))
    first = h - ground_rows
    t = CHASE_UP / -ray_z[first:]  # per ground row
    fwd = -CHASE_BACK + t[:, None] * ray_fwd[first:, None] * np.ones(w)[None, :]
    left = t[:, None] * u_left[None, :]
    far = np.hypot(fwd + CHASE_BACK, left) > MAX_GROUND
    elevation = np.arctan2(ray_z[:first, None], np.hypot(ray_fwd[:first, None], u_left[None, :]))
    azimuth = np.arctan2(u_left, cp)  # per column, near the horizon
    return dict(f=f, first=first, fwd=fwd, left=left, far=far, elevation=elevation, azimuth=azimuth)


def _colours_once(image: jax.Array) -> jax.Array:
    """`image` (uint32 colour words below 2**24) unchanged, but computed once per pixel.

    Splitting a word into three bytes reads each pixel three times, and XLA:CPU fuses the
    whole per-pixel computation into that byte loop: every pixel would be coloured three
    times, in a loop over a trailing axis of 3 that does not vectorise. The words are
    below 2**24, so the float32 round trip through `materialised` is exact.
    """
    return materialised(image.astype(jnp.float32)).astype(jnp.uint32)


def select_by_bits(index: jax.Array, values: list) -> jax.Array:
    """values[index] per element, as a tree of selects on the bits of `index` (uint32).

    A per-pixel gather from a small per-frame table is a scalar loop on XLA:CPU; selects
    vectorise, and a tree needs one bit test per level instead of a compare per value.
    """
    bit = 0
    while len(values) > 1:
        odd = (jnp.right_shift(index, bit) & 1) == 1
        pairs = [jnp.where(odd, values[i + 1], values[i]) for i in range(0, len(values) - 1, 2)]
        values, bit = pairs + values[len(pairs) * 2:], bit + 1
    return values[0]


def make_renderer(static) -> callable:
    """Builds `render(textures, state, car=0) -> uint8[H, W, 3]` for a static config.

    `static` needs `image_size` (H, W), `camera` ("chase" or "topdown") and `num_cars`.
    `textures` is `EnvParams.textures` (the track is `state.track_index`); `car` picks
    whose camera (0 = the ego car). Pure and jittable; vmap it over envs or cars.
    """
    h, w = static.image_size
    if static.camera not in CAMERAS:
        raise ValueError(f"camera must be one of {CAMERAS}, got {static.camera!r}")
    if h < 8 or w < 8:
        raise ValueError(f"image_size must be at least (8, 8), got {static.image_size}")
    if static.num_cars > 32:
        raise ValueError(f"the renderer draws at most 32 cars, got {static.num_cars}")
    rgba = lambda name: jnp.uint32(PALETTE32[CLASS[name]])  # noqa: E731
    num_colours = len(CAR_COLOURS)
    car_colours = jnp.asarray(PALETTE32[[CLASS["ego"]] + [CAR_BASE + (k - 1) % num_colours
                                                          for k in range(1, static.num_cars)]])
    if static.camera == "chase":
        geo = chase_geometry(h, w)
        ground_fwd, ground_left = jnp.asarray(geo["fwd"], jnp.float32), jnp.asarray(geo["left"], jnp.float32)
        first = geo["first"]  # rows above it are sky
        azimuth_cos = jnp.asarray(np.cos(geo["azimuth"]), jnp.float32)
        azimuth_sin = jnp.asarray(np.sin(geo["azimuth"]), jnp.float32)
        tan_elevation = jnp.asarray(np.tan(geo["elevation"]), jnp.float32)
        sky_band = jnp.asarray(np.where(np.arange(first)[:, None] < first // 2, PALETTE32[CLASS["sky_high"]],
                                        PALETTE32[CLASS["sky_low"]]))
    else:
        m = TOPDOWN_SPAN / w
        rows = (h - np.arange(h) - 0.5) * m - TOPDOWN_BEHIND
        cols = (w / 2 - np.arange(w) - 0.5) * m
        ground_fwd = jnp.asarray(np.repeat(rows[:, None], w, 1), jnp.float32)
        ground_left = jnp.asarray(np.repeat(cols[None, :], h, 0), jnp.float32)
        geo = dict(first=0, far=np.zeros((h, w), bool))
        first = 0
    far = jnp.asarray(geo["far"])

    def ground(tex, track, cx, cy, cos, sin):
        size = tex.texels.shape[-1]
        inv = 1.0 / tex.texel_size[track]  # texels per metre
        # Texel coordinates as one multiply-add per term: scalars folded per frame.
        ax, ay = (cx - tex.origin[track, 0]) * inv, (cy - tex.origin[track, 1]) * inv
        c, s = cos * inv, sin * inv
        # Clamped and floored in float, the row-major texel index is an exact float (size**2
        # <= 2**24): one float-to-int conversion per pixel instead of two, and an unsigned
        # index skips jnp's wrap of negative indices.
        fx = jnp.floor(jnp.clip(ax + c * ground_fwd - s * ground_left, 0.0, size - 1.0))
        fy = jnp.floor(jnp.clip(ay + s * ground_fwd + c * ground_left, 0.0, size - 1.0))
        index = (fy * size + fx).astype(jnp.uint32) + (track * (size * size)).astype(jnp.uint32)
        texel = tex.texels.reshape(-1).at[index].get(mode="promise_in_bounds")
        return jnp.where(far, rgba("outside"), texel)

    def sky(tex, track, px, py, cos, sin):
        # World direction of each column near the horizon: the column's azimuth turned by the yaw.
        dx = cos * azimuth_cos - sin * azimuth_sin
        dy = sin * azimuth_cos + cos * azimuth_sin
        ox, oy = px - tex.sky_centre[track, 0], py - tex.sky_centre[track, 1]
        b = ox * dx + oy * dy
        c = ox * ox + oy * oy - tex.sky_radius[track] ** 2  # < 0: the camera is inside the ring
        t = -b + jnp.sqrt(jnp.maximum(b * b - c, 0.0))  # distance to the skyline, per column
        angle = jnp.arctan2(oy + t * dy, ox + t * dx)
        a = (jnp.round(angle / (2 * jnp.pi) * SKYLINE_ANGLES).astype(jnp.int32)) % SKYLINE_ANGLES
        # A pixel sees the skyline when its elevation is below the skyline's: tan(e) * t < height.
        below = tan_elevation * t[None, :] < (tex.sky_height[track, a] - CHASE_UP)[None, :]
        return jnp.where(below, tex.sky_colour[track, a][None, :], sky_band)

    def nearest_colour(covered, front, colours):
        """Colour of the highest set bit of `covered` (the nearest car), dark unless its `front` bit is set."""
        slot = (31 - jax.lax.clz(covered)).astype(jnp.uint32)
        body = select_by_bits(slot, [colours[k] for k in range(static.num_cars)])
        lit = (jnp.right_shift(front, slot) & 1) == 1
        return jnp.where(lit, body, rgba("car_dark"))

    def cars_chase(image, rel_fwd, rel_left, rel_yaw, visible):
        """Paints the cars: the nearest covering car wins, found with bit tricks, not a loop of passes.

        Cars are sorted far to near into slots 0..C-1; row r has bit k set when slot k's
        rectangle spans it, and column c likewise, so a pixel's covering cars are
        row_bits[r] & col_bits[c] and the nearest is the highest set bit.
        """
        f = geo["f"]
        a = rel_fwd + CHASE_BACK  # from the camera
        sp, cp = np.sin(CHASE_PITCH), np.cos(CHASE_PITCH)
        depth_bottom = a * cp + CHASE_UP * sp
        depth_top = a * cp - (CAR_HEIGHT - CHASE_UP) * sp
        row_bottom = h / 2 - f * (a * sp - CHASE_UP * cp) / jnp.maximum(depth_bottom, 1e-3)
        row_top = h / 2 - f * (a * sp + (CAR_HEIGHT - CHASE_UP) * cp) / jnp.maximum(depth_top, 1e-3)
        col = w / 2 - f * rel_left / jnp.maximum(depth_bottom, 1e-3)
        half = 0.5 * (CAR_WIDTH * jnp.abs(jnp.cos(rel_yaw)) + CAR_LENGTH * jnp.abs(jnp.sin(rel_yaw)))
        half_w = f * half / jnp.maximum(depth_bottom, 1e-3)
        shown = visible & (depth_top > 1.0)
        order = jnp.argsort(-depth_bottom)  # far to near
        top, bottom, centre, half_w, shown = row_top[order], row_bottom[order], col[order], half_w[order], shown[order]
        rows = jnp.arange(h, dtype=jnp.float32) + 0.5
        cols = jnp.arange(w, dtype=jnp.float32) + 0.5
        bit = jnp.left_shift(jnp.uint32(1), jnp.arange(static.num_cars, dtype=jnp.uint32))[:, None]
        in_rows = (rows >= top[:, None]) & (rows <= bottom[:, None]) & shown[:, None]  # [C, H]
        lit = rows >= (top + 0.35 * (bottom - top))[:, None]  # below the glasshouse
        row_bits = jnp.sum(jnp.where(in_rows, bit, 0), axis=0, dtype=jnp.uint32)
        lit_bits = jnp.sum(jnp.where(in_rows & lit, bit, 0), axis=0, dtype=jnp.uint32)
        col_bits = jnp.sum(jnp.where(jnp.abs(cols - centre[:, None]) <= half_w[:, None], bit, 0), axis=0,
                           dtype=jnp.uint32)
        covered = row_bits[:, None] & col_bits[None, :]
        car = nearest_colour(covered, lit_bits[:, None], car_colours[order])
        return jnp.where(covered != 0, car, image)

    def cars_topdown(image, rel_fwd, rel_left, rel_yaw, visible):
        """Paints every car's box; the car with the highest index wins where boxes overlap."""
        covered = jnp.zeros(image.shape, jnp.uint32)
        front = jnp.zeros(image.shape, jnp.uint32)
        for k in range(static.num_cars):
            dx, dy = ground_fwd - rel_fwd[k], ground_left - rel_left[k]
            c, s = jnp.cos(rel_yaw[k]), jnp.sin(rel_yaw[k])
            along, across = c * dx + s * dy, -s * dx + c * dy
            inside = (jnp.abs(along) <= CAR_LENGTH / 2) & (jnp.abs(across) <= CAR_WIDTH / 2) & visible[k]
            covered = covered | jnp.where(inside, jnp.uint32(1 << k), jnp.uint32(0))
            front = front | jnp.where(inside & (along > CAR_LENGTH * 0.1), jnp.uint32(1 << k), jnp.uint32(0))
        return jnp.where(covered != 0, nearest_colour(covered, front, car_colours), image)

    def render(textures: TrackTextures, state, car: int | jax.Array = 0) -> jax.Array:
        body = state.cars.body
        track = jnp.maximum(state.track_index, 0)
        cx, cy, yaw = body.x[car], body.y[car], body.yaw[car]
        cos, sin = jnp.cos(yaw), jnp.sin(yaw)
        dx, dy = body.x - cx, body.y - cy
        rel_fwd, rel_left = cos * dx + sin * dy, -sin * dx + cos * dy
        rel_yaw = body.yaw - yaw
        visible = state.active
        floor = ground(textures, track, cx, cy, cos, sin)
        if static.camera == "chase":
            cam_x, cam_y = cx - CHASE_BACK * cos, cy - CHASE_BACK * sin
            image = jnp.concatenate([sky(textures, track, cam_x, cam_y, cos, sin), floor], axis=0) if first else floor
            image = cars_chase(image, rel_fwd, rel_left, rel_yaw, visible)
        else:
            image = cars_topdown(floor, rel_fwd, rel_left, rel_yaw, visible)
        return jax.lax.bitcast_convert_type(_colours_once(image), jnp.uint8)[..., :3]

    return render
