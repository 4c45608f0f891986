"""`hrl train --serve`: an online run. The proxy listens on --host/--port; clients with the run's keys (`hrl keys
add`) open sessions, run their agents against them anywhere, and end and reward them; the async loop trains on the
traces (`hrl.train.online`). docs/online.md."""

from __future__ import annotations

import secrets
from typing import Any

from hrl.cli.output import err
from hrl.runners.errors import UsageError

__all__ = ["IGNORED", "check_online_settings", "train_online"]

# Settings an online run reads nowhere (its episodes, tasks and groups are the clients'), and what acts instead.
IGNORED = {
    "train.group_size": "a group is the sessions a client opens with the same group",
    "train.tasks_per_iteration": "clients choose the tasks",
    "train.task_sampler": "clients choose the tasks",
    "train.sampler_key": "clients choose the tasks",
    "async.max_in_flight": "clients run their own sessions (online.max_open_per_key bounds each key)",
    "async.max_failed_groups": "no episode is started here to fail",
    "tasks": "episodes come from the clients (held-out tasks: eval_tasks)",
}


def _value(cfg: dict[str, Any], key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_online_settings(cfg: dict[str, Any]) -> None:
    """With `online.enabled` (--serve): refuse, before anything starts, the `IGNORED` settings that this run's `-c`
    gave (its value differs from the recipe's), naming each, what acts instead, and the one that sets a step's
    size (async.batch_traces). The recipe's own values are left alone: a recipe serves both kinds of run."""
    if not (cfg.get("online") or {}).get("enabled"):
        return
    from hrl.cli.config import load_recipe_config
    from hrl.train.async_config import AsyncConfig

    recipe = load_recipe_config(cfg["recipe"]) if cfg.get("recipe") else {}
    given = [k for k in IGNORED if _value(cfg, k) not in (None, "") and _value(cfg, k) != _value(recipe, k)]
    if not given:
        return
    batch = _value(cfg, "async.batch_traces") or AsyncConfig.model_fields["batch_traces"].default
    why = "; ".join(dict.fromkeys(IGNORED[k] for k in given))
    raise UsageError(
        f"an online run (--serve) ignores {', '.join(f'{k}={_value(cfg, k)}' for k in given)}: a step trains on "
        f"the next async.batch_traces={batch} final traces clients send, in the groups they send them ({why})",
        hint="drop those -c settings; -c async.batch_traces=N sets how many traces a step waits for",
    )


def _scorer(cfg: dict[str, Any], spec: str) -> Any:
    """`online.scorer` loaded now, so a wrong name stops the run before anything starts."""
    if not spec:
        return None
    from hrl.runners.whitebox.harness import load_function

    return load_function(spec, cfg.get("recipe_dir"))


def _heldout(cfg: dict[str, Any], run: Any, include_unchecked: bool) -> list[dict[str, Any]] | None:
    if not cfg.get("eval_tasks"):
        return None
    from hrl.runners.tasks.checks import select_for_run
    from hrl.runners.tasks.task import load_tasks

    held, report = select_for_run(load_tasks(cfg["eval_tasks"]), run.path, "eval_tasks", include_unchecked)
    err.print(report.line("held-out tasks"), markup=False, highlight=False)
    return [t.model_dump() for t in held] or None


async def train_online(cfg: dict[str, Any], run: Any, address: tuple[str, int], include_unchecked: bool) -> None:
    from hrl.cli.config import checked, run_config
    from hrl.cli.serve import write_control_token
    from hrl.cli.train import _training, step_printer, summary
    from hrl.runners.live import live_status
    from hrl.runners.online import OnlineConfig, OnlineSessions
    from hrl.runners.placement.local import local_placement
    from hrl.train.async_loop import train_async
    from hrl.train.online import ExternalProducer

    section = dict(cfg.get("online") or {})
    section.pop("enabled", None)
    online_cfg = checked(OnlineConfig, **section)
    loop_cfg, async_cfg = _training(cfg)
    if async_cfg is None or (cfg.get("placement") or {}).get("kind", "local") != "local":
        raise UsageError("an online run (--serve) trains with the async loop, in this process",
                         hint="drop -c async.enabled=false and --placement ray")  # fmt: skip
    scorer = _scorer(cfg, online_cfg.scorer)
    heldout = _heldout(cfg, run, include_unchecked)
    cfg.setdefault("proxy", {})["sampling"] = "honest"
    settings = run_config(cfg)
    control = secrets.token_urlsafe(32)
    write_control_token(run.path / "control-token", control)

    def clients(proxy: Any) -> OnlineSessions:
        return OnlineSessions(proxy, online_cfg, run.path, async_cfg.max_staleness, scorer)

    host, port = address
    online = {"host": host, "port": port, "control_token": control, "clients": clients}
    say = lambda line: err.print(line, markup=False)  # noqa: E731
    async with local_placement(settings, settings.model, settings.engine, say=say, online=online) as here:
        if heldout:
            await here.prepare()  # the recipe's agent, for the held-out evaluations only
        stack = here.stack
        keys = stack.clients.keys
        err.print(f"serving clients at {stack.url} (POST /sessions with a client key; {len(keys.names())} keys in "
                  f"{keys.path}; add one: hrl keys add NAME --run-dir {run.path})", markup=False)  # fmt: skip
        err.print(f"each step waits for {async_cfg.batch_traces} final traces (async.batch_traces): sessions ended "
                  "with a reward, or scored by online.scorer", markup=False)  # fmt: skip
        producer = ExternalProducer(stack.clients, loop_cfg, run)
        with live_status(run.path, lambda: stack.proxy.engine.version):
            history = await train_async([], loop_cfg, async_cfg, run, stack.proxy, here.rollouts, step_printer(),
                                        heldout, producer=producer)  # fmt: skip
    summary(run, history)
