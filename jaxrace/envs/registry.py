"""`make`: build an environment and its default parameters from a few options."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from jaxrace.envs.circuits import BUILTIN_TRACKS, builtin_track, load_track_csv, procedural_track
from jaxrace.envs.race import RaceEnv
from jaxrace.envs.state import EnvParams, StaticParams
from jaxrace.envs.track import Track, stack_tracks

ENV_IDS = ("race",)


@lru_cache(maxsize=32)
def _named_track(name: str, num_points: int) -> Track:
    # Tracks are immutable pytrees, so one build per (name, size) serves every caller.
    if name.startswith("procedural:"):
        return procedural_track(int(name.split(":", 1)[1]), num_points=num_points)
    if name.endswith(".csv"):
        path = Path(name)
        raceline = path.with_name(path.stem + "_raceline.csv")
        return load_track_csv(path, raceline if raceline.exists() else None, num_points=num_points)
    return builtin_track(name, num_points=num_points)


def resolve_tracks(track, num_points: int = 2048) -> Track:
    """A Track from a Track, a name, or a list of them (stacked).

    Names: a built-in layout ('oval', 'club', 'gp', 'figure_eight'),
    'procedural:SEED', or a path to a centre-line CSV (a `NAME_raceline.csv` beside it
    is used as the race line).
    """
    if isinstance(track, Track):
        return track
    if isinstance(track, str):
        if not (track in BUILTIN_TRACKS or track.startswith("procedural:") or track.endswith(".csv")):
            raise ValueError(
                f"unknown track {track!r}: use one of {', '.join(BUILTIN_TRACKS)}, 'procedural:SEED', "
                "a path to a .csv centre line, or a Track"
            )
        return _named_track(track, num_points)
    tracks = [resolve_tracks(t, num_points) for t in track]
    if not tracks:
        raise ValueError("track list is empty")
    return tracks[0] if len(tracks) == 1 else stack_tracks(tracks)


def make(
    env_id: str = "race",
    *,
    track="club",
    num_opponents: int | None = None,
    laps: int = 1,
    start: str = "grid_back",
    num_points: int = 2048,
    **options,
) -> tuple[RaceEnv, EnvParams]:
    """Builds the race environment and its default parameters.

    Args:
        env_id: only "race" for now.
        track: a Track, a track name, or a list of them (an episode uses
            `params.track_index`, or draws one at each reset when it is -1).
        num_opponents: AI cars (0-19; default 7, or 0 for a time trial);
            `params.num_active_opponents` can lower it.
        laps: race distance (stored in `params.laps`).
        start: "time_trial" (alone), "grid_back" (ego at the back of the grid) or
            "random" (fresh random positions along the track at every reset).
        num_points: stations per track.
        **options: further StaticParams fields (dt, substeps, lookahead_points,
            lookahead_spacing, opponent_slots) or EnvParams fields (time_limit, skill, ...).

    Returns:
        (env, params).
    """
    if env_id not in ENV_IDS:
        raise ValueError(f"unknown env id {env_id!r}; available: {', '.join(ENV_IDS)}")
    static_names = set(StaticParams.__dataclass_fields__)
    static_opts = {k: v for k, v in options.items() if k in static_names}
    param_opts = {k: v for k, v in options.items() if k not in static_names}
    if num_opponents is None:
        num_opponents = 0 if start == "time_trial" else 7
    env = RaceEnv(StaticParams(num_opponents=num_opponents, start=start, **static_opts))
    params = env.default_params(resolve_tracks(track, num_points), laps=laps, **param_opts)
    return env, params
