"""The synchronous training loop end to end through the real proxy and engine, and its resume."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from hrl.runners.engines.base import Engine
from hrl.runners.proxy.proxy import Proxy
from hrl.runners.rollouts.episodes import Rollouts
from hrl.runners.rundir import RunDir
from hrl.runners.serving.stack import serving
from hrl.runners.trace import TraceWriter, read_traces
from hrl.train.loop import Episode, LoopConfig, train
from hrl.train.step import Publisher
from hrl.train.trainer import TrainerConfig

TASKS = [{"instance_id": f"t{i}", "problem_statement": p} for i, p in enumerate(["fix it", "run tests", "ls", "read"])]


class Crash(BaseException):
    """The process stopping mid-iteration (an Exception would be an episode's bug: an internal_error trace)."""


class ChatRollouts(Rollouts):
    """One chat call per episode over HTTP; reward = share of the letter e in the answer."""

    def __init__(
        self,
        proxy: Proxy,
        url: str,
        crash_after: int | None = None,
        reward: Callable[[Episode, str], float] | None = None,
    ) -> None:
        self.proxy, self.url, self.crash_after, self.runs = proxy, url, crash_after, 0
        self.reward = reward or (lambda ep, text: text.count("e") / max(len(text), 1))

    async def episode(self, ep: Episode, trace_file: Path) -> dict:
        self.proxy.traces = TraceWriter(trace_file)
        meta = {"task_id": ep.task_id, "group_id": ep.group_id, "metadata": {"episode": ep.key}}
        token = self.proxy.open_session(meta=meta).token
        if self.crash_after is not None and self.runs >= self.crash_after:
            # a stop mid-iteration: this episode ends as cancelled (as a Ctrl-C ends it), state not committed
            self.proxy.end_session(token, failure_reason="cancelled")
            raise Crash
        body = {"messages": [{"role": "user", "content": ep.task["problem_statement"]}], "max_tokens": 12}
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(f"{self.url}/s/{token}/v1/chat/completions", json=body)
        text = r.json()["choices"][0]["message"]["content"] or ""
        self.runs += 1
        return self.proxy.end_session(token, reward=self.reward(ep, text))


async def _run(
    model: str, run: RunDir, cfg: LoopConfig, crash_after: int | None = None, reward=None, eval_tasks=None
) -> list[dict]:
    async with serving(model, engine_options={"dtype": "float32"}) as stack:
        rollouts = ChatRollouts(stack.proxy, stack.url, crash_after, reward)
        return await train(TASKS, cfg, run, stack.proxy, rollouts, eval_tasks=eval_tasks)


def test_loop_runs_commits_state_and_resumes_without_lost_or_duplicated_traces(tiny_model, tmp_path):
    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(
        iterations=3,
        tasks_per_iteration=2,
        group_size=3,
        concurrency=1,
        trainer=TrainerConfig(model=tiny_model, lr=1e-2),
    )
    run.create(cfg.model_dump())
    try:  # iteration 0 completes (6 episodes), iteration 1 crashes after 2 of its 6 episodes
        asyncio.run(_run(tiny_model, run, cfg, crash_after=8))
    except Crash:
        pass
    assert run.state()["iteration"] == 1
    assert run.state()["version"] == 1
    reasons = [t["failure_reason"] for t in read_traces(run.trace_file(1))]
    assert reasons[:2] == [None, None] and set(reasons[2:]) == {"cancelled"}, reasons
    history = asyncio.run(_run(tiny_model, run, cfg))
    # the cancelled episode ran again; its cut-short trace is kept aside, not trained on
    assert all(t["failure_reason"] is None for t in read_traces(run.trace_file(1)))
    cut = list(read_traces(run.trace_file(1).with_suffix(".cancelled.jsonl")))
    assert [t["failure_reason"] for t in cut] == reasons[2:]
    assert {t["metadata"]["episode"] for t in cut} <= {t["metadata"]["episode"] for t in read_traces(run.trace_file(1))}
    assert [m["step"] for m in history] == [1, 2]
    assert [m["version"] for m in history] == [2, 3]
    for it in range(3):
        keys = [t["metadata"]["episode"] for t in read_traces(run.trace_file(it))]
        assert len(keys) == 6 == len(set(keys)), keys  # nothing lost, nothing twice
    state = run.state()
    assert state["iteration"] == 3
    assert state["version"] == 3
    assert Path(state["checkpoint"]).is_dir()
    lines = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert all("train/mismatch_kl" in m for m in lines)
    assert all(m["train/lr"] == cfg.trainer.lr for m in lines)  # the learning rate of each step, in its row
    # every publish says how long it took, how many weight bytes it moved and which sync tier carried them
    assert all(
        m["publish/tier"] == "lora-adapter" and m["publish/bytes"] > 0 and m["publish/seconds"] > 0 for m in lines
    )
    assert all(m["proxy/cpu_us_per_token"] > 0 for m in lines)  # every step streamed tokens through the proxy
    assert all(m["train/peak_mem_gib"] > 0 and m["train/optimizer_steps"] == 1 for m in lines if not m["train/skipped"])


def test_ppo_epochs_and_mini_batches_make_clipping_act_in_the_loop(tiny_model, tmp_path):
    """train.ppo_epochs=2 × train.mini_batches=2: four optimizer steps per batch against one set of old logprobs,
    through the real proxy and engine; the later steps see moved ratios, so train/clip_frac > 0 in metrics.jsonl."""
    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(iterations=2, tasks_per_iteration=2, group_size=4, concurrency=4, ppo_epochs=2, mini_batches=2,
                     trainer=TrainerConfig(model=tiny_model, lr=5e-2, micro_batch=4))  # fmt: skip
    run.create(cfg.model_dump())
    asyncio.run(_run(tiny_model, run, cfg))
    lines = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in lines if not m["train/skipped"]]
    print("\n" + "\n".join(f"step {m['step']}: clip_frac {m['train/clip_frac']:.3f} ratio_max {m['train/ratio_max']:.2f} "
                           f"approx_kl {m['train/approx_kl']:.4f}" for m in trained))  # fmt: skip
    assert trained and all(m["train/optimizer_steps"] == 4 for m in trained)
    assert max(m["train/clip_frac"] for m in trained) > 0, trained


class EnginePublisher(Publisher):
    """A publisher straight over an engine (no proxy): what the loop reads of one."""

    def __init__(self, engine) -> None:
        self.engine, self.stats = engine, {}

    async def publish(self, path: str, kind: str, version: int | None = None) -> int:
        return await self.engine.publish(path, kind, version)

    def take_cpu_per_token(self) -> float | None:
        return None


def test_sleep_level_2_with_lora_is_refused_before_any_work(tiny_model, tmp_path):
    """Level 2 drops vLLM's base weights; a LoRA publish would serve adapters on nothing."""
    from hrl.runners.engines.vllm import VLLMEngine, VLLMEngineConfig
    from hrl.runners.errors import HrlError

    engine = VLLMEngine(VLLMEngineConfig(model=tiny_model, sleep_level=2))  # never started: refused first
    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(iterations=1, trainer=TrainerConfig(model=tiny_model))
    run.create(cfg.model_dump())
    with pytest.raises(HrlError, match="sleep_level=2") as info:
        asyncio.run(train(TASKS, cfg, run, EnginePublisher(engine), ChatRollouts(None, "")))  # type: ignore[arg-type]
    assert "sleep_level=1" in info.value.hint


def _pass_fail(ep: Episode, text: str) -> float:
    """A verifier-like 0/1 that depends on the episode alone (the same in every run): t0 never passes, t1 always,
    t2 on the group's first episode, t3 about half the time."""
    if ep.task_id == "t2":
        return float(ep.index == 0)
    return {"t0": 0.0, "t1": 1.0}.get(ep.task_id, float(zlib.crc32(ep.key.encode()) % 2))


def test_signal_sampler_resumes_to_the_same_tasks_and_both_samplers_log_groups_with_signal(tiny_model, tmp_path):
    """train.task_sampler=signal: 3 iterations straight and 2 + a crash inside the third + resume pick the same
    tasks every iteration (the success counts are rebuilt from the committed steps); train/groups_with_signal is
    the share of the step's groups whose rewards differ, for signal and uniform alike."""
    cfgs = {
        s: LoopConfig(iterations=3, tasks_per_iteration=2, group_size=3, concurrency=1, task_sampler=s,
                      trainer=TrainerConfig(model=tiny_model, lr=1e-2))
        for s in ("signal", "uniform")
    }  # fmt: skip
    runs = {name: RunDir(tmp_path / name) for name in ("straight", "resumed", "uniform")}
    for name, run in runs.items():
        run.create(cfgs["uniform" if name == "uniform" else "signal"].model_dump())
    asyncio.run(_run(tiny_model, runs["straight"], cfgs["signal"], reward=_pass_fail))
    asyncio.run(_run(tiny_model, runs["uniform"], cfgs["uniform"], reward=_pass_fail))
    try:  # iterations 0 and 1 commit (12 episodes); iteration 2 stops after one of its episodes
        asyncio.run(_run(tiny_model, runs["resumed"], cfgs["signal"], crash_after=13, reward=_pass_fail))
    except Crash:
        pass
    assert runs["resumed"].state()["iteration"] == 2
    asyncio.run(_run(tiny_model, runs["resumed"], cfgs["signal"], reward=_pass_fail))

    def picked(run: RunDir) -> list[list[str]]:
        return [sorted({t["task_id"] for t in read_traces(run.trace_file(it))}) for it in range(3)]

    def lines(run: RunDir) -> list[dict]:
        return [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]

    assert picked(runs["straight"]) == picked(runs["resumed"]), (picked(runs["straight"]), picked(runs["resumed"]))
    sampled = [(m["train/sampler_entropy"], m["train/sampler_max_share"]) for m in lines(runs["straight"])]
    assert sampled == [(m["train/sampler_entropy"], m["train/sampler_max_share"]) for m in lines(runs["resumed"])]
    assert (
        sampled[0] == pytest.approx((1.0, 0.25)) and sampled[1][0] < 0.999
    )  # nothing seen: uniform; then t0 or t1 weigh less
    for name, run in runs.items():
        for it, m in enumerate(lines(run)):
            groups: dict[str, set[float]] = {}
            for t in read_traces(run.trace_file(it)):
                if t["reward"] is not None:
                    groups.setdefault(t["group_id"], set()).add(t["reward"])
            assert m["train/groups_with_signal"] == sum(len(r) > 1 for r in groups.values()) / len(groups), name
        print(
            f"\n{name}: tasks {picked(run)}, groups_with_signal {[m['train/groups_with_signal'] for m in lines(run)]}"
        )
    assert all(m["train/sampler_entropy"] == pytest.approx(1.0) for m in lines(runs["uniform"]))


def test_several_harnesses_take_the_groups_in_turn_and_each_group_is_one_task_under_one_harness():
    from hrl.train.loop import _batch

    class Mix:  # what the loop reads of a HarnessMix: its harnesses, in order
        harnesses = ("opencode", "codex", "aider")

    cfg = LoopConfig(tasks_per_iteration=2, group_size=3, trainer=TrainerConfig(model="m"))
    batches = [_batch(TASKS, cfg, it, rollouts=Mix()) for it in range(3)]
    for episodes in batches:
        groups: dict[str, set[tuple[str, str]]] = {}
        for ep in episodes:
            groups.setdefault(ep.group_id, set()).add((ep.task_id, ep.agent))
            assert ep.group_id.endswith(f"@{ep.agent}")
        assert len(groups) == 2 and all(len(members) == 1 for members in groups.values())
    turns = [ep.agent for episodes in batches for ep in episodes[:: cfg.group_size]]
    assert turns == ["opencode", "codex", "aider", "opencode", "codex", "aider"]
    assert {ep.agent for ep in _batch(TASKS, cfg, 0)} == {""}  # one harness: group ids as before
    assert all("@" not in ep.group_id for ep in _batch(TASKS, cfg, 0))


HELDOUT = [{"instance_id": f"h{i}", "problem_statement": p} for i, p in enumerate(["see", "tree", "free"])]


def test_held_out_tasks_are_evaluated_at_both_ends_and_between_apart_from_training(tiny_model, tmp_path):
    """eval_tasks: all of them at step 0 and after the last step, the slice every eval_every steps; their traces in
    eval/, never in a training batch; one eval/ row each in metrics.jsonl, kept through an extending resume."""
    from transformers import AutoTokenizer

    from hrl.train.heldout import eval_steps, sampled_text

    decode = AutoTokenizer.from_pretrained(tiny_model).decode

    assert eval_steps(4, 0) == {0: True, 4: True} and eval_steps(4, 2) == {2: False, 0: True, 4: True}
    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(iterations=2, tasks_per_iteration=2, group_size=2, concurrency=4, eval_every=1, eval_slice=2,
                     eval_episodes=2, success_reward=0.1, eval_markers={"e": "e", "never": "\x00never"},
                     trainer=TrainerConfig(model=tiny_model, lr=1e-2))  # fmt: skip
    run.create(cfg.model_dump())
    asyncio.run(_run(tiny_model, run, cfg, eval_tasks=HELDOUT))
    evals = run.eval_rows()
    assert sorted(evals) == [0, 1, 2] and sorted(run.metric_rows()) == [0, 1]  # the rows apart
    assert [evals[k]["eval/episodes"] for k in (0, 1, 2)] == [6, 4, 6]  # whole, slice, whole
    assert [evals[k]["eval/version"] for k in (0, 1, 2)] == [0, 1, 2]  # the policy of that step
    for k, row in evals.items():
        traces = list(read_traces(run.eval_trace_file(k)))
        assert len(traces) == row["eval/episodes"] and all(t["group_id"].startswith(f"eval{k}:h") for t in traces)
        share = sum(float(t["reward"]) >= 0.1 for t in traces) / len(traces)
        assert row["eval/success"] == share and row["eval/turns"] > 0
        texts = [sampled_text(t, decode) for t in traces]
        with_e = [float(t["reward"]) for t, said in zip(traces, texts, strict=True) if "e" in said]
        assert row["eval/has/e"] == len(with_e) / len(traces)
        assert row["eval/success_given/e"] == (sum(r >= 0.1 for r in with_e) / len(with_e) if with_e else None)
        assert row["eval/has/never"] == 0.0 and row["eval/success_given/never"] is None
    assert not any(t["task_id"].startswith("h") for t in run.all_traces())  # never in a training batch
    cfg3 = cfg.model_copy(update={"iterations": 3})  # extend the run: the evaluations done stay, step 3 is new
    asyncio.run(_run(tiny_model, run, cfg3, eval_tasks=HELDOUT))
    lines = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "eval/success" in m] == [0, 1, 2, 3]
    assert [m["step"] for m in lines if "eval/success" not in m] == [0, 1, 2]


def test_a_step_that_trains_on_nothing_publishes_nothing_and_is_counted_across_a_resume(tiny_model, tmp_path):
    """Step 0's rewards all agree (every advantage 0: the trainer skips): no checkpoint, no new version, its line
    says train/empty. The run resumes from that commit (no checkpoint yet: the starting weights) and step 1, with
    rewards that differ in every group, trains and publishes version 1; train/empty_steps counts the run's empty
    steps, the one before the resume included."""
    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(iterations=1, tasks_per_iteration=2, group_size=2, concurrency=4,
                     trainer=TrainerConfig(model=tiny_model, lr=1e-2))  # fmt: skip
    run.create(cfg.model_dump())
    split = lambda ep, text: 0.0 if ep.iteration == 0 else float(ep.index == 0)  # noqa: E731
    assert [(m["version"], m["train/empty"]) for m in asyncio.run(_run(tiny_model, run, cfg, reward=split))] == [
        (0, 1.0)
    ]
    assert run.state() == {"iteration": 1, "version": 0, "checkpoint": None}
    assert not list(run.checkpoints.glob("v*"))
    history = asyncio.run(_run(tiny_model, run, cfg.model_copy(update={"iterations": 2}), reward=split))
    assert [(m["version"], m["train/empty"], m["train/empty_steps"]) for m in history] == [(1, 0.0, 1.0)]
    assert run.state()["version"] == 1 and [p.name for p in run.checkpoints.glob("v*")] == ["v0001"]
    lines = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["version"], m["train/skipped"]) for m in lines] == [(0, 0, 1.0), (1, 1, 0.0)]
    assert "publish/seconds" not in lines[0] and lines[1]["publish/seconds"] > 0


def test_an_empty_step_after_a_level_2_sleep_loads_the_weights_back(tmp_path):
    """vLLM at sleep_level 2 drops its weights for the update; a step that publishes nothing must load the live
    version's weights back (the last checkpoint, else the base model), or the next rollouts have no model."""
    from types import SimpleNamespace

    from hrl.train.step import restore_dropped_weights

    restored: list[str] = []
    checkpoint = tmp_path / "v0003"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")

    class Sleeping(Engine):
        name, version = "sleeping", 0

        def __init__(self, sleep_level: int) -> None:
            self.sleep_level = sleep_level

        async def restore(self, path: str) -> None:
            restored.append(path)

    for level in (0, 1, 2):
        asyncio.run(restore_dropped_weights(SimpleNamespace(engine=Sleeping(level)), str(checkpoint)))
    assert restored == [str(checkpoint)]  # only where the weights were dropped
