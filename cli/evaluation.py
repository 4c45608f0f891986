"""`hrl eval`: every task under every named harness, one table row per harness; with `--baseline` the same for a
second model, before and after side by side. A run directory `hrl report` reads (`runners/report/evaluation.py`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.errors import infra_exit
from hrl.cli.options import OtlpOption
from hrl.cli.output import emit, err
from hrl.runners.errors import UsageError

__all__ = ["EPILOG", "eval_"]

EPILOG = """Examples:

  hrl eval --agents mini-swe-agent,codex,opencode --recipe demo --model hrl:tiny-agent --limit 4

  hrl eval --agents mini-swe-agent,opencode --recipe demo --model runs/demo/checkpoints/v0010 --baseline hrl:tiny-agent

  hrl eval --agents opencode,codex,claude-code --tasks terminal-bench/ --model Qwen/Qwen3-8B --engine vllm -n 2

  hrl eval --agents mini-swe-agent,aider --tasks my_swebench.jsonl --model M --run-dir runs/eval-aider --json

  hrl report runs/eval-aider          # the same table, in the HTML report
"""


def _agents(text: str) -> list[str]:
    names = [a.strip() for a in text.split(",") if a.strip()]
    if not names:
        raise UsageError("give --agents A,B,…", hint="`hrl agents ls` lists the agents")
    if len(set(names)) != len(names):
        raise UsageError(f"--agents names a harness twice: {text}", hint="name each harness once")
    return names


def eval_(
    agents: Annotated[str, typer.Option("--agents", "-a", help="Comma-separated harnesses (see `hrl agents ls`).")],
    model: Annotated[
        str, typer.Option("--model", "-m", help="HF model id, local dir, hrl:tiny-agent, or a LoRA checkpoint.")
    ] = "",
    recipe: Annotated[str, typer.Option(help="Recipe name or YAML path giving tasks, model and settings.")] = "",
    tasks: Annotated[
        Path | None, typer.Option(help="SWE-bench-format tasks (JSONL, JSON, Parquet) or a folder of Harbor tasks.")
    ] = None,
    baseline: Annotated[
        str, typer.Option(help="Also run this model on the same episodes: before/after and delta columns.")
    ] = "",
    limit: Annotated[int, typer.Option(min=0, help="Use only the first N tasks; 0 = all.")] = 0,
    n: Annotated[int, typer.Option("-n", min=1, help="Episodes per task and harness (as in `hrl rollout`).")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes running at once (within one harness).")] = 4,
    sandbox: Annotated[str, typer.Option(help="docker | local (default: the recipe's).")] = "",
    engine: Annotated[str, typer.Option(help="embedded | vllm | URL of a running vLLM server.")] = "",
    time_budget: Annotated[float, typer.Option(min=0, help="Seconds per agent run; 0 = the recipe's.")] = 0,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="Where the traces and the table go (default: runs/eval-TIME).")
    ] = None,
    config: Annotated[list[str] | None, typer.Option("-c", "--config", help="key=value override or YAML.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the rows (intervals, pass@k, infra, agreement) as a JSON array.")
    ] = False,
    include_unchecked: Annotated[
        bool, typer.Option("--include-unchecked", help="Also the tasks `hrl tasks check` found not ok.")
    ] = False,
    otlp: OtlpOption = "",
) -> None:
    """Run every task under every harness named in --agents (K episodes per task each), through the recording
    proxy, and print one row per harness: success rate with its Wilson 95 % interval (infrastructure failures left
    out of it and counted apart), mean reward, pass@K with -n K, mean turns, tokens per episode, failures by reason;
    below, how often each pair of harnesses agrees per task. With --baseline, the baseline model runs the same
    episodes first, and the row shows both and the delta. The traces go to a run directory (one step per model ×
    harness) that `hrl report` renders with the same table."""
    from hrl.cli.checks import check_model, check_run, grade_by_source, say_context
    from hrl.cli.config import apply_overrides, hide_from_sandboxes, load_recipe_config, materialize_model, run_settings

    names = _agents(agents)
    if not recipe and tasks is None:
        raise UsageError("give --recipe or --tasks", hint="e.g. `hrl eval --agents mini-swe-agent --recipe demo`")
    cfg = apply_overrides(load_recipe_config(recipe) if recipe else {}, config or [], engine=engine, tasks=tasks)
    if otlp:
        cfg.setdefault("telemetry", {})["otlp_endpoint"] = otlp
    model, engine, task_file = run_settings(cfg, sandbox, time_budget, model, engine, tasks, "hrl:tiny-agent")
    roll = cfg["rollout"]
    grade_by_source(cfg, task_file)
    roll.pop("agents", None)  # --agents names the harnesses (a recipe's rollout.agents is for training)
    for name in names:  # every harness's name, sandbox and the tasks, before anything starts
        check_run({**cfg, "rollout": {**roll, "agent": name, "agents": []}}, engine, task_file)
    run_dir = run_dir or Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir {run_dir} is a file", hint="give a new folder for the run, or leave --run-dir out")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"--run-dir {run_dir} is not empty", hint="give a new --run-dir (or leave it out)")
    models = [materialize_model(m) for m in ([baseline] if baseline else []) + [model]]
    for m in models:
        check_model(m)
    for name in names:
        say_context(name, models[-1], cfg)
    roll["run_id"] = roll.get("run_id") or f"hrl-{uuid.uuid4().hex[:8]}"
    hide_from_sandboxes(cfg, task_file, run_dir)
    plan = _plan(names, model, baseline, models, task_file, n)
    plan["include_unchecked"] = include_unchecked
    rc = asyncio.run(_run(cfg, plan, engine, task_file, limit, concurrency, run_dir, as_json))
    raise typer.Exit(rc)


def _plan(names: list[str], model: str, baseline: str, paths: list[str], task_file: str, n: int) -> dict[str, Any]:
    """The cells, baseline first: (iteration, agent, model, role); models as named and as resolved."""
    roles = [("baseline", baseline, paths[0])] if baseline else []
    roles.append(("model", model, paths[-1]))
    cells = [
        {"iteration": i, "agent": agent, "model": named, "model_path": path, "role": role}
        for i, (role, named, path, agent) in enumerate((r, m, p, a) for r, m, p in roles for a in names)
    ]
    return {"model": model, "baseline": baseline or None, "agents": names, "tasks": task_file, "n": n, "cells": cells}


async def _run(
    cfg: dict[str, Any], plan: dict[str, Any], engine: str, task_file: str, limit: int, concurrency: int,
    run_dir: Path, as_json: bool,
) -> int:  # fmt: skip
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hrl.cli.config import run_config
    from hrl.runners.live import live_status
    from hrl.runners.placement import Episode, engine_version, local_placement
    from hrl.runners.report.evaluation import eval_rows, eval_table_text, write_plan
    from hrl.runners.report.run import load_run
    from hrl.runners.rundir import RunDir
    from hrl.runners.tasks.checks import filter_checked
    from hrl.runners.tasks.task import load_tasks
    from hrl.runners.telemetry.otlp import exporting

    settings = run_config(cfg)
    task_list, checks = filter_checked(load_tasks(task_file), plan["include_unchecked"])  # `hrl tasks check`
    task_list, plan["task_checks"] = task_list[: limit or None], checks.to_dict()
    err.print(checks.line(), markup=False)
    plan["task_count"] = len(task_list)
    run = RunDir(run_dir)
    run.create({**cfg, "model": plan["model"], "eval": {k: v for k, v in plan.items() if k != "cells"}})
    write_plan(run.path, plan)
    per_cell = len(task_list) * plan["n"]
    err.print(
        f"{len(plan['cells'])} harness runs × {per_cell} episodes ({len(task_list)} tasks × {plan['n']}), engine "
        f"{engine}, run {cfg['rollout']['run_id']} → {run_dir}",
        markup=False,
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    progress = Progress(*columns, console=err, disable=as_json or not err.is_terminal, transient=False)
    traces: list[dict[str, Any]] = []
    say = lambda line: err.print(line, markup=False)  # noqa: E731
    provider = "openai-compatible" if "://" in engine else engine
    serving: list[Any] = []  # the placement serving now (one model after the other), for the live status's version
    with (
        exporting(settings.telemetry, run_id=settings.rollout.run_id, provider=provider, phase="eval", say=say),
        progress,
        live_status(run.path, lambda: engine_version(serving[-1]) if serving else None) as live,  # `hrl top RUN`
    ):
        bars = {
            c["iteration"]: progress.add_task(f"{c['agent']} · {c['model']}", total=per_cell) for c in plan["cells"]
        }
        for path in dict.fromkeys(c["model_path"] for c in plan["cells"]):
            cells = [c for c in plan["cells"] if c["model_path"] == path]
            async with local_placement(settings, path, engine, harnesses=[c["agent"] for c in cells]) as here:
                serving.append(here)
                for cell in cells:
                    bar = bars[cell["iteration"]]

                    def on_event(kind: str, data: dict[str, Any], bar: Any = bar) -> None:
                        if kind == "episode_end":
                            progress.advance(bar)

                    roll = settings.rollout.model_copy(update={"agent": cell["agent"], "agents": []})
                    await here.prepare(on_event, roll)
                    episodes = [Episode(t, k, cell["iteration"]) for t in task_list for k in range(plan["n"])]
                    try:
                        traces += await here.run(episodes, run.trace_file(cell["iteration"]), concurrency)
                    except asyncio.CancelledError:
                        err.print(f"interrupted: the traces so far are in {run_dir}", markup=False)
                        live.end_as = "interrupted"
                        return 130
                    if progress.disable:
                        err.print(f"{cell['agent']} · {cell['model']}: {per_cell} episodes done", markup=False)
    rows = eval_rows(load_run(run_dir)) or []
    emit(rows, as_json=as_json, human=eval_table_text(rows, plan))
    err.print(f"traces in {run_dir}; `hrl report {run_dir}` renders them with this table", markup=False)
    return infra_exit(traces, settings.max_error_rate, str(run_dir))
