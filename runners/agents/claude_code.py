"""Claude Code (npm `@anthropic-ai/claude-code`): Anthropic Messages (`/v1/messages?beta=true`), streaming.

Measured (agent-clis.md §3): redirected by environment only; it first sends `HEAD /` to the base URL (the proxy
answers 200), then one Messages call per agent step. The key goes out as `x-api-key`, which names the proxy
session. `--dangerously-skip-permissions` refuses to run as root unless IS_SANDBOX=1. With the DISABLE_* variables
below it resolves no other host.
"""

from __future__ import annotations

import json

from hrl.runners.agents.base import AgentContext, AgentRunner, ScriptedTurn, shell_turns

__all__ = ["ClaudeCodeRunner"]

MCP_CONFIG = ".hrl-mcp.json"  # in HOME: `--mcp-config` with `--strict-mcp-config` (no other MCP settings read)
OFF = (
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    "DISABLE_TELEMETRY",
    "DISABLE_ERROR_REPORTING",
    "DISABLE_AUTOUPDATER",
    "DISABLE_BUG_COMMAND",
    "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE",
)
MODEL_VARS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


def _telemetry(ctx: AgentContext) -> dict[str, str]:
    """OpenTelemetry log events (`claude_code.tool_result`, …) as OTLP/HTTP protobuf to the session's receiver; the
    SDK adds /v1/logs to the endpoint. Metrics off; the key in a header, as the model calls send it."""
    return {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": ctx.base_url.rstrip("/"),
        "OTEL_EXPORTER_OTLP_HEADERS": f"x-api-key={ctx.api_key}",
        "OTEL_LOGS_EXPORT_INTERVAL": "1000",  # ms: events leave within a second, not only at exit
        "OTEL_LOG_TOOL_DETAILS": "1",  # an MCP tool's own name (else `mcp_tool`), its server's, the shell command
    }


class ClaudeCodeRunner(AgentRunner):
    name = "claude-code"
    version = "2.1.197"
    fixed_prompt_chars = 76_500  # system prompt + tool schemas of its first request, measured
    package_kind = "npm"
    package = "@anthropic-ai/claude-code"
    bin = "claude"
    install_scripts = True
    dialect = "anthropic"
    needs_tty = False
    mcp_tool = "mcp__{server}__{tool}"  # what the model calls a tool of an MCP server in its config (AgentContext.mcp)
    image_tool = ("Read", "file_path")  # its Read tool sends a PNG as an image block in the tool_result

    def files(self, ctx: AgentContext) -> dict[str, str]:
        if not ctx.mcp:
            return {}
        servers = {name: {"type": "stdio", "command": argv[0], "args": argv[1:]} for name, argv in ctx.mcp.items()}
        return {MCP_CONFIG: json.dumps({"mcpServers": servers}, indent=2)}

    def env(self, ctx: AgentContext) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": ctx.base_url,  # no /v1: it appends /v1/messages
            "ANTHROPIC_API_KEY": ctx.api_key,
            **dict.fromkeys(MODEL_VARS, ctx.model),
            **dict.fromkeys(OFF, "1"),
            "IS_SANDBOX": "1",  # allows --dangerously-skip-permissions as root
            **(_telemetry(ctx) if ctx.telemetry else {}),
            # its MCP servers connected before the first request (else, slow to start, their tools are missing
            # from it); MCP_TIMEOUT: how long a server may take to start, in ms
            **({"MCP_CONNECTION_NONBLOCKING": "0", "MCP_TIMEOUT": "60000"} if ctx.mcp else {}),
        }

    def command(self, ctx: AgentContext) -> list[str]:
        return [
            self.bin, "-p", "--model", ctx.model, "--output-format", "stream-json", "--verbose",
            "--dangerously-skip-permissions",
            *(["--strict-mcp-config", "--mcp-config", f"{ctx.home}/{MCP_CONFIG}"] if ctx.mcp else []),
            "--", ctx.prompt,  # after "--": a task may start with a dash
        ]  # fmt: skip

    def smoke_turns(self, path: str, text: str) -> list[ScriptedTurn]:
        return shell_turns("Bash", "command", path, text)
