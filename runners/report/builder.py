"""`hrl report`: one self-contained HTML file for a run — plots over steps and distributions (inline SVG, drawn
here) and a searchable table of traces whose rows open each trace's conversation, calls and tool events (a little
inline JS over an embedded JSON blob and inert `<template>`s). Nothing is fetched at view time.

The report adapts to its input: charts over steps only where there are training steps (a `hrl train` run
directory; a rollout's trace files have none), the model and policy-version cards from the run or else from the
traces, the conversations decoded with the model's tokenizer when this machine has it (token counts otherwise).

Element ids are stable (tests and users link to them): `plot-reward`, `plot-failures`, `plot-latency-steps`,
`plot-latency`, `plot-prompt-tokens`, `plot-response-tokens`, `plot-staleness`, `plot-versions`,
`plot-train-*`; an `hrl eval` run's harness table is `#eval`; the table of traces is `#traces`, each row
`tr.trace[data-trace=ID]`; `#trace=ID` in the URL opens one.
"""

from __future__ import annotations

import json
import time
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from hrl.runners.conversation import decoding_template
from hrl.runners.durable import write_atomically
from hrl.runners.metrics import harness_rewards, trace_metrics
from hrl.runners.report.conversation import MAX_LINES, conversation_templates, thumbnails
from hrl.runners.report.evaluation import eval_rows, eval_table_html
from hrl.runners.report.run import Run, iteration_summaries, load_run, trainer_version
from hrl.runners.report.svg import histogram, line_chart, stacked_bars
from hrl.runners.rundir import is_run_dir
from hrl.runners.summary import describe_calls, media_text, summarize_trace

__all__ = ["build_report", "has_steps", "render_report", "report_summary", "write_report"]

Trace = dict[str, Any]
_TRAIN_PLOTS = (("train/loss", "loss"), ("train/mismatch_kl", "mismatch-kl"), ("train/grad_norm", "grad-norm"))


def _series(iters: list[dict[str, Any]], key: str) -> list[float | None]:
    return [v if isinstance(v := it["metrics"].get(key), int | float) else None for it in iters]


def _stats(iters: list[dict[str, Any]], key: str, *stats: str) -> list[tuple[str, list[float | None]]]:
    """(stat, values per step) for a distribution metric; "mean" is the bare name."""
    return [(s, _series(iters, key if s == "mean" else f"{key}/{s}")) for s in stats]


def _column(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def _harness_plots(iters: list[dict[str, Any]], xs: list[float]) -> list[str]:
    """Reward per step of each harness, when the run trained across several (`rollout.agents`)."""
    names = sorted({name for it in iters for name in harness_rewards(it["metrics"])})
    if len(names) < 2:
        return []
    series = [(name, _series(iters, f"harness/{name}/reward")) for name in names]
    return [line_chart("plot-reward-harness", "Reward per step, per harness", xs, series)]


def smoothed(values: list[float | None], alpha: float = 0.4) -> list[float | None]:
    """An exponential moving average (None where the value is missing), debiased at the start like TensorBoard's
    smoothing, so the first point is the first value and not a pull toward 0."""
    out: list[float | None] = []
    avg = weight = 0.0
    for v in values:
        if v is None:
            out.append(None)
            continue
        avg, weight = (1 - alpha) * avg + alpha * v, (1 - alpha) * weight + alpha
        out.append(avg / weight)
    return out


def _reward_plot(iters: list[dict[str, Any]], evals: dict[int, dict[str, Any]]) -> str:
    """Training reward per step with its smoothed line and its range, the training traces' success rate (the
    tasks' own pass/fail, which a shaped reward does not move), and held-out success where evaluated (the policy of
    step k: `hrl.train.heldout`), on one step axis."""
    steps = sorted({float(it["iteration"]) for it in iters} | {float(k) for k in evals})
    at = {float(it["iteration"]): i for i, it in enumerate(iters)}

    def on_axis(values: list[float | None]) -> list[float | None]:
        return [values[at[x]] if x in at else None for x in steps]

    mean = _series(iters, "trace/reward")
    series = [("mean", on_axis(mean)), ("smoothed", on_axis(smoothed(mean)))]
    series += [(stat, on_axis(v)) for stat, v in _stats(iters, "trace/reward", "min", "max")]
    success = _series(iters, "trace/success")  # the tasks' own pass/fail rate, apart from a shaped reward
    if any(v is not None for v in success):
        series.append(("success", on_axis(success)))
    if evals:
        held = [evals[int(x)].get("eval/success") if int(x) in evals and x == int(x) else None for x in steps]
        series.append(("held-out success", held))
    return line_chart("plot-reward", "Reward per step", steps, series)


def _step_plots(iters: list[dict[str, Any]], evals: dict[int, dict[str, Any]] | None = None) -> list[str]:
    """Charts over steps: reward (and held-out success), failures, latency percentiles, staleness, versions,
    trainer numbers."""
    evals = evals or {}
    xs = [float(it["iteration"]) for it in iters]
    reasons = sorted({r for it in iters for r in it["failures"]})
    failures = [(r, [float(it["failures"].get(r, 0)) for it in iters]) for r in reasons]
    latency = [
        ("trace p50", _series(iters, "trace/latency_s/p50")),
        ("trace p95", _series(iters, "trace/latency_s/p95")),
        ("llm p50", _series(iters, "trace/llm_latency_s/p50")),
        ("tool p50", _series(iters, "trace/tool_latency_s/p50")),
    ]
    versions = [
        ("oldest token", _series(iters, "trace/policy_version_min/min")),
        ("newest token", _series(iters, "trace/policy_version_max/max")),
        ("trainer", _series(iters, "train/version")),
        ("env", _series(iters, "trace/env_version")),
    ]
    charts = [
        _reward_plot(iters, evals),
        *_harness_plots(iters, xs),
        stacked_bars("plot-failures", "Failures by reason per step", xs, failures, zero="no failures"),
        line_chart("plot-latency-steps", "Latency per step (s)", xs, latency),
        line_chart(
            "plot-staleness", "Staleness per step (versions)", xs, _stats(iters, "trace/staleness", "mean", "max")
        ),
        line_chart("plot-versions", "Versions per step", xs, versions),
    ]
    return charts + [
        line_chart(f"plot-train-{slug}", key, xs, [(key, _series(iters, key))])
        for key, slug in _TRAIN_PLOTS
        if any(v is not None for v in _series(iters, key))
    ]


def _distribution_plots(rows: list[dict[str, Any]]) -> list[str]:
    """Histograms over every trace of the run: latencies and tokens."""
    latency = [
        ("trace", _column(rows, "latency_s")),
        ("llm", _column(rows, "llm_s")),
        ("tool", _column(rows, "tool_s")),
    ]
    per_call = [float(n) for r in rows for n in r["call_response_tokens"]]
    return [
        histogram("plot-latency", "Latency per trace, all steps", latency, "seconds"),
        histogram(
            "plot-prompt-tokens", "Prompt tokens per trace", [("per trace", _column(rows, "prompt_tokens"))], "tokens"
        ),
        histogram(
            "plot-response-tokens",
            "Response tokens",
            [("per trace", _column(rows, "response_tokens")), ("per call", per_call)],
            "tokens",
        ),
    ]


def has_steps(run: Run) -> bool:
    """Are the run's iterations training steps (a `hrl train` run directory)? Trace files, one per iteration, and an
    `hrl eval` run's cells are not: charts over them would draw steps that never happened."""
    return is_run_dir(run.path) and eval_rows(run) is None


def _plots(
    iters: list[dict[str, Any]], rows: list[dict[str, Any]], evals: dict[int, dict[str, Any]], steps: bool
) -> str:
    if not steps:
        return "\n".join(_distribution_plots(rows))
    step = _step_plots(iters, evals)
    # reading order: outcome (reward, failures), time, tokens, versions, trainer
    return "\n".join([*step[:3], *_distribution_plots(rows), *step[3:]])


# ---- the trace table ---------------------------------------------------------------------------------------


def _trace_row(iteration: int, trace: Trace, version: int | None) -> dict[str, Any]:
    """The table's numbers for one trace (its summary + contract metrics) and the details a click opens."""
    s, m = summarize_trace(trace), trace_metrics(trace, version)
    calls = describe_calls(trace)
    return {
        "iteration": iteration,
        "trace_id": str(trace["trace_id"]),
        "task_id": s["task_id"],
        "agent": (trace.get("agent") or {}).get("name"),
        "outcome": s["failure_reason"] or s["status"],
        "flags": _flags(s),
        "reward": s["reward"],
        "success": None if s["success"] is None else "yes" if s["success"] else "no",
        "turns": s["turns"],
        "calls": s["calls"],
        "branches": s["branches"],
        "prompt_tokens": s["prompt_tokens"],
        "response_tokens": s["response_tokens"],
        "latency_s": s["duration_s"],
        "llm_s": s["llm_s"],
        "tool_s": m["trace/tool_latency_s"],
        "versions": s["versions"],
        "staleness": m.get("trace/staleness"),
        "call_response_tokens": [c["response_tokens"] for c in calls],
        "detail": {
            "calls": calls,
            "tools": trace.get("tools") or [],
            "reward_info": trace.get("reward_info") or {},
            "session": trace.get("session"),
            "group_id": trace.get("group_id"),
            "model": (trace.get("model") or {}).get("name"),
            "env": trace.get("env") or {},
            "agents": trace.get("agents") or [],  # the tree of agents, root first (empty without sub-agents)
        },
    }


def _flags(s: dict[str, Any]) -> str | None:
    """What a trace is flagged for: `degenerate`, tool calls that did not parse, media the proxy dropped; None when
    nothing."""
    flags = ["degenerate"] if s["degenerate"] else []
    flags += [f"{s['tool_parse_errors']} tool parse errors"] if s["tool_parse_errors"] else []
    flags += [f"dropped media: {media_text(s['dropped_media'])}"] if s["dropped_media"] else []
    return ", ".join(flags) or None


def short_id(trace_id: str) -> str:
    """A trace id as the table shows it: whole up to 13 characters, else its first 8 and last 4 around an ellipsis
    (a 32-character id would wrap into a tall, narrow column; the cell's title holds it whole)."""
    return trace_id if len(trace_id) <= 13 else f"{trace_id[:8]}…{trace_id[-4:]}"


def _cell(value: Any, cls: str = "", title: str | None = None) -> str:
    if value is None:
        text = "–"
    elif isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    elif isinstance(value, list):
        text = ",".join(f"v{v}" for v in value) or "–"
    else:
        text = str(value)
    sort = value if isinstance(value, int | float) else ""
    title = title or (text if isinstance(value, str) else None)  # a cell cut to fit shows it whole on hover
    shown = short_id(text) if cls == "id" else text
    hover = f' title="{escape(title)}"' if title else ""
    return f'<td class="{cls}" data-sort="{escape(str(sort))}"{hover}>{escape(shown)}</td>'


_COLUMNS = (
    ("trace", "trace_id"),
    ("iter", "iteration"),
    ("task", "task_id"),
    ("agent", "agent"),
    ("outcome", "outcome"),
    ("flags", "flags"),
    ("reward", "reward"),
    ("success", "success"),
    ("turns", "turns"),
    ("calls", "calls"),
    ("branches", "branches"),
    ("prompt tok", "prompt_tokens"),
    ("resp tok", "response_tokens"),
    ("latency s", "latency_s"),
    ("llm s", "llm_s"),
    ("tool s", "tool_s"),
    ("versions", "versions"),
    ("staleness", "staleness"),
)


def _table(rows: list[dict[str, Any]], unit: str, files: dict[int, str]) -> str:
    """The table of traces; its `iteration` column is headed by what an iteration is here (`unit`: step, file, cell),
    and a trace file's name is its cell's title (`files`: by iteration)."""
    head = "".join(
        f'<th data-col="{i}">{escape(unit if key == "iteration" else name)}</th>'
        for i, (name, key) in enumerate(_COLUMNS)
    )
    body = []
    for n, r in enumerate(rows):
        outcome_cls = "ok" if r["outcome"] == "ok" else "bad"
        cells = "".join(
            _cell(r[key], outcome_cls if key == "outcome" else "id" if key == "trace_id" else "",
                  files.get(r["iteration"]) if key == "iteration" else None)
            for _, key in _COLUMNS
        )  # fmt: skip
        body.append(
            f'<tr class="trace" tabindex="0" data-n="{n}" data-trace="{escape(r["trace_id"])}" '
            f'data-outcome="{escape(str(r["outcome"]))}" data-iter="{r["iteration"]}">{cells}</tr>'
        )
    return f'<table id="traces"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _options(values: list[Any], labels: dict[Any, str] | None = None) -> str:
    """`<option>`s of `values`, each shown as itself, or as `value · label` where `labels` has one."""
    labels = labels or {}
    return "".join(
        f'<option value="{escape(str(v))}">{escape(f"{v} · {labels[v]}" if v in labels else str(v))}</option>'
        for v in values
    )


def _unit(run: Run, steps: bool) -> str:
    """What one of the run's iterations is: a training step, a trace file given, or an evaluation's cell."""
    if steps:
        return "step"
    return "cell" if eval_rows(run) is not None else "file"


# ---- the page ----------------------------------------------------------------------------------------------


def _models(run: Run) -> str:
    """The run's configured model, else every model its traces name (the first three, then how many more)."""
    named = run.config.get("model") or (run.config.get("trainer") or {}).get("model")
    if named:
        return str(named)
    names = list(dict.fromkeys(str(n) for _, t in run.traces if (n := (t.get("model") or {}).get("name"))))
    return ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "") if names else "–"


def _policy_version(run: Run, rows: list[dict[str, Any]]) -> str:
    """The run's current policy version, else the versions that sampled its traces' tokens (`v3` or `v3–v5`)."""
    if "version" in run.state:
        return str(run.state["version"])
    versions = sorted({v for r in rows for v in r["versions"]})
    if not versions:
        return "–"
    return f"v{versions[0]}" if len(versions) == 1 else f"v{versions[0]}–v{versions[-1]}"


def _headline(run: Run, iters: list[dict[str, Any]], rows: list[dict[str, Any]], steps: bool) -> str:
    fails = sum(1 for r in rows if r["outcome"] != "ok")
    rewards = [r["reward"] for r in rows if isinstance(r["reward"], int | float)]
    graded = [r["success"] for r in rows if r["success"] is not None]
    facts = [
        ("steps", str(len(iters))) if steps else ("files", str(len(run.iterations))),
        ("traces", str(len(rows))),
        ("failed", str(fails)),
        ("mean reward", f"{sum(rewards) / len(rewards):.3g}" if rewards else "–"),
        ("success", f"{graded.count('yes')}/{len(graded)}" if graded else "–"),
        ("policy version", _policy_version(run, rows)),
        ("model", _models(run)),
    ]
    return "".join(f'<div class="fact"><b>{escape(v)}</b><span>{escape(k)}</span></div>' for k, v in facts)


def _template(run: Run, model: str | None) -> tuple[Any, str | None]:
    """The tokenizer that decodes the run's conversations (`model`, else the run's or the traces' model), and why
    there is none (None when there is). UsageError when an explicit `model` cannot be loaded."""
    return decoding_template([t for _, t in run.traces], run.config, model)


def _note(note: str | None) -> str:
    if note is None:
        return (f'<p class="muted">Texts longer than {MAX_LINES} lines are cut: '
                "<code>hrl inspect FILE --trace ID --full</code> shows them whole.</p>")  # fmt: skip
    return (f'<p class="note">Conversations show token counts only: {escape(note)} '
            "(<code>hrl report … --model DIR</code> decodes them with that tokenizer).</p>")  # fmt: skip


def _images(run: Run) -> dict[str, str]:
    """Thumbnails of the images the run's calls saw, read from `media/<sha256>` beside each trace file."""
    stored: dict[str, Path] = {}
    for it in run.iterations:
        for t in it.traces if it.trace_file is not None else []:
            for c in t.get("calls") or []:
                for m in c.get("media") or []:
                    stored.setdefault(m["sha256"], it.trace_file.parent / "media" / m["sha256"])  # type: ignore[union-attr]
    return thumbnails(stored) if stored else {}


def render_report(run: Run, model: str | None = None) -> str:
    """The HTML document for a loaded run; `model`: the tokenizer its conversations are decoded with."""
    iters = iteration_summaries(run)
    steps = has_steps(run)
    versions = {it["iteration"]: trainer_version(it["metrics"]) for it in iters}
    rows = [_trace_row(i, t, versions.get(i)) for i, t in run.traces]
    template, note = _template(run, model)
    details = [{"id": r["trace_id"], **r["detail"]} for r in rows]
    data = json.dumps(details, separators=(",", ":"), default=str).replace("<", "\\u003c")
    outcomes = sorted({str(r["outcome"]) for r in rows}, key=lambda o: (o != "ok", o))
    unit = _unit(run, steps)
    files = {it.index: it.trace_file.name for it in run.iterations if it.trace_file} if unit == "file" else {}
    parts = {
        "TITLE": escape(f"hrl report · {run.path.name}"),
        "RUN": escape(str(run.path)),
        "GENERATED": escape(time.strftime("%Y-%m-%d %H:%M:%S")),
        "HEADLINE": _headline(run, iters, rows, steps),
        "EVAL": eval_table_html(harnesses) if (harnesses := eval_rows(run)) else "",
        "PLOTS_TITLE": "Steps and distributions" if steps else "Distributions",
        "PLOTS_NOTE": ""
        if steps
        else '<p class="muted" id="no-steps">no training steps in this input: charts over steps are left out.</p>',
        "PLOTS": _plots(iters, rows, run.evals, steps),
        "NOTE": _note(note),
        "CONVERSATIONS": conversation_templates([t for _, t in run.traces], template, note, thumbs=_images(run)),
        "OUTCOMES": _options(outcomes),
        "UNIT": unit,
        "ITERATIONS": _options(sorted({r["iteration"] for r in rows}), files),
        "TABLE": _table(rows, unit, files),
        "DATA": data,
    }
    page = resources.files("hrl.runners.report").joinpath("template.html").read_text(encoding="utf-8")
    for key, value in parts.items():
        page = page.replace(f"<!--HRL:{key}-->", value)
    return page


def build_report(run_dir: str | Path) -> str:
    return render_report(load_run(run_dir))


def write_report(run: Run | str | Path, out: str | Path | None = None, model: str | None = None) -> Path:
    """Write the report of a run (or run dir) to `out` atomically; its path. Default: `<run>/report.html`, or
    beside a single trace file with the suffix .html. `model`: the tokenizer that decodes the conversations."""
    run = run if isinstance(run, Run) else load_run(run)
    default = run.path / "report.html" if run.path.is_dir() else run.path.with_suffix(".html")
    path = Path(out) if out is not None else default
    html = render_report(run, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, html)
    return path


def report_summary(run: Run, path: Path) -> dict[str, Any]:
    """What `hrl report` says of the report of `run` it wrote to `path`: {out, traces, steps, bytes}; the files whose
    last line a crash cut short (cut_lines), the traces whose requests lost media (dropped_media) and an `hrl eval`
    run's rows (eval), where there are any."""
    from hrl.runners.trace import dropped_media

    info: dict[str, Any] = {
        "out": str(path), "traces": len(run.traces), "steps": len(run.iterations), "bytes": path.stat().st_size
    }  # fmt: skip
    if run.cut_lines:
        info["cut_lines"] = run.cut_lines
    if media := sum(bool(dropped_media(t)) for _, t in run.traces):  # flagged in the table too
        info["dropped_media"] = media
    if (harnesses := eval_rows(run)) is not None:  # an `hrl eval` run: its table
        info["eval"] = harnesses
    return info
