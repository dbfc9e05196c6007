"""The reward-design loop: stages, each resumable, joined into `run_design` (host-side orchestration).

Plain Python around the jitted parts (the trainer, evaluation races, TAC, the renderer).
Stages, each writing its files to the run directory before it is marked finished:

    bootstrap                 AI-driven races at varied skill and aggression, clips, judged:
                              preferences for TAC from the first iteration
    pretrain/train            (pretrain_epochs) a library reward trains one run per seed: the agents
                              the iterations' and the final job's runs start from
    iter{k}/generate          M programs (the previous best carried over), compiled in the sandbox
    iter{k}/select            TAC over the stored preferences keeps N (all while too few are stored)
    iter{k}/train             the N x seeds runs in one batched job, checkpointed per chunk
                              (warm_start: from the best agent so far, after the first;
                              pretrain_epochs: from the pretrained agents)
    iter{k}/race              evaluation races, component statistics, clips, videos
    iter{k}/judge             pairs of clips across candidates, judged and stored
    iter{k}/rank              Bradley-Terry, the best candidate, feedback for the next iteration
    iter{k}/tune              (tune_weights) the best program's weights fitted to every stored
                              preference; the tuned program joins the next iteration
    final/train, final/race   the winner (final_candidates: the last iteration's best few) and the library
                              rewards on a longer, equal budget
    final/judge               (final_candidates > 1) the judge compares the finalists' final races;
                              Bradley-Terry picks the loop's agent
    final/trial               each final agent alone for two laps: its lap against the reference
    report                    report.html

Keys come from the config's seed folded with the stage's name, so a resumed stage draws
what it would have drawn the first time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import os
import re
import shutil
import threading
import time
import warnings
import zlib
from contextlib import contextmanager
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrace.design.config import DesignConfig
from jaxrace.design.progress import Display
from jaxrace.design.rundir import RunDir
from jaxrace.jit import jit

# Subprocesses started here (the reward sandbox, ffmpeg) exec at once after the fork, which
# is safe beside JAX's threads; JAX warns about any fork all the same.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

NOTHING_TO_TRAIN = "no candidate trained in any iteration and final_baselines is empty: no final job"
MAX_RETRIES = 1  # iterations in which every candidate failed that are run again (not counted)
STEER_LOCK_SPEED = 20.0  # m/s: speed-sensitive steering, GT7's controller assist (as the reference agent)
STORE = "preferences.sqlite"


def _crc(text: str) -> int:
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def stage_key(config: DesignConfig, stage: str) -> jax.Array:
    """The PRNG key of one stage: the run's seed folded with a hash of the stage's name."""
    return jax.random.fold_in(jax.random.key(config.seed), _crc(stage))


@dataclasses.dataclass
class Envs:
    """The training env (random starts, half the envs alone) and the race env (grid start, AI field)."""

    train_env: object
    train_params: object
    race_env: object
    race_params: object
    race_steps: int
    clip_steps: int
    ref_lap: float
    trial_params: object  # for race_env: no opponent taking part, two laps (the time trial)
    trial_steps: int

    @property
    def clip_seconds(self) -> float:
        """A clip's length in seconds (the whole race with `clip_whole_race`)."""
        return self.clip_steps * self.race_env.static.dt

    def race_fields(self, key: jax.Array, races: int):
        """Race params with a leading race axis: each race its own field (`jaxrace.envs.race_fields`)."""
        from jaxrace.envs import race_fields

        return race_fields(self.race_params, key, races)

    @classmethod
    def make(cls, config: DesignConfig) -> Envs:
        import jaxrace
        from jaxrace.envs import builtin_track, per_env_params, reference_lap_time

        ref_lap = float(reference_lap_time(builtin_track(config.track)))
        pixels = config.actor_input == "pixels"

        def field(env, params):
            c = env.static.num_cars
            return params.replace(skill=jnp.full((c,), config.ai_skill, jnp.float32),
                                  car=params.car.replace(steer_lock_speed=STEER_LOCK_SPEED))

        train_env, train_params = jaxrace.make(track=config.track, num_opponents=config.opponents, start="random",
                                               laps=1000, time_limit=1.6 * ref_lap, pixels=pixels,
                                               opponent_accel=config.opponent_accel,
                                               lane_headway=config.lane_headway,
                                               grid_start_prob=config.grid_start_prob,
                                               corner_start_prob=config.corner_start_prob,
                                               offtrack_start_prob=config.offtrack_start_prob,
                                               terminate_on_course_out=config.terminate_on_course_out,
                                               course_out_margin=config.train_course_out_margin)
        train_params = field(train_env, train_params)
        alone = config.num_envs // 2 if config.opponents else config.num_envs
        in_traffic = config.num_envs - alone
        scenarios = dict(num_active_opponents=[0] * alone + [config.opponents] * in_traffic,
                         random_start_gap=[0.0] * alone + [config.traffic_start_gap] * in_traffic)
        if config.varied_ai:
            k_ai = stage_key(config, "train/ai")
            scenarios["aggression"] = jax.random.uniform(k_ai, (config.num_envs, train_env.static.num_cars))
        train_params = per_env_params(train_params, config.num_envs, **scenarios)
        race_env, race_params = jaxrace.make(track=config.track, num_opponents=config.opponents,
                                             laps=config.race_laps, start="grid_back", pixels=pixels,
                                             opponent_accel=config.opponent_accel,
                                             lane_headway=config.lane_headway)
        race_params = field(race_env, race_params)
        _, trial_params = jaxrace.make(track=config.track, num_opponents=config.opponents, laps=2,
                                       start="grid_back", num_active_opponents=0, pixels=pixels)
        trial_params = field(race_env, trial_params)
        dt = race_env.static.dt
        steps = math.ceil(config.race_laps * ref_lap / config.ai_skill * 1.3 / dt)
        clip_steps = steps if config.clip_whole_race else min(max(1, round(config.clip_seconds / dt)), steps)
        return cls(train_env, train_params, race_env, race_params, steps, clip_steps, ref_lap, trial_params,
                   math.ceil(2.3 * ref_lap / dt))


def train_config(c: DesignConfig, *, host_updates: bool = False, sequential_runs: bool = False):
    """The `TrainConfig` of a design config's training jobs (the iterations'; the final job's
    differs in epochs only). `host_updates` and `sequential_runs` depend on the backend
    (`backend_options`)."""
    from jaxrace.agents import NetworkConfig, TrainConfig

    network = NetworkConfig(recurrent=c.recurrent, hidden=c.hidden, actor_input=c.actor_input)
    return TrainConfig(network=network, num_envs=c.num_envs, rollout_steps=c.rollout_steps,
                       updates_per_epoch=c.updates_per_epoch, batch_size=c.batch_size, replay_size=c.replay_size,
                       n_step=c.n_step, warmup_epochs=c.warmup_epochs, epochs=c.epochs,
                       actor_average=c.actor_average, actor_cvar=c.actor_cvar, host_updates=host_updates,
                       sequential_runs=sequential_runs)


def backend_options(c: DesignConfig) -> dict[str, bool]:
    """How the pixel actor trains, as measured (`experiments/epoch_split.py`). Vmapped over runs,
    its convolutions become grouped ones, slow on both backends, so each program runs a job's
    runs one after another (`TrainConfig.sequential_runs`; each device its own share when the
    runs are split over several): the paper preset's epoch of 2 runs took 2.5x less time on a
    2-core CPU, 11.5x less on an H100. On CPU, also one jitted call per update
    (`TrainConfig.host_updates`). The state actor's vmapped runs are batched matrix products:
    one after another they took 2.4x as long."""
    import jax

    pixels = c.actor_input == "pixels"
    return {"host_updates": pixels and jax.default_backend() == "cpu", "sequential_runs": pixels}


def _start_sandbox_in_background() -> None:
    """Starts the reward sandbox's worker (a second of importing JAX) while the bootstrap runs.

    A failure here is ignored: the first build starts the worker again and reports it.
    """
    from jaxrace.rewards import sandbox

    def start():
        with contextlib.suppress(Exception):
            sandbox.isolation()

    threading.Thread(target=start, name="sandbox-start", daemon=True).start()



def job_placement(runs: int, devices: int, processes: int) -> str | None:
    """Where a training job of `runs` runs trains (`train_many`), for the log; None on a single device."""
    if processes > 1 and runs % devices:
        return (f"{runs} runs do not split over the {devices} devices of {processes} processes: "
                "trained by process 0 alone")
    if devices == 1:
        return None
    if runs % devices:
        return (f"{runs} runs do not split over the {devices} devices: trained whole on one "
                f"(N x seeds a multiple of {devices} would use them all)")
    return f"{runs} runs split over {devices} devices, {runs // devices} on each"

class Loop:
    """One run of the loop over a run directory (see the module docstring)."""

    def __init__(self, config: DesignConfig, run: RunDir, display: Display):
        self.config = config
        self.run = run
        self.display = display
        self._store = None  # the PreferenceStore, opened by `store`
        self._envs: Envs | None = None
        self._chat = None
        self._vlm = None
        self._human = None
        self._record = None
        self._learner = None  # one per process: its programs serve every iteration's bank
        self.last_iteration = config.iterations  # one more for each retried iteration (run_all)

    # -- plumbing --------------------------------------------------------------------------------------

    @property
    def store(self):
        """The run's preference store (opened on first use: processes other than 0 never open it)."""
        from jaxrace.rewards.preferences import PreferenceStore

        if self._store is None:
            self._store = PreferenceStore(self.run.file(STORE))
            self._store.set_meta("task", self.config.task)  # the human judge's page shows it
        return self._store

    @property
    def envs(self) -> Envs:
        if self._envs is None:
            self._envs = Envs.make(self.config)
        return self._envs

    @contextmanager
    def _stage(self, name: str):
        from jaxrace.design.compilation import CompileClock

        with CompileClock() as clock, self.run.attempt(name, lambda: clock.seconds) as earlier:
            t0 = time.perf_counter()
            self.run.log(f"{name}: started" + (f" (attempt {earlier['attempts'] + 1})" if earlier["attempts"] else ""))
            yield
            seconds = time.perf_counter() - t0
        self.run.mark_done(name, seconds, compile_seconds=clock.seconds, earlier=earlier)
        said = f"{name}: finished in {seconds:.1f} s ({clock.seconds:.1f} s compiling)"
        if earlier["attempts"]:
            said += f"; {seconds + earlier['seconds']:.1f} s over {earlier['attempts'] + 1} attempts"
        self.run.log(said)
        self.display.line(said)

    def stage(self, name: str, fn, *args) -> None:
        if self.run.done(name):
            self.display.line(f"{name}: finished earlier, kept")
            return
        with self._stage(name):
            fn(*args)

    def judge(self):
        from jaxrace.judges import ScriptedJudge, TaskScoring

        c = self.config
        if c.judge == "vlm":
            if self._vlm is None:
                from jaxrace.judges.vlm import VLMJudge
                from jaxrace.llm import open_chat

                kind = "replay" if c.llm == "replay" else "openai"
                chat = open_chat(kind, self.record, base_url=c.judge_base_url or c.base_url or None,
                                 model=c.judge_model or c.model or None, replay_from=c.replay_from or None,
                                 role="judge")
                self._vlm = VLMJudge(chat, c.task, root=self.run.path, frames=c.judge_frames,
                                     seconds=self.envs.clip_seconds)
            return self._vlm
        if c.judge == "human":
            if self._human is None:
                from jaxrace.judges.human import HumanJudge

                def notify(text):
                    self.run.log(re.sub(r"token=[\w-]+", "token=<printed on the terminal>", text))
                    self.display.notice(text)

                self._human = HumanJudge(self.store, host=c.judge_host, port=c.judge_port,
                                         timeout_s=c.judge_timeout_s, notify=notify)
            return self._human
        scoring = dataclasses.replace(TaskScoring.from_task(c.task), standing_at=c.judge_standing_at)
        if not c.judge_standing:
            scoring = dataclasses.replace(scoring, standing=0.0)
        return ScriptedJudge(scoring=scoring, beta=c.judge_beta, mistake=c.judge_mistake,
                             equal_within=c.judge_equal_within, seed=c.seed)

    # -- the loop --------------------------------------------------------------------------------------

    def run_all(self) -> Path:
        c = self.config
        self.run.log(f"run: task {c.task!r}, preset {c.preset}, {c.iterations} iterations of M={c.m}, N={c.n}")
        if not self.run.done(f"iter{c.iterations}/generate"):
            _start_sandbox_in_background()
        if c.bootstrap_races:
            self.stage("bootstrap", self.bootstrap)
        if c.pretrain_epochs:
            self.stage("pretrain/train", self.train, "pretrain")
        k, retries = 1, 0
        while k <= c.iterations + retries:
            self.stage(f"iter{k}/generate", self.generate, k)
            self.stage(f"iter{k}/select", self.select, k)
            self.stage(f"iter{k}/train", self.train, k)
            self.stage(f"iter{k}/race", self.race, k)
            self.stage(f"iter{k}/judge", self.judge_pairs, k)
            self.stage(f"iter{k}/rank", self.rank, k)
            if not self.run.read_json(f"iter{k}/rank.json")["parents"] and retries < MAX_RETRIES:
                # nothing trained: not counted, the next iteration retries with the failures in its prompt
                retries += 1
                self.run.log(f"iter{k}: every candidate failed in training; iteration {k + 1} retries it")
                self.display.line(f"iter{k}: every candidate failed in training; iteration {k + 1} retries it")
            if c.tune_weights and k < c.iterations + retries:
                self.stage(f"iter{k}/tune", self.tune, k)
            k += 1
        self.last_iteration = k - 1
        if self._runs("final")[0]:
            self.stage("final/train", self.train, "final")
            self.stage("final/race", self.race, "final")
            if len(self._finalists()) > 1:
                self.stage("final/judge", self.judge_final)
            self.stage("final/trial", self.time_trial)
        else:
            self.run.log(f"final: {NOTHING_TO_TRAIN}")
        from jaxrace.design.report import write_report

        with self._stage("report"):
            path = write_report(self.run)
        return path

    # -- stages ----------------------------------------------------------------------------------------

    def bootstrap(self) -> None:
        """Preferences before any agent exists: the built-in AI driving the ego car with varied skill,
        in `bootstrap_careless` of the races blind to the other cars (the AI field never runs into a
        car, so without those the store would hold no at-fault contact to price)."""
        from jaxrace.envs.rollouts import trajectory_with_actions

        c, e = self.config, self.envs
        races = c.bootstrap_races
        k_style, k_race = jax.random.split(stage_key(c, "bootstrap"))
        careless = np.asarray(jax.random.permutation(jax.random.fold_in(k_style, 2),
                                                     np.arange(races) < round(c.bootstrap_careless * races)))
        # a blind driver slower than the field never reaches it after the start: it drives at least
        # about as fast (at skill 0.9, 0.85-1; a seeing one 0.6-1)
        floor = np.where(careless, max(0.6, min(c.ai_skill, 1.0) - 0.05), 0.6)
        ego_skill = floor + (1.0 - floor) * np.asarray(jax.random.uniform(k_style, (races,)))
        ego_aggression = np.asarray(jax.random.uniform(jax.random.fold_in(k_style, 1), (races,)))
        params = jax.vmap(lambda s, a: e.race_params.replace(skill=e.race_params.skill.at[0].set(s),
                                                             aggression=e.race_params.aggression.at[0].set(a)))(
            jnp.asarray(ego_skill), jnp.asarray(ego_aggression))
        keys = jax.random.split(k_race, races)
        with self.display.task("bootstrap: AI races", total=None):
            states, actions = jit(jax.vmap(lambda p, key, blind: trajectory_with_actions(
                e.race_env, p, key, e.race_steps, ai_sees_traffic=~blind)),
                renders=e.race_env.static.pixels)(params, keys, jnp.asarray(careless))
        names = [f"ai(skill={s:.2f}, aggression={a:.2f}{', blind' if b else ''})"
                 for s, a, b in zip(ego_skill, ego_aggression, careless, strict=True)]
        clip_ids = self._store_clips("bootstrap", 0, names, [0] * races, list(range(races)), states, actions,
                                     same_race=False)
        pairs = []
        for slot in range(c.clips_per_race):
            for a, b in itertools.combinations(range(races), 2):
                pairs.append((f"bootstrap/slot{slot}/{a}~{b}", clip_ids[(a, 0, slot)], clip_ids[(b, 0, slot)]))
        self._judge(0, pairs, "bootstrap")
        self.run.write_json("bootstrap/races.json", {"names": names, "skill": ego_skill, "aggression": ego_aggression,
                                                     "blind": careless, "pairs": len(pairs)})

    @property
    def record(self):
        """The run's LLM record (llm/record.jsonl), shared by the generator and the VLM judge."""
        if self._record is None:
            from jaxrace.llm import Record

            self._record = Record(self.run.file("llm/record.jsonl"))
        return self._record

    @property
    def chat(self):
        """The run's LLM backend, recording every request and reply to llm/record.jsonl."""
        if self._chat is None:
            from jaxrace.llm import Budget, open_chat

            c = self.config
            self._chat = open_chat(c.llm, self.record, base_url=c.base_url or None,
                                   model=c.model or None, replay_from=c.replay_from or None,
                                   budget=Budget(max_tokens=c.llm_token_budget or None,
                                                 max_calls=c.llm_call_budget or None))
        return self._chat

    def generate(self, k: int) -> None:
        """M compiled candidates: the previous best carried over, the rest written by the LLM (or offline)."""
        from jaxrace.llm import LLMError, generate
        from jaxrace.llm.generate import Generation
        from jaxrace.rewards import load_reward

        c = self.config
        folder = f"iter{k}/candidates"
        candidates, exclude, feedback = [], [], ""
        if k > 1:
            feedback = self.run.file(f"iter{k - 1}/feedback.txt").read_text(encoding="utf-8")
        if k > 1 and (best := self._best(k - 1)) is not None:
            name, where = best
            source = self.run.file(f"{where}/{name}.py").read_text(encoding="utf-8")
            compiled = load_reward(self.run.file(f"{where}/{name}.jaxreward"))
            self.run.write_text(f"{folder}/{name}.py", source)
            compiled.save(self.run.file(f"{folder}/{name}.jaxreward"))
            candidates.append({"name": name, "origin": f"carried from iteration {k - 1}",
                               "components": list(compiled.component_names), "params": dict(compiled.params)})
            exclude.append(source)
        tuned = self.run.read_json(f"iter{k - 1}/tune.json") if k > 1 and self.run.exists(
            f"iter{k - 1}/tune.json") else {}
        if tuned.get("program"):
            name = tuned["program"]
            source = self.run.file(f"iter{k - 1}/tuned/{name}.py").read_text(encoding="utf-8")
            compiled = load_reward(self.run.file(f"iter{k - 1}/tuned/{name}.jaxreward"))
            self.run.write_text(f"{folder}/{name}.py", source)
            compiled.save(self.run.file(f"{folder}/{name}.jaxreward"))
            candidates.append({"name": name, "origin": f"carried from iteration {k - 1}: {tuned['candidate']} with "
                                                       f"weights tuned ({tuned['method']}, {tuned['reason']})",
                               "components": list(compiled.component_names), "params": dict(compiled.params)})
            exclude.append(source)
        if k == 1 and c.start_reward:
            start = self._start_reward(folder)
            candidates.append(start)
            exclude.append(self.run.file(f"{folder}/{start['name']}.py").read_text(encoding="utf-8"))
            feedback = (f"No iteration has run yet. The program to improve on is the library's {c.start_reward} "
                        f"reward, written in the same terms as yours; it races beside your candidates as "
                        f"{start['name']}.\n\n### The best program: {start['name']}\n```python\n{exclude[-1]}```\n")
        chat = self.chat
        chat.stage = f"iter{k}/generate"
        with self.display.task(f"iter{k}/generate: {c.llm} LLM writes, the sandbox compiles", total=c.m) as advance:
            advance(len(candidates))
            # the carried programs may fill all M (M = 2 with a tuned best, or 1 with a start reward)
            result = generate(chat, c.task, c.m - len(candidates), feedback, repairs=c.llm_repairs,
                              concurrency=c.llm_concurrency, seed=_crc(f"{c.seed}/iter{k}/generate"),
                              temperature=c.llm_temperature, max_tokens=c.llm_max_tokens,
                              max_prompt_chars=c.llm_max_prompt_chars, exclude=exclude,
                              on_program=lambda _: advance(1),
                              compile_fn=self._compile_fn()) if c.m > len(candidates) else Generation([], [])
        for program in result.programs:
            name = f"i{k}-c{len(candidates) + 1}"
            self.run.write_text(f"{folder}/{name}.py", program.source)
            program.compiled.save(self.run.file(f"{folder}/{name}.jaxreward"))
            candidates.append({"name": name, "origin": f"{chat.model} (sample {program.sample + 1}"
                                                        f"{f', {program.repairs} repairs' if program.repairs else ''})",
                               "components": list(program.compiled.component_names),
                               "params": dict(program.compiled.params)})
        self.run.write_json(f"iter{k}/attempts.json", {"stopped": result.stopped, "tokens": result.tokens,
                                                        "attempts": result.attempts})
        if result.stopped:
            self.run.log(f"iter{k}/generate: stopped early: {result.stopped}")
        if len(candidates) < min(2, c.m) and not result.programs:
            raise LLMError(f"iteration {k}: the LLM gave no program that compiles ({result.stopped}); every "
                               f"attempt is in {self.run.file(f'iter{k}/attempts.json')}")
        self.run.write_json(f"iter{k}/candidates.json", candidates)

    def _start_reward(self, folder: str) -> dict:
        """The library reward the run starts from (`start_reward`), compiled into iteration 1 as i1-c1."""
        from jaxrace.rewards.compiler import RewardCompileError
        from jaxrace.rewards.proposer import library_proposal

        c, name = self.config, "i1-c1"
        source = library_proposal(c.start_reward, c.task).source
        compiled = self._compile_fn()([source], names=[name])[0]
        if isinstance(compiled, RewardCompileError):  # the proposer's own terms: a bug, not an LLM's error
            raise RuntimeError(f"the start reward {c.start_reward!r} did not compile: {compiled}")
        self.run.write_text(f"{folder}/{name}.py", source)
        compiled.save(self.run.file(f"{folder}/{name}.jaxreward"))
        return {"name": name, "origin": f"carried from the start: the library's {c.start_reward} in the offline "
                                        "proposer's terms (start_reward)",
                "components": list(compiled.component_names), "params": dict(compiled.params)}

    def tune(self, k: int) -> None:
        """The best program's weights fitted to every stored preference (`jaxrace.rewards.tuning`); when
        tuning helps on held-out pairs, the program with the tuned PARAMS is compiled for the next iteration."""
        from jaxrace.rewards import RewardBank, compile_reward, load_reward
        from jaxrace.rewards.proposer import parse_proposal, tuning_bands, tuning_limits
        from jaxrace.rewards.tuning import TuningConfig, tune, with_params

        c = self.config
        best = self._best(k)
        if best is None:
            self.run.write_json(f"iter{k}/tune.json", {"program": None, "reason": "no candidate trained"})
            return
        name, folder = best
        try:
            first, second, labels = self.store.labelled_pairs()
        except ValueError as err:
            self.run.write_json(f"iter{k}/tune.json", {"program": None, "candidate": name, "reason": str(err)})
            return
        compiled = load_reward(self.run.file(f"{folder}/{name}.jaxreward"))
        # a program in the offline proposer's form (its own, or an LLM's that kept its w_<term> weights) keeps
        # the proposer's rules through tuning: its named prices never fall, and a rear-end keeps its price in
        # seconds of the pay for progress
        proposal = parse_proposal(self.run.file(f"{folder}/{name}.py").read_text(encoding="utf-8"))
        limits = tuning_limits(proposal, c.task) if proposal is not None else None
        bands = tuning_bands(proposal) if proposal is not None else None
        with self.display.task(f"iter{k}/tune: {name}'s weights, {c.tune_weights}, {len(labels)} preferences",
                               total=None):
            result = tune(RewardBank.from_compiled([compiled]), first, second, labels,
                          TuningConfig(method=c.tune_weights, seed=c.seed), limits=None if limits is None else [limits],
                          bands=None if bands is None else [bands])
        (one,) = result.candidates
        record = dataclasses.asdict(one) | {"candidate": name, "method": c.tune_weights, "program": None,
                                            "fit_seconds": result.fit_seconds, "clips": result.clips, "limits": limits,
                                            "bands": None if bands is None else [b.as_dict() for b in bands]}
        if one.tuned:
            tuned_name = f"{re.sub(r'-t[0-9]+$', '', name)}-t{k}"
            source = with_params(self.run.file(f"{folder}/{name}.py").read_text(encoding="utf-8"), one.params)
            self.run.write_text(f"iter{k}/tuned/{tuned_name}.py", source)
            compile_reward(source, name=tuned_name).save(self.run.file(f"iter{k}/tuned/{tuned_name}.jaxreward"))
            record["program"] = tuned_name
        self.run.log(f"iter{k}/tune: {name}: {one.reason}")
        self.run.write_json(f"iter{k}/tune.json", record)

    def select(self, k: int) -> None:
        """TAC over the store keeps N (the carried best always stays); all N while the store is small."""
        c = self.config
        candidates = self.run.read_json(f"iter{k}/candidates.json")
        names = [x["name"] for x in candidates]
        # a carried best raced with its saved agent is kept beside the N trained
        reused = self._carried_untuned(k, candidates) if self._reuses_agents(k) else None
        n = c.n + (reused is not None)
        labelled = self.store.count_labelled()
        tac_scores = None
        if labelled >= c.tac_min_preferences and len(names) > n:
            from jaxrace.rewards.tac import tac

            bank = self._bank(f"iter{k}/candidates", names)
            first, second, labels = self.store.labelled_pairs()
            with self.display.task(f"iter{k}/select: TAC over {len(labels)} preferences", total=None):
                tac_scores = np.asarray(tac(bank, jax.tree.map(jnp.asarray, first), jax.tree.map(jnp.asarray, second),
                                            jnp.asarray(labels), variant="b"))
            carried = [i for i, x in enumerate(candidates) if x["origin"].startswith("carried")]
            order = carried + [int(i) for i in np.argsort(-tac_scores, kind="stable") if int(i) not in carried]
            selected = sorted(order[:n])
            reason = f"the top {n} of {len(names)} by TAC (tau-b) over {labelled} stored preferences"
        else:
            selected = list(range(min(n, len(names))))
            reason = (f"TAC needs at least {c.tac_min_preferences} stored preferences and the store holds {labelled}: "
                      f"kept the first {len(selected)}" if len(names) > n else
                      f"all {len(names)} candidates fit the N={c.n} trained")
        if reused is not None:
            reason += f"; {reused} races with its agent from iteration {k - 1}"
        self.run.log(f"iter{k}/select: {reason}")
        self.run.write_json(f"iter{k}/select.json", {
            "selected": [names[i] for i in selected], "reason": reason, "labelled_preferences": labelled,
            "tac": None if tac_scores is None else dict(zip(names, tac_scores.tolist(), strict=True))})

    def _runs(self, k) -> tuple[list[str], str]:
        """(candidate names trained in stage k, the folder of their artifacts)."""
        if k == "final":
            return [name for name, _ in self._finalists()] + list(self.config.final_baselines), "final/candidates"
        if k == "pretrain":
            return [self.config.pretrain_reward], "pretrain/candidates"
        return self.run.read_json(f"iter{k}/select.json")["selected"], f"iter{k}/candidates"

    def _best(self, k: int) -> tuple[str, str] | None:
        """(name, folder of its program) of the best candidate after iteration k; None while none trained."""
        rank = self.run.read_json(f"iter{k}/rank.json")
        if rank["best"] is None:
            return None
        return rank["best"], rank.get("best_folder", f"iter{k}/candidates")

    def _finalists(self) -> list[tuple[str, str]]:
        """(name, folder of its program) of the loop's candidates in the final job: the best after the last
        iteration, then that iteration's next trained candidates in Bradley-Terry's order, `final_candidates`
        in all; empty while none trained."""
        k = self.last_iteration
        best = self._best(k)
        if best is None or self.config.final_candidates == 1:
            return [] if best is None else [best]
        rank = self.run.read_json(f"iter{k}/rank.json")
        more = [(n, f"iter{k}/candidates") for n in rank["order"] if n != best[0] and not rank["failed"][n]]
        return ([best] + more)[:self.config.final_candidates]

    @staticmethod
    def _carried_untuned(k: int, candidates: list[dict]) -> str | None:
        """The name of iteration k's best candidate carried from k - 1 with its weights as they were."""
        return next((x["name"] for x in candidates if x["origin"] == f"carried from iteration {k - 1}"), None)

    def _reuses_agents(self, k) -> bool:
        return self.config.reuse_carried_agent and isinstance(k, int) and k > 1 and jax.process_count() == 1

    def _reused(self, k) -> str | None:
        """The candidate of stage k that races with its saved agent instead of training again; None if none."""
        if not self._reuses_agents(k):
            return None
        name = self._carried_untuned(k, self.run.read_json(f"iter{k}/candidates.json"))
        return name if name in self._runs(k)[0] else None

    @staticmethod
    def _compile_fn():
        """compile_rewards with the artifact cache beside JAX's (a rerun builds nothing it built before)."""
        from jaxrace.design.compilation import reward_cache_dir
        from jaxrace.rewards.compiler import compile_rewards

        return functools.partial(compile_rewards, cache_dir=reward_cache_dir())

    def _bank(self, folder: str, names: list[str]):
        from jaxrace.rewards import RewardBank, load_reward

        return RewardBank.from_compiled([load_reward(self.run.file(f"{folder}/{n}.jaxreward")) for n in names])

    def _trainer(self, k, bank):
        from jaxrace.agents.trainer import Trainer, make_learner

        c = self.config
        if self._learner is None:
            config = train_config(c, **backend_options(c))
            self._learner = make_learner(config, self.envs.train_env, self.envs.train_params)
        return Trainer(self._learner, bank, dataclasses.replace(self._learner.config, epochs=self._epochs(k)))

    def _epochs(self, k) -> int:
        c = self.config
        return {"final": c.final_epochs, "pretrain": c.pretrain_epochs}.get(k, c.epochs)

    def _prepare_pretrain(self) -> None:
        from jaxrace.rewards import library_reward

        name = self.config.pretrain_reward
        self.run.file("pretrain/candidates").mkdir(parents=True, exist_ok=True)
        library_reward(name).save(self.run.file(f"pretrain/candidates/{name}.jaxreward"))

    def _prepare_final(self) -> None:
        from jaxrace.rewards import library_reward, load_reward

        folder = "final/candidates"
        self.run.file(folder).mkdir(parents=True, exist_ok=True)  # (no winner's files make it when none trained)
        for name, where in self._finalists():
            self.run.write_text(f"{folder}/{name}.py", self.run.file(f"{where}/{name}.py").read_text(encoding="utf-8"))
            load_reward(self.run.file(f"{where}/{name}.jaxreward")).save(self.run.file(f"{folder}/{name}.jaxreward"))
        for name in self.config.final_baselines:
            library_reward(name).save(self.run.file(f"{folder}/{name}.jaxreward"))

    def train(self, k) -> None:
        """The stage's candidates x seeds in one batched job; checkpoints per chunk, so a kill loses a chunk.

        With several processes, they all join the job (`serve_training`); process 0 writes the files.
        """
        from jaxrace.agents.distributed import broadcast_json

        c = self.config
        if k == "final":
            self._prepare_final()
        if k == "pretrain":
            self._prepare_pretrain()
        reused = self._reused(k)
        trained = [n for n in self._runs(k)[0] if n != reused]
        seeds = self._seeds(k)
        runs = len(trained) * seeds
        # A job whose runs do not split over every process's devices trains on process 0's alone.
        alone = jax.process_count() > 1 and runs % jax.device_count() != 0
        placement = job_placement(runs, jax.device_count(), jax.process_count())
        if placement:
            self.run.log(f"{self._dir(k)}/train: {placement}")
        broadcast_json({"train": k, "last_iteration": self.last_iteration, "alone": alone})
        epochs = self._epochs(k)
        with self.display.task(f"{self._dir(k)}/train: {len(trained)} x {seeds} runs (compile first)",
                               total=epochs) as advance:
            done = [0]

            def progress(epoch, metrics):
                advance(epoch - done[0])
                done[0] = epoch
                self.run.log(f"{self._dir(k)}/train: epoch {epoch}/{epochs}, progress m/step "
                             + " ".join(f"{float(v):.2f}" for v in metrics.progress[:, -1]))

            names, history, reward_index = self.train_job(k, progress, alone=alone)
        curves = {f: np.asarray(getattr(history, f), np.float64) for f in history._fields}
        failed = np.asarray(history.failed[:, -1], bool) | ~np.all(np.isfinite(curves["reward"]), axis=1)
        runs = [{"candidate": names[int(i)], "seed": s % seeds, "failed": bool(failed[s])}
                for s, i in enumerate(reward_index)]
        if reused is not None:  # its runs as they trained in iteration k - 1, after the trained ones
            earlier = self.run.read_json(f"iter{k - 1}/train/curves.json")
            picks = [r for r, run in enumerate(earlier["runs"]) if run["candidate"] == reused]
            runs += [earlier["runs"][r] | {"reused_from": earlier["runs"][r].get("reused_from", k - 1)}
                     for r in picks]
            curves = {f: np.concatenate([v, np.asarray(earlier[f], np.float64)[picks]]) for f, v in curves.items()
                      if f != "failed"}
        self.run.write_json(f"{self._dir(k)}/train/curves.json", {
            "runs": runs, "epochs": epochs, "env_steps_per_epoch": c.num_envs * c.rollout_steps,
            **{f: v for f, v in curves.items() if f != "failed"}})
        # The job state holds the replay buffer: large, and done with. Renamed first: orbax would
        # take a half-deleted step folder for a finished one.
        job = self.run.file(f"{self._dir(k)}/train/job.ckpt")
        if job.exists():
            os.replace(job, job.with_name("job.ckpt.deleting"))
        shutil.rmtree(job.with_name("job.ckpt.deleting"), ignore_errors=True)

    def train_job(self, k, progress=None, *, alone: bool = False):
        """Trains stage k's runs and saves the agents (orbax). Every process of the job calls this,
        unless `alone`: then process 0 trains on its own devices.

        Returns (candidate names, Metrics [R, epochs] as numpy arrays, candidate index per run i32[R]).
        """
        from jaxrace.agents import HParams, train_many
        from jaxrace.agents.checkpoint import save_checkpoint
        from jaxrace.agents.distributed import to_host

        c = self.config
        names, folder = self._runs(k)
        reused = self._reused(k)
        names = [n for n in names if n != reused]
        trainer = self._trainer(k, self._bank(folder, names))
        shutil.rmtree(self.run.file(f"{self._dir(k)}/train/job.ckpt.deleting"), ignore_errors=True)
        keep = self._keep_best(trainer) if k == "final" and c.keep_best_every else None
        start_from = self._start_from(k, trainer, len(names) * self._seeds(k))
        hold = self._hold(k) if start_from is not None else 0
        state, history, reward_index = train_many(
            trainer, stage_key(c, f"{self._dir(k)}/train"), list(range(len(names))), seeds_per_reward=self._seeds(k),
            hparams=HParams(reward_scale=c.reward_scale, actor_hold_epochs=hold), chunk_epochs=c.chunk_epochs,
            progress=progress,
            checkpoint=str(self.run.file(f"{self._dir(k)}/train/job.ckpt")),
            devices=jax.local_devices() if alone else None, keep=keep, start_from=start_from)
        actor = state.policy_actor
        if keep is not None:
            actor = keep.actor
            if jax.process_index() == 0:
                self.run.write_json(f"{self._dir(k)}/train/kept.json", {
                    "epoch": keep.epoch.tolist(), "task_score": [-float(x) for x in keep.score],
                    "judged": [{"epoch": e, "task_score": [-x for x in s]} for e, s in keep.history],
                    "races": c.select_races, "every_chunks": c.keep_best_every,
                    "averaged_policies": c.keep_best_average})
        critic = state.critic
        if reused is not None:  # (single process: `_reuses_agents`)
            earlier = self.run.read_json(f"iter{k - 1}/train/curves.json")["runs"]
            picks = np.asarray([r for r, run in enumerate(earlier) if run["candidate"] == reused])
            old_actor, old_critic = self._actors(k - 1, trainer, len(earlier), critic=True)
            actor, critic = (jax.tree.map(lambda a, b: np.concatenate([np.asarray(a), np.asarray(b)[picks]]), new, old)
                             for new, old in ((to_host(actor), old_actor), (to_host(critic), old_critic)))
            self.run.log(f"{self._dir(k)}/train: {reused} races with its agent from iteration {k - 1} "
                         f"(runs {picks.tolist()} there), not trained again")
        save_checkpoint(self.run.file(f"{self._dir(k)}/train/agents"), {"actor": actor, "critic": critic},
                        trainer.config.epochs, local=alone)
        return names, to_host(history), to_host(reward_index)

    def _parent(self, k: int) -> tuple[int, str] | None:
        """(iteration, name) of the best candidate trained before iteration k; None before any trained."""
        for j in range(k - 1, 0, -1):
            rank = self.run.read_json(f"iter{j}/rank.json")
            if rank["parents"]:  # a candidate trained in iteration j: the best is the first of them
                return j, rank["best"]
        return None

    def _start_from(self, k, trainer, runs: int) -> dict | None:
        """`train_many`'s start_from for stage k. With `warm_start`, an iteration after the first
        starts every run from the agent of the previous best's run with its seed (or its first run
        that did not fail), as saved. Otherwise, with `pretrain_epochs`, an iteration's or the final
        job's runs start from the pretrained agent of their seed. None: from scratch."""
        c = self.config
        parent = self._parent(k) if c.warm_start and isinstance(k, int) else None
        if parent is not None:
            j, name = parent
            curves = self.run.read_json(f"iter{j}/train/curves.json")
            picks = parent_runs(curves["runs"], name, runs, self._seeds(k))
            said, start = f"warm start from iter{j}'s best, {name}", {"iteration": j, "candidate": name}
        elif c.pretrain_epochs and k != "pretrain":
            j, name = "pretrain", c.pretrain_reward
            curves = self.run.read_json("pretrain/train/curves.json")
            if all(run["failed"] for run in curves["runs"]):
                self.run.log(f"{self._dir(k)}/train: every pretrained run failed; training from scratch")
                return None
            picks = parent_runs(curves["runs"], name, runs, self._seeds(k))
            said, start = f"from the agents pretrained on {name}", {"pretrained": name}
        else:
            return None
        actor, critic = self._actors(j, trainer, len(curves["runs"]), critic=True)
        alpha = np.asarray(curves["alpha"], np.float64)[picks, -1]
        if jax.process_index() == 0:
            hold = self._hold(k)
            held = f"; the actor held for {hold} epochs" if hold else ""
            self.run.log(f"{self._dir(k)}/train: {said} (its runs {picks}, alpha "
                         + " ".join(f"{a:.3g}" for a in alpha) + f"){held}")
            self.run.write_json(f"{self._dir(k)}/train/start.json", {**start, "runs": picks, "alpha": alpha,
                                                                     "actor_hold_epochs": hold})

        def take(x):
            return np.asarray(x)[np.asarray(picks)]

        return {"actor": jax.tree.map(take, actor), "critic": jax.tree.map(take, critic),
                "log_alpha": np.log(alpha).astype(np.float32)}

    def _hold(self, k) -> int:
        """Epochs stage k's runs hold their actor and temperature when started from another agent."""
        c = self.config
        return 0 if k == "final" and not c.start_hold_final else c.start_hold_epochs

    def _keep_best(self, trainer):
        """Each final run's best checkpoint by the task: races on fields of their own (not the final
        races'), each scored whole as the scripted judge scores a clip (`TaskScoring.from_task`)."""
        from jaxrace.agents.distributed import to_host
        from jaxrace.agents.evaluation import evaluate
        from jaxrace.agents.selection import KeepBest
        from jaxrace.judges import ScriptedJudge, TaskScoring
        from jaxrace.rewards.api import Action
        from jaxrace.rewards.clips import cut_clip

        c, e = self.config, self.envs
        # a whole race's standing at its end is the places it gained, which the steps already count
        judge = ScriptedJudge(scoring=dataclasses.replace(TaskScoring.from_task(c.task), standing=0.0))
        k_field, k_race = jax.random.split(stage_key(c, "final/select"))
        fields = e.race_fields(k_field, c.select_races)
        per_race = (0, 0, 0, None, None)
        whole = jit(jax.vmap(jax.vmap(cut_clip, in_axes=per_race), in_axes=per_race), static_argnums=4)

        def score(epoch, actors):
            ev = evaluate(trainer, to_host(actors), e.race_env, fields, k_race, e.race_steps,
                          num_races=c.select_races, params_per_race=True)
            views = ev.states.view  # [R, races, T + 1]
            done = views.finished[..., 1:] & ~views.finished[..., :-1]
            act = Action(steering=ev.actions[..., 0], throttle_brake=ev.actions[..., 1])
            clips = jax.tree.map(np.asarray, whole(views, act, done, jnp.int32(0), e.race_steps))
            runs, races = views.progress.shape[:2]
            task = [[judge.score(jax.tree.map(lambda x, r=r, i=i: x[r, i], clips)) for i in range(races)]
                    for r in range(runs)]
            if jax.process_index() == 0:
                self.run.log(f"final/train: epoch {epoch}, task score of the selection races per run "
                             + " ".join(f"{np.mean(t):.2f}" for t in task))
            return -np.mean(np.asarray(task), axis=1)

        return KeepBest(score, every=c.keep_best_every, average=c.keep_best_average)

    def _seeds(self, k) -> int:
        """Training draws per reward in stage k (keys of their own)."""
        return self.config.final_seeds if k == "final" else self.config.seeds

    def _final_agents(self) -> dict[str, int]:
        return final_agents(self.run.path)

    @staticmethod
    def _dir(k) -> str:
        return k if k in ("final", "pretrain") else f"iter{k}"

    def _actors(self, k, trainer, runs: int, *, critic: bool = False):
        """Stage k's saved actors (leading run axis), with their critics when `critic`."""
        from jaxrace.agents import HParams
        from jaxrace.agents.checkpoint import load_checkpoint
        from jaxrace.agents.runner import per_run_hparams

        template = jax.eval_shape(jax.vmap(trainer.init), jax.random.split(jax.random.key(0), runs),
                                  per_run_hparams(HParams(), runs), jnp.zeros((runs,), jnp.int32))
        saved, _ = load_checkpoint(self.run.file(f"{self._dir(k)}/train/agents"),
                                   {"actor": template.actor, "critic": template.critic})
        return (saved["actor"], saved["critic"]) if critic else saved["actor"]

    def race(self, k) -> None:
        """Evaluation races of every run; metrics, component statistics, clips (stored) and videos."""
        from jaxrace.agents.evaluation import evaluate

        c, e = self.config, self.envs
        d = self._dir(k)
        names, folder = self._runs(k)
        bank = self._bank(folder, names)
        trainer = self._trainer(k, bank)
        curves = self.run.read_json(f"{d}/train/curves.json")
        runs = curves["runs"]
        actors = self._actors(k, trainer, len(runs))
        races = c.final_races if k == "final" else c.eval_races
        k_field, k_race = jax.random.split(stage_key(c, f"{d}/race"))
        with self.display.task(f"{d}/race: {len(runs)} runs x {races} races", total=None):
            ev = evaluate(trainer, actors, e.race_env, e.race_fields(k_field, races), k_race, e.race_steps,
                          num_races=races, params_per_race=True)
        metrics = [[dataclasses.asdict(m) for m in per_run] for per_run in ev.metrics]
        self.run.write_json(f"{d}/race/metrics.json", {"runs": runs, "races": metrics, "reference_lap": e.ref_lap})
        self.run.write_json(f"{d}/race/components.json", self._component_stats(bank, ev, runs, names))
        clips_json, clips_dir, iteration = f"{d}/race/clips.json", d, k
        if k == "final":
            self.run.write_json(f"{d}/race/track.json", centre_line(e.race_params))
            agents = self._final_agents()
            self._videos(d, [(name, ri, 0, 0) for name, ri in agents.items()],
                         ev.states, seconds=min(30.0, e.race_steps * e.race_env.static.dt))
            finalists = [n for n, _ in self._finalists()]
            if len(finalists) < 2:
                return
            # the judge picks among the loop's finalists from their final races' clips (stored as iteration K + 1)
            ok = [agents[n] for n in finalists if not runs[agents[n]]["failed"]]
            clips_dir, iteration = "final/clips", self.last_iteration + 1
        else:
            ok = [ri for ri, r in enumerate(runs) if not r["failed"]]
        ids = self._store_clips(clips_dir, iteration, [runs[ri]["candidate"] for ri in ok],
                                [runs[ri]["seed"] for ri in ok], ok, jax.tree.map(lambda x: x[np.asarray(ok, int)],
                                                                                  ev.states),
                                ev.actions[np.asarray(ok, int)], same_race=True) if ok else {}
        self.run.write_json(clips_json, {f"{a}/{b}/{s}": v for (a, b, s), v in ids.items()})

    def time_trial(self) -> None:
        """Each final agent alone for two laps from a standing start (the races' laps are in traffic)."""
        from jaxrace.agents.selection import assess

        e = self.envs
        names, folder = self._runs("final")
        trainer = self._trainer("final", self._bank(folder, names))
        runs = self.run.read_json("final/train/curves.json")["runs"]
        actors = self._actors("final", trainer, len(runs))
        with self.display.task(f"final/trial: {len(runs)} runs alone for 2 laps", total=None):
            results = assess(trainer, actors, e.ref_lap, stage_key(self.config, "final/trial"), tt_env=e.race_env,
                             tt_params=e.trial_params, tt_steps=e.trial_steps)
        self.run.write_json("final/trial.json", {
            "runs": runs, "reference_lap": e.ref_lap,
            "trials": [{"best_lap": a.lap, "lap_gap_percent": a.lap_gap, "course_outs": a.lap_outs} for a in results]})

    def _component_stats(self, bank, ev, runs, names) -> list[dict]:
        """Per run: each component of its own reward over its races (min, mean, max, share, samples)."""
        from jaxrace.rewards.api import Action

        views = ev.states.view  # [R, races, T + 1]
        prev = jax.tree.map(lambda x: x[:, :, :-1], views)
        curr = jax.tree.map(lambda x: x[:, :, 1:], views)
        action = Action(steering=ev.actions[..., 0], throttle_brake=ev.actions[..., 1])
        batched = jit(jax.vmap(jax.vmap(jax.vmap(lambda p, a, q: bank.evaluate_all(p, a, q)))))
        totals, components = (np.asarray(x) for x in batched(prev, action, curr))  # [R, races, T, N(, C)]
        out = []
        for r, run in enumerate(runs):
            i = names.index(run["candidate"])
            own = components[r, :, :, i, :]
            entry = {"candidate": run["candidate"], "seed": run["seed"],
                     "total_per_step": float(np.mean(totals[r, :, :, i])), "components": {}}
            scale = np.sum(np.abs(own[..., :len(bank.component_names[i])]).mean(axis=(0, 1))) or 1.0
            for j, comp in enumerate(bank.component_names[i]):
                values = own[..., j].ravel()
                entry["components"][comp] = {  # + 0.0: no "-0" in the report
                    "min": float(values.min()) + 0.0, "mean": float(values.mean()) + 0.0,
                    "max": float(values.max()) + 0.0,
                    "share": float(np.abs(values).mean() / scale), "constant": bool(values.max() == values.min()),
                    "samples": values[np.linspace(0, values.size - 1, 10).astype(int)].round(4).tolist()}
            out.append(entry)
        return out

    def _store_clips(self, d: str, k: int, names, seeds, runs, states, actions, *, same_race: bool) -> dict:
        """Cuts clips_per_race clips of every race, saves their arrays, stores them; {(run, race, slot): id}.

        `states`/`actions` have leading axes [len(names), races] (or [len(names)] for one race each
        when not `same_race`); `runs` are the labels the ids are keyed by.
        """
        from jaxrace.judges import clip_facts
        from jaxrace.rewards.clips import cut_clip, finish_window_end, interesting_starts, race_events
        from jaxrace.rewards.preferences import save_clip_arrays

        c, e = self.config, self.envs
        if not same_race:
            states = jax.tree.map(lambda x: x[:, None], states)
            actions = actions[:, None]
        views = states.view  # [R, races, T + 1]
        races = views.progress.shape[1]
        length = e.clip_steps
        slots = c.clips_per_race
        # per race, the same starts for every run in it: the grid start, the first finish of its runs (with
        # clip_finish), then the busiest moments of all runs
        events = race_events(views).sum(axis=0)  # [races, steps]
        after = round(c.clip_finish_after_s / e.race_env.static.dt) if c.clip_finish else 0
        finished = np.asarray(views.finished, bool)
        starts = [interesting_starts(events[i], length, slots,
                                     finish_window_end(finished[:, i], after) if c.clip_finish else None)
                  for i in range(races)]
        done = views.finished[..., 1:] & ~views.finished[..., :-1]
        from jaxrace.rewards.api import Action

        act = Action(steering=actions[..., 0], throttle_brake=actions[..., 1])
        cut = jit(jax.vmap(jax.vmap(jax.vmap(cut_clip, in_axes=(None, None, None, 0, None)),
                                        in_axes=(0, 0, 0, 0, None)), in_axes=(0, 0, 0, None, None)),
                      static_argnums=4)
        clips = cut(views, act, done, jnp.asarray(starts), length)  # [R, races, slots, ...]
        flat = jax.tree.map(lambda x: np.asarray(x).reshape(-1, *x.shape[3:]), clips)
        path = save_clip_arrays(self.run.file(f"{d}/clips.npz"), flat)
        ids = {}
        judged_from_video = self.config.judge in ("vlm", "human")
        videos = self._clip_videos(d, names, seeds, states, starts) if same_race or judged_from_video else {}
        row = 0
        for r, (name, seed, run) in enumerate(zip(names, seeds, runs, strict=True)):
            for i in range(races):
                for j in range(slots):
                    one = jax.tree.map(lambda x, row=row: x[row], flat)
                    key = f"{d}/{name}/seed{seed}/race{i}/slot{j}"
                    ids[(run, i, j)] = self.store.add_clip(
                        key, iteration=k, candidate=name, seed=seed, race=i, start=starts[i][j], length=length,
                        metrics=dataclasses.asdict(clip_facts(one)), arrays=path, arrays_row=row,
                        video=videos.get((r, i, j)))
                    row += 1
        return ids

    def _clip_videos(self, d, names, seeds, states, starts) -> dict:
        """Renders videos_per_candidate clips of each candidate's seed-0 run (of every run in final/clips: each
        finalist's agent, whichever its seed): {(run, race, slot): path}."""
        c = self.config
        wanted = []
        for r, (name, seed) in enumerate(zip(names, seeds, strict=True)):
            slots = [(i, j) for i in range(states.view.progress.shape[1]) for j in range(len(starts[0]))]
            if c.judge in ("vlm", "human"):  # they judge from videos: every clip needs one
                wanted += [(f"{name}-seed{seed}" if seed else name, r, i, j) for i, j in slots]
            elif seed == 0 or d == "final/clips":
                wanted += [(name, r, i, j) for i, j in slots[:c.videos_per_candidate]]

        paths = self._videos(d, wanted, states, starts=starts, seconds=self.envs.clip_seconds)
        return {(r, i, j): p for (_, r, i, j), p in zip(wanted, paths, strict=True)}

    def _videos(self, d, wanted, states, *, starts=((0,),), seconds: float) -> list[str]:
        """Renders (name, run, race, slot) clips from starts[race][slot] to d/videos; returns paths in the run."""
        import os

        from jaxrace.envs.video import render_clip

        e = self.envs
        out = []
        with self.display.task(f"{d}: render {len(wanted)} videos", total=len(wanted)) as advance:
            for name, r, i, j in wanted:
                one = jax.tree.map(lambda x, r=r, i=i: x[r, i], states)
                safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")
                target = self.run.file(f"{d}/videos/{safe}-race{i}-slot{j}.mp4")
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".tmp-{target.name}")
                written = render_clip(e.race_env, e.race_params, one, tmp, start=starts[i][j], seconds=seconds)
                final = target.with_suffix(written.suffix)
                os.replace(written, final)
                out.append(str(final.relative_to(self.run.path)))
                advance(1)
        return out

    def _judge(self, k: int, pairs, d: str) -> list[dict]:
        """Judges (key, first id, second id) pairs not yet in the store; returns every verdict's record."""
        from jaxrace.judges import Pair

        judge = self.judge()
        if judge.kind == "human":  # a person labels the whole batch on the page, in any order
            with self.display.task(f"{d}: a person labels {len(pairs)} pairs", total=None):
                verdicts = judge.judge_many(k, pairs)
            return [{"key": key, "first": first, "second": second, "label": verdicts[key].label,
                     "judge": self.store.preference(key).judge_id, "rationale": verdicts[key].rationale}
                    for key, first, second in pairs]
        if hasattr(judge, "chat"):
            judge.chat.stage = f"{d}/judge"
        records = []
        with self.display.task(f"{d}: judge {len(pairs)} pairs", total=len(pairs)) as advance:
            for key, first, second in pairs:
                pref = self.store.preference(key)
                if pref is None:
                    a, b = self.store.clips([first, second])
                    t0 = time.perf_counter()
                    one_a, one_b = (jax.tree.map(lambda x: x[0], self.store.load_clips([row])) for row in (a, b))
                    verdict = judge.judge(Pair(key=key, first=one_a, second=one_b, first_video=a.video,
                                               second_video=b.video))
                    pref = self.store.add_preference(
                        key, iteration=k, first=first, second=second, label=verdict.label, judge_kind=judge.kind,
                        judge_id=judge.id, rationale=verdict.rationale, confidence=verdict.confidence,
                        seconds=time.perf_counter() - t0)
                records.append({"key": key, "first": first, "second": second, "label": pref.label,
                                "judge": pref.judge_id, "rationale": pref.rationale})
                advance(1)
        return records

    def judge_pairs(self, k: int) -> None:
        """Pairs of candidates on the same race, clip slot and seed (left/right order drawn): all of them, or
        `judge_budget` chosen actively (`jaxrace.judges.pairs`) in rounds, refitting the clip model between rounds."""
        c = self.config
        d = f"iter{k}"
        runs = self.run.read_json(f"{d}/train/curves.json")["runs"]
        rng = np.random.default_rng([c.seed, k, 0x9A1D])
        pairs = self._same_race_pairs(d, runs, [ri for ri, r in enumerate(runs) if not r["failed"]], c.eval_races,
                                      rng)
        if c.judge_selection == "active" and 0 < c.judge_budget < len(pairs):
            records = self._judge_active(k, pairs, d, runs, rng)
        else:
            records = self._judge(k, pairs, d)
        self.run.write_json(f"{d}/judge.json", records)
        stats = getattr(self.judge(), "stats", None)
        if stats is not None:  # the VLM judge's skips, order disagreements and position bias so far
            self.run.write_json(f"{d}/judge_stats.json", dataclasses.asdict(stats) | {
                "position_bias": stats.position_bias})

    def _same_race_pairs(self, d: str, runs: list[dict], ok: list[int], races: int, rng, *,
                         by_seed: bool = True) -> list[tuple]:
        """(key, first clip id, second clip id) for every two of the `ok` runs of one seed (or of any seeds:
        not `by_seed`) on the same race and clip slot, in an order drawn from `rng`; the clip ids from
        d/race/clips.json."""
        ids = self.run.read_json(f"{d}/race/clips.json")
        pairs = []
        seeds = sorted({runs[ri]["seed"] for ri in ok})
        groups = ([(f"seed{s}", [ri for ri in ok if runs[ri]["seed"] == s]) for s in seeds] if by_seed or len(seeds) < 2
                  else [("draws", ok)])
        for seed, mine in groups:
            for i in range(races):
                for j in range(self.config.clips_per_race):
                    for a, b in itertools.combinations(mine, 2):
                        if rng.uniform() < 0.5:
                            a, b = b, a
                        key = f"{d}/{seed}/race{i}/slot{j}/{runs[a]['candidate']}~{runs[b]['candidate']}"
                        pairs.append((key, ids[f"{a}/{i}/{j}"], ids[f"{b}/{i}/{j}"]))
        return pairs

    def judge_final(self) -> None:
        """The judge compares the loop's finalists' agents (each one's picked draw) on every final race and clip
        slot; Bradley-Terry over those verdicts picks the loop's agent (final/pick.json). A finalist whose every
        run failed is last."""
        from jaxrace.rewards.bradley_terry import fit_labels

        c = self.config
        k = self.last_iteration + 1
        runs = self.run.read_json("final/train/curves.json")["runs"]
        names = [n for n, _ in self._finalists()]
        agents = self._final_agents()
        ok = [agents[n] for n in names if not runs[agents[n]]["failed"]]
        rng = np.random.default_rng([c.seed, k, 0x9A1D])
        pairs = self._same_race_pairs("final", runs, ok, c.final_races, rng, by_seed=False)
        if c.judge_selection == "active" and 0 < c.judge_budget < len(pairs):
            records = self._judge_active(k, pairs, "final", runs, rng)
        else:
            records = self._judge(k, pairs, "final")
        self.run.write_json("final/judge.json", records)
        scores = stderr = np.zeros(len(names))
        if records:  # none when fewer than two finalists trained
            owner = {row.id: row.candidate for row in self.store.clips([x for r in records
                                                                         for x in (r["first"], r["second"])])}
            scores, stderr = (np.asarray(x, np.float64) for x in fit_labels(
                [names.index(owner[r["first"]]) for r in records], [names.index(owner[r["second"]]) for r in records],
                [r["label"] for r in records], len(names)))
        failed = {n: all(r["failed"] for r in runs if r["candidate"] == n) for n in names}
        order = sorted(range(len(names)), key=lambda i: (failed[names[i]], -scores[i]))
        pick = names[order[0]]
        self.run.write_json("final/pick.json", {
            "finalists": names, "scores": scores, "stderr": stderr, "failed": failed,
            "order": [names[i] for i in order], "pick": pick, "games": sum(r["label"] != "skip" for r in records),
            "pairs": len(records), "races": c.final_races})
        games = sum(r["label"] != "skip" for r in records)
        self.run.log(f"final/judge: the judge picked {pick} from the finalists "
                     + ", ".join(f"{names[i]} ({scores[i]:+.2f})" for i in order) + f" in {games} games"
                     + ("; with no verdict the pick is the search's best" if not games else ""))

    def _judge_active(self, k: int, pairs, d: str, runs, rng) -> list[dict]:
        """`judge_budget` of `pairs` in rounds of a fifth, each chosen by the clip model's expected information
        (`jaxrace.judges.pairs.choose_informative`) given the labels so far; the prior alone picks the first."""
        from jaxrace.judges.pairs import choose_informative

        c = self.config
        clip_ids = sorted({x for _, a, b in pairs for x in (a, b)})
        index = {clip: i for i, clip in enumerate(clip_ids)}
        owner_of = {row.id: row.candidate for row in self.store.clips(clip_ids)}
        names = sorted(set(owner_of.values()))
        owner = np.array([names.index(owner_of[clip]) for clip in clip_ids], np.int64)
        items = np.array([(index[a], index[b]) for _, a, b in pairs], np.int64)
        step = max(1, c.judge_budget // 5)
        chosen, records = [], []
        while len(chosen) < c.judge_budget:
            left = np.setdiff1d(np.arange(len(pairs)), chosen)
            picked = left[choose_informative(items[left], owner, items[chosen], [r["label"] for r in records],
                                             min(step, c.judge_budget - len(chosen)), rng)]
            if not len(picked):  # every pair judged: a budget above the pool
                break
            chosen += [int(i) for i in picked]
            records += self._judge(k, [pairs[i] for i in picked], d)
        self.run.log(f"{d}/judge: {len(chosen)} of {len(pairs)} pairs chosen actively")
        return records

    def rank(self, k: int) -> None:
        """Bradley-Terry over this iteration's verdicts; failed candidates rank last; the feedback."""
        from jaxrace.rewards.bradley_terry import fit_labels

        d = f"iter{k}"
        names = self.run.read_json(f"{d}/select.json")["selected"]
        runs = self.run.read_json(f"{d}/train/curves.json")["runs"]
        failed = {n: all(r["failed"] for r in runs if r["candidate"] == n) for n in names}
        clip_owner = {row.id: row.candidate for row in self.store.clips()}
        prefs = self.store.preferences(k)
        scores, stderr = (np.asarray(x, np.float64) for x in fit_labels(
            [names.index(clip_owner[p.first]) for p in prefs], [names.index(clip_owner[p.second]) for p in prefs],
            [p.label for p in prefs], len(names)))
        order = sorted(range(len(names)), key=lambda i: (failed[names[i]], -scores[i]))
        trained = [names[i] for i in order if not failed[names[i]]]
        if trained:
            best, best_folder = trained[0], f"{d}/candidates"
        else:  # nothing to rank: the previous best stays the best, and the feedback says every candidate failed
            previous = self._best(k - 1) if k > 1 else None
            best, best_folder = previous if previous is not None else (None, None)
            self.run.log(f"{d}/rank: every candidate failed in training (see {d}/train/curves.json); the best stays "
                         f"{best or 'none'}")
            self.display.line(f"{d}/rank: every candidate failed in training; the best stays {best or 'none'}")
        metrics = self.run.read_json(f"{d}/race/metrics.json")
        summary = {n: race_summary([m for r, m in zip(runs, metrics["races"], strict=True) if r["candidate"] == n])
                   for n in names}
        self.run.write_json(f"{d}/rank.json", {
            "names": names, "scores": scores, "stderr": stderr, "failed": failed, "order": [names[i] for i in order],
            "best": best, "best_folder": best_folder, "parents": trained[:2],
            "games": sum(p.label != "skip" for p in prefs), "races": summary})
        text = self._feedback(k, [names[i] for i in order], scores, stderr, failed, summary)
        self.run.write_text(f"{d}/feedback.txt", text)
        self.store.add_feedback(k, "loop", text)

    def _feedback(self, k: int, order: list[str], scores, stderr, failed: dict, summary: dict) -> str:
        """The next generation prompt's feedback (`jaxrace.llm.prompts.feedback_text`) from this iteration's data."""
        from jaxrace.llm.prompts import CandidateSummary, IterationSummary, feedback_text

        d = f"iter{k}"
        names = self.run.read_json(f"{d}/select.json")["selected"]
        tac = self.run.read_json(f"{d}/select.json")["tac"] or {}
        components = {e["candidate"]: e["components"] for e in self.run.read_json(f"{d}/race/components.json")
                      if e["seed"] == 0}
        owner = {row.id: row.candidate for row in self.store.clips()}
        rationales: dict[str, list[str]] = {n: [] for n in names}
        for p in self.store.preferences(k):
            if p.rationale and p.label in ("first", "second"):
                loser = owner[p.second if p.label == "first" else p.first]
                if len(rationales[loser]) < 2 and p.rationale not in rationales[loser]:
                    rationales[loser].append(p.rationale)
        first = 0 if k == 1 else k  # what a person wrote while labelling the bootstrap goes to iteration 1
        person = "\n".join(text for i, author, text in self.store.feedback() if author != "loop" and first <= i <= k)
        curves = self.run.read_json(f"{d}/train/curves.json")
        training = {}
        for r, run in enumerate(curves["runs"]):
            if run["seed"] == 0:
                picks = np.linspace(0, curves["epochs"] - 1, 8).round().astype(int)
                training[run["candidate"]] = {key: [float(curves[key][r][i]) for i in picks]
                                              for key in ("reward", "progress")}
        cands = tuple(CandidateSummary(
            name=n, source=self.run.file(f"{d}/candidates/{n}.py").read_text(encoding="utf-8"),
            strength=float(scores[names.index(n)]), stderr=float(stderr[names.index(n)]), tac=tac.get(n),
            failed=failed[n], races=summary[n], components=components.get(n, {}),
            rationales=tuple(rationales[n]), training=training.get(n, {})) for n in order)
        reference_lap = self.run.read_json(f"{d}/race/metrics.json")["reference_lap"]
        return feedback_text(IterationSummary(k, cands, reference_lap=reference_lap, person=person),
                             max_chars=self.config.llm_max_prompt_chars // 2)


def loop_agent(run_dir: str | Path) -> str | None:
    """The candidate of a run directory's final job that is the loop's agent: the judge's pick among the
    finalists (final/pick.json), or the one loop candidate the final job trained; None if it trained none,
    or while the judge has not yet picked among several."""
    import json

    from jaxrace.rewards.library import LIBRARY

    run_dir = Path(run_dir)
    if (run_dir / "final/pick.json").exists():
        return json.loads((run_dir / "final/pick.json").read_text())["pick"]
    runs = json.loads((run_dir / "final/train/curves.json").read_text())["runs"]
    loop = list(dict.fromkeys(r["candidate"] for r in runs if r["candidate"] not in LIBRARY))
    return loop[0] if len(loop) == 1 else None


def final_agents(run_dir: str | Path) -> dict[str, int]:
    """{candidate: the run of a run directory's final job that is its agent}: `picked_draws` over its
    runs (final/train/curves.json) by their kept checkpoints' selection scores (kept.json)."""
    import json

    train = Path(run_dir) / "final/train"
    runs = json.loads((train / "curves.json").read_text())["runs"]
    kept = json.loads((train / "kept.json").read_text()) if (train / "kept.json").exists() else None
    return picked_draws(runs, None if kept is None else [float(x) for x in kept["task_score"]])


def picked_draws(runs: list[dict], task_scores: list[float] | None) -> dict[str, int]:
    """{candidate: the index of its run that is its agent}, candidates in the order of `runs`: of its draws
    that did not fail (all of them if every one failed), the one whose kept checkpoint scored best on the
    selection races (`task_scores`, per run; higher is better), the lower index on a tie or without scores."""
    out = {}
    for name in dict.fromkeys(r["candidate"] for r in runs):
        mine = [i for i, r in enumerate(runs) if r["candidate"] == name]
        ok = [i for i in mine if not runs[i]["failed"]] or mine
        out[name] = min(ok, key=lambda i: (-task_scores[i] if task_scores else 0.0, i))
    return out


def parent_runs(trained: list[dict], name: str, runs: int, seeds: int) -> list[int]:
    """For each of a new job's `runs` (candidate-major, `seeds` per candidate), the index into an
    earlier job's runs (`curves.json`'s "runs") of `name`'s run to start from: the one with the
    same seed, or `name`'s first run that did not fail where that one failed."""
    own = [r for r, run in enumerate(trained) if run["candidate"] == name and not run["failed"]]
    if not own:
        raise ValueError(f"{name} has no run that trained to start from")
    by_seed = {trained[r]["seed"]: r for r in own}
    return [by_seed.get(r % seeds, own[0]) for r in range(runs)]


def centre_line(params, points: int = 500) -> dict:
    """{"xy": [[x, y], ...] m, at most `points` of the centre line; "width": its mean width, m}.

    Of the first track when `params` holds stacked tracks (the loop races on one).
    """
    def first(a, trailing: int):  # a stacked Track has a leading track axis
        a = np.asarray(a)
        return a.reshape((-1,) + a.shape[a.ndim - trailing:])[0]

    tracks = params.tracks
    xy = first(tracks.xy, 2)
    width = first(tracks.width_left, 1) + first(tracks.width_right, 1)
    step = max(1, -(-len(xy) // points))
    return {"xy": np.round(xy[::step], 1).tolist(), "width": round(float(np.mean(width)), 2)}


def race_summary(races_per_run: list[list[dict]]) -> dict:
    """Medians and means over every race of a candidate's runs."""
    races = [r for per_run in races_per_run for r in per_run]
    if not races:
        return {}
    laps = [r["best_lap"] for r in races if r["best_lap"] is not None]
    return {
        "races": len(races),
        "median_position": float(np.median([r["finishing_position"] for r in races])),
        "mean_positions_gained": float(np.mean([r["positions_gained"] for r in races])),
        "at_fault_contacts_per_race": float(np.mean([r["collisions_at_fault"] for r in races])),
        "side_contacts_per_race": float(np.mean([r["side_contacts"] for r in races])),
        "course_outs_per_race": float(np.mean([r["course_outs"] for r in races])),
        "wall_hits_per_race": float(np.mean([r["wall_hits"] for r in races])),
        "finished": float(np.mean([r["finished"] for r in races])),
        "best_lap": min(laps) if laps else None,
    }


def run_design(config: DesignConfig, run_dir: str | Path, *, quiet: bool = False) -> Path:
    """Runs (or resumes) the loop in `run_dir`; returns the report's path.

    Raises `ConfigMismatch` when `run_dir` holds a run of another config.
    """
    from jaxrace.agents.distributed import broadcast_json, is_primary
    from jaxrace.design.compilation import enable_compile_cache

    enable_compile_cache()
    if not is_primary():
        return serve_training(config, run_dir)
    try:
        run = RunDir.open(run_dir, config)
        # (the device count is not the config's: a run resumes on any, but trains other numbers on another)
        run.log(f"JAX {jax.__version__} on {jax.default_backend()}: {jax.device_count()} device(s), "
                f"{jax.process_count()} process(es)")
        with Display(quiet=quiet) as display:
            loop = Loop(config, run, display)
            try:
                return loop.run_all()
            finally:
                if loop._human is not None:
                    loop._human.close()
                if loop._store is not None:
                    loop._store.close()
    finally:
        broadcast_json(None)  # the other processes' cue that the run is over (or failed)


def serve_training(config: DesignConfig, run_dir: str | Path) -> Path:
    """The loop in processes other than 0: joins each training job process 0 announces, until it
    announces the end. Everything else (LLM, judging, files) is process 0's. Returns the report's path."""
    from jaxrace.agents.distributed import broadcast_json

    loop, failed = None, None
    while (message := broadcast_json()) is not None:
        if failed is not None or message["alone"]:
            continue  # after a failure, only listen on: process 0 ends the run (its error says why)
        try:
            if loop is None:  # process 0 has made the run directory by now
                loop = Loop(config, RunDir(run_dir), Display(quiet=True))
            loop.last_iteration = message["last_iteration"]
            loop.train_job(message["train"])
        except Exception as err:  # noqa: BLE001 (any failure: process 0 fails the same job and stops)
            failed = err
    if failed is not None:
        raise failed
    return Path(run_dir) / "report.html"
