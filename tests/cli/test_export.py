"""`hrl export`: the golden traces (tests/golden, recorded through the real proxy with the tiny model's tokenizer) as
ATIF trajectories that the schema generated from harbor's models accepts, decoded, with a sub-agent as an embedded
sub-trajectory; and as OTLP/JSON with the documented gen_ai.* / rl.* attributes and no token ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hrl.runners.telemetry.atif import SCHEMA_PATH, AtifError, trajectory, validate
from hrl.runners.trace import all_prompt_ids, prompt_len, read_traces

GOLDEN = Path(__file__).parents[1] / "golden"
CHAT = GOLDEN / "chat-json.jsonl"  # c1 asks for `ls -la`, gets "ok"; c2 extends c1, c3 c2; c4 forks c1 ("no such file")
SSE = GOLDEN / "chat-sse.jsonl"  # 5 calls (one side), 2 tool events, a response sampled across a publish (v0, v1)
VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def hrl_export(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "hrl.cli", "export", *args], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip


def _errors(traj: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(traj)]


def test_every_golden_trace_exports_as_valid_decoded_atif(tiny_model: str, tmp_path: Path):
    out = hrl_export(str(GOLDEN), "--format", "atif", "--out", str(tmp_path), "-m", tiny_model, "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    traces = [t for f in sorted(GOLDEN.glob("*.jsonl")) for t in read_traces(f)]
    assert summary["traces"] == len(summary["files"]) == len(traces) == 8  # 4 dialects x (json, sse), one trace each
    assert summary["decoded"] is True and summary["schema_checked"] is True
    for path in map(Path, summary["files"]):
        traj = json.loads(path.read_text())
        assert _errors(traj) == [], path.name
        assert traj["schema_version"] == "ATIF-v1.8" and path.stem == traj["trajectory_id"]
        agent_steps = [s for s in traj["steps"] if s["source"] == "agent"]
        trace = next(t for t in traces if t["trace_id"] == traj["trajectory_id"])
        assert [s["extra"]["call_id"] for s in agent_steps] == [c["call_id"] for c in trace["calls"]]
        assert traj["final_metrics"]["total_prompt_tokens"] == sum(prompt_len(c) for c in trace["calls"])
        assert traj["final_metrics"]["extra"]["reward"] == trace["reward"]

    chat = json.loads((tmp_path / f"{next(read_traces(CHAT))['trace_id']}.json").read_text())
    first = chat["steps"][1]  # after the user step holding the prompt
    assert first["message"] == "Looking."
    (call,) = first["tool_calls"]
    assert (call["function_name"], call["arguments"]) == ("bash", {"command": "ls -la"})
    (result,) = first["observation"]["results"]  # one tool: its id and what the next call was shown
    assert result["source_call_id"] == call["tool_call_id"] and "\nok\n" in result["content"]
    assert chat["final_metrics"]["extra"]["success"] is False
    fork = chat["steps"][4]  # c4 forked c1 with another tool result: an input no observation carries
    assert fork["source"] == "user" and "no such file" in fork["message"] and fork["extra"]["since"] == "c1-9bdaea"


def _with_subagent(trace: dict[str, Any]) -> dict[str, Any]:
    """The chat trace with its forked call c4 made by a sub-agent `helper` under the root `main`, as the proxy
    records a sub-agent: `agent` on the call, the tree in `agents`."""
    calls = [dict(c, agent="helper") if c["call_id"] == "c4-ee0583" else c for c in trace["calls"]]
    agents = [{"name": "main", "parent": None, "trainable": True, "calls": 3},
              {"name": "helper", "parent": "main", "trainable": True, "calls": 1}]  # fmt: skip
    return {**trace, "calls": calls, "agents": agents}


def test_a_subagent_is_an_embedded_subtrajectory_referenced_from_its_parent():
    traj = trajectory(_with_subagent(next(read_traces(CHAT))))
    assert validate(traj) is True and _errors(traj) == []
    (sub,) = traj["subagent_trajectories"]
    assert sub["agent"]["name"] == "helper" and sub["trajectory_id"] == f"{traj['trajectory_id']}/helper"
    assert [s["extra"]["call_id"] for s in sub["steps"] if s["source"] == "agent"] == ["c4-ee0583"]
    assert [s["extra"]["call_id"] for s in traj["steps"] if s["source"] == "agent"] == ["c1-9bdaea", "c2-d6e871",
                                                                                        "c3-da8b4c"]  # fmt: skip
    refs = [(s["step_id"], ref["trajectory_id"]) for s in traj["steps"]
            for r in (s.get("observation") or {}).get("results", []) for ref in r.get("subagent_trajectory_ref", [])]  # fmt: skip
    # c4 started after c3 (0.567 s > 0.192 s): the last root step begun before it holds the reference
    assert refs == [(traj["steps"][-1]["step_id"], sub["trajectory_id"])]
    assert "notes" in traj  # no tokenizer given: said, not hidden


def test_token_ids_are_the_recorded_ids_with_prompts_resolved():
    trace = next(read_traces(SSE))  # later calls store their prompt as a reference + suffix
    traj = trajectory(trace, token_ids=True)
    assert validate(traj) is True and _errors(traj) == []
    metrics = [s["metrics"] for s in traj["steps"] if s["source"] == "agent"]
    assert [m["completion_token_ids"] for m in metrics] == [c["response_ids"] for c in trace["calls"]]
    assert [m["logprobs"] for m in metrics] == [c["response_logprobs"] for c in trace["calls"]]
    assert [m["prompt_token_ids"] for m in metrics] == all_prompt_ids(trace)
    assert [len(m["prompt_token_ids"]) for m in metrics] == [m["prompt_tokens"] for m in metrics]
    assert all("token_ids" not in k for s in trajectory(trace)["steps"] for k in s.get("metrics", {}))  # opt-in


def test_an_episode_without_model_calls_is_still_a_valid_trajectory():
    trace = {**next(read_traces(CHAT)), "calls": [], "tools": [], "status": "failed", "failure_reason": "no_llm_calls",
             "reward": 0.0}  # fmt: skip
    traj = trajectory(trace)
    assert validate(traj) is True and _errors(traj) == []
    (step,) = traj["steps"]  # ATIF wants one step at least: a system step says why there is no more
    assert step["source"] == "system" and "no_llm_calls" in step["message"]
    assert traj["final_metrics"]["extra"]["failure_reason"] == "no_llm_calls"


def test_a_broken_trajectory_is_refused():
    traj = trajectory(next(read_traces(CHAT)))
    traj["steps"][1]["step_id"] = 7
    with pytest.raises(AtifError, match=r"steps\[1\]\.step_id: expected 2, got 7"):
        validate(traj)
    traj = trajectory(next(read_traces(CHAT)))
    traj["steps"][1]["message"] = 3
    with pytest.raises(AtifError, match="steps/1/message"):
        validate(traj)


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    def value(v: dict[str, Any]) -> Any:
        (kind, x), = v.items()  # fmt: skip
        if kind == "arrayValue":
            return [value(y) for y in x["values"]]
        return int(x) if kind == "intValue" else x

    return {a["key"]: value(a["value"]) for a in span["attributes"]}


def test_otlp_json_has_the_documented_attributes_and_no_token_ids(tmp_path: Path):
    run = tmp_path / "demo"  # a training run whose step 3 trained version 4 on this trace (sampled by v0 and v1)
    (run / "traces").mkdir(parents=True)
    (run / "traces" / "iter-0003.jsonl").write_text(SSE.read_text())
    (run / "metrics.jsonl").write_text(json.dumps({"step": 3, "train/version": 4}) + "\n")
    (trace,) = read_traces(SSE)
    out = hrl_export(str(run), "--format", "otlp-json", "--out", str(tmp_path / "otlp"))
    assert out.returncode == 0, out.stderr
    request = json.loads((tmp_path / "otlp" / "iter-0003.otlp.json").read_text())
    (spans,) = [s["spans"] for rs in request["resourceSpans"] for s in rs["scopeSpans"]]
    episode, *children = spans
    assert len(children) == len(trace["calls"]) + len(trace["tools"]) == 7
    assert {s["traceId"] for s in spans} == {trace["trace_id"]} and "parentSpanId" not in episode
    assert all(c["parentSpanId"] == episode["spanId"] for c in children)
    ep = _attrs(episode)
    assert ep["gen_ai.operation.name"] == "invoke_agent" and ep["gen_ai.system"] == "hrl"
    assert (ep["rl.run"], ep["rl.step"], ep["rl.phase"], ep["rl.reward"]) == ("demo", 3, "train", 1.0)
    assert ep["rl.policy_versions"] == [0, 1] and ep["rl.staleness"] == 4 - 0  # trained version - oldest sampler
    chats = [_attrs(s) for s in children if _attrs(s)["gen_ai.operation.name"] == "chat"]
    assert [c["gen_ai.usage.input_tokens"] for c in chats] == [prompt_len(c) for c in trace["calls"]]
    assert [c["gen_ai.usage.output_tokens"] for c in chats] == [len(c["response_ids"]) for c in trace["calls"]]
    assert ep["gen_ai.usage.output_tokens"] == sum(len(c["response_ids"]) for c in trace["calls"])
    tools = [_attrs(s) for s in children if _attrs(s)["gen_ai.operation.name"] == "execute_tool"]
    assert [t["gen_ai.tool.call.id"] for t in tools] == [t["tool_call_id"] for t in trace["tools"]]
    # no token ids: every array attribute is a short list of versions or finish reasons, never a call's ids
    arrays = {k: v for s in spans for k, v in _attrs(s).items() if isinstance(v, list)}
    assert set(arrays) <= {"rl.policy_versions", "gen_ai.response.finish_reasons"}
    assert "response_ids" not in json.dumps(request) and "prompt_ids" not in json.dumps(request)


def test_bad_arguments_are_usage_errors(tmp_path: Path):
    out = hrl_export(str(SSE), "--format", "otlp-json", "--token-ids", "--out", str(tmp_path))
    assert out.returncode == 2 and "Error: --model and --token-ids apply to --format atif only" in out.stderr
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_a_file_without_traces_exports_nothing_and_exits_1(tmp_path: Path):
    empty, out = tmp_path / "empty.jsonl", tmp_path / "out"
    empty.write_text("")
    proc = hrl_export(str(empty), "--out", str(out))
    assert proc.returncode == 1 and "Error: no traces in" in proc.stderr, proc.stderr
    assert not out.exists()
