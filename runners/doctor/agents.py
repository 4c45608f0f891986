"""Check agent CLIs end to end: each installed CLI runs one scripted episode through the real recording proxy.

The scripted engine plays the runner's `smoke_turns` (write a file with the CLI's own tool, then finish) as real
token ids of the given model's tokenizer; the proxy serves on TCP (local sandbox) or on a unix socket that the
docker sandbox forwards to 127.0.0.1:<port> inside the container. A CLI passes when it exits 0, the file is
there, and its trace has ≥ 2 main calls in its dialect whose prompts extend each other token-exactly (or, where the
family's template writes an answer's stop token otherwise in the history, fork exactly there).

With `images=True` (`hrl agents doctor --images`), each CLI with an image tool (`runner.image_tool`) writes a PNG
with its shell tool and shows it to the model with its image tool, the scripted engine serving a vision model (the
tiny one by default): it passes when the call after the image tool holds the file's image, the bytes the CLI sent
hashing as the file does, expanded by the model's processor into the very ids the trace records, and kept in the
media folder training reads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import itertools
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hrl.runners.agents import AGENTS, get_agent
from hrl.runners.agents.install import installed
from hrl.runners.agents.run import AgentOutcome
from hrl.runners.engines.scripted import ScriptedTurn
from hrl.runners.errors import HrlError, UsageError
from hrl.runners.rollouts.agent_session import agent_session
from hrl.runners.trace import call_prompt_ids

if TYPE_CHECKING:
    from hrl.runners.serving.stack import Stack

__all__ = [
    "AgentCheck", "Probe", "agents_table", "check_names", "doctor", "image_problems", "image_turns", "probe_agent",
    "probe_png", "scripted_stack", "trace_problems",
]  # fmt: skip

SandboxName = Literal["docker", "local"]
PROBE_FILE, PROBE_TEXT = "hrl-doctor.txt", "ok"
PROBE_IMAGE = "hrl-doctor.png"  # written and read in the workdir (/work) by the image probe


def agents_table() -> list[dict[str, Any]]:
    """One row per registered agent, for `hrl agents ls`."""
    rows = []
    for name in AGENTS:
        r = get_agent(name)
        rows.append(
            {
                "name": name,
                "version": r.version,
                "package": f"{r.package_kind}:{r.package}",
                "dialect": r.dialect,
                "installed_docker": installed(name, "docker") is not None,
                "installed_local": installed(name, "local") is not None,
            }
        )
    return rows


@dataclass
class Probe:
    """One scripted episode: how the CLI ended, its trace, what it wrote, and its start-up time."""

    outcome: AgentOutcome
    trace: dict[str, Any]
    file_text: str | None  # PROBE_FILE's content afterwards (None: not written)
    startup_s: float  # from launching the CLI to its first LLM request


@dataclass
class AgentCheck:
    name: str
    ok: bool
    reason: str  # "" when ok
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


def scripted_stack(model: str, turns: list[Any]) -> contextlib.AbstractAsyncContextManager[Stack]:
    """The real serving stack with a scripted engine that plays `turns` as real token ids of `model`'s tokenizer."""
    from hrl.runners.serving.stack import serving  # aiohttp and the tokenizer load only when a probe runs

    options = {"turns": turns, "max_model_len": 1 << 20}  # agents' system prompts are long
    return serving(model, "scripted", model_name="hrl-model", engine_options=options)


async def probe_agent(
    name: str,
    model: str,
    sandbox: SandboxName = "docker",
    *,
    time_budget_s: float = 180,
    turns: list[Any] | None = None,
    backend: Any = None,
    prompt: str = "",
    media_dir: str | None = None,
) -> Probe:
    """Run one scripted episode of an installed CLI (in a sandbox from `backend`, default: a new one of that kind),
    with `prompt` as the task (default: write the probe word into the probe file). `media_dir`: where the proxy keeps
    the bytes of the images the CLI sends (as a run keeps them beside its traces). Raises PrerequisiteError when it
    is not installed."""
    from hrl.runners.errors import PrerequisiteError
    from hrl.sandboxes import SandboxSpec, get_backend

    runner = get_agent(name)
    inst = installed(name, sandbox)
    if inst is None:
        raise PrerequisiteError(f"agent {name} is not installed for the {sandbox} sandbox",
                                hint=f"hrl agents install {name}")  # fmt: skip
    turns = turns if turns is not None else runner.smoke_turns(PROBE_FILE, PROBE_TEXT)
    prompt = prompt or f"Write the word {PROBE_TEXT} into the file {PROBE_FILE}."
    async with scripted_stack(model, turns) as stack:
        if media_dir is not None:
            stack.proxy.keep_media(media_dir)
        token = stack.proxy.open_session(meta={"metadata": {"probe": name}}).token
        backend = backend or get_backend(sandbox)
        async with agent_session(stack, runner, inst, backend, SandboxSpec(workdir="/work"), token, prompt,
                                 run_id="agents-doctor", episode_id=name) as session:  # fmt: skip
            outcome = await session.run(time_budget_s)
            try:
                file_text: str | None = (await session.sandbox.read_file(PROBE_FILE)).decode(errors="replace")
            except FileNotFoundError:
                file_text = None
        proxy = stack.proxy
        trace = proxy.end_session(token) if token in proxy.sessions else {"calls": [], "tools": []}
    startup = trace["started_at"] - outcome.started_at if trace["calls"] else float("nan")
    return Probe(outcome, trace, file_text, round(startup, 3))


def trace_problems(trace: dict[str, Any], dialect: str) -> list[str]:
    """What is wrong with a probe's trace: too few main calls, another dialect, prompts that do not extend."""
    calls = trace["calls"]
    main = [i for i, c in enumerate(calls) if not c["side"]]
    problems = [] if len(main) >= 2 else [f"{len(main)} main LLM call(s), expected at least 2"]
    problems += [f"call {c['call_id']} spoke {c['dialect']}" for c in calls if c["dialect"] != dialect]
    for a, b in itertools.pairwise(main):
        prev = call_prompt_ids(trace, a) + calls[a]["response_ids"]
        ids = call_prompt_ids(trace, b)
        # a template that writes the sampled stop token otherwise in the history (Harmony: a final answer's
        # <|return|> becomes <|end|>) starts a new branch right there; any other difference is drift
        rewritten_stop = (
            "parent" not in calls[b] and calls[a]["finish_reason"] == "stop" and ids[: len(prev) - 1] == prev[:-1]
        )
        if ids[: len(prev)] != prev and not rewritten_stop:
            problems.append(f"call {calls[b]['call_id']} does not extend call {calls[a]['call_id']} token-exactly")
    return problems


def probe_png() -> bytes:
    """The image probe's PNG: 40×28 pixels, two colours (101 bytes)."""
    from PIL import Image

    image = Image.new("RGB", (40, 28), (200, 30, 30))
    image.paste((30, 60, 200), (20, 0, 40, 28))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _with_image_tool() -> list[str]:
    return [n for n in AGENTS if get_agent(n).image_tool is not None]


def image_tool(name: str) -> tuple[str, str]:
    """The CLI's image tool and its path argument; a UsageError for a CLI with none."""
    tool = get_agent(name).image_tool
    if tool is None:
        raise UsageError(f"{name} has no tool known to send the model an image",
                         hint="the CLIs with one: " + ", ".join(_with_image_tool()))  # fmt: skip
    return tool


def image_turns(name: str, png: bytes, workdir: str = "/work") -> list[ScriptedTurn]:
    """The image probe's script: write `png` into PROBE_IMAGE with the CLI's shell tool (base64-decoded), show it to
    the model with its image tool (by absolute path), then finish."""
    runner = get_agent(name)
    tool, arg = image_tool(name)
    *write, _done = runner.smoke_turns(PROBE_IMAGE, f"{base64.b64encode(png).decode()} | base64 -d")
    return [*write, {"tool_calls": [{"name": tool, "arguments": {arg: f"{workdir}/{PROBE_IMAGE}"}}]}, "Done."]


def image_problems(trace: dict[str, Any], png: bytes, model: str, media_dir: str) -> list[str]:
    """What is wrong with an image probe's trace: the call after the image tool must hold exactly the file's image,
    the model's processor must expand those bytes into the very ids the call records at its placeholder, and the
    bytes must be kept in `media_dir` (where training reads them)."""
    from hrl.runners.engines.base import ImageInput
    from hrl.runners.engines.images import expand_images, load_processor

    main = [i for i, c in enumerate(trace["calls"]) if not c["side"]]
    if len(main) < 3:
        return [f"{len(main)} main LLM call(s), expected 3 (write, show the image, finish)"]
    media = trace["calls"][main[2]].get("media") or []
    sha = hashlib.sha256(png).hexdigest()
    if [m["sha256"] for m in media] != [sha]:
        return [f"the call after the image tool holds images {[m['sha256'][:12] for m in media]}, expected the "
                f"file's {sha[:12]} alone"]  # fmt: skip
    processor, image_token = load_processor(model)
    run = expand_images(processor, image_token, [image_token], [ImageInput(png, "image/png", sha)])[0].prompt_ids
    offset, length = media[0]["placeholder"]
    if call_prompt_ids(trace, main[2])[offset : offset + length] != run:
        return [f"the ids at the image's placeholder ({offset}+{length}) are not the model processor's expansion"]
    kept = Path(media_dir) / sha
    if not kept.is_file() or kept.read_bytes() != png:
        return [f"the image's bytes are not kept as {kept}"]
    return []


async def _check(
    name: str, model: str, sandbox: SandboxName, time_budget_s: float, backend: Any, images: bool = False
) -> AgentCheck:
    """One CLI's probe: the file it writes (or, with `images`, the image it shows the model) and its trace."""
    t0 = time.monotonic()
    if _drives_browser(name):  # no shell and no file tool: what the probe asks of a CLI it cannot do
        return AgentCheck(name, False, f"{name} is a browser agent: the file probe does not apply; run it on a "
                          f"browser task (hrl rollout --recipe browser --agent {name} --sandbox docker --limit 1)", 0.0)  # fmt: skip
    png = probe_png() if images else b""
    with tempfile.TemporaryDirectory(prefix="hrl-doctor-media-") as media:
        script: dict[str, Any] = {}
        try:
            if images:
                script = {"turns": image_turns(name, png), "prompt": f"Look at {PROBE_IMAGE}.", "media_dir": media}
            probe = await probe_agent(name, model, sandbox, time_budget_s=time_budget_s, backend=backend, **script)
        except HrlError as e:
            reason = f"{e} (fix: {e.hint})" if e.hint else str(e)
            return AgentCheck(name, False, reason, round(time.monotonic() - t0, 1))
        except Exception as e:  # a broken sandbox or proxy: report it for this CLI and go on with the next
            return AgentCheck(name, False, f"{type(e).__name__}: {e}", round(time.monotonic() - t0, 1))
        out, trace = probe.outcome, probe.trace
        problems = [] if out.ok else [f"{out.failure_reason} (exit {out.exit_code}): {_last_line(out)}"]
        if not images and (probe.file_text is None or probe.file_text.strip() != PROBE_TEXT):
            problems.append(f"{PROBE_FILE} holds {probe.file_text!r}, expected {PROBE_TEXT!r}")
        problems += trace_problems(trace, get_agent(name).dialect)
        if images and not problems:
            problems += image_problems(trace, png, model, media)
    details = {"calls": len(trace["calls"]), "startup_s": probe.startup_s, "agent_s": out.duration_s}
    if images:
        details["image"] = next((c["media"][0] for c in trace["calls"] if c.get("media")), {})
    return AgentCheck(name, not problems, "; ".join(problems), round(time.monotonic() - t0, 1), details)


def _drives_browser(name: str) -> bool:
    return get_agent(name).drives_browser


def _last_line(out: AgentOutcome) -> str:
    lines = (out.stderr_tail.strip() or out.stdout_tail.strip()).splitlines()
    return lines[-1][:300] if lines else "no output"


def check_names(names: list[str] | None, sandbox: SandboxName, images: bool = False) -> None:
    """Refuse, before anything starts, an unknown CLI, and for the image probe a sandbox other than Docker or a CLI
    with no image tool."""
    if images and sandbox != "docker":
        raise UsageError(
            "the image probe runs in Docker sandboxes (the CLIs' image tools take an absolute path, which a local "
            "sandbox's workdir is not)",
            hint="hrl agents doctor --images --sandbox docker",
        )
    for n in names or []:
        get_agent(n)
        if images:
            image_tool(n)


def doctor(
    names: list[str] | None,
    model: str,
    sandbox: SandboxName = "docker",
    *,
    time_budget_s: float = 180,
    images: bool = False,
) -> list[AgentCheck]:
    """Probe each named CLI (default: every installed one; with `images`, every installed one with an image tool)
    once; a CLI not installed is a ✗ with the fix."""
    check_names(names, sandbox, images)
    if images:
        from hrl.runners.engines.images import model_has_vision
        from hrl.runners.models import resolve_model

        if not model_has_vision(resolve_model(model)):
            raise UsageError(
                f"{model} is not a vision model: the image probe needs one",
                hint="leave --model out for the tiny one, or build one: `hrl models tiny DIR --vision`",
            )
    names = names or [
        n
        for n in AGENTS
        if installed(n, sandbox) is not None and not _drives_browser(n) and (not images or n in _with_image_tool())
    ]

    async def all_checks() -> list[AgentCheck]:
        from hrl.sandboxes import get_backend

        backend = get_backend(sandbox)
        return [await _check(n, model, sandbox, time_budget_s, backend, images) for n in names]

    return asyncio.run(all_checks())
