"""opencode (npm `opencode-ai`): OpenAI chat/completions, always streaming, through a custom provider.

Measured (docs: shared notes, agent-clis.md §1): the provider lives in opencode.json (`@ai-sdk/openai-compatible`
is bundled, nothing is fetched); every run first makes a title-generation side call with `small_model` and no
tools (the proxy flags it `side`); state goes to ~/.local/share/opencode, so the fresh HOME isolates episodes.
Each run still resolves registry.npmjs.org once (its embedded plugin installer); that fails harmlessly offline and
no flag turns it off.
"""

from __future__ import annotations

import json
from typing import Any

from hrl.runners.agents.base import AgentContext, AgentRunner, ScriptedTurn, shell_turns

__all__ = ["OpencodeRunner"]

CONFIG = ".config/opencode/opencode.json"


class OpencodeRunner(AgentRunner):
    name = "opencode"
    version = "1.18.33"
    fixed_prompt_chars = 29_560  # system prompt + tool schemas of its first request, measured
    package_kind = "npm"
    package = "opencode-ai"
    bin = "opencode"
    install_scripts = True
    dialect = "chat"
    needs_tty = False
    mcp_tool = "{server}_{tool}"  # what the model calls a tool of an MCP server in its config (AgentContext.mcp)
    image_tool = (
        "read",
        "filePath",
    )  # its read tool attaches a PNG in a user message after the tool result (vision models)

    def files(self, ctx: AgentContext) -> dict[str, str]:
        # its context limit (agent_options.context_tokens, default 32768): past it, opencode compacts the session
        context = int(ctx.options.get("context_tokens", 32768))
        model: dict[str, Any] = {"name": ctx.model, "tool_call": True, "limit": {"context": context, "output": 4096}}
        if ctx.vision:  # else its read tool answers an image with "this model does not support image input"
            model |= {"attachment": True, "modalities": {"input": ["text", "image"], "output": ["text"]}}
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "hrl": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "hrl proxy",
                    "options": {"baseURL": ctx.openai_base, "apiKey": ctx.api_key},
                    "models": {ctx.model: model},
                }
            },
            "model": f"hrl/{ctx.model}",
            "small_model": f"hrl/{ctx.model}",
            "enabled_providers": ["hrl"],
            "autoupdate": False,
            "share": "disabled",
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny", "external_directory": "allow"},
            **(
                {"mcp": {n: {"type": "local", "command": argv, "enabled": True} for n, argv in ctx.mcp.items()}}
                if ctx.mcp
                else {}
            ),
        }
        return {CONFIG: json.dumps(config, indent=2)}

    def env(self, ctx: AgentContext) -> dict[str, str]:
        return {
            "OPENCODE_CONFIG": f"{ctx.home}/{CONFIG}",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",  # no models.dev
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",  # ignore any ~/.claude
        }

    def command(self, ctx: AgentContext) -> list[str]:
        # the task after "--": it may start with a dash
        return [self.bin, "run", "-m", f"hrl/{ctx.model}", "--format", "json", "--", ctx.prompt]

    def smoke_turns(self, path: str, text: str) -> list[ScriptedTurn]:
        return shell_turns("bash", "command", path, text)
