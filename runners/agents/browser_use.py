"""browser-use (PyPI `browser-use`): a browser agent library, run as deployed: its own `Agent` loop, its own prompts
and its OpenAI client (chat/completions, not streaming, a JSON-schema `response_format` per step) against the proxy.

It is a library, not a CLI: hrl writes a short driver (`browser_use_agent.py`) into the episode's HOME that builds
`Agent(task, llm, browser)` with `ChatOpenAI(base_url=<proxy>)` and `Browser(cdp_url=…)` on the episode's browser
(`browser.json`, forwarded into the sandbox), and runs it. The same file is the white-box form
(`--agent python:hrl.runners.agents.browser_use_agent:run` with `rollout.python: browser-use`). It lives in a venv of its own (it
pins exact versions of pydantic, anthropic, protobuf and others that hrl's own environment cannot take), so it runs
in a sandbox like the Python CLIs. Browser tasks only.
Telemetry, cloud sync and the LLM judge are off; `rollout.agent_options.max_steps` (default 10) bounds its steps (no
extra "final response" call past them).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from hrl.runners.agents.base import AgentContext, AgentRunner, ScriptedTurn

__all__ = ["BrowserUseRunner"]

DRIVER = ".hrl-browser-use.py"  # in HOME: browser_use_agent.py, run by the library's venv in the sandbox


@functools.cache
def _driver() -> str:
    return (Path(__file__).parent / "browser_use_agent.py").read_text()


class BrowserUseRunner(AgentRunner):
    name = "browser-use"
    version = "0.13.14"
    fixed_prompt_chars = 24_100  # its system prompt, measured; each step's page state and history come on top
    package_kind = "pypi"
    package = "browser-use"
    bin = "python"
    install_scripts = False
    dialect = "chat"
    needs_tty = False
    mcp_tool = None  # it drives the browser itself over CDP (drives_browser)
    image_tool = None
    drives_browser = True  # browser tasks: it connects to the episode's browser itself, given no MCP server

    def files(self, ctx: AgentContext) -> dict[str, str]:
        return {DRIVER: _driver()}

    def env(self, ctx: AgentContext) -> dict[str, str]:
        return {
            "OPENAI_API_KEY": ctx.api_key,
            "ANONYMIZED_TELEMETRY": "false",
            "BROWSER_USE_CLOUD_SYNC": "false",
            "BROWSER_USE_CLOUD_HINTS": "false",
            "BROWSER_USE_CONFIG_DIR": f"{ctx.home}/.config/browseruse",
            "BROWSER_USE_LOGGING_LEVEL": "info",
        }

    def command(self, ctx: AgentContext) -> list[str]:
        steps = int(ctx.options.get("max_steps", 10))
        return [self.bin, f"{ctx.home}/{DRIVER}", ctx.openai_base, ctx.model, str(steps), "1" if ctx.vision else "0",
                ctx.prompt]  # fmt: skip

    def smoke_turns(self, path: str, text: str) -> list[ScriptedTurn]:
        """No shell and no file tool: the smoke probe does not apply (`hrl agents doctor` leaves it out)."""
        return [json.dumps({"action": [{"done": {"text": text, "success": True}}]})]
