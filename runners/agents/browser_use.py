"""browser-use (PyPI `browser-use`): a browser agent library, run as deployed: its own `Agent` loop, its own prompts
and its OpenAI client (chat/completions, not streaming, a JSON-schema `response_format` per step) against the proxy.

It is a library, not a CLI: hrl writes a short driver into the episode's HOME that builds `Agent(task, llm, browser)`
with `ChatOpenAI(base_url=<proxy>)` and `Browser(cdp_url=…)` on the episode's browser (`browser.json`, forwarded into
the sandbox), and runs it. It lives in a venv of its own (it pins exact versions of pydantic, anthropic, protobuf and
others that hrl's own environment cannot take), so it runs in a sandbox like the Python CLIs. Browser tasks only.
Telemetry, cloud sync and the LLM judge are off; `rollout.agent_options.max_steps` (default 10) bounds its steps (no
extra "final response" call past them).
"""

from __future__ import annotations

import json

from hrl.runners.agents.base import AgentContext, ScriptedTurn

__all__ = ["BrowserUseRunner"]

DRIVER = ".hrl-browser-use.py"
_DRIVER = '''"""hrl's driver for browser-use: the episode's task on the episode's browser. Usage: DRIVER BASE MODEL STEPS VISION TASK"""
import asyncio, json, os, sys

from browser_use import Agent, Browser
from browser_use.llm.openai.chat import ChatOpenAI


async def main(base, model, steps, vision, task):
    with open("browser.json") as f:
        cdp = json.load(f)["cdp_url"]
    endpoint = "http://" + cdp.split("://", 1)[1].split("/", 1)[0]  # it reads /json/version there
    llm = ChatOpenAI(model=model, base_url=base, api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
    browser = Browser(cdp_url=endpoint, keep_alive=True)  # hrl's browser: the episode's own, stopped by hrl
    agent = Agent(task=task, llm=llm, browser=browser, use_vision=vision == "1", use_judge=False,
                  directly_open_url=False, enable_planning=False, calculate_cost=False, max_failures=2,
                  final_response_after_failure=False, enable_signal_handler=False)
    history = await agent.run(max_steps=int(steps))
    print(json.dumps({"done": history.is_done(), "steps": history.number_of_steps(), "result": history.final_result()}))


asyncio.run(main(*sys.argv[1:6]))
'''


class BrowserUseRunner:
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
        return {DRIVER: _DRIVER}

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
