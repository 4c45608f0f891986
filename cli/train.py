"""`hrl train`: the RL loop — rollouts with a real agent CLI, verification, GRPO update, publish, repeat."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.options import OtlpOption
from hrl.cli.output import err
from hrl.runners.errors import UsageError

__all__ = ["EPILOG", "train"]

EPILOG = """Examples:

  hrl train --recipe demo                                   # the CPU demo: tiny agent model, real CLI, minutes

  hrl train --recipe swe --agent mini-swe-agent --model Qwen/Qwen2.5-Coder-1.5B-Instruct --engine vllm --lora

  hrl train --recipe swe --async -c async.max_staleness=2 -c trainer.lr=5e-6

  hrl train --run-dir runs/swe-1 --resume                   # continue after a crash, same next version

  hrl train --recipe agents-sdk --iterations 2              # a white-box OpenAI Agents SDK agent with a handoff

  hrl train --recipe demo --agent mini-swe-agent,aider      # across two harnesses: curves per harness in the report
  hrl train --recipe demo --placement ray -c placement.engine_replicas=2   # rollouts on Ray (docs/ray.md)

  hrl train --recipe demo --serve --port 8100 --run-dir runs/online   # episodes come from clients (docs/online.md)
  hrl keys add fleet --run-dir runs/online                             # a client key for them
"""


def _resolve(recipe: str, overrides: list[str], flags: dict[str, Any]) -> dict[str, Any]:
    """The run's config: recipe, then `-c`, then flags; names, paths and keys checked before anything starts."""
    from hrl.cli.checks import (
        check_honest_sampling,
        check_model,
        check_placement,
        check_run,
        check_tasks,
        harnesses,
        say_context,
    )
    from hrl.cli.config import apply_overrides, load_recipe_config, materialize_model, set_dotted
    from hrl.cli.online import check_online_settings

    cfg = apply_overrides(load_recipe_config(recipe), overrides, engine=str(flags.get("engine") or ""))
    cfg["recipe"] = recipe
    for key, value in flags.items():
        if value not in (None, "", False):
            set_dotted(cfg, key, value)
    _check_loop_settings(cfg)  # first: no model is built, no engine checked, for settings that cannot work
    check_online_settings(cfg)  # and, with --serve, the settings an online run would ignore
    if not cfg.get("model"):
        raise UsageError("give --model (the recipe names none)", hint="e.g. --model hrl:tiny (a tiny local model)")
    check_honest_sampling(cfg)
    cfg.setdefault("proxy", {})["sampling"] = "honest"  # in the run's config.json: what every call sampled with
    check_placement(cfg)
    check_run(cfg, str(cfg.get("engine") or "embedded"), str(cfg.get("tasks") or ""))
    if cfg.get("eval_tasks"):  # held-out tasks: read whole now too (`-c eval_tasks=` runs without evaluations)
        check_tasks(str(cfg["eval_tasks"]))
    cfg["model"] = materialize_model(cfg["model"])
    check_model(cfg["model"])
    for agent in harnesses(cfg):
        say_context(agent, cfg["model"], cfg)
    cfg.setdefault("trainer", {})["model"] = cfg["model"]
    _training(cfg)  # the training sections' checks across fields (a balanced sampler needs its key, …), now
    return cfg


def _check_loop_settings(cfg: dict[str, Any]) -> None:
    """Settings the loops cannot honour, refused before anything starts: `proxy.version_policy=pin` with full
    publishes (a full publish replaces the only weights the engine holds, so a pinned trace would silently go on
    as `mixed`), an async buffer that cannot hold a batch (`check_batch_fits`), an engine asked to sleep in a loop
    that never puts it to sleep (async), CUDA IPC publishes where they cannot reach the engine (`_check_ipc`), and an
    engine that keeps vLLM's default memory share on the trainer's GPU (`_check_memory_plan`)."""
    from hrl.cli.config import checked
    from hrl.train.async_loop import AsyncConfig, check_batch_fits
    from hrl.train.loop import LoopConfig
    from hrl.train.trainer_config import TrainerConfig

    mode = (cfg.get("trainer") or {}).get("mode", TrainerConfig.model_fields["mode"].default)
    if (cfg.get("proxy") or {}).get("version_policy") == "pin" and mode == "full":
        raise UsageError(
            "proxy.version_policy=pin keeps an episode on the version it started with, but trainer.mode=full "
            "publishes replace the engine's only weights: pinned episodes would silently continue as mixed",
            hint="use -c proxy.version_policy=mixed with --full, or train LoRA adapters (--lora) to pin",
        )
    section = dict(cfg.get("async") or {})
    if section.pop("enabled", False):
        group_size = (cfg.get("train") or {}).get("group_size", LoopConfig.model_fields["group_size"].default)
        check_batch_fits(checked(AsyncConfig, **section), int(group_size))
        if level := int((cfg.get("engine_options") or {}).get("sleep_level") or 0):
            raise UsageError(
                f"engine_options.sleep_level={level} puts vLLM to sleep around each update of the synchronous loop, "
                "but the async loop (--async, --serve) serves while it trains and never sleeps or wakes the engine: "
                "the trainer would be built beside an engine holding its whole memory share",
                hint="use -c engine_options.sleep_level=0 with --async or --serve and give the engine and the "
                "trainer their own GPUs (engine_options.gpus, trainer.gpus), or train without --async",
            )
    _check_ipc(cfg, mode)
    _check_memory_plan(cfg)


@functools.cache
def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_ipc(cfg: dict[str, Any], mode: str) -> None:
    """`engine_options.weight_sync=ipc` only where the trainer's CUDA tensors can reach the server: full training,
    one trainer process, tensor parallel 1, the trainer on the engine's GPU. Anywhere else the first publish would
    fail after a whole rollout and update, or go by disk without a word."""
    opts, trainer = cfg.get("engine_options") or {}, cfg.get("trainer") or {}
    if opts.get("weight_sync") != "ipc":
        return
    disk = "use -c engine_options.weight_sync=disk (safetensors reloaded in place; works in every layout)"
    why = ""
    if mode != "full":
        why = f"trainer.mode={mode} publishes adapters, which vLLM loads from files"
    elif int(opts.get("tensor_parallel_size") or 1) > 1:
        why = (f"engine_options.tensor_parallel_size={opts['tensor_parallel_size']} shards the weights over several "
               "GPUs, and the handles hold the trainer's whole tensors on one")  # fmt: skip
    elif int(trainer.get("nproc") or 1) > 1:
        why = f"trainer.nproc={trainer['nproc']} shards the trainer's weights over its ranks"
    elif not (gpus := _gpus(cfg))[0]:
        why = f"trainer.device={trainer.get('device') or 'auto'} trains on the CPU here, in host memory"
    elif gpus[0] != gpus[1]:
        why = (f"the trainer runs on GPU {gpus[0][0]} and the engine on GPU {gpus[1][0]} (split layout), and vLLM "
               "maps the handles on its own GPU")  # fmt: skip
    if why:
        raise UsageError(f"engine_options.weight_sync=ipc sends the trainer's CUDA tensors to a colocated engine, "
                         f"but {why}", hint=disk)  # fmt: skip


def _gpus(cfg: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The GPUs the trainer's ranks run on ([] on the CPU) and those the vLLM engine spans (its first
    tensor_parallel_size of engine_options.gpus, or of all)."""
    opts, trainer = cfg.get("engine_options") or {}, cfg.get("trainer") or {}
    device, nproc = str(trainer.get("device") or "auto"), int(trainer.get("nproc") or 1)
    if device == "cpu" or (device == "auto" and not _cuda()):
        trainer_gpus: list[int] = []
    elif gpus := [int(g) for g in trainer.get("gpus") or []]:
        trainer_gpus = gpus[:nproc]
    else:
        trainer_gpus = [int(device.split(":")[1])] if ":" in device and nproc == 1 else list(range(nproc))
    tp = int(opts.get("tensor_parallel_size") or 1)
    return trainer_gpus, ([int(g) for g in opts.get("gpus") or []] or list(range(tp)))[:tp]


def _check_memory_plan(cfg: dict[str, Any]) -> None:
    """A vLLM engine that shares a GPU with the trainer and never sleeps needs a memory share the trainer can live
    beside: at vLLM's default (0.9 of the GPU) the trainer is built in the tenth that is left and runs out of memory
    at its first update, after a whole rollout."""
    opts = cfg.get("engine_options") or {}
    if str(cfg.get("engine") or "") != "vllm" or opts.get("sleep_level") or opts.get("gpu_memory_utilization"):
        return
    trainer_gpus, engine_gpus = _gpus(cfg)
    if shared := sorted(set(trainer_gpus) & set(engine_gpus)):
        raise UsageError(
            f"the trainer and the vLLM engine share GPU {', '.join(map(str, shared))}, and the engine never sleeps "
            "(engine_options.sleep_level=0) at vLLM's default memory share (0.9 of the GPU): the trainer would be "
            "built in the tenth that is left",
            hint="give vLLM what the trainer leaves (-c engine_options.gpu_memory_utilization=0.4; sizes per model "
            "in docs/training-on-gpus.md), put it to sleep around each update (-c engine_options.sleep_level=1), "
            "or give each its own GPUs (engine_options.gpus, trainer.gpus)",
        )


def _training(cfg: dict[str, Any]) -> tuple[Any, Any | None]:
    """The typed training sections: the loop's config (the trainer's inside) and the async loop's, None when the
    loop is synchronous; a value they refuse is a usage error naming it."""
    from hrl.cli.config import checked
    from hrl.train.async_loop import AsyncConfig
    from hrl.train.loop import LoopConfig
    from hrl.train.trainer import TrainerConfig

    loop = checked(LoopConfig, **cfg.get("train", {}), trainer=checked(TrainerConfig, **cfg["trainer"]))
    section = dict(cfg.get("async") or {})
    enabled = section.pop("enabled", False)
    return loop, checked(AsyncConfig, **section) if enabled else None


def train(
    recipe: Annotated[str, typer.Option(help="Recipe name (`hrl recipes ls`) or YAML path.")] = "",
    agent: Annotated[
        str,
        typer.Option(
            "--agent",
            "-a",
            help="Agent CLI, or python:MODULE:FUNCTION | FILE.py:FUNCTION (default: the recipe's). Several, "
            "comma-separated (A,B), train across harnesses: groups per task and harness.",
        ),
    ] = "",
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
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="An online run: train on sessions clients run anywhere, over HTTP with client keys (hrl keys add), "
            "instead of episodes hrl starts (the async loop; docs/online.md).",
        ),
    ] = False,
    host: Annotated[
        str, typer.Option(help="With --serve (or --resume of an online run): the address to listen on.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="With --serve (or --resume of an online run): the port; 0 = any free.")
    ] = 8100,
    placement: Annotated[
        str,
        typer.Option(
            help="local (default) | ray: engine replicas, a node agent and a proxy shard per node on a Ray cluster "
            "(placement.address, default a local one; placement.engine_replicas); the trainer stays here. docs/ray.md."
        ),
    ] = "",
    config: Annotated[list[str] | None, typer.Option("-c", "--config", help="key=value override or YAML.")] = None,
    include_unchecked: Annotated[
        bool,
        typer.Option(
            "--include-unchecked",
            help="Use every task, even those `hrl tasks check` found not ok (left out by default; unchecked ones are "
            "always used).",
        ),
    ] = False,
) -> None:
    """Train a model through the agent harness it is deployed with; one line per step, run dir for everything."""
    from hrl.runners.rundir import RunDir

    if resume:
        if run_dir is None:
            raise UsageError(
                "--resume needs --run-dir of an existing run",
                hint="`hrl train --run-dir DIR --resume` continues the run in DIR; without --resume a new run starts",
            )
        RunDir(run_dir).check_resumable()  # a run stopped before its first step resumes too
        fixed = {"--recipe": recipe, "--agent": agent, "--model": model, "--engine": engine, "--lora": lora,
                 "--full": full, "--async": use_async, "--sandbox": sandbox, "--placement": placement,
                 "-c": config, "--include-unchecked": include_unchecked, "--serve": serve}  # fmt: skip
        if given := [name for name, value in fixed.items() if value]:
            raise UsageError(
                f"{', '.join(given)} cannot change on --resume: the run goes on with its own config.json",
                hint="only --iterations (to extend the run), --wandb, --otlp, --host and --port may be given with "
                "--resume (an online run serves again)",
            )
        cfg = RunDir(run_dir).config()
        _check_loop_settings(cfg)  # a run written before these checks existed is refused before it resumes
        if iterations or wandb:  # extend a run (finished or not) to `iterations` steps, or start logging to W&B
            given_train = {"iterations": iterations, "wandb": wandb}
            cfg.setdefault("train", {}).update({k: v for k, v in given_train.items() if v})
        if otlp:
            cfg.setdefault("telemetry", {})["otlp_endpoint"] = otlp
    else:
        if not recipe:
            raise UsageError("give --recipe (or --run-dir with --resume)", hint="e.g. `hrl train --recipe demo`")
        if run_dir is not None:
            RunDir(run_dir).check_new()  # before anything is written: its config.json stays the run's own
        from hrl.cli.checks import check_writable

        check_writable(run_dir or Path("runs"), "--run-dir")  # before the model is built
        flags = {
            "model": model, "engine": engine, "rollout.agent": agent, "rollout.sandbox": sandbox,
            "trainer.mode": "full" if full else ("lora" if lora else None), "train.iterations": iterations or None,
            "train.wandb": wandb or None, "placement.kind": placement or None,
            "telemetry.otlp_endpoint": otlp or None, "online.enabled": serve or None,
            "async.enabled": (use_async or serve) or None,
        }  # fmt: skip
        cfg = _resolve(recipe, config or [], flags)
        run_dir = run_dir or Path("runs") / f"{Path(recipe).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    run = RunDir(run_dir)
    with run.locked():
        if resume and cfg != run.config():
            run.save_config(cfg)  # the extended run: a later plain --resume goes on to the new iteration count
        _start(run, cfg, resume, include_unchecked, (host, port))
    err.print(
        f"done. report: hrl report {run.path}    per-iteration summary: hrl inspect {run.path}\n"
        f"      a trace as a tree: hrl inspect {run.path} --trace <id>",
        markup=False,
    )


def _start(
    run: Any, cfg: dict[str, Any], resume: bool, include_unchecked: bool = False, address: tuple[str, int] = ("", 0)
) -> None:
    """Create the run (or clean up after its interrupted process) and train; the caller holds the run's lock."""
    if not resume:
        run.check_new()  # again under the lock: another process may have started a run there meanwhile
        rollout = cfg.setdefault("rollout", {})
        rollout["run_id"] = rollout.get("run_id") or f"hrl-{uuid.uuid4().hex[:8]}"  # one label for all its sandboxes
        run.create(cfg)
    else:
        _remove_leftovers(cfg)
    err.print(f"run dir {run.path}  (resume: hrl train --run-dir {run.path} --resume)", markup=False)
    from hrl.cli.config import hide_from_sandboxes

    held = [Path(cfg["eval_tasks"])] if cfg.get("eval_tasks") else []
    hide_from_sandboxes(cfg, cfg["tasks"], run.path, *held)  # no sandbox may read the tasks or the run
    asyncio.run(_train(cfg, run, include_unchecked, address))


def _remove_leftovers(cfg: dict[str, Any]) -> None:
    """Kill and delete the sandboxes (agent and grading) the interrupted process of this run left behind: after
    `kill -9` nobody closed them, so their agent CLIs may still run and their directories or containers remain.
    The run's lock guarantees that process is gone. Runs from before sandboxes carried the run's id are skipped."""
    from hrl.sandboxes import get_backend

    rollout = cfg.get("rollout") or {}
    if not rollout.get("run_id"):
        return
    removed = asyncio.run(get_backend(rollout.get("sandbox", "docker")).prune(rollout["run_id"]))
    if removed:
        err.print(f"removed {removed} sandboxes left by the interrupted process", markup=False)


def _reward(m: dict[str, Any]) -> str:
    """The step's mean reward over the traces that have one ('-' when none has: all failed in the infrastructure)."""
    value = m.get("trace/reward")
    return "  -  " if value is None else f"{value:.3f}"


def _line(m: dict[str, Any]) -> str:
    """A step's line: `mismatch` is the KL between the engine's sampled logprobs and the trainer's on the same tokens
    (train/mismatch_kl: ~1e-12 when token-exact; a KL to the reference model is train/kl_ref)."""
    fails = {
        k.split("/")[-1]: int(v) for k, v in m.items() if k.startswith("trace/failures/") and k[-4:] != "none" and v
    }
    return (
        f"step {m['step']:>3}  v{m['version']:<3} reward {_reward(m)}  traces {m.get('trace/count', 0)}"
        f"  loss {m.get('train/loss', 0):+.4f}  mismatch {m.get('train/mismatch_kl', 0):.1e}"
        f"  grad {m.get('train/grad_norm', 0):.2f}  {m.get('time/rollout_s', m.get('time/step_s', 0)):.0f}s"
        + (f"  failures {fails}" if fails else "")
        + (f"  degenerate {int(m['trace/degenerate'])}" if m.get("trace/degenerate") else "")
        + (f"  left out for dropped media {int(m['train/dropped_media'])}" if m.get("train/dropped_media") else "")
        + (f"  left out for images {int(m['train/image_traces'])}" if m.get("train/image_traces") else "")
        + ("  trained on nothing: not published" if m.get("train/empty") else "")
        + (_online(m) if "online/open" in m else "")
        + (f"  per harness {harness}" if len(harness := _per_harness(m)) > 1 else "")
    )


def _online(m: dict[str, Any]) -> str:
    """An online step's client counts: sessions open, traces waiting for a reward, and what was not trained."""
    n = {k: int(m.get(f"online/{k}", 0)) for k in ("open", "pending", "late_rewards", "expired", "reaped")}
    return "  online " + " ".join(f"{k} {v}" for k, v in n.items())


def before_after(rows: dict[int, dict[str, Any]]) -> str:
    """The held-out table of a run: its first and last evaluation (`eval/…` rows), side by side with the change."""
    whole = {k: r for k, r in sorted(rows.items()) if r.get("eval/success") is not None}
    if len(whole) < 2:
        return ""
    (s0, start), (s1, end) = next(iter(whole.items())), list(whole.items())[-1]
    lines = [f"held-out tasks        step {s0:<6} step {s1:<6} change"]
    rows = [("eval/success", "success"), ("eval/reward", "mean reward"), ("eval/turns", "turns")]
    for key in sorted(k for k in end if k.startswith(("eval/has/", "eval/success_given/"))):  # train.eval_markers
        kind, name = key.split("/")[1:]
        rows.append((key, f"{name}" if kind == "has" else f"success | {name}"))
    for key, label in rows:
        if start.get(key) is None or end.get(key) is None:
            continue
        a, b = float(start[key]), float(end[key])
        ratio = f"  ({b / a:.1f}×)" if key == "eval/success" and a > 0 else ""
        lines.append(f"  {label:<19} {a:<11.3f} {b:<11.3f} {b - a:+.3f}{ratio}")
    lines.append(f"  {'episodes':<19} {start['eval/episodes']:<11.0f} {end['eval/episodes']:<11.0f}")
    if start.get("eval/version") is not None and end.get("eval/version") is not None:  # every token sampled by it
        lines.append(f"  {'policy version':<19} {start['eval/version']:<11.0f} {end['eval/version']:<11.0f}")
    return "\n".join(lines)


def _per_harness(m: dict[str, Any]) -> dict[str, float]:
    """{harness: mean reward, rounded} of a step (several harnesses: rollout.agents)."""
    from hrl.runners.metrics import harness_rewards

    return {name: round(v, 3) for name, v in harness_rewards(m).items()}


def _checked_tasks(cfg: dict[str, Any], run: Any, include_unchecked: bool) -> tuple[list[Any], list[Any] | None]:
    """The training and held-out tasks, less those `hrl tasks check` found not ok (said on stderr, and kept in the
    run's task_checks.json, which a resumed run takes its tasks from again)."""
    from hrl.runners.tasks.checks import select_for_run
    from hrl.runners.tasks.task import load_tasks

    tasks, report = select_for_run(load_tasks(cfg["tasks"]), run.path, "tasks", include_unchecked)
    err.print(report.line("tasks"), markup=False, highlight=False)
    if not tasks:
        raise UsageError(
            f"every task of {cfg['tasks']} was left out: `hrl tasks check` found none ok",
            hint="fix the tasks and `hrl tasks check --recheck` them, or train on them anyway with --include-unchecked",
        )
    if not cfg.get("eval_tasks"):
        return tasks, None
    heldout, report = select_for_run(load_tasks(cfg["eval_tasks"]), run.path, "eval_tasks", include_unchecked)
    err.print(report.line("held-out tasks"), markup=False, highlight=False)
    return tasks, heldout or None


async def _train(
    cfg: dict[str, Any], run: Any, include_unchecked: bool = False, address: tuple[str, int] = ("", 0)
) -> None:
    from hrl.cli.config import run_config
    from hrl.runners.live import live_status
    from hrl.runners.placement import placed
    from hrl.train.async_loop import train_async
    from hrl.train.loop import train as train_sync

    if (cfg.get("online") or {}).get("enabled"):
        from hrl.cli.online import train_online

        await train_online(cfg, run, address, include_unchecked)
        return
    checked, held = _checked_tasks(cfg, run, include_unchecked)
    tasks = [t.model_dump() for t in checked]
    heldout = [t.model_dump() for t in held] if held else None
    loop_cfg, async_cfg = _training(cfg)
    cfg.setdefault("proxy", {})["sampling"] = "honest"  # every call at the policy's own distribution
    settings = run_config(cfg)
    batch = loop_cfg.tasks_per_iteration * loop_cfg.group_size * max(1, len(settings.rollout.harnesses))
    if settings.rollout.warm_sandboxes > batch:  # more than an iteration's episodes would never be leased in time
        settings.rollout.warm_sandboxes = batch

    on_event = step_printer()
    say = lambda line: err.print(line, markup=False)  # noqa: E731
    async with placed(settings, settings.model, settings.engine, loop_cfg.concurrency, say=say) as here:
        rollouts, publisher = here.rollouts, here.publisher
        with live_status(run.path, lambda: publisher.engine.version):  # <run>/live.json, for `hrl top`
            if async_cfg is not None:
                history = await train_async(tasks, loop_cfg, async_cfg, run, publisher, rollouts,
                                            on_event, heldout)  # fmt: skip
            else:
                history = await train_sync(tasks, loop_cfg, run, publisher, rollouts, on_event, heldout)
    summary(run, history)


def step_printer() -> Any:
    """The training loop's events as lines on stderr."""

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "step":
            err.print(_line(data), markup=False, highlight=False)
        elif kind == "rollout":
            err.print(
                f"iteration {data['iteration']}: {data['episodes']} episodes"
                + (f" ({data['resumed']} already done)" if data["resumed"] else "")
                + (f" ({data['rerun']} cut short by a stop run again)" if data.get("rerun") else ""),
                markup=False,
            )
        elif kind == "eval_start":
            err.print(f"held-out evaluation at step {data['step']} (policy v{data['version']}): {data['tasks']} tasks, "
                      f"{data['episodes']} episodes", markup=False)  # fmt: skip
        elif kind == "eval":
            err.print(f"held-out at step {data['step']}: success {data['eval/success']:.3f} of "
                      f"{data['eval/episodes']:.0f} episodes, {data['eval/turns']:.1f} turns", markup=False)  # fmt: skip
        elif kind == "resumed":
            err.print(f"resuming at iteration {data['iteration']}, version {data['version']}", markup=False)

    return on_event


def summary(run: Any, history: list[dict[str, Any]]) -> None:
    """The run's reward curve and held-out table, on stderr."""
    curve = [None if m.get("trace/reward") is None else round(float(m["trace/reward"]), 3) for m in history]
    err.print(f"reward per iteration: {curve}", markup=False)
    if len(curve) > 2:
        from hrl.runners.report.builder import smoothed

        err.print(
            f"smoothed:             {[None if v is None else round(v, 3) for v in smoothed(curve)]}", markup=False
        )
    if table := before_after(run.eval_rows()):
        err.print(table, markup=False, highlight=False)
