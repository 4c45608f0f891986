"""The agent-runner protocol: an agent CLI as data plus a few hooks.

A runner says which package to install (pinned), which wire dialect the CLI speaks, which config files go into the
fresh HOME, which environment redirects it to the session's proxy (telemetry and auto-update off), and which
headless, auto-approving command runs it. Everything else (HOME, workdir, time budget, exit code, kill) is the
lifecycle in `runners.agents.run`, written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from hrl.runners.engines.scripted import ScriptedTurn

__all__ = ["AgentContext", "AgentRunner", "DialectName", "PackageKind", "ScriptedTurn", "shell_turns"]

PackageKind = Literal["npm", "pypi"]
DialectName = Literal["chat", "responses", "anthropic", "gemini"]  # a key of runners.proxy.dialects.DIALECTS


@dataclass(frozen=True)
class AgentContext:
    """What one episode's agent needs to know; every path is as seen from inside the sandbox."""

    base_url: str  # the session's proxy root, e.g. http://127.0.0.1:8000/s/<token> (no /v1)
    api_key: str  # hrl-<token>: also names the session
    model: str  # model name the agent asks for
    prompt: str  # the task, given to the CLI as its one headless message
    home: str  # a fresh, empty HOME for this episode
    workdir: str  # the task's files; the CLI runs here
    install_dir: str  # the CLI's install root (npm prefix, or the dir holding `venv/`)
    options: dict[str, Any] = field(
        default_factory=dict
    )  # agent-specific knobs from the recipe (rollout.agent_options)
    vision: bool = False  # the served model takes images: tells CLIs that send images only where configured to
    # MCP servers the CLI starts over stdio (name -> argv inside the sandbox), each configured through the CLI's own
    # MCP settings: the episode's browser server on browser tasks (`install_mcp`)
    mcp: dict[str, list[str]] = field(default_factory=dict)

    @property
    def openai_base(self) -> str:
        """The OpenAI-style base URL (`…/v1`)."""
        return f"{self.base_url.rstrip('/')}/v1"

    @property
    def telemetry(self) -> bool:
        """Whether a CLI that exports OpenTelemetry sends it to the session's receiver (`<base_url>/v1/logs`, its
        tool calls as it timed them; runners/proxy/otel_in.py): `rollout.agent_options.telemetry`, default on."""
        return self.options.get("telemetry", True) is not False


class AgentRunner(Protocol):
    """What every runner is; the runners inherit it (the members with a value or a body are defaults)."""

    name: str  # registry name, e.g. "opencode"
    version: str  # pinned package version
    package_kind: PackageKind
    package: str  # npm or PyPI package name
    bin: str  # the executable the package installs
    install_scripts: bool  # npm: run the packages' install scripts (only where the CLI needs them to link its binary)
    dialect: DialectName  # the wire API it speaks to the proxy
    needs_tty: bool = False  # run under a pseudo-terminal (none of the supported CLIs needs one)
    # How the model names a tool of an MCP server the CLI starts (AgentContext.mcp), `{server}` and `{tool}` filled
    # in, measured at the pinned version; None: no MCP client (browser tasks refuse the CLI)
    mcp_tool: str | None = None
    # Characters of what the CLI sends before the task (system prompt, tool schemas) on its first request, measured
    # at the pinned version; `runners.agents.fit` turns it into tokens of a model to say up front when it cannot fit.
    # 0: not measured.
    fixed_prompt_chars: int = 0
    # The CLI's own tool that shows the model an image file, and its path argument, where measured at the pinned
    # version to send the image to the model (`hrl agents doctor --images`); None where it sends none.
    image_tool: tuple[str, str] | None = None
    # Browser tasks: the CLI connects to the episode's browser itself (over CDP), given no browser MCP server.
    drives_browser: bool = False
    # A warm sandbox starts the harness ahead (runners/agents/warm.py, PyPI runners): the modules its Python imports
    # then, and the fixed part of `env` it imports them under; none: no warm start.
    warm_imports: tuple[str, ...] = ()
    warm_env: ClassVar[dict[str, str]] = {}

    def files(self, ctx: AgentContext) -> dict[str, str]:
        """Config files to write before the run: path (relative = under HOME) -> content."""
        ...

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """Environment that points the CLI at the proxy and turns off telemetry and updates."""
        ...

    def command(self, ctx: AgentContext) -> list[str]:
        """The headless, auto-approving command line (bin first, found on PATH)."""
        ...

    def smoke_turns(self, path: str, text: str) -> list[ScriptedTurn]:
        """Scripted assistant turns (see ScriptedEngineConfig.turns) that make this CLI write `text` and a newline
        into `path` (relative to the workdir) with its own tools, then finish: `hrl agents doctor` and the tests."""
        ...


def shell_turns(tool: str, arg: str, path: str, text: str, done: ScriptedTurn = "Done.") -> list[ScriptedTurn]:
    """The usual smoke script: one call of the shell tool `tool` (command in argument `arg`), then `done`."""
    return [{"tool_calls": [{"name": tool, "arguments": {arg: f"echo {text} > {path}"}}]}, done]
