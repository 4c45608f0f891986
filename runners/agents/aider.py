"""aider (PyPI `aider-chat`): OpenAI chat/completions through litellm, streaming, no tools.

Measured (agent-clis.md §7): edits come as SEARCH/REPLACE blocks in the reply text (`--edit-format diff`), applied
without asking under `--yes-always`; it exits after the one `--message` and its reflection loop. Without a model
metadata file it fetches litellm's price map from raw.githubusercontent.com. It re-sends the files in the chat ahead
of the conversation, so a call after an edit does not extend the one before (a new branch in the trace). `--no-git`: outside a git repo aider
would otherwise `git init` the workdir and write .gitignore, and inside one commit dirty files; its history files
are kept in HOME. So the workdir changes only by the agent's edits.
"""

from __future__ import annotations

import json

from hrl.runners.agents.base import AgentContext, AgentRunner, ScriptedTurn

__all__ = ["AiderRunner"]

METADATA = ".aider.model.metadata.json"
SETTINGS = ".aider.model.settings.yml"


class AiderRunner(AgentRunner):
    name = "aider"
    version = "0.86.2"
    fixed_prompt_chars = 7_030  # system prompt + tool schemas of its first request, measured
    package_kind = "pypi"
    package = "aider-chat"
    bin = "aider"
    install_scripts = False
    dialect = "chat"
    needs_tty = False
    mcp_tool = None  # no MCP client: browser tasks refuse it
    image_tool = None  # no tool reads files to the model

    def files(self, ctx: AgentContext) -> dict[str, str]:
        meta = {
            "max_input_tokens": 32768, "max_output_tokens": 4096, "max_tokens": 4096, "input_cost_per_token": 0,
            "output_cost_per_token": 0, "litellm_provider": "openai", "mode": "chat",
        }  # fmt: skip
        # reminder "none": aider otherwise re-appends its format reminder to whichever user message is last, so no
        # call's prompt would extend the previous one (each would be a new branch in the trace).
        settings = [{"name": f"openai/{ctx.model}", "edit_format": "diff", "reminder": "none"}]
        return {METADATA: json.dumps({f"openai/{ctx.model}": meta}), SETTINGS: json.dumps(settings)}  # JSON is YAML

    def env(self, ctx: AgentContext) -> dict[str, str]:
        return {
            "OPENAI_API_BASE": ctx.openai_base,
            "OPENAI_API_KEY": ctx.api_key,
            "AIDER_ANALYTICS_DISABLE": "true",
            "AIDER_CHECK_UPDATE": "false",
            "AIDER_SHOW_RELEASE_NOTES": "false",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }

    def command(self, ctx: AgentContext) -> list[str]:
        return [
            self.bin, "--model", f"openai/{ctx.model}", "--model-metadata-file", f"{ctx.home}/{METADATA}",
            "--model-settings-file", f"{ctx.home}/{SETTINGS}",
            "--edit-format", "diff", "--message", ctx.prompt, "--yes-always", "--no-git", "--no-pretty",
            "--no-fancy-input", "--no-detect-urls", "--map-tokens", "0", "--no-show-model-warnings",
            "--chat-history-file", f"{ctx.home}/.aider.chat.history.md",
            "--input-history-file", f"{ctx.home}/.aider.input.history",
        ]  # fmt: skip

    def smoke_turns(self, path: str, text: str) -> list[ScriptedTurn]:
        # First a block without a file name, so aider reflects and calls again (2 calls), then the real edit. Its
        # first prompt already holds 4 assistant turns (few-shot examples and an "Ok."): the script starts at 4.
        block = f"```\n<<<<<<< SEARCH\n=======\n{text}\n>>>>>>> REPLACE\n```"
        return [*[block] * 5, f"{path}\n{block}", "Done."]
