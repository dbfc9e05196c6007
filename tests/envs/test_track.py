import jax
import jax.numpy as jnp
import numpy as np
import pytest
from shared_tracks import shared_track

from jaxrace.envs import BUILTIN_TRACKS, CarParams, TrackError, builtin_track, load_track_csv, procedural_track
from jaxrace.envs import reference as ref
from jaxrace.envs.circuits import REAL_CIRCUITS, filleted_polygon
from jaxrace.envs.track import (
    point_at,
    project,
    reference_lap_time,
    stack_tracks,
    station_at,
    track_slice,
)
from jaxrace.envs.track_build import build_track


@pytest.fixture(scope="module")
def club():
    return builtin_track("club")


@pytest.fixture(scope="module")
def real_tracks():
    out = {}
    for name in REAL_CIRCUITS:
        centre, raceline = shared_track(name)
        out[name] = load_track_csv(centre, raceline)
    return out


def _circle(radius=200.0, n=400):
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)
    return np.stack([radius * np.cos(t), radius * np.sin(t)], axis=1)


# ---------------------------------------------------------------- sources


@pytest.mark.parametrize("name", BUILTIN_TRACKS)
def test_builtin_tracks_are_closed_fixed_shape_and_consistent(name):
    tr = builtin_track(name, num_points=1024)
    assert tr.xy.shape == (1024, 2) and tr.ref_speed.shape == (1024,)
    seg = np.linalg.norm(np.roll(np.asarray(tr.xy), -1, axis=0) - np.asarray(tr.xy), axis=1)
    # Equal spacing, and the loop closes with a segment like the others.
    assert seg.max() / seg.min() < 1.05
    np.testing.assert_allclose(float(tr.length), seg.sum(), rtol=1e-4)
    # The race line stays between the edges, the walls are beyond the edges.
    assert np.all(np.asarray(tr.raceline) < np.asarray(tr.width_left))
    assert np.all(np.asarray(tr.raceline) > -np.asarray(tr.width_right))
    assert np.all(np.asarray(tr.wall_left) > np.asarray(tr.width_left))
    assert 1000.0 < float(tr.length) < 6000.0
    assert np.isfinite(float(tr.ref_lap_time))


def test_unknown_builtin_track_lists_the_names():
    with pytest.raises(KeyError, match="oval"):
        builtin_track("monaco")


def test_procedural_tracks_are_seeded_and_varied():
    a, b, c = (procedural_track(seed, num_points=512) for seed in (3, 3, 4))
    np.testing.assert_array_equal(np.asarray(a.xy), np.asarray(b.xy))
    assert not np.allclose(np.asarray(a.xy[:10]), np.asarray(c.xy[:10]))
    lengths = [float(procedural_track(s, num_points=512).length) for s in range(6)]
    assert all(2000.0 * 0.97 <= length <= 6000.0 * 1.03 for length in lengths), lengths
    assert max(lengths) - min(lengths) > 500.0  # not all the same size
    # A corner mix: left and right-hand corners, hairpins and sweepers, on every circuit.
    for seed in range(4):
        curv = np.asarray(procedural_track(seed, num_points=512).curvature)
        assert curv.max() > 1 / 80 and curv.min() < -1 / 200, seed
        assert np.mean(np.abs(curv) < 1 / 1000) > 0.2, seed  # straights too


def test_filleted_polygon_has_the_requested_corner_radius():
    pts = filleted_polygon([(0, 0), (400, 0), (400, 400), (0, 400)], [50, 50, 50, 50], spacing=0.5)
    tr = build_track(pts, 6.0, 6.0, num_points=2048, smooth_m=0.0)
    curv = np.asarray(tr.curvature)
    # Corners of radius 50 m: the peak curvature is 1/50 (slightly softened by the smoothing).
    assert 0.85 / 50 < curv.max() < 1.05 / 50
    np.testing.assert_allclose(float(tr.length), 4 * 300 + 2 * np.pi * 50, rtol=2e-3)


# ---------------------------------------------------------------- real circuits


def test_csv_loader_on_real_circuits(real_tracks):
    for name, tr in real_tracks.items():
        km = REAL_CIRCUITS[name][0]
        assert abs(float(tr.length) / 1000.0 - km) / km < 0.02, (name, float(tr.length))
        width = np.asarray(tr.width_left + tr.width_right)
        assert width.min() > 6.0 and width.max() < 30.0
        # The imported race line stays on the track.
        assert np.all(
            np.abs(np.asarray(tr.raceline)) < np.maximum(np.asarray(tr.width_left), np.asarray(tr.width_right))
        )


def test_reference_lap_is_within_8_percent_of_real_gt3_qualifying(real_tracks):
    for name, tr in real_tracks.items():
        _, (lo, hi) = REAL_CIRCUITS[name]
        lap = reference_lap_time(tr)
        assert 0.92 * lo <= lap <= 1.08 * hi, (name, lap, lo, hi)


def test_reference_lap_responds_to_the_car(real_tracks):
    tr = real_tracks["BrandsHatch"]
    base = reference_lap_time(tr, CarParams())
    assert reference_lap_time(tr, CarParams(power=300e3)) > base + 0.5
    assert reference_lap_time(tr, CarParams(mu=1.8)) < base - 0.5
    assert reference_lap_time(tr, CarParams(cla=0.0)) > base + 1.0
    np.testing.assert_allclose(base, float(tr.ref_lap_time), rtol=1e-4)


def test_speed_profile_on_a_circle_is_the_steady_state_cornering_speed():
    # On a constant-radius circle the car holds the speed at which the rear tyres' grip
    # left over by cornering just balances drag and rolling resistance: a little below
    # the pure cornering limit. Solved here by bisection, independently of the passes.
    car = CarParams()
    radius, n = 150.0, 500
    ds = np.full(n, 2 * np.pi * radius / n)
    v = ref.speed_profile(ds, np.full(n, 1.0 / radius), car)
    down = 0.5 * car.air_density * car.cla / car.mass

    def surplus(speed):
        grip = car.mu * (9.81 + down * speed**2)
        lateral = speed**2 / radius
        traction = grip * np.sqrt(max(0.0, 1 - (lateral / grip) ** 2)) * car.lf / (car.lf + car.lr)
        resist = 0.5 * car.air_density * car.cda * speed**2 / car.mass + car.rolling_resistance * (
            9.81 + down * speed**2
        )
        return traction - resist

    lo, hi = 10.0, np.sqrt(car.mu * 9.81 / (1.0 / radius - car.mu * down))
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if surplus(mid) > 0 else (lo, mid)
    np.testing.assert_allclose(v, lo, rtol=1e-3)
    assert v.max() < np.sqrt(car.mu * 9.81 / (1.0 / radius - car.mu * down))
    np.testing.assert_allclose(ref.lap_time(ds, v), 2 * np.pi * radius / lo, rtol=1e-3)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda xy, w: (xy[:10], w[:10]), "too few points"),
        (lambda xy, w: (xy.__setitem__((5, 0), np.nan) or xy, w), "non-finite x/y at point 5"),
        (lambda xy, w: (np.insert(xy, 8, xy[7], axis=0), np.insert(w, 8, w[7])), "between points 7 and 8"),
        (lambda xy, w: (xy, w.__setitem__(12, 0.5) or w), "width at point 12 is 1.50 m, narrower than a car"),
        (lambda xy, w: (xy[: len(xy) // 2], w[: len(w) // 2]), "not closed"),
    ],
)
def test_validation_errors_name_the_problem_and_the_point(mutate, message):
    xy, w = _circle(), np.full(400, 4.0)
    bad_xy, bad_w = mutate(xy.copy(), w.copy())
    with pytest.raises(TrackError, match=message):
        build_track(bad_xy, bad_w, 1.0 if "narrower" in message else bad_w, where="test")


def test_csv_errors_name_the_file(tmp_path):
    path = tmp_path / "broken.csv"
    path.write_text("# x_m,y_m,w_tr_right_m,w_tr_left_m\n0,0,5\n1,1,5\n")
    with pytest.raises(TrackError, match="broken.csv.*4 columns"):
        load_track_csv(path)
    path.write_text("# x_m,y_m,w_tr_right_m,w_tr_left_m\n0,0,5,abc\n")
    with pytest.raises(TrackError, match="broken.csv: cannot read"):
        load_track_csv(path)


def test_csv_loader_reads_comments_and_a_repeated_closing_point(tmp_path):
    xy = _circle(300.0, 300)
    rows = [f"{x:.4f},{y:.4f},5.0,6.0" for x, y in np.vstack([xy, xy[:1]])]
    path = tmp_path / "ring.csv"
    path.write_text("# a ring\n# x_m,y_m,w_tr_right_m,w_tr_left_m\n" + "\n".join(rows) + "\n")
    tr = load_track_csv(path, num_points=512)
    np.testing.assert_allclose(float(tr.length), 2 * np.pi * 300.0, rtol=2e-3)
    np.testing.assert_allclose(np.asarray(tr.width_right), 5.0, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(tr.width_left), 6.0, rtol=1e-5)


# ---------------------------------------------------------------- projection


def test_projection_round_trips(club):
    ts = track_slice(club)
    key_arc, key_lat = jax.random.split(jax.random.key(0))
    arc = jax.random.uniform(key_arc, (500,), maxval=club.length)
    lateral = jax.random.uniform(key_lat, (500,), minval=-4.0, maxval=4.0)
    xy, station = jax.jit(point_at)(ts, arc, lateral)
    proj = jax.jit(project)(ts, xy, station)
    np.testing.assert_allclose(np.asarray(proj.lateral), np.asarray(lateral), atol=5e-3)
    err = (np.asarray(proj.arc) - np.asarray(arc) + float(club.length) / 2) % float(club.length) - float(
        club.length
    ) / 2
    # Near a segment end on the inside of a bend a point lies on both neighbours, whose
    # arc lengths for it differ by at most |lateral| x the heading change per segment.
    bound = np.abs(np.asarray(lateral)) * np.abs(np.asarray(club.curvature)).max() * float(club.seg_len[0]) * 2
    assert np.all(np.abs(err) <= np.maximum(bound, 2e-2))
    assert np.mean(np.abs(err) < 2e-2) > 0.98
    assert np.all(np.abs(np.asarray(proj.station) - np.asarray(station)) <= 1)


def test_projection_follows_a_car_from_a_stale_station(club):
    # A car that moved up to three segments since its last projection is found.
    ts = track_slice(club)
    arc = jnp.linspace(0.0, float(club.length), 300, endpoint=False)
    moved = arc + 2.5 * float(club.seg_len[0])
    xy, _ = point_at(ts, moved, jnp.zeros(300))
    proj = project(ts, xy, station_at(ts, arc))
    np.testing.assert_allclose(np.asarray(proj.arc), np.asarray(moved) % float(club.length), atol=2e-2)
    np.testing.assert_allclose(np.asarray(proj.lateral), 0.0, atol=2e-2)


def test_projection_stays_on_its_branch_through_a_crossover():
    tr = builtin_track("figure_eight")
    ts = track_slice(tr)
    xy = np.asarray(tr.xy)
    # The crossing: the two stations, far apart along the loop, that are closest in space.
    d = np.linalg.norm(xy[:, None] - xy[None], axis=-1)
    idx = np.arange(len(xy))
    sep = np.minimum(np.abs(idx[:, None] - idx[None]), len(xy) - np.abs(idx[:, None] - idx[None]))
    i, j = np.unravel_index(np.argmin(np.where(sep > 100, d, np.inf)), d.shape)
    assert d[i, j] < 1.0  # the branches really cross
    # Drive along branch i through the crossing in 1 m steps, projecting as the env does.
    arcs = float(tr.s[i]) + np.arange(-40.0, 40.0, 1.0)
    points, _ = point_at(ts, jnp.asarray(arcs), jnp.zeros(len(arcs)))
    station = station_at(ts, jnp.asarray(arcs[0]))
    seen = []
    for p in np.asarray(points):
        station = project(ts, jnp.asarray(p), station).station
        seen.append(int(station))
    steps = np.diff(seen) % len(xy)
    assert np.all(steps <= 2), seen  # never jumps to the other branch


def test_stacked_tracks_and_slices(club):
    oval = builtin_track("oval")
    stacked = stack_tracks([club, oval])
    assert stacked.xy.shape == (2, club.num_points, 2)
    ts = track_slice(stacked, 1)
    np.testing.assert_allclose(float(ts.length), float(oval.length))
    row = ts.row(jnp.int32(7))
    np.testing.assert_allclose([float(row.x), float(row.y)], np.asarray(oval.xy[7]))
    # The slice index is traced: picking a track under jit/vmap needs no recompile.
    lengths = jax.jit(jax.vmap(lambda i: track_slice(stacked, i).length))(jnp.array([0, 1, 0]))
    np.testing.assert_allclose(np.asarray(lengths), [float(club.length), float(oval.length), float(club.length)])
    with pytest.raises(TrackError, match="num_points"):
        stack_tracks([club, builtin_track("oval", num_points=512)])


def test_wraps_agree_with_a_slow_reference():
    from jaxrace.envs.opponents import wrap_half
    from jaxrace.envs.track import wrap_angle

    a = np.linspace(-30.0, 30.0, 2001)
    ref = np.arctan2(np.sin(a), np.cos(a))
    np.testing.assert_allclose(wrap_angle(a), ref, atol=1e-9)  # numpy in, numpy out
    np.testing.assert_allclose(np.asarray(wrap_angle(jnp.asarray(a, jnp.float32))), ref, atol=2e-5)
    d = np.linspace(-2500.0, 2500.0, 1001)
    got = np.asarray(wrap_half(jnp.asarray(d, jnp.float32), jnp.float32(1000.0)))
    assert np.all(np.abs(got) <= 500.0 + 1e-3)
    np.testing.assert_allclose(np.cos(2 * np.pi * got / 1000.0), np.cos(2 * np.pi * d / 1000.0), atol=1e-4)
