"""Agent runners: each coding-agent CLI as data plus hooks, installed pinned, run by one lifecycle.

`AGENTS` maps a name to "module:Class"; modules are imported only when an agent is asked for.
"""

from __future__ import annotations

from hrl.registry import lookup
from hrl.runners.agents.base import AgentContext, AgentRunner

__all__ = ["AGENTS", "AgentContext", "AgentRunner", "get_agent"]

AGENTS: dict[str, str] = {
    "opencode": "hrl.runners.agents.opencode:OpencodeRunner",
    "codex": "hrl.runners.agents.codex:CodexRunner",
    "claude-code": "hrl.runners.agents.claude_code:ClaudeCodeRunner",
    "qwen-code": "hrl.runners.agents.qwen_code:QwenCodeRunner",
    "gemini-cli": "hrl.runners.agents.gemini_cli:GeminiCliRunner",
    "mini-swe-agent": "hrl.runners.agents.mini_swe_agent:MiniSweAgentRunner",
    "aider": "hrl.runners.agents.aider:AiderRunner",
    "browser-use": "hrl.runners.agents.browser_use:BrowserUseRunner",
}


def get_agent(name: str) -> AgentRunner:
    """A runner instance by registry name; unknown names raise UnknownNameError listing the valid ones."""
    runner: AgentRunner = lookup(AGENTS, "agent", name)()
    return runner
