"""mini-swe-agent (PyPI `mini-swe-agent`): OpenAI chat/completions through litellm, not streaming, one `bash` tool.

Measured (agent-clis.md §6): the model is `openai/<name>` with `model.model_kwargs.api_base`; any `-c` drops the
default config unless `mini.yaml` is named first. The episode ends only when the agent runs
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`; plain text is a format error it retries. Unknown models make cost
tracking raise unless MSWEA_COST_TRACKING=ignore_errors; LITELLM_LOCAL_MODEL_COST_MAP keeps litellm off GitHub.
"""

from __future__ import annotations

from typing import ClassVar

from hrl.runners.agents.base import AgentContext, AgentRunner, ScriptedTurn, shell_turns

__all__ = ["SUBMIT_COMMAND", "MiniSweAgentRunner"]

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _bash(command: str) -> ScriptedTurn:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


class MiniSweAgentRunner(AgentRunner):
    name = "mini-swe-agent"
    version = "2.4.6"
    fixed_prompt_chars = 3_470  # system prompt + tool schemas of its first request, measured
    package_kind = "pypi"
    package = "mini-swe-agent"
    bin = "mini"
    install_scripts = False
    dialect = "chat"
    needs_tty = False
    mcp_tool = None  # no MCP client: browser tasks refuse it
    image_tool = None  # only a shell tool: text out

    def files(self, ctx: AgentContext) -> dict[str, str]:
        return {}

    # A warm sandbox imports litellm ahead (runners/agents/warm.py): ~4 s of the ~5 s mini spends before its first
    # request. Its environment then is the fixed part of `env`, what litellm reads at import.
    warm_imports = ("litellm",)
    warm_env: ClassVar[dict[str, str]] = {
        "MSWEA_CONFIGURED": "true",  # no setup wizard
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }

    def env(self, ctx: AgentContext) -> dict[str, str]:
        return {"OPENAI_API_KEY": ctx.api_key, **self.warm_env}

    def command(self, ctx: AgentContext) -> list[str]:
        return [
            self.bin, "-m", f"openai/{ctx.model}", "-t", ctx.prompt, "--yolo", "--exit-immediately",
            "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={ctx.openai_base}",
            "-o", f"{ctx.home}/trajectory.json",
            "-c", f"agent.step_limit={int(ctx.options.get('step_limit', 30))}",
        ]  # fmt: skip

    def smoke_turns(self, path: str, text: str) -> list[ScriptedTurn]:
        return shell_turns("bash", "command", path, text, done=_bash(SUBMIT_COMMAND))
