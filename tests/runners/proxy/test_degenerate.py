"""A trace with one model call for an agentic task (the call offered tools) is flagged `degenerate` by the real
proxy, counted in the metrics (`trace/degenerate`), and shown by `hrl inspect` and `hrl report`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from openai import OpenAI

from hrl.runners.metrics import DEGENERATE, step_metrics, trace_metrics
from tests.proxy_helpers import running_proxy

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
CALL = {"text": "Looking.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}


def _episode(tiny_model: str, turns: list, tools: bool, token: str, **outcome) -> dict:
    with running_proxy(tiny_model, engine_options={"turns": turns}) as p:
        client = OpenAI(base_url=f"{p.url}/s/{token}/v1", api_key="unused")
        msgs: list = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "fix it"}]
        for _ in turns:
            msg = client.chat.completions.create(model="m", messages=msgs, **({"tools": TOOLS} if tools else {}))
            reply = msg.choices[0].message.model_dump(exclude_none=True)
            msgs.append(reply)
            if not reply.get("tool_calls"):
                break
            msgs += [{"role": "tool", "tool_call_id": t["id"], "content": "a.py"} for t in reply["tool_calls"]]
        return p.end(token, **outcome)


@pytest.mark.parametrize(
    ("turns", "tools", "outcome", "flagged"),
    [
        (["Done, nothing to fix."], True, {}, True),  # answered at once though it had tools
        ([CALL], True, {"failure_reason": "agent_exit"}, True),  # asked for a tool, then the harness stopped
        ([CALL, "Fixed."], True, {}, False),  # a real agent loop
        (["Hello."], False, {}, False),  # no tools offered: a chat task, one call is all it takes
        (["Done."], True, {"failure_reason": "sandbox_error"}, False),  # the machinery failed, not the policy
    ],
    ids=["one-call", "one-call-exit", "two-calls", "no-tools", "infra"],
)
def test_degenerate_flag_and_metric(tiny_model, turns, tools, outcome, flagged):
    trace = _episode(tiny_model, turns, tools, "d", **outcome)
    assert trace.get("degenerate", False) is flagged
    assert trace_metrics(trace).get(DEGENERATE) == (1.0 if flagged else None)
    assert step_metrics([trace, trace])[DEGENERATE] == (2.0 if flagged else 0.0)


def test_inspect_and_report_show_the_flag(tiny_model, tmp_path):
    path = tmp_path / "t.jsonl"
    traces = [_episode(tiny_model, ["Done."], True, "a"), _episode(tiny_model, [CALL, "Fixed."], True, "b")]
    path.write_text("".join(json.dumps(t) + "\n" for t in traces))
    env = {**os.environ, "NO_COLOR": "1"}
    hrl = [sys.executable, "-m", "hrl.cli", "inspect", str(path)]
    table = subprocess.run(hrl, capture_output=True, text=True, timeout=60, env=env)
    assert table.returncode == 0, table.stderr
    assert table.stdout.count("degenerate") == 2, table.stdout  # its row, and the totals line
    assert "· 1 degenerate" in table.stdout
    tree = subprocess.run([*hrl, "--trace", traces[0]["trace_id"]], capture_output=True, text=True, timeout=60, env=env)
    assert "degenerate: one model call for an agentic task" in tree.stdout
    summary = json.loads(subprocess.run([*hrl, "--json"], capture_output=True, text=True, timeout=60, env=env).stdout)
    assert [s["degenerate"] for s in summary] == [True, False]
    report = [sys.executable, "-m", "hrl.cli", "report", str(path), "--out", str(tmp_path / "r.html")]
    assert subprocess.run(report, capture_output=True, text=True, timeout=60, env=env).returncode == 0
    html = (tmp_path / "r.html").read_text()
    assert "<th" in html and ">flags</th>" in html and ">degenerate</td>" in html
