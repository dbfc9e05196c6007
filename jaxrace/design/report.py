"""report.html from a run directory's files alone (host-side; opens from the folder, no server).

Charts are inline SVG and videos are relative links, so the page has no dependency and
travels with the directory.
"""

from __future__ import annotations

import difflib
import html
import itertools
import json
import math
import time
from collections import Counter
from pathlib import Path

from jaxrace.design.rundir import RunDir

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .6em 0; } td, th { border: 1px solid #ddd; padding: 3px 8px; }
th { background: #f3f3f3; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best td { background: #eaf6ea; } tr.failed td { color: #a33; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; font-size: 12px; }
pre.wrap { white-space: pre-wrap; max-height: 40em; overflow-y: auto; }
.diff-add { color: #176317; } .diff-del { color: #a31515; }
.videos { display: flex; flex-wrap: wrap; gap: 12px; } .videos figure { margin: 0; }
figcaption { font-size: 12px; color: #555; } .note { color: #555; }
"""


def _e(x) -> str:
    return html.escape(str(x))


def _num(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _table(header: list[str], rows: list[list], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td class="num">{_e(c)}</td>' if isinstance(c, int | float) else f"<td>{c}</td>"
                        for c in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def svg_lines(series: dict[str, list[float]], *, xlabel: str, ylabel: str, width=520, height=220) -> str:
    """A line chart of named series (x = index)."""
    finite = [v for ys in series.values() for v in ys if v == v and abs(v) != float("inf")]
    if not finite:
        return '<p class="note">no data</p>'
    lo, hi = min(finite), max(finite)
    hi = hi if hi > lo else lo + 1.0
    n = max(len(ys) for ys in series.values())
    left, bottom, top, right = 50, 30, 10, 130
    w, h = width - left - right, height - top - bottom

    def xy(i, v):
        return left + w * i / max(n - 1, 1), top + h * (1 - (v - lo) / (hi - lo))

    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" font-size="11">',
             f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
             f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{hi:.3g}</text>',
             f'<text x="{left - 4}" y="{top + h}" text-anchor="end">{lo:.3g}</text>',
             f'<text x="{left + w / 2}" y="{height - 6}" text-anchor="middle">{_e(xlabel)}</text>',
             f'<text x="12" y="{top + h / 2}" transform="rotate(-90 12 {top + h / 2})" '
             f'text-anchor="middle">{_e(ylabel)}</text>']
    for j, (name, ys) in enumerate(series.items()):
        color = COLORS[j % len(COLORS)]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(ys) if v == v))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/>')
        parts.append(f'<text x="{left + w + 6}" y="{top + 12 + 14 * j}" fill="{color}">{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_error_bars(names: list[str], values: list[float], errors: list[float], *, width=520) -> str:
    """Horizontal points with +-1 standard error bars (Bradley-Terry scores)."""
    row, left, right = 22, 90, 20
    height = row * len(names) + 30
    lo = min(v - e for v, e in zip(values, errors, strict=True))
    hi = max(v + e for v, e in zip(values, errors, strict=True))
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    hi = hi if hi > lo else lo + 1.0
    w = width - left - right

    def x(v):
        return left + w * (v - lo) / (hi - lo)

    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" font-size="11">',
             f'<line x1="{x(0):.1f}" y1="5" x2="{x(0):.1f}" y2="{height - 20}" stroke="#bbb" stroke-dasharray="3"/>',
             f'<text x="{left}" y="{height - 5}">{lo:.2f}</text>',
             f'<text x="{left + w}" y="{height - 5}" text-anchor="end">{hi:.2f}</text>']
    for i, (name, v, e) in enumerate(zip(names, values, errors, strict=True)):
        y = 15 + row * i
        parts.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{_e(name)}</text>')
        parts.append(f'<line x1="{x(v - e):.1f}" y1="{y}" x2="{x(v + e):.1f}" y2="{y}" stroke="#333"/>')
        parts.append(f'<circle cx="{x(v):.1f}" cy="{y}" r="4" fill="{COLORS[0]}"/>')
    parts.append("</svg>")
    return "".join(parts)


INCIDENT_STYLE = {"at_fault": ("#d62728", "at-fault contact"), "course_out": ("#ff7f0e", "course-out"),
                  "wall": ("#9467bd", "wall hit")}


def svg_incident_map(xy: list[list[float]], track_width: float, incidents: list[dict], *, size=300) -> str:
    """The circuit from above (centre line `xy`, m) with a dot where each incident began."""
    pts = [(float(p[0]), float(p[1])) for p in xy if len(p) == 2 and math.isfinite(p[0]) and math.isfinite(p[1])]
    if len(pts) < 2:
        return '<p class="note">no track</p>'
    marks = [(i.get("kind"), float(i["x"]), float(i["y"])) for i in incidents]  # the JSON may hold "nan"
    marks = [m for m in marks if math.isfinite(m[1]) and math.isfinite(m[2])]
    xs, ys = [p[0] for p in pts] + [m[1] for m in marks], [p[1] for p in pts] + [m[2] for m in marks]
    pad = 8
    scale = (size - 2 * pad) / max(max(xs) - min(xs), max(ys) - min(ys), 1e-6)

    def at(x, y):  # SVG's y grows downwards
        return f"{pad + (x - min(xs)) * scale:.1f}", f"{pad + (max(ys) - y) * scale:.1f}"

    line = " ".join(",".join(at(x, y)) for x, y in pts)
    height = round(2 * pad + (max(ys) - min(ys)) * scale) + 1
    parts = [f'<svg width="{size}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
             f'<polygon points="{line}" fill="none" stroke="#ccc" stroke-linejoin="round" '
             f'stroke-width="{max(2.0, track_width * scale):.1f}"/>']
    sx, sy = at(*pts[0])
    parts.append(f'<circle cx="{sx}" cy="{sy}" r="4" fill="none" stroke="#222"/>')  # the start line
    for kind, x, y in marks:
        color = INCIDENT_STYLE.get(kind, ("#333", ""))[0]
        cx, cy = at(x, y)
        parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}" fill-opacity="0.6"/>')
    parts.append("</svg>")
    return "".join(parts)


def _incidents(run: RunDir, names: list[str], runs: list[dict], races: list[list[dict]]) -> str:
    """Per final agent: a map of where its incidents began over all its races, and when."""
    if not run.exists("final/race/track.json") or not all("incidents" in m for r in races for m in r):
        return ""
    track = run.read_json("final/race/track.json")
    figures = []
    for name in names:
        own = [m for r, per_run in zip(runs, races, strict=True) if r["candidate"] == name for m in per_run]
        found = [i for m in own for i in m["incidents"]]
        counts = []
        for kind, (color, label) in INCIDENT_STYLE.items():
            of_kind = [i for i in found if i["kind"] == kind]
            first_lap = sum(i["lap"] == 0 for i in of_kind)
            counts.append(f'<span style="color:{color}">&#9679;</span> {len(of_kind)} {label}'
                          + ("" if len(of_kind) == 1 else "s")
                          + (f" ({first_lap} on the first lap)" if of_kind else ""))
        figures.append('<figure style="width:300px">' + svg_incident_map(track["xy"], track["width"], found)
                       + f"<figcaption><b>{_e(name)}</b>, {len(own)} races: {', '.join(counts)}</figcaption></figure>")
    return ('<h3>Where the incidents began</h3><p class="note">Every race of each final agent; the open circle is '
            f'the start line.</p><div class="videos">{"".join(figures)}</div>')


def _diff(old: str, new: str) -> str:
    lines = []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), "previous best", "this candidate",
                                     lineterm="", n=2):
        cls = "diff-add" if line.startswith("+") else "diff-del" if line.startswith("-") else ""
        lines.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line))
    return "\n".join(lines) or "(identical)"


def _videos(paths: list[tuple[str, str]]) -> str:
    """Figures of (path, caption) clips: mp4 as a video, GIF (written where ffmpeg failed) as an image."""
    if not paths:
        return ""

    def media(p: str, caption: str) -> str:
        if p.lower().endswith(".gif"):
            return f'<img src="{_e(p)}" alt="{_e(caption)}" width="320">'
        return f'<video src="{_e(p)}" controls muted loop width="320"></video>'

    figures = "".join(f"<figure>{media(p, caption)}<figcaption>{_e(caption)}</figcaption></figure>"
                      for p, caption in paths)
    return f'<div class="videos">{figures}</div>'


def _race_cells(s: dict) -> list:
    if not s:
        return ["-"] * 6
    return [s["median_position"], round(s["mean_positions_gained"], 2), round(s["at_fault_contacts_per_race"], 2),
            round(s["course_outs_per_race"], 2), round(s["wall_hits_per_race"], 2), _num(s["best_lap"])]


RACE_HEADER = ["median pos.", "places gained", "at-fault contacts/race", "course-outs/race", "wall hits/race",
               "best lap (s)"]


def _iteration(run: RunDir, k: int, previous_best: tuple[str, str] | None) -> tuple[str, tuple[str, str] | None]:
    d = f"iter{k}"
    out = [f'<h2 id="{d}">Iteration {k}</h2>']
    if not run.exists(f"{d}/candidates.json"):
        return "".join(out) + '<p class="note">not run yet</p>', previous_best
    candidates = run.read_json(f"{d}/candidates.json")
    attempts = run.read_json(f"{d}/attempts.json")
    select = run.read_json(f"{d}/select.json") if run.exists(f"{d}/select.json") else None
    rank = run.read_json(f"{d}/rank.json") if run.exists(f"{d}/rank.json") else None
    tries = attempts["attempts"]
    refused = [a for a in tries if a["stage"] != "ok"]
    stages = ", ".join(f"{n} {stage}" for stage, n in Counter(a["stage"] for a in tries).items())
    out.append(f"<p>{len(candidates)} candidates; the LLM was asked {len(tries)} times ({stages}), "
               f"{attempts['tokens']:,} tokens"
               f"{' (estimated at 4 characters a token)' if any(a.get('tokens_estimated') for a in tries) else ''}"
               ".</p>")
    if attempts["stopped"]:
        out.append(f'<p class="note">Generation stopped early: {_e(attempts["stopped"])}</p>')
    if select:
        out.append(f'<p class="note">Selection: {_e(select["reason"])}.</p>')
    trained = run.done(f"{d}/train")
    reused = ({r["candidate"]: r["reused_from"] for r in run.read_json(f"{d}/train/curves.json")["runs"]
               if "reused_from" in r} if trained else {})
    rows, classes = [], []
    order = rank["order"] if rank else [c["name"] for c in candidates]
    order += [c["name"] for c in candidates if c["name"] not in order]
    info = {c["name"]: c for c in candidates}
    for name in order:
        c = info[name]
        tac = select["tac"].get(name) if select and select["tac"] else None
        chosen = bool(select) and name in select["selected"]
        score = err = None
        if rank and name in rank["names"]:
            i = rank["names"].index(name)
            score, err = rank["scores"][i], rank["stderr"][i]
        diverged = bool(rank and rank["failed"].get(name))
        status = ("not trained" if not chosen else "failed in training" if diverged
                  else f"its agent from iteration {reused[name]}" if name in reused else "trained" if trained
                  else "selected; training not finished")
        bt = "-" if score is None else f"{score:+.2f} &plusmn; {err:.2f}"
        race = rank["races"].get(name, {}) if rank else {}
        rows.append([_e(name), _e(c["origin"]), _e(", ".join(c["components"])), _num(tac), status, bt,
                     *_race_cells(race)])
        best_here = rank and rank["parents"] and name == rank["best"]
        classes.append("best" if best_here else "failed" if diverged else "")
    out.append(_table(["candidate", "origin", "components", "TAC", "training", "Bradley-Terry", *RACE_HEADER],
                      rows, classes))
    if rank:
        names = [n for n in rank["order"] if n in rank["names"]]
        idx = [rank["names"].index(n) for n in names]
        out.append("<h3>Bradley-Terry strengths (&plusmn; 1 s.e.)</h3>")
        out.append(svg_error_bars(names, [rank["scores"][i] for i in idx], [rank["stderr"][i] for i in idx]))
    if run.exists(f"{d}/train/curves.json"):
        out.append("<h3>Training</h3>" + _start_note(run, d) + _curves(run.read_json(f"{d}/train/curves.json")))
    if rank and not rank["parents"]:
        kept = ("there is no best agent yet" if rank["best"] is None else
                f"the best agent is still {_e(rank['best'])}, from {_e(rank.get('best_folder', 'before'))}")
        out.append(f'<p class="note">Every candidate of this iteration failed in training: {kept}.</p>'
                   "<h4>Feedback to the next iteration (the next prompt's)</h4>"
                   f"<pre class='wrap'>{_e(run.file(f'{d}/feedback.txt').read_text())}</pre>")
    elif rank:
        best = rank["best"]
        clips = sorted(p.relative_to(run.path) for p in run.file(f"{d}/videos").glob(f"{best}-*"))
        out.append(f"<h3>The best agent, {_e(best)}</h3>")
        out.append(_videos([(str(p), p.stem) for p in clips]))
        out.append("<h4>Feedback to the next iteration (the next prompt's)</h4>"
                   f"<pre class='wrap'>{_e(run.file(f'{d}/feedback.txt').read_text())}</pre>")
    if run.exists(f"{d}/judge.json"):
        out.append(_judged(run, run.read_json(f"{d}/judge.json")))
    if run.exists(f"{d}/judge_stats.json"):
        st = run.read_json(f"{d}/judge_stats.json")
        bias = ("it gave no decisive answer, so its position bias is unknown" if st["position_bias"] is None else
                f"it picked the clip shown first in {100 * st['position_bias']:.0f}% of its decisive answers (50% is "
                "no position bias)")
        out.append(f'<p class="note">VLM judge (so far in the run): {st["pairs"]} pairs, {st["skipped"]} skipped, '
                   f'{st["disagreements"]} where the two orders disagreed (ties); {bias}.</p>')
    if run.exists(f"{d}/tune.json"):
        out.append(_tuned(run.read_json(f"{d}/tune.json")))
    if refused:
        out.append("<h3>Refused samples and repairs</h3>" + _table(
            ["sample", "repair", "stage", "line", "error"],
            [[a["sample"] + 1, a["repair"], _e(a["stage"]), _e(a.get("line")), f"<pre>{_e(a['error'])}</pre>"]
             for a in refused]))
    out.append("<h3>Sources</h3>")
    for c in candidates:
        source = run.file(f"{d}/candidates/{c['name']}.py").read_text(encoding="utf-8")
        if previous_best and c["name"] != previous_best[0]:
            body = f"<p class='note'>diff against the previous best, {_e(previous_best[0])}</p>" \
                   f"<pre>{_diff(previous_best[1], source)}</pre>"
        else:
            body = f"<pre>{_e(source)}</pre>"
        out.append(f"<details><summary>{_e(c['name'])} ({_e(c['origin'])})</summary>{body}</details>")
    if rank and rank["best"] is not None:
        best = rank["best"]
        folder = rank.get("best_folder", f"{d}/candidates")
        previous_best = (best, run.file(f"{folder}/{best}.py").read_text(encoding="utf-8"))
    return "".join(out), previous_best


def _tuned(t: dict) -> str:
    """The weight-tuning stage: what it did and each weight before and after."""
    if not t.get("defaults"):
        return f'<h3>Weight tuning</h3><p class="note">Skipped: {_e(t.get("reason", ""))}.</p>'
    held = ("" if t["heldout_accuracy_before"] is None else
            f" Held-out ({t['heldout_pairs']} pairs): accuracy {t['heldout_accuracy_before']:.3f} &rarr; "
            f"{t['heldout_accuracy_after']:.3f}, log-likelihood per pair {t['heldout_loglik_before']:.3f} &rarr; "
            f"{t['heldout_loglik_after']:.3f}.")
    outcome = (f"carried into the next iteration as <b>{_e(t['program'])}</b>" if t["program"] else
               "the defaults are kept")
    limits = t.get("limits") or {}

    def kept(name: str) -> str:  # the range a weight was tuned within (the offline proposer's rules)
        least, most = limits.get(name, (None, None))
        return ("" if least is None and most is None else f"at least {least:.4g}" if most is None
                else f"at most {most:.4g}" if least is None else f"{least:.4g} to {most:.4g}")

    rows = [[_e(k), f"{v:.4g}", f"{t['params'][k]:.4g}", f"{t['params'][k] / v:.2f}x" if v else "-", kept(k)]
            for k, v in t["defaults"].items()]
    rules = (" Tuned within the offline proposer's rules: a price the task names never falls and a place's "
             "pay never rises." if limits else "")
    for band in t.get("bands") or ():
        over = " + ".join(f"{c:g} &times; {_e(k)}" for k, c in band["denominator"].items())
        ratio = (sum(c * t["params"][k] for k, c in band["numerator"].items())
                 / sum(c * t["params"][k] for k, c in band["denominator"].items()))
        rules += (f" {_e(' + '.join(band['numerator']))} kept within {band['least']:.3g}-{band['most']:.3g} times "
                  f"{over} (a rear-end's price in seconds of the pay for progress): {ratio:.3g} tuned.")
    return (f"<h3>Weight tuning ({_e(t['method'])})</h3><p>{_e(t['candidate'])}: {_e(t['reason'])}; "
            f"{outcome}.{held}{rules}</p>" + _table(["weight", "program", "tuned", "change", "kept within"], rows))


def _start_note(run: RunDir, d: str) -> str:
    """Where stage d's runs started from (its train/start.json), as a note; "" from scratch."""
    if not run.exists(f"{d}/train/start.json"):
        return ""
    start = run.read_json(f"{d}/train/start.json")
    hold = start.get("actor_hold_epochs", 0)
    held = (f" For its first {hold} epochs after the warm-up the actor and temperature were held while the "
            "critic learnt the run's reward." if hold else "")
    if "pretrained" in start:
        return (f'<p class="note">Every run trained on from the agent pretrained on {_e(start["pretrained"])} '
                "with its seed (its networks and temperature; <a href='#pretrain'>pretraining</a>), not from "
                f"scratch.{held}</p>")
    return (f'<p class="note">Every run trained on from the agent of iteration {start["iteration"]}\'s '
            f'best, {_e(start["candidate"])} (warm start: its networks and temperature), not from scratch.'
            f'{held}</p>')


def _pretrain(run: RunDir) -> str:
    if not run.exists("pretrain/train/curves.json"):
        return ""
    curves = run.read_json("pretrain/train/curves.json")
    steps = curves["epochs"] * curves["env_steps_per_epoch"]
    name = curves["runs"][0]["candidate"]
    failed = [r["seed"] for r in curves["runs"] if r["failed"]]
    return (f'<h2 id="pretrain">Pretraining</h2><p>Before the first iteration, the library reward '
            f"<b>{_e(name)}</b> trained one agent per seed for {steps:,} env steps; the iterations' runs and the "
            "final job's start from them.</p>"
            + (f'<p class="note">Failed in training: seed(s) {failed}.</p>' if failed else "")
            + _curves(curves))


def _curves(curves: dict) -> str:
    labels = [f"{r['candidate']} s{r['seed']}" for r in curves["runs"]]
    as_floats = lambda rows: [[float(v) for v in row] for row in rows]  # noqa: E731 ("nan" is stored as a string)
    progress = dict(zip(labels, as_floats(curves["progress"]), strict=True))
    reward = dict(zip(labels, as_floats(curves["reward"]), strict=True))
    return (svg_lines(progress, xlabel="epoch", ylabel="progress (m/step)")
            + svg_lines(reward, xlabel="epoch", ylabel="own reward per step"))


def _judged(run: RunDir, records: list[dict], limit: int = 40) -> str:
    from jaxrace.rewards.preferences import PreferenceStore

    with PreferenceStore(run.file("preferences.sqlite")) as store:
        clips = {c.id: c for c in store.clips()}
    rows = []
    for r in records[:limit]:
        a, b = clips[r["first"]], clips[r["second"]]
        rows.append([_e(a.candidate), _e(b.candidate), f"race {a.race}, {a.start / 10:.0f} s", _e(r["label"]),
                     _e(r.get("judge", "")), _e(r["rationale"])])
    more = f'<p class="note">and {len(records) - limit} more</p>' if len(records) > limit else ""
    return (f"<h3>Judged pairs ({len(records)})</h3>"
            + _table(["first", "second", "clip", "verdict", "judge", "rationale"], rows) + more)


def _trial_cell(trial: dict, run: int) -> str:
    """One final run's time trial (alone, two laps): its best lap against the reference, its course-outs."""
    t = trial["trials"][run]
    lap = (f"{t['best_lap']:.2f} s ({100 * (t['best_lap'] / trial['reference_lap'] - 1):+.1f}%)"
           if t["best_lap"] is not None else "no full lap")
    return f"{lap}, {t['course_outs']} out{'s' if t['course_outs'] != 1 else ''}"


def _draws(runs: list[dict], races: list[list[dict]], kept: dict | None, agents: dict[str, int],
           trial: dict | None) -> str:
    """Every training draw of the final job's rewards (final_seeds > 1): what each scored on the selection
    races and in the final races, which one is the reward's agent."""
    from jaxrace.design.loop import race_summary

    rows, classes = [], []
    for r, run in enumerate(runs):
        score = "-" if kept is None else _num(float(kept["task_score"][r]))
        rows.append([_e(run["candidate"]), run["seed"], score, *_race_cells(race_summary([races[r]]))]
                    + ([_trial_cell(trial, r)] if trial else []) + ["failed" if run["failed"] else ""])
        classes.append("best" if agents[run["candidate"]] == r else "")
    return ("<h3>Training draws</h3><p>Each reward trained once per seed on a key of its own; its agent (marked, "
            "and in the table above) is the draw whose kept checkpoint scored best on the selection races, "
            "never on the final races. The draws of a reward differ in their training keys (with pretraining, "
            "each started from the pretrained agent of its seed, or of seed 0 past the seeds pretrained).</p>"
            + _table(["reward", "seed", "selection task score", *RACE_HEADER,
                      *(["time trial: best lap, course-outs"] if trial else []), ""], rows, classes))


def _training_notes(config) -> str:
    """What a reader of the final section must know about how its agents were trained (empty if nothing)."""
    out = []
    if config.actor_average:
        out.append(f"<p>Every agent raced in this run is a moving average of its actor's parameters (policy "
                   f"averaging: {config.actor_average:g} of the way to the actor after each update); the actor "
                   f"itself drove the training envs.</p>")
    if config.actor_cvar < 1.0:
        out.append(f"<p>The actors were trained risk-averse: each maximised the mean of the lowest "
                   f"{config.actor_cvar:.0%} of its critic's return quantiles (their CVaR), not the mean of all "
                   f"of them.</p>")
    return "".join(out)


def _kept_note(kept: dict, runs: list[dict]) -> str:
    """What the final job kept of each run (final/train/kept.json) and how it chose."""
    chosen = ", ".join(f"{_e(r['candidate'])} (seed {r['seed']}): epoch {epoch}" for r, epoch in
                       zip(runs, kept["epoch"], strict=True))
    averaged = kept.get("averaged_policies", 1)  # (run directories before weight averaging lack it)
    what = (f"the mean of the parameters of each run's last {averaged} judged policies (weight averaging)"
            if averaged > 1 else "each run's policy")
    return (f"<p>Each agent is its run's best checkpoint by the task: every {kept['every_chunks']} chunk(s) of "
            f"training {what} raced {kept['races']} times on fields of its own, and the races were scored as "
            f"the scripted judge scores a clip. Kept: {chosen}.</p>")


def _pick_note(pick: dict) -> str:
    """How the judge chose the loop's agent among the finalists (final/pick.json)."""
    scores = ", ".join(f"{_e(n)} {pick['scores'][pick['finalists'].index(n)]:+.2f} &plusmn; "
                       f"{pick['stderr'][pick['finalists'].index(n)]:.2f}"
                       + (" (failed)" if pick["failed"][n] else "") for n in pick["order"])
    return (f"<p>The judge compared the {len(pick['finalists'])} finalists on each of their {pick['races']} final "
            f"races ({pick['games']} games). Bradley-Terry: {scores}. The loop's agent is "
            f"<b>{_e(pick['pick'])}</b>" + ("" if pick["games"] else ", the search's best: the judge gave no "
                                               "verdict") + ".</p>")


def _final(run: RunDir) -> str:
    from jaxrace.design.loop import NOTHING_TO_TRAIN, final_agents, loop_agent, race_summary

    if not run.exists("final/race/metrics.json"):
        nothing = run.exists("log.txt") and f"final: {NOTHING_TO_TRAIN}" in run.file("log.txt").read_text()
        return f'<h2 id="final">Final agent</h2><p class="note">{NOTHING_TO_TRAIN if nothing else "not run yet"}</p>'
    from jaxrace.rewards.library import LIBRARY

    metrics = run.read_json("final/race/metrics.json")
    runs = metrics["runs"]
    agents = final_agents(run.path)  # each reward's agent: its picked draw (its one run with final_seeds 1)
    names = list(agents)
    trial = run.read_json("final/trial.json") if run.exists("final/trial.json") else None
    kept = run.read_json("final/train/kept.json") if run.exists("final/train/kept.json") else None
    rows = []
    for name in names:
        s = race_summary([metrics["races"][agents[name]]])
        rows.append([_e(name), *_race_cells(s), _num(s["finished"], "{:.0%}")]
                    + ([_trial_cell(trial, agents[name])] if trial else []))
    ref = metrics.get("reference_lap")
    agent = loop_agent(run.path)
    pick = run.read_json("final/pick.json") if run.exists("final/pick.json") else None
    loop = [n for n in names if n not in LIBRARY]
    who = ("The loop's finalists (the last iteration's best, in Bradley-Terry's order)" if len(loop) > 1
           else "The winner (first, when an iteration produced one)")
    out = ['<h2 id="final">Final agent against the library rewards</h2>',
           f"<p>{who}" + (" and the library rewards, trained on the same budget" if len(loop) < len(names) else "")
           + (f", each trained {len(runs) // len(names)} times (its agent the draw below)" if len(runs) > len(names)
              else "")
           + f", raced {len(metrics['races'][0])} times each from the back of the grid against the built-in AI"
           + (f" (reference lap {ref:.2f} s)" if ref else "") + "."
           + (" The loop's agent is marked." if agent else " The judge has not yet picked the loop's agent.")
           + "</p>",
           _table(["reward", *RACE_HEADER, "finished", *(["time trial: best lap, course-outs"] if trial else [])],
                  rows, ["best" if name == agent else "" for name in names])]
    if pick is not None:
        out.append(_pick_note(pick))
    if len(runs) > len(names):
        out.append(_draws(runs, metrics["races"], kept, agents, trial))
    out.append(_incidents(run, names, [runs[agents[n]] for n in names], [metrics["races"][agents[n]] for n in names]))
    if kept is not None:
        out.append(_kept_note(kept, runs))
    out.append(_training_notes(run.config()))
    out.append(_start_note(run, "final"))
    if run.exists("final/train/curves.json"):
        out.append(_curves(run.read_json("final/train/curves.json")))
    # (a `.tmp-` file is one that a killed render left half-written)
    videos = sorted(p.relative_to(run.path) for p in run.file("final/videos").glob("[!.]*"))
    out.append(_videos([(str(p), p.stem) for p in videos]))
    return "".join(out)


def build_report(run: RunDir) -> str:
    config = run.config()
    stages = {name: info for name, info in run.stages().items() if name != "report"}  # this page's own writing
    parts = [f"<h1>jaxrace reward design</h1><p><b>Task:</b> {_e(config.task)}</p>",
             f"<p>Preset <b>{_e(config.preset)}</b>, LLM <b>{_e(config.llm)}</b>, judge <b>{_e(config.judge)}</b>, "
             f"track <b>{_e(config.track)}</b>, {config.iterations} iterations of M={config.m}, N={config.n}, "
             f"{config.seeds} seed(s). Run directory <code>{_e(run.path.resolve())}</code>.</p>"]
    # every iteration begun, retried ones included (a retry adds one after the configured ones)
    iterations = list(itertools.takewhile(lambda k: run.exists(f"iter{k}/candidates.json"), itertools.count(1)))
    iterations = iterations or list(range(1, config.iterations + 1))
    nav = " | ".join(f'<a href="#iter{k}">iteration {k}</a>' for k in iterations)
    if run.exists("pretrain/train/curves.json"):
        nav = f'<a href="#pretrain">pretraining</a> | {nav}'
    parts.append(f"<p>{nav} | <a href='#final'>final agent</a> | <a href='#time'>time and tokens</a></p>")
    if run.exists("bootstrap/races.json"):
        b = run.read_json("bootstrap/races.json")
        blind = sum(b.get("blind", ()))  # (a run made before blind drivers has no such key)
        careless = f", {blind} of them blind to the other cars," if blind else ""
        parts.append(f"<h2>Bootstrap preferences</h2><p>{len(b['names'])} races of the built-in AI driving the ego "
                     f"car with varied skill and aggression{careless} gave {b['pairs']} judged clip pairs before the "
                     "first iteration, so TAC can filter from iteration 1.</p>")
    parts.append(_pretrain(run))
    previous = None
    for k in iterations:
        section, previous = _iteration(run, k, previous)
        parts.append(section)
    parts.append(_final(run))
    tokens = _tokens_by_stage(run)
    cell = lambda name: (f"{tokens[name][0]:,}{'*' if tokens[name][1] else ''}" if name in tokens  # noqa: E731
                         else "0")
    compiling = lambda info: round(info.get("compile_seconds", 0.0), 1)  # noqa: E731 (absent in older runs)
    attempts = lambda info: info.get("attempts", 1)  # noqa: E731 (absent in older runs)
    rows = [[_e(name) + (f" ({attempts(info)} attempts)" if attempts(info) > 1 else ""), round(info["seconds"], 1),
             compiling(info), cell(name)] for name, info in stages.items()]
    unfinished = {name: info for name, info in run.unfinished().items() if name not in stages and name != "report"}
    rows += [[f"{_e(name)} (unfinished: {attempts(info)} attempt{'s' if attempts(info) > 1 else ''}, last seen "
              f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(info['alive']))})", round(info["seconds"], 1),
              compiling(info), cell(name)] for name, info in unfinished.items()]
    stages = {**stages, **unfinished}
    total = sum(info["seconds"] for info in stages.values())
    total_compile = sum(compiling(info) for info in stages.values())
    all_tokens = sum(t for t, _ in tokens.values())
    estimated = any(e for _, e in tokens.values())
    parts.append('<h2 id="time">Time and tokens per stage</h2>'
                 + _table(["stage", "seconds", "of which compiling", "LLM tokens"],
                          rows + [["<b>total</b>", round(total, 1), round(total_compile, 1),
                                   f"{all_tokens:,}{'*' if estimated else ''}"]])
                 + ('<p class="note">A stage of several attempts was stopped and resumed; its time adds them '
                    "all, a stopped attempt's up to the run's last sign of life in it.</p>"
                    if any(attempts(info) > 1 for info in stages.values()) else "")
                 + ('<p class="note">An unfinished stage was under way when this page was written, or was stopped; '
                    "the same command resumes it.</p>" if unfinished else "")
                 + ('<p class="note">* estimated at 4 characters a token: the offline proposer is not an LLM and '
                    "counts none.</p>" if estimated else ""))
    parts.append(f"<details><summary>Configuration</summary><pre>{_e(json.dumps(config.to_dict(), indent=1))}"
                 "</pre></details>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>jaxrace: {_e(config.task)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")


def _tokens_by_stage(run: RunDir) -> dict[str, tuple[int, bool]]:
    """{loop stage: (prompt + completion tokens, any estimated)} from the run's LLM record (generator and judge)."""
    path = run.file("llm/record.jsonl")
    out: dict[str, tuple[int, bool]] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a torn last line of a killed run
            continue
        reply = entry.get("reply") or {}
        stage = str(entry.get("stage") or "")
        stage = "bootstrap" if stage.startswith("bootstrap") else stage
        used = int(reply.get("prompt_tokens") or 0) + int(reply.get("completion_tokens") or 0)
        tokens, estimated = out.get(stage, (0, False))
        out[stage] = (tokens + used, estimated or bool(reply.get("estimated")))
    return out


def write_report(run: RunDir | str | Path) -> Path:
    """Writes report.html into the run directory and returns its path."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    return run.write_text("report.html", build_report(run))
