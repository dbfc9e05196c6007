"""Trains the reference agent: QR-SAC, state observations, the GT Sophy style reward.

Usage: python experiments/train_reference.py [--minutes 25] [--track oval|club|gp|PATH.csv]

One run on a built-in circuit or a real one (`--track ../shared/tracks/BrandsHatch.csv`,
its race line read from NAME_raceline.csv beside it), trained until the time budget is
spent (compile and the checkpoint-selection races included). Training episodes start at
random places and speeds round the lap (`--start`), or with `--grid-prob P` standing on
the grid as a race does, or with `--offtrack-start P` off the course to learn to
rejoin it, and end at a time limit or a course-out; half the envs
(`--alone`) drive alone, the others among 7 AI cars at skill 0.9, spread round the lap
or, with `--pack-gap G`, bunched G m apart; each env's AI cars get their own aggression
(`--ai-aggression varied`) and, with `--ai-skill-spread S`, its own skills in 0.9 +- S. Then:
1. time trial: the best lap of the policy in a two-lap deterministic run alone on
   the track, against the reference lap (issue 16's target: within 5%, no course-out);
2. 20 deterministic races from the back of an 8-car grid against the AI at skill 0.9,
   each race with its own field (every AI car's aggression drawn in [0, 1]; with one
   shared field the deterministic races would be 20 copies of one race). Targets:
   median finishing position 3rd or better, at most 2 at-fault contacts and 1
   course-out per race.
Every `--eval-every` chunks the policy also runs a time trial and `--select-races` races
on other fields than those of step 2; the best of those checkpoints by a racing score
(`racing_score`; `--lap-miss C` adds C when the lap target is missed) is
the kept checkpoint (with `--keep-average K`: the best mean of the parameters of the last K
evaluated policies, `KeepBest(average=K)`), assessed beside the final policy (with `--save DIR --save-evaluated`
every evaluated checkpoint is saved too, and `--assess DIR --hindsight` assesses them all and
the checkpoint each selection rule would keep: checkpoint_hindsight.py). Writes results/train_reference.json
and .png (with `--tag T`: train_reference-T.json and .png, for variants).
Pin a run to one core with `taskset -c 0` to train two seeds side by side: the rows
record the cores used. `--steps N` also stops at N env steps (to compare actors at equal
steps, or runs on machines of different speeds: the curriculum's and the learning-rate
decay's shares are then shares of N). `--alone-first S --alone A [--then S2:A2 ...]` is
a curriculum: every env alone for the first share S, then A of them alone, and so on.
`--weight NAME=V` sets a reward weight; `--weight-ramp NAME=V` moves it linearly to V
from `--weight-ramp-from` (a share, as above) to the end.
`--actor pixels` trains the CNN+GRU actor on 64x64 images (the critics read the state);
on CPU its gradient updates are jitted calls from a host loop (`--host-updates`), since
XLA:CPU differentiates a convolution inside a scan about 25x slower. Its programs compile
with jaxrace's CPU compile options (`jaxrace.jit`, as the loop's); with
`JAXRACE_XLA_DEFAULTS=1` they compile as the runs before 2026-12-01 did, with XLA's defaults.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import RESULTS, print_table, write_results

import jaxrace
from jaxrace.agents import HParams, TrainConfig, make_train
from jaxrace.agents.checkpoint import load_checkpoint, save_checkpoint
from jaxrace.agents.evaluation import evaluate
from jaxrace.agents.networks import NetworkConfig
from jaxrace.agents.runner import committed, per_run_hparams, split_epochs
from jaxrace.agents.selection import Assessment, KeepBest, assess, racing_score
from jaxrace.envs import builtin_track, load_track_csv, per_env_params, race_fields, reference_lap_time
from jaxrace.jit import jit
from jaxrace.rewards import RewardBank, library_reward

SKILL = 0.9
RACE_LAPS = 3


def setup(env, params, skill: float, steer_lock_speed: float):
    """The AI's skill on every car, and speed-sensitive steering (GT7's controller assist)."""
    return params.replace(skill=jnp.full((env.static.num_cars,), skill, jnp.float32),
                          car=params.car.replace(steer_lock_speed=steer_lock_speed))


def load_track(spec: str):
    """(Track, short name) of a built-in name or a centre-line CSV path."""
    if not spec.endswith(".csv"):
        return builtin_track(spec), spec
    centre = Path(spec)
    if not centre.exists():
        raise SystemExit(f"--track {spec}: no such file")
    raceline = centre.with_name(centre.stem + "_raceline.csv")
    return load_track_csv(centre, raceline if raceline.exists() else None), centre.stem


def result_rows(prefix: str, a: Assessment) -> list[dict]:
    lap, gap = a.lap, a.lap_gap
    return [
        {"name": f"{prefix}time-trial best lap", "value": None if lap is None else round(lap, 2), "unit": "s"},
        {"name": f"{prefix}time-trial lap vs reference", "value": None if gap is None else round(gap, 1), "unit": "%"},
        {"name": f"{prefix}time-trial course-outs", "value": a.lap_outs, "unit": "count"},
        {"name": f"{prefix}{a.races} races from P8 vs AI skill {SKILL}, median finish",
         "value": float(np.median(a.positions)), "unit": "position"},
        {"name": f"{prefix}races, finishing positions", "value": list(a.positions), "unit": "position"},
        {"name": f"{prefix}races, collisions at fault (total)", "value": a.at_fault, "unit": "count"},
        {"name": f"{prefix}races, course-outs (total)", "value": a.course_outs, "unit": "count"},
        {"name": f"{prefix}races, course-outs by race", "value": list(a.outs_by_race), "unit": "list"},
        {"name": f"{prefix}races, at-fault contacts by race", "value": list(a.at_fault_by_race), "unit": "list"},
        {"name": f"{prefix}races, finished (1) or out of time (0)", "value": [int(f) for f in a.finished],
         "unit": "list"},
        {"name": f"{prefix}races, mean squared action change per step (steering, throttle_brake)",
         "value": None if a.action_change is None else [round(c, 5) for c in a.action_change], "unit": "list"},
    ]


def targets(a: Assessment) -> str:
    """Issue 16's targets, met or not, for one assessed policy."""
    names = {"lap": "lap within 5% with no course-out", "position": "median finish <= 3",
             "at_fault": "<= 2 at-fault contacts per race", "course_outs": "<= 1 course-out per race"}
    return "; ".join(f"{names[k]}: {'met' if ok else 'NOT met'}" for k, ok in a.met().items())


def plot_curve(path, curve, evals, ref_lap):
    """Learning curve: per-chunk means of the training rollouts, and time-trial laps.

    curve: (env steps, mean progress m/step, mean reward per step) per chunk.
    evals: (env steps, best lap s or None, course-outs) per evaluation.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    steps, progress, reward = (np.asarray(x) for x in zip(*curve, strict=True))
    top.plot(steps / 1e6, progress, lw=1.5, label="progress (m/step)")
    if np.all(np.isfinite(reward)):
        top.plot(steps / 1e6, reward, lw=1.5, label="GT Sophy reward per step")
    top.set_ylabel("training rollouts (chunk means)")
    top.legend(loc="lower right")
    clean = [(s, lap) for s, lap, outs in evals if lap is not None and outs == 0]
    dirty = [(s, lap) for s, lap, outs in evals if lap is not None and outs > 0]
    for points, style, label in ((clean, "o", "agent, no course-out"), (dirty, "x", "agent, with course-outs")):
        if points:
            bottom.plot(np.asarray([s for s, _ in points]) / 1e6, [lap for _, lap in points], style, label=label)
    bottom.axhline(ref_lap, color="k", ls="--", lw=1, label="reference lap")
    bottom.axhline(1.1 * ref_lap, color="r", ls=":", lw=1, label="reference + 10%")
    bottom.set_ylabel("time-trial best lap (s)")
    bottom.set_xlabel("env steps (millions)")
    bottom.legend(loc="lower center", ncol=2, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def saved_actors(directory: Path, template):
    """(which, actor, step) of the final and the kept actor a run saved under `directory`; a missing
    one is named and skipped."""
    for which in ("final", "kept"):
        if not (directory / which).is_dir():
            print(f"{directory / which}: none saved")
            continue
        yield (which, *load_checkpoint(directory / which, template))


def assess_saved(args, directory: Path, template, final_assessment, track_name: str, final_races=None,
                 dt: float = 0.1, track=None) -> None:
    """Assesses the final and the kept actor a run saved (a run cut off before its own assessment).

    With `final_races` (actor -> the `evaluate` result of the assessment's races) and
    `--anatomy`, only the at-fault contacts of those races are looked at (contact_anatomy.py), also
    by corner of `track`."""
    if args.anatomy:
        return anatomy_of_saved(args, directory, template, final_assessment, final_races, dt, track)
    rows = []
    for which, actor, step in saved_actors(directory, template):
        a = final_assessment(actor)
        prefix = f"{track_name}: " + ("" if which == "final" else "kept checkpoint: ")
        if which == "kept":
            rows.append({"name": f"{prefix}env steps", "value": int(step), "unit": "steps"})
        rows += result_rows(prefix, a)
        print(f"{which} ({step} {'env steps' if which == 'kept' else 'chunks'}): {targets(a)}")
    print_table(["measure", "value", "unit"], [[r["name"], r["value"], r["unit"]] for r in rows])
    rows.append({"name": "assessed saved actors (command-line options)", "unit": "options",
                 "value": {k: v for k, v in vars(args).items() if k not in ("save", "assess")}})
    name = "train_reference" + (f"-{args.tag}" if args.tag else "")
    path = RESULTS / f"{name}.json"
    if path.exists():  # the run's own rows (training, checkpoint evaluations) stay; assessed rows replace theirs
        import json

        old = [r for r in json.loads(path.read_text())["rows"] if r["name"] not in {r2["name"] for r2 in rows}]
        rows = old + rows
    print(f"wrote {write_results(name, rows)}")


def anatomy_of_saved(args, directory: Path, template, final_assessment, final_races, dt: float, track) -> None:
    """When, where (at which corner of `track`), at what closing speed and pedal the saved actors'
    at-fault contacts of the 20 races begin; writes results/contact_anatomy-<tag>.json."""
    from contact_anatomy import add_corners, agent_row, print_agent_rows, print_corner_rows, run_events, track_corners

    rows = []
    for which, actor, _ in saved_actors(directory, template):
        ev = final_races(actor)
        events = run_events(ev, 0, dt)
        at_fault = final_assessment(actor).at_fault
        if len(events) != at_fault:
            raise SystemExit(f"{which}: {len(events)} at-fault onsets against the assessment's {at_fault}: "
                             "the races were not reproduced")
        rows.append(agent_row(which, args.seed, args.races, events))
    if not rows:
        raise SystemExit(f"{directory}: no saved actor (final/ or kept/) to look at")
    print(f"{directory}: {args.races} races from P8, AI skill {SKILL}")
    print_agent_rows(rows)
    add_corners(rows, *track_corners(track))
    print_corner_rows(rows)
    print(f"wrote {write_results(f'contact_anatomy-{args.tag}', rows)}")


def parse_weights(parser, items, flag: str = "--weight") -> dict:
    weights = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            parser.error(f"{flag} {item!r}: expected NAME=NUMBER, e.g. w_rear_end=20")
    return weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=25.0,
                        help="training budget, compile and checkpoint-selection races included")
    parser.add_argument("--track", default="oval")
    parser.add_argument("--chunk-epochs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=None,
                        help="stop after the chunk that reaches this many env steps (default: --minutes only); "
                        "the shares of --alone-first, --then and --lr-decay are then shares of these steps, so a "
                        "schedule is the same on a slower or faster machine")
    parser.add_argument("--eval-every", type=int, default=3, help="chunks between checkpoint evaluations")
    parser.add_argument("--select-races", type=int, default=16,
                        help="races per checkpoint evaluation (0: time trial only)")
    parser.add_argument("--lap-miss", type=float, default=1.0, metavar="COST",
                        help="racing score: what a missed lap target costs on top of its gap and course-outs "
                             "(runs before 2026-11-30 used 0)")
    parser.add_argument("--keep-average", type=int, default=1, metavar="K",
                        help="judge and keep the mean of the parameters of the last K evaluated policies "
                             "(weight averaging over checkpoints; --save-evaluated still saves each policy; "
                             "1: each policy itself)")
    parser.add_argument("--races", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-entropy", type=float, default=-2.0)
    parser.add_argument("--n-step", type=int, default=5)
    parser.add_argument("--discount", type=float, default=0.99)
    parser.add_argument("--reward-scale", type=float, default=0.1)
    parser.add_argument("--start", default="random", choices=["random", "grid_back"],
                        help="training starts: random places and speeds round the lap, or the grid")
    parser.add_argument("--grid-prob", type=float, default=0.0,
                        help="with --start random: share of episodes that start standing on the grid")
    parser.add_argument("--corner-prob", type=float, default=0.0,
                        help="with --pack-gap: share of traffic episodes whose pack starts in grid formation at "
                             "speed just before a braking zone (the first corners of a race)")
    parser.add_argument("--envs", type=int, default=16, help="training envs")
    parser.add_argument("--actor", default="state", choices=["state", "pixels"],
                        help="the actor's input: the state vector, or 64x64 pixels through a CNN and a GRU "
                             "(recurrent replay; the critics read the state either way)")
    parser.add_argument("--host-updates", default="auto", choices=["auto", "on", "off"],
                        help="each gradient update its own jitted call from a Python loop instead of a scan "
                             "(XLA:CPU differentiates convolutions in a loop far more slowly); auto: on for the "
                             "pixel actor on CPU")
    parser.add_argument("--burn-in", type=int, default=8, help="pixels: replayed steps that warm the GRU")
    parser.add_argument("--train-length", type=int, default=16, help="pixels: trained steps per sequence")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--reinit-every", type=int, default=0, metavar="EPOCHS",
                        help="re-initialise the networks and optimisers every this many epochs, keeping replay "
                             "and temperature (primacy bias; 0: never)")
    parser.add_argument("--critic-layer-norm", action="store_true", help="LayerNorm in the critics' hidden layers")
    parser.add_argument("--updates", type=int, default=16, help="gradient updates per epoch (envs x 8 steps)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--replay", type=int, default=300_000, help="replay capacity (transitions)")
    parser.add_argument("--no-terminate-on-course-out", dest="terminate_on_course_out", action="store_false",
                        help="keep training episodes going after a course-out (the reward's penalty only)")
    parser.add_argument("--terminate-on-contact", action="store_true",
                        help="end a training episode when the ego car runs into the back of another car, as a "
                             "course-out ends it (the races go on after contacts)")
    parser.add_argument("--keep-going", type=float, default=0.0, metavar="SHARE",
                        help="share of the training envs, alone and in traffic alike, whose episodes go on after a "
                             "course-out (the reward's penalty only), so the agent learns to rejoin the track")
    parser.add_argument("--offtrack-start", type=float, default=0.0, metavar="P",
                        help="chance a random start puts the ego car off the course (on the run-off, slower, "
                             "turned up to 0.5 rad), to train rejoining; its episode ends only when the car "
                             "rejoins and leaves again")
    parser.add_argument("--train-course-out-margin", type=float, default=1.0,
                        help="m beyond the edge that ends a training episode (the races and time trial use 1.0)")
    parser.add_argument("--steer-lock-speed", type=float, default=20.0,
                        help="m/s; full lock shrinks as 1 / (1 + (v / this)^2); 0: fixed lock")
    parser.add_argument("--weight", action="append", default=[], metavar="NAME=VALUE",
                        help="override one of the reward's PARAMS, e.g. --weight w_rear_end=20 (repeatable)")
    parser.add_argument("--weight-ramp", action="append", default=[], metavar="NAME=VALUE",
                        help="a reward PARAM's value at the end of training: from --weight-ramp-from on it moves "
                        "linearly from its --weight (or default) value to this one (repeatable; the weights are "
                        "traced, so nothing compiles again)")
    parser.add_argument("--weight-ramp-from", type=float, default=0.5, metavar="SHARE",
                        help="share of --minutes (or --steps) where the --weight-ramp starts")
    parser.add_argument("--lr-decay", type=float, default=None, metavar="SHARE",
                        help="from this share of --minutes (or --steps) on, the actor's and critics' learning "
                        "rates fall linearly to 10%% of theirs at the end (default: constant)")
    parser.add_argument("--tag", default="", help="results go to results/train_reference-<tag>.json and .png")
    parser.add_argument("--save", default=None,
                        help="write the final and the kept actor's parameters under this directory (orbax)")
    parser.add_argument("--assess", default=None, metavar="DIR",
                        help="no training: assess the actors a run saved with --save DIR (same options and seed)")
    parser.add_argument("--save-evaluated", action="store_true",
                        help="with --save: also write every evaluated checkpoint's actor under DIR/evaluated/, for "
                             "--assess DIR --hindsight")
    parser.add_argument("--hindsight", action="store_true",
                        help="with --assess DIR of a --save-evaluated run: every evaluated checkpoint on the 20 "
                             "assessment races, and which checkpoint each selection rule would have kept "
                             "(checkpoint_hindsight.py), into results/checkpoint_hindsight-<tag>.json")
    parser.add_argument("--hindsight-fields", type=int, default=0, metavar="N",
                        help="with --hindsight: judge the checkpoints on a third set of --races fields (the N-th, "
                             "drawn apart from the selection's and the assessment's), into "
                             "results/checkpoint_hindsight-<tag>-fields<N>.json: a held-out judge of the rules")
    parser.add_argument("--hindsight-average", type=int, default=None, metavar="K",
                        help="with --hindsight: instead of single checkpoints, weight averages of the last K "
                             "evaluated actors (1: each alone, for a run that kept averages), also on the selection "
                             "races, and the one each rule would keep, into "
                             "results/checkpoint_hindsight-<tag>[-fields<N>]-avg<K>.json")
    parser.add_argument("--anatomy", action="store_true",
                        help="with --assess: when and how the saved actors' at-fault contacts in the 20 races begin "
                             "(experiments/contact_anatomy.py), into results/contact_anatomy-<tag>.json")
    parser.add_argument("--alone", type=float, default=0.5, help="share of training envs with no opponent")
    parser.add_argument("--alone-first", type=float, default=0.0, metavar="SHARE",
                        help="curriculum: every env drives alone for this share of --minutes (or --steps), "
                             "then --alone of them (the envs restart at the switch; the second phase compiles "
                             "its own chunk)")
    parser.add_argument("--then", action="append", default=[], metavar="SHARE:ALONE",
                        help="a later step of the --alone-first curriculum: from this share of --minutes (or "
                             "--steps) on, ALONE of the envs alone (repeatable, shares rising; each step restarts "
                             "the envs and compiles its own chunk)")
    parser.add_argument("--lookahead", type=float, nargs=2, default=(30, 10.0), metavar=("POINTS", "SPACING"),
                        help="track-edge points ahead in the observation and metres between them")
    parser.add_argument("--traffic-seconds", type=float, default=0.0,
                        help="time limit of episodes in traffic (0: the same as alone, 1.6 reference laps)")
    parser.add_argument("--opponent-frame", default="car", choices=["car", "track"],
                        help="opponents in the observation: relative states in the car's frame or the track's")
    parser.add_argument("--actor-average", type=float, default=0.0, metavar="RATE",
                        help="policy averaging: evaluate, keep and save a moving average of the actor, moved this "
                             "share of the way after each update (0: the actor itself)")
    parser.add_argument("--actor-cvar", type=float, default=1.0, metavar="LEVEL",
                        help="risk-averse actor: maximise the mean of the lowest LEVEL share of the critic's "
                             "quantiles (the CVaR of the return; 1: their mean)")
    parser.add_argument("--action-smoothness", type=float, default=0.0, metavar="WEIGHT",
                        help="action smoothing: the actor's loss also pays WEIGHT times the squared change of its "
                             "evaluation action from a state to the next (0: none)")
    parser.add_argument("--penalty-replay", type=float, default=0.0, metavar="SHARE",
                        help="this share of each batch: the replayed sequences with the lowest reward among 4x as "
                             "many uniform candidates (TrainConfig.penalty_replay; 0: uniform replay)")
    parser.add_argument("--lane-headway", action="store_true",
                        help="the observation also shows the time headway and closing rate (inverse time to "
                             "contact) to the car ahead in our lane")
    parser.add_argument("--opponent-accel", action="store_true",
                        help="opponents in the observation also show their longitudinal acceleration (brake lights)")
    parser.add_argument("--pack-gap", type=float, default=0.0,
                        help="m between cars at a random start in traffic (a pack); 0: spread round the lap")
    parser.add_argument("--ai-aggression", default="fixed", choices=["fixed", "varied"],
                        help="training AI: every car at aggression 0.5, or each env's cars drawn in [0, 1]")
    parser.add_argument("--ai-skill-spread", type=float, default=0.0, metavar="S",
                        help="training AI: each env's cars at skill drawn in 0.9 +- S, so traffic is sometimes "
                             "slower (more passing) and sometimes faster; races stay at 0.9 (0: every car 0.9)")
    args = parser.parse_args()
    if not 0.0 <= args.grid_prob <= 1.0:
        parser.error(f"--grid-prob must be in [0, 1], got {args.grid_prob}")
    if (args.anatomy or args.hindsight) and not args.assess:
        parser.error("--anatomy and --hindsight look at saved actors: they need --assess DIR")
    if args.hindsight_fields and not args.hindsight:
        parser.error("--hindsight-fields judges the checkpoints of --hindsight: it needs --assess DIR --hindsight")
    if args.hindsight_average is not None and not args.hindsight:
        parser.error("--hindsight-average averages the checkpoints of --hindsight: it needs --assess DIR --hindsight")
    if args.hindsight_average is not None and args.hindsight_average < 1:
        parser.error(f"--hindsight-average must be at least 1 (1: each checkpoint alone), got {args.hindsight_average}")
    if args.hindsight and args.hindsight_average is None and args.select_races != parser.get_default("select_races"):
        parser.error("--select-races with --hindsight: the single checkpoints keep the run's own selection "
                     "races; race the averages on more with --hindsight-average K")
    if args.hindsight_fields < 0:
        parser.error(f"--hindsight-fields must be positive, got {args.hindsight_fields}")
    if not args.lap_miss >= 0.0:
        parser.error(f"--lap-miss is a cost and must be >= 0 (a negative one rewards a missed lap), "
                     f"got {args.lap_miss}")
    if args.keep_average < 1:
        parser.error(f"--keep-average must be at least 1 (1: no averaging), got {args.keep_average}")
    if args.save_evaluated and not args.save:
        parser.error("--save-evaluated writes under the --save directory: it needs --save DIR")
    if not 0.0 <= args.ai_skill_spread < 0.5:
        parser.error(f"--ai-skill-spread must be in [0, 0.5), got {args.ai_skill_spread}")
    if not 0.0 <= args.corner_prob <= 1.0:
        parser.error(f"--corner-prob must be in [0, 1], got {args.corner_prob}")
    if not 0.0 <= args.offtrack_start <= 1.0:
        parser.error(f"--offtrack-start must be in [0, 1], got {args.offtrack_start}")
    if not 0.0 <= args.keep_going <= 1.0:
        parser.error(f"--keep-going must be in [0, 1], got {args.keep_going}")
    if not 0.0 <= args.weight_ramp_from < 1.0:
        parser.error(f"--weight-ramp-from must be in [0, 1), got {args.weight_ramp_from}")
    if not 0.0 <= args.alone_first < 1.0:
        parser.error(f"--alone-first must be in [0, 1), got {args.alone_first}")
    steps_later = []
    for spec in args.then:
        try:
            share, alone = (float(x) for x in spec.split(":"))
        except ValueError:
            parser.error(f"--then takes SHARE:ALONE (two numbers), got {spec!r}")
        last = steps_later[-1][0] if steps_later else args.alone_first
        if not last < share < 1.0 or not 0.0 <= alone <= 1.0:
            parser.error(f"--then {spec}: SHARE must rise above {last} and stay below 1, ALONE be in [0, 1]")
        steps_later.append((share, alone))
    if steps_later and not args.alone_first:
        parser.error("--then is a later step of a curriculum: it needs --alone-first")
    if args.corner_prob and not args.pack_gap:
        parser.error("--corner-prob needs --pack-gap: only packed traffic starts can start at a corner")

    track, track_name = load_track(args.track)
    ref_lap = float(reference_lap_time(track))
    # Many laps: episodes end only at the time limit (bootstrapped). With a finish line
    # the return is the fixed lap distance whatever the speed, and nothing rewards pace.
    look = dict(lookahead_points=int(args.lookahead[0]), lookahead_spacing=float(args.lookahead[1]),
                opponent_frame=args.opponent_frame, opponent_accel=args.opponent_accel,
                lane_headway=args.lane_headway, pixels=args.actor == "pixels")
    env, params = jaxrace.make(track=track, start=args.start, laps=1000, time_limit=1.6 * ref_lap, **look,
                               terminate_on_course_out=args.terminate_on_course_out, grid_start_prob=args.grid_prob,
                               corner_start_prob=args.corner_prob, offtrack_start_prob=args.offtrack_start,
                               course_out_margin=args.train_course_out_margin,
                               terminate_on_contact=args.terminate_on_contact)
    params = setup(env, params, SKILL, args.steer_lock_speed)
    num_envs = args.envs
    key = jax.random.key(args.seed)
    # (the third key restarts the envs at --alone-first's switch; before that option it was unused)
    k_init, k_eval, k_restart, k_select, k_train_ai, k_fields = jax.random.split(key, 6)
    traffic_limit = args.traffic_seconds or 1.6 * ref_lap

    base_params = params

    def env_params(alone_share: float):
        """Per-env params: the first `alone_share` of the envs alone, the others in traffic."""
        alone = round(alone_share * num_envs)
        per_env = dict(num_active_opponents=[0] * alone + [7] * (num_envs - alone),
                       random_start_gap=[0.0] * alone + [args.pack_gap] * (num_envs - alone),
                       time_limit=[1.6 * ref_lap] * alone + [traffic_limit] * (num_envs - alone))
        if args.keep_going:
            def ending(envs: int) -> list[bool]:  # the last `--keep-going` share of a group drives on
                on = round(args.keep_going * envs)
                return [args.terminate_on_course_out] * (envs - on) + [False] * on
            per_env["terminate_on_course_out"] = ending(alone) + ending(num_envs - alone)
        if args.ai_aggression == "varied":
            per_env["aggression"] = jax.random.uniform(k_train_ai, (num_envs, env.static.num_cars))
        if args.ai_skill_spread:  # (its own key: the aggression draw stays as runs without it made it)
            shape, spread = (num_envs, env.static.num_cars), args.ai_skill_spread
            per_env["skill"] = SKILL + jax.random.uniform(jax.random.fold_in(k_train_ai, 1), shape,
                                                          minval=-spread, maxval=spread)
        return per_env_params(base_params, num_envs, **per_env)

    params = env_params(1.0 if args.alone_first else args.alone)
    # The time trial is the race env with no opponent taking part (same observation shape).
    tt_env, tt_params = jaxrace.make(track=track, start="grid_back", laps=2, num_active_opponents=0, **look)
    race_env, race_params = jaxrace.make(track=track, start="grid_back", laps=RACE_LAPS, **look)
    tt_params = setup(tt_env, tt_params, SKILL, args.steer_lock_speed)
    race_params = setup(race_env, race_params, SKILL, args.steer_lock_speed)
    # The assessment's fields and the selection's are drawn apart: the kept checkpoint is
    # chosen on races it is not then judged by.
    if args.hindsight_fields:  # a third set of fields and race key, for a held-out judge
        k_fields, k_eval = (jax.random.fold_in(k, args.hindsight_fields) for k in (k_fields, k_eval))
    final_fields = race_fields(race_params, k_fields, args.races, skill_spread=0.0)
    select_fields = race_fields(race_params, k_select, max(args.select_races, 1), skill_spread=0.0)

    bank = RewardBank.from_compiled([library_reward("gt_sophy")])
    pixels = args.actor == "pixels"
    network = NetworkConfig(actor_input=args.actor, recurrent=pixels, hidden=args.hidden,
                            critic_layer_norm=args.critic_layer_norm)
    config = TrainConfig(network=network, num_envs=num_envs, rollout_steps=8, updates_per_epoch=args.updates,
                         burn_in=args.burn_in, train_length=args.train_length,
                         batch_size=args.batch, replay_size=args.replay,
                         n_step=args.n_step, warmup_epochs=20, epochs=args.chunk_epochs,
                         actor_average=args.actor_average, actor_cvar=args.actor_cvar,
                         action_smoothness=args.action_smoothness, penalty_replay=args.penalty_replay,
                         reinit_every=args.reinit_every,
                         host_updates=args.host_updates == "on" or (args.host_updates == "auto" and pixels
                                                                    and jax.default_backend() == "cpu"))
    trainer = make_train(config, env, params, bank)
    # The curriculum's later phases, (budget share, alone share, learner): the same networks
    # and replay, the envs in traffic (the traffic settings are constants of each compiled learner).
    phases = [(args.alone_first, args.alone), *steps_later] if args.alone_first else []
    phases = [(share, alone, make_train(config, env, env_params(alone), bank)) for share, alone in phases]
    weights = parse_weights(parser, args.weight)
    hparams = jax.tree.map(jnp.float32, HParams(
        reward_scale=args.reward_scale, discount=args.discount, target_entropy=args.target_entropy,
        reward_params=jnp.asarray(bank.params_matrix([weights])[0])))
    final_weights = {**weights, **parse_weights(parser, args.weight_ramp, "--weight-ramp")}
    ramp_to = jnp.asarray(bank.params_matrix([final_weights])[0], jnp.float32)
    steps_per_epoch = config.num_envs * config.rollout_steps

    tt_steps = math.ceil(2.3 * ref_lap / 0.1)
    race_steps = math.ceil(RACE_LAPS * ref_lap / SKILL * 1.3 / 0.1)
    judge = dict(tt_env=tt_env, tt_params=tt_params, tt_steps=tt_steps)
    if args.select_races:
        judge.update(race_env=race_env, race_fields=select_fields, race_steps=race_steps)
    evals = []

    def score(epoch, actors):
        a = assess(trainer, actors, ref_lap, jax.random.fold_in(k_select, epoch), **judge)[0]
        evals.append(dict(steps=epoch * steps_per_epoch, epoch=epoch, lap=a.lap, outs=a.lap_outs, races=a.races,
                          mean_position=float(np.mean(a.positions)) if a.positions else None,
                          median_position=float(np.median(a.positions)) if a.positions else None,
                          met=a.met(),
                          at_fault=a.at_fault, race_outs=a.course_outs, score=racing_score(a, lap_miss=args.lap_miss),
                          action_change=None if a.action_change is None else [round(c, 5) for c in a.action_change]))
        return np.array([evals[-1]["score"]])

    def final_assessment(actor):
        return assess(trainer, jax.tree.map(lambda x: x[None], actor), ref_lap, k_eval, tt_env=tt_env,
                      tt_params=tt_params, tt_steps=tt_steps, race_env=race_env, race_fields=final_fields,
                      race_steps=race_steps)[0]

    def final_races(actor):  # assess's races of final_assessment: the same fields and key
        return evaluate(trainer, jax.tree.map(lambda x: x[None], actor), race_env, final_fields,
                        jax.random.split(k_eval)[1], race_steps, num_races=args.races, params_per_race=True)

    keep = KeepBest(score, every=args.eval_every, average=args.keep_average)
    # jaxrace's CPU compile options, as train_many's programs (a pixel actor's render: `jaxrace.jit`)
    init = jit(trainer.init, renders=pixels)
    budget = 60 * args.minutes
    fused_chunks = {id(t): jit(lambda s, h, t=t: t.run_epochs(s, h, 0, args.chunk_epochs), renders=pixels,
                               donate_argnums=0)
                    for t in (trainer, *(p[2] for p in phases))}
    training = trainer  # the curriculum's current phase

    def chunk(s, h, done: int):
        """`--chunk-epochs` epochs after `done`: one fused program, or split with a host loop of updates."""
        if not config.host_updates:
            return fused_chunks[id(training)](s, h)
        s, m = split_epochs(training, jax.tree.map(lambda x: x[None], s), per_run_hparams(h, 1),
                            jnp.zeros(1, jnp.int32), args.chunk_epochs, first_epoch=done)
        return jax.tree.map(lambda x: x[0], (s, m))

    def restart_in_traffic(s, learner, step: int):
        """A curriculum switch: every env restarts under `learner`'s params; networks and replay kept."""
        # (the first switch: the key init would reset the envs with, as the curriculum runs in
        # README were made; a later one folds its step in)
        k = jax.random.split(k_restart, 3)[1]
        restart = jit(learner.restart_envs, renders=pixels)
        return committed(restart(s, k if step == 0 else jax.random.fold_in(k, step)))

    def share_done(chunks_done: int) -> float:
        """How far the run is: its share of --steps when given, else of --minutes."""
        if args.steps is not None:
            return chunks_done * args.chunk_epochs * steps_per_epoch / args.steps
        return (time.perf_counter() - t0) / budget

    def ramp(share: float, start: float) -> float:
        """0 before `start`, rising linearly to 1 at the end of the run."""
        return min(max((share - start) / (1.0 - start), 0.0), 1.0)

    def hparams_at(share: float) -> HParams:  # learning rates and weights are traced: new values compile nothing
        h = hparams
        if args.weight_ramp:
            done = jnp.float32(ramp(share, args.weight_ramp_from))
            h = h.replace(reward_params=h.reward_params + done * (ramp_to - h.reward_params))
        if args.lr_decay is None:
            return h
        scale = jnp.float32(1.0 - 0.9 * ramp(share, args.lr_decay))
        return h.replace(actor_lr=h.actor_lr * scale, critic_lr=h.critic_lr * scale)

    t0 = time.perf_counter()
    state = committed(init(k_init, hparams, 0))  # else the second chunk compiles again
    if args.assess and args.hindsight:
        from checkpoint_hindsight import averaged_hindsight, hindsight

        out = args.tag
        if args.select_races != parser.get_default("select_races"):  # the averages' selection races
            out += f"-select{args.select_races}"
        if args.hindsight_fields:
            out += f"-fields{args.hindsight_fields}"
        if args.hindsight_average is not None:
            def select_assessment(actor, epoch):  # the selection races `score` ran at `epoch`
                return assess(trainer, jax.tree.map(lambda x: x[None], actor), ref_lap,
                              jax.random.fold_in(k_select, epoch), **judge)[0]

            return averaged_hindsight(Path(args.assess), state.policy_actor, final_assessment, select_assessment,
                                      ref_lap, args.tag, f"{out}-avg{args.hindsight_average}",
                                      args.hindsight_average, args.lap_miss)
        return hindsight(Path(args.assess), state.policy_actor, final_assessment, ref_lap, args.tag, out, args.lap_miss)
    if args.assess:
        return assess_saved(args, Path(args.assess), state.policy_actor, final_assessment, track_name, final_races,
                            float(race_env.static.dt), race_params.tracks)
    keep.start(jax.tree.map(lambda x: x[None], state.policy_actor))
    curve, chunks = [], 0
    chunk_s = eval_s = 0.0
    switched_at = []  # epoch of each curriculum switch
    while time.perf_counter() - t0 + chunk_s + (eval_s if (chunks + 1) % args.eval_every == 0 else 0.0) < budget \
            and (args.steps is None or chunks * args.chunk_epochs * steps_per_epoch < args.steps):
        if len(switched_at) < len(phases) and share_done(chunks) >= phases[len(switched_at)][0]:
            _, alone, training = phases[len(switched_at)]
            state = restart_in_traffic(state, training, len(switched_at))
            switched_at.append(chunks * args.chunk_epochs)
            chunk_s = 0.0  # the next chunk compiles
            print(f"{time.perf_counter() - t0:7.0f} s  curriculum: {alone:.0%} of the envs alone from epoch "
                  f"{switched_at[-1]} on", flush=True)
        started = time.perf_counter()
        state, metrics = chunk(state, hparams_at(share_done(chunks)), chunks * args.chunk_epochs)
        chunks += 1
        epochs = chunks * args.chunk_epochs
        progress, reward = float(np.mean(metrics.progress)), float(np.mean(metrics.reward))
        curve.append((epochs * steps_per_epoch, progress, reward))
        chunk_s = time.perf_counter() - started
        line = (f"{time.perf_counter() - t0:7.1f} s  epoch {epochs:6d}  steps {epochs * steps_per_epoch:9d}  "
                f"progress {progress:.2f} m/step  reward {reward:.2f}  alpha {float(metrics.alpha[-1]):.3f}  "
                f"critic {float(np.mean(metrics.critic_loss)):.3f}")
        if bool(state.failed):
            raise SystemExit("the run failed (non-finite loss): see the log above")
        started = time.perf_counter()
        keep.update(epochs, jax.tree.map(lambda x: x[None], state.policy_actor))
        if chunks % args.eval_every == 0 and args.save_evaluated:  # the policy itself, with --keep-average too
            try:
                save_checkpoint(Path(args.save) / "evaluated" / f"epoch{epochs:06d}", state.policy_actor, epochs)
            except Exception as err:  # noqa: BLE001 (a failed save must not cost the training; --hindsight names it)
                print(f"could not save the actor of epoch {epochs} to {args.save}/evaluated "
                      f"({type(err).__name__}: {err}); training on", flush=True)
        if chunks % args.eval_every == 0:
            eval_s = time.perf_counter() - started
            e = evals[-1]
            line += (f"  | time trial {e['lap'] if e['lap'] is None else round(e['lap'], 2)} s, {e['outs']} outs; "
                     f"races: mean pos {e['mean_position'] or 0:.1f}, at fault {e['at_fault']}, "
                     f"outs {e['race_outs']}; score {e['score']:.2f} ({eval_s:.0f} s)")
        print(line, flush=True)
    train_s = time.perf_counter() - t0
    total_steps = chunks * args.chunk_epochs * steps_per_epoch
    kept_actor = jax.tree.map(lambda x: x[0], keep.actor)
    kept_steps = int(keep.epoch[0]) * steps_per_epoch
    saved = {}
    if args.save:
        wanted = {"final": (state.policy_actor, chunks)}
        if keep.epoch[0] >= 0:
            wanted["kept"] = (kept_actor, kept_steps)
        for which, (actor, step) in wanted.items():
            try:
                saved[which] = str(save_checkpoint(Path(args.save) / which, actor, step))
            except Exception as err:  # noqa: BLE001 (a failed save must not cost the assessment below)
                saved[which] = None
                print(f"could not save the {which} actor to {args.save} ({type(err).__name__}: {err}); "
                      "assessing it anyway")

    final = final_assessment(state.policy_actor)
    tag = f"{track_name}: "
    rows = [
        {"name": f"{tag}training wall time incl. compile and selection races", "value": round(train_s, 1),
         "unit": "s"},
        {"name": f"{tag}CPU cores used", "value": len(os.sched_getaffinity(0)), "unit": "cores"},
        {"name": f"{tag}env steps trained", "value": total_steps, "unit": "steps"},
        {"name": f"{tag}reference lap", "value": round(ref_lap, 2), "unit": "s"},
        *result_rows(tag, final),
    ]
    if keep.epoch[0] >= 0:
        kept = final_assessment(kept_actor)
        rows += [{"name": f"{tag}kept checkpoint: env steps", "value": kept_steps, "unit": "steps"},
                 *result_rows(f"{tag}kept checkpoint: ", kept)]
    late = [e for e in evals if e["steps"] >= total_steps / 2 and e["races"] > 0]
    if late:
        rows += [
            {"name": f"{tag}second half of training, checkpoint races: mean position",
             "value": round(float(np.mean([e["mean_position"] for e in late])), 2), "unit": "position",
             "evaluations": len(late)},
            {"name": f"{tag}second half of training, checkpoint races: at-fault contacts per race",
             "value": round(float(np.mean([e["at_fault"] / e["races"] for e in late])), 2), "unit": "count"},
            {"name": f"{tag}second half of training, checkpoint races: course-outs per race",
             "value": round(float(np.mean([e["race_outs"] / e["races"] for e in late])), 2), "unit": "count"},
            {"name": f"{tag}second half of training, time-trial course-outs per evaluation",
             "value": round(float(np.mean([e["outs"] for e in late])), 2), "unit": "count"}]
    if args.alone_first:
        rows.append({"name": f"{tag}curriculum: env steps alone before the switch to traffic",
                     "value": switched_at[0] * steps_per_epoch if switched_at else None, "unit": "steps"})
    for i, (_, alone) in enumerate(steps_later, start=1):
        rows.append({"name": f"{tag}curriculum: env steps before the switch to {alone:.0%} of the envs alone",
                     "value": switched_at[i] * steps_per_epoch if i < len(switched_at) else None, "unit": "steps"})
    rows.append({"name": f"{tag}checkpoint evaluations", "value": evals, "unit": "list"})
    rows.append({"name": f"{tag}training curve: env steps, progress m/step, reward per step", "unit": "list",
                 "value": [[int(n), round(p, 3), round(r, 3)] for n, p, r in curve]})
    rows.append({"name": "command-line options", "value": {k: v for k, v in vars(args).items() if k != "save"},
                 "unit": "options"})
    if args.save:
        rows.append({"name": "saved actors (null: the save failed)", "value": saved, "unit": "paths"})
    print_table(["measure", "value", "unit"], [[r["name"], r["value"], r["unit"]] for r in rows
                                               if r["unit"] not in ("list", "options")])
    print(f"final policy: {targets(final)}")
    if keep.epoch[0] >= 0:
        print(f"kept checkpoint ({kept_steps} steps): {targets(kept)}")
    name = "train_reference" + (f"-{args.tag}" if args.tag else "")
    print(f"wrote {write_results(name, rows)}")
    png = RESULTS / f"{name}.png"
    try:
        plot_curve(png, curve, [(e["steps"], e["lap"], e["outs"]) for e in evals]
                   + [(total_steps, final.lap, final.lap_outs)], ref_lap)
    except ImportError as err:  # matplotlib is in the `bench` extra; the JSON above has every number
        print(f"skipped the plot ({err}); install it with: .venv/bin/pip install -e '.[bench]'")
    else:
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
