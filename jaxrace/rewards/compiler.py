"""Reward programs (Python source) compiled to exported JAX functions.

`compile_reward(source)` checks the program's syntax tree here (parse and policy:
nothing runs), then has the sandbox worker execute, trace, export and validate it
(`jaxrace.rewards.build`), and loads the exported artifact. **This process never
executes the source**: a `CompiledReward` calls only the artifact, which is also what a
run directory stores (`save` / `load_reward`), so a reward is reproducible without
trusting its source again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxrace.rewards.api import Action, RaceView
from jaxrace.rewards.artifact import ArtifactError, RewardArtifact, load_call
from jaxrace.rewards.errors import RewardCompileError
from jaxrace.rewards.parse import parse_program
from jaxrace.rewards.policy import check_policy


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledReward:
    """A reward program compiled to an exported JAX function.

    Call as `compiled(prev, action, curr, params=None) -> (total f32[...], {name: f32[...]})`
    on transitions whose fields share leading axes [...] (none for one transition); it
    works under jit, vmap and grad w.r.t. the weights. `params` maps PARAMS names to
    (traced) values; missing names take their defaults. Hashable by identity, so jitted
    code can close over it.
    """

    name: str
    artifact: RewardArtifact = dataclasses.field(repr=False)
    call: Callable = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_artifact(cls, artifact: RewardArtifact | bytes, name: str | None = None) -> CompiledReward:
        """Load an artifact (raises `ArtifactError` if it is malformed or not a pure reward)."""
        if isinstance(artifact, bytes | bytearray):
            artifact = RewardArtifact.from_bytes(bytes(artifact))
        return cls(name=name or f"reward-{artifact.sha256[:8]}", artifact=artifact, call=load_call(artifact))

    @property
    def source(self) -> str:
        return self.artifact.source

    @property
    def sha256(self) -> str:
        return self.artifact.sha256

    @property
    def component_names(self) -> tuple[str, ...]:
        return self.artifact.component_names

    @property
    def params(self) -> Mapping[str, float]:
        """PARAMS defaults, in declaration order."""
        return dict(self.artifact.params)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.artifact.params)

    def default_params(self) -> dict[str, jax.Array]:
        return {k: jnp.float32(v) for k, v in self.artifact.params}

    def weights(self, params: Mapping[str, jax.Array | float] | None = None) -> jax.Array:
        """f32[P]: the defaults with `params` (a subset of PARAMS) substituted."""
        params = params or {}
        unknown = set(params) - set(self.param_names)
        if unknown:
            raise KeyError(f"reward '{self.name}' has no PARAMS {sorted(unknown)}; it declares {list(self.params)}")
        values = [jnp.asarray(params[k], jnp.float32) if k in params else jnp.float32(v) for k, v in
                  self.artifact.params]
        return jnp.stack(values) if values else jnp.zeros((0,), jnp.float32)

    def apply(self, weights: jax.Array, prev: RaceView, action: Action, curr: RaceView
              ) -> tuple[jax.Array, jax.Array]:
        """(total f32[...], components f32[..., C]) with weights f32[P] (or f32[..., P])."""
        return self.call(weights, prev, action, curr)

    def __call__(self, prev: RaceView, action: Action, curr: RaceView, params=None):
        total, components = self.call(self.weights(params), prev, action, curr)
        return total, {k: components[..., j] for j, k in enumerate(self.component_names)}

    def save(self, path: str | Path) -> Path:
        """Write the artifact (exported functions, header, source as a record) atomically."""
        path = Path(path)
        # One temporary name per writer: two processes may save the same cache entry at once.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_bytes(self.artifact.to_bytes())
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return path


def load_reward(path: str | Path, name: str | None = None) -> CompiledReward:
    """A `CompiledReward` from an artifact file written by `CompiledReward.save`."""
    path = Path(path)
    try:
        return CompiledReward.from_artifact(path.read_bytes(), name=name or path.stem)
    except ArtifactError as e:
        raise ArtifactError(f"{path}: {e}") from None


_CACHE: dict[tuple[str, str, str], CompiledReward] = {}
_CACHE_LOCK = threading.Lock()


def compile_reward(source: str, *, name: str | None = None, timeout_s: float | None = None,
                   memory_gib: float | None = None, train_batch: int | None = None,
                   max_temp_mib: float | None = None) -> CompiledReward:
    """Compile a reward program (Python source) to a `CompiledReward`.

    Args:
        source: the program; it defines `reward(prev, action, curr[, params])` and
            optionally `PARAMS = {...}` (see `jaxrace.rewards.api_text()`).
        name: a label for reports (default: "reward-<first 8 of the sha256>").
        timeout_s, memory_gib: the sandbox's limits per program (defaults in
            `jaxrace.rewards.sandbox`).
        train_batch, max_temp_mib: temporary memory of one evaluation of `train_batch`
            transitions must stay under `max_temp_mib` (defaults in `build.Limits`).

    Raises:
        RewardCompileError: with `.stage`, `.lineno` and a message fit for an LLM.
    """
    result = compile_rewards([source], names=None if name is None else [name], timeout_s=timeout_s,
                             memory_gib=memory_gib, train_batch=train_batch, max_temp_mib=max_temp_mib)[0]
    if isinstance(result, RewardCompileError):
        raise result
    return result


def compile_rewards(sources: Sequence[str], *, names: Sequence[str] | None = None, timeout_s: float | None = None,
                    memory_gib: float | None = None, train_batch: int | None = None,
                    max_temp_mib: float | None = None,
                    cache_dir: str | Path | None = None) -> list[CompiledReward | RewardCompileError]:
    """Compile many reward programs at once: the sandbox builds them in parallel, one per CPU core.

    Arguments as for `compile_reward`, with one name per source (or None). `cache_dir`:
    a folder of artifacts the sandbox built before, by program and limits (and jaxrace and
    jax versions); a program found there is loaded (and checked) instead of built, and
    every new artifact is added. Trust it as you trust the run directories you resume.

    Returns:
        One entry per source, in order: its `CompiledReward`, or the `RewardCompileError`
        it failed with. One program's failure never stops or changes another's.
    """
    if names is not None and len(names) != len(sources):
        raise ValueError(f"{len(sources)} sources but {len(names)} names")
    limits = {k: v for k, v in (("train_batch", train_batch), ("max_temp_mib", max_temp_mib)) if v is not None}
    results: list = [None] * len(sources)
    todo = []  # (index, source, digest, name, cache key)
    for i, source in enumerate(sources):
        try:
            check_policy(parse_program(source))  # quick refusals without a round trip; nothing runs
        except RewardCompileError as e:
            results[i] = e
            continue
        digest = hashlib.sha256(source.encode()).hexdigest()
        name = names[i] if names is not None else f"reward-{digest[:8]}"
        key = (digest, name, repr(sorted(limits.items())))
        with _CACHE_LOCK:
            results[i] = _CACHE.get(key)
        if results[i] is None and cache_dir is not None:
            results[i] = _load_cached(_cache_file(cache_dir, digest, limits), digest, name)
        if results[i] is None:
            todo.append((i, source, digest, name, key))
    if todo:
        from jaxrace.rewards.sandbox import build_many

        built = build_many([t[1] for t in todo], limits=limits, timeout_s=timeout_s, memory_gib=memory_gib)
        for (i, _, digest, name, key), data in zip(todo, built, strict=True):
            results[i] = data if isinstance(data, RewardCompileError) else _load_built(data, digest, name)
            if isinstance(results[i], CompiledReward):
                with _CACHE_LOCK:
                    _CACHE[key] = results[i]
                if cache_dir is not None:
                    with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
                        Path(cache_dir).mkdir(parents=True, exist_ok=True)
                        results[i].save(_cache_file(cache_dir, digest, limits))
    return results


def _cache_file(cache_dir: str | Path, digest: str, limits: dict) -> Path:
    from jaxrace import __version__
    from jaxrace.rewards.artifact import FORMAT_VERSION

    key = (f"{digest} {sorted(limits.items())!r} jaxrace {__version__} jax {jax.__version__} "
           f"artifact {FORMAT_VERSION}")
    return Path(cache_dir) / f"{hashlib.sha256(key.encode()).hexdigest()}.jaxreward"


def _load_cached(path: Path, digest: str, name: str) -> CompiledReward | None:
    """The artifact at `path` if it is a readable one of this program; None otherwise (then it is built)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    loaded = _load_built(data, digest, name)
    return loaded if isinstance(loaded, CompiledReward) else None


def _load_built(data: bytes, digest: str, name: str) -> CompiledReward | RewardCompileError:
    try:
        compiled = CompiledReward.from_artifact(data, name=name)
    except ArtifactError as e:
        return RewardCompileError("validate", f"the sandbox returned an unusable artifact: {e}")
    if compiled.sha256 != digest:
        return RewardCompileError("validate", "the sandbox returned an artifact for another program")
    return compiled
