"""Qwen Code (npm `@qwen-code/qwen-code`): OpenAI chat/completions, streaming.

Measured (agent-clis.md §4): redirected by OPENAI_* variables plus `--auth-type openai`; message contents arrive
as arrays of text parts. Its managed-memory subagent makes an extra call after the answer unless turned off in
settings (done below). It resolves no other host.
"""

from __future__ import annotations

import json

from hrl.runners.agents.base import AgentContext, AgentRunner, ScriptedTurn, shell_turns

__all__ = ["QwenCodeRunner"]


class QwenCodeRunner(AgentRunner):
    name = "qwen-code"
    version = "0.15.10"
    fixed_prompt_chars = 65_260  # system prompt + tool schemas of its first request, measured
    package_kind = "npm"
    package = "@qwen-code/qwen-code"
    bin = "qwen"
    install_scripts = False
    dialect = "chat"
    needs_tty = False
    mcp_tool = "mcp__{server}__{tool}"  # what the model calls a tool of an MCP server in its config (AgentContext.mcp)
    image_tool = ("read_file", "file_path")  # read_file sends an image_url part (vision models: ctx.vision)

    def files(self, ctx: AgentContext) -> dict[str, str]:
        settings = {
            "security": {"auth": {"selectedType": "openai"}},
            # modalities: else read_file answers an image "This model does not support image input" (qwen-code
            # guesses them from the model's name, and hrl's is none it knows)
            "model": {
                "name": ctx.model,
                **({"generationConfig": {"modalities": {"image": True}}} if ctx.vision else {}),
            },
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            **(
                {
                    "mcpServers": {
                        n: {"command": argv[0], "args": argv[1:], "trust": True} for n, argv in ctx.mcp.items()
                    }
                }
                if ctx.mcp
                else {}
            ),
            "general": {"enableAutoUpdate": False},
        }
        return {".qwen/settings.json": json.dumps(settings, indent=2)}

    def env(self, ctx: AgentContext) -> dict[str, str]:
        return {"OPENAI_BASE_URL": ctx.openai_base, "OPENAI_API_KEY": ctx.api_key, "OPENAI_MODEL": ctx.model}

    def command(self, ctx: AgentContext) -> list[str]:
        return [
            self.bin, "--auth-type", "openai", "-m", ctx.model, "--approval-mode", "yolo", "-o", "stream-json",
            f"--prompt={ctx.prompt}",  # one word: a task may start with a dash
        ]  # fmt: skip

    def smoke_turns(self, path: str, text: str) -> list[ScriptedTurn]:
        turns = shell_turns("run_shell_command", "command", path, text)
        return [turns[0], *turns]  # its first prompt already holds one (injected) assistant turn
