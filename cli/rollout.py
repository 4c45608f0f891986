"""`hrl rollout`: run agent CLIs on tasks in sandboxes through the recording proxy; one trace per episode."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.errors import infra_exit
from hrl.cli.options import OtlpOption
from hrl.cli.output import err
from hrl.runners.errors import UsageError

__all__ = ["EPILOG", "LOCAL_WARNING", "rollout"]

EPILOG = """Examples:

  hrl rollout --agent mini-swe-agent --recipe swe -n 2

  hrl rollout --agent opencode --tasks my_swebench.jsonl --model Qwen/Qwen2.5-Coder-7B-Instruct --engine vllm

  hrl rollout --agent qwen-code --recipe swe --sandbox local --concurrency 2 --out traces.jsonl

  hrl rollout --agent mini-swe-agent --recipe demo --model runs/demo/checkpoints/v0010   # a LoRA checkpoint

  hrl rollout --agent codex --recipe swe --json | jq .reward

  hrl rollout --recipe langgraph-react -n 2                 # a white-box LangGraph agent (docs/whitebox.md)

  hrl rollout --recipe demo --placement ray -c placement.engine_replicas=2   # on Ray (docs/ray.md)
"""


LOCAL_WARNING = (
    "Warning: --sandbox local runs the agent as your user on this machine{how}: host secrets stay out of its "
    "environment{hidden}, but it can read the rest of what you can. Use --sandbox docker for agents you do not "
    "trust (docs/security.md)."
)


def local_warning() -> str:
    """The one-line warning for --sandbox local, saying whether bubblewrap isolates it on this machine. Raises
    SandboxUnavailableError where bubblewrap is installed but cannot set a sandbox up (`isolation`)."""
    from hrl.sandboxes.local import ISOLATION_VAR, isolation

    if isolation():
        return LOCAL_WARNING.format(how=" in a bubblewrap namespace", hidden=", it reaches no network but the "
                                    "proxy, and the task file, the run's traces, other sandboxes and hrl's processes "
                                    "are hidden from it")  # fmt: skip
    why = (
        f"{ISOLATION_VAR}=0" if os.environ.get(ISOLATION_VAR) == "0" else "no bubblewrap: `apt-get install bubblewrap`"
    )
    return LOCAL_WARNING.format(how=f", unisolated ({why})", hidden=", but it "
                                "shares the host's network and the task file (hidden tests, gold patch) is "
                                "readable")  # fmt: skip


def rollout(
    agent: Annotated[
        str,
        typer.Option(
            "--agent",
            "-a",
            help="Agent CLI (see `hrl agents ls`), or a white-box Python agent python:MODULE:FUNCTION | FILE.py:FUNCTION "
            "(default: the recipe's). Several, comma-separated (A,B): every task runs under each.",
        ),
    ] = "",
    recipe: Annotated[str, typer.Option(help="Recipe name or YAML path giving tasks, model and settings.")] = "",
    tasks: Annotated[Path | None, typer.Option(help="SWE-bench-format tasks (JSONL or Parquet).")] = None,
    n: Annotated[int, typer.Option("-n", min=1, help="Episodes per task.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes running at once.")] = 4,
    sandbox: Annotated[str, typer.Option(help="docker | local.")] = "",
    model: Annotated[
        str, typer.Option("--model", "-m", help="HF model id, local dir, or a LoRA checkpoint (adapter dir).")
    ] = "",
    engine: Annotated[str, typer.Option(help="embedded | vllm | URL of a running vLLM server.")] = "",
    limit: Annotated[int, typer.Option(min=0, help="Use only the first N tasks; 0 = all.")] = 0,
    time_budget: Annotated[float, typer.Option(min=0, help="Seconds per agent run; 0 = the recipe's.")] = 0,
    out: Annotated[Path, typer.Option(help="Append one trace per episode here.")] = Path("traces.jsonl"),
    config: Annotated[list[str] | None, typer.Option("-c", "--config", help="key=value override or YAML.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Stream one JSON summary line per episode.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also say what is cached and ready.")] = False,
    placement: Annotated[
        str,
        typer.Option(
            help="local: everything in this process; ray: engine replicas, a node agent and a proxy shard per node "
            "on a Ray cluster (placement.address, default a local one; placement.engine_replicas). docs/ray.md."
        ),
    ] = "",
    otlp: OtlpOption = "",
    include_unchecked: Annotated[
        bool, typer.Option("--include-unchecked", help="Also the tasks `hrl tasks check` found not ok.")
    ] = False,
    run_id: Annotated[
        str,
        typer.Option(
            "--run-id",
            help="Label every sandbox of this run hrl.run=ID (docker ps --filter label=hrl.run=ID finds them); "
            "default: a fresh id, printed at the start.",
        ),
    ] = "",
) -> None:
    """Run K episodes per task with at most M at once; append each episode's trace to --out as it finishes. Tasks
    `hrl tasks check` found not ok are left out (and listed) unless --include-unchecked."""
    from hrl.cli.checks import check_model, check_placement, check_run, check_writable, harnesses, say_context
    from hrl.cli.config import (
        apply_overrides,
        hide_from_sandboxes,
        load_recipe_config,
        materialize_model,
        run_config,
        run_settings,
    )
    from hrl.runners.tasks.regrade import archive_dir
    from hrl.runners.whitebox.harness import is_python_agent

    if not recipe and tasks is None:
        raise UsageError("give --recipe or --tasks", hint="e.g. `hrl rollout --agent mini-swe-agent --recipe demo`")
    cfg = apply_overrides(load_recipe_config(recipe) if recipe else {}, config or [], engine=engine, tasks=tasks)
    roll = cfg.setdefault("rollout", {})
    if placement:
        cfg.setdefault("placement", {})["kind"] = placement
    if otlp:
        cfg.setdefault("telemetry", {})["otlp_endpoint"] = otlp
    check_placement(cfg)
    roll["agent"] = agent or roll.get("agent") or ""
    if not roll["agent"]:
        raise UsageError("give --agent (the recipe names none)", hint="`hrl agents ls` lists the agents")
    model, engine, task_file = run_settings(
        cfg, sandbox, time_budget, model, engine, tasks, "hrl:tiny (a tiny local model)"
    )
    check_run(cfg, engine, task_file)  # names and paths first: nothing has started yet
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory", hint="give a file for the traces, e.g. --out traces.jsonl")
    check_writable(out, "--out")  # its folder also takes the archive (for `hrl regrade`) and the media
    if roll.get("sandbox", "docker") == "local" and not is_python_agent(roll["agent"]):
        err.print(local_warning(), markup=False)
    model = materialize_model(model)
    check_model(model)
    for name in harnesses(cfg):
        say_context(name, model, cfg)
    roll["run_id"] = run_id or roll.get("run_id") or f"hrl-{uuid.uuid4().hex[:8]}"
    archive = archive_dir(out)  # tasks and long diffs for `hrl regrade`: hidden from every sandbox, as --out is
    archive.mkdir(parents=True, exist_ok=True)  # a folder hides only once it exists
    hide_from_sandboxes(cfg, task_file, out, archive)
    run = run_config(cfg)
    rc = asyncio.run(
        _run(run, model, engine, task_file, n, concurrency, limit, out, as_json, verbose, include_unchecked)
    )
    raise typer.Exit(rc)


async def _run(
    run: Any,
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
    from hrl.runners.live import live_status, traces_live_file
    from hrl.runners.placement import Episode, engine_version, placed
    from hrl.runners.tasks.checks import filter_checked
    from hrl.runners.tasks.task import load_tasks

    task_list, checks = filter_checked(load_tasks(task_file), include_unchecked)  # as `hrl train` and `hrl eval`
    task_list = task_list[: limit or None]
    err.print(checks.line(), markup=False)
    several = list(run.rollout.agents)
    names = several if len(several) > 1 else [""]  # "": the run's one harness
    episodes = [Episode(t, k, 0, name) for t in task_list for name in names for k in range(n)]
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
            sys.stdout.write(
                json.dumps({"episode": data["episode"], "reward": data["reward"], "failure_reason": data["failure"]})
                + "\n"
            )
            sys.stdout.flush()
        fails = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "ok")
        err.print(
            f"[{done}/{len(episodes)}] {data['episode']}: reward {'-' if data['reward'] is None else data['reward']} "
            f"{data['failure'] or ''}"
            f"  (running {len(running)}{'; failures: ' + fails if fails else ''})",
            markup=False,
            highlight=False,
        )

    who = (
        f" × {len(names)} harnesses), agents {', '.join(names)}" if len(names) > 1 else f"), agent {run.rollout.agent}"
    )
    err.print(
        f"{len(episodes)} episodes ({len(task_list)} tasks × {n}{who}, "
        f"sandbox {_sandbox_of(run)}, engine {engine}, run {run.rollout.run_id}",
        markup=False,
    )
    say = lambda line: err.print(line, markup=False)  # noqa: E731
    if run.rollout.warm_sandboxes > len(episodes):  # a recipe's pool sized for training: no more than this run uses
        run.rollout.warm_sandboxes = len(episodes)
    async with placed(run, model, engine, concurrency, on_event=on_event, say=say, verbose=verbose) as here:
        if callable(keep := getattr(getattr(here, "publisher", None), "keep_media", None)):
            keep(out.parent / "media")  # images' bytes beside the traces, where report, inspect and training read them
        try:
            with live_status(traces_live_file(out), lambda: engine_version(here)):  # `hrl top OUT` watches it
                traces = await here.run(episodes, out, concurrency)
        except asyncio.CancelledError:
            err.print(f"interrupted: traces of finished and cancelled episodes are in {out}", markup=False)
            return 130
    return _summary(traces, out, run.max_error_rate)


def _sandbox_of(run: Any) -> str:
    """Where episodes run: a white-box agent gets a sandbox only with a verifier that grades one."""
    from hrl.runners.whitebox.harness import is_python_agent, needs_sandbox, resolve_mode

    agent, verifier = run.rollout.agent, run.verifier or None
    if not is_python_agent(agent):
        return str(run.rollout.sandbox)
    mode, why = resolve_mode(run.rollout.mode, agent, verifier, run.rollout.python)
    where = str(run.rollout.sandbox) if needs_sandbox(agent, verifier) else "none"
    if where != "none" and mode == "inprocess":
        return where
    return f"{where} (agent {'in process' if mode == 'inprocess' else 'in a subprocess'}: {why})"


def _summary(traces: list[dict[str, Any]], out: Path, max_error_rate: float) -> int:
    """The closing lines: the mean over rewarded episodes (and how many had none), the failures by reason, and
    exit 3 with the reason when infrastructure failures are above `max_error_rate`."""
    rewards = [t["reward"] for t in traces if t["reward"] is not None]
    mean = f"mean reward {sum(rewards) / len(rewards):.3f} over {len(rewards)}" if rewards else "no rewarded episode"
    unrewarded = len(traces) - len(rewards)
    reasons = Counter(str(t["failure_reason"]) for t in traces if t["failure_reason"])
    failed = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none"
    err.print(f"done: {len(traces)} traces in {out}; {mean}" + (f" ({unrewarded} without a reward)" if unrewarded
              else "") + f"; failures: {failed}", markup=False)  # fmt: skip
    return infra_exit(traces, max_error_rate, str(out))
