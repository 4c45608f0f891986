"""`hrl train`: the RL loop — rollouts with a real agent CLI, verification, GRPO update, publish, repeat."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hrl.cli.options import ConfigOption, OtlpOption
from hrl.cli.output import say
from hrl.runners.errors import UsageError

if TYPE_CHECKING:
    from hrl.config import RunConfig

__all__ = ["EPILOG", "train"]

EPILOG = """Examples:

  hrl train --recipe demo                                   # the CPU demo: tiny agent model, real CLI, minutes

  hrl train --recipe swe --agent mini-swe-agent --model Qwen/Qwen2.5-Coder-1.5B-Instruct --engine vllm --lora

  hrl train --recipe swe --async -c async.max_staleness=2 -c trainer.lr=5e-6

  hrl train --run-dir runs/swe-1 --resume                   # continue after a crash, same next version

  hrl train --recipe agents-sdk --iterations 2              # a white-box OpenAI Agents SDK agent with a handoff

  hrl train --recipe demo --agent mini-swe-agent,aider      # across two harnesses: curves per harness in the report
  hrl train --recipe demo --placement ray -c placement.engine_replicas=2   # rollouts on Ray (docs/ray.md)
  hrl train --recipe swe --placement ray -c placement.trainer=ray -c trainer.nproc=8 --dry-run   # starts nothing

  hrl train --recipe demo --serve --port 8100 --run-dir runs/online   # episodes come from clients (docs/online.md)
  hrl keys add fleet --run-dir runs/online                             # a client key for them
"""


def _resolve(recipe: str, overrides: list[str], flags: dict[str, Any]) -> RunConfig:
    """The run's config, typed and validated first (recipe, then `-c`, then flags; the rules across fields, such as
    an async buffer that cannot hold a batch, are the config's own), then the names, paths and keys the run needs,
    checked before anything starts."""
    from hrl.cli.config import materialize_checked, materialize_model
    from hrl.runners.preflight import check_teacher, check_training
    from hrl.runners.recipe_config import resolve

    cfg = resolve(recipe, overrides, flags)
    cfg.recipe = recipe
    from hrl.runners.placement.plan import check_plan  # after `resolve`: its refusals import nothing heavy

    check_plan(cfg)  # where the trainer's ranks go, as --dry-run refuses it
    check_training(cfg, say)
    materialize_checked(cfg)
    if cfg.distill.enabled:  # the teacher made real as the model is, its tokenizer checked to be the student's
        if not cfg.distill.remote:
            cfg.distill.teacher = materialize_model(cfg.distill.teacher)
        check_teacher(cfg)
    return cfg


_Agent = Annotated[
    str,
    typer.Option(
        "--agent",
        "-a",
        help="Agent CLI, or python:MODULE:FUNCTION | FILE.py:FUNCTION (default: the recipe's). Several, "
        "comma-separated (A,B), train across harnesses: groups per task and harness.",
    ),
]
_Serve = Annotated[
    bool,
    typer.Option(
        "--serve",
        help="An online run: train on sessions clients run anywhere, over HTTP with client keys (hrl keys add), "
        "instead of episodes hrl starts (the async loop; docs/online.md).",
    ),
]
_Host = Annotated[str, typer.Option(help="With --serve (or --resume of an online run): the address to listen on.")]
_Port = Annotated[
    int, typer.Option(min=0, max=65535, help="With --serve (or --resume of an online run): the port; 0 = any free.")
]
_Placement = Annotated[
    str,
    typer.Option(
        help="local (default) | ray: engine replicas, a node agent and a proxy shard per node on a Ray cluster "
        "(placement.address, default a local one; placement.engine_replicas); the trainer stays here unless "
        "placement.trainer=ray. docs/ray.md."
    ),
]
_DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Resolve the recipe, -c and the flags as the run would, refuse what it would refuse from the config, "
        "and print what would start where (placement and cluster, engine replicas, node agents, the trainer's ranks, "
        "how weights reach the replicas, the run dir); start nothing, write nothing. This machine's Docker, vLLM, "
        "Ray and model files are not looked at.",
    ),
]
_Json = Annotated[bool, typer.Option("--json", help="With --dry-run: the plan as one JSON object.")]
_IncludeUnchecked = Annotated[
    bool,
    typer.Option(
        "--include-unchecked",
        help="Use every task, even those `hrl tasks check` found not ok (left out by default; unchecked ones are "
        "always used).",
    ),
]


def train(
    recipe: Annotated[str, typer.Option(help="Recipe name (`hrl recipes ls`) or YAML path.")] = "",
    agent: _Agent = "",
    model: Annotated[str, typer.Option("--model", "-m", help="HF model id or local dir (default: the recipe's).")] = "",
    engine: Annotated[str, typer.Option(help="embedded | vllm | URL (default: the recipe's).")] = "",
    lora: Annotated[bool, typer.Option("--lora", help="Train LoRA adapters (default).")] = False,
    full: Annotated[bool, typer.Option("--full", help="Train all weights.")] = False,
    use_async: Annotated[bool, typer.Option("--async", help="Asynchronous rollouts and updates.")] = False,
    iterations: Annotated[int, typer.Option(min=0, help="Training steps; 0 = the recipe's.")] = 0,
    sandbox: Annotated[str, typer.Option(help="docker | local (default: the recipe's).")] = "",
    run_dir: Annotated[Path | None, typer.Option(help="Run directory (default: runs/<recipe>-<time>).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --run-dir.")] = False,
    wandb: Annotated[bool, typer.Option("--wandb", help="Also log metrics to Weights & Biases.")] = False,
    otlp: OtlpOption = "",
    serve: _Serve = False,
    host: _Host = "127.0.0.1",
    port: _Port = 8100,
    placement: _Placement = "",
    config: ConfigOption = None,
    include_unchecked: _IncludeUnchecked = False,
    dry_run: _DryRun = False,
    as_json: _Json = False,
) -> None:
    """Train a model through the agent harness it is deployed with; one line per step, run dir for everything."""
    if as_json and not dry_run:
        raise UsageError("--json prints the --dry-run plan: it needs --dry-run", hint="hrl train ... --dry-run --json")
    if resume:
        fixed = {"--recipe": recipe, "--agent": agent, "--model": model, "--engine": engine, "--lora": lora,
                 "--full": full, "--async": use_async, "--sandbox": sandbox, "--placement": placement,
                 "-c": config, "--include-unchecked": include_unchecked, "--serve": serve}  # fmt: skip
        run, cfg = _resumed_run(run_dir, fixed, iterations, wandb, otlp)
    else:
        flags = {
            "model": model, "engine": engine, "rollout.agent": agent, "rollout.sandbox": sandbox,
            "trainer.mode": "full" if full else ("lora" if lora else None), "train.iterations": iterations or None,
            "train.wandb": wandb or None, "placement.kind": placement or None,
            "telemetry.otlp_endpoint": otlp or None, "online.enabled": serve or None,
            "async.enabled": (use_async or serve) or None,
        }  # fmt: skip
        run, cfg = (_planned_run if dry_run else _new_run)(recipe, run_dir, config or [], flags)
    if dry_run:
        _print_plan(run, cfg, resume, as_json)
        return
    with run.locked():
        if resume and cfg.dump() != run.config():
            run.save_config(cfg.dump())  # the extended run: a later plain --resume goes on to the new iteration count
        _start(run, cfg, resume, include_unchecked, (host, port))
    say(f"done. report: hrl report {run.path}    per-iteration summary: hrl inspect {run.path}\n"
        f"      a trace as a tree: hrl inspect {run.path} --trace <id>")  # fmt: skip


def _resumed_run(
    run_dir: Path | None, fixed: dict[str, Any], iterations: int, wandb: bool, otlp: str
) -> tuple[Any, RunConfig]:
    """The run in `run_dir` to resume and its own config, checked again; `fixed` maps the flags that cannot change
    on a resume to their values (any given is refused), and only `iterations`, `wandb` and `otlp` change it."""
    from hrl.runners.rundir import RunDir

    if run_dir is None:
        raise UsageError(
            "--resume needs --run-dir of an existing run",
            hint="`hrl train --run-dir DIR --resume` continues the run in DIR; without --resume a new run starts",
        )
    run = RunDir(run_dir)
    run.check_resumable()  # a run stopped before its first step resumes too
    if given := [name for name, value in fixed.items() if value]:
        raise UsageError(
            f"{', '.join(given)} cannot change on --resume: the run goes on with its own config.json",
            hint="only --iterations (to extend the run), --wandb, --otlp, --host and --port may be given with "
            "--resume (an online run serves again)",
        )
    from hrl.runners.preflight import check_gpu_plan
    from hrl.runners.recipe_config import resumed

    cfg = resumed(run.config(), iterations, wandb, otlp)  # a run written before a rule existed is refused now
    check_gpu_plan(cfg)
    return run, cfg


def _new_run(recipe: str, run_dir: Path | None, overrides: list[str], flags: dict[str, Any]) -> tuple[Any, RunConfig]:
    """A new run (`run_dir`, default runs/<recipe>-<time>; created later, under its lock) and its config from
    `recipe`, `overrides` and `flags` (`_resolve`); the folder is checked before the model is built."""
    from hrl.runners.preflight import check_writable

    run = _new_run_dir(recipe, run_dir)
    check_writable(run_dir or Path("runs"), "--run-dir")  # before the model is built
    return run, _resolve(recipe, overrides, flags)


def _new_run_dir(recipe: str, run_dir: Path | None) -> Any:
    """The `RunDir` a new run would take (`run_dir`, default runs/<recipe>-<time>), refused where a run is already."""
    from hrl.runners.rundir import RunDir

    if not recipe:
        raise UsageError("give --recipe (or --run-dir with --resume)", hint="e.g. `hrl train --recipe demo`")
    if run_dir is not None:
        RunDir(run_dir).check_new()  # before anything is written: its config.json stays the run's own
    return RunDir(run_dir or Path("runs") / f"{Path(recipe).stem}-{time.strftime('%Y%m%d-%H%M%S')}")


def _planned_run(
    recipe: str, run_dir: Path | None, overrides: list[str], flags: dict[str, Any]
) -> tuple[Any, RunConfig]:
    """`--dry-run`: the run and config `_new_run` would make, resolved the same way (`resolve`, the config's own
    rules), with the checks that read the config alone (`_resolve`'s others look at this machine: Docker, vLLM, Ray,
    the model's files, which a plan for a cluster need not find where it is read). Nothing is built or written."""
    from hrl.runners.preflight import check_gpu_plan, check_honest_sampling, check_online_settings, check_turn_credit
    from hrl.runners.recipe_config import require_model, resolve

    run = _new_run_dir(recipe, run_dir)
    cfg = resolve(recipe, overrides, flags)
    cfg.recipe = recipe
    from hrl.runners.placement.plan import check_names, check_plan  # after `resolve`, as in `_resolve`

    check_plan(cfg)
    check_gpu_plan(cfg)
    check_online_settings(cfg)
    require_model(cfg, "hrl:tiny (a tiny local model)")
    check_honest_sampling(cfg)
    check_names(cfg)
    check_turn_credit(cfg)
    return run, cfg.for_training()


def _print_plan(run: Any, cfg: RunConfig, resume: bool, as_json: bool) -> None:
    """What the run would start where (`runners.placement.plan`), on stdout; nothing is started."""
    from hrl.cli.output import emit
    from hrl.runners.placement.plan import describe, plan

    found = plan(cfg, cfg.model, cfg.engine, cfg.loop().concurrency)
    found.update(recipe=cfg.recipe, run_dir=str(run.path), resume=resume)
    say("dry run: nothing was started or written")
    emit(found, as_json=as_json, human=describe(found))


def _start(
    run: Any, cfg: RunConfig, resume: bool, include_unchecked: bool = False, address: tuple[str, int] = ("", 0)
) -> None:
    """Create the run (or clean up after its interrupted process) and train; the caller holds the run's lock."""
    from hrl.cli.progress import step_printer, summary
    from hrl.runners.leftovers import remove_leftovers
    from hrl.runners.recipe_config import hide_from_sandboxes
    from hrl.train.run import train_run

    if not resume:
        run.check_new()  # again under the lock: another process may have started a run there meanwhile
        cfg.rollout.labelled()  # one label for all its sandboxes
        run.create(cfg.dump())
    else:
        remove_leftovers(cfg.rollout.sandbox, cfg.rollout.run_id, say)
    say(f"run dir {run.path}  (resume: hrl train --run-dir {run.path} --resume)")
    held = [Path(cfg.eval_tasks)] if cfg.eval_tasks else []
    hide_from_sandboxes(cfg, cfg.tasks, run.path, *held)  # no sandbox may read the tasks or the run
    summary(run, asyncio.run(train_run(cfg, run, include_unchecked, address, step_printer(), say)))
