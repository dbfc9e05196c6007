"""The racing simulator: tracks, GT3 vehicle dynamics, AI opponents, the race env."""

from jaxrace.envs.circuits import BUILTIN_TRACKS, builtin_track, load_track_csv, procedural_track
from jaxrace.envs.race import RaceEnv
from jaxrace.envs.registry import make, resolve_tracks
from jaxrace.envs.state import EnvParams, EnvState, StaticParams, per_env_params, race_fields
from jaxrace.envs.track import Track, TrackError, reference_lap_time, stack_tracks
from jaxrace.envs.vehicle import CarParams

__all__ = [
    "BUILTIN_TRACKS",
    "CarParams",
    "EnvParams",
    "EnvState",
    "RaceEnv",
    "StaticParams",
    "Track",
    "TrackError",
    "builtin_track",
    "load_track_csv",
    "make",
    "per_env_params",
    "procedural_track",
    "race_fields",
    "reference_lap_time",
    "resolve_tracks",
    "stack_tracks",
]
