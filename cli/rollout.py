"""`hrl rollout`: run agent CLIs on tasks in sandboxes through the recording proxy; one trace per episode."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

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
from hrl.cli.output import emit, say
from hrl.runners.errors import UsageError

__all__ = ["EPILOG", "rollout"]

EPILOG = """Examples:

  hrl rollout --agent mini-swe-agent --recipe swe -n 2

  hrl rollout --agent opencode --tasks my_swebench.jsonl --model Qwen/Qwen2.5-Coder-7B-Instruct --engine vllm

  hrl rollout --agent qwen-code --recipe swe --sandbox local --concurrency 2 --out traces.jsonl

  hrl rollout --agent mini-swe-agent --recipe demo --model runs/demo/checkpoints/v0010   # a LoRA checkpoint

  hrl rollout --agent codex --recipe swe --json | jq .reward

  hrl rollout --recipe langgraph-react -n 2                 # a white-box LangGraph agent (docs/whitebox.md)

  hrl rollout --recipe demo --placement ray -c placement.engine_replicas=2   # on Ray (docs/ray.md)
  hrl rollout --recipe demo --placement ray -c placement.engine_replicas=2 --dry-run   # what would start where
"""


_Agent = Annotated[
    str,
    typer.Option(
        "--agent",
        "-a",
        help="Agent CLI (see `hrl agents ls`), or a white-box Python agent python:MODULE:FUNCTION | FILE.py:FUNCTION "
        "(default: the recipe's). Several, comma-separated (A,B): every task runs under each.",
    ),
]
_Model = Annotated[
    str, typer.Option("--model", "-m", help="HF model id, local dir, or a LoRA checkpoint (adapter dir).")
]
_Placement = Annotated[
    str,
    typer.Option(
        help="local: everything in this process; ray: engine replicas, a node agent and a proxy shard per node "
        "on a Ray cluster (placement.address, default a local one; placement.engine_replicas). docs/ray.md."
    ),
]
_DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Resolve the recipe, -c and the flags as the run would and print what would start where (placement and "
        "cluster, engine replicas, node agents); start nothing, write nothing. This machine's Docker, vLLM, Ray and "
        "model files are not looked at.",
    ),
]
_RunId = Annotated[
    str,
    typer.Option(
        "--run-id",
        help="Label every sandbox of this run hrl.run=ID (docker ps --filter label=hrl.run=ID finds them); "
        "default: a fresh id, printed at the start.",
    ),
]


def rollout(
    agent: _Agent = "",
    recipe: RecipeOption = "",
    tasks: Annotated[Path | None, typer.Option(help="SWE-bench-format tasks (JSONL or Parquet).")] = None,
    n: Annotated[int, typer.Option("-n", min=1, help="Episodes per task.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes running at once.")] = 4,
    sandbox: Annotated[str, typer.Option(help="docker | local.")] = "",
    model: _Model = "",
    engine: EngineOption = "",
    limit: LimitOption = 0,
    time_budget: TimeBudgetOption = 0,
    out: Annotated[Path, typer.Option(help="Append one trace per episode here.")] = Path("traces.jsonl"),
    config: ConfigOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Stream one JSON summary line per episode (--dry-run: the plan, one object).")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also say what is cached and ready.")] = False,
    placement: _Placement = "",
    otlp: OtlpOption = "",
    include_unchecked: IncludeUncheckedOption = False,
    run_id: _RunId = "",
    dry_run: _DryRun = False,
) -> None:
    """Run K episodes per task with at most M at once; append each episode's trace to --out as it finishes. Tasks
    `hrl tasks check` found not ok are left out (and listed) unless --include-unchecked."""
    from hrl.cli.config import materialize_checked
    from hrl.runners.preflight import check_out_file, check_rollout, local_warning
    from hrl.runners.recipe_config import hide_from_sandboxes, resolve
    from hrl.runners.tasks.regrade import archive_dir
    from hrl.runners.whitebox.harness import is_python_agent

    if not recipe and tasks is None:
        raise UsageError("give --recipe or --tasks", hint="e.g. `hrl rollout --agent mini-swe-agent --recipe demo`")
    flags = {"engine": engine, "model": model, "tasks": str(tasks) if tasks else None, "rollout.agent": agent,
             "rollout.sandbox": sandbox, "rollout.time_budget_s": time_budget or None, "rollout.run_id": run_id,
             "placement.kind": placement, "telemetry.otlp_endpoint": otlp}  # fmt: skip
    settings = resolve(recipe, config or [], flags, tasks=str(tasks) if tasks else None)
    if dry_run:
        _print_plan(settings, concurrency, out, as_json)
        return
    check_rollout(settings, say)
    roll = settings.rollout
    check_out_file(out, "traces")  # its folder also takes the archive (for `hrl regrade`) and the media
    if roll.sandbox == "local" and not is_python_agent(roll.agent):
        say(local_warning())
    model = materialize_checked(settings)
    roll.labelled()
    archive = archive_dir(out)  # tasks and long diffs for `hrl regrade`: hidden from every sandbox, as --out is
    archive.mkdir(parents=True, exist_ok=True)  # a folder hides only once it exists
    hide_from_sandboxes(settings, settings.tasks, out, archive)
    engine, task_file = settings.engine, settings.tasks
    rc = asyncio.run(
        _run(settings, model, engine, task_file, n, concurrency, limit, out, as_json, verbose, include_unchecked)
    )
    raise typer.Exit(rc)


def _print_plan(settings: Any, concurrency: int, out: Path, as_json: bool) -> None:
    """`--dry-run`: what the rollout would start where (`runners.placement.plan`), after the checks that read the
    config alone (those of `check_rollout` that look at this machine are left to the run). Nothing is started."""
    from hrl.runners.placement.plan import check_names, describe, plan
    from hrl.runners.recipe_config import require_model

    if not ({"agent", "agents"} & settings.rollout.model_fields_set):
        raise UsageError("give --agent (the recipe names none)", hint="`hrl agents ls` lists the agents")
    require_model(settings, "hrl:tiny (a tiny local model)")
    check_names(settings)
    found = plan(settings, settings.model, settings.engine, concurrency, training=False)
    found["out"] = str(out)
    say("dry run: nothing was started or written")
    emit(found, as_json=as_json, human=describe(found))


async def _run(
    settings: Any,
    model: str,
    engine: str,
    task_file: str,
    n: int,
    concurrency: int,
    limit: int,
    out: Path,
    as_json: bool,
    verbose: bool,
    include_unchecked: bool = False,
) -> int:
    from hrl.runners.placement.runs import rollout_episodes, rollout_plan
    from hrl.runners.tasks.task_checks import checked_task_file

    task_list, _ = checked_task_file(task_file, include_unchecked, limit, say)  # as `hrl train` and `hrl eval`
    episodes, names = rollout_plan(settings, task_list, n)
    on_event = _episode_printer(len(episodes), as_json)
    _say_plan(settings, len(episodes), len(task_list), n, names, engine)
    traces = await rollout_episodes(settings, model, engine, episodes, out, concurrency, on_event=on_event, say=say,
                                    verbose=verbose)  # fmt: skip
    if traces is None:
        return 130
    return _summary(traces, out, settings.max_error_rate)


def _episode_printer(total: int, as_json: bool) -> Callable[[str, dict[str, Any]], None]:
    """The handler of episode events: a line on stderr per finished episode (its reward and failure, how many run,
    the failures so far) and, with `as_json`, its summary as a JSON line on stdout."""
    counts: Counter[str] = Counter()
    running: set[str] = set()

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "episode_start":
            running.add(data["episode"])
            return
        running.discard(data["episode"])
        counts[data["failure"] or "ok"] += 1
        done = sum(counts.values())
        if as_json:
            emit(
                {"episode": data["episode"], "reward": data["reward"], "failure_reason": data["failure"]}, as_json=True
            )
        fails = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "ok")
        say(f"[{done}/{total}] {data['episode']}: reward {'-' if data['reward'] is None else data['reward']} "
            f"{data['failure'] or ''}  (running {len(running)}{'; failures: ' + fails if fails else ''})")  # fmt: skip

    return on_event


def _say_plan(settings: Any, episodes: int, tasks: int, n: int, names: list[str], engine: str) -> None:
    """The opening line: how many episodes (tasks × n, × harnesses), the agents, sandbox, engine and run id."""
    from hrl.runners.whitebox.harness import sandbox_of

    who = (
        f" × {len(names)} harnesses), agents {', '.join(names)}"
        if len(names) > 1
        else f"), agent {settings.rollout.agent}"
    )
    say(
        f"{episodes} episodes ({tasks} tasks × {n}{who}, "
        f"sandbox {sandbox_of(settings.rollout, settings.verifier or None)}, engine {engine}, run {settings.rollout.run_id}"
    )


def _summary(traces: list[dict[str, Any]], out: Path, max_error_rate: float) -> int:
    """The closing lines: the mean over rewarded episodes (and how many had none), the failures by reason, and
    exit 3 with the reason when infrastructure failures are above `max_error_rate`."""
    rewards = [t["reward"] for t in traces if t["reward"] is not None]
    mean = f"mean reward {sum(rewards) / len(rewards):.3f} over {len(rewards)}" if rewards else "no rewarded episode"
    unrewarded = len(traces) - len(rewards)
    reasons = Counter(str(t["failure_reason"]) for t in traces if t["failure_reason"])
    failed = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none"
    say(f"done: {len(traces)} traces in {out}; {mean}" + (f" ({unrewarded} without a reward)" if unrewarded else "")
        + f"; failures: {failed}")  # fmt: skip
    return infra_exit(traces, max_error_rate, str(out))
