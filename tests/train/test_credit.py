"""Turn credit (`train.credit: turn`): per-call progress from turn scores, centred per agent, one value per call (so
a call shared by branches agrees, with tree training too), added to a distillation term, and the fallback counted."""

from __future__ import annotations

import pytest

from hrl.config import LoopConfig, TrainerConfig
from hrl.train.credit import credit_turns, turn_credit, turn_progress
from hrl.train.samples import build_samples
from tests.train.test_math import _call, _trace


def _scored(call, score, at, agent=None):
    """`call` arrived at `at` (ended 0.5 s later), scored `score` then."""
    call.update({"turn_score": score, "started_at": at, "ended_at": at + 0.5})
    if agent is not None:
        call["agent"] = agent
    return call


def _credited(calls, final, tid="t", reward=1.0):
    trace = _trace(calls, tid, reward)
    trace["metadata"] = {"turn_scores": {"final": final, "states": len(calls), "failed": 0}}
    return trace


def _linear(scores=(0.2, 0.2, 0.5), final=1.0, tid="t", reward=1.0):
    return _credited([
        _scored(_call("a", prompt=[1, 2, 3], resp=[4, 5]), scores[0], 0),
        _scored(_call("b", ref=("a", 5), suffix=[6], resp=[7, 8], parent="a"), scores[1], 1),
        _scored(_call("c", ref=("b", 8), suffix=[9], resp=[10], parent="b"), scores[2], 2),
    ], final, tid, reward)  # fmt: skip


def test_progress_is_the_score_after_a_turn_minus_before_and_the_terms_are_centred():
    trace = _linear()
    assert turn_progress(trace) == pytest.approx({"a": 0.0, "b": 0.3, "c": 0.5})  # the last: final − its arrival's
    mean = 0.8 / 3
    credit = turn_credit(trace, coef=2.0)
    assert credit == pytest.approx({"a": 2 * -mean, "b": 2 * (0.3 - mean), "c": 2 * (0.5 - mean)})
    assert sum(credit.values()) == pytest.approx(0.0)
    (s,) = build_samples(trace)
    metrics = credit_turns([(trace, [s])], coef=2.0)
    assert s.dense_advantage == pytest.approx([0, 0, 0, *[credit["a"]] * 2, 0, *[credit["b"]] * 2, 0, credit["c"]])
    s.advantage = 0.5
    assert s.token_advantages()[3] == pytest.approx(0.5 + credit["a"])
    assert metrics == pytest.approx(
        {
            "credit/turn_traces": 1.0,
            "credit/episode_fallback": 0.0,
            "credit/turn_progress_abs_mean": 0.8 / 3,
            "credit/turn_score_failed": 0.0,
        }
    )


def test_a_call_shared_by_two_branches_has_one_value_in_both():
    """a is the prefix of b and of c (two continuations of one agent): its tokens get one value in both samples."""
    trace = _credited([
        _scored(_call("a", prompt=[1, 2, 3], resp=[4, 5]), 0.0, 0),
        _scored(_call("b", ref=("a", 5), suffix=[6], resp=[7, 8], parent="a"), 0.5, 1),
        _scored(_call("c", ref=("a", 5), suffix=[9], resp=[10], parent="a"), 0.25, 2),
    ], final=1.0)  # fmt: skip
    samples = build_samples(trace)
    assert [s.branch for s in samples] == [["a", "b"], ["a", "c"]]
    credit_turns([(trace, samples)], coef=1.0)
    d = {"a": 0.5, "b": -0.25, "c": 0.75}  # a → b (its agent's next arrival), b → c, c → final
    mean = sum(d.values()) / 3
    for s in samples:
        assert s.dense_advantage[3:5] == pytest.approx([d["a"] - mean] * 2)  # the shared call, the same in both
    assert samples[0].dense_advantage[6:8] == pytest.approx([d["b"] - mean] * 2)
    assert samples[1].dense_advantage[6] == pytest.approx(d["c"] - mean)


def test_each_agent_is_credited_along_its_own_turns():
    """main m1 starts a sub-agent (s1, s2), then goes on (m2): m1's progress is the whole sub-agent's (the state at
    m2 minus at m1); s2's last turn ends at m2's arrival; each agent's terms are centred on its own mean."""
    trace = _credited([
        _scored(_call("m1", prompt=[1, 2], resp=[3]), 0.0, 0),
        _scored(_call("s1", prompt=[7, 8], resp=[9]), 0.0, 1, agent="sub"),
        _scored(_call("s2", ref=("s1", 3), suffix=[10], resp=[11], parent="s1"), 0.5, 2, agent="sub"),
        _scored(_call("m2", ref=("m1", 3), suffix=[4], resp=[5], parent="m1"), 0.75, 3),
    ], final=1.0)  # fmt: skip
    assert turn_progress(trace) == pytest.approx({"m1": 0.75, "m2": 0.25, "s1": 0.5, "s2": 0.25})
    credit = turn_credit(trace, coef=1.0)
    assert credit == pytest.approx({"m1": 0.25, "m2": -0.25, "s1": 0.125, "s2": -0.125})


@pytest.mark.parametrize("why", ["null score", "no score", "no final"])
def test_a_trace_without_every_score_falls_back_to_episode_credit_counted(why):
    trace = _linear()
    if why == "null score":
        trace["calls"][1]["turn_score"] = None
    elif why == "no score":
        del trace["calls"][1]["turn_score"]
    else:
        trace["metadata"]["turn_scores"]["final"] = None
    samples = build_samples(trace)
    metrics = credit_turns([(trace, samples), (_linear(tid="u"), build_samples(_linear(tid="u")))], coef=1.0)
    assert samples[0].dense_advantage == []  # the trace's own advantage alone
    assert metrics["credit/episode_fallback"] == 1.0 and metrics["credit/turn_traces"] == 1.0
    assert metrics["credit/turn_score_failed"] == float(why == "null score")


def test_turn_credit_adds_to_a_distillation_term():
    trace = _linear()
    (s,) = build_samples(trace)
    s.dense_advantage = [0.1 * i for i in range(len(s.input_ids))]  # as `distill` leaves it
    credit_turns([(trace, [s])], coef=1.0)
    credit = turn_credit(trace, coef=1.0)
    assert s.dense_advantage[4] == pytest.approx(0.4 + credit["a"])
    assert s.dense_advantage[9] == pytest.approx(0.9 + credit["c"])
    assert s.dense_advantage[5] == pytest.approx(0.5)  # a prompt token: the distillation term alone


def test_a_step_with_turn_credit_and_tree_training(tmp_path):
    """Through the trainer's own step (`update_from_traces`) with tree training on: the shared prefix is trained once,
    the credit is counted, and a group whose rewards agree (advantage 0) still trains on its turns' credit."""
    from hrl.train.step import update_from_traces
    from hrl.train.trainer import Trainer
    from tests.train.test_tree import _qwen2

    _qwen2(dtype=__import__("torch").float32).save_pretrained(tmp_path / "m")
    shared = _credited([
        _scored(_call("a", prompt=[1, 2, 3], resp=[4, 5]), 0.0, 0),
        _scored(_call("b", ref=("a", 5), suffix=[6], resp=[7, 8], parent="a"), 0.5, 1),
        _scored(_call("c", ref=("a", 5), suffix=[9], resp=[10], parent="a"), 0.25, 2),
    ], final=1.0, tid="t1")  # fmt: skip
    traces = [shared, _linear(tid="t2", scores=(0.0, 0.0, 0.0), final=1.0)]  # both reward 1: group advantage 0
    trainer = Trainer(TrainerConfig(model=str(tmp_path / "m"), mode="lora", lr=1e-3, tree="on"))
    cfg = LoopConfig(credit="turn", trainer=trainer.config)
    metrics = update_from_traces(trainer, traces, cfg)
    assert metrics["credit/turn_traces"] == 2.0 and metrics["credit/episode_fallback"] == 0.0
    assert metrics["train/tree"] == 1.0 and metrics.get("train/skipped", 0.0) == 0.0
    episode = update_from_traces(trainer, traces, LoopConfig(trainer=trainer.config))  # episode credit: nothing
    assert "credit/turn_traces" not in episode and episode.get("train/skipped") == 1.0


@pytest.mark.agents
@pytest.mark.timeout(600)
def test_a_loop_with_turn_credit_records_and_counts_turn_scores(tiny_model, tmp_path):
    """One step of the real loop: mini-swe-agent in a local sandbox fixes a one-bug task (the scripted engine's turns),
    the tests verifier scores the sandbox as each call arrives, and the step credits the turns. Both episodes of the
    group earn 1 (group advantage 0), so the update trains on the turn credit alone."""
    import asyncio
    import uuid

    from hrl.config import RolloutConfig
    from hrl.runners.rollouts.rollout import AgentRollouts
    from hrl.runners.rundir import RunDir
    from hrl.runners.serving.stack import serving
    from hrl.runners.trace import read_traces
    from hrl.train.loop import train
    from tests.runners.agents.test_warm import FIX
    from tests.runners.tasks.test_verifier import mini_task

    cfg = LoopConfig(iterations=1, tasks_per_iteration=1, group_size=2, concurrency=2, credit="turn",
                     trainer=TrainerConfig(model=tiny_model, lr=1e-3))  # fmt: skip
    rollout = RolloutConfig(agent="mini-swe-agent", sandbox="local", run_id=f"test-credit-{uuid.uuid4().hex[:8]}",
                            time_budget_s=120, agent_options={"step_limit": 4}, turn_scores=True)  # fmt: skip

    async def go():
        async with serving(tiny_model, "scripted", engine_options={"turns": FIX}) as stack:
            rollouts = AgentRollouts(stack, rollout, verifier={"run_id": rollout.run_id})
            await asyncio.to_thread(rollouts.prepare)
            try:
                return await train([mini_task("local").model_dump()], cfg, RunDir(tmp_path / "run"), stack.proxy,
                                   rollouts)  # fmt: skip
            finally:
                await rollouts.close()

    (step,) = asyncio.run(go())
    traces = [t for f in sorted((tmp_path / "run" / "traces").glob("*.jsonl")) for t in read_traces(f)]
    assert len(traces) == 2 and all(t["reward"] == 1.0 for t in traces)
    for t in traces:
        scores = [c["turn_score"] for c in t["calls"]]
        assert scores == pytest.approx([2 / 3, 1.0]), scores  # test_add fails at the start; the sed fixes it
        assert t["metadata"]["turn_scores"]["final"] == 1.0 and t["metadata"]["turn_scores"]["failed"] == 0
    assert step["credit/turn_traces"] == 2.0 and step["credit/episode_fallback"] == 0.0
    assert step["credit/turn_progress_abs_mean"] == pytest.approx(1 / 6)  # d = 1/3 then 0, per trace
    assert step.get("train/skipped", 0.0) == 0.0
