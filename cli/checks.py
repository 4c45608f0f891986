"""Names and paths checked before any work: no run header, sandbox or engine start until the arguments are good.

Each check raises a `UsageError` (exit 2) whose hint names the command that lists the valid choices; the
registries themselves stay the one place that knows the names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrl.cli.output import err
from hrl.runners.errors import PrerequisiteError, UnknownNameError, UsageError

if TYPE_CHECKING:
    from hrl.runners.tasks.task import Task

__all__ = [
    "check_agent",
    "check_browser_reach",
    "check_engine",
    "check_honest_sampling",
    "check_model",
    "check_placement",
    "check_run",
    "check_sandbox",
    "check_tasks",
    "check_web_apps",
    "check_writable",
    "grade_by_source",
    "harnesses",
    "say_context",
]


def _listed(exc: UnknownNameError, hint: str) -> UnknownNameError:
    return UnknownNameError(str(exc), hint=hint)


def check_agent(name: str) -> None:
    from hrl.registry import require
    from hrl.runners.agents import AGENTS

    try:
        require(AGENTS, "agent", name)
    except UnknownNameError as e:
        raise _listed(e, "`hrl agents ls` lists the agents and their versions") from None


def check_sandbox(name: str, flag: str = "--sandbox") -> None:
    from hrl.registry import require
    from hrl.sandboxes import SANDBOXES

    try:
        require(SANDBOXES, "sandbox", name)
    except UnknownNameError as e:
        raise _listed(e, f"use {flag} docker (isolated) or {flag} local (trusted agents)") from None


def check_engine(name: str, options: dict[str, Any] | None = None) -> None:
    """A registered engine or a URL; for `vllm` started here, an interpreter that has vLLM (a prerequisite, exit 4)."""
    import os

    from hrl.runners.doctor.checks import vllm_python
    from hrl.runners.engines import engine_kind

    try:
        kind, opts = engine_kind(name, options)
    except UnknownNameError as e:
        raise _listed(e, "use --engine embedded (CPU), --engine vllm, or the URL of a running vLLM server") from None
    python = opts.get("python") or vllm_python()
    if kind == "vllm" and not opts.get("url") and not (python and os.access(python, os.X_OK)):
        raise PrerequisiteError(
            f"--engine vllm needs a Python with vLLM: {python or 'HRL_VLLM_PYTHON is not set and this one has none'}",
            hint="set HRL_VLLM_PYTHON to a venv's python with vllm (`make setup` builds one), or use --engine embedded",
        )


def check_tasks(path: str | Path) -> int:
    """Read the task file now (a missing file is a usage error, a malformed one a data error); its task count."""
    from hrl.runners.tasks.task import load_tasks

    return len(load_tasks(path))


def check_writable(path: str | Path, flag: str) -> None:
    """What a command will write (`flag` names it: --out, --run-dir) can be written: the file or folder itself when it
    exists, else the nearest folder above it that does. A usage error naming the path, said before any work."""
    import os

    path = Path(path)
    where = next((p for p in (path, *path.parents) if p.exists()), path)
    if not where.is_dir() and where != path:
        raise UsageError(f"{flag} {path}: {where} is a file, not a folder", hint=f"give {flag} a path in a folder")
    if not os.access(where, os.W_OK):
        raise UsageError(
            f"{flag} {path}: {where} is not writable (permission denied)",
            hint=f"give {flag} a path in a folder you can write to, or change {where}'s permissions",
        )


def check_model(model: str) -> None:
    """A model named by path must exist (an HF id is resolved by the engine, which may download it)."""
    from hrl.runners.models import resolve_model, split_adapter

    base, _ = split_adapter(model)
    resolve_model(base)


def check_honest_sampling(cfg: dict[str, Any]) -> None:
    """`hrl train` samples every call honestly (`proxy.sampling: honest`): a config that asks otherwise is refused,
    since the recorded logprobs would then not be those of the distribution the tokens were drawn from."""
    asked = (cfg.get("proxy") or {}).get("sampling", "honest")
    if asked != "honest":
        raise UsageError(
            f"proxy.sampling={asked} cannot be trained on: the agent's temperature, top_p, top_k, min_p and "
            "penalties would reshape the sampled distribution, and the recorded logprobs would not be its own",
            hint="drop proxy.sampling from the recipe and -c (hrl train always samples with proxy.sampling=honest); "
            "`hrl rollout -c proxy.sampling=agent` samples with the agent's settings",
        )


def harnesses(cfg: dict[str, Any]) -> list[str]:
    """The run's harnesses: `rollout.agents`, else `rollout.agent`. `--agent A,B` (a comma in rollout.agent)
    becomes rollout.agents here, in cfg, so the run's config.json says it the one way."""
    roll = cfg.setdefault("rollout", {})
    agent = str(roll.get("agent") or "mini-swe-agent")
    if "," in agent:
        roll["agents"] = [a.strip() for a in agent.split(",") if a.strip()]
    names = list(dict.fromkeys(str(a) for a in roll.get("agents") or [])) or [agent]
    roll["agent"] = names[0]
    return names


def check_placement(cfg: dict[str, Any]) -> None:
    """`--placement local|ray`: a known kind, and Ray installed when it is ray (before anything starts)."""
    kind = str((cfg.get("placement") or {}).get("kind") or "local")
    if kind not in ("local", "ray"):
        raise UsageError(f"unknown placement {kind!r}", hint="give --placement local or --placement ray")
    if kind == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise PrerequisiteError("--placement ray needs Ray, which is not installed", hint="pip install 'hrl[ray]'")


def check_run(cfg: dict[str, Any], engine: str, task_file: str) -> int:
    """The names and paths `hrl rollout` and `hrl train` need before any work: agent, sandbox, engine, verifier and
    task file (read whole); returns the number of tasks. The model is checked once it is materialized."""
    from hrl.registry import require
    from hrl.runners.tasks import VERIFIERS
    from hrl.runners.whitebox.harness import is_python_agent, load_function, needs_sandbox, resolve_mode, split_spec
    from hrl.runners.whitebox.interpreter import agent_python, check_python, closed_mounts
    from hrl.sandboxes.local import LocalBackend

    grade_by_source(cfg, task_file)
    names = harnesses(cfg)
    roll = cfg["rollout"]
    check_browser_reach(cfg, names)
    for agent in names:
        if is_python_agent(agent):  # its module and function load now, in its own Python where it has one
            mode, _ = resolve_mode(str(roll.get("mode", "auto")), agent, cfg.get("verifier"),
                                   str(roll.get("python") or ""))  # fmt: skip
            where = agent_python(str(roll.get("python") or ""), on_event=_installing)
            if where.own:
                load_function(agent, cfg.get("recipe_dir"))
            else:
                check_python(where, agent, cfg.get("recipe_dir"))
            if mode == "subprocess":  # what its namespace would hide is bound in, or refused now, naming the path
                target, _ = split_spec(agent, cfg.get("recipe_dir"))
                closed_mounts(where, target, cfg.get("recipe_dir"), LocalBackend().private_roots())
        else:
            check_agent(agent)
    sandboxed = any(needs_sandbox(agent, cfg.get("verifier")) for agent in names)
    check_sandbox(str(roll.get("sandbox", "docker")))
    verifier = str((cfg.get("verifier") or {}).get("name") or "tests")
    # no Docker daemon is a missing prerequisite: said before any header
    if sandboxed and roll.get("sandbox", "docker") == "docker":
        from hrl.sandboxes import get_backend

        _ = get_backend("docker").api  # type: ignore[attr-defined]
    check_engine(engine, cfg.get("engine_options"))
    if not sandboxed:  # white-box agents scored by a Python function: load it now
        if (function := (cfg.get("verifier") or {}).get("function")) is not None:
            load_function(str(function), cfg.get("recipe_dir"))
    else:
        try:
            require(VERIFIERS, "verifier", verifier)
        except UnknownNameError as e:
            raise _listed(e, "set -c verifier.name=tests") from None
    if verifier == "harbor" and roll.get("sandbox", "docker") != "docker":
        raise UsageError(
            "Harbor tasks run in Docker sandboxes (their environment is a Dockerfile)", hint="add --sandbox docker"
        )
    if not task_file:
        raise UsageError("no task file: the recipe names none", hint="give --tasks FILE (SWE-bench JSONL)")
    from hrl.runners.tasks.task import load_tasks

    tasks = load_tasks(task_file)  # read whole, once
    if verifier == "harbor":
        check_web_apps(names, tasks)
    return len(tasks)


def grade_by_source(cfg: dict[str, Any], task_file: str) -> None:
    """A folder of Harbor tasks is graded by the `harbor` verifier when the recipe names the pytest one (or none):
    the section's pytest settings (its `timeout_s`, say) do not carry over; task.toml's apply. Keys only the
    Harbor verifier has (`carry`, `keep_final`, …) do. `miniwob:` pages are graded by the `miniwob` verifier the
    same way."""
    from hrl.registry import load
    from hrl.runners.tasks import VERIFIERS, verifier_for

    section = cfg.get("verifier") or {}
    by_source = verifier_for(task_file)
    if by_source in ("harbor", "miniwob") and section.get("name") in (None, "tests"):  # miniwob: graded from the page
        # kept: what only the source's verifier knows (`-c verifier.keep_final=false`), and the CLI's own keys
        own = set(load(VERIFIERS[by_source] + "Config").model_fields) - set(
            load(VERIFIERS["tests"] + "Config").model_fields
        )
        keep = {*own, *(("hide_paths", "run_id") if by_source == "harbor" else ())}
        cfg["verifier"] = {"name": by_source, **{k: v for k, v in section.items() if k in keep}}


def _installing(message: str) -> None:
    err.print(f"  rollout.python: {message}", markup=False)


def check_browser_reach(cfg: dict[str, Any], agents: list[str]) -> None:
    """The `miniwob` verifier's browser: a CLI agent reaches it through its sandbox's own network (the endpoint
    forwarded in, the CLI's MCP browser server connected to it); a white-box agent in hrl's process on the host's
    loopback, in a closed subprocess through the same forward (`session.browser` says where). An agent that could
    not (a CLI with no MCP client, a local sandbox without bubblewrap) is refused before anything starts rather
    than scored 0."""
    from hrl.runners.agents import get_agent
    from hrl.runners.whitebox.harness import is_python_agent

    if (cfg.get("verifier") or {}).get("name") != "miniwob":
        return
    roll = cfg.get("rollout") or {}
    clis = [a for a in agents if not is_python_agent(a)]
    drives = [a for a in clis if getattr(get_agent(a), "drives_browser", False)]  # browser-use: over CDP itself
    if no_mcp := [a for a in clis if a not in drives and not getattr(get_agent(a), "mcp_tool", None)]:
        raise UsageError(
            f"MiniWoB++ tasks cannot run with {', '.join(no_mcp)}: it has no MCP client to drive the browser with",
            hint="use claude-code, codex, opencode, gemini-cli or qwen-code (each given a browser MCP server), or "
            "browser-use",
        )
    if clis and roll.get("sandbox", "docker") == "local":
        from hrl.sandboxes.local import isolation

        if not isolation():
            raise UsageError(
                f"MiniWoB++ tasks cannot run with {', '.join(clis)} in a local sandbox without bubblewrap: the "
                "browser's endpoint is forwarded into a sandbox's own network namespace",
                hint="use --sandbox docker (or install bubblewrap)",
            )


def check_web_apps(agents: list[str], tasks: Sequence[Task]) -> None:
    """Harbor tasks that serve a web app ([browser]) run only with an agent that drives a browser: a CLI with an
    MCP client (given the browser MCP server), or browser-use; any other is refused before anything starts."""
    from hrl.runners.agents import get_agent
    from hrl.runners.tasks.harbor_verifier import browser_of
    from hrl.runners.whitebox.harness import is_python_agent

    web = [t.instance_id for t in tasks if browser_of(t) is not None]
    if not web:
        return

    def reaches(agent: str) -> bool:  # a CLI with an MCP client, or one that speaks CDP itself (browser-use)
        runner = get_agent(agent)
        return bool(getattr(runner, "mcp_tool", None) or getattr(runner, "drives_browser", False))

    if cannot := [a for a in agents if is_python_agent(a) or not reaches(a)]:
        raise UsageError(
            f"Harbor tasks that serve a web app ({', '.join(web[:3])}{'…' if len(web) > 3 else ''}) cannot run with "
            f"{', '.join(cannot)}: the agent drives the episode's browser through a browser MCP server",
            hint="use claude-code, codex, opencode, gemini-cli, qwen-code or browser-use",
        )


def say_context(agent: str, model: str, cfg: dict[str, Any]) -> None:
    """One warning line when the agent's fixed prompt cannot fit the model's context, naming the fix."""
    from hrl.runners.agents import AGENTS, get_agent
    from hrl.runners.agents.fit import fit
    from hrl.runners.whitebox.harness import is_python_agent

    if is_python_agent(agent):  # a white-box agent's prompt is its own code's: nothing measured to compare
        return
    options, proxy = cfg.get("engine_options") or {}, cfg.get("proxy") or {}
    found = fit(agent, model, options, proxy)
    if found is None or found.fits:
        return
    coders = [n for n in sorted(AGENTS) if n != agent and not getattr(get_agent(n), "drives_browser", False)]
    others = [f for name in coders if (f := fit(name, model, options, proxy)) and f.fits]
    fitting = ", ".join(f"{f.agent} (~{f.prompt_tokens / 1000:.0f}k)" for f in others) or "none on this model"
    err.print(
        f"Warning: {agent}'s fixed prompt (system prompt + tool schemas) is about {found.prompt_tokens:,} tokens on "
        f"this model, more than its context of {found.context:,} tokens: every episode will end in "
        f"context_overflow. Use a model with a larger context (max_position_embeddings), or an agent whose prompt "
        f"fits: {fitting}.",
        markup=False,
    )
