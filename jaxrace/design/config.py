"""The reward-design loop's configuration: one frozen dataclass, presets, TOML files (host-side)."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

# the library rewards a final job trains beside the loop's agent by default
LIBRARY_BASELINES = ("progress", "gt_sophy")
DEFAULT_TASK = "win the race cleanly from the back of the grid"
LLMS = ("offline", "openai", "replay")
JUDGES = ("scripted", "vlm", "human")
ACTOR_INPUTS = ("state", "pixels")
# Where the human judge's page listens and how long it waits: a resumed run may change them.
OPERATIONAL = ("judge_host", "judge_port", "judge_timeout_s")
# Fields that a run directory may predate, and the value such a run ran with. It resumes with that value,
# not the command's (its networks' input sizes, its final job's checkpoints or its stored clips depend on
# it), so a command with another value is refused with the field named (and, where the default has
# changed since, how to resume).
PREDATED_VALUES = {"lane_headway": False, "offtrack_start_prob": 0.0, "keep_best_average": 1,
                   "clip_finish": False, "judge_standing": False,
                   "judge_standing_at": "end", "clip_whole_race": False, "final_candidates": 1, "final_seeds": 1,
                   "final_baselines": LIBRARY_BASELINES, "bootstrap_careless": 0.0}


@dataclasses.dataclass(frozen=True)
class DesignConfig:
    """Everything that decides what a reward-design run computes (the run directory keeps it).

    Iteration: generate `m` programs -> keep `n` by TAC -> train each with `seeds` seeds for
    `epochs` -> `eval_races` races -> clips -> judge -> Bradley-Terry. After `iterations`,
    the winner and the library rewards train `final_epochs` and race `final_races` times.
    """

    task: str = DEFAULT_TASK
    preset: str = "quick"
    llm: str = "offline"
    judge: str = "scripted"
    # the LLM (jaxrace.llm): endpoint for "openai" (no key: it comes from the environment only),
    # the record to replay from for "replay" (a run directory or record file; "" = this run's own)
    base_url: str = ""
    model: str = ""
    replay_from: str = ""
    llm_repairs: int = 2
    llm_concurrency: int = 4
    llm_temperature: float = 0.8
    llm_max_tokens: int = 2048
    llm_token_budget: int = 0  # tokens for the whole run; 0: no limit
    llm_call_budget: int = 0  # requests for the whole run; 0: no limit
    llm_max_prompt_chars: int = 24_000
    # a library reward to start from (Eureka's start from a human reward): iteration 1 races it beside
    # the M - 1 new candidates, carried like a previous best, and its prompt offers it as the program to
    # improve on, written in the offline proposer's terms (`jaxrace.rewards.proposer.library_proposal`).
    # "": start from nothing
    start_reward: str = ""
    iterations: int = 2
    m: int = 4
    n: int = 3
    seeds: int = 1
    seed: int = 0
    track: str = "oval"
    opponents: int = 3
    # metres between the cars where training envs with opponents start (a pack at a random place);
    # 0 spreads them round the lap, where on a long circuit the agent seldom meets them (issue 16)
    traffic_start_gap: float = 25.0
    # training scenarios (issue 16's reference recipe, experiments/train_reference.py): this share of
    # episodes starts standing on the grid, as the races do; each env's AI cars get their own
    # aggression; an episode ends when the car is train_course_out_margin m beyond the edge (the races
    # count a course-out at 1 m), so the policy keeps a margin instead of riding the limit; 0.3 m left
    # the track less than 0.6 m on all six of issue 16's seeds (docs/reference_agent.md,
    # "A stricter training edge: 0.3 m")
    grid_start_prob: float = 0.3
    # share of the other packed traffic starts that begin in grid formation at speed just before a braking
    # zone, as a race's first corners do (where the headline's at-fault contacts happen)
    corner_start_prob: float = 0.0
    # share of random starts with the ego car off the course (on the run-off), so the agent learns to
    # rejoin the track: most last places in issue 16's races were cars lost after a course-out. With the
    # lane headway below it raced further forward with fewer course-outs on three same-CPU pairs of three,
    # and two of six seeds met all four of issue 16's targets (docs/reference_agent.md,
    # *Starts off the track with headway*)
    offtrack_start_prob: float = 0.25
    varied_ai: bool = True
    terminate_on_course_out: bool = True
    train_course_out_margin: float = 0.3
    ai_skill: float = 0.9
    race_laps: int = 1
    # training (QR-SAC; see jaxrace.agents.TrainConfig)
    actor_input: str = "state"
    # the privileged observation (a state actor's input, every critic's) also shows each nearby car's
    # longitudinal acceleration (its brake lights)
    opponent_accel: bool = False
    # ... and the time headway and closing rate to the car ahead in our lane, where most at-fault contacts
    # begin: fewer of them on all five of issue 16's same-CPU pairs
    # (docs/reference_agent.md, *The time headway and closing
    # rate to the car ahead in our lane*)
    lane_headway: bool = True
    recurrent: bool = False
    hidden: int = 64
    num_envs: int = 16
    rollout_steps: int = 8
    updates_per_epoch: int = 8
    batch_size: int = 128
    replay_size: int = 50_000
    warmup_epochs: int = 10
    epochs: int = 150
    chunk_epochs: int = 50
    final_epochs: int = 300
    # the final job trains the last iteration's best this many candidates (in Bradley-Terry's order)
    # beside the library rewards, and with more than one the judge compares their final races and picks
    # the loop's agent: the search's short budget ranks rewards by what a car learns in it, the final
    # budget by what it learns in the long run (successive halving's last rung)
    final_candidates: int = 1
    # ... and trains each reward of the final job (its finalists and the library rewards alike) this many
    # times, on keys of their own; each reward's agent is its draw with the best selection races (the
    # final job's keep-best races, not the final races): one training draw moves a car as far as rewards
    # differ, so one draw per reward compares keys as much as rewards. With pretraining, a draw starts from
    # the pretrained agent of its seed (of seed 0 beyond `seeds`): the draws differ in their keys
    final_seeds: int = 1
    # the library rewards the final job trains beside the loop's finalists, on the same budget
    final_baselines: tuple[str, ...] = LIBRARY_BASELINES
    # iterations after the first train their candidates on from the best candidate's agents so far
    # (networks and temperature; each seed from that seed's), not from scratch, so that a search budget
    # too short to learn to race still shows the judge racing; the final job starts from scratch
    warm_start: bool = False
    # before iteration 1, `pretrain_reward` (a library reward) trains one run per seed for this many
    # epochs; every run of the iterations (the first's, and the others' unless warm_start gives them a
    # parent) and of the final job starts from that seed's pretrained agent, so the search compares
    # rewards that fine-tune a car that already drives. 0: every run starts from scratch
    pretrain_epochs: int = 0
    pretrain_reward: str = "progress"
    # a run started from another agent (warm_start or pretrain_epochs) holds its actor and temperature
    # for this many epochs after the warm-up while its critic learns the new reward (HParams.actor_hold_epochs)
    start_hold_epochs: int = 0
    # ... in the final job too (off: only the iterations' runs hold): a 4000-epoch final run has time to
    # learn its reward's critic, and held for 200 epochs gt_sophy's final agent lost all three targets it
    # met unheld from the same start (docs/headline_experiment.md, *Whole races with the actor held*)
    start_hold_final: bool = True
    # an iteration after the first races the best candidate carried over with the agent it trained
    # (its iteration's, saved), instead of training it again on a new key, and trains N others
    # beside it: retraining one reward varies the car as much as rewards differ. Off with several
    # processes (every carried best then trains again)
    reuse_carried_agent: bool = False
    reward_scale: float = 0.1
    n_step: int = 5
    # policy averaging (TrainConfig.actor_average): races, selection and the saved agents use a moving
    # average of the actor, moved this share of the way after each update; 0: the actor itself
    actor_average: float = 0.0
    # a risk-averse actor (TrainConfig.actor_cvar): it maximises the mean of this lowest share of the
    # critic's return quantiles; 1: their mean (risk-neutral)
    actor_cvar: float = 1.0
    # evaluation, clips and judging
    eval_races: int = 2
    final_races: int = 3
    # the final job keeps each run's best checkpoint: every keep_best_every chunks (0: never, the last
    # one is raced) its policies race select_races times on fields of their own, scored by the task
    keep_best_every: int = 1
    select_races: int = 4
    # ...and judges and keeps the mean of the parameters of the last keep_best_average policies it
    # judged (weight averaging over checkpoints; 1: each policy itself)
    keep_best_average: int = 1
    clip_seconds: float = 10.0
    clips_per_race: int = 2
    # the second clip of every race ends clip_finish_after_s past the first finish of its runs (or at the
    # race's end): the judge sees who finished where, not only the start and the busiest moments
    clip_finish: bool = True
    clip_finish_after_s: float = 2.0
    # each race is one clip from the start to the race's end (clips_per_race 1; clip_seconds and clip_finish
    # then do not apply): the judge compares whole races, so a clean start cannot outweigh the finish, and
    # contacts and course-outs anywhere in the race count (the final job's selection races score so too)
    clip_whole_race: bool = False
    videos_per_candidate: int = 1
    judge_beta: float = float("inf")
    judge_mistake: float = 0.0
    judge_equal_within: float = 0.05
    # the scripted judge also scores where the car stands on the grid at a clip's end, for a task about
    # places (TaskScoring.standing), as a person reads the video's P
    judge_standing: bool = True
    # ... at the clip's start ("start": a place gained in the clip counts once, as a place gained) or at
    # its end ("end", as a run before this field did: a place gained counts twice, so under "cleanly" a
    # pass that costs an at-fault contact scored as much as staying behind)
    judge_standing_at: str = "start"
    # the VLM judge: its endpoint and model (default: the LLM's), frames per clip
    judge_base_url: str = ""
    judge_model: str = ""
    judge_frames: int = 4
    # the human judge's page: where it listens (port 0: a free one; any host but loopback needs a token)
    # and how long the loop waits for labels before the pairs left become skips
    judge_host: str = "127.0.0.1"
    judge_port: int = 0
    judge_timeout_s: float = 3600.0
    # which pairs are judged per iteration: all, or judge_budget of them chosen actively (0: all)
    judge_selection: str = "all"
    judge_budget: int = 0
    # tuning the best program's weights from the stored preferences after each iteration ("": off;
    # grad, mh or soft-tac): the tuned program is carried into the next iteration beside the best
    tune_weights: str = ""
    # TAC
    tac_min_preferences: int = 20
    bootstrap_races: int = 8
    # the share of bootstrap races whose AI ego drives blind to the other cars (so runs into them):
    # preferences that price an at-fault contact against the places it gains
    bootstrap_careless: float = 0.5

    def __post_init__(self):
        problems = []
        positive = ("iterations", "m", "n", "seeds", "race_laps", "hidden", "num_envs", "rollout_steps", "n_step",
                    "llm_concurrency", "llm_max_tokens", "llm_max_prompt_chars",
                    "updates_per_epoch", "batch_size", "replay_size", "epochs", "chunk_epochs", "final_epochs",
                    "eval_races", "final_races", "clips_per_race", "judge_frames", "select_races",
                    "keep_best_average", "final_candidates", "final_seeds")
        problems += [f"{k} must be at least 1 (got {getattr(self, k)})" for k in positive if getattr(self, k) < 1]
        nonneg = ("warmup_epochs", "opponents", "videos_per_candidate", "tac_min_preferences", "bootstrap_races",
                  "judge_equal_within", "llm_repairs", "llm_token_budget", "llm_call_budget", "judge_budget",
                  "judge_port", "judge_timeout_s", "traffic_start_gap", "keep_best_every", "clip_finish_after_s",
                  "pretrain_epochs", "start_hold_epochs")
        problems += [f"{k} must be at least 0 (got {getattr(self, k)})" for k in nonneg if getattr(self, k) < 0]
        if not 0.0 <= self.bootstrap_careless <= 1.0:
            problems.append(f"bootstrap_careless is a share of the bootstrap races, in [0, 1] "
                            f"(got {self.bootstrap_careless})")
        if self.n > self.m:
            problems.append(f"n (trained per iteration, {self.n}) cannot exceed m (generated, {self.m})")
        if self.final_candidates > self.n:
            problems.append(f"final_candidates ({self.final_candidates}) cannot exceed n (trained per iteration, "
                            f"{self.n}): they are the last iteration's best")
        if self.final_seeds > 1 and not 0 < self.keep_best_every <= self.final_epochs // self.chunk_epochs:
            problems.append(f"final_seeds ({self.final_seeds}) picks each reward's draw by the final job's "
                            f"selection races: keep_best_every ({self.keep_best_every}) must be at least 1 and "
                            f"at most the final job's chunks ({self.final_epochs // self.chunk_epochs})")
        for name, value, choices in (("llm", self.llm, LLMS), ("judge", self.judge, JUDGES),
                                     ("actor_input", self.actor_input, ACTOR_INPUTS)):
            if value not in choices:
                problems.append(f"{name} must be one of {', '.join(choices)} (got {value!r})")
        if self.tune_weights not in ("", "grad", "mh", "soft-tac"):
            problems.append(f"tune_weights must be empty (off), grad, mh or soft-tac (got {self.tune_weights!r})")
        if self.judge_standing_at not in ("start", "end"):
            problems.append(f"judge_standing_at must be start or end (got {self.judge_standing_at!r})")
        if self.judge_selection not in ("all", "active"):
            problems.append(f"judge_selection must be all or active (got {self.judge_selection!r})")
        from jaxrace.rewards.library import LIBRARY

        if self.start_reward:
            from jaxrace.rewards.proposer import LIBRARY_FORMS

            if self.start_reward not in LIBRARY_FORMS:
                problems.append(f"start_reward must be '' or a library reward, one of "
                                f"{', '.join(sorted(LIBRARY_FORMS))} (got {self.start_reward!r})")
        object.__setattr__(self, "final_baselines", tuple(self.final_baselines))  # (a list from TOML or JSON)
        unknown = [b for b in self.final_baselines if b not in LIBRARY]
        if unknown or len(set(self.final_baselines)) < len(self.final_baselines):
            problems.append(f"final_baselines must name distinct library rewards, of {', '.join(sorted(LIBRARY))} "
                            f"(got {list(self.final_baselines)})")
        if self.pretrain_reward not in LIBRARY:
            problems.append(f"pretrain_reward must be a library reward, one of {', '.join(sorted(LIBRARY))} "
                            f"(got {self.pretrain_reward!r})")
        for name in ("epochs", "final_epochs", "pretrain_epochs"):
            if getattr(self, name) % self.chunk_epochs:
                problems.append(f"chunk_epochs ({self.chunk_epochs}) must divide {name} ({getattr(self, name)})")
        if not 0.0 <= self.actor_average < 1.0:
            problems.append(f"actor_average must be in [0, 1) (0: no averaging; got {self.actor_average})")
        if not 0.0 < self.actor_cvar <= 1.0:
            problems.append(f"actor_cvar must be in (0, 1] (1: risk-neutral; got {self.actor_cvar})")
        for name in ("grid_start_prob", "corner_start_prob", "offtrack_start_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name} must be in [0, 1] (got {getattr(self, name)})")
        if self.corner_start_prob > 0 and not self.traffic_start_gap > 0:
            problems.append("corner_start_prob needs traffic_start_gap > 0: only packed traffic starts begin "
                            "at a corner")
        if self.opponents > 19:
            problems.append(f"opponents must be at most 19 (got {self.opponents})")
        if not 0.0 < self.ai_skill <= 1.2:
            problems.append(f"ai_skill must be in (0, 1.2] (got {self.ai_skill})")
        if not 0.0 <= self.judge_mistake <= 1.0 or not self.judge_beta > 0:
            problems.append(f"judge_mistake must be in [0, 1] and judge_beta > 0 (got {self.judge_mistake}, "
                            f"{self.judge_beta})")
        if self.judge_port > 65535:
            problems.append(f"judge_port must be at most 65535 (got {self.judge_port})")
        if self.clip_seconds <= 0:
            problems.append(f"clip_seconds must be positive (got {self.clip_seconds})")
        if self.clip_whole_race and self.clips_per_race != 1:
            problems.append(f"clip_whole_race makes each race one clip: clips_per_race must be 1 (got "
                            f"{self.clips_per_race})")
        if self.llm == "openai" and not self.model:
            problems.append("llm 'openai' needs a model (--model, or JAXRACE_LLM_MODEL / OPENAI_MODEL)")
        if self.judge == "vlm" and self.llm != "replay" and not (self.judge_model or self.model):
            problems.append("judge 'vlm' needs a model that takes images (--judge-model, or --model for both)")
        if not 0.0 <= self.llm_temperature <= 2.0:
            problems.append(f"llm_temperature must be in [0, 2] (got {self.llm_temperature})")
        if not self.task.strip():
            problems.append("task must say something")
        if problems:
            raise ValueError("invalid design config: " + "; ".join(problems))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def changes(self, other: DesignConfig, ignore=()) -> list[str]:
        """'field: ours -> theirs' for every field that differs (but those in `ignore`)."""
        a, b = self.to_dict(), other.to_dict()
        return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k] and k not in ignore]


PRESETS = {
    # 2 CPU cores, at most 10 minutes end to end.
    "quick": DesignConfig(),
    # 2 CPU cores, at most 60 minutes: the headline experiment's loop.
    # Training as issue 16's reference recipe (32 envs, 16 updates of 256 per epoch): 256,000 env steps
    # per candidate per iteration, 2,048,000 for each agent of the final job, all started from an agent
    # pretrained 2,000 epochs on gt_sophy (512,000 more). The search's settings are the headline runs'
    # (docs/headline_experiment.md): ten whole races judged per candidate, the actor held 200 epochs while
    # a candidate's critic learns its reward (not in the final job); the gt_sophy start gave the loop's
    # agents with the fewest contacts (1.40, 0.60 and 1.65 per race against 2.5-3.9 from progress starts).
    "standard": DesignConfig(preset="standard", track="gp", opponents=7, iterations=3, m=6, n=4, hidden=128,
                             num_envs=32, updates_per_epoch=16, batch_size=256, replay_size=300_000, epochs=1000,
                             chunk_epochs=100, final_epochs=8000, keep_best_every=4, select_races=8, race_laps=2,
                             eval_races=10, final_races=20, clip_seconds=15.0, clips_per_race=1,
                             clip_whole_race=True, judge_beta=2.0, judge_mistake=0.1, tac_min_preferences=40,
                             bootstrap_races=16, tune_weights="grad", actor_average=3e-4, keep_best_average=5,
                             pretrain_epochs=2000, pretrain_reward="gt_sophy", start_hold_epochs=200,
                             start_hold_final=False),
    # The papers' settings, meant for one GPU: pixel actor with a GRU, asymmetric critic. Batches of
    # 32 sequences and 150,000 transitions of replay per run, so that a job of 10 runs (N x seeds)
    # fits: 20 GiB of state and 8 GiB of temporary memory by experiments/train_memory.py on XLA:CPU.
    # 256 sequences and 1,000,000 (about the papers') need 13 GiB of replay per run: on an H100,
    # 2 runs already ran out of memory (the README's "The paper preset on a GPU").
    "paper": DesignConfig(preset="paper", track="gp", opponents=7, iterations=4, m=10, n=5, seeds=2, final_seeds=2,
                          actor_input="pixels", recurrent=True, hidden=256, num_envs=64, updates_per_epoch=32,
                          batch_size=32, replay_size=150_000, warmup_epochs=20, epochs=1000, chunk_epochs=100,
                          final_epochs=1500, race_laps=2, eval_races=4, final_races=20, clip_seconds=15.0,
                          clips_per_race=4, tac_min_preferences=100, bootstrap_races=32, tune_weights="grad"),
}


def load_config(preset: str = "quick", path: str | Path | None = None, **overrides) -> DesignConfig:
    """A preset, then the fields of a TOML file (top-level keys), then `overrides` (None ignored)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    fields = PRESETS[preset].to_dict()
    given = {}
    if path is not None:
        try:
            given = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ValueError(f"{path}: cannot read the config: {err}") from None
        if "preset" in given and given["preset"] != preset:
            fields = PRESETS[_preset_of(given["preset"], path)].to_dict()
    given.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise ValueError(f"{path or 'options'}: unknown config keys {unknown}; known: {', '.join(fields)}")
    for k, v in given.items():
        want = type(fields[k])
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if want is tuple and isinstance(v, list) and all(isinstance(x, str) for x in v):
            v = tuple(v)
        if not isinstance(v, want) or (want is int and isinstance(v, bool)):
            raise ValueError(f"{path or 'options'}: {k} must be a {want.__name__}, got {v!r}")
        fields[k] = v
    return DesignConfig(**fields)


def _preset_of(name, path) -> str:
    if name not in PRESETS:
        raise ValueError(f"{path}: unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return name
