"""`hrl eval`: every task under every named harness, one table row per harness; with `--baseline` the same for a
second model, before and after side by side. A run directory `hrl report` reads (`runners/report/evaluation.py`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hrl.cli.errors import infra_exit
from hrl.cli.options import (
    ConfigOption,
    EngineOption,
    IncludeUncheckedOption,
    LimitOption,
    OtlpOption,
    RecipeOption,
    TimeBudgetOption,
)
from hrl.cli.output import emit, err, say
from hrl.runners.errors import UsageError

if TYPE_CHECKING:
    from hrl.config import RunConfig

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


_Model = Annotated[
    str, typer.Option("--model", "-m", help="HF model id, local dir, hrl:tiny-agent, or a LoRA checkpoint.")
]
_Tasks = Annotated[
    Path | None, typer.Option(help="SWE-bench-format tasks (JSONL, JSON, Parquet) or a folder of Harbor tasks.")
]
_Baseline = Annotated[
    str, typer.Option(help="Also run this model on the same episodes: before/after and delta columns.")
]
_RunDir = Annotated[
    Path | None, typer.Option("--run-dir", help="Where the traces and the table go (default: runs/eval-TIME).")
]
_Json = Annotated[
    bool, typer.Option("--json", help="Print the rows (intervals, pass@k, infra, agreement) as a JSON array.")
]


def eval_(
    agents: Annotated[str, typer.Option("--agents", "-a", help="Comma-separated harnesses (see `hrl agents ls`).")],
    model: _Model = "",
    recipe: RecipeOption = "",
    tasks: _Tasks = None,
    baseline: _Baseline = "",
    limit: LimitOption = 0,
    n: Annotated[int, typer.Option("-n", min=1, help="Episodes per task and harness (as in `hrl rollout`).")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes running at once (within one harness).")] = 4,
    sandbox: Annotated[str, typer.Option(help="docker | local (default: the recipe's).")] = "",
    engine: EngineOption = "",
    time_budget: TimeBudgetOption = 0,
    run_dir: _RunDir = None,
    config: ConfigOption = None,
    as_json: _Json = False,
    include_unchecked: IncludeUncheckedOption = False,
    otlp: OtlpOption = "",
) -> None:
    """Run every task under every harness named in --agents (K episodes per task each), through the recording
    proxy, and print one row per harness: success rate with its Wilson 95 % interval (infrastructure failures left
    out of it and counted apart), mean reward, pass@K with -n K, mean turns, tokens per episode, failures by reason;
    below, how often each pair of harnesses agrees per task. With --baseline, the baseline model runs the same
    episodes first, and the row shows both and the delta. The traces go to a run directory (one step per model ×
    harness) that `hrl report` renders with the same table."""
    from hrl.cli.config import materialize_model
    from hrl.runners.preflight import check_empty_folder, check_harnesses, check_model, say_context
    from hrl.runners.recipe_config import hide_from_sandboxes, require_model, resolve
    from hrl.runners.report.evaluation import eval_plan

    names = _agents(agents)
    if not recipe and tasks is None:
        raise UsageError("give --recipe or --tasks", hint="e.g. `hrl eval --agents mini-swe-agent --recipe demo`")
    flags = {"engine": engine, "model": model, "tasks": str(tasks) if tasks else None, "rollout.sandbox": sandbox,
             "rollout.time_budget_s": time_budget or None, "telemetry.otlp_endpoint": otlp}  # fmt: skip
    cfg = resolve(recipe, config or [], flags, tasks=str(tasks) if tasks else None)
    model, engine, task_file = require_model(cfg, "hrl:tiny-agent"), cfg.engine, cfg.tasks
    check_harnesses(cfg, names, engine, task_file, say)
    run_dir = run_dir or Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    check_empty_folder(run_dir, "--run-dir")
    models = [materialize_model(m) for m in ([baseline] if baseline else []) + [model]]
    for m in models:
        check_model(m)
    for name in names:
        say_context(name, models[-1], cfg, say)
    cfg.rollout.labelled()
    hide_from_sandboxes(cfg, task_file, run_dir)
    plan = eval_plan(names, model, baseline, models, task_file, n)
    plan["include_unchecked"] = include_unchecked
    rc = asyncio.run(_run(cfg, plan, engine, task_file, limit, concurrency, run_dir, as_json))
    raise typer.Exit(rc)


def _open_run(
    settings: RunConfig, plan: dict[str, Any], engine: str, task_file: str, limit: int, run_dir: Path
) -> tuple[Any, list[Any]]:
    """The run directory, created with the config and the plan, and the tasks it runs: the first `limit` of those
    `hrl tasks check` found ok (the plan records their checks and count)."""
    from hrl.runners.report.evaluation import open_eval_run
    from hrl.runners.tasks.task_checks import checked_task_file

    task_list, checks = checked_task_file(task_file, plan["include_unchecked"], limit, say)  # `hrl tasks check`
    plan["task_checks"], plan["task_count"] = checks.to_dict(), len(task_list)
    run = open_eval_run(settings.dump(), plan, run_dir)
    per_cell = len(task_list) * plan["n"]
    say(f"{len(plan['cells'])} harness runs × {per_cell} episodes ({len(task_list)} tasks × {plan['n']}), engine "
        f"{engine}, run {settings.rollout.run_id} → {run_dir}")  # fmt: skip
    return run, task_list


def _progress(quiet: bool) -> Any:
    """A progress bar per harness run on stderr, shown on a terminal unless `quiet`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=err, disable=quiet or not err.is_terminal, transient=False)


def _advancing(progress: Any, bar: Any) -> Callable[[str, dict[str, Any]], None]:
    """The handler of episode events that advances `bar` at each episode's end."""

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "episode_end":
            progress.advance(bar)

    return on_event


async def _run(
    settings: RunConfig, plan: dict[str, Any], engine: str, task_file: str, limit: int, concurrency: int,
    run_dir: Path, as_json: bool,
) -> int:  # fmt: skip
    from hrl.runners.placement.runs import evaluate
    from hrl.runners.report.evaluation import eval_rows, eval_table_text
    from hrl.runners.report.run import load_run

    run, task_list = _open_run(settings, plan, engine, task_file, limit, run_dir)
    per_cell = len(task_list) * plan["n"]
    progress = _progress(quiet=as_json)
    bars = {c["iteration"]: progress.add_task(f"{c['agent']} · {c['model']}", total=per_cell) for c in plan["cells"]}

    def done(cell: dict[str, Any]) -> None:
        if progress.disable:
            say(f"{cell['agent']} · {cell['model']}: {per_cell} episodes done")

    on_cell = lambda c: _advancing(progress, bars[c["iteration"]])  # noqa: E731
    traces = await evaluate(settings, plan, engine, task_list, run, concurrency, shown=progress, on_cell=on_cell,
                            cell_done=done, say=say)  # fmt: skip
    if traces is None:
        return 130
    rows = eval_rows(load_run(run_dir)) or []
    emit(rows, as_json=as_json, human=eval_table_text(rows, plan))
    say(f"traces in {run_dir}; `hrl report {run_dir}` renders them with this table")
    return infra_exit(traces, settings.max_error_rate, str(run_dir))
