"""The recipe's `rollout:` section: which agent runs, in which sandbox, for how long."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PROXY_PORT", "RolloutConfig"]

PROXY_PORT = 8000  # where the proxy appears inside docker sandboxes


class RolloutConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    agent: str = Field("mini-swe-agent", description="Agent CLI to run (see `hrl agents ls`).")
    agents: list[str] = Field(
        default_factory=list,
        description="Several harnesses in one run (replaces `agent`): episodes are spread over them, each GRPO "
        "group is one task under one harness, and the metrics are split per harness (harness/<name>/…).",
    )
    sandbox: str = Field("docker", description="docker | local.")
    time_budget_s: float = Field(600, ge=0, description="Wall-time budget of one agent run; 0 = none.")
    proxy_port: int = Field(
        PROXY_PORT, ge=1, le=65535, description="Port the proxy appears on inside docker sandboxes."
    )
    verify: bool = Field(True, description="Score episodes with the task's tests.")
    run_id: str = Field("", description="Label for sandboxes (hrl.run); default: a fresh id.")
    cpus: float = Field(
        0.0, ge=0, description="CPU limit per agent sandbox; 0 = the task's (Harbor: task.toml), else none."
    )
    memory_mb: int = Field(0, ge=0, description="Memory limit per agent sandbox in MiB; 0 = the task's, else none.")
    agent_options: dict[str, Any] = Field(
        default_factory=dict, description="Agent-specific knobs, e.g. step_limit; a white-box agent's session.options."
    )
    browser_mcp: str = Field(
        "playwright",
        description="Browser tasks (verifier miniwob) with an agent CLI: the MCP server the CLI is given, configured "
        "through its own MCP settings and connected to the episode's browser (`playwright`: @playwright/mcp).",
    )
    warm_sandboxes: int = Field(
        0,
        ge=0,
        description="Keep this many agent sandboxes created and ready (for the spec of the tasks being run), "
        "refilled in the background and closed at the end of the run; 0 = each episode creates its own.",
    )
    reuse: Literal["none", "group"] = Field(
        "none",
        description="group: the episodes of one GRPO group reuse its sandboxes in turn, reset between them (workdir "
        "restored, processes killed, HOME and tmp emptied) and checked against the first episode's starting state "
        "(a mismatch: a fresh sandbox, counted as rollout/reset_mismatch). none: a sandbox per episode.",
    )
    warm_harness: bool = Field(
        True,
        description="In a sandbox made ahead (warm_sandboxes > 0, reuse none), start a Python harness ahead too: its "
        "heavy imports done off the episode's clock, then run unchanged when the episode starts (mini-swe-agent: "
        "litellm). Traces say harness_warm.",
    )
    turn_scores: bool = Field(
        False,
        description="Score the agent's sandbox as each LLM call arrives, with the verifier's turn_score (the tests "
        "verifier: the share of the task's tests passing with the diff so far, one grading run per distinct diff); "
        "each call's trace record gets turn_score. train.credit: turn sets it; alone, the scores are only recorded.",
    )
    turn_score_timeout_s: float = Field(
        300.0, gt=0, description="Limit for reading or grading one turn's state, s; past it the score is null."
    )
    mode: Literal["auto", "inprocess", "subprocess"] = Field(
        "auto",
        description="White-box (python:) agents only: `subprocess` (a worker process with OPENAI_BASE_URL / "
        "OPENAI_API_KEY set; in its own namespace where bubblewrap runs), `inprocess` (on hrl's event loop: "
        "trusted code only), or `auto`: subprocess where bubblewrap runs and the agent needs no "
        "session.sandbox, else in process.",
    )
    python: str = Field(
        "",
        description="White-box (python:) agents only: the Python the agent runs in. Empty: hrl's own. The name of a "
        "Python agent hrl installs (browser-use, mini-swe-agent, aider): its pinned venv, installed on first use. "
        "Or a path to a venv's bin/python. Another Python runs the agent in a subprocess, with hrl's package (not "
        "its environment) importable there; it needs pydantic and aiohttp.",
    )

    def labelled(self) -> str:
        """The run's sandbox label (`run_id`), a fresh one set here when none was given: every sandbox of a run,
        agent's and grader's, carries the one label, and a resumed run finds its leftovers by it."""
        if not self.run_id:
            self.run_id = f"hrl-{uuid.uuid4().hex[:8]}"
        return self.run_id

    @property
    def harnesses(self) -> list[str]:
        """The harnesses of the run, in order: `agents`, else the one `agent`."""
        return list(dict.fromkeys(self.agents)) or [self.agent]
