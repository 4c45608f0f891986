"""Names and paths checked before any work: no run header, sandbox or engine start until the arguments are good.

Each check raises a `UsageError` (exit 2) whose hint names the command that lists the valid choices; the
registries themselves stay the one place that knows the names. What a check has to say short of an error (a
warning, an install under way) goes to its `say` callable, a line at a time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrl.config import DEFAULT_VERIFIER
from hrl.runners.errors import EngineError, PrerequisiteError, UnknownNameError, UsageError

if TYPE_CHECKING:
    from hrl.config import RunConfig
    from hrl.runners.tasks.task import Task

__all__ = [
    "IGNORED",
    "LOCAL_WARNING",
    "check_agent",
    "check_browser_reach",
    "check_empty_folder",
    "check_engine",
    "check_gpu_plan",
    "check_harnesses",
    "check_honest_sampling",
    "check_model",
    "check_online_settings",
    "check_out_file",
    "check_placement",
    "check_proxy_choices",
    "check_rollout",
    "check_run",
    "check_sandbox",
    "check_tasks",
    "check_teacher",
    "check_tool_prompt",
    "check_training",
    "check_web_apps",
    "check_writable",
    "grade_by_source",
    "harnesses",
    "local_warning",
    "say_context",
]

Say = Callable[[str], None]


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

    from hrl.runners.engines import engine_kind
    from hrl.runners.engines.vllm_server import vllm_python

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
    from hrl.runners.tasks.load import load_tasks

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


def check_empty_folder(path: Path, flag: str) -> None:
    """A folder a run is made in (`flag` names it: --run-dir): refused where it is a file or a folder that is not
    empty."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file", hint=f"give a new folder for the run, or leave {flag} out")
    if path.exists() and any(path.iterdir()):
        raise UsageError(f"{flag} {path} is not empty", hint=f"give a new {flag} (or leave it out)")


def check_out_file(path: Path, what: str) -> None:
    """`--out`, the file `what` (traces, tasks) go to: not a folder, and writable (`check_writable`)."""
    if path.is_dir():
        raise UsageError(f"--out {path} is a directory", hint=f"give a file for the {what}, e.g. --out {what}.jsonl")
    check_writable(path, "--out")


def check_model(model: str) -> None:
    """A model named by path must exist (an HF id is resolved by the engine, which may download it)."""
    from hrl.runners.models import resolve_model, split_adapter

    base, _ = split_adapter(model)
    resolve_model(base)


def check_teacher(cfg: RunConfig) -> None:
    """`distill.teacher` (made real, as the model is): a model that exists, whose tokenizer is the student's, the same
    token for every id and the same special tokens, since the teacher scores the student's token ids as they are.
    A mismatch is a usage error naming the first differences, said before anything starts."""
    if not cfg.distill.enabled:
        return
    from transformers import AutoTokenizer

    from hrl.runners.models import split_adapter

    if cfg.distill.remote:
        _check_remote_teacher(cfg, AutoTokenizer.from_pretrained(split_adapter(cfg.model)[0]))
        return
    check_model(cfg.distill.teacher)
    student, teacher = (AutoTokenizer.from_pretrained(split_adapter(m)[0]) for m in (cfg.model, cfg.distill.teacher))
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    differ = sorted(t for t in ours.keys() | theirs.keys() if ours.get(t) != theirs.get(t))
    special = set(student.all_special_tokens) ^ set(teacher.all_special_tokens)
    if not differ and not special:
        return
    shown = ", ".join(f"{t!r}: {ours.get(t)} vs {theirs.get(t)}" for t in differ[:3]) if differ else ""
    what = f"{len(differ)} tokens map to other ids or are missing (student vs teacher: {shown})" if differ else ""
    what += ("; " if what and special else "") + (f"special tokens differ: {sorted(special)[:5]}" if special else "")
    raise UsageError(
        f"distill.teacher={cfg.distill.teacher} has another tokenizer than the student {cfg.model}: {what}",
        hint="give a teacher of the student's family, with its tokenizer (the teacher scores the student's token ids)",
    )


PROBE_TOKENS = 4096  # of the student's vocabulary, decoded into the texts a URL teacher's tokenizer must split alike


def _check_remote_teacher(cfg: RunConfig, student: Any) -> None:
    """A teacher behind a URL: the server answers, serves the model named (or one), and its tokenizer splits, as the
    student's does, the text of every special token and of PROBE_TOKENS tokens spread over the vocabulary (a server
    shows no vocabulary to compare whole; another tokenizer splits such a probe otherwise)."""
    from hrl.runners.engines.scoring import ScoringServer

    vocab = len(student)
    step = max(1, vocab // PROBE_TOKENS)
    texts = [*student.all_special_tokens, *(student.decode(list(range(i, min(i + 64, vocab)))) for i in
                                             range(0, vocab, 64 * step))]  # fmt: skip
    server = ScoringServer(cfg.distill.teacher, cfg.distill.teacher_model)
    try:
        theirs = server.describe(texts)
    except EngineError as e:
        raise UsageError(f"distill.teacher={cfg.distill.teacher}: {e}",
                         hint="start the teacher's vLLM server first (hrl serve, or vllm serve), or name "
                         "its model with -c distill.teacher_model=NAME") from e  # fmt: skip
    for text, got in zip(texts, theirs, strict=True):
        want = student.encode(text, add_special_tokens=False)
        if got != want:
            raise UsageError(
                f"distill.teacher={cfg.distill.teacher} ({server.model}) has another tokenizer than the student "
                f"{cfg.model}: {text[:40]!r} is {want[:6]} for the student and {got[:6]} for the teacher",
                hint="serve a teacher of the student's family, with its tokenizer (the teacher scores the student's "
                "token ids)",
            )


def check_honest_sampling(cfg: RunConfig) -> None:
    """`hrl train` samples every call honestly (`proxy.sampling: honest`): a config that asks otherwise is refused,
    since the recorded logprobs would then not be those of the distribution the tokens were drawn from."""
    asked = cfg.proxy.sampling
    if "sampling" in cfg.proxy.model_fields_set and asked != "honest":
        raise UsageError(
            f"proxy.sampling={asked} cannot be trained on: the agent's temperature, top_p, top_k, min_p and "
            "penalties would reshape the sampled distribution, and the recorded logprobs would not be its own",
            hint="drop proxy.sampling from the recipe and -c (hrl train always samples with proxy.sampling=honest); "
            "`hrl rollout -c proxy.sampling=agent` samples with the agent's settings",
        )


def harnesses(cfg: RunConfig) -> list[str]:
    """The run's harnesses: `rollout.agents`, else `rollout.agent`. `--agent A,B` (a comma in rollout.agent)
    becomes rollout.agents here, in cfg, so the run's config.json says it the one way."""
    roll = cfg.rollout
    if "," in roll.agent:
        roll.agents = [a.strip() for a in roll.agent.split(",") if a.strip()]
    names = roll.harnesses
    if roll.agent != names[0]:
        roll.agent = names[0]
    return names


def check_placement(cfg: RunConfig) -> None:
    """`--placement ray`: Ray installed (before anything starts; the kind itself is checked with the config)."""
    if cfg.placement.kind == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise PrerequisiteError("--placement ray needs Ray, which is not installed", hint="pip install 'hrl[ray]'")


def check_run(cfg: RunConfig, engine: str, task_file: str, *, say: Say) -> int:
    """The names and paths `hrl rollout` and `hrl train` need before any work: agent, sandbox, engine, verifier and
    task file (read whole); returns the number of tasks. The model is checked once it is materialized. A white-box
    agent's own Python being installed is said to `say`."""
    from hrl.registry import require
    from hrl.runners.proxy.reasoning import check_reasoning_name
    from hrl.runners.proxy.toolparsers import check_name
    from hrl.runners.tasks import VERIFIERS
    from hrl.runners.whitebox.harness import is_python_agent, load_function, needs_sandbox, resolve_mode, split_spec
    from hrl.runners.whitebox.interpreter import agent_python, check_python, closed_mounts
    from hrl.sandboxes.local import LocalBackend

    check_name(cfg.proxy.tool_parser)  # an UnknownNameError naming the nearest parser
    check_reasoning_name(cfg.proxy.reasoning_parser)
    grade_by_source(cfg, task_file)
    names = harnesses(cfg)
    roll, recipe_dir = cfg.rollout, cfg.recipe_dir or None
    check_browser_reach(cfg, names)
    for agent in names:
        if is_python_agent(agent):  # its module and function load now, in its own Python where it has one
            mode, _ = resolve_mode(roll.mode, agent, cfg.verifier, roll.python)
            where = agent_python(roll.python, on_event=lambda message: say(f"  rollout.python: {message}"))
            if where.own:
                load_function(agent, recipe_dir)
            else:
                check_python(where, agent, recipe_dir)
            if mode == "subprocess":  # what its namespace would hide is bound in, or refused now, naming the path
                target, _ = split_spec(agent, recipe_dir)
                closed_mounts(where, target, recipe_dir, LocalBackend().private_roots())
        else:
            check_agent(agent)
    sandboxed = any(needs_sandbox(agent, cfg.verifier) for agent in names)
    check_sandbox(roll.sandbox)
    verifier = cfg.verifier_name
    # no Docker daemon is a missing prerequisite: said before any header
    if sandboxed and roll.sandbox == "docker":
        from hrl.sandboxes import get_backend

        _ = get_backend("docker").api  # type: ignore[attr-defined]
    check_engine(engine, cfg.engine_options)
    if not sandboxed:  # white-box agents scored by a Python function: load it now
        if (function := cfg.verifier.get("function")) is not None:
            load_function(str(function), recipe_dir)
    else:
        try:
            require(VERIFIERS, "verifier", verifier)
        except UnknownNameError as e:
            raise _listed(e, "set -c verifier.name=tests") from None
    if verifier == "harbor" and roll.sandbox != "docker":
        raise UsageError(
            "Harbor tasks run in Docker sandboxes (their environment is a Dockerfile)", hint="add --sandbox docker"
        )
    if not task_file:
        raise UsageError("no task file: the recipe names none", hint="give --tasks FILE (SWE-bench JSONL)")
    from hrl.runners.tasks.load import load_tasks

    tasks = load_tasks(task_file)  # read whole, once
    if verifier == "harbor":
        check_web_apps(names, tasks)
    return len(tasks)


def grade_by_source(cfg: RunConfig, task_file: str) -> None:
    """A folder of Harbor tasks is graded by the `harbor` verifier when the recipe names the pytest one (or none):
    the section's pytest settings (its `timeout_s`, say) do not carry over; task.toml's apply. Keys only the
    Harbor verifier has (`carry`, `keep_final`, …) do. `miniwob:` pages are graded by the `miniwob` verifier the
    same way."""
    from hrl.registry import load
    from hrl.runners.tasks import VERIFIERS, verifier_for

    section = cfg.verifier
    by_source = verifier_for(task_file)
    if by_source in ("harbor", "miniwob") and section.get("name") in (
        None,
        DEFAULT_VERIFIER,
    ):  # miniwob: graded from the page
        # kept: what only the source's verifier knows (`-c verifier.keep_final=false`), and the CLI's own keys
        own = set(load(VERIFIERS[by_source] + "Config").model_fields) - set(
            load(VERIFIERS[DEFAULT_VERIFIER] + "Config").model_fields
        )
        keep = {*own, *(("hide_paths", "run_id") if by_source == "harbor" else ())}
        cfg.verifier = {"name": by_source, **{k: v for k, v in section.items() if k in keep}}


def check_browser_reach(cfg: RunConfig, agents: list[str]) -> None:
    """The `miniwob` verifier's browser: a CLI agent reaches it through its sandbox's own network (the endpoint
    forwarded in, the CLI's MCP browser server connected to it); a white-box agent in hrl's process on the host's
    loopback, in a closed subprocess through the same forward (`session.browser` says where). An agent that could
    not (a CLI with no MCP client, a local sandbox without bubblewrap) is refused before anything starts rather
    than scored 0."""
    from hrl.runners.agents import get_agent
    from hrl.runners.whitebox.harness import is_python_agent

    if cfg.verifier.get("name") != "miniwob":
        return
    clis = [a for a in agents if not is_python_agent(a)]
    drives = [a for a in clis if get_agent(a).drives_browser]  # browser-use: over CDP itself
    if no_mcp := [a for a in clis if a not in drives and not get_agent(a).mcp_tool]:
        raise UsageError(
            f"MiniWoB++ tasks cannot run with {', '.join(no_mcp)}: it has no MCP client to drive the browser with",
            hint="use claude-code, codex, opencode, gemini-cli or qwen-code (each given a browser MCP server), or "
            "browser-use",
        )
    if clis and cfg.rollout.sandbox == "local":
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
        return bool(runner.mcp_tool or runner.drives_browser)

    if cannot := [a for a in agents if is_python_agent(a) or not reaches(a)]:
        raise UsageError(
            f"Harbor tasks that serve a web app ({', '.join(web[:3])}{'…' if len(web) > 3 else ''}) cannot run with "
            f"{', '.join(cannot)}: the agent drives the episode's browser through a browser MCP server",
            hint="use claude-code, codex, opencode, gemini-cli, qwen-code or browser-use",
        )


def say_context(agent: str, model: str, cfg: RunConfig, say: Say) -> None:
    """One warning line to `say` when the agent's fixed prompt cannot fit the model's context, naming the fix."""
    from hrl.runners.agents import AGENTS, get_agent
    from hrl.runners.agents.fit import fit
    from hrl.runners.whitebox.harness import is_python_agent

    if is_python_agent(agent):  # a white-box agent's prompt is its own code's: nothing measured to compare
        return
    options, proxy = cfg.engine_options, cfg.proxy_options()
    found = fit(agent, model, options, proxy)
    if found is None or found.fits:
        return
    coders = [n for n in sorted(AGENTS) if n != agent and not get_agent(n).drives_browser]
    others = [f for name in coders if (f := fit(name, model, options, proxy)) and f.fits]
    fitting = ", ".join(f"{f.agent} (~{f.prompt_tokens / 1000:.0f}k)" for f in others) or "none on this model"
    say(
        f"Warning: {agent}'s fixed prompt (system prompt + tool schemas) is about {found.prompt_tokens:,} tokens on "
        f"this model, more than its context of {found.context:,} tokens: every episode will end in "
        f"context_overflow. Use a model with a larger context (max_position_embeddings), or an agent whose prompt "
        f"fits: {fitting}."
    )


LOCAL_WARNING = (  # `hrl rollout --sandbox local`: said before anything starts
    "Warning: --sandbox local runs the agent as your user on this machine{how}: host secrets stay out of its "
    "environment{hidden}, but it can read the rest of what you can. Use --sandbox docker for agents you do not "
    "trust (docs/security.md)."
)


def local_warning() -> str:
    """The one-line warning for --sandbox local, saying whether bubblewrap isolates it on this machine. Raises
    SandboxUnavailableError where bubblewrap is installed but cannot set a sandbox up (`isolation`)."""
    import os

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


def check_rollout(cfg: RunConfig, say: Say) -> None:
    """`hrl rollout`'s config: its placement, agent and model, and the names and paths it gives checked."""
    from hrl.runners.recipe_config import require_model

    check_placement(cfg)
    if not ({"agent", "agents"} & cfg.rollout.model_fields_set):
        raise UsageError("give --agent (the recipe names none)", hint="`hrl agents ls` lists the agents")
    require_model(cfg, "hrl:tiny (a tiny local model)")
    check_run(cfg, cfg.engine, cfg.tasks, say=say)  # names and paths first: nothing has started yet


def check_training(cfg: RunConfig, say: Say) -> None:
    """`hrl train`'s config, typed and validated already (the rules across fields, such as an async buffer that
    cannot hold a batch, are the config's own): the names, paths and keys the run needs, checked before anything
    starts; `proxy.sampling` set to honest. The model is checked once it is materialized."""
    from hrl.runners.recipe_config import require_model

    check_gpu_plan(cfg)  # no model is built, no engine checked, for settings that cannot work
    check_online_settings(cfg)  # and, with --serve, the settings an online run would ignore
    require_model(cfg, "hrl:tiny (a tiny local model)")
    check_honest_sampling(cfg)
    cfg.for_training()  # in the run's config.json: what every call sampled with
    check_placement(cfg)
    check_turn_credit(cfg)
    check_run(cfg, cfg.engine, cfg.tasks, say=say)
    if cfg.eval_tasks:  # held-out tasks: read whole now too (`-c eval_tasks=` runs without evaluations)
        check_tasks(cfg.eval_tasks)


def check_turn_credit(cfg: RunConfig) -> None:
    """`train.credit: turn` (rollout.turn_scores) needs agent CLI episodes (the white-box rollouts record no turn
    scores) graded by a verifier whose class scores turns (`Verifier.scores_turns`): else every trace would fall back."""
    if not cfg.rollout.turn_scores:
        return
    from hrl.registry import lookup
    from hrl.runners.tasks import VERIFIERS
    from hrl.runners.whitebox.harness import is_python_agent

    grade_by_source(cfg, cfg.tasks)  # the verifier a task source implies (miniwob: pages), as check_run finds it
    if white := [a for a in harnesses(cfg) if is_python_agent(a)]:
        raise UsageError(
            f"train.credit=turn scores turns in an agent CLI's sandbox; {white[0]} is a white-box Python agent, whose "
            "episodes record no turn scores",
            hint="use -c train.credit=episode, or an agent CLI (--agent mini-swe-agent)",
        )
    name = cfg.verifier_name
    if not lookup(VERIFIERS, "verifier", name).scores_turns:
        raise UsageError(
            f"train.credit=turn needs a verifier that scores each turn; the {name} verifier cannot",
            hint="use -c train.credit=episode, or tasks graded by their tests (verifier.name: tests)",
        )


def check_harnesses(cfg: RunConfig, names: list[str], engine: str, task_file: str, say: Say) -> None:
    """Every harness in `names` (`hrl eval --agents`) with the run's sandbox, engine and tasks (and how the tasks are
    graded), before anything starts."""
    grade_by_source(cfg, task_file)
    cfg.rollout.agents = []  # --agents names the harnesses (a recipe's rollout.agents is for training)
    for name in names:  # every harness's name, sandbox and the tasks, before anything starts
        one = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"agent": name, "agents": []})})
        check_run(one, engine, task_file, say=say)


def check_tool_prompt(tool_prompt: str) -> None:
    from hrl.runners.proxy.toolprompt import TOOL_PROMPTS

    if tool_prompt not in TOOL_PROMPTS:
        raise UsageError(f"unknown --tool-prompt {tool_prompt!r}", hint="use --tool-prompt auto, hermes or refuse")


def check_proxy_choices(tool_parser: str, reasoning_parser: str, sampling: str, tool_prompt: str, media: str) -> None:
    """The named choices among the proxy's options (`hrl serve`), each a usage error when unknown."""
    from hrl.runners.proxy.reasoning import check_reasoning_name
    from hrl.runners.proxy.toolparsers import check_name

    check_name(tool_parser)
    check_reasoning_name(reasoning_parser)
    if sampling not in ("agent", "honest"):
        raise UsageError(f"unknown --sampling {sampling!r}", hint="use --sampling agent or --sampling honest")
    check_tool_prompt(tool_prompt)
    if media not in ("refuse", "drop"):
        raise UsageError(f"unknown --media {media!r}", hint="use --media refuse or --media drop")


# ---- the GPU layout of a training run ----------------------------------------------------------------------------


def check_gpu_plan(cfg: RunConfig) -> None:
    """Layouts that cannot work on this machine's GPUs, refused before anything starts: CUDA IPC publishes where they
    cannot reach the engine (`_check_ipc`), and an engine that keeps vLLM's default memory share on the trainer's
    GPU (`_check_memory_plan`). The rules that need no GPU to say are the config's own (`RunConfig`)."""
    _check_ipc(cfg)
    _check_memory_plan(cfg)


@functools.cache
def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_ipc(cfg: RunConfig) -> None:
    """`engine_options.weight_sync=ipc` only where the trainer's CUDA tensors can reach the server: full training,
    one trainer process, tensor parallel 1, the trainer on the engine's GPU. Anywhere else the first publish would
    fail after a whole rollout and update, or go by disk without a word."""
    opts, trainer, mode = cfg.engine_options, cfg.trainer, cfg.trainer.mode
    if opts.get("weight_sync") != "ipc":
        return
    disk = "use -c engine_options.weight_sync=disk (safetensors reloaded in place; works in every layout)"
    why = ""
    if mode != "full":
        why = f"trainer.mode={mode} publishes adapters, which vLLM loads from files"
    elif int(opts.get("tensor_parallel_size") or 1) > 1:
        why = (f"engine_options.tensor_parallel_size={opts['tensor_parallel_size']} shards the weights over several "
               "GPUs, and the handles hold the trainer's whole tensors on one")  # fmt: skip
    elif trainer.nproc > 1:
        why = f"trainer.nproc={trainer.nproc} shards the trainer's weights over its ranks"
    elif not (gpus := _gpus(cfg))[0]:
        why = f"trainer.device={trainer.device} trains on the CPU here, in host memory"
    elif gpus[0] != gpus[1]:
        why = (f"the trainer runs on GPU {gpus[0][0]} and the engine on GPU {gpus[1][0]} (split layout), and vLLM "
               "maps the handles on its own GPU")  # fmt: skip
    if why:
        raise UsageError(f"engine_options.weight_sync=ipc sends the trainer's CUDA tensors to a colocated engine, "
                         f"but {why}", hint=disk)  # fmt: skip


def _gpus(cfg: RunConfig) -> tuple[list[int], list[int]]:
    """The GPUs the trainer's ranks run on ([] on the CPU) and those the vLLM engine spans (its first
    tensor_parallel_size of engine_options.gpus, or of all)."""
    opts = cfg.engine_options
    device, nproc = cfg.trainer.device, cfg.trainer.nproc
    if device == "cpu" or (device == "auto" and not _cuda()):
        trainer_gpus: list[int] = []
    elif gpus := list(cfg.trainer.gpus):
        trainer_gpus = gpus[:nproc]
    else:
        trainer_gpus = [int(device.split(":")[1])] if ":" in device and nproc == 1 else list(range(nproc))
    tp = int(opts.get("tensor_parallel_size") or 1)
    return trainer_gpus, ([int(g) for g in opts.get("gpus") or []] or list(range(tp)))[:tp]


def _check_memory_plan(cfg: RunConfig) -> None:
    """A vLLM engine that shares a GPU with the trainer and never sleeps needs a memory share the trainer can live
    beside: at vLLM's default (0.9 of the GPU) the trainer is built in the tenth that is left and runs out of memory
    at its first update, after a whole rollout."""
    opts = cfg.engine_options
    if cfg.engine != "vllm" or opts.get("sleep_level") or opts.get("gpu_memory_utilization"):
        return
    if cfg.placement.kind == "ray" and (cfg.placement.trainer == "ray" or cfg.placement.replica_gpus):
        return  # Ray gives each replica (replica_gpus) and each trainer rank (placement.trainer=ray) GPUs of its own
    trainer_gpus, engine_gpus = _gpus(cfg)
    if shared := sorted(set(trainer_gpus) & set(engine_gpus)):
        raise UsageError(
            f"the trainer and the vLLM engine share GPU {', '.join(map(str, shared))}, and the engine never sleeps "
            "(engine_options.sleep_level=0) at vLLM's default memory share (0.9 of the GPU): the trainer would be "
            "built in the tenth that is left",
            hint="give vLLM what the trainer leaves (-c engine_options.gpu_memory_utilization=X, X measured for "
            "your model by `python bench/gpu.py --only memory_plan --model M`), put it to sleep around each update "
            "(-c engine_options.sleep_level=1), or give each its own GPUs (engine_options.gpus, trainer.gpus)",
        )


# ---- an online run (`hrl train --serve`) -------------------------------------------------------------------------

# Settings an online run reads nowhere (its episodes, tasks and groups are the clients'), and what acts instead.
IGNORED = {
    "train.group_size": "a group is the sessions a client opens with the same group",
    "train.tasks_per_iteration": "clients choose the tasks",
    "train.task_sampler": "clients choose the tasks",
    "train.sampler_key": "clients choose the tasks",
    "async.max_in_flight": "clients run their own sessions (online.max_open_per_key bounds each key)",
    "async.max_failed_groups": "no episode is started here to fail",
    "async.pace": "clients start their own sessions: nothing is admitted here to pace",
    "tasks": "episodes come from the clients (held-out tasks: eval_tasks)",
}


def _value(cfg: dict[str, Any], key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_online_settings(cfg: RunConfig) -> None:
    """With `online.enabled` (--serve): refuse, before anything starts, the `IGNORED` settings that this run's `-c`
    gave (its value differs from the recipe's), naming each, what acts instead, and the one that sets a step's
    size (async.batch_traces). The recipe's own values are left alone: a recipe serves both kinds of run."""
    if not cfg.serves_clients:
        return
    from hrl.runners.recipe_config import load_recipe_config

    recipe = load_recipe_config(cfg.recipe) if cfg.recipe else {}
    dumped = cfg.dump()  # by the names a recipe uses: the settings are named as they were given
    given = [k for k in IGNORED if _value(dumped, k) not in (None, "") and _value(dumped, k) != _value(recipe, k)]
    if not given:
        return
    why = "; ".join(dict.fromkeys(IGNORED[k] for k in given))
    raise UsageError(
        f"an online run (--serve) ignores {', '.join(f'{k}={_value(dumped, k)}' for k in given)}: a step trains on "
        f"the next async.batch_traces={cfg.async_.batch_traces} final traces clients send, in the groups they send "
        f"them ({why})",
        hint="drop those -c settings; -c async.batch_traces=N sets how many traces a step waits for",
    )
