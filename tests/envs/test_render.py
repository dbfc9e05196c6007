"""The pixel renderer: geometry that could go wrong, purity, vmapping, videos."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrace
from jaxrace.envs.render import CAR_BASE, CLASS, PALETTE
from jaxrace.envs.video import render_clip

EGO = PALETTE[CLASS["ego"]]
TARMAC = PALETTE[CLASS["tarmac"]]


def colour_of(car: int) -> np.ndarray:
    return PALETTE[CAR_BASE + (car - 1) % (len(PALETTE) - CAR_BASE)]


@pytest.fixture(scope="module")
def oval():
    env, params = jaxrace.make(track="oval", num_opponents=2, start="grid_back", pixels=True, texture_size=1024)
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    return env, params, state


def place(state, params, car, station, lateral=0.0, ahead=0.0, active=True):
    """Puts `car` on the centre line at `station` (+ `ahead` metres along it), pointing along the track."""
    t = params.tracks
    xy = np.asarray(t.xy[station]) + np.asarray(t.tangent[station]) * ahead + np.asarray(t.normal[station]) * lateral
    body = state.cars.body
    body = body.replace(x=body.x.at[car].set(xy[0]), y=body.y.at[car].set(xy[1]),
                        yaw=body.yaw.at[car].set(t.heading[station]))
    return state.replace(cars=state.cars._replace(body=body), active=state.active.at[car].set(active))


def straight_station(params, length=150.0):
    k = np.asarray(params.tracks.curvature)
    s = np.asarray(params.tracks.seg_len)
    for i in range(len(k)):
        ahead = np.cumsum(np.roll(s, -i)) < length
        if np.all(np.abs(np.roll(k, -i)[ahead]) < 1e-5):
            return i
    raise AssertionError("no straight")


def alone(state, params, station):
    state = place(state, params, 0, station)
    for car in (1, 2):
        state = place(state, params, car, station, ahead=-500.0, active=False)
    return state


def mask(image, colour):
    return np.all(np.asarray(image) == colour, axis=-1)


def test_shape_dtype_palette_and_determinism(oval):
    env, params, state = oval
    render = jax.jit(env.render)
    a, b = render(state, params), render(state, params)
    assert a.shape == (64, 64, 3) and a.dtype == jnp.uint8
    np.testing.assert_array_equal(a, b)
    colours = {tuple(c) for c in np.asarray(a).reshape(-1, 3)}
    assert colours <= {tuple(c) for c in PALETTE}
    assert len(colours) >= 5  # sky, skyline, tarmac, grass, cars...
    assert mask(a, PALETTE[CLASS["sky_high"]])[0].all()  # sky on top
    assert mask(a, TARMAC)[-1].any()  # road at the bottom


def test_on_a_straight_the_track_is_centred_and_symmetric(oval):
    env, params, state = oval
    state = alone(state, params, straight_station(params))
    image = np.asarray(env.render(state, params))
    road = mask(image, TARMAC) | mask(image, EGO) | mask(image, PALETTE[CLASS["car_dark"]])
    ground = road[40:]
    mismatch = np.mean(ground != ground[:, ::-1])
    assert mismatch < 0.02, mismatch
    cols = np.nonzero(ground.any(axis=0))[0]
    assert abs((cols.min() + cols.max()) / 2 - 31.5) <= 1.0


def road_centre_at(image, metres_ahead):
    """Mean column of the road in the image row that sees the ground `metres_ahead` of the car."""
    from jaxrace.envs.render import chase_geometry

    geo = chase_geometry(64, 64)
    row = geo["first"] + int(np.argmin(np.abs(geo["fwd"][:, 32] - metres_ahead)))
    return np.mean(np.nonzero(mask(image, TARMAC)[row])[0])


def test_a_left_hand_corner_curves_left_in_the_image(oval):
    env, params, state = oval
    k = np.asarray(params.tracks.curvature)
    s = np.asarray(params.tracks.s)
    straight = straight_station(params, length=300.0)
    corner = next(i for i in range(len(k)) if k[i] > 1e-3 and abs(k[i - 40]) < 1e-5)  # the oval turns left
    before = int(np.argmin(np.abs(s - (s[corner] - 60.0) % float(params.tracks.length))))
    straight_centre = road_centre_at(env.render(alone(state, params, straight), params), 150.0)
    corner_centre = road_centre_at(env.render(alone(state, params, before), params), 150.0)
    assert abs(straight_centre - 31.5) <= 1.0
    assert corner_centre < straight_centre - 2.5, (corner_centre, straight_centre)


def test_an_opponent_ahead_is_central_and_shrinks_with_distance(oval):
    env, params, state = oval
    station = straight_station(params)
    sizes = []
    for distance in (12.0, 30.0):
        s = alone(state, params, station)
        s = place(s, params, 1, station, ahead=distance)
        car = mask(env.render(s, params), colour_of(1))
        assert car.any()
        cols = np.nonzero(car.any(axis=0))[0]
        assert abs(cols.mean() - 31.5) <= 1.5
        sizes.append(car.sum())
    assert sizes[1] < sizes[0] / 2


def test_a_nearer_opponent_occludes_a_farther_one(oval):
    env, params, state = oval
    station = straight_station(params)
    s = alone(state, params, station)
    far_only = place(s, params, 2, station, ahead=35.0)
    both = place(far_only, params, 1, station, ahead=20.0)
    far_alone = mask(env.render(far_only, params), colour_of(2)).sum()
    far_hidden = mask(env.render(both, params), colour_of(2)).sum()
    assert far_alone > 0 and far_hidden < far_alone / 4
    # Same two cars, drawn in the other order of the array: occlusion is by distance, not index.
    swapped = place(place(s, params, 1, station, ahead=35.0), params, 2, station, ahead=20.0)
    assert mask(env.render(swapped, params), colour_of(1)).sum() < far_alone / 4


def test_topdown_shows_the_car_ahead_up_the_image(oval):
    env, params, state = jaxrace.make(track="oval", num_opponents=2, pixels=True, camera="topdown",
                                      texture_size=1024) + (oval[2],)
    station = straight_station(params)
    s = place(alone(state, params, station), params, 1, station, ahead=25.0)
    image = np.asarray(env.render(s, params))
    ego_rows = np.nonzero(mask(image, EGO).any(axis=1))[0]
    other_rows = np.nonzero(mask(image, colour_of(1)).any(axis=1))[0]
    assert ego_rows.size and other_rows.size and other_rows.max() < ego_rows.min()


def test_vmaps_over_cars_and_tracks_and_compiles_once():
    env, params = jaxrace.make(track=["oval", "club"], num_opponents=2, pixels=True, texture_size=512)
    keys = jax.random.split(jax.random.key(1), 2)
    _, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, params.replace(track_index=jnp.int32(0)))
    states = states.replace(track_index=jnp.array([0, 1], jnp.int32))
    traces = []

    def render(state, car):
        traces.append(1)
        return env.render(state, params, car)

    per_car = jax.jit(jax.vmap(render, in_axes=(None, 0)))
    pick = jax.jit(lambda s, i: jax.tree.map(lambda x: x[i], s))
    one = pick(states, 1)
    images = per_car(one, jnp.arange(3))
    assert images.shape == (3, 64, 64, 3)
    render_one = jax.jit(env.render, static_argnums=2)  # eagerly, each operation would compile on its own
    for car in range(3):
        np.testing.assert_array_equal(images[car], render_one(one, params, car))
    per_track = jax.jit(jax.vmap(render, in_axes=(0, None)))
    both = per_track(states, 0)
    for i in range(2):
        np.testing.assert_array_equal(both[i], render_one(pick(states, i), params, 0))
    assert not np.array_equal(both[0], both[1])  # different circuits look different
    per_track(states, 0)
    per_car(one, jnp.arange(3))
    assert len(traces) == 2  # one trace per jitted function, none on the second calls


def test_pixels_only_when_asked(oval):
    env, params = jaxrace.make(track="oval", num_opponents=2)
    obs, _ = jax.jit(env.reset)(jax.random.key(0), params)
    assert "pixels" not in obs and params.textures is None
    with pytest.raises(ValueError, match="pixels=True"):
        env.render(oval[2], params)
    env, params, state = oval
    obs, *_ = jax.jit(env.step)(jax.random.key(2), state, jnp.array([0.0, 1.0]), params)
    assert obs["pixels"].shape == (64, 64, 3) and obs["pixels"].dtype == jnp.uint8
    with pytest.raises(ValueError, match="camera"):
        jaxrace.make(track="oval", pixels=True, camera="fisheye")
    for size in (8, 8192):
        with pytest.raises(ValueError, match=f"between 16 and 4096 texels, got {size}"):
            jaxrace.make(track="oval", pixels=True, texture_size=size)


def test_a_clip_is_written_and_reads_back_with_the_expected_frames(oval, tmp_path):
    import imageio.v2 as imageio

    from jaxrace.envs.rollouts import trajectory

    env, params, _ = oval
    states = jax.jit(trajectory, static_argnums=(0, 3))(env, params, jax.random.key(3), 40)
    path = render_clip(env, params, states, tmp_path / "clip.mp4", start=5, seconds=2.0, size=(72, 128))
    frames = imageio.mimread(path)
    assert len(frames) == 20 and frames[0].shape == (72, 128, 3)
    gif = render_clip(env, params, states, tmp_path / "clip.gif", seconds=1.0, size=(72, 128))
    assert gif.suffix == ".gif" and len(imageio.mimread(gif)) == 10
    with pytest.raises(ValueError, match="trajectory has 41"):
        render_clip(env, params, states, tmp_path / "long.mp4", seconds=10.0)


@pytest.mark.parametrize("ffmpeg", ["missing", "writes nothing"])
def test_a_video_falls_back_to_gif_without_a_working_ffmpeg_and_leaves_no_mp4(tmp_path, monkeypatch, ffmpeg):
    import imageio.v2 as imageio

    from jaxrace.envs.video import write_video

    exe = tmp_path / "ffmpeg"
    if ffmpeg == "writes nothing":  # exits 0 and writes no file, as a stub binary would
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(exe))
    frames = np.zeros((6, 16, 24, 3), np.uint8)
    frames[:, :, :12, 0] = 200
    for i in range(6):  # frames that differ (a GIF writer merges equal ones)
        frames[i, :4, 12 + 2 * i:14 + 2 * i, 1] = 255
    written = write_video(frames, tmp_path / "videos" / "clip.mp4")
    assert written == tmp_path / "videos" / "clip.gif"
    assert sorted(p.name for p in written.parent.iterdir()) == ["clip.gif"]
    back = np.asarray(imageio.mimread(written))
    assert back.shape[0] == 6 and back[0, 0, 0, 0] > 150 and back[0, 0, -1, 0] < 50


@pytest.mark.parametrize("count", [1, 2, 3, 7, 8, 10])
def test_select_by_bits_picks_the_indexed_value(count):
    from jaxrace.envs.render import select_by_bits

    values = [jnp.uint32(100 + 7 * k) for k in range(count)]
    index = jnp.arange(count, dtype=jnp.uint32).reshape(-1, 1) * jnp.ones((1, 3), jnp.uint32)
    np.testing.assert_array_equal(select_by_bits(index, values), 100 + 7 * np.asarray(index))


def test_textures_hold_palette_colours_below_2_pow_24(oval):
    from jaxrace.envs.render import CLASS, PALETTE32

    _, params, _ = oval
    texels = np.unique(np.asarray(params.textures.texels))
    assert set(texels) <= set(PALETTE32.tolist())
    assert {PALETTE32[CLASS[c]] for c in ("tarmac", "grass_a", "outside", "kerb_red")} <= set(texels)
    assert PALETTE32.max() < 2 ** 24  # the exact float32 round trip in _colours_once relies on it
