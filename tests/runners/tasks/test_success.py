"""Success apart from reward: every verifier says whether the task's own rule passed (`Verdict.success`, a python
verifier's third item or `info["success"]`, else a binary reward read as such), and every trace carries it as a
top-level `success` that a shaped reward never changes; older traces without it read as `reward == 1.0`."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.runners.proxy.session import Session
from hrl.runners.rollouts.episodes import Episode
from hrl.runners.rollouts.rollout import RolloutConfig, make_rollouts
from hrl.runners.serving.stack import serving
from hrl.runners.tasks.swebench import parse_log
from hrl.runners.tasks.verifier import TestVerifierConfig, Verdict, score_tests
from hrl.runners.trace import binary_success, trace_success, validate_trace
from tests.runners.tasks.test_resolution import CASES, FIXTURES, task_of

TASK = {"instance_id": "a1", "problem_statement": "What is 2+2?", "FAIL_TO_PASS": [], "answer": "4"}


def test_a_partial_reward_keeps_the_rules_success() -> None:
    """astropy-partial: one of two FAIL_TO_PASS tests passes, all PASS_TO_PASS do: partial reward 3/4 (of the four
    counted tests), success false (RESOLVED_PARTIAL is not resolved); the trace fields carry both."""
    case = next(c for c in CASES if c.log.endswith("astropy-partial.log"))
    task = task_of(case)
    verdict = score_tests(
        task, parse_log(task, (FIXTURES / case.log).read_text()), TestVerifierConfig(reward="partial")
    )
    assert verdict.reward == 3 / 4 and verdict.success is False
    assert verdict.trace_fields()["success"] is False and verdict.trace_fields()["reward"] == 0.75
    assert Verdict.error("the sandbox died").trace_fields()["success"] is None  # grading failed: unknown
    assert Verdict.failed({"patch_error": "does not apply"}).trace_fields()["success"] is False


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({"reward": 1.0}, True),
        ({"reward": 0.0}, False),
        ({"reward": 0.4}, None),  # a fraction says nothing of the task's own rule
        ({"reward": 0.4, "reward_info": {"success": True}}, True),  # a verifier may say it in its info
        ({"reward": 1.0, "success": False}, False),  # said outright: kept whatever the reward
        ({}, None),  # no reward: no grade
        ({"failure_reason": "agent_timeout", "reward": 0.0}, False),
    ],
)
def test_every_trace_carries_success(kwargs: dict[str, object], want: bool | None) -> None:
    trace = Session("t" * 16).to_trace(**kwargs)  # type: ignore[arg-type]
    validate_trace(trace)
    assert "success" in trace and trace["success"] is want
    assert trace_success(trace) is want


def test_old_traces_read_as_reward_one_and_a_bad_success_is_refused() -> None:
    old = Session("t" * 16).to_trace(reward=1.0)
    del old["success"]
    assert trace_success(old) is True and trace_success({**old, "reward": 0.1}) is False
    assert trace_success({**old, "reward": None}) is None
    with pytest.raises(ValueError, match="success must be true, false or null"):
        validate_trace({**old, "success": "yes"})
    assert binary_success(0.5) is None and binary_success(1.0) is True and binary_success(None) is None


def _score_file(tmp_path: Path) -> Path:
    path = tmp_path / "score.py"
    path.write_text(
        "def shaped(task, answer):\n    return 0.1, {'why': 'format credit'}, False\n\n"
        "def said(task, answer):\n    return 0.4, {'success': True}\n\n"
        "def bare(task, answer):\n    return 0.5\n"
    )
    return path


@pytest.mark.parametrize(("function", "reward", "success"), [("shaped", 0.1, False), ("said", 0.4, True),
                                                              ("bare", 0.5, None)])  # fmt: skip
def test_a_python_verifier_says_success_beside_its_reward(
    tiny_model: str, tmp_path: Path, function: str, reward: float, success: bool | None
) -> None:
    """A python verifier's (reward, info, success), its info's success, or a bare fraction (null), through a real
    episode of a white-box agent, proxy and scripted engine, into the trace file."""
    agent = tmp_path / "agent.py"
    agent.write_text(
        "async def run(task, session):\n"
        "    await session.openai().chat.completions.create(model=session.model,\n"
        "        messages=[{'role': 'user', 'content': task.problem_statement}])\n"
    )
    verifier = {"name": "python", "function": f"{_score_file(tmp_path)}:{function}"}

    async def main() -> dict[str, object]:
        async with serving(tiny_model, "scripted", engine_options={"turns": ["4"]},
                           control_token=secrets.token_urlsafe(32)) as stack:  # fmt: skip
            rollouts = make_rollouts(stack, RolloutConfig(agent=f"{agent}:run", mode="inprocess"), verifier=verifier)
            return await rollouts.episode(Episode(TASK, 0, 0), tmp_path / "traces.jsonl")

    trace = asyncio.run(main())
    assert trace["failure_reason"] is None and trace["reward"] == reward and trace["success"] is success


def test_inspect_and_report_show_success_beside_the_reward(tmp_path: Path) -> None:
    """A shaped 0.1 that failed, a 1.0 that passed, a fraction said to pass, and an older trace without the key
    (reward 1.0: read as a success): `hrl inspect` per trace and in its totals, `hrl report` in its table."""
    from hrl.runners.report.builder import render_report
    from hrl.runners.report.run import load_source
    from hrl.runners.trace import encode_trace

    said = [{"reward": 0.1, "success": False}, {"reward": 1.0}, {"reward": 0.4, "success": True}]
    traces = [Session(f"s{i}" * 8, {"trace_id": f"t{i}" * 6}).to_trace(**kw) for i, kw in enumerate(said)]  # type: ignore[arg-type]
    older = Session("s3" * 8, {"trace_id": "t3" * 6}).to_trace(reward=1.0)
    del older["success"]
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(encode_trace(t) for t in [*traces, older]))
    env = {**os.environ, "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-m", "hrl.cli", "inspect", str(path), "--json"], capture_output=True,
                         text=True, timeout=60, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [d["success"] for d in json.loads(out.stdout)] == [False, True, True, True]
    human = subprocess.run([sys.executable, "-m", "hrl.cli", "inspect", str(path)], capture_output=True, text=True,
                           timeout=60, env=env)  # fmt: skip
    assert "mean reward 0.625 · success 3/4" in human.stdout, human.stdout  # (0.1 + 1 + 0.4 + 1) / 4
    html = render_report(load_source([path]))
    assert "<th" in html and ">success</th>" in html and ">no</td>" in html


@pytest.mark.parametrize(
    ("name", "text", "want"),
    [("reward.txt", "1\n", True), ("reward.txt", "0", False), ("reward.txt", "0.5", None),
     ("reward.json", '{"reward": 0.5, "success": true}', True), ("reward.json", '{"reward": 1.0, "style": 0.5}', True)],
)  # fmt: skip
def test_a_harbor_reward_file_gives_success(name: str, text: str, want: bool | None) -> None:
    from hrl.runners.tasks.harbor_verifier import _reward

    verdict = _reward(name, text, {})
    assert verdict.failure_reason is None and verdict.success is want
