"""Codex CLI (npm `@openai/codex`): OpenAI Responses API only (`wire_api = "chat"` was removed), streaming.

Measured (agent-clis.md §2): only a custom `[model_providers.*]` entry talks plain HTTP SSE to a base URL
(`OPENAI_BASE_URL` is ignored; the built-in provider tries WebSockets first); the key comes from the env var named
by `env_key`. Top-level TOML keys must precede every table. With plugins, apps, web search, multi-agent and the
other features below off it contacts no other host and offers only function tools (`exec_command`, …). It reads
extra input from stdin, which the lifecycle closes.
"""

from __future__ import annotations

import json

from hrl.runners.agents.base import AgentContext, AgentRunner, ScriptedTurn, shell_turns

__all__ = ["CodexRunner"]

KEY_VAR = "HRL_API_KEY"
FEATURES_OFF = (
    "goals",
    "plugins",
    "apps",
    "remote_plugin",
    "image_generation",
    "tool_suggest",
    "skill_mcp_dependency_install",
)


def _exporter(ctx: AgentContext) -> str:
    """`[otel] exporter`: OTLP/HTTP protobuf to the session's receiver (`codex.tool_result`, `codex.tool_decision`
    log events), or none. The TOML shape is codex's `OtelExporterKind` (codex-rs config types: kebab-case
    `otlp-http = {endpoint, protocol = "binary" | "json", headers}`); the endpoint is used as given."""
    if not ctx.telemetry:
        return '"none"'
    q = json.dumps
    endpoint = f"{ctx.base_url.rstrip('/')}/v1/logs"
    return f'{{ otlp-http = {{ endpoint = {q(endpoint)}, protocol = "binary", headers = {{ "x-api-key" = {q(ctx.api_key)} }} }} }}'


def _config(ctx: AgentContext) -> str:
    q = json.dumps  # a JSON string is a valid TOML basic string
    lines = [
        f"model = {q(ctx.model)}",
        'model_provider = "hrl"',
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        "check_for_update_on_startup = false",
        'web_search = "disabled"',
        'model_reasoning_effort = "none"',
        "[analytics]\nenabled = false",
        "[feedback]\nenabled = false",
        f"[otel]\nexporter = {_exporter(ctx)}",
        "[agents]\nenabled = false",  # drops the multi_agent namespace tool
        "[features]",
        *(f"{f} = false" for f in FEATURES_OFF),
        "[model_providers.hrl]",
        'name = "hrl proxy"',
        f"base_url = {q(ctx.openai_base)}",
        f"env_key = {q(KEY_VAR)}",
        'wire_api = "responses"',
        "request_max_retries = 0",
        "stream_max_retries = 0",
        "stream_idle_timeout_ms = 600000",
    ]
    for name, argv in ctx.mcp.items():  # stdio servers; absolute paths, so codex's trimmed server env does
        # required: the first request waits for the server's tools (else codex sends it without them when the server
        # starts slowly); approve: its tools run without asking, as approval_policy never says for the others
        lines += [f"[mcp_servers.{name}]", f"command = {q(argv[0])}", f"args = {q(argv[1:])}",
                  "startup_timeout_sec = 60", "required = true", 'default_tools_approval_mode = "approve"']  # fmt: skip
    return "\n".join(lines) + "\n"


class CodexRunner(AgentRunner):
    name = "codex"
    version = "0.171.0"
    fixed_prompt_chars = 24_390  # system prompt + tool schemas of its first request, measured
    package_kind = "npm"
    package = "@openai/codex"
    bin = "codex"
    install_scripts = False
    dialect = "responses"
    needs_tty = False
    mcp_tool = "mcp__{server}__{tool}"  # its namespace mcp__SERVER, flattened by the proxy
    image_tool = ("view_image", "path")  # view_image sends an input_image in the function_call_output

    def files(self, ctx: AgentContext) -> dict[str, str]:
        return {".codex/config.toml": _config(ctx)}

    def env(self, ctx: AgentContext) -> dict[str, str]:
        return {"CODEX_HOME": f"{ctx.home}/.codex", KEY_VAR: ctx.api_key}

    def command(self, ctx: AgentContext) -> list[str]:
        # the prompt after `--`: a task text that starts with `-` (or is `help`, `resume`, …) is still the prompt
        return [
            self.bin, "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--", ctx.prompt,
        ]  # fmt: skip

    def smoke_turns(self, path: str, text: str) -> list[ScriptedTurn]:
        return shell_turns("exec_command", "cmd", path, text)
