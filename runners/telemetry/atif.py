"""A trace as an ATIF trajectory (Harbor's Agent Trajectory Interchange Format, v1.8), for `hrl export --format
atif`: the episode in the form trajectory viewers and other RL stacks read, with the words decoded from the trace's
token ids by `hrl.runners.conversation` (the same decoding as `hrl inspect --trace`).

Mapping, per agent of the trace's agent tree (the root, then each sub-agent as an embedded sub-trajectory):
- a call's new input (the task, a rewritten history, a forked tool result) that no earlier step of the same agent
  already carries as its observation: a `user` step;
- each model call: an `agent` step (reply text, reasoning, tool calls with their arguments; prompt and completion
  token counts; with `token_ids`, the ids and logprobs ATIF keeps for RL);
- what the next call extending it was shown (tool results): that step's observation, with one result per tool
  event (its id, timing) and a `subagent_trajectory_ref` where a sub-agent started after it;
- reward, success, status and the verifier's numbers: `final_metrics.extra`.

The schema beside this module (`atif-v1.8.schema.json`) is generated from harbor's own pydantic models; `validate`
checks a trajectory against it with `jsonschema` when that is installed, and always checks the rules a JSON schema
cannot say (step ids 1..n, observation ids naming the step's tool calls, unique sub-trajectory ids).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from hrl.runners.conversation import conversation, image_mark
from hrl.runners.errors import HrlError
from hrl.runners.trace import call_prompt_ids, trace_success

__all__ = ["ATIF_IMAGE_TYPES", "ATIF_VERSION", "SCHEMA_PATH", "AtifError", "schema", "trajectory", "validate"]

ATIF_VERSION = "ATIF-v1.8"
SCHEMA_PATH = Path(__file__).with_name("atif-v1.8.schema.json")
ROOT = "main"  # the root agent's name in a trace's `agents` when the trace names none
Trace = dict[str, Any]
Step = dict[str, Any]


class AtifError(HrlError):
    """A trajectory that breaks the ATIF schema or its rules: a bug in the mapping, never the trace's fault."""


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _arguments(text: str) -> dict[str, Any]:
    """ATIF wants arguments as an object; arguments that are not one (the model wrote bad JSON) stay as `raw`."""
    try:
        value = json.loads(text)
    except ValueError:
        return {"raw": text}
    return value if isinstance(value, dict) else {"raw": text}


def _tool_calls(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """The reply's tool calls, each with the id the agent got for it (the trace's tool event in the same place, when
    the events under this call match the calls one for one), else `<call_id>.<n>`."""
    calls, events = turn["reply"]["tool_calls"], turn["tools"]
    same = len(events) == len(calls) and all(e.get("name") == c["name"] for e, c in zip(events, calls, strict=True))
    return [
        {
            "tool_call_id": str(events[n]["tool_call_id"]) if same else f"{turn['call_id']}.{n}",
            "function_name": c["name"],
            "arguments": _arguments(c["arguments"]),
        }
        for n, c in enumerate(calls)
    ]


def _agent_step(trace: Trace, index: int, turn: dict[str, Any], token_ids: bool) -> Step:
    call = trace["calls"][index]
    metrics = {
        "prompt_tokens": turn["prompt_tokens"],
        "completion_tokens": turn["response_tokens"],
        "prompt_token_ids": call_prompt_ids(trace, index) if token_ids else None,
        "completion_token_ids": list(call["response_ids"]) if token_ids else None,
        "logprobs": list(call.get("response_logprobs") or []) if token_ids else None,
        "extra": _drop_none(
            {
                "policy_versions": turn["versions"] or None,
                "first_token_s": turn["first_token_s"],
                "total_s": turn["total_s"],
            }
        ),
    }
    extra = {k: turn[k] for k in ("call_id", "parent", "side", "finish_reason", "error", "tool_parse_error")}
    extra |= {"side": bool(turn["side"]), "trainable": call.get("trainable", True)}
    return _drop_none({
        "source": "agent",
        "timestamp": _iso(float(trace["started_at"]) + float(turn["started_at"] or 0.0)),
        "message": turn["reply"]["text"] or "",
        "reasoning_content": turn["reply"]["reasoning"],
        "tool_calls": _tool_calls(turn) or None,
        "metrics": _drop_none(metrics),
        "llm_call_count": 1,
        "extra": _drop_none(extra),
    })  # fmt: skip


ATIF_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # ATIF's ImageSource media types


def _input_text(turn: dict[str, Any]) -> str | list[dict[str, Any]]:
    """What the call was shown new: text, or ATIF content parts when it held images (each image a file reference,
    `media/<sha256>`, relative to the trajectory file: `hrl export` copies the stored bytes there). An image of a
    type ATIF cannot name stays in the text as its mark."""
    given = turn["input"]
    if given["text"] is None:
        return f"({given['tokens']} tokens, not decoded)"
    if not given.get("parts"):
        return str(given["text"])
    out: list[dict[str, Any]] = []
    for part in given["parts"]:
        m = part.get("media")
        if m is not None and m.get("mime") in ATIF_IMAGE_TYPES:
            out.append({"type": "image", "source": {"media_type": m["mime"], "path": f"media/{m['sha256']}"}})
        else:
            text = part["text"] if m is None else image_mark(m)
            if out and out[-1]["type"] == "text":
                out[-1]["text"] += text
            else:
                out.append({"type": "text", "text": text})
    return out


def _observation(turn: dict[str, Any], step: Step, shown: dict[str, Any] | None) -> dict[str, Any]:
    """One result per tool event (its id when the step's tool calls carry it) and the text the next call was
    shown after this one (`shown`: that call's turn): the tool's output when there was one tool, else one more
    result (the text holds every result; the ids do not say where one ends)."""
    ids = {tc["tool_call_id"] for tc in step.get("tool_calls") or []}
    results = [
        _drop_none({
            "source_call_id": str(e["tool_call_id"]) if e.get("tool_call_id") in ids else None,
            "extra": _drop_none({"name": e.get("name"), "tool_call_id": e.get("tool_call_id"),
                                 "started_s": e["started_at"], "duration_s": e["duration_s"]}),
        })
        for e in turn["tools"]
    ]  # fmt: skip
    if shown is not None:
        seen = {
            "content": _input_text(shown),
            "extra": {"shown_to": shown["call_id"], "tokens": shown["input"]["tokens"]},
        }
        if len(results) == 1 and "source_call_id" in results[0]:  # one tool, one result: the text is its output
            results[0] = {**results[0], "content": seen["content"], "extra": results[0]["extra"] | seen["extra"]}
        else:
            results.append(seen)
    return {"results": results}


def _steps(trace: Trace, turns: list[tuple[int, dict[str, Any]]], token_ids: bool) -> list[tuple[float, Step]]:
    """(start seconds, step) for one agent's calls, in order: user steps for inputs no observation carries."""
    out: list[tuple[float, Step]] = []
    shown_as_observation: set[str] = set()
    for k, (index, turn) in enumerate(turns):
        start = float(turn["started_at"] or 0.0)
        if turn["call_id"] not in shown_as_observation:
            user = {"source": "user", "timestamp": _iso(float(trace["started_at"]) + start),
                    "message": _input_text(turn), "extra": {"input_of": turn["call_id"], "since": turn["input"]["since"],
                                                            "tokens": turn["input"]["tokens"]}}  # fmt: skip
            out.append((start, _drop_none(user)))
        step = _agent_step(trace, index, turn, token_ids)
        shown = next((t for _, t in turns[k + 1 :] if t["input"]["since"] == turn["call_id"]), None)
        if shown is not None:
            shown_as_observation.add(shown["call_id"])
        if turn["tools"] or shown is not None:
            step["observation"] = _observation(turn, step, shown)
        out.append((start, step))
    return out


def _tree(trace: Trace) -> tuple[str, dict[str | None, list[str]]]:
    """(root agent name, children by parent) of the trace's agent tree; a trace without one is a lone root."""
    agents = trace.get("agents") or []
    root = str(agents[0]["name"]) if agents else str((trace.get("agent") or {}).get("name") or ROOT)
    children: dict[str | None, list[str]] = {}
    for a in agents[1:]:
        children.setdefault(a.get("parent") or root, []).append(str(a["name"]))
    return root, children


def _attach_ref(steps: list[tuple[float, Step]], at: float, ref: dict[str, Any]) -> None:
    """The sub-agent's reference goes in the observation of the last step that started before it did."""
    before = [s for start, s in steps if start <= at] or [steps[0][1]]
    step = before[-1]
    step.setdefault("observation", {"results": []})["results"].append({"subagent_trajectory_ref": [ref]})


def _agent_trajectory(
    trace: Trace, conv: dict[str, Any], name: str, root: str, children: dict[str | None, list[str]], token_ids: bool
) -> dict[str, Any] | None:
    """One agent's trajectory with its sub-agents embedded; None for a sub-agent that made no calls."""
    mine = [(i, t) for i, t in enumerate(conv["calls"]) if (t["agent"] or root) == name]
    if not mine and name != root:
        return None
    steps = _steps(trace, mine, token_ids)
    if not steps:  # an episode that ended before its first model call: ATIF wants at least one step
        why = trace.get("failure_reason") or "no model calls"
        steps = [(0.0, {"source": "system", "timestamp": _iso(float(trace["started_at"])),
                        "message": f"the episode made no model calls ({why})"})]  # fmt: skip
    subs = []
    for child in children.get(name, []):
        sub = _agent_trajectory(trace, conv, child, root, children, token_ids)
        if sub is None:
            continue
        first = next(t for t in conv["calls"] if t["agent"] == child)
        _attach_ref(steps, float(first["started_at"] or 0.0), {"trajectory_id": sub["trajectory_id"]})
        subs.append(sub)
    numbered = [{"step_id": n, **s} for n, (_, s) in enumerate(steps, start=1)]
    return _drop_none({
        "schema_version": ATIF_VERSION,
        "trajectory_id": f"{trace['trace_id']}/{name}" if name != root else str(trace["trace_id"]),
        "agent": _drop_none({"name": name, "version": str((trace.get("agent") or {}).get("version") or "unknown"),
                             "model_name": conv["model"]}),
        "steps": numbered,
        "subagent_trajectories": subs or None,
        "final_metrics": _totals(numbered),
    })  # fmt: skip


def _totals(steps: list[Step]) -> dict[str, Any]:
    metrics = [s["metrics"] for s in steps if "metrics" in s]
    return {
        "total_prompt_tokens": sum(m["prompt_tokens"] for m in metrics),
        "total_completion_tokens": sum(m["completion_tokens"] for m in metrics),
        "total_steps": len(steps),
    }


def trajectory(
    trace: Trace, template: Any = None, *, note: str | None = None, token_ids: bool = False
) -> dict[str, Any]:
    """The trace as one ATIF trajectory (a JSON-able dict). `template`: a `ChatTemplate` to decode with (None: the
    steps carry token counts in place of text, and `notes` says why); `token_ids`: also the prompt and completion
    ids and logprobs of each call (ATIF's RL fields; large)."""
    conv = conversation(trace, template, max_lines=None, note=note)
    root, children = _tree(trace)
    out = _agent_trajectory(trace, conv, root, root, children, token_ids)
    assert out is not None  # the root always has a trajectory
    outcome = conv["outcome"]
    out["session_id"] = str(trace.get("session") or trace["trace_id"])
    out["final_metrics"]["extra"] = _drop_none({
        "reward": outcome["reward"], "success": trace_success(trace), "status": outcome["status"],
        "failure_reason": outcome["failure_reason"], "reward_info": outcome["info"] or None, "tests": outcome["tests"],
    })  # fmt: skip
    out["extra"] = _drop_none({"trace_id": trace["trace_id"], "task_id": trace.get("task_id"),
                               "group_id": trace.get("group_id"), "env": trace.get("env") or None,
                               "decoded": conv["decoded"], "trace_schema": trace.get("schema")})  # fmt: skip
    if not conv["decoded"]:
        out["notes"] = f"Text not decoded: {conv['note']}; steps carry token counts."
    return {"schema_version": out.pop("schema_version"), "session_id": out.pop("session_id"), **out}


@cache
def schema() -> dict[str, Any]:
    """The ATIF JSON Schema shipped with hrl (generated from harbor's models; its `$comment` says how)."""
    return dict(json.loads(SCHEMA_PATH.read_text()))


def validate(traj: dict[str, Any]) -> bool:
    """Raise AtifError unless `traj` is valid ATIF. Returns whether the JSON schema was checked too (it is when
    `jsonschema` is installed; the rules the schema cannot say are always checked)."""
    _check_rules(traj, "$")
    try:
        import jsonschema
    except ImportError:
        return False
    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(traj), key=lambda e: list(e.path))
    if errors:
        where = "/".join(map(str, errors[0].absolute_path)) or "$"
        raise AtifError(f"{where}: {errors[0].message} ({len(errors)} schema error(s))")
    return True


def _check_rules(traj: dict[str, Any], at: str) -> None:
    """harbor's model validators: step ids 1..n; observation source ids name the step's tool calls; every embedded
    sub-trajectory has a trajectory_id unique among its siblings."""
    for n, step in enumerate(traj.get("steps") or [], start=1):
        if step.get("step_id") != n:
            raise AtifError(f"{at}.steps[{n - 1}].step_id: expected {n}, got {step.get('step_id')}")
        ids = {tc["tool_call_id"] for tc in step.get("tool_calls") or []}
        for r in (step.get("observation") or {}).get("results", []):
            if r.get("source_call_id") is not None and r["source_call_id"] not in ids:
                raise AtifError(f"{at}.steps[{n - 1}]: observation names unknown tool call {r['source_call_id']!r}")
    seen: set[str] = set()
    for i, sub in enumerate(traj.get("subagent_trajectories") or []):
        tid = sub.get("trajectory_id")
        if tid is None or tid in seen:
            raise AtifError(f"{at}.subagent_trajectories[{i}].trajectory_id: missing or repeated ({tid!r})")
        seen.add(tid)
        _check_rules(sub, f"{at}.subagent_trajectories[{i}]")
