"""Turn-level credit (`train.credit: turn`): per-call advantages from the verifier's turn scores.

The rollouts record `turn_score` on each call of a trained agent: the verifier's score of the sandbox as the call
arrived, that is of the state the agent's previous tools left (`runners/rollouts/turns.py`), and
`metadata.turn_scores.final`, the same measure of the end state, read from the final verdict. A call's progress is
d = (score after its tools) − (score at its arrival). After its tools is the arrival of its agent's next call (an agent
compacted onto a new branch still makes that call), for an agent's last call the first scored call of any agent to
arrive after it ended (a sub-agent's last turn is followed by its parent's next), else the final score. Each agent's
(root's, each sub-agent's) progress telescopes: its d sum to its own end score minus its start score.

Each response token of the call gets coef × (d − mean of d over its agent's calls) added to the trace's advantage: the
added terms of an agent's turns sum to 0, so a turn that moved the tests more than its agent's average turn is pushed
up, one that moved them less is pushed down, and the episode's advantage stays the mean per turn. A value belongs to a
call, not a branch, so a call shared by several branches (trained once by tree training) has one value. In the spirit
of prime-rl's turn credit, GiGPO's step-level groups and DRACO; our own code.
"""

from __future__ import annotations

from typing import Any

from hrl.runners.trace import all_prompt_ids
from hrl.train.samples import Sample, training_calls

__all__ = ["add_turn_credit", "credit_turns", "turn_credit", "turn_progress"]


def turn_progress(trace: dict[str, Any], include_side: bool = False) -> dict[str, float] | None:
    """d per call id of the trace's training calls; None where the trace cannot be credited per turn (a call
    without a score, a null score, no final score, no training call): its traces fall back to episode credit."""
    final = ((trace.get("metadata") or {}).get("turn_scores") or {}).get("final")
    calls = sorted(training_calls(trace, include_side), key=lambda c: c["started_at"])
    if final is None or not calls or any(c.get("turn_score") is None for c in calls):
        return None
    scored = sorted((c for c in trace["calls"] if c.get("turn_score") is not None), key=lambda c: c["started_at"])
    by_agent: dict[str | None, list[dict[str, Any]]] = {}
    for c in calls:
        by_agent.setdefault(c.get("agent"), []).append(c)
    progress = {}
    for own in by_agent.values():
        for k, c in enumerate(own):
            if k + 1 < len(own):
                after = own[k + 1]["turn_score"]
            else:
                later = (n for n in scored if n["started_at"] >= c["ended_at"] and n is not c)
                after = next((n["turn_score"] for n in later), final)
            progress[c["call_id"]] = float(after) - float(c["turn_score"])
    return progress


def turn_credit(trace: dict[str, Any], coef: float, include_side: bool = False) -> dict[str, float] | None:
    """coef × (d − mean of d over the call's agent's calls) per call id; None: fall back to episode credit."""
    progress = turn_progress(trace, include_side)
    if progress is None:
        return None
    agent = {c["call_id"]: c.get("agent") for c in trace["calls"]}
    mean: dict[str | None, list[float]] = {}
    for call_id, d in progress.items():
        mean.setdefault(agent[call_id], []).append(d)
    return {call_id: coef * (d - sum(mean[agent[call_id]]) / len(mean[agent[call_id]]))
            for call_id, d in progress.items()}  # fmt: skip


def add_turn_credit(trace: dict[str, Any], samples: list[Sample], credit: dict[str, float]) -> None:
    """Add each call's value to its response tokens in every sample whose branch holds it, on top of any dense term
    already set (distillation's)."""
    prompts = all_prompt_ids(trace)
    index = {c["call_id"]: i for i, c in enumerate(trace["calls"])}
    for s in samples:
        if not s.dense_advantage:
            s.dense_advantage = [0.0] * len(s.input_ids)
        for call_id in s.branch:
            i, value = index[call_id], credit.get(call_id, 0.0)
            start = len(prompts[i])
            for j in range(len(trace["calls"][i]["response_ids"])):
                s.dense_advantage[start + j] += value


def credit_turns(
    trained: list[tuple[dict[str, Any], list[Sample]]], coef: float, include_side: bool = False
) -> dict[str, float]:
    """Turn credit over a step's trained traces (each with its samples). Metrics: `credit/turn_traces` (credited per
    turn), `credit/episode_fallback` (trained traces left with episode credit), `credit/turn_progress_abs_mean` (the
    mean |d| over the credited calls), `credit/turn_score_failed` (calls of the trained traces whose score is null)."""
    credited, fallback, progress, failed = 0, 0, [], 0
    for trace, samples in trained:
        failed += sum("turn_score" in c and c["turn_score"] is None for c in trace["calls"])
        values = turn_credit(trace, coef, include_side)
        if values is None:
            fallback += 1
            continue
        credited += 1
        progress += [abs(d) for d in (turn_progress(trace, include_side) or {}).values()]
        add_turn_credit(trace, samples, values)
    return {"credit/turn_traces": float(credited), "credit/episode_fallback": float(fallback),
            "credit/turn_progress_abs_mean": sum(progress) / len(progress) if progress else 0.0,
            "credit/turn_score_failed": float(failed)}  # fmt: skip
