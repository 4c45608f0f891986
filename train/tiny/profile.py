"""The harness's prompt profile: what mini-swe-agent sends on its first request (system prompt, instance prompt
around the task, the `bash` tool) and how it renders a tool result.

`capture_profile` captures it from the real CLI through the real proxy; the result is kept in
`recipes/demo/harness.json`, so a build needs no agent install.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SUBMIT", "HarnessProfile", "bash_turn", "capture_profile", "load_profile", "machine_uname", "save_profile"]

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
PROFILE_FILE = "harness.json"


@dataclass(frozen=True)
class HarnessProfile:
    """What the harness sends: `system`; the instance prompt is `before` + task + `after` (the machine's
    `uname` line replaced by `{uname}`); `tools`; tool results are `observation` rendered with jinja2."""

    agent: str
    version: str
    system: str
    before: str
    after: str
    uname: str  # the capture machine's "system release version machine"
    tools: list[dict[str, Any]]
    observation: str  # mini-swe-agent's observation_template

    def user(self, task: str, uname: str | None = None) -> str:
        """The instance prompt for `task`."""
        return self.before + task + self.after.replace("{uname}", uname or machine_uname())

    def tool_result(self, output: str, returncode: int = 0) -> str:
        out = {"output": output, "returncode": returncode, "exception_info": ""}
        return _compiled(self.observation).render(output=out)


@functools.lru_cache(maxsize=8)
def _compiled(observation: str) -> Any:
    """The observation template compiled once: compiling it took a build ~25 ms a tool result, most of the time of
    rendering a build's transcripts (three per episode, for the tokenizer's corpus and again for each phase)."""
    from jinja2 import StrictUndefined, Template

    return Template(observation, undefined=StrictUndefined)


def machine_uname() -> str:
    """The `{{system}} {{release}} {{version}} {{machine}}` line mini-swe-agent puts into its prompt here."""
    import platform

    u = platform.uname()
    return f"{u.system} {u.release} {u.version} {u.machine}"


def load_profile(path: str | Path | None = None) -> HarnessProfile:
    """The profile shipped with the demo recipe (or one at `path`)."""
    if path is None:
        from importlib.resources import files

        text = (files("hrl.recipes") / "demo" / PROFILE_FILE).read_text()
    else:
        text = Path(path).read_text()
    return HarnessProfile(**json.loads(text))


def bash_turn(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


# ---- capturing the profile from the real harness ----------------------------------------------------------------

_UNAME_RE = re.compile(r"<system_information>\n(.*?)\n</system_information>", re.S)
_MARKER = "HRL-TASK-MARKER"
_PROBE_OUTPUT = "a<b & 'c'\n"
_FIRST = re.compile(
    r"<\|im_start\|>system\n(?P<system>.*?)\n\n# Tools\n\n.*?<tools>\n(?P<tools>.*?)\n</tools>.*?<\|im_end\|>\n"
    r"<\|im_start\|>user\n(?P<user>.*?)<\|im_end\|>\n<\|im_start\|>assistant\n",
    re.S,
)


async def capture_profile(model_dir: str, sandbox: str = "local", agent: str = "mini-swe-agent") -> HarnessProfile:
    """Run the installed CLI once through the real proxy (scripted engine: print a probe line, then submit) and
    read back what it sent. Raises ValueError when the capture does not re-render token-exactly."""
    from hrl.runners.agents import get_agent
    from hrl.runners.agents.install import install
    from hrl.runners.doctor.agents import scripted_stack
    from hrl.runners.rollouts.agent_session import agent_session
    from hrl.runners.trace import call_prompt_ids
    from hrl.sandboxes import SandboxSpec, get_backend

    runner, inst = get_agent(agent), install(agent, "docker" if sandbox == "docker" else "local")
    turns = [bash_turn(f"printf {json.dumps(_PROBE_OUTPUT)}"), bash_turn(SUBMIT)]
    async with scripted_stack(model_dir, turns) as stack:
        token = stack.proxy.open_session(meta={"metadata": {"capture": agent}}).token
        async with agent_session(stack, runner, inst, get_backend(sandbox), SandboxSpec(workdir="/testbed"), token,
                                 _MARKER, run_id="tiny-agent-capture", episode_id=agent) as session:  # fmt: skip
            outcome = await session.run(time_budget_s=180)
        trace, template = stack.proxy.end_session(token), stack.proxy.template
    if len(trace["calls"]) != 2:
        raise ValueError(f"capture expected 2 calls, got {len(trace['calls'])} ({outcome.failure_reason}: "
                         f"{outcome.stderr_tail[-500:]})")  # fmt: skip
    first = template.decode(call_prompt_ids(trace, 0))
    m = _FIRST.fullmatch(first)
    if m is None:
        raise ValueError(f"cannot parse the first request:\n{first[:2000]}")
    tools = [{"type": "function", "function": json.loads(line)} for line in m["tools"].split("\n")]
    before, _, after = m["user"].partition(_MARKER)
    uname = _UNAME_RE.search(after)
    profile = HarnessProfile(
        agent=runner.name, version=runner.version, system=m["system"], before=before,
        after=after.replace(uname[1], "{uname}") if uname else after, uname=uname[1] if uname else "",
        tools=tools, observation=_observation_template(inst.host_dir),
    )  # fmt: skip
    messages = [{"role": "system", "content": profile.system},
                {"role": "user", "content": profile.user(_MARKER, profile.uname)}]  # fmt: skip
    if template.render(messages, tools) != first:
        raise ValueError("the captured profile does not re-render the first request exactly")
    second = template.decode(call_prompt_ids(trace, 1))
    if f"<tool_response>\n{profile.tool_result(_PROBE_OUTPUT)}\n</tool_response>" not in second:
        raise ValueError(f"tool results are not rendered as captured:\n{second[-600:]}")
    return profile


def _observation_template(host_dir: str) -> str:
    import yaml

    found = sorted(Path(host_dir).glob("venv/lib/python*/site-packages/minisweagent/config/mini.yaml"))
    if not found:
        raise ValueError(f"no minisweagent/config/mini.yaml under {host_dir}")
    return str(yaml.safe_load(found[0].read_text())["model"]["observation_template"])


def save_profile(profile: HarnessProfile, path: str | Path) -> Path:
    from dataclasses import asdict

    Path(path).write_text(json.dumps(asdict(profile), indent=1, ensure_ascii=False) + "\n")
    return Path(path)
