"""The `jaxrace` command (host-side).

`jaxrace` with no arguments runs the main job on embedded defaults: the reward-design
loop (`jaxrace design`) with the offline proposer, the scripted judge and the quick
preset, in a new folder under runs/. `jaxrace race` is a race of the built-in AI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np

from jaxrace.jit import jit


def _race(args) -> int:
    import jaxrace
    from jaxrace.envs.rollouts import ai_race, format_summary, summarise

    if args.steps is not None and args.steps < 1:
        raise SystemExit("error: --steps must be at least 1")
    env, params = jaxrace.make(track=args.track, num_opponents=args.opponents, laps=args.laps, start=args.start)
    c = env.static.num_cars
    key = jax.random.key(args.seed)
    k_skill, k_aggr, k_race = jax.random.split(key, 3)
    # A field with a spread of skills, the faster cars further back, so there is racing.
    skill = jnp.sort(jax.random.uniform(k_skill, (c,), minval=0.88, maxval=1.0))
    skill = skill.at[0].set(args.ego_skill)
    params = params.replace(skill=skill, aggression=jax.random.uniform(k_aggr, (c,)))
    steps = args.steps or int(float(params.tracks.ref_lap_time) * (args.laps + 1) * 1.3 / env.static.dt)
    print(f"jaxrace: {c} cars, {args.laps} lap(s) of '{args.track}' "
          f"({float(params.tracks.length) / 1000:.2f} km, reference lap {float(params.tracks.ref_lap_time):.2f} s), "
          f"start '{args.start}', {steps} steps of {env.static.dt:.1f} s on {jax.default_backend()}")
    t0 = time.perf_counter()
    record = jit(ai_race, static_argnums=(0, 3), renders=env.static.pixels)(env, params, k_race, steps)
    jax.block_until_ready(record)
    wall = time.perf_counter() - t0
    print(format_summary(summarise(record, args.laps), np.asarray(skill)))
    print(f"simulated {steps * env.static.dt:.0f} s of racing in {wall:.1f} s (compile included)")
    return 0


def _reward(args) -> int:
    from pathlib import Path

    from jaxrace.rewards import RewardCompileError, api_text, compile_reward, propose

    if args.reward_command == "api":
        print(api_text())
        return 0
    if args.reward_command == "propose":
        if args.m < 1:
            raise SystemExit("error: -m must be at least 1")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for p in propose(args.task, args.m, jax.random.key(args.seed)):
            (out / f"{p.name}.py").write_text(p.source)
            print(f"{out / (p.name + '.py')}: {p.structure}, terms {', '.join(p.terms)}")
        return 0
    status = 0
    for path in args.files:
        try:
            r = compile_reward(Path(path).read_text(encoding="utf-8"), name=Path(path).stem)
        except (OSError, UnicodeDecodeError) as err:
            print(f"{path}: cannot read: {err}", file=sys.stderr)
            status = 1
        except RewardCompileError as err:
            print(f"{path}:{err.lineno or 0}: {err}", file=sys.stderr)
            status = 1
        else:
            saved = ""
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                saved = f", artifact {r.save(Path(args.out) / (Path(path).stem + '.jaxreward'))}"
            print(f"{path}: ok, components {list(r.component_names)}, PARAMS {dict(r.params)}, "
                  f"sha256 {r.sha256[:12]}{saved}")
    return status


def _tune(args) -> int:
    """jaxrace reward tune STORE PROGRAM.py...: the programs' PARAMS fitted to the store's preferences."""
    from pathlib import Path

    from jaxrace.rewards import RewardBank, RewardCompileError, compile_rewards
    from jaxrace.rewards.preferences import PreferenceStore
    from jaxrace.rewards.tuning import TuningConfig, tune

    if not Path(args.store).is_file():
        print(f"jaxrace reward tune: error: {args.store}: no such store (a run directory's preferences.sqlite)",
              file=sys.stderr)
        return 2
    try:
        config = TuningConfig(method=args.method, holdout=args.holdout, seed=args.seed, beta=args.beta,
                              min_preferences=args.min_preferences)
        sources = [Path(f).read_text(encoding="utf-8") for f in args.programs]
    except (ValueError, OSError) as err:
        print(f"jaxrace reward tune: error: {err}", file=sys.stderr)
        return 2
    compiled = compile_rewards(sources, names=[Path(f).stem for f in args.programs])
    bad = [(f, c) for f, c in zip(args.programs, compiled, strict=True) if isinstance(c, RewardCompileError)]
    for f, err in bad:
        print(f"{f}:{err.lineno or 0}: {err}", file=sys.stderr)
    if bad:
        return 1
    with PreferenceStore(args.store) as store:
        try:
            first, second, labels = store.labelled_pairs()
        except ValueError as err:
            print(f"jaxrace reward tune: error: {err}", file=sys.stderr)
            return 1
    result = tune(RewardBank.from_compiled(compiled), first, second, labels, config)
    print(f"{args.store}: {len(labels)} labelled pairs; method {result.method}, fit in {result.fit_seconds:.1f} s "
          "(compile included)")
    for c in result.candidates:
        figures = "" if c.heldout_accuracy_before is None else (
            f"; held-out ({c.heldout_pairs} pairs) accuracy {c.heldout_accuracy_before:.3f} -> "
            f"{c.heldout_accuracy_after:.3f}, log-likelihood per pair {c.heldout_loglik_before:.3f} -> "
            f"{c.heldout_loglik_after:.3f}")
        mh = "" if c.acceptance is None else (
            f"; acceptance {c.acceptance:.2f}, effective samples "
            + ", ".join(f"{k} {v:.0f}" for k, v in c.ess.items()))
        how = f", returns {c.returns}" if c.returns else ""
        print(f"{c.name}: {'tuned' if c.tuned else 'kept the defaults'} ({c.reason}{how}){figures}{mh}")
        print(f"  PARAMS = {{{', '.join(f'{k!r}: {v:.6g}' for k, v in c.params.items())}}}")
    return 0


def _endpoint(args) -> tuple[str | None, str | None]:
    """--base-url and --model for the openai backend, else from the environment (never the key)."""
    if getattr(args, "llm", None) != "openai":
        return args.base_url, args.model
    from jaxrace.llm.openai_chat import env_setting

    return args.base_url or env_setting("BASE_URL"), args.model or env_setting("MODEL")


def _generate(args) -> int:
    from pathlib import Path

    from jaxrace.llm import LLMError, generate, open_chat

    if args.m < 1:
        raise SystemExit("error: -m must be at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base_url, model = _endpoint(args)
    try:
        chat = open_chat(args.llm, out / "llm" / "record.jsonl", base_url=base_url, model=model,
                         replay_from=args.replay_from)
        chat.stage = "reward generate"
        result = generate(chat, args.task, args.m, repairs=args.repairs, seed=args.seed)
    except LLMError as err:
        print(f"jaxrace reward generate: error: {err}", file=sys.stderr)
        return 1
    for i, p in enumerate(result.programs):
        path = out / f"candidate-{i + 1}.py"
        path.write_text(p.source, encoding="utf-8")
        p.compiled.save(path.with_suffix(".jaxreward"))
        print(f"{path}: sample {p.sample + 1}, {p.repairs} repairs, components {list(p.compiled.component_names)}")
    (out / "attempts.json").write_text(json.dumps({"stopped": result.stopped, "tokens": result.tokens,
                                                    "attempts": result.attempts}, indent=1), encoding="utf-8")
    stages = Counter(a["stage"] for a in result.attempts)
    print(f"{len(result.programs)} of {args.m} programs from {chat.model}; attempts: "
          f"{', '.join(f'{k} {v}' for k, v in stages.items())}; {result.tokens} tokens; record {out / 'attempts.json'}")
    if result.stopped:
        print(f"stopped early: {result.stopped}", file=sys.stderr)
    return 0 if result.programs else 1


def _llm_check(args) -> int:
    from jaxrace.llm import LLMError, message
    from jaxrace.llm.openai_chat import OpenAIChat
    from jaxrace.llm.structured import chat_json

    try:
        chat = OpenAIChat(args.base_url, args.model, timeout_s=args.timeout, max_retries=1)
    except LLMError as err:
        print(f"jaxrace llm check: error: {err}", file=sys.stderr)
        return 2
    print(f"endpoint {chat.base_url}, model {chat.model}")
    ok = True
    try:
        models = chat.list_models()
        listed = "listed" if chat.model in models else "NOT listed"
        print(f"  models: {len(models)} ({', '.join(models[:8])}{', ...' if len(models) > 8 else ''}); "
              f"{chat.model} {listed}")
    except LLMError as err:
        print(f"  models: cannot list ({err})")
    try:
        reply = chat.chat([message("user", "Reply with the single word: ready")], max_tokens=16, temperature=0.0)
        print(f"  reply: {reply.text.strip()[:60]!r} in {reply.seconds:.2f} s, {reply.tokens} tokens"
              f"{' (estimated)' if reply.estimated else ''}")
    except LLMError as err:
        print(f"  reply: FAILED: {err}")
        return 1
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    try:
        answer, _ = chat_json(chat, [message("user", "What colour is the sky on a clear day?")], schema,
                              max_tokens=64, temperature=0.0)
        print(f"  JSON: works ({answer})")
    except LLMError as err:
        ok = False
        print(f"  JSON: FAILED ({err})")
    try:
        reply = chat.chat([message("user", "What colour is this image? Answer in one word.", [_red_png()])],
                          max_tokens=16, temperature=0.0)
        seen = "red" in reply.text.lower()
        print(f"  images: {'work' if seen else 'accepted, but the answer is not red'} ({reply.text.strip()[:40]!r})")
    except LLMError as err:
        print(f"  images: not supported ({err}); a VLM judge needs a model that takes images")
    return 0 if ok else 1


def _red_png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (220, 20, 20)).save(buffer, format="PNG")
    return buffer.getvalue()


def _judges(args) -> int:
    from pathlib import Path

    from jaxrace.judges.agreement import agreements
    from jaxrace.rewards.preferences import PreferenceStore

    if not Path(args.store).is_file():
        print(f"jaxrace judges: error: {args.store}: no such store (a run directory's preferences.sqlite)",
              file=sys.stderr)
        return 2
    with PreferenceStore(args.store) as store:
        if args.judges_command == "rank":
            return _judges_rank(store, args.iteration)
        if args.judges_command == "export":
            try:
                print(store.export(args.out))
            except ValueError as err:
                print(f"jaxrace judges export: error: {err}", file=sys.stderr)
                return 2
            return 0
        found = agreements(store.preferences())
        counts = Counter(p.judge_id for p in store.preferences() if p.label != "skip")
    print(f"{args.store}: {sum(counts.values())} labels from {len(counts)} judges "
          f"({', '.join(f'{j} {n}' for j, n in sorted(counts.items()))})")
    if not found:
        print("no two judges labelled the same pair of clips")
        return 0
    print(f"{'judge A':<32} {'judge B':<32} {'shared':>6} {'agreed':>6} {'rate':>6} {'kappa':>6}")
    for a in found:
        kappa = "-" if a.kappa is None else f"{a.kappa:.3f}"
        print(f"{a.judge_a:<32} {a.judge_b:<32} {a.shared:>6} {a.agreed:>6} {a.rate:>6.3f} {kappa:>6}")
    return 0


def _judges_rank(store, iteration) -> int:
    """Bradley-Terry strengths of the judged candidates (AI drivers in the bootstrap), per iteration."""
    from jaxrace.rewards.bradley_terry import rank_named

    owner = {c.id: c.candidate for c in store.clips()}
    prefs = store.preferences(iteration)
    if not prefs:
        print(f"{store.path}: no preferences" + ("" if iteration is None else f" in iteration {iteration}"))
        return 0 if iteration is None else 1
    for k in sorted({p.iteration for p in prefs}):
        mine = [p for p in prefs if p.iteration == k]
        rows = rank_named([owner[p.first] for p in mine], [owner[p.second] for p in mine], [p.label for p in mine])
        skips = sum(p.label == "skip" for p in mine)
        print(f"{'bootstrap' if k == 0 else f'iteration {k}'}: {len(mine)} judged pairs ({skips} skipped)")
        print(f"  {'candidate':<40} {'strength':>8} {'s.e.':>6} {'games':>5} {'wins':>6}")
        for r in rows:
            print(f"  {r['name']:<40} {r['score']:>+8.2f} {r['stderr']:>6.2f} {r['games']:>5} {r['wins']:>6.1f}")
    return 0


def _design(args) -> int:
    from pathlib import Path

    from jaxrace.agents.distributed import ENV_NUM_PROCESSES, broadcast_json, is_primary
    from jaxrace.design import ConfigMismatch, load_config, run_design
    from jaxrace.llm import LLMError

    distributed = bool(args.distributed or args.num_processes is not None or os.environ.get(ENV_NUM_PROCESSES))
    if not distributed or args.cpu_devices != "auto":  # (several processes: one device each unless asked)
        from jaxrace.envs.parallel import cpu_devices, use_cpu_devices

        try:
            use_cpu_devices(cpu_devices(args.cpu_devices), warn=args.cpu_devices != "auto")
        except ValueError as err:
            print(f"jaxrace design: error: --cpu-devices: {err}", file=sys.stderr)
            return 2
    if distributed:
        from jaxrace.agents.distributed import initialize

        try:
            initialize(args.coordinator, args.num_processes, args.process_id)
        except (ValueError, RuntimeError) as err:
            print(f"jaxrace design: error: --distributed: {err}", file=sys.stderr)
            return 2
    base_url, model = _endpoint(args)
    try:
        config = load_config(args.preset or "quick", args.config, task=args.task, llm=args.llm, judge=args.judge,
                             iterations=args.iterations, m=args.m, n=args.n, track=args.track, seed=args.seed,
                             base_url=base_url, model=model, replay_from=args.replay_from,
                             judge_base_url=args.judge_base_url, judge_model=args.judge_model,
                             judge_host=args.judge_host, judge_port=args.judge_port,
                             judge_timeout_s=args.judge_timeout,
                             tune_weights="" if args.tune_weights == "off" else args.tune_weights)
    except ValueError as err:
        print(f"jaxrace design: error: {err}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{config.preset}"
    run_dir = Path(broadcast_json(str(run_dir)))  # with several processes, process 0's name for a new run
    args.quiet = args.quiet or not is_primary()
    if not args.quiet:
        print(f"jaxrace design: {config.task!r}, preset {config.preset}, {config.iterations} iterations of "
              f"M={config.m}, N={config.n} on '{config.track}', LLM {config.llm}, judge {config.judge}; "
              f"run directory {run_dir}")
    try:
        report = run_design(config, run_dir, quiet=args.quiet)
    except ConfigMismatch as err:
        print(f"jaxrace design: error: {err}", file=sys.stderr)
        return 2
    except LLMError as err:
        print(f"jaxrace design: error: {err}\nThe finished stages are kept: rerun the same command to resume.",
              file=sys.stderr)
        return 1
    if is_primary():
        print(f"report: {report}")
    return 0


def _report(args) -> int:
    from pathlib import Path

    from jaxrace.design import RunDir, write_report

    if not (Path(args.run_dir) / "config.json").exists():
        print(f"jaxrace report: error: {args.run_dir} is not a run directory (no config.json)", file=sys.stderr)
        return 2
    print(write_report(RunDir(args.run_dir)))
    return 0


def _llm_options(parser) -> None:
    parser.add_argument("--base-url", default=None, help="openai: the endpoint (default: JAXRACE_LLM_BASE_URL, "
                                                         "OPENAI_BASE_URL, else OpenAI's)")
    parser.add_argument("--model", default=None, help="openai: the model (default: JAXRACE_LLM_MODEL, OPENAI_MODEL)")
    parser.add_argument("--replay-from", default=None, help="replay: a run directory (or record file) to replay")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jaxrace", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    race = sub.add_parser("race", help="a race of the built-in AI; prints lap times and positions")
    race.add_argument("--track", default="club", help="built-in name, 'procedural:SEED' or a centre-line CSV")
    race.add_argument("--opponents", type=int, default=7)
    race.add_argument("--laps", type=int, default=2)
    race.add_argument("--start", default="grid_back", choices=("grid_back", "random", "time_trial"))
    race.add_argument("--seed", type=int, default=0)
    race.add_argument("--ego-skill", type=float, default=1.0, help="the AI skill driving the ego car")
    race.add_argument("--steps", type=int, default=None, help="agent steps to simulate (default: enough)")
    reward = sub.add_parser("reward", help="reward programs: show the API, check programs, propose offline")
    reward_sub = reward.add_subparsers(dest="reward_command", required=True)
    reward_sub.add_parser("api", help="print the API text an LLM is shown")
    check = reward_sub.add_parser("check", help="compile reward programs (sandboxed) and report")
    check.add_argument("files", nargs="+", help="Python source files, each defining reward(prev, action, curr)")
    check.add_argument("--out", default=None, help="write each compiled artifact to DIR/NAME.jaxreward")
    prop = reward_sub.add_parser("propose", help="write M programs from the offline proposer (not an LLM)")
    prop.add_argument("--task", default="win the race cleanly from the back of the grid")
    prop.add_argument("-m", type=int, default=8)
    prop.add_argument("--seed", type=int, default=0)
    prop.add_argument("--out", default="proposals")
    tune_cmd = reward_sub.add_parser("tune", help="fit programs' PARAMS to a store's preferences (held-out figures)")
    tune_cmd.add_argument("store", help="a preferences.sqlite (a run directory's)")
    tune_cmd.add_argument("programs", nargs="+", help="reward programs (.py) declaring PARAMS")
    tune_cmd.add_argument("--method", default="grad", choices=("mh", "grad", "soft-tac"))
    tune_cmd.add_argument("--holdout", type=float, default=0.3, help="share of the pairs held out (default 0.3)")
    tune_cmd.add_argument("--beta", type=float, default=0.9, help="Boltzmann rationality per s.d. of the returns")
    tune_cmd.add_argument("--min-preferences", type=int, default=10, help="pairs to fit on, or keep the defaults")
    tune_cmd.add_argument("--seed", type=int, default=0)
    gen = reward_sub.add_parser("generate", help="M programs from an LLM (or offline), compiled, with the record")
    gen.add_argument("--task", default="win the race cleanly from the back of the grid")
    gen.add_argument("-m", type=int, default=4)
    gen.add_argument("--llm", default="offline", choices=("offline", "openai", "replay"))
    _llm_options(gen)
    gen.add_argument("--repairs", type=int, default=2, help="repairs per sample that fails to compile")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", default="generated", help="DIR for the programs, attempts.json and llm/record.jsonl")
    llm = sub.add_parser("llm", help="the LLM endpoint")
    llm_sub = llm.add_subparsers(dest="llm_command", required=True)
    llm_check = llm_sub.add_parser("check", help="reach the endpoint, list models, time a reply, try JSON and images")
    llm_check.add_argument("--base-url", default=None, help="default: JAXRACE_LLM_BASE_URL, OPENAI_BASE_URL")
    llm_check.add_argument("--model", default=None, help="default: JAXRACE_LLM_MODEL, OPENAI_MODEL")
    llm_check.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    design = sub.add_parser("design", help="the reward-design loop (the main job)")
    design.add_argument("--task", default=None, help="the task in words (default: the preset's)")
    design.add_argument("--preset", default=None, choices=("quick", "standard", "paper"))
    design.add_argument("--config", default=None, help="a TOML file of DesignConfig fields (top-level keys)")
    design.add_argument("--llm", default=None, choices=("offline", "openai", "replay"),
                        help="who writes the programs (default offline: the proposer, not an LLM)")
    _llm_options(design)
    design.add_argument("--judge", default=None, choices=("scripted", "vlm", "human"),
                        help="who compares the clips (vlm: a model that takes images, on an OpenAI-compatible "
                             "server; human: you, on a local web page whose URL the loop prints)")
    design.add_argument("--judge-base-url", default=None, help="vlm: its endpoint (default: the LLM's)")
    design.add_argument("--judge-model", default=None, help="vlm: its model (default: the LLM's --model)")
    design.add_argument("--judge-host", default=None,
                        help="human: the page's address (default 127.0.0.1; any other needs the printed token)")
    design.add_argument("--judge-port", type=int, default=None, help="human: the page's port (default: a free one)")
    design.add_argument("--judge-timeout", type=float, default=None,
                        help="human: seconds to wait for labels before the pairs left become skips (default 3600)")
    design.add_argument("--tune-weights", default=None, choices=("grad", "mh", "soft-tac", "off"),
                        help="after each iteration, tune the best program's weights from the preferences and carry "
                             "the tuned program into the next (default: the preset's; standard and paper: grad; "
                             "off: never)")
    design.add_argument("--run-dir", default=None, help="the run directory; an existing one is resumed")
    design.add_argument("--iterations", type=int, default=None, help="K")
    design.add_argument("-m", type=int, default=None, help="programs generated per iteration")
    design.add_argument("-n", type=int, default=None, help="programs trained per iteration")
    design.add_argument("--track", default=None, help="a built-in circuit")
    design.add_argument("--seed", type=int, default=None)
    design.add_argument("--quiet", action="store_true", help="no progress display")
    design.add_argument("--cpu-devices", default="auto", metavar="N",
                        help="JAX CPU devices; a training job whose runs they divide trains its share on each at "
                             "once (default auto: one per core this process may use; 1: one device; GPUs "
                             "unaffected; with --distributed, one per process unless given)")
    design.add_argument("--distributed", action="store_true",
                        help="train across processes and hosts (jax.distributed): run this same command in every "
                             "process; process 0 does the rest. Settings from the options below or "
                             "$JAXRACE_COORDINATOR, $JAXRACE_NUM_PROCESSES, $JAXRACE_PROCESS_ID (or a cluster's)")
    design.add_argument("--coordinator", default=None, help="--distributed: process 0's host:port")
    design.add_argument("--num-processes", type=int, default=None, help="--distributed: how many processes")
    design.add_argument("--process-id", type=int, default=None, help="--distributed: this process's index")
    judges = sub.add_parser("judges", help="the preference store's labels: agreement between judges, export")
    judges_sub = judges.add_subparsers(dest="judges_command", required=True)
    agree = judges_sub.add_parser("agreement", help="agreement rate and Cohen's kappa of judges on shared pairs")
    agree.add_argument("store", help="a preferences.sqlite")
    rank = judges_sub.add_parser("rank", help="Bradley-Terry strengths with standard errors per iteration")
    rank.add_argument("store", help="a preferences.sqlite")
    rank.add_argument("--iteration", type=int, default=None, help="only this iteration (0: the bootstrap)")
    export = judges_sub.add_parser("export", help="every preference with its clips, as CSV or JSON")
    export.add_argument("store", help="a preferences.sqlite")
    export.add_argument("--out", required=True, help="FILE.csv or FILE.json")
    report = sub.add_parser("report", help="rebuild report.html of a run directory")
    report.add_argument("run_dir")
    args = parser.parse_args(argv)
    if args.command == "reward":
        handler = {"generate": _generate, "tune": _tune}.get(args.reward_command, _reward)
        return handler(args)
    if args.command == "llm":
        return _llm_check(args)
    if args.command == "judges":
        return _judges(args)
    if args.command is None:  # the main job on embedded defaults
        args = parser.parse_args(["design", *(argv or [])])
    if args.command == "design":
        return _design(args)
    if args.command == "report":
        return _report(args)
    if args.start == "time_trial":
        args.opponents = 0
    try:
        return _race(args)
    except (ValueError, KeyError) as err:
        print(f"jaxrace: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
