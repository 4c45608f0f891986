"""Gemini CLI (npm `@google/gemini-cli`): the Gemini API (`…:streamGenerateContent?alt=sse`); no OpenAI mode.

Measured (agent-clis.md §5): redirected by GOOGLE_GEMINI_BASE_URL (the proxy root; it appends /v1beta/…) and
GEMINI_API_KEY (sent as x-goog-api-key, which names the proxy session). npm's skipped node-pty build only makes
the shell tool fall back to child_process. With the settings below it resolves no other host.
"""

from __future__ import annotations

import json

from hrl.runners.agents.base import AgentContext, AgentRunner, ScriptedTurn, shell_turns

__all__ = ["GeminiCliRunner"]


def _telemetry(ctx: AgentContext) -> dict[str, object]:
    """settings.json `telemetry`: OTLP/HTTP protobuf to the session's receiver (target local, otlpProtocol http:
    packages/core/src/telemetry/sdk.ts adds v1/logs, v1/traces, v1/metrics to otlpEndpoint), prompts not logged."""
    if not ctx.telemetry:
        return {"enabled": False}
    return {"enabled": True, "target": "local", "otlpEndpoint": ctx.base_url.rstrip("/"), "otlpProtocol": "http",
            "logPrompts": False}  # fmt: skip


class GeminiCliRunner(AgentRunner):
    name = "gemini-cli"
    version = "0.61.0"
    fixed_prompt_chars = 50_330  # system prompt + tool schemas of its first request, measured
    package_kind = "npm"
    package = "@google/gemini-cli"
    bin = "gemini"
    install_scripts = False
    dialect = "gemini"
    needs_tty = False
    mcp_tool = "mcp_{server}_{tool}"  # what the model calls a tool of an MCP server in its config (AgentContext.mcp)
    image_tool = ("read_file", "file_path")  # read_file sends inlineData in the functionResponse

    def files(self, ctx: AgentContext) -> dict[str, str]:
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "model": {"name": ctx.model},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": _telemetry(ctx),
            **(
                {
                    "mcpServers": {
                        n: {"command": argv[0], "args": argv[1:], "trust": True} for n, argv in ctx.mcp.items()
                    }
                }
                if ctx.mcp
                else {}
            ),
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        }
        return {".gemini/settings.json": json.dumps(settings, indent=2)}

    def env(self, ctx: AgentContext) -> dict[str, str]:
        return {
            "GOOGLE_GEMINI_BASE_URL": ctx.base_url,
            "GEMINI_API_KEY": ctx.api_key,
            "GEMINI_MODEL": ctx.model,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            # settings.json has no headers field; its OTLP/HTTP exporters merge this variable into theirs
            # (opentelemetry-js otlp-exporter-base: convertLegacyHttpOptions, getNodeHttpConfigurationFromEnvironment)
            **({"OTEL_EXPORTER_OTLP_HEADERS": f"x-api-key={ctx.api_key}"} if ctx.telemetry else {}),
        }

    def command(self, ctx: AgentContext) -> list[str]:
        # --prompt=TASK as one word: a task may start with a dash
        return [self.bin, "-m", ctx.model, "--yolo", "-o", "stream-json", f"--prompt={ctx.prompt}"]

    def smoke_turns(self, path: str, text: str) -> list[ScriptedTurn]:
        return shell_turns("run_shell_command", "command", path, text)
